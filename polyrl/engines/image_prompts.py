"""Image prompts for the rollout engines: processor, token ids, banned tokens, learner inputs.

One image-text prompt has three forms:

* *un-expanded ids*: the prompt tokenised with one image token per image (``<image>`` for
  Idefics3). vLLM takes these with ``multi_modal_data`` and inserts the image's tokens itself;
  sending expanded ids would expand them twice (DESIGN.md).
* *expanded ids*: what the model's processor makes (Idefics3: ``<fake_token_around_image>
  <global-img>`` + ``<image>`` × 4 + ``<fake_token_around_image>`` per 32×32 image). vLLM
  returns these as the request's ``prompt_token_ids``; the HF engine and the learner use them.
* *image inputs*: the processor's tensors other than the ids (``pixel_values``, and
  ``pixel_attention_mask`` for Idefics3 or ``image_grid_thw`` for Qwen2.5-VL), stored on each
  :class:`Completion` so the learner's forward sees the same pixels.

Prompts write ``<image>`` (polyrl's placeholder) once per image; :func:`model_prompt_text`
swaps it for the model's own image token when that differs (Qwen2.5-VL:
``<|vision_start|><|image_pad|><|vision_end|>``; that path is written for CUDA vLLM and is
untested on this CPU machine, whose vLLM cannot run Qwen2.5-VL without torchvision).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch

from polyrl.data.image_rows import model_takes_images  # noqa: F401 - re-exported for the engines
from polyrl.modeling.logprobs import collate_image_inputs  # noqa: F401 - the learner's collation, re-exported

IMAGE_PLACEHOLDER = "<image>"
# Token strings that belong to images or to the chat scaffolding of known image-text models.
# A policy that samples one of them asks the next forward for an image that is not there.
_IMAGE_TOKEN_PATTERNS = (
    "<image>",
    "<fake_token_around_image>",
    "<global-img>",
    "<end_of_utterance>",
    "<|image_pad|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|video_pad|>",
)
# Inputs of a processor that are the ids themselves, not image data.
_ID_KEYS = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids")


def load_processor(model_path: str | Path) -> Any | None:
    """The model's ``AutoProcessor`` when it is an image-text model, else ``None``."""
    if not model_takes_images(model_path):
        return None
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(str(model_path))


def banned_token_ids(tokenizer: Any) -> list[int]:
    """Ids an image-text policy must never sample: image/scaffolding tokens, ``<row_i_col_j>``
    tiles, and pad/bos/unk (never EOS).

    The sampler bans them (vLLM ``allowed_token_ids``, HF ``bad_words_ids``) and the learner
    masks the same ids to ``-inf`` (:func:`polyrl.modeling.logprobs.token_logprobs` reads them from
    the completions), so both normalise over the same vocabulary and log-probs agree.
    """
    vocab = tokenizer.get_vocab()
    ids = {vocab[t] for t in _IMAGE_TOKEN_PATTERNS if t in vocab}
    ids.update(index for token, index in vocab.items() if token.startswith("<row_") and "_col_" in token)
    for name in ("pad_token_id", "bos_token_id", "unk_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None and value != tokenizer.eos_token_id:
            ids.add(int(value))
    return sorted(ids)


def image_token(processor: Any) -> str:
    return getattr(processor, "image_token", None) or IMAGE_PLACEHOLDER


def model_prompt_text(prompt: str, processor: Any) -> str:
    """The prompt with polyrl's ``<image>`` placeholder in the model's own image-token form."""
    token = image_token(processor)
    if token == IMAGE_PLACEHOLDER:
        return prompt
    if token == "<|image_pad|>":  # Qwen2-VL family: the image sits between vision markers
        token = "<|vision_start|><|image_pad|><|vision_end|>"
    return prompt.replace(IMAGE_PLACEHOLDER, token)


def encode_image_prompt(
    processor: Any, prompt: str, images: Sequence[Any]
) -> tuple[list[int], list[int], dict[str, torch.Tensor]]:
    """``(un-expanded ids, expanded ids, image inputs)`` of one prompt with its images."""
    text = model_prompt_text(prompt, processor)
    found = prompt.count(IMAGE_PLACEHOLDER)
    if found != len(images):
        raise ValueError(f"prompt has {found} {IMAGE_PLACEHOLDER} placeholder(s) for {len(images)} image(s): {prompt[:80]!r}")
    unexpanded = list(processor.tokenizer(text, add_special_tokens=False)["input_ids"])
    rgb = [image.convert("RGB") if hasattr(image, "convert") else image for image in images]
    processed = processor(text=[text], images=[rgb], return_tensors="pt", add_special_tokens=False)
    expanded = processed["input_ids"][0].tolist()
    inputs = {key: value for key, value in processed.items() if key not in _ID_KEYS and isinstance(value, torch.Tensor)}
    return unexpanded, expanded, inputs


def prompt_modalities(prompt_ids: Sequence[int], image_ids: set[int]) -> list[str]:
    return ["image" if token in image_ids else "text" for token in prompt_ids]


def auto_model_class(model_path: str | Path) -> Any:
    """``AutoModelForImageTextToText`` for an image-text model folder (the full multimodal
    model: vision tower, connector, decoder, head), else ``AutoModelForCausalLM``."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if model_takes_images(model_path) else AutoModelForCausalLM
