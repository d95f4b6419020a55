"""A tiny vision-language policy: Idefics3 (Llama text backbone, SigLIP-style vision tower).

Why Idefics3: on the CPU build of vLLM (no torchvision) it is the VLM that runs natively, with
prompt ids equal to the HF processor's and a sampler/learner log-prob gap of ~5e-7
(DESIGN.md, "Real components"). The same code builds it for CUDA.

Shape: text hidden 128, 3 layers; vision 2 layers × 64; 32×32 images, patch 8 → 16 patches,
``scale_factor=2`` pixel shuffle → 4 image tokens per image, no image splitting. The tokenizer
is the character tokenizer of the text policy plus the Idefics3 special tokens as whole
tokens. A processor (PIL image processor + tokenizer) is saved beside the weights, so
``AutoProcessor``, ``AutoModelForImageTextToText`` and vLLM load the folder.

``warm_vlm_policy`` trains it briefly on the shipped scenes VQA split (loss on the answer and
EOS only) and caches the result like the text policy (``models/warmup.py``): a folder named
by a hash of every input, written to a temporary folder and renamed into place.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import random
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from polyrl.engines.images import banned_token_ids
from polyrl.models.cache import INFO_FILE, build_cached, build_record, cache_key, is_complete, resolve_cache_dir, torch_threads
from polyrl.tasks import scenes

IMAGE_TOKEN = "<image>"
FAKE_IMAGE_TOKEN = "<fake_token_around_image>"
GLOBAL_IMAGE_TOKEN = "<global-img>"
END_OF_UTTERANCE = "<end_of_utterance>"
# The processor looks these up even without image splitting; giving them ids keeps them off <unk>.
ROW_COL_TOKENS = [f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)]
IMAGE_SPECIAL_TOKENS = [FAKE_IMAGE_TOKEN, IMAGE_TOKEN, END_OF_UTTERANCE, GLOBAL_IMAGE_TOKEN, *ROW_COL_TOKENS]

VLM_SIZES: dict[str, dict[str, Any]] = {
    "0.7m": dict(
        text=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2),
        vision=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2),
        image_size=32,
        patch_size=8,
        scale_factor=2,
    ),
}
WARMUP_CODE_VERSION = "1"
# 200 steps at lr 1e-3, batch 32: 55% held-out greedy VQA accuracy in ~20 s on one core (measured);
# the full supervised run reaches 99% (DESIGN.md), so RL has room above this start.
DEFAULT_WARMUP_STEPS = 200
DEFAULT_WARMUP_LR = 1e-3


def image_seq_len(size: str = "0.7m") -> int:
    spec = VLM_SIZES[size]
    return (spec["image_size"] // spec["patch_size"]) ** 2 // spec["scale_factor"] ** 2


def build_vlm_tokenizer():
    """The character tokenizer with the Idefics3 special tokens added as whole tokens."""
    from polyrl.models.text import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": IMAGE_SPECIAL_TOKENS})
    return tokenizer


def build_vlm_processor(size: str = "0.7m"):
    """An ``Idefics3Processor``: PIL image processor (32×32, no splitting) + the VLM tokenizer."""
    from transformers import Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    spec = VLM_SIZES[size]
    image_processor = Idefics3ImageProcessorPil(
        do_resize=True,
        size={"longest_edge": spec["image_size"]},
        do_image_splitting=False,
        max_image_size={"longest_edge": spec["image_size"]},
        do_pad=True,
    )
    return Idefics3Processor(image_processor=image_processor, tokenizer=build_vlm_tokenizer(), image_seq_len=image_seq_len(size))


def build_tiny_vlm(tokenizer, size: str = "0.7m", *, seed: int = 0):
    """A randomly initialised ``Idefics3ForConditionalGeneration``, deterministic for ``seed``.

    Untied embeddings, as for the text policy: vLLM's in-place reload does not rebuild a tied
    output head on every backend (DESIGN.md).
    """
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3VisionConfig, LlamaConfig

    if size not in VLM_SIZES:
        raise ValueError(f"unknown VLM size {size!r}; allowed: {sorted(VLM_SIZES)}")
    spec = VLM_SIZES[size]
    text = spec["text"]
    text_config = LlamaConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        rope_theta=10000.0,
        head_dim=text["hidden_size"] // text["num_attention_heads"],
        **text,
    )
    vision_config = Idefics3VisionConfig(image_size=spec["image_size"], patch_size=spec["patch_size"], **spec["vision"])
    config = Idefics3Config(
        text_config=text_config.to_dict(),
        vision_config=vision_config.to_dict(),
        scale_factor=spec["scale_factor"],
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(config)
    for key in ("pad_token_id", "eos_token_id", "bos_token_id"):
        setattr(model.generation_config, key, getattr(tokenizer, key))
    return model


def save_vlm_dir(model, processor, directory: str | Path) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    processor.save_pretrained(directory)
    return directory


# -- warm-up --------------------------------------------------------------------------------


def _encode_rows(processor, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    tokenizer = processor.tokenizer
    encoded = []
    for row in rows:
        inputs = processor(text=[row["prompt"]], images=[list(row["images"])], return_tensors="pt", add_special_tokens=False)
        answer_ids = tokenizer(" " + row["answer"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        encoded.append({"prompt_ids": inputs["input_ids"][0].tolist(), "answer_ids": answer_ids, "pixel_values": inputs["pixel_values"][0]})
    return encoded


def _batch(encoded: Sequence[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(e["prompt_ids"]) + len(e["answer_ids"]) for e in encoded)
    input_ids = torch.full((len(encoded), width), pad_id, dtype=torch.long)
    labels = torch.full((len(encoded), width), -100, dtype=torch.long)
    mask = torch.zeros((len(encoded), width), dtype=torch.long)
    for i, e in enumerate(encoded):
        ids = e["prompt_ids"] + e["answer_ids"]
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, len(e["prompt_ids"]) : len(ids)] = torch.tensor(e["answer_ids"])
        mask[i, : len(ids)] = 1
    pixel_values = torch.stack([e["pixel_values"] for e in encoded])  # [B, 1, C, H, W]
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels, "pixel_values": pixel_values}


@torch.no_grad()
def evaluate_vqa(model, processor, rows: Sequence[dict[str, Any]], *, max_new_tokens: int = 14, batch_size: int = 64) -> dict[str, Any]:
    """Greedy VQA accuracy (:func:`polyrl.tasks.scenes.answer_matches`) with the image/special tokens banned."""
    tokenizer = processor.tokenizer
    model.eval()
    correct, outputs = 0, []
    bad = [[i] for i in banned_token_ids(tokenizer)]
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        encoded = _encode_rows(processor, [{**r, "answer": ""} for r in chunk])
        width = max(len(e["prompt_ids"]) for e in encoded)
        input_ids = torch.full((len(chunk), width), tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(input_ids)
        for i, e in enumerate(encoded):
            input_ids[i, width - len(e["prompt_ids"]) :] = torch.tensor(e["prompt_ids"])
            mask[i, width - len(e["prompt_ids"]) :] = 1
        out = model.generate(
            input_ids=input_ids, attention_mask=mask, pixel_values=torch.stack([e["pixel_values"] for e in encoded]),
            max_new_tokens=max_new_tokens, do_sample=False, bad_words_ids=bad,
            pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        )
        for row, ids in zip(chunk, out[:, width:].tolist()):
            text = tokenizer.decode(ids, skip_special_tokens=True)
            correct += scenes.answer_matches(text, row["answer"])
            outputs.append(text)
    return {"accuracy": correct / max(1, len(rows)), "completions": outputs}


def _read_split(split: str) -> list[dict[str, Any]]:
    import datasets

    data = datasets.load_dataset("parquet", data_files={split: str(scenes.shipped_path(split))}, split=split)
    return [dict(row) for row in data]


def vlm_fingerprint(size: str) -> str:
    payload = json.dumps(
        {"size": VLM_SIZES[size], "tokens": IMAGE_SPECIAL_TOKENS, "builder": inspect.getsource(build_tiny_vlm)},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def warm_vlm_policy(
    cache_dir: str | Path | None = None,
    *,
    size: str = "0.7m",
    seed: int = 0,
    steps: int = DEFAULT_WARMUP_STEPS,
    lr: float = DEFAULT_WARMUP_LR,
    batch_size: int = 32,
    eval_prompts: int = 200,
    num_threads: int | None = 1,
    force: bool = False,
) -> Path:
    """Build (or reuse from the cache) the warmed-up VQA policy; return its folder.

    ``steps`` defaults to a short run so the start leaves room for RL (the measured record is
    ``polyrl_warmup.json``: held-out greedy accuracy, seconds, losses). lr 1e-3 as measured in
    DESIGN.md (2e-3 did not learn).
    """
    if size not in VLM_SIZES:
        raise ValueError(f"unknown VLM size {size!r}; allowed: {sorted(VLM_SIZES)}")
    cache_dir = resolve_cache_dir(cache_dir)
    settings = {
        "task": "scenes-vqa", "size": size, "seed": seed, "steps": steps, "lr": lr, "batch_size": batch_size,
        "eval_prompts": eval_prompts, "data_version": scenes.shipped_data_version(),
        "model_fingerprint": vlm_fingerprint(size), "code_version": WARMUP_CODE_VERSION,
    }
    key = cache_key("vlm", settings)
    final = cache_dir / key
    if not force and is_complete(final):
        return final

    def write(folder: Path) -> dict[str, Any]:
        started = time.perf_counter()
        processor = build_vlm_processor(size)
        model = build_tiny_vlm(processor.tokenizer, size, seed=seed)
        encoded = _encode_rows(processor, _read_split("train"))
        rng = random.Random(f"polyrl-vlm-warmup-{seed}")
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
        torch.manual_seed(seed)
        model.train()
        losses, order = [], []
        for _ in range(steps):
            if len(order) < batch_size:
                fresh = list(range(len(encoded)))
                rng.shuffle(fresh)
                order.extend(fresh)
            picked, order = order[:batch_size], order[batch_size:]
            loss = model(**_batch([encoded[i] for i in picked], processor.tokenizer.pad_token_id)).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(round(float(loss.detach()), 5))
        train_seconds = time.perf_counter() - started
        test_rows = _read_split("test")[:eval_prompts]
        result = evaluate_vqa(model, processor, test_rows)
        save_vlm_dir(model, processor, folder)
        return {
            **build_record(settings, key=key, params=sum(p.numel() for p in model.parameters()), started=started,
                           train_seconds=train_seconds),
            "losses": losses, "greedy_accuracy": result["accuracy"], "eval_num_prompts": len(test_rows),
            "examples": [{"prompt": r["prompt"], "answer": r["answer"], "greedy": c} for r, c in zip(test_rows, result["completions"][:8])],
        }

    with torch_threads(num_threads):
        return build_cached(final, write, force=force)
