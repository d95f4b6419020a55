"""``tracking:``, ``checkpoint:``, ``eval:`` and ``health:``: what a run records, keeps, evaluates and
warns about while it trains."""

from __future__ import annotations

from pydantic import Field, field_validator

from polyrl.config.base import StrictModel


class TrackingConfig(StrictModel):
    """What goes to MLflow: the tracking server and experiment, the sample tables, and which reward is
    accuracy."""

    uri: str | None = Field(
        None, description="MLflow tracking URI; default $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the working folder."
    )
    experiment: str | None = Field(None, description="MLflow experiment name; default: the config's name.")
    sample_table_every: int = Field(
        5,
        ge=1,
        description="Log a table of samples (prompt, completion, rewards, answer) to MLflow at step 1 and every N-th "
        "step, as samples/step_<n>.json (with images or episodes, also an HTML page).",
    )
    sample_table_rows: int = Field(
        16, ge=1, description="How many of the step's samples each sample table holds (the first ones)."
    )
    progress: bool = Field(
        True,
        description="A progress bar per arm in the terminal while it trains; false: plain log lines (as polyrl run --no-progress).",
    )
    accuracy_reward: str | None = Field(
        None,
        description="Label of the reward whose score defines train/accuracy; default: the reward labelled 'accuracy', if any.",
    )
    replay_store: bool = Field(
        True,
        description="Keep every step's groups (prompt, completions as text and token ids, each reward's raw score) in "
        "<checkpoint.dir>/<name>/<arm>/inspector/replay.jsonl.gz, so `polyrl replay run:<id> --rewards other.yaml` can "
        "re-score them under other rewards, weights or aggregation without the policy (docs/rewards.md, Reward replay).",
    )


class CheckpointConfig(StrictModel):
    """Where and how often an arm saves checkpoints (for resume and evaluation), and how many it keeps."""

    dir: str = Field("runs", description="Checkpoints go to <dir>/<name>/<arm>/step_<n>.")
    every: int = Field(
        10,
        ge=1,
        description="Save a checkpoint (weights, optimizer state, sampler position) every N steps and after the last "
        "step; a resumed run starts from the latest.",
    )
    keep: int = Field(
        2, ge=1, description="How many of the latest checkpoints stay on disk; older ones are deleted after each save."
    )


class EvalConfig(StrictModel):
    """Periodic evaluation inside training: an eval suite run with the training run's own rollout engine,
    logged as eval/<metric>."""

    every: int = Field(0, ge=0, description="Evaluate every N steps inside training (0 = never); > 0 needs suite.")
    suite: str | None = Field(
        None,
        description="The eval suite periodic evaluation runs: a YAML path, or a suite name looked up as <name>.yaml in "
        "$POLYRL_EVAL_SUITES's folders, ./experiments/evals and the repository's experiments/evals. Required when "
        "every > 0; refused with every 0.",
    )
    limit: int | None = Field(
        None,
        ge=1,
        description="At most this many prompts per dataset of the suite (the suite's own limit, if lower, wins); "
        "refused with every 0.",
    )


class HealthConfig(StrictModel):
    """Thresholds of the live health checks: a step whose metrics cross one logs a warning (and
    health/<check>_trips); they do not stop the run. The defaults are polyrl's own heuristics, not
    figures from a paper."""

    # The defaults of the checks below are polyrl's own heuristics (from its design notes), not figures from a paper.
    min_entropy: float = Field(
        0.1, description="Warn when the mean token entropy (actor/entropy, nats) falls below this: entropy collapse."
    )
    advantage_sigma: float = Field(
        3.0,
        description="Warn when an advantage lies more than this many standard deviations from the batch mean "
        "(advantage/max_abs_z): check the reward scale and advantage normalisation.",
    )
    positive_share_target: float = Field(
        0.45,
        description="The expected share of the policy loss from positive-advantage tokens (actor/pos_loss_share); "
        "warn when it strays further than positive_share_tolerance (BAPO's balance, arXiv 2510.18927).",
    )
    positive_share_tolerance: float = Field(
        0.25, description="How far actor/pos_loss_share may stray from positive_share_target before a warning."
    )
    min_mean_length: float = Field(
        2.0,
        description="Warn when the mean response length (tokens) falls below this, or below a quarter of the first "
        "step's when that was over 4 × this: length collapse.",
    )
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
    # polyrl's own thresholds for a slow asynchronous run (from its design notes); checked when rollout.max_staleness > 0.
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
    # Reward-hacking checks (polyrl/rewards/monitors.py, polyrl/monitoring/reward_hacking.py; docs/reward_workbench.md).
    reward_window: int = Field(
        10,
        ge=2,
        description="Steps the reward-hacking checks look back over: the train/held-out trend, the reward-length "
        "correlation's running mean and the judge/rule agreement pool their samples over this many steps.",
    )
    held_out_metric: str | None = Field(
        None,
        description="The held-out score the training reward is checked against (a metric key, e.g. "
        "'eval/gsm8k/accuracy'); default: every eval/<suite>/accuracy and eval/<suite>/reward/mean the periodic "
        "evaluation logs. Refused without periodic evaluation (eval.every > 0 with eval.suite).",
    )
    min_reward_rise: float = Field(
        0.05,
        gt=0,
        description="Warn when reward/mean rose by at least this (least-squares change over health.reward_window "
        "steps) while the held-out score moved by at most health.held_out_stall.",
    )
    held_out_stall: float = Field(
        0.0,
        description="The largest held-out change over the window that still counts as stalled (0: flat or falling).",
    )
    min_component_correlation: float = Field(
        0.3,
        gt=0,
        lt=1,
        description="Warn when two reward components' correlation over a step's samples, once at least this in size, "
        "turns to the opposite sign at least this large (one term now pays for what the other punishes).",
    )
    max_component_share: float = Field(
        0.9,
        gt=0,
        le=1,
        description="Warn when one reward component's share of the total's variance over a step's samples comes to "
        "exceed this, having been below it at the run's first report (it alone now decides the advantage).",
    )
    max_length_correlation: float = Field(
        0.8,
        gt=0,
        le=1,
        description="Warn when the correlation of total reward and completion length over a step's samples, "
        "averaged over the last health.reward_window steps, exceeds this (the reward pays for length).",
    )
    min_distinct_per_prompt: float = Field(
        0.5,
        ge=0,
        description="Warn when a step's distinct completion texts per distinct prompt fall below this (different "
        "prompts answered with the same few texts); 0 turns the check off.",
    )
    judge_rule_pairs: dict[str, str] = Field(
        default_factory=dict,
        description="Reward labels {judge: rule}: a model-scored reward and a rule-based one that check the same "
        "thing; warn when their correlation over the last health.reward_window steps' samples falls below "
        "health.min_judge_rule_correlation.",
    )
    min_judge_rule_correlation: float = Field(0.3, ge=-1, lt=1, description="See health.judge_rule_pairs.")

    @field_validator("judge_rule_pairs")
    @classmethod
    def _judge_and_rule_differ(cls, pairs: dict[str, str]) -> dict[str, str]:
        # A reward correlates perfectly with itself: the check could never fire.
        same = sorted(judge for judge, rule in pairs.items() if judge == rule)
        if same:
            raise ValueError(
                f"{same} paired with itself: a reward always agrees with itself, so the check could never warn; "
                "pair a model-scored reward's label with a different, rule-based reward's label"
            )
        return pairs
