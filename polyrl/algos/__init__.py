"""The maths of training, as pure tensor functions registered by name: objectives (``objectives/``),
advantage estimators (``advantages/``), loss aggregation, group statistics, rollout correction,
entropy controls, the distillation term and typed parameters."""
