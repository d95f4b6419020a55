"""Run an eval suite through a rollout engine: generate, score, summarise, one row per sample.

:class:`SuiteRunner` loads the datasets and sets up the metric modules once; ``run(engine)``
can then be called many times (``polyrl eval`` once per model, periodic evaluation once per
eval step on the training run's own engine).

Metric names (every one prefixed with the dataset's name, ``<dataset>/``):

- ``accuracy`` — the share of scored samples the suite's ``accuracy`` module scores > 0
  (:func:`polyrl.rewards.summary.accuracy_share`, the definition ``train/accuracy`` uses too;
  over all samples of all prompts, so with ``n > 1`` it is the expected pass@1),
  ``accuracy/unscored``;
- ``pass_at_<k>`` — unbiased pass@k (:mod:`polyrl.evals.passk`);
- ``length/{mean,median,p90,max,truncated_share}`` — completion tokens;
- ``reward/<label>/{mean,std,unscored}`` and ``reward/{mean,std,unscored}`` — the suite's
  reward modules, combined exactly as in training (:class:`polyrl.rewards.CompositeReward`);
- caption suites: ``coco/{BLEU-1..4,METEOR,ROUGE-L,CIDEr}`` (pycocoevalcap, PTB tokenizer)
  and ``cider_fast`` (the in-process ``cider`` reward module, df from the split's references).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polyrl.core.types import Completion, PromptSample
from polyrl.data.chat import ChatFormat, chat_in_effect, format_prompts
from polyrl.data.prompt_samples import rows_to_prompt_samples
from polyrl.data.prompts import load_prompt_dataset
from polyrl.evals.coco import coco_caption_metrics
from polyrl.evals.example_outcomes import example_id
from polyrl.evals.passk import mean_pass_at_k
from polyrl.evals.suite import DatasetSpec, EvalError, EvalSuite, load_suite, resolve_source
from polyrl.rewards import CompositeReward, RewardBatch, RewardSpec, run_module
from polyrl.rewards import summary as stats


@dataclass
class EvalResult:
    suite: str
    metrics: dict[str, float]
    rows: list[dict[str, Any]]  # the per-sample table
    datasets: dict[str, dict[str, int]]  # name -> {"prompts", "samples"}
    seconds: float = 0.0
    # The prompt images (PIL) of each row of ``rows``, for the HTML sample table; empty lists
    # for text prompts. Kept out of ``rows``, which go to JSON.
    row_images: list[list[Any]] = field(default_factory=list)


@dataclass
class _Dataset:
    spec: DatasetSpec
    samples: list[PromptSample]
    accuracy: Any | None = None  # the accuracy reward module, set up
    cider: Any | None = None  # the in-process CIDEr module (caption suites)
    chat: ChatFormat = ChatFormat()
    # ``samples`` formatted for one tokenizer (chat prompts), made once per tokenizer.
    formatted: list[PromptSample] | None = None
    formatted_for: Any = None


def chat_format(spec: DatasetSpec, default: ChatFormat | None) -> ChatFormat:
    """The dataset's chat settings: its own, else the training run's (``default``: periodic eval
    formats its prompts as the run's training prompts are)."""
    own = ChatFormat(spec.chat_template, spec.system_prompt, spec.messages_field, where=f"datasets[{spec.label}]")
    if default is None or spec.chat_template is not None or spec.system_prompt is not None:
        return own
    return ChatFormat(default.chat_template, default.system_prompt, spec.messages_field, where=default.where)


def load_samples(
    spec: DatasetSpec, *, base_dir: Path | None, limit: int | None, messages_field: str | None = None
) -> list[PromptSample]:
    """The dataset's prompts; ``limit`` (from the CLI or ``eval.limit``) caps the suite's own;
    ``messages_field``: chat rows may carry messages instead of a prompt (:mod:`polyrl.data.chat`)."""
    cap = min(x for x in (spec.limit, limit) if x is not None) if (spec.limit or limit) else None
    dataset = load_prompt_dataset(
        resolve_source(spec.source, base_dir),
        spec.split,
        prompt_field=spec.prompt_field,
        answer_field=spec.answer_field,
        references_field=spec.references_field,
        images_field=spec.image_field or "images",
        limit=cap,
        holdout=spec.holdout,
        # A dataset that names no split takes a single file whole; a split it names must be honoured.
        whole_file="split" not in spec.model_fields_set and spec.holdout is None,
        messages_field=messages_field,
    )
    if spec.image_field and spec.image_field not in dataset.column_names:
        raise EvalError(f"datasets[{spec.label}].image_field: column {spec.image_field!r} not in {dataset.column_names}")
    # The prompt loader opens the images (RGB PIL) into PromptSample.images (data/images.py).
    return rows_to_prompt_samples(
        dataset,
        prompt_field=spec.prompt_field,
        answer_field=spec.answer_field,
        references_field=spec.references_field,
        images_field=spec.image_field or "images",
        messages_field=messages_field,
    )


class SuiteRunner:
    """A suite with its data loaded and its metric modules set up, ready to run on engines."""

    def __init__(
        self,
        suite: EvalSuite | str | Path,
        *,
        limit: int | None = None,
        base_dir: Path | None = None,
        chat: ChatFormat | None = None,
    ):
        """``chat``: the chat settings of datasets that set none (periodic eval: the run's ``data``)."""
        self.suite, found_dir = load_suite(suite)
        self.base_dir = base_dir or found_dir
        self.settings = self.suite.generation.sampling_settings()
        self.datasets = [self._prepare(spec, limit, chat) for spec in self.suite.datasets]
        self.rewards = self._build_rewards(self.suite.metrics.rewards)

    def _prepare(self, spec: DatasetSpec, limit: int | None, default_chat: ChatFormat | None) -> _Dataset:
        from polyrl.rewards.builtins.accuracy import Accuracy
        from polyrl.rewards.builtins.cider import Cider

        chat = chat_format(spec, default_chat)
        data = _Dataset(
            spec, load_samples(spec, base_dir=self.base_dir, limit=limit, messages_field=chat.rows_messages_field), chat=chat
        )
        params = self.suite.accuracy_params(spec)
        if params is not None:
            module = str(params.pop("module", "accuracy"))  # another reward module may count right (reasoning_gym)
            if module == "accuracy":  # the dataset's answer column is the gold answer unless the suite says otherwise
                params.setdefault("answer_field", spec.answer_field)
            data.accuracy = RewardSpec(module=module, params=params).build()
            data.accuracy.setup()
            if module == "accuracy" and not isinstance(data.accuracy, Accuracy):  # pragma: no cover - registry misconfigured
                raise EvalError("metrics.accuracy: the registered 'accuracy' module is not polyrl's Accuracy")
        if self.suite.kind == "caption":
            corpus = [s.references for s in data.samples if s.references]
            if not corpus:
                raise EvalError(f"dataset {spec.label!r}: a caption suite needs references (field {spec.references_field!r})")
            data.cider = Cider(corpus_references=corpus)
            data.cider.setup()
        return data

    @staticmethod
    def _build_rewards(specs: list[RewardSpec]) -> CompositeReward | None:
        if not specs:
            return None
        reward = CompositeReward(specs)
        reward.setup()
        return reward

    # -- running -----------------------------------------------------------------------------

    def run(self, engine: Any) -> EvalResult:
        started = time.perf_counter()
        metrics: dict[str, float] = {}
        rows: list[dict[str, Any]] = []
        images: list[list[Any]] = []
        counts: dict[str, dict[str, int]] = {}
        for data in self.datasets:
            samples = self.prompts(engine, data)
            groups = self._generate(engine, data, samples)
            dataset_metrics, dataset_rows = self._score(data, groups, samples)
            metrics.update({f"{data.spec.label}/{k}": v for k, v in dataset_metrics.items()})
            rows.extend(dataset_rows)
            images.extend(list(data.samples[row["prompt_index"]].images) for row in dataset_rows)
            counts[data.spec.label] = {"prompts": len(data.samples), "samples": len(dataset_rows)}
        return EvalResult(self.suite.name, metrics, rows, counts, time.perf_counter() - started, row_images=images)

    def check_model(self, model_dir: str | Path, *, field: str = "--model") -> None:
        """Refuse a text-only model for a suite with image prompts (names the dataset and row)."""
        from polyrl.data.image_rows import check_model_takes_images

        for data in self.datasets:
            try:
                check_model_takes_images(model_dir, data.samples, field=field, images_field=data.spec.image_field or "images")
            except ValueError as error:
                raise EvalError(f"dataset {data.spec.label!r}: {error}") from None
        self.check_chat(model_dir)

    def check_chat(self, model_dir: str | Path) -> None:
        """Format the chat datasets' prompts with the model's tokenizer now, so a model without a
        chat template is refused before any engine starts (raises ChatTemplateError)."""
        chat_datasets = [data for data in self.datasets if chat_in_effect(data.chat, data.samples) or data.chat.system_prompt]
        if not chat_datasets:
            return
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        for data in chat_datasets:
            format_prompts(data.samples, tokenizer, data.chat, model=str(model_dir))

    def prompts(self, engine: Any, data: _Dataset) -> list[PromptSample]:
        """The dataset's prompts as ``engine``'s model sees them (chat-formatted with its tokenizer
        when chat formatting is in effect), made once per tokenizer."""
        tokenizer = getattr(engine, "tokenizer", None)
        if data.formatted is None or data.formatted_for is not tokenizer:
            model = str(getattr(engine, "model_path", "the model"))
            data.formatted = format_prompts(data.samples, tokenizer, data.chat, model=model)
            data.formatted_for = tokenizer
        return data.formatted

    def _generate(self, engine: Any, data: _Dataset, samples: list[PromptSample]) -> list[list[Completion]]:
        groups = engine.generate(samples, self.settings)
        n = self.settings.n
        if len(groups) != len(data.samples) or any(len(g) != n for g in groups):
            raise EvalError(
                f"dataset {data.spec.label!r}: the {getattr(engine, 'name', 'rollout')} engine returned "
                f"{[len(g) for g in groups][:8]}… completions for {len(data.samples)} prompts × n={n}"
            )
        return groups

    def _score(
        self, data: _Dataset, groups: list[list[Completion]], samples: list[PromptSample]
    ) -> tuple[dict[str, float], list[dict[str, Any]]]:
        n = self.settings.n
        completions = [c for group in groups for c in group]
        batch = RewardBatch.from_samples(samples, [c.text for c in completions], group_size=n)
        rows = _base_rows(data, samples, completions, n)
        out: dict[str, float] = {}
        if data.accuracy is not None:
            out.update(self._accuracy(data, batch, rows, n))
        if self.suite.metrics.length:
            lengths = [len(c.completion_ids) for c in completions]
            out.update({f"length/{k}": v for k, v in stats.length_stats(lengths, [c.truncated for c in completions]).items()})
            if data.accuracy is not None:  # length/correct_mean, length/wrong_mean
                correct = [row["correct"] for row in rows]
                out.update({f"length/{k}": v for k, v in stats.length_by_correctness(lengths, correct).items()})
        if self.rewards is not None:
            result = self.rewards.score(batch)  # raises RewardModuleError naming the module
            out.update(result.metrics())
            for label, values in result.per_module.items():
                for row, value in zip(rows, values):
                    row[f"reward/{label}"] = value
            for row, value in zip(rows, result.totals):
                row["reward"] = value
        if data.cider is not None:
            values = run_module(data.cider, batch, label="cider_fast")
            out["cider_fast"] = stats.mean_of_scored(values)
            for row, value in zip(rows, values):
                row["cider_fast"] = value
        if self.suite.coco_enabled():
            out.update(_coco(batch, rows))
        return out, rows

    def _accuracy(self, data: _Dataset, batch: RewardBatch, rows: list[dict[str, Any]], n: int) -> dict[str, float]:
        values = run_module(data.accuracy, batch, label="accuracy")
        for row, value in zip(rows, values):
            row["correct"] = value
        out = {"accuracy": stats.accuracy_share(values), "accuracy/unscored": float(sum(v is None for v in values))}
        # (n, c) per prompt, c counted as accuracy counts; prompts with an unscored sample (no
        # gold answer) are left out.
        counts = []
        for start in range(0, len(values), n):
            group = values[start : start + n]
            if all(v is not None for v in group):
                counts.append((n, sum(stats.is_correct(v) for v in group)))
        for k in self.suite.metrics.pass_at_k:
            # "pass_at_k", not "pass@k": MLflow metric names may not contain '@'.
            out[f"pass_at_{k}"] = mean_pass_at_k(counts, k)
        return out


def _base_rows(data: _Dataset, samples: list[PromptSample], completions: list[Completion], n: int) -> list[dict[str, Any]]:
    rows = []
    ids = [example_id(sample) for sample in samples]  # once per prompt, not per completion
    for index, completion in enumerate(completions):
        sample = samples[index // n]
        rows.append(
            {
                "dataset": data.spec.label,
                "prompt_index": index // n,
                "sample_index": index % n,
                "id": str(sample.fields.get("id", index // n)),
                "example_id": ids[index // n],  # stable across runs (evals/example_outcomes.py)
                "prompt": sample.shown_prompt,  # as the model saw it: chat template tokens included
                "question": sample.prompt,  # the user's text alone (a chat row's last user message)
                "completion": completion.text,
                "answer": None
                if sample.fields.get(data.spec.answer_field) is None
                else str(sample.fields[data.spec.answer_field]),
                "references": list(sample.references),
                "length": len(completion.completion_ids),
                "finish_reason": completion.finish_reason,
            }
        )
    return rows


def _coco(batch: RewardBatch, rows: list[dict[str, Any]]) -> dict[str, float]:
    # Every sample is its own COCO "image" id: with n samples per prompt each reference set is
    # repeated n times, which scales CIDEr's df and corpus size alike (idf unchanged).
    keys = [str(i) for i in range(len(batch))]
    if any(not refs for refs in batch.references):
        missing = [i for i, refs in enumerate(batch.references) if not refs][:5]
        raise EvalError(f"COCO caption metrics: samples {missing} have no references")
    corpus, per_sample = coco_caption_metrics(dict(zip(keys, batch.completions)), dict(zip(keys, batch.references)))
    for key, row in zip(keys, rows):
        row["coco_CIDEr"] = per_sample[key].get("CIDEr")
    return {f"coco/{name}": value for name, value in corpus.items()}


def run_suite(engine: Any, suite: EvalSuite | str | Path, *, limit: int | None = None) -> EvalResult:
    """One-shot: load ``suite`` and run it on ``engine``."""
    return SuiteRunner(suite, limit=limit).run(engine)
