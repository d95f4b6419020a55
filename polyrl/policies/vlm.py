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
EOS only) with the warm-up loop and cache the three built-in families share
(:mod:`polyrl.policies.recipe`): a folder named by a hash of every input, written to a
temporary folder and renamed into place.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import random
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from polyrl.engines.image_prompts import banned_token_ids
from polyrl.policies.recipe import WarmupRecipe, supervised_steps
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
# 200 steps at lr 1e-3, batch 32: 55% held-out greedy VQA accuracy (measured);
# the full supervised run reaches 99% (DESIGN.md), so RL has room above this start.
DEFAULT_WARMUP_STEPS = 200
DEFAULT_WARMUP_LR = 1e-3
CAPTION_WARMUP_STEPS = 150
# The longest scenes caption is 107 characters (one token each) + EOS.
CAPTION_MAX_TOKENS = 112


# Per warm-up task: its cache name, default steps and held-out prompts scored in the record.
# Captioning: CAPTION_WARMUP_STEPS measured to start RL mid-way (see the constant).
WARMUP_TASKS: dict[str, dict[str, Any]] = {
    "vqa": {"name": "scenes-vqa", "steps": DEFAULT_WARMUP_STEPS, "eval_prompts": 200},
    "caption": {"name": "scenes-caption", "steps": CAPTION_WARMUP_STEPS, "eval_prompts": 100},
}


def image_seq_len(size: str = "0.7m") -> int:
    spec = VLM_SIZES[size]
    return (spec["image_size"] // spec["patch_size"]) ** 2 // spec["scale_factor"] ** 2


def build_vlm_tokenizer():
    """The character tokenizer with the Idefics3 special tokens added as whole tokens."""
    from polyrl.policies.text import build_char_tokenizer

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
        encoded.append(
            {"prompt_ids": inputs["input_ids"][0].tolist(), "answer_ids": answer_ids, "pixel_values": inputs["pixel_values"][0]}
        )
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
def greedy_completions(
    model, processor, rows: Sequence[dict[str, Any]], *, max_new_tokens: int, batch_size: int = 64
) -> list[str]:
    """Greedy completions of ``rows`` (``prompt``, ``images``) with the image/special tokens banned."""
    tokenizer = processor.tokenizer
    model.eval()
    outputs = []
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
            input_ids=input_ids,
            attention_mask=mask,
            pixel_values=torch.stack([e["pixel_values"] for e in encoded]),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            bad_words_ids=bad,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        outputs.extend(tokenizer.decode(ids, skip_special_tokens=True) for ids in out[:, width:].tolist())
    return outputs


def evaluate_vqa(
    model, processor, rows: Sequence[dict[str, Any]], *, max_new_tokens: int = 14, batch_size: int = 64
) -> dict[str, Any]:
    """Greedy VQA accuracy (:func:`polyrl.tasks.scenes.answer_matches`) with the image/special tokens banned."""
    outputs = greedy_completions(model, processor, rows, max_new_tokens=max_new_tokens, batch_size=batch_size)
    correct = sum(scenes.answer_matches(text, row["answer"]) for row, text in zip(rows, outputs))
    return {"accuracy": correct / max(1, len(rows)), "completions": outputs}


def evaluate_captions(
    model,
    processor,
    rows: Sequence[dict[str, Any]],
    corpus: Sequence[Sequence[str]],
    *,
    max_new_tokens: int = CAPTION_MAX_TOKENS,
    batch_size: int = 64,
) -> dict[str, Any]:
    """Greedy captions scored by the ``cider`` reward module (df from ``corpus``, the training references)."""
    from polyrl.rewards.base import RewardBatch
    from polyrl.rewards.builtins.cider import Cider

    outputs = greedy_completions(model, processor, rows, max_new_tokens=max_new_tokens, batch_size=batch_size)
    references = [list(row["references"]) for row in rows]
    values = Cider(corpus_references=[list(refs) for refs in corpus]).score(
        RewardBatch(prompts=[row["prompt"] for row in rows], completions=outputs, references=references)
    )
    return {"cider": sum(values) / max(1, len(values)), "completions": outputs}


def _read_split(split: str, task: str = "vqa") -> list[dict[str, Any]]:
    import datasets

    path = scenes.shipped_path(split) if task == "vqa" else scenes.caption_path(split)
    data = datasets.load_dataset("parquet", data_files={split: str(path)}, split=split)
    return [dict(row) for row in data]


def _encode_captions(processor, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row once, with every reference encoded as a target (" " + caption + EOS)."""
    tokenizer = processor.tokenizer
    encoded = _encode_rows(processor, [{**row, "answer": ""} for row in rows])
    for row, entry in zip(rows, encoded):
        entry["targets"] = [
            tokenizer(" " + ref, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for ref in row["references"]
        ]
    return encoded


def vlm_fingerprint(size: str) -> str:
    payload = json.dumps(
        {"size": VLM_SIZES[size], "tokens": IMAGE_SPECIAL_TOKENS, "builder": inspect.getsource(build_tiny_vlm)},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def warm_vlm_policy(
    cache_dir: str | Path | None = None,
    *,
    task: str = "vqa",
    size: str = "0.7m",
    seed: int = 0,
    steps: int | None = None,
    lr: float = DEFAULT_WARMUP_LR,
    batch_size: int = 32,
    eval_prompts: int | None = None,
    num_threads: int | None = 1,
    force: bool = False,
) -> Path:
    """Build (or reuse from the cache) the warmed-up VQA or captioning policy; return its folder.

    ``steps`` defaults to a short run so the start leaves room for RL (the measured record is
    ``polyrl_warmup.json``: held-out greedy accuracy or CIDEr, seconds, losses). lr 1e-3 as
    measured in DESIGN.md (2e-3 did not learn). Captioning trains on one reference per scene
    per step, drawn at random, so the policy does not lock onto one template.
    """
    if size not in VLM_SIZES:
        raise ValueError(f"unknown VLM size {size!r}; allowed: {sorted(VLM_SIZES)}")
    if task not in WARMUP_TASKS:
        raise ValueError(f"unknown VLM warm-up task {task!r}; allowed: {list(WARMUP_TASKS)}")
    defaults = WARMUP_TASKS[task]
    steps = defaults["steps"] if steps is None else steps
    eval_prompts = defaults["eval_prompts"] if eval_prompts is None else eval_prompts
    recipe = WarmupRecipe(
        prefix="vlm",
        task=defaults["name"],
        size=size,
        seed=seed,
        steps=steps,
        lr=lr,
        batch_size=batch_size,
        eval_prompts=eval_prompts,
        data_version=scenes.shipped_data_version() if task == "vqa" else scenes.caption_data_version(),
        model_fingerprint=vlm_fingerprint(size),
        code_version=WARMUP_CODE_VERSION,
    )

    def train() -> tuple[torch.nn.Module, tuple[Any, list[dict[str, Any]], list[float]]]:
        processor = build_vlm_processor(size)
        model = build_tiny_vlm(processor.tokenizer, size, seed=seed)
        train_rows = _read_split("train", task)
        encoded = _encode_rows(processor, train_rows) if task == "vqa" else _encode_captions(processor, train_rows)
        torch.manual_seed(seed)
        batches = _warmup_batches(
            encoded, processor.tokenizer.pad_token_id, captions=task != "vqa", batch_size=batch_size, seed=seed
        )
        losses = supervised_steps(model, batches, steps=steps, lr=lr)
        return model, (processor, train_rows, [round(value, 5) for value in losses])

    def finish(folder: Path, model: torch.nn.Module, state: tuple[Any, list[dict[str, Any]], list[float]]) -> dict[str, Any]:
        processor, train_rows, losses = state
        test_rows = _read_split("test", task)[:eval_prompts]
        if task == "vqa":
            result = evaluate_vqa(model, processor, test_rows)
            scores = {"greedy_accuracy": result["accuracy"]}
            examples = [
                {"prompt": r["prompt"], "answer": r["answer"], "greedy": c} for r, c in zip(test_rows, result["completions"][:8])
            ]
        else:
            result = evaluate_captions(model, processor, test_rows, [r["references"] for r in train_rows])
            scores = {"greedy_cider": result["cider"]}
            examples = [
                {"scene_id": r["scene_id"], "references": list(r["references"]), "greedy": c}
                for r, c in zip(test_rows, result["completions"][:8])
            ]
        save_vlm_dir(model, processor, folder)
        return {"losses": losses, **scores, "eval_num_prompts": len(test_rows), "examples": examples}

    return recipe.build(cache_dir, train, finish, num_threads=num_threads, force=force)


def _warmup_batches(
    encoded: Sequence[dict[str, Any]], pad_id: int, *, captions: bool, batch_size: int, seed: int
) -> Iterator[dict[str, torch.Tensor]]:
    """Endless batches in a seeded shuffled order, epoch after epoch; captioning trains on one
    reference per scene per step, drawn at random, so the policy does not lock onto one template."""
    rng = random.Random(f"polyrl-vlm-warmup-{seed}")
    # A separate stream for the caption choice: the VQA run's batch order stays as it was.
    pick = random.Random(f"polyrl-vlm-caption-{seed}")
    order: list[int] = []
    while True:
        if len(order) < batch_size:
            fresh = list(range(len(encoded)))
            rng.shuffle(fresh)
            order.extend(fresh)
        picked, order = order[:batch_size], order[batch_size:]
        rows = [{**encoded[i], "answer_ids": pick.choice(encoded[i]["targets"])} if captions else encoded[i] for i in picked]
        yield _batch(rows, pad_id)
