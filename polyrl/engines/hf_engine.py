"""The ``hf`` rollout engine: transformers ``generate`` with left padding.

Log-probs come from the processed scores (logits after temperature/top-p), the distribution
the token was sampled from (:mod:`polyrl.engines.base`). ``generate`` is called with
``top_k=0``, ``repetition_penalty=1`` and one beam, so the model directory's
``generation_config`` cannot change the sampling distribution.

Seeding: transformers samples a whole batch from the one global torch generator, so a row's
tokens would depend on the rows beside it. Instead each row (sample ``j`` of prompt ``i``) draws
from its own ``torch.Generator`` seeded per request as vLLM does (:func:`request_seed`): the
last logits processor (:class:`SeededRowSampler`) samples every row's token from the processed
scores with the row's generator, keeps its log-prob, and leaves only that token for
``generate``'s greedy pick. Temperature and top-p are applied by transformers' own warpers,
placed before it. The global torch generator is neither used nor reset.

Image-text models (a ``vision_config`` in the model folder) load with
``AutoModelForImageTextToText``; an image prompt is run through the model's processor (expanded
ids + ``pixel_values``) and a batch may mix image and text-only prompts
(:func:`polyrl.engines.image_prompts.collate_image_inputs`). Image/special tokens are banned with
``bad_words_ids``, applied before temperature, so the processed scores exclude them as the
learner does. Tested with Idefics3 on CPU; other image-text models (e.g. Qwen2.5-VL on CUDA)
take the same path, untested here.
"""

from __future__ import annotations

import gc
from typing import Any, Iterable

import torch

from polyrl.core.types import Completion, PromptSample, SamplingSettings
from polyrl.engines import image_prompts
from polyrl.engines.base import RolloutEngine, eos_ids, request_seed
from polyrl.engines.modality_marks import load_modality_rule
from polyrl.engines.stop_tokens import completion_text, stop_token_ids
from polyrl.runtime.devices import auto_device_name


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
        kv_cache_need: Any = None,
        enforce_eager: bool = True,
        device: str | None = None,
        batch_size: int | None = None,
        model: torch.nn.Module | None = None,
        tokenizer: Any = None,
    ) -> None:
        from transformers import AutoTokenizer

        del kv_cache_gb, kv_cache_need, enforce_eager  # vLLM-only knobs, accepted for a uniform factory
        self.model_path = str(model_path)
        self.seed = seed
        self.max_model_len = max_model_len
        self.batch_size = batch_size
        self.device = torch.device(device or auto_device_name())
        torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(self.model_path)
        self.tokenizer.padding_side = "left"
        # Image-text models load whole (vision tower included): AutoModelForImageTextToText.
        model_class = image_prompts.auto_model_class(self.model_path)
        self.model = model or model_class.from_pretrained(self.model_path, dtype=torch_dtype)
        self.model.to(self.device).eval()
        # EOS, the generation config's EOS ids and the chat template's end of turn (stop_tokens.py).
        self.eos_ids = set(eos_ids(self.tokenizer, self.model)) | stop_token_ids(self.tokenizer)
        text_config = getattr(self.model.config, "text_config", None) or self.model.config
        self._setup_images(self.model_path, getattr(text_config, "vocab_size", None))
        self.modality_rule = load_modality_rule(self.model_path, self.tokenizer)
        self._pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.eos_ids)

    def generate(self, prompts: list[PromptSample], settings: SamplingSettings) -> list[list[Completion]]:
        if not prompts:
            return []
        # Expanded ids (the processor's) and image tensors; text prompts: their ids and None.
        encoded = [self._encode_images(p)[1:] for p in prompts]
        # One row per sample, grouped per prompt: row i*n + j is sample j of prompt i.
        rows = [row for row in encoded for _ in range(settings.n)]
        base = self.seed if settings.seed is None else settings.seed
        seeds = [
            request_seed(base, settings.first_prompt_index + i, settings.n) + j
            for i in range(len(prompts))
            for j in range(settings.n)
        ]
        chunk = self.batch_size or len(rows)
        flat: list[Completion] = []
        for start in range(0, len(rows), chunk):
            flat.extend(self._generate_rows(rows[start : start + chunk], settings, seeds[start : start + chunk]))
        return [flat[i * settings.n : (i + 1) * settings.n] for i in range(len(prompts))]

    @torch.no_grad()
    def _generate_rows(
        self, rows: list[tuple[list[int], dict[str, Any] | None]], settings: SamplingSettings, seeds: list[int]
    ) -> list[Completion]:
        width = max(len(r) for r, _ in rows)
        input_ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (r, _) in enumerate(rows):
            input_ids[i, width - len(r) :] = torch.as_tensor(r)
            attention_mask[i, width - len(r) :] = 1
        greedy = settings.temperature == 0
        # Sampled rows: SeededRowSampler picks each token and generate's greedy step takes it.
        sampler = None if greedy else SeededRowSampler(seeds, self.device)
        gen_kwargs: dict[str, Any] = dict(
            do_sample=False,
            max_new_tokens=settings.max_tokens,
            eos_token_id=sorted(self.eos_ids) or None,
            pad_token_id=self._pad_id,
            return_dict_in_generate=True,
            output_scores=greedy,
            # Pin every knob so generation_config defaults (top_k=50, penalties) cannot apply;
            # temperature and top-p act through the processors below.
            top_k=0,
            top_p=1.0,
            temperature=1.0,
            repetition_penalty=1.0,
            num_beams=1,
        )
        if sampler is not None:
            from transformers import LogitsProcessorList

            gen_kwargs["logits_processor"] = LogitsProcessorList(sampling_warpers(settings) + [sampler])
        if settings.stop:
            gen_kwargs["stop_strings"] = list(settings.stop)
            gen_kwargs["tokenizer"] = self.tokenizer
        if self.banned_token_ids:
            # -inf before temperature, so the processed scores (the sampling log-probs) exclude
            # them, as the learner does with the same ids.
            gen_kwargs["bad_words_ids"] = [[i] for i in self.banned_token_ids]
        images = image_prompts.collate_image_inputs([inputs for _, inputs in rows])
        for key, value in images.items():
            if key == "pixel_values":
                value = value.to(next(self.model.parameters()).dtype)
            gen_kwargs[key] = value.to(self.device)
        out = self.model.generate(
            input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device), **gen_kwargs
        )
        new_tokens = out.sequences[:, width:].cpu()  # [B, L]
        if sampler is not None:
            logprobs = sampler.sampled_logprobs().cpu()  # under the processed scores: the sampling distribution
        else:
            scores = torch.stack(out.scores, dim=1).float()  # [B, L, V]
            logprobs = torch.log_softmax(scores, dim=-1).gather(-1, new_tokens.to(scores.device)[..., None]).squeeze(-1).cpu()
        completions = []
        eos = torch.tensor(sorted(self.eos_ids)) if self.eos_ids else torch.tensor([], dtype=torch.long)
        is_eos = torch.isin(new_tokens, eos)
        for i, (r, image_inputs) in enumerate(rows):
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
            text = completion_text(self.tokenizer, ids, finish, self.eos_ids, settings.stop)
            completions.append(
                Completion(
                    prompt_ids=list(r),
                    completion_ids=ids,
                    text=text,
                    sampling_logprobs=logprobs[i, :length].tolist(),
                    finish_reason=finish,
                    completion_token_modalities=self.completion_modalities(ids),
                    policy_version=self.policy_version,
                    **self._image_fields(list(r), image_inputs),
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


def sampling_warpers(settings: SamplingSettings) -> list[Any]:
    """transformers' temperature and top-p warpers for ``settings`` (none at 1.0), in the order
    ``generate`` would apply them when sampling."""
    from transformers import TemperatureLogitsWarper, TopPLogitsWarper

    warpers: list[Any] = []
    if settings.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(settings.temperature))
    if settings.top_p < 1.0:
        warpers.append(TopPLogitsWarper(settings.top_p))
    return warpers


class SeededRowSampler:
    """The last logits processor: samples each row's next token from the processed scores with
    the row's own generator and records its log-prob; returns scores that leave only that token
    (0 for it, -inf elsewhere), so ``generate``'s greedy step takes it.

    A row's stream depends only on its seed: the same prompt and seed sample the same tokens
    whichever rows share the batch (up to float rounding of a batch of another shape).
    """

    def __init__(self, seeds: list[int], device: torch.device):
        self.generators = [torch.Generator(device=device).manual_seed(int(seed)) for seed in seeds]
        self._logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        logprobs = torch.log_softmax(scores.float(), dim=-1)
        probs = logprobs.exp()
        chosen = torch.cat([torch.multinomial(probs[i], 1, generator=g) for i, g in enumerate(self.generators)])
        self._logprobs.append(logprobs.gather(-1, chosen[:, None]).squeeze(-1))
        only = torch.full_like(scores, float("-inf"))
        return only.scatter_(1, chosen[:, None], 0.0)

    def sampled_logprobs(self) -> torch.Tensor:
        """``[rows, steps]``: each sampled token's log-prob under the distribution it came from."""
        return torch.stack(self._logprobs, dim=1)


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
