"""The learner captures per-token values for the rollout inspector only in the update it is asked
for (polyrl/learner/token_capture.py): the other updates call the objective as before and
capture nothing; the captured update's loss and metrics are those of an uncaptured one."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from learner_helpers import built, first_batch


@pytest.mark.slow
def test_only_the_asked_update_captures_and_it_changes_nothing(tmp_path, tiny_experiment):
    config = tiny_experiment(
        rollout={"prompts_per_step": 2, "samples_per_prompt": 4, "max_tokens": 8},
        train={"steps": 2, "learning_rate": 1e-2, "micro_batch_size": 4, "mini_batches": 2},
    )
    with built(tmp_path, config) as arm:
        rollout, _, batch = first_batch(arm)
        learner = arm.learner
        calls: list[bool] = []
        spec = learner.objective

        def spy(*args, **kwargs):
            calls.append(kwargs.get("inspect_tokens", False))
            return spec.fn(*args, **kwargs)

        learner.objective = dataclasses.replace(spec, fn=spy)
        start = {k: v.detach().clone() for k, v in learner.policy.state_dict().items()}
        plain = learner.update(batch, 0)
        assert calls and not any(calls) and learner.take_inspection([1]) is None
        # The same update again from the same weights and optimizer state, now captured.
        learner.policy.load_state_dict(start)
        learner.optimizer.state.clear()
        learner.optimizer_step = 0
        calls.clear()
        learner.inspect_next_update()
        captured = learner.update(batch, 0)
        assert calls and all(calls)
        assert all(isinstance(v, float) for v in captured.values())  # the tensors went to the capture
        assert captured.keys() == plain.keys()
        for key in plain:
            assert captured[key] == plain[key] or key.startswith("perf/"), key
        rows = learner.take_inspection([len(c.completion_ids) for c in rollout.completions])
        assert len(rows) == len(rollout) and all(
            len(r["ratio"]) == len(c.completion_ids) for r, c in zip(rows, rollout.completions)
        )
        assert learner.take_inspection([1]) is None  # handed out once
        calls.clear()
        learner.update(batch, 1)
        assert not any(calls) and learner.take_inspection([1]) is None
        assert torch.isfinite(torch.tensor([x for r in rows for x in r["learner_logprob"] if x is not None])).all()
