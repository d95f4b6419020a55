"""Pairwise (Bradley–Terry) training of a small learned scorer, for the ``learned_scorer`` reward.

A reward model is trained on preference pairs (a prompt, a chosen and a rejected completion)
to give the chosen one the higher score: the loss is the mean of −log σ(r_chosen − r_rejected)
("Training language models to follow instructions with human feedback", Ouyang et al., arXiv
2203.02155, §3.5; the pairwise model of Bradley & Terry, Biometrika 1952). The scorer starts
from a causal LM folder: transformers' ``AutoModelForSequenceClassification`` with one output
keeps its transformer and adds a fresh linear ``score`` head read at the last token; only the
last ``trainable_layers`` transformer layers (and the final norm) and the head may be trained,
so a 135M model trains on a CPU.

Each pair is written exactly as ``learned_scorer`` writes it when it scores (a user turn and an
assistant turn of the tokenizer's chat template, :func:`polyrl.reward_models.scorer.encode_pair`)
and padded the same way (:func:`~polyrl.reward_models.scorer.padded_batch`), so the folder this
saves scores in training the text it was trained on.

:func:`arithmetic_preference_pairs` builds pairs from the shipped arithmetic task in the
``arithmetic_chat`` form (experiments/real/train_arithmetic_scorer.py trains on the train split
and reports pairwise accuracy on the test split). The task's splits are disjoint by prompt, but
addition commutes: a test problem (``7 + 5``) can have its twin (``5 + 7``) in train, and a scorer that learned ``5 + 7 = 12`` knows ``7 + 5``. So the pairs split on the unordered
problem (:func:`unordered_problem`): the train pairs leave out every problem whose unordered form
the test split holds.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from polyrl.reward_models.scorer import encode_pair, padded_batch
from polyrl.tasks import arithmetic


def bradley_terry_loss(chosen_scores: torch.Tensor, rejected_scores: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean of −log σ(r_c − r_r) over pairs, and its metrics.

    Metrics: ``loss``; ``accuracy``, the share of pairs with r_c > r_r (a tie counts as wrong:
    the scorer did not prefer the chosen one); ``margin``, the mean of r_c − r_r.
    """
    if chosen_scores.shape != rejected_scores.shape or chosen_scores.dim() != 1 or chosen_scores.numel() == 0:
        raise ValueError(
            f"bradley_terry_loss: chosen and rejected scores must be 1-D of the same non-zero length, "
            f"got {tuple(chosen_scores.shape)} and {tuple(rejected_scores.shape)}"
        )
    margin = chosen_scores.float() - rejected_scores.float()
    # logsigmoid is the numerically stable log σ (no overflow for a large negative margin).
    loss = -F.logsigmoid(margin).mean()
    metrics = {
        "loss": float(loss.detach()),
        "accuracy": float((margin > 0).float().mean()),
        "margin": float(margin.detach().mean()),
    }
    return loss, metrics


@dataclass(frozen=True)
class PreferencePair:
    """One comparison: for ``prompt``, ``chosen`` is better than ``rejected``. ``kind`` (optional)
    names the way the pair was made; :func:`evaluate_pairs` reports an accuracy per kind."""

    prompt: str
    chosen: str
    rejected: str
    kind: str = ""


# How an answer is written. A pair's chosen and rejected completions share the form, so the only
# thing that tells them apart is the number; several forms keep the scorer from keying on one
# phrasing, since a policy asked for "the number only" still writes sentences at times.
ANSWER_FORMS = ("{n}", "{n}.", "The answer is {n}.", "{a} {op} {b} = {n}")
# Wrong answers near the right one (an off-by-one or a slipped carry), as a policy writes them.
WRONG_OFFSETS = (-10, -2, -1, 1, 2, 10)


def unordered_problem(prompt: str) -> tuple[str, int, int]:
    """An arithmetic prompt's problem up to commutation: ``(op, a, b)`` with the operands of a sum
    sorted (``7+5`` and ``5+7`` are one problem; ``12-7`` and ``7-12`` are not)."""
    a, op, b = arithmetic.parse_prompt(prompt)
    return (op, min(a, b), max(a, b)) if op == "+" else (op, a, b)


def arithmetic_preference_pairs(split: str, *, seed: int = 0, limit: int | None = None) -> list[PreferencePair]:
    """One pair per shipped ``split`` row of the arithmetic task, in ``arithmetic_chat`` form;
    the train split without the rows whose :func:`unordered_problem` the test split holds.

    The prompt is the chat question the ``arithmetic_chat`` source asks (``What is 37 + 48?
    Answer with the number only.``). The chosen completion states the right answer, the rejected
    one a wrong answer in the same form: half the time the right answer plus one of
    :data:`WRONG_OFFSETS` (never negative; kind ``near``), else another row's answer (kind
    ``other``, often far off: a scorer can tell those by size alone, so the two kinds' accuracies
    are reported apart). Deterministic in ``seed``; ``limit`` keeps the first of those rows, in the shipped file's order.
    """
    rows = arithmetic.read_rows(split)
    if split != "test":
        held_out = {unordered_problem(row["prompt"]) for row in arithmetic.read_rows("test")}
        rows = [row for row in rows if unordered_problem(row["prompt"]) not in held_out]
    if limit is not None:
        rows = rows[:limit]
    rng = random.Random(f"polyrl-arithmetic-pairs-{seed}-{split}")
    answers = [int(row["answer"]) for row in rows]
    pairs = []
    for row in rows:
        a, op, b = arithmetic.parse_prompt(row["prompt"])
        right = arithmetic.compute_answer(a, op, b)
        if rng.random() < 0.5:
            kind, wrong = "near", right + rng.choice([o for o in WRONG_OFFSETS if right + o >= 0])
        else:
            others = [n for n in answers if n != right]
            kind, wrong = "other", rng.choice(others) if others else right + 1
        form = rng.choice(ANSWER_FORMS)
        pairs.append(
            PreferencePair(
                prompt=arithmetic.chat_row(row)["prompt"],
                chosen=form.format(n=right, a=a, op=op, b=b),
                rejected=form.format(n=wrong, a=a, op=op, b=b),
                kind=kind,
            )
        )
    return pairs


@dataclass(frozen=True)
class PairwiseSettings:
    """How the scorer is trained.

    steps: optimizer steps; batch_pairs: pairs per step (their chosen and rejected rows go
    through one forward pass); trainable_layers: train the last N transformer layers, the final
    norm and the head (0: the head alone; None: every parameter); chat_template: as
    ``learned_scorer``'s parameter of the same name (the saved folder must be scored with the same).
    """

    steps: int = 100
    batch_pairs: int = 8
    learning_rate: float = 1e-4
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    trainable_layers: int | None = None
    seed: int = 0
    chat_template: bool = True

    def __post_init__(self) -> None:
        for name in ("steps", "batch_pairs"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: a positive integer, got {value!r}")
        if self.trainable_layers is not None and (not isinstance(self.trainable_layers, int) or self.trainable_layers < 0):
            raise ValueError(f"trainable_layers: a non-negative integer or None (all), got {self.trainable_layers!r}")
        if not self.learning_rate > 0 or self.weight_decay < 0 or not self.max_grad_norm > 0:
            raise ValueError(
                f"learning_rate and max_grad_norm must be > 0 and weight_decay >= 0, got {self.learning_rate}, "
                f"{self.max_grad_norm}, {self.weight_decay}"
            )


def load_scorer_from_lm(model_dir: str | Path, *, seed: int = 0) -> tuple[Any, Any]:
    """``(model, tokenizer)``: the causal LM in ``model_dir`` as a one-output sequence classifier.

    The transformer's weights load from the folder; the ``score`` head is new, initialised
    under ``torch.manual_seed(seed)``. A tokenizer without a pad token gets EOS as its pad id in
    the model's config (transformers refuses batches otherwise); the forward passes here pad
    with an id no row holds (see ``padded_batch``), so the choice never moves the scored token.
    """
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = Path(model_dir).expanduser()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=1, dtype=torch.float32)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    model.config.pad_token_id = pad
    return model, tokenizer


def set_trainable_layers(model: Any, trainable_layers: int | None) -> list[str]:
    """Freeze all but the head, the final norm and the last ``trainable_layers`` transformer
    layers (``None``: train everything); returns the trainable parameters' names."""
    if trainable_layers is None:
        for parameter in model.parameters():
            parameter.requires_grad_(True)
        return [name for name, _ in model.named_parameters()]
    prefix = model.base_model_prefix
    base = getattr(model, prefix, None)
    layers = getattr(base, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(
            f"trainable_layers: {type(model).__name__} keeps no transformer layers at {prefix}.layers; "
            "set trainable_layers to None (train every parameter)"
        )
    if trainable_layers > len(layers):
        raise ValueError(f"trainable_layers: {trainable_layers}, but the model has {len(layers)} layers")
    keep = [f"{prefix}.layers.{i}." for i in range(len(layers) - trainable_layers, len(layers))]
    if trainable_layers > 0 and isinstance(getattr(base, "norm", None), torch.nn.Module):
        keep.append(f"{prefix}.norm.")
    names = []
    for name, parameter in model.named_parameters():
        # Parameters outside the base model are the head (``score``).
        train = not name.startswith(prefix + ".") or any(name.startswith(k) for k in keep)
        parameter.requires_grad_(train)
        if train:
            names.append(name)
    return names


def pair_scores(
    model: Any, tokenizer: Any, pairs: Sequence[PreferencePair], *, chat_template: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's scores of the chosen and of the rejected completions, in one forward pass
    (gradients flow when the caller has them on)."""
    rows = [encode_pair(tokenizer, p.prompt, p.chosen, chat_template=chat_template) for p in pairs]
    rows += [encode_pair(tokenizer, p.prompt, p.rejected, chat_template=chat_template) for p in pairs]
    ids, mask, pad = padded_batch(rows, int(model.get_input_embeddings().num_embeddings))
    model.config.pad_token_id = pad
    device = next(model.parameters()).device
    scores = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits[:, 0].float()
    return scores[: len(pairs)], scores[len(pairs) :]


@torch.no_grad()
def evaluate_pairs(
    model: Any, tokenizer: Any, pairs: Sequence[PreferencePair], *, batch_pairs: int = 16, chat_template: bool = True
) -> dict[str, float]:
    """Bradley–Terry loss, pairwise accuracy and mean margin over ``pairs`` (no training), and
    ``accuracy/<kind>`` with ``pairs/<kind>`` for each non-empty ``PreferencePair.kind``."""
    was_training = model.training
    model.eval()
    chosen, rejected = [], []
    for start in range(0, len(pairs), batch_pairs):
        c, r = pair_scores(model, tokenizer, pairs[start : start + batch_pairs], chat_template=chat_template)
        chosen.append(c)
        rejected.append(r)
    model.train(was_training)
    chosen_all, rejected_all = torch.cat(chosen), torch.cat(rejected)
    _, metrics = bradley_terry_loss(chosen_all, rejected_all)
    metrics["pairs"] = float(len(pairs))
    for kind in sorted({p.kind for p in pairs} - {""}):
        rows = torch.tensor([p.kind == kind for p in pairs])
        metrics[f"accuracy/{kind}"] = float((chosen_all[rows] > rejected_all[rows]).float().mean())
        metrics[f"pairs/{kind}"] = float(rows.sum())
    return metrics


def train_pairwise(
    model: Any,
    tokenizer: Any,
    pairs: Sequence[PreferencePair],
    settings: PairwiseSettings,
    *,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> list[dict[str, float]]:
    """Train ``model`` on ``pairs`` with AdamW for ``settings.steps`` steps; returns each step's
    metrics (``loss``, ``accuracy``, ``margin`` of its batch, ``grad_norm``).

    Batches are drawn without replacement from a shuffled pass over ``pairs`` (a new shuffle per
    pass), seeded by ``settings.seed``.
    """
    if not pairs:
        raise ValueError("train_pairwise: no pairs to train on")
    set_trainable_layers(model, settings.trainable_layers)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=settings.learning_rate, weight_decay=settings.weight_decay)
    rng = random.Random(settings.seed)
    order: list[int] = []
    history = []
    model.train()
    for step in range(1, settings.steps + 1):
        batch = []
        while len(batch) < min(settings.batch_pairs, len(pairs)):
            if not order:
                order = list(range(len(pairs)))
                rng.shuffle(order)
            batch.append(pairs[order.pop()])
        chosen, rejected = pair_scores(model, tokenizer, batch, chat_template=settings.chat_template)
        loss, metrics = bradley_terry_loss(chosen, rejected)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        metrics["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(trainable, settings.max_grad_norm))
        optimizer.step()
        history.append(metrics)
        if on_step is not None:
            on_step(step, metrics)
    model.eval()
    return history


def save_scorer(model: Any, tokenizer: Any, out: str | Path) -> Path:
    """Write the scorer (safetensors) and its tokenizer to ``out``: a ``learned_scorer`` folder."""
    out = Path(out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    # The forward passes left the last batch's padding id in the config; store the tokenizer's.
    model.config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    model.save_pretrained(out)  # transformers 5 writes safetensors only
    tokenizer.save_pretrained(out)
    return out
