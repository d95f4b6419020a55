"""Rewards that score with a model: an LLM judge (``judge``) and a learned scorer
(``learned_scorer``). They need an engine or a transformers model, so they sit above
``polyrl.engines`` in the layers; ``polyrl.rewards.registry`` imports this package by name when
it lists or resolves the built-ins, as it would a plug-in (docs/reward_workbench.md)."""

from polyrl.reward_models import judge, scorer  # noqa: F401  (registers the modules)
