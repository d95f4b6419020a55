"""The learner: the policy update (``policy_learner``, with one micro-batch's loss in
``micro_batch_loss``), data-parallel learner ranks (``ranks``), the critic (``critic``), the
learning-rate schedule (``lr_schedule``), the non-finite guard (``nonfinite``) and the per-token
capture the rollout inspector shows (``token_capture``)."""
