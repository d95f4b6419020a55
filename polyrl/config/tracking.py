"""``tracking:``, ``checkpoint:``, ``eval:`` and ``health:``: what a run records, keeps, evaluates and
warns about while it trains."""

from __future__ import annotations

from pydantic import Field

from polyrl.config.base import StrictModel


class TrackingConfig(StrictModel):
    uri: str | None = Field(
        None, description="MLflow tracking URI; default $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the working folder."
    )
    experiment: str | None = Field(None, description="MLflow experiment name; default: the config's name.")
    sample_table_every: int = Field(5, ge=1)
    sample_table_rows: int = Field(16, ge=1)
    progress: bool = True
    accuracy_reward: str | None = Field(
        None,
        description="Label of the reward whose score defines train/accuracy; default: the reward labelled 'accuracy', if any.",
    )


class CheckpointConfig(StrictModel):
    dir: str = Field("runs", description="Checkpoints go to <dir>/<name>/<arm>/step_<n>.")
    every: int = Field(10, ge=1)
    keep: int = Field(2, ge=1)


class EvalConfig(StrictModel):
    every: int = Field(0, ge=0, description="Evaluate every N steps inside training (0 = never).")
    suite: str | None = None
    limit: int | None = Field(None, ge=1)


class HealthConfig(StrictModel):
    min_entropy: float = 0.1
    advantage_sigma: float = 3.0
    positive_share_target: float = 0.45
    positive_share_tolerance: float = 0.25
    min_mean_length: float = 2.0
    max_logprob_gap: float = Field(
        1e-2, gt=0, description="Warn when rollout/logprob_gap (nats/token) exceeds this: a stale or partial weight sync."
    )
    max_mismatch_kl: float = Field(
        1e-3,
        gt=0,
        description="Warn when rollout_corr/k3_kl (the sampler/learner mismatch KL per token, docs/rollout_correction.md) "
        "exceeds this.",
    )
    mismatch_growth: float = Field(
        10.0,
        gt=1,
        description="Warn when rollout_corr/k3_kl grows past this multiple of its mean over the run's first three "
        "reports (and past 1e-5, below which it is rounding noise): the mismatch that precedes a collapse.",
    )
    # Seed 000 §5.2's two figures for a slow distributed run; checked in asynchronous training (rollout.max_staleness > 0).
    min_buffer_utilisation: float = Field(
        0.7,
        ge=0,
        le=1,
        description="Warn when the rollout buffer's mean utilisation (ready "
        "batches when the learner asks for one, over the max_staleness it may hold) is below this.",
    )
    max_sync_share: float = Field(
        0.15, gt=0, le=1, description="Warn when weight syncs take a larger mean share of the learner's step."
    )
