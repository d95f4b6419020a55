"""Live health checks during training: the step-level checks and their warnings (``health``) and
the reward-hacking checks (``reward_hacking``). The per-reward statistics they read are computed
in :mod:`polyrl.rewards.monitors` (below the config layer, which validates their settings); the
report's health section is :mod:`polyrl.analysis.health_notes`."""
