"""polyrl: reinforcement-learning experiments on language and vision-language models.

The rooms, top of the import layers first (``.importlinter`` holds the order; a room imports only
rooms below it):

- ``cli``: the ``polyrl`` command; ``launch``: running experiments (arms, seeds, rounds, Ray);
  ``analysis``: ``polyrl compare``, replay and the statistics of verdicts; ``evals``: eval suites.
- ``trainer``: one arm assembled from its config and its training loop; ``monitoring``: live
  health checks; ``learner``: the policy (and critic) update; ``rollout``: collecting and scoring
  samples; ``reward_models``: rewards that score with a model; ``tracking``: MLflow.
- ``policies``: building and loading models; ``engines``: rollout engines and weight transports;
  ``data``: prompt sources and mixtures; ``config``: the typed experiment YAML; ``tasks``: the
  shipped tasks; ``envs``: environments and tools; ``rewards``: reward modules.
- ``modeling``: the learner's model-side blocks (log-probs, LoRA); ``algos``: objectives and
  advantages as pure functions in registries; ``runtime``: devices and threads; ``core``: what
  every layer shares.

CONTRIBUTING.md's "Where a change goes" names the room for each kind of change.
"""
