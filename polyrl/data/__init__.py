"""Prompts and their sources: shipped tasks, files, datasets and mixtures; chat formatting,
train/held-out splits and the seeded, resumable prompt sampler."""
