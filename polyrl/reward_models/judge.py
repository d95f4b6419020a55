"""``judge``: a language model scores each completion against a rubric written in the YAML.

The judge runs on an engine of its own (``params.engine``: polyrl's HF engine or a vLLM engine of
its own, :mod:`polyrl.reward_models.judge_engines`; started once in ``setup``, never when the
module is built), batched over the step's samples. Its input is the rubric with the
sample filled in; the score is read from it as :mod:`polyrl.reward_models.reading` describes
(the probabilities of the allowed score tokens, or a parsed number). Judge inputs seen before
are answered from a cache keyed on the judge-input text, and a time and a token budget bound
each call: samples past a budget are unscored (``None``), as are inputs the judge cannot read
and samples it fails on. A judge never makes up a number.

With ``group: true`` the judge reads a prompt's completions together and scores each against
the others (relative judging, as OpenPipe ART's RULER does: "RULER", ART documentation, which
ranks a group of trajectories in one judge call). Deviation: RULER asks for all the group's
scores in one JSON answer; here each completion is read in its own pass with the whole group
in the prompt, so the probability reading works per completion and one unreadable answer does
not lose the group.

The rubric's templates and check are :mod:`polyrl.reward_models.judge_rubric`; the judge model's
reference and its resolution to a folder, :mod:`polyrl.reward_models.judge_model`.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from typing import Any, Literal, Sequence

from polyrl.core.types import PromptSample, SamplingSettings
from polyrl.reward_models.judge_engines import (
    JUDGE_ENGINES,
    max_score_tokens,
    model_positions,
    score_token_logprobs,
    start_judge_engine,
)
from polyrl.reward_models.judge_model import check_model_reference, resolve_model
from polyrl.reward_models.judge_rubric import checked_rubric, filled_rubrics, score_text, scores_text
from polyrl.reward_models.reading import expected_score_from_logprobs, parse_score
from polyrl.rewards.base import RewardBatch, RewardConfigError, RewardModule
from polyrl.rewards.registry import register_reward


def _field(name: str) -> str:
    return f"params.{name}"


@register_reward("judge")
class JudgeReward(RewardModule):
    """A language model scores each completion against a rubric (LLM-as-a-judge).

    Parameters:
        model: the judge: a Hugging Face model folder, a ``.gguf`` file, or a built-in pretrained
            model's name (``smollm2-135m-instruct``).
        rubric: the judge prompt, with ``{prompt}``, ``{completion}``, ``{reference}`` (the first
            reference), ``{answer}`` (the row's answer field) and ``{scores}`` (the allowed scores,
            written out); with ``group: true``, ``{completions}`` (the group, numbered), ``{index}``
            (the one being scored, from 1) and ``{n}`` instead of ``{completion}``.
        scores: the allowed scores (numbers).
        read: ``probabilities`` (expected score over the allowed scores' tokens; each score must
            be one token of the judge's tokenizer) or ``parsed`` (the first number of a greedy answer).
        group: relative judging: a prompt's consecutive samples are judged together.
        chat_template: wrap the rubric in the judge tokenizer's chat template (when it has one).
        min_score_mass: probabilities: below this probability on the score tokens, unscored.
        max_new_tokens: parsed: the longest answer read.
        batch_size: judge inputs per forward pass or generate call.
        max_input_tokens: a longer judge input is unscored (never cut: the judge would score
            a different text).
        time_budget_s: seconds one score call may spend judging; later samples are unscored.
        token_budget: judge tokens (input plus answer) one score call may use; later samples are unscored.
        cache_size: judge inputs whose scores are kept (least recently used dropped first).
        dtype: the judge's weights' dtype (``float32``, ``bfloat16``).
        reference_field: the row field ``{answer}`` reads.
        answer_prefix: written as the start of the judge's answer (after the chat template's
            assistant header), so that its next token is the score: a small judge then puts most
            of its probability on the score tokens instead of on a preamble.
        engine: ``hf`` (polyrl's transformers engine) or ``vllm`` (a vLLM engine of the judge's
            own in this process, batched generation; the same expected scores up to rounding).
        kv_cache_gb: vllm: the judge's KV cache; by default the smallest vLLM accepts (one judge
            input of ``max_input_tokens + max_new_tokens``; shorter inputs share it).
    """

    def __init__(
        self,
        model: str,
        rubric: str | None = None,
        scores: Sequence[float] = (1, 2, 3, 4, 5),
        read: Literal["probabilities", "parsed"] = "probabilities",
        group: bool = False,
        chat_template: bool = True,
        min_score_mass: float = 0.5,
        max_new_tokens: int = 8,
        batch_size: int = 8,
        max_input_tokens: int = 2048,
        time_budget_s: float | None = None,
        token_budget: int | None = None,
        cache_size: int = 4096,
        dtype: str = "float32",
        reference_field: str = "answer",
        answer_prefix: str = "Score: ",
        engine: str = "hf",
        kv_cache_gb: float | None = None,
    ):
        if not isinstance(model, str) or not model.strip():
            raise RewardConfigError(f"judge {_field('model')}: a model folder, a .gguf file or a built-in model name")
        if read not in ("probabilities", "parsed"):
            raise RewardConfigError(f"judge {_field('read')}: {read!r}; allowed: probabilities, parsed")
        try:
            self.scores = [float(s) for s in scores]
        except (TypeError, ValueError):
            raise RewardConfigError(f"judge {_field('scores')}: a list of numbers, got {scores!r}") from None
        if len(self.scores) < 2 or len(set(self.scores)) != len(self.scores) or not all(map(math.isfinite, self.scores)):
            raise RewardConfigError(f"judge {_field('scores')}: at least two distinct finite numbers, got {scores!r}")
        rubric = checked_rubric(rubric, group)
        for name, value, low in (("min_score_mass", min_score_mass, 0.0), ("time_budget_s", time_budget_s, 0.0)):
            if value is not None and not (value > low if name == "time_budget_s" else 0 < value <= 1):
                raise RewardConfigError(f"judge {_field(name)}: {value!r} out of range")
        for name, value in (("max_new_tokens", max_new_tokens), ("batch_size", batch_size), ("max_input_tokens", max_input_tokens),
                            ("cache_size", cache_size), ("token_budget", token_budget)):  # fmt: skip
            if value is not None and (not isinstance(value, int) or value < (0 if name == "cache_size" else 1)):
                raise RewardConfigError(f"judge {_field(name)}: a positive integer, got {value!r}")
        if engine not in JUDGE_ENGINES:
            raise RewardConfigError(f"judge {_field('engine')}: {engine!r}; allowed: {', '.join(JUDGE_ENGINES)}")
        if kv_cache_gb is not None and (
            engine != "vllm" or isinstance(kv_cache_gb, bool) or not isinstance(kv_cache_gb, (int, float)) or not kv_cache_gb > 0
        ):
            raise RewardConfigError(
                f"judge {_field('kv_cache_gb')}: {kv_cache_gb!r}; allowed: a positive number of GiB with engine: vllm "
                "(the HF engine has no KV cache to size), or leave it out"
            )
        if dtype not in ("float32", "bfloat16", "float16"):
            raise RewardConfigError(f"judge {_field('dtype')}: {dtype!r}; allowed: float32, bfloat16, float16")
        self.model, self.rubric, self.read, self.group = model.strip(), rubric, read, bool(group)
        self.chat_template, self.min_score_mass, self.max_new_tokens = chat_template, min_score_mass, max_new_tokens
        self.batch_size, self.max_input_tokens = batch_size, max_input_tokens
        self.time_budget_s, self.token_budget, self.cache_size = time_budget_s, token_budget, cache_size
        self.dtype, self.reference_field, self.answer_prefix = dtype, reference_field, str(answer_prefix)
        self.engine_name, self.kv_cache_gb = engine, kv_cache_gb
        check_model_reference(self.model)  # last: the other parameters' errors come first
        self.engine: Any = None
        self.score_token_ids: list[int] = []
        self.cache: OrderedDict[str, float] = OrderedDict()
        # What the last score call did: judged (new), cached, and why samples were left unscored;
        # ``details`` holds what a reason names (the first unreadable answer, the chunk over budget …).
        self.stats: dict[str, int] = {}
        self.details: dict[str, Any] = {}

    # -- setup ----------------------------------------------------------------------------------
    def setup(self) -> None:
        if self.engine is not None:
            return
        if (
            self.read == "probabilities"
            and (limit := max_score_tokens(self.engine_name)) is not None
            and len(self.scores) > limit
        ):
            raise RewardConfigError(
                f"judge {_field('scores')}: {len(self.scores)} scores; engine: {self.engine_name} reads at most {limit} "
                "score tokens per judge input (use fewer scores, read: parsed, or engine: hf)"
            )
        folder = resolve_model(self.model)
        length = self.max_input_tokens + self.max_new_tokens
        if self.engine_name == "vllm" and (positions := model_positions(folder)) is not None and length > positions:
            # vLLM refuses a max_model_len past the model's positions (the HF engine does not check).
            raise RewardConfigError(
                f"judge {_field('max_input_tokens')}: {self.max_input_tokens} + {_field('max_new_tokens')} "
                f"{self.max_new_tokens} = {length} tokens, more than the judge model's {positions} positions, "
                f"which engine: vllm refuses; allowed: max_input_tokens up to {positions - self.max_new_tokens}"
            )
        engine = start_judge_engine(
            self.engine_name,
            folder,
            dtype=self.dtype,
            max_model_len=self.max_input_tokens + self.max_new_tokens,
            kv_cache_gb=self.kv_cache_gb,
            field=_field("engine"),
        )
        try:
            self.score_token_ids = self._score_token_ids(engine.tokenizer)
        except RewardConfigError:
            engine.close()
            raise
        self.engine = engine

    def _score_token_ids(self, tokenizer: Any) -> list[int]:
        if self.read == "probabilities":
            ids = []
            for score in self.scores:
                pieces = tokenizer.encode(score_text(score), add_special_tokens=False)
                if len(pieces) != 1:
                    raise RewardConfigError(
                        f"judge {_field('scores')}: score {score_text(score)!r} is {len(pieces)} tokens for the judge's "
                        "tokenizer; read: probabilities needs one token per score (use read: parsed, or single-digit scores)"
                    )
                ids.append(pieces[0])
            if len(set(ids)) != len(ids):
                raise RewardConfigError(f"judge {_field('scores')}: two scores share a token")
            return ids
        return []

    # -- judge inputs -----------------------------------------------------------------------------
    def judge_inputs(self, batch: RewardBatch) -> list[str]:
        """The judge's input text of each sample (chat template applied when asked and available)."""
        texts = filled_rubrics(self.rubric, batch, group=self.group, reference_field=self.reference_field, scores=self.scores)
        return [self._wrap(text) for text in texts]

    def _wrap(self, text: str) -> str:
        tokenizer = self.engine.tokenizer if self.engine is not None else None
        if self.chat_template and tokenizer is not None and getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
        else:
            text = text + "\n"
        return text + self.answer_prefix

    # -- scoring ----------------------------------------------------------------------------------
    def score(self, batch: RewardBatch) -> list[float | None]:
        self.setup()
        inputs = self.judge_inputs(batch)
        out: list[float | None] = [None] * len(batch)
        stats = {"judged": 0, "cached": 0, "unreadable": 0, "too_long": 0, "over_time": 0, "over_tokens": 0, "failed": 0}
        self.details = {}
        todo: dict[str, list[int]] = {}
        for i, text in enumerate(inputs):
            if text in self.cache:
                self.cache.move_to_end(text)
                out[i] = self.cache[text]
                stats["cached"] += 1
            else:
                todo.setdefault(text, []).append(i)  # the same input twice in a batch is judged once
        tokenizer = self.engine.tokenizer
        encoded = {text: tokenizer.encode(text, add_special_tokens=not self._templated()) for text in todo}
        pending = []
        for text, ids in encoded.items():
            if len(ids) > self.max_input_tokens:
                stats["too_long"] += len(todo[text])
                self.details["shortest_too_long"] = min(len(ids), self.details.get("shortest_too_long", len(ids)))
            else:
                pending.append(text)
        started, tokens = time.perf_counter(), 0
        for start in range(0, len(pending), self.batch_size):
            chunk = pending[start : start + self.batch_size]
            if self.time_budget_s is not None and time.perf_counter() - started > self.time_budget_s:
                stats["over_time"] += sum(len(todo[t]) for t in pending[start:])
                break
            cost = sum(len(encoded[t]) + (self.max_new_tokens if self.read == "parsed" else 1) for t in chunk)
            if self.token_budget is not None and tokens + cost > self.token_budget:
                stats["over_tokens"] += sum(len(todo[t]) for t in pending[start:])
                self.details["over_budget"] = {"spent": tokens, "chunk": cost, "inputs": len(chunk)}
                break
            tokens += cost
            try:
                values = self._judge([encoded[t] for t in chunk])
            except (RuntimeError, ValueError) as error:  # e.g. out of memory: these samples unscored, the rest go on
                stats["failed"] += sum(len(todo[t]) for t in chunk)
                self.last_error = f"{type(error).__name__}: {error}"
                self.details.setdefault("error", self.last_error)
                continue
            for text, value in zip(chunk, values):
                if value is None:
                    stats["unreadable"] += len(todo[text])
                    continue
                stats["judged"] += len(todo[text])
                self._remember(text, value)
                for i in todo[text]:
                    out[i] = value
        stats["tokens"] = tokens
        self.stats = stats
        return out

    def _templated(self) -> bool:
        return bool(self.chat_template and getattr(self.engine.tokenizer, "chat_template", None))

    def _remember(self, text: str, value: float) -> None:
        if self.cache_size == 0:
            return
        self.cache[text] = value
        self.cache.move_to_end(text)
        while len(self.cache) > self.cache_size:
            self.cache.popitem(last=False)

    def _judge(self, rows: list[list[int]]) -> list[float | None]:
        if self.read == "parsed":
            settings = SamplingSettings(n=1, temperature=0.0, max_tokens=self.max_new_tokens)
            prompts = [PromptSample(prompt="", model_prompt="", prompt_ids=list(ids)) for ids in rows]
            answers = self.engine.generate(prompts, settings)
            values = [parse_score(group[0].text, self.scores) for group in answers]
            for group, value in zip(answers, values):
                if value is None:
                    self.details.setdefault("unreadable_answer", group[0].text)
            return values
        values = []
        for row in score_token_logprobs(self.engine, rows, self.score_token_ids):
            value, mass = expected_score_from_logprobs(row, self.scores, min_mass=self.min_score_mass)
            if value is None:
                self.details["unreadable_mass"] = max(mass, self.details.get("unreadable_mass", 0.0))
            values.append(value)
        return values

    def unscored_reason(self) -> str | None:
        """Why the last score call left samples unscored, each cause with the setting that governs
        it (what a reward that scored nothing reports instead of a guess about the data); None when
        it scored every sample it was given."""
        stats, details, reasons = self.stats, self.details, []
        if stats.get("over_tokens"):
            over = details.get("over_budget", {})
            reasons.append(
                f"{stats['over_tokens']} past judge {_field('token_budget')} ({self.token_budget} judge tokens per score "
                f"call): {over.get('spent', 0)} were spent and the next chunk of {over.get('inputs', '?')} judge inputs "
                f"needs {over.get('chunk', '?')} (its inputs' tokens plus "
                f"{'max_new_tokens each' if self.read == 'parsed' else 'one each'}); raise token_budget"
            )
        if stats.get("too_long"):
            reasons.append(
                f"{stats['too_long']} with a judge input longer than {_field('max_input_tokens')} "
                f"({self.max_input_tokens}; the shortest was {details.get('shortest_too_long', '?')} tokens)"
            )
        if stats.get("over_time"):
            reasons.append(f"{stats['over_time']} past {_field('time_budget_s')} ({self.time_budget_s} s per score call)")
        if stats.get("unreadable"):
            if self.read == "parsed":
                answer = details.get("unreadable_answer")
                reasons.append(
                    f"{stats['unreadable']} whose answer held no allowed score ({scores_text(self.scores)}) as its first "
                    f"number (read: parsed; first such answer: {answer!r}); check the rubric and "
                    f"{_field('answer_prefix')}, or raise {_field('max_new_tokens')} ({self.max_new_tokens}) if "
                    "answers are cut short"
                )
            else:
                reasons.append(
                    f"{stats['unreadable']} whose next-token probability on the score tokens was below "
                    f"{_field('min_score_mass')} ({self.min_score_mass}; the most was "
                    f"{details.get('unreadable_mass', 0.0):.3g}): the judge meant to write something else; check "
                    f"the rubric and {_field('answer_prefix')}, or use read: parsed"
                )
        if stats.get("failed"):
            reasons.append(f"{stats['failed']} where the judge failed ({details.get('error')})")
        return "judge left samples unscored: " + "; ".join(reasons) if reasons else None

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None
