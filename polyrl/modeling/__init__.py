"""Model-side building blocks of the learner: packed batches, log-probs, micro-batches, LoRA,
freezing, attention and gradient checkpointing."""
