"""The learner loop of one arm, split into named, timed phases.

generate → score → advantage → update → sync → log

Each phase is a method with plain inputs and outputs; the loop itself (:meth:`ArmTrainer.step`)
only calls them in order and times them. Objectives and advantage estimators are looked up by
name in their registries; nothing here branches on an algorithm's name.

Numerics (see :mod:`polyrl.roles.precision`, :mod:`polyrl.roles.schedule`): master weights
and optimizer state are fp32 whatever ``model.dtype`` says (it names the compute dtype);
dropout is off in every pass; an optimizer step whose loss or gradient norm is NaN/inf is
skipped, and too many in a row stop the run with a checkpoint of the last good weights.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
import random
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch import Tensor
from transformers import AutoModelForTokenClassification, AutoTokenizer

from polyrl.rewards.summary import accuracy_share
from polyrl.data.images import check_model_takes_images
from polyrl.data.prompts import PromptSampler, load_prompt_dataset
from polyrl.engines.images import auto_model_class
from polyrl.algos.advantages import get_advantage
from polyrl.algos.aggregation import global_loss_normalizer
from polyrl.roles.batches import LearnerBatch, Rollout, Scores, informative_groups
from polyrl.roles.checkpoint import latest_checkpoint, load_checkpoint, prune_checkpoints, save_checkpoint
from polyrl.config.schema import ConfigError, ExperimentConfig
from polyrl.algos.dapo_data import dapo_overlong_penalty
from polyrl.roles.health import NONFINITE_REASONS, HealthMonitor, NonFiniteGuard, NonFiniteTrainingError
from polyrl.algos.logprobs import PackedBatch, logprob_gap, pack_completions, token_logprobs
from polyrl.algos.losses import clipped_value_loss, kl_penalty, masked_mean
from polyrl.models.paths import resolve_policy_path
from polyrl.algos.objectives import get_objective
from polyrl.roles.precision import autocast, compute_dtype
from polyrl.engines.base import RolloutEngine, build_rollout_engine
from polyrl.roles.schedule import apply_optimizer_settings, lr_factor, set_learning_rate
from polyrl.core.types import SamplingSettings
from polyrl.rewards import CompositeReward, RewardBatch, RewardResult, load_reward_class

__all__ = ["PHASES", "ArmTrainer", "LearnerBatch", "PhaseTimer", "Rollout", "Scores", "ValueModel", "seed_everything"]

PHASES = ("generate", "score", "advantage", "update", "sync", "log")


class PhaseTimer:
    """Accumulates wall time per named phase within one step."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        out = {f"perf/{phase}_s": self.seconds.get(phase, 0.0) for phase in PHASES}
        out["perf/step_s"] = sum(self.seconds.values())
        return out


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def _masked_stats(values: Tensor, mask: Tensor) -> tuple[float, float]:
    mask = mask.bool()
    count = int(mask.sum())
    if count == 0:
        return 0.0, 0.0
    picked = values[mask]
    return float(picked.mean()), float(picked.std(unbiased=False)) if count > 1 else 0.0


class ValueModel(torch.nn.Module):
    """A critic: the policy's backbone with a scalar head (transformers' token-classification head)."""

    def __init__(self, path: str | Path, dtype: torch.dtype):
        super().__init__()
        self.model = AutoModelForTokenClassification.from_pretrained(str(path), num_labels=1, dtype=dtype)

    def forward(self, batch: PackedBatch) -> Tensor:
        device = next(self.parameters()).device
        batch = batch.to(device)
        logits = self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[..., 0]  # [B, S]
        # V(s_t) is read where the policy's logits for completion token t are read.
        values = torch.gather(logits, 1, batch.response_index).float()
        return torch.where(batch.response_mask.bool(), values, torch.zeros_like(values))


class ArmTrainer:
    """Trains one arm of an experiment; owns its policy, engine, rewards and checkpoints."""

    def __init__(self, config: ExperimentConfig, *, arm: str, arm_dir: Path, logger: Any | None = None, progress: Any | None = None,
                 on_step: Callable[[int, dict[str, float]], None] | None = None, evaluator: Any | None = None):
        self.config = config
        self.arm = arm
        self.arm_dir = Path(arm_dir)
        self.logger = logger  # polyrl.tracking.mlflow_runs.RunLogger or None
        self.progress = progress
        self.on_step = on_step
        self.evaluator = evaluator
        self.objective = get_objective(config.objective.name)
        self.aggregation = config.objective.aggregation or self.objective.default_aggregation
        self.objective_params = {**self.objective.default_params, **config.objective.params}
        self.estimator = get_advantage(config.advantage.estimator or self.objective.default_advantage)
        self.estimator_params = {**self.estimator.default_params, **config.advantage.params}
        self.needs_values = "values" in self.estimator.requires
        self.needs_reference = config.train.kl_coef > 0
        self.step_index = 0
        # Policy optimizer steps applied so far (the LR schedule's and the critic cadence's clock).
        self.optimizer_step = 0
        self.health = HealthMonitor(config.health, check_logprob_gap=config.rollout.top_p == 1.0)
        self.guard = NonFiniteGuard(config.train.max_consecutive_nonfinite)
        self.critic_guard = NonFiniteGuard(config.train.max_consecutive_nonfinite, prefix="critic_")
        self.history: list[dict[str, float]] = []
        self.engine: RolloutEngine | None = None
        self.health_printer: Callable[[str], None] = print
        self.accuracy_label: str | None = None
        self._step_start_sampler_state: dict[str, Any] | None = None
        # Bookkeeping the caller wants in every checkpoint (e.g. MLflow run ids).
        self.checkpoint_extra: dict[str, Any] = {}

    # --- set-up -----------------------------------------------------------------------------

    def setup(self, *, resume: bool = False) -> dict[str, Any]:
        """Build models, engine, data and rewards; restore the latest checkpoint if ``resume``."""
        cfg = self.config
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        seed_everything(cfg.seed)
        self.compute_dtype = compute_dtype(cfg.model.dtype)
        self.policy_path = resolve_policy_path(cfg.model)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.policy_path))
        self.pad_token_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        # fp32 master weights and optimizer state; model.dtype is the compute dtype (precision.py).
        # Image-text models load whole (AutoModelForImageTextToText): the learner's forward needs the vision tower.
        self.policy = auto_model_class(self.policy_path).from_pretrained(str(self.policy_path), dtype=torch.float32)
        # Dropout off in every pass, the update included, so that π_old and π_θ are the same
        # function of the weights (TRL's disable_dropout default; verl does the same).
        self.policy.eval()
        self.optimizer = torch.optim.AdamW(
            self.policy.parameters(), lr=cfg.train.learning_rate, betas=cfg.train.betas, weight_decay=cfg.train.weight_decay
        )
        self.reference = None
        if self.needs_reference:
            # Same storage dtype and autocast as the policy: KL is exactly 0 before the first update.
            self.reference = auto_model_class(self.policy_path).from_pretrained(str(self.policy_path), dtype=torch.float32).eval()
            self.reference.requires_grad_(False)
        self.critic = None
        self.critic_optimizer = None
        if self.needs_values:
            value = cfg.train.value
            self.critic = ValueModel(self.policy_path, torch.float32).eval()
            self.critic_optimizer = torch.optim.AdamW(self.critic.parameters(), lr=value.learning_rate, betas=value.betas,
                                                      weight_decay=value.weight_decay)
        dataset = load_prompt_dataset(cfg.data.source, cfg.data.train_split, prompt_field=cfg.data.prompt_field,
                                      answer_field=cfg.data.answer_field, references_field=cfg.data.references_field, limit=cfg.data.limit)
        self.sampler = PromptSampler(dataset, seed=cfg.seed, prompt_field=cfg.data.prompt_field,
                                     answer_field=cfg.data.answer_field, references_field=cfg.data.references_field)
        check_model_takes_images(self.policy_path, self.sampler.samples)
        self.rewards = CompositeReward(self._reward_specs_with_defaults())
        self.rewards.setup()
        self.accuracy_label = self._accuracy_label()
        self.engine = build_rollout_engine(cfg.rollout.engine, str(self.policy_path), seed=cfg.seed, dtype=cfg.model.dtype,
                                           max_model_len=cfg.rollout.max_model_len, kv_cache_gb=cfg.rollout.kv_cache_gb)
        # vLLM drops torch to one thread "for serving"; the learner shares this process and
        # wants every core back for its forward/backward passes.
        torch.set_num_threads(cfg.train.threads or os.cpu_count() or 1)
        state: dict[str, Any] = {}
        checkpoint = latest_checkpoint(self.arm_dir) if resume else None
        if checkpoint is not None:
            state = load_checkpoint(checkpoint, models=self._checkpoint_models(), optimizers=self._checkpoint_optimizers())
            self.sampler.load_state_dict(state["sampler"])
            self.step_index = int(state["step"])
            self.optimizer_step = int(state.get("optimizer_step", self.step_index * self.optimizer_steps_per_step()))
            self.health.load_state_dict(state.get("health", {}))
            self.guard.load_state_dict(state.get("nonfinite", {}))
            self.sync()  # the engine was built from the base weights
        self._apply_optimizer_settings()
        return state

    def _apply_optimizer_settings(self) -> None:
        """The config's optimizer hyper-parameters, also over those a checkpoint restored."""
        train = self.config.train
        apply_optimizer_settings(self.optimizer, lr=self.learning_rate(self.optimizer_step + 1), betas=train.betas,
                                 weight_decay=train.weight_decay)
        if self.critic_optimizer is not None:
            apply_optimizer_settings(self.critic_optimizer, lr=train.value.learning_rate, betas=train.value.betas,
                                     weight_decay=train.value.weight_decay)

    def _reward_specs_with_defaults(self):
        """Rewards that score with a language model default to the reference policy."""
        specs = []
        for spec in self.config.rewards:
            reward_class = load_reward_class(spec.module)
            accepts_model_path = "model_path" in inspect.signature(reward_class.__init__).parameters
            if accepts_model_path and "model_path" not in spec.params:
                spec = spec.model_copy(update={"params": {**spec.params, "model_path": str(self.policy_path)}})
            specs.append(spec)
        return specs

    def _accuracy_label(self) -> str | None:
        """The reward that defines ``train/accuracy``: ``tracking.accuracy_reward``, else the one
        labelled ``accuracy``, else none (no accuracy metric)."""
        labels = self.rewards.labels
        wanted = self.config.tracking.accuracy_reward
        if wanted is None:
            return "accuracy" if "accuracy" in labels else None
        if wanted not in labels:
            raise ConfigError(f"tracking.accuracy_reward: no reward is labelled {wanted!r}; reward labels: {', '.join(labels)}")
        return wanted

    def _checkpoint_models(self) -> dict[str, torch.nn.Module]:
        models: dict[str, torch.nn.Module] = {"policy": self.policy}
        if self.critic is not None:
            models["critic"] = self.critic
        return models

    def _checkpoint_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        optimizers: dict[str, torch.optim.Optimizer] = {"policy": self.optimizer}
        if self.critic_optimizer is not None:
            optimizers["critic"] = self.critic_optimizer
        return optimizers

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    # --- schedule and precision ---------------------------------------------------------------

    def optimizer_steps_per_step(self) -> int:
        return self.config.train.updates_per_batch * self.config.train.mini_batches

    def learning_rate(self, optimizer_step: int) -> float:
        """The policy's learning rate at (1-based) optimizer step ``optimizer_step``."""
        train = self.config.train
        return train.learning_rate * lr_factor(optimizer_step, schedule=train.lr_schedule, warmup_steps=train.warmup_steps,
                                               total_steps=train.steps * self.optimizer_steps_per_step(),
                                               min_lr_ratio=train.min_lr_ratio)

    def _autocast(self, model: torch.nn.Module):
        return autocast(model, self.compute_dtype)

    # --- phases -------------------------------------------------------------------------------

    def sampling_settings(self, step: int, round_index: int = 0) -> SamplingSettings:
        r = self.config.rollout
        # A distinct, reproducible seed per (run seed, step, refill round).
        return SamplingSettings(n=r.samples_per_prompt, temperature=r.temperature, top_p=r.top_p, max_tokens=r.max_tokens,
                                seed=self.config.seed * 1_000_003 + step * 101 + round_index)

    def generate(self, step: int, round_index: int = 0, group_offset: int = 0) -> Rollout:
        prompts = self.sampler.next_batch(self.config.rollout.prompts_per_step)
        grouped = self.engine.generate(prompts, self.sampling_settings(step, round_index))
        flat_prompts, flat_completions, group_ids = [], [], []
        for index, (prompt, completions) in enumerate(zip(prompts, grouped)):
            for completion in completions:
                flat_prompts.append(prompt)
                flat_completions.append(completion)
                group_ids.append(group_offset + index)
        return Rollout(flat_prompts, flat_completions, torch.tensor(group_ids, dtype=torch.long))

    def score(self, rollout: Rollout) -> Scores:
        batch = RewardBatch(
            prompts=[p.prompt for p in rollout.prompts],
            completions=[c.text for c in rollout.completions],
            references=[list(p.references) for p in rollout.prompts],
            images=[list(p.images) for p in rollout.prompts],
            fields=[dict(p.fields) for p in rollout.prompts],
        )
        result = self.rewards.score(batch)
        return Scores(list(result.totals), self.reward_metrics(result.totals, result.per_module), dict(result.per_module))

    def reward_metrics(self, totals: list[float | None], per_module: dict[str, list[float | None]]) -> dict[str, float]:
        metrics = RewardResult(totals=list(totals), per_module=per_module).metrics()
        if self.accuracy_label is not None:
            metrics["train/accuracy"] = accuracy_share(per_module[self.accuracy_label])
        return metrics

    def generate_and_score(self, step: int, timer: PhaseTimer) -> tuple[Rollout, Scores]:
        """Generate and score; with DAPO dynamic sampling, refill until the batch is full.

        Dynamic sampling (Yu et al., arXiv 2503.14476, §3.2): each round's informative groups
        (scored rewards not all equal) enter the batch, uninformative ones never do, and the
        batch is cut to exactly ``prompts_per_step`` whole groups (as DAPO and verl's
        ``filter_groups`` do). After ``max_rounds`` the batch keeps what was informative, even
        if short or empty, and ``rollout/dynamic_sampling_missing_groups`` says by how much.
        Reward metrics (``reward/*``, ``train/accuracy``) cover every generated sample of every
        round: they describe the policy, not the filtered batch.
        """
        dynamic = self.config.advantage.dynamic_sampling
        wanted = self.config.rollout.prompts_per_step
        if not dynamic.enabled:
            with timer("generate"):
                rollout = self.generate(step)
            with timer("score"):
                return rollout, self.score(rollout)
        kept: list[tuple[Rollout, Scores]] = []
        generated: list[Scores] = []
        kept_groups = dropped_groups = surplus_groups = rounds = 0
        while rounds < dynamic.max_rounds and kept_groups < wanted:
            with timer("generate"):
                rollout = self.generate(step, rounds, group_offset=rounds * wanted)
            with timer("score"):
                scores = self.score(rollout)
            rounds += 1
            generated.append(scores)
            informative = informative_groups(scores.totals, rollout.group_ids)
            taken = set(informative[: wanted - kept_groups])
            dropped_groups += len(torch.unique(rollout.group_ids)) - len(informative)
            surplus_groups += len(informative) - len(taken)
            rows = [i for i, group in enumerate(rollout.group_ids.tolist()) if group in taken]
            kept.append((rollout.select(rows), scores.select(rows)))
            kept_groups += len(taken)
        merged = Rollout.concat([r for r, _ in kept])
        totals = [t for s in generated for t in s.totals]
        per_module = {label: [v for s in generated for v in s.per_module[label]] for label in generated[0].per_module}
        metrics = self.reward_metrics(totals, per_module)
        metrics.update({
            "rollout/dynamic_sampling_rounds": float(rounds),
            "rollout/dynamic_sampling_dropped_groups": float(dropped_groups),
            "rollout/dynamic_sampling_kept_groups": float(kept_groups),
            "rollout/dynamic_sampling_surplus_groups": float(surplus_groups),
            "rollout/dynamic_sampling_missing_groups": float(wanted - kept_groups),
        })  # fmt: skip
        return merged, Scores([t for _, s in kept for t in s.totals], metrics)

    @torch.no_grad()
    def _batched(self, fn: Callable[[PackedBatch], Tensor], packed: PackedBatch, model: torch.nn.Module) -> Tensor:
        size = self.config.train.micro_batch_size
        with self._autocast(model):
            return torch.cat([fn(packed.select(slice(i, i + size))) for i in range(0, len(packed), size)])

    def compute_advantages(self, rollout: Rollout, scores: Scores) -> LearnerBatch:
        cfg = self.config
        packed = pack_completions(rollout.completions, pad_token_id=self.pad_token_id)
        mask = packed.response_mask.bool()
        temperature = cfg.rollout.temperature
        metrics: dict[str, float] = {}
        old_logprobs = None
        if not self.update_reuses_old_logprobs():
            old_logprobs = self._batched(lambda b: token_logprobs(self.policy, b, temperature=temperature)[0], packed, self.policy)
            metrics["rollout/logprob_gap"] = logprob_gap(packed.sampling_logprobs, old_logprobs, mask)

        # Unscored rewards reach the estimator as NaN: it leaves them out of group statistics
        # and gives them no advantage; their rows then leave the loss (loss_mask below).
        totals = torch.tensor([math.nan if t is None else float(t) for t in scores.totals], dtype=torch.float32)
        unscored = torch.isnan(totals)
        metrics["reward/unscored_samples"] = float(unscored.sum())
        excluded = unscored.clone()

        lengths = mask.sum(-1)
        overlong = cfg.advantage.overlong
        if overlong.mode == "soft_punishment":
            penalty = dapo_overlong_penalty(lengths, max_length=overlong.max_length or cfg.rollout.max_tokens, cache_length=overlong.cache_length)
            totals = totals + overlong.penalty_weight * penalty.to(totals.dtype)
            metrics["reward/overlong_penalty_mean"] = float(penalty.mean())
        if overlong.mode == "mask_truncated":
            # DAPO's overlong filtering (arXiv 2503.14476, §3.4): truncated samples keep their
            # place in group statistics but their tokens leave the loss entirely.
            truncated = torch.tensor([c.truncated for c in rollout.completions], dtype=torch.bool)
            excluded |= truncated
            metrics["rollout/masked_truncated"] = float(truncated.sum())
        loss_mask = mask & ~excluded[:, None]

        ref_logprobs = None
        token_rewards = None
        if self.reference is not None:
            ref_logprobs = self._batched(lambda b: token_logprobs(self.reference, b, temperature=temperature)[0], packed, self.reference)
            # Sampler log-probs stand in for π_old when the update supplies it (equal to ~1e-6).
            current = old_logprobs if old_logprobs is not None else packed.sampling_logprobs
            metrics["actor/ref_kl"] = float(masked_mean(kl_penalty(current, ref_logprobs, estimator=cfg.train.kl_estimator), loss_mask))
            if cfg.train.kl_in_reward:
                # KL folded into per-token rewards, the sequence reward on the last token.
                token_rewards = -cfg.train.kl_coef * kl_penalty(old_logprobs, ref_logprobs, estimator=cfg.train.kl_estimator)
                last = (lengths - 1).clamp(min=0)
                token_rewards[torch.arange(len(totals)), last] += totals
                token_rewards = torch.where(mask, token_rewards, torch.zeros_like(token_rewards))

        values = self._batched(self.critic, packed, self.critic) if self.critic is not None else None
        gammas, lambdas = self.token_discounts(rollout, packed)
        estimator_inputs = dict(rewards=token_rewards if token_rewards is not None else totals, mask=packed.response_mask,
                                group_ids=rollout.group_ids, values=values, gammas=gammas, lambdas=lambdas)
        advantages, adv_metrics = self.estimator.fn(**estimator_inputs, **self.estimator_params)
        returns = None
        if self.estimator.value_targets is not None:
            returns, _ = self.estimator.value_targets(**estimator_inputs, **{k: v for k, v in self.estimator_params.items() if k == "whiten"})
            returns = torch.where(loss_mask, returns, torch.zeros_like(returns))
        advantages = torch.where(loss_mask, advantages, torch.zeros_like(advantages))
        tis = cfg.rollout.truncated_importance_sampling
        if tis.enabled:
            # Truncated importance sampling (Yao et al. 2025): weight each token by
            # min(π_learner/π_sampler, C); folded into the (detached) advantage.
            weight = torch.exp(old_logprobs - packed.sampling_logprobs).clamp(max=tis.cap)
            advantages = torch.where(loss_mask, advantages * weight, advantages)
            metrics["rollout/tis_weight_mean"] = float(masked_mean(weight, loss_mask))
        metrics.update({f"advantage/{k.split('/', 1)[-1]}" if not k.startswith("advantage/") else k: v for k, v in adv_metrics.items()})
        adv_mean, adv_std = _masked_stats(advantages, loss_mask)
        metrics["advantage/mean"], metrics["advantage/std"] = adv_mean, adv_std
        metrics["advantage/max_abs_z"] = float(((advantages[loss_mask] - adv_mean).abs() / (adv_std + 1e-8)).max()) if loss_mask.any() else 0.0
        return LearnerBatch(packed=packed, old_logprobs=old_logprobs, advantages=advantages.detach(), ref_logprobs=ref_logprobs,
                            old_values=values, returns=returns, metrics=metrics, loss_mask=loss_mask)

    def update_reuses_old_logprobs(self) -> bool:
        """With one on-policy optimizer step per rollout batch, π_old is the policy of the
        update's own forward pass, so a separate no-grad pass over the batch would compute the
        same numbers again; the update reads them off its first pass instead."""
        cfg = self.config
        return (cfg.train.updates_per_batch == 1 and cfg.train.mini_batches == 1
                and not cfg.rollout.truncated_importance_sampling.enabled and not cfg.train.kl_in_reward)

    def token_discounts(self, rollout: Rollout, packed: PackedBatch) -> tuple[Tensor, Tensor]:
        """Per-token γ and λ from each completion token's modality (seed 003 §7), read from
        ``Completion.completion_token_modalities`` ("text" unless an engine marks otherwise)."""
        settings = self.config.modalities
        shape = packed.response_mask.shape
        gammas = torch.full(shape, settings.text.gamma)
        lambdas = torch.full(shape, settings.text.lam)
        for row, completion in enumerate(rollout.completions):
            for t, modality in enumerate(completion.completion_token_modalities):
                if modality == "text":
                    continue
                setting = getattr(settings, modality, None)
                if not hasattr(setting, "gamma"):
                    raise ValueError(f"completion token modality {modality!r} has no GAE setting; modalities: {', '.join(type(settings).model_fields)}")
                gammas[row, t], lambdas[row, t] = setting.gamma, setting.lam
        return gammas, lambdas

    def update(self, batch: LearnerBatch) -> dict[str, float]:
        """Several optimizer passes over the rollout batch, each split into mini-batches (one
        optimizer step each) whose gradients accumulate over micro-batches.

        The loss normaliser spans each mini-batch (all its micro-batches), not the whole rollout
        batch: a mini-batch's loss, hence its optimizer step, does not depend on how it is cut
        into micro-batches. An objective's ``prepare`` runs once per mini-batch for the same reason.
        """
        cfg = self.config.train
        size = len(batch.packed)
        generator = torch.Generator().manual_seed(self.config.seed * 7919 + self.step_index)
        sums: dict[str, float] = defaultdict(float)
        weights: dict[str, float] = defaultdict(float)
        grad_norms, losses = [], []
        skipped: dict[str, int] = defaultdict(int)
        critic_updates = 0
        sampler_gap_sum = 0.0
        learning_rate = self.learning_rate(self.optimizer_step + 1)
        for _ in range(cfg.updates_per_batch):
            order = torch.randperm(size, generator=generator) if cfg.updates_per_batch > 1 or cfg.mini_batches > 1 else torch.arange(size)
            for mini in torch.tensor_split(order, cfg.mini_batches):
                if not batch.loss_mask[mini].any():
                    continue  # nothing trains here; momentum and weight decay alone must not move the weights
                normalizer = global_loss_normalizer(batch.loss_mask[mini], mode=self.aggregation, max_response_length=self.config.rollout.max_tokens)
                prepared = self._prepare_objective(batch, mini)
                self.optimizer.zero_grad(set_to_none=True)
                mini_loss = 0.0
                for micro in torch.split(mini, cfg.micro_batch_size):
                    loss, metrics, logprobs = self._policy_loss(batch, micro, normalizer, prepared)
                    if batch.old_logprobs is None:
                        sampler_gap_sum += float((logprobs.detach() - batch.packed.sampling_logprobs[micro]).abs()
                                                 .mul(batch.packed.response_mask[micro]).sum())
                    loss.backward()
                    mini_loss += float(loss.detach())
                    tokens = float(batch.loss_mask[micro].sum())
                    for key, value in metrics.items():
                        sums[key] += value * tokens
                        weights[key] += tokens
                grad_norm = float(torch.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.max_grad_norm))
                learning_rate = self.learning_rate(self.optimizer_step + 1)
                applied = self._guarded_step(self.optimizer, self.guard, mini_loss, grad_norm, skipped, learning_rate)
                if applied:
                    self.optimizer_step += 1
                grad_norms.append(grad_norm)
                losses.append(mini_loss)
                # The critic's cadence counts policy optimizer steps (seed 000 §3.3, delayed critic).
                if self.critic is not None and applied and (self.optimizer_step - 1) % cfg.value.update_every == 0:
                    value_metrics = self._critic_update(batch, mini, skipped)
                    critic_updates += 1
                    for key, value in value_metrics.items():
                        sums[key] += value
                        weights[key] += 1
        out = {f"actor/{k}" if not k.startswith(("bapo/", "quadrant/", "value/")) else k: sums[k] / max(weights[k], 1e-12) for k in sums}
        if batch.old_logprobs is None:
            out["rollout/logprob_gap"] = sampler_gap_sum / max(float(batch.packed.response_mask.sum()), 1.0)
        out["actor/loss"] = float(np.mean(losses)) if losses else 0.0
        out["actor/grad_norm"] = float(np.mean(grad_norms)) if grad_norms else 0.0
        out["actor/grad_norm_max"] = float(np.max(grad_norms)) if grad_norms else 0.0
        out["actor/learning_rate"] = learning_rate  # the rate of this step's last optimizer step
        out["actor/optimizer_steps"] = float(self.optimizer_step)
        out["health/nonfinite_steps"] = float(sum(skipped.values()))
        for reason in NONFINITE_REASONS:
            out[f"health/nonfinite_{reason}_steps"] = float(skipped.get(reason, 0))
        if self.critic is not None:
            out["value/updates"] = float(critic_updates)
        return out

    def _guarded_step(self, optimizer: torch.optim.Optimizer, guard: NonFiniteGuard, loss: float, grad_norm: float,
                      skipped: dict[str, int], learning_rate: float | None = None) -> bool:  # fmt: skip
        """Apply ``optimizer``'s step unless the loss or gradient norm is NaN/inf; then zero the
        gradients, count the skip, and stop the run after too many in a row."""
        reason = guard.check(loss, grad_norm)
        if reason is None:
            if learning_rate is not None:
                set_learning_rate(optimizer, learning_rate)
            optimizer.step()
            return True
        optimizer.zero_grad(set_to_none=True)
        skipped[reason] += 1
        if guard.exhausted:
            self._stop_nonfinite(reason, guard.consecutive)
        return False

    def _stop_nonfinite(self, reason: str, count: int) -> None:
        # No non-finite step was applied, so the weights are the last good ones; the data
        # position is that of the start of the failing step, which a resume then repeats.
        # A resume after the user's fix starts a fresh count of consecutive skips.
        extra: dict[str, Any] = {"stopped": f"non-finite {NONFINITE_REASONS[reason]}", "nonfinite": {"consecutive": 0}}
        if self._step_start_sampler_state is not None:
            extra["sampler"] = self._step_start_sampler_state
        path = self.save(self.step_index, extra=extra)
        raise NonFiniteTrainingError(
            f"arm {self.arm!r}: training stopped in step {self.step_index + 1}: {count} optimizer steps in a row had a "
            f"non-finite (NaN/inf) {NONFINITE_REASONS[reason]} and were skipped (train.max_consecutive_nonfinite = "
            f"{self.config.train.max_consecutive_nonfinite}). The last good weights are saved in {path}. Check the "
            "rewards and advantages for NaN/inf, lower train.learning_rate, then resume with --resume."
        )

    def _objective_params(self, batch: LearnerBatch, rows: Tensor) -> dict[str, Any]:
        params = dict(self.objective_params)
        params["kl_coef"] = 0.0 if self.config.train.kl_in_reward else self.config.train.kl_coef
        params["kl_estimator"] = self.config.train.kl_estimator
        params["entropy_coef"] = self.config.train.entropy_coef
        if batch.ref_logprobs is not None:
            params["ref_logprobs"] = batch.ref_logprobs[rows]
        return params

    @torch.no_grad()
    def _prepare_objective(self, batch: LearnerBatch, mini: Tensor) -> dict[str, Any]:
        """The objective's once-per-mini-batch preparation (e.g. BAPO's clip-bound search) on
        the current policy's log-probs over the whole mini-batch, so that its result does not
        depend on the micro-batch size; ``{}`` for objectives without one."""
        prepare = getattr(self.objective, "prepare", None)
        if prepare is None:
            return {}
        temperature = self.config.rollout.temperature
        packed = batch.packed.select(mini)
        parts = []
        with self._autocast(self.policy):
            for start in range(0, len(packed), self.config.train.micro_batch_size):
                part = packed.select(slice(start, start + self.config.train.micro_batch_size))
                parts.append(token_logprobs(self.policy, part, temperature=temperature, compute_entropy=True))
        logprobs = torch.cat([lp for lp, _ in parts])
        entropy = torch.cat([h for _, h in parts])
        old_logprobs = logprobs if batch.old_logprobs is None else batch.old_logprobs[mini]
        return dict(prepare(logprobs, old_logprobs, batch.advantages[mini], batch.loss_mask[mini], entropy=entropy,
                            **self._objective_params(batch, mini)))

    def _policy_loss(self, batch: LearnerBatch, rows: Tensor, normalizer: float,
                     prepared: dict[str, Any] | None = None) -> tuple[Tensor, dict[str, float], Tensor]:  # fmt: skip
        packed = batch.packed.select(rows)
        # The entropy takes part in the gradient only through an entropy bonus; else it is a metric.
        with self._autocast(self.policy):
            logprobs, entropy = token_logprobs(self.policy, packed, temperature=self.config.rollout.temperature,
                                               compute_entropy=True, entropy_grad=self.config.train.entropy_coef != 0)
        params = {**self._objective_params(batch, rows), **(prepared or {})}
        old_logprobs = logprobs.detach() if batch.old_logprobs is None else batch.old_logprobs[rows]
        loss, metrics = self.objective.fn(logprobs, old_logprobs, batch.advantages[rows], batch.loss_mask[rows],
                                          loss_normalizer=normalizer, aggregation=self.aggregation, entropy=entropy, **params)
        return loss, metrics, logprobs

    def _critic_update(self, batch: LearnerBatch, rows: Tensor, skipped: dict[str, int]) -> dict[str, float]:
        cfg = self.config.train
        mask = batch.loss_mask[rows]
        normalizer = global_loss_normalizer(mask, mode="token_mean")
        self.critic_optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for micro in torch.split(rows, cfg.micro_batch_size):
            with self._autocast(self.critic):
                values = self.critic(batch.packed.select(micro))
            loss, _ = clipped_value_loss(values, batch.old_values[micro], batch.returns[micro], batch.loss_mask[micro],
                                         clip_range=cfg.value.clip_range, loss_normalizer=normalizer, aggregation="token_mean")
            loss.backward()
            total += float(loss.detach())
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.critic.parameters(), cfg.value.max_grad_norm))
        self._guarded_step(self.critic_optimizer, self.critic_guard, total, grad_norm, skipped)
        return {"value/loss": total, "value/grad_norm": grad_norm}

    def sync(self) -> None:
        """Push the policy's weights to the engine, in the engine's dtype (model.dtype)."""
        engine_dtype = self.compute_dtype
        self.engine.sync_weights((name, tensor.detach().to(engine_dtype)) for name, tensor in self.policy.state_dict().items())

    # --- the loop -------------------------------------------------------------------------------

    def rollout_metrics(self, rollout: Rollout) -> dict[str, float]:
        if not len(rollout):
            return {"rollout/samples": 0.0}
        lengths = np.array([len(c.completion_ids) for c in rollout.completions], dtype=np.float64)
        return {
            "rollout/response_length/mean": float(lengths.mean()),
            "rollout/response_length/min": float(lengths.min()),
            "rollout/response_length/max": float(lengths.max()),
            "rollout/response_length/clipped_ratio": float(np.mean([c.truncated for c in rollout.completions])),
            "rollout/samples": float(len(rollout)),
        }

    def step(self) -> dict[str, float]:
        step = self.step_index + 1
        timer = PhaseTimer()
        self._step_start_sampler_state = self.sampler.state_dict()
        rollout, scores = self.generate_and_score(step, timer)
        batch_metrics: dict[str, float] = {}
        update_metrics: dict[str, float] = {}
        if len(rollout):  # dynamic sampling may find no informative group: nothing to learn from
            with timer("advantage"):
                batch = self.compute_advantages(rollout, scores)
                batch_metrics = batch.metrics
            with timer("update"):
                update_metrics = self.update(batch)
            with timer("sync"):
                self.sync()
        self.step_index = step
        with timer("log"):
            metrics = {**scores.metrics, **batch_metrics, **update_metrics, **self.rollout_metrics(rollout)}
            metrics["train/samples_per_s"] = len(rollout) / max(sum(timer.seconds.values()), 1e-9)
            warnings = self.health.check(step, metrics)
            for warning in warnings:
                self.health_printer(f"[{self.arm}] health warning at step {step}: {warning}")
            metrics["health/warnings"] = float(len(warnings))
            self.record(step, metrics, rollout, scores, warnings)
        metrics.update(timer.metrics())
        if self.logger is not None:
            # perf/log_s of this step is the time of everything in "log" but the final write.
            self.logger.log_step(step, metrics)
        # Checkpoint only after the step is logged: a kill in between then repeats the step on
        # resume (and the logger skips what it already has) instead of losing it.
        self.maybe_checkpoint(step)
        self.history.append(metrics)
        if self.on_step is not None:
            self.on_step(step, metrics)
        return metrics

    def record(self, step: int, metrics: dict[str, float], rollout: Rollout, scores: Scores, warnings: list[str]) -> None:
        """Health tags, sample tables and periodic evaluation of ``step`` (its metrics are logged
        by the caller). A step the logger already has (recomputed after a resume) writes no
        table and no evaluation again: MLflow tables append, so they would duplicate."""
        cfg = self.config
        replay = self.logger is not None and step in self.logger.logged_steps()
        if self.logger is not None:
            for warning in warnings:
                self.logger.set_tags({f"health.{warning.split(':', 1)[0]}": f"step {step}: {warning.split(':', 1)[-1].strip()}"})
            if not replay and (step % cfg.tracking.sample_table_every == 0 or step == 1):
                rows = [
                    {"step": step, "prompt": p.prompt, "completion": c.text, "reward": s, "length": len(c.completion_ids),
                     "finish_reason": c.finish_reason}
                    for p, c, s in list(zip(rollout.prompts, rollout.completions, scores.totals))[: cfg.tracking.sample_table_rows]
                ]
                if rows:
                    self.logger.log_table(rows, f"samples/step_{step:05d}.json")
        if not replay and self.evaluator is not None and cfg.eval.every and step % cfg.eval.every == 0:
            eval_metrics = self.evaluator(self.engine, step)
            metrics.update({f"eval/{k}": v for k, v in eval_metrics.items()})
            rows = getattr(getattr(self.evaluator, "last_result", None), "rows", None)
            if self.logger is not None and rows:
                self.logger.log_table([{"step": step, **row} for row in rows], f"eval_samples/step_{step:05d}.json")

    def maybe_checkpoint(self, step: int) -> None:
        cfg = self.config
        if step % cfg.checkpoint.every == 0 or step == cfg.train.steps:
            self.save(step)

    def save(self, step: int, extra: dict[str, Any] | None = None) -> Path:
        path = save_checkpoint(self.arm_dir / f"step_{step:06d}", step=step, models=self._checkpoint_models(),
                               optimizers=self._checkpoint_optimizers(),
                               state={"sampler": self.sampler.state_dict(), "health": self.health.state_dict(),
                                      "optimizer_step": self.optimizer_step, "nonfinite": self.guard.state_dict(),
                                      "arm": self.arm, "policy_path": str(self.policy_path), **self.checkpoint_extra, **(extra or {})})
        prune_checkpoints(self.arm_dir, self.config.checkpoint.keep)
        if self.logger is not None:
            self.logger.set_tags({"polyrl.latest_checkpoint": str(path.resolve()), "polyrl.latest_checkpoint_step": step})
        return path

    def evaluate_start(self) -> dict[str, float]:
        """Held-out metrics of the starting policy, logged at step 0, so every eval curve
        begins at the warmed-up model the arm started from."""
        cfg = self.config
        if self.evaluator is None or not cfg.eval.every or self.step_index != 0:
            return {}
        metrics = {f"eval/{k}": v for k, v in self.evaluator(self.engine, 0).items()}
        if self.logger is not None:
            self.logger.log_metrics(0, metrics)
        return metrics

    def run(self) -> list[dict[str, float]]:
        self.start_metrics = self.evaluate_start()
        while self.step_index < self.config.train.steps:
            self.step()
        return self.history
