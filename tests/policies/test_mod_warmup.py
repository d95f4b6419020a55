"""The warmed-up policy builder: determinism, caching, loadable output, loss going down.

These use the 0.3M-parameter model and a handful of steps; the default 3M build is measured
by hand (see polyrl/policies/warmup.py), not in the unit tests.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from safetensors.torch import load_file  # noqa: E402

from polyrl.policies import warmup  # noqa: E402
from polyrl.policies.warmup import (  # noqa: E402
    COMPLETE_MARKER,
    build_warm_policy,
    default_cache_dir,
    warm_policy_info,
)

# One thread: on a shared 2-core box two OpenMP threads can run 10-40x slower than one.
TINY = dict(size="0.3m", seed=0, steps=5, eval_prompts=4, max_new_tokens=8, num_threads=1)


def _weights(path):
    return load_file(str(path / "model.safetensors"))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    first = build_warm_policy(tmp_path_factory.mktemp("a"), **TINY)
    second = build_warm_policy(tmp_path_factory.mktemp("b"), **TINY)
    return first, second


def test_two_builds_are_identical(built):
    first, second = built
    assert first.name == second.name  # same inputs, same key
    a, b = _weights(first), _weights(second)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_info_record(built):
    info = warm_policy_info(built[0])
    assert info["size"] == "0.3m" and info["steps"] == 5 and info["seed"] == 0
    assert 250_000 < info["params"] < 400_000
    assert len(info["losses"]) == 5
    for key in ("greedy_accuracy", "sampled_accuracy", "greedy_mean_length", "sampled_mean_length", "train_seconds"):
        assert key in info
    assert 0.0 <= info["greedy_accuracy"] <= 1.0
    assert info["eval_num_prompts"] == 4
    assert (built[0] / COMPLETE_MARKER).is_file()


def test_second_call_returns_cached_dir_without_training(built, monkeypatch):
    path = built[0]
    mtime = (path / "model.safetensors").stat().st_mtime_ns

    def fail(*args, **kwargs):
        raise AssertionError("retrained a cached policy")

    monkeypatch.setattr(warmup, "supervised_finetune", fail)
    assert build_warm_policy(path.parent, **TINY) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime
    # A different input is a different key, so it would train (and hit the patched function).
    with pytest.raises(AssertionError, match="retrained"):
        build_warm_policy(path.parent, **{**TINY, "seed": 1})
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp-")]  # temp dir cleaned up


def test_incomplete_dir_is_rebuilt(built, tmp_path):
    cache = tmp_path / "cache"
    stale = cache / built[0].name
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}")  # a half-written dir from a crashed run: no marker
    path = build_warm_policy(cache, **TINY)
    assert path == stale and (path / COMPLETE_MARKER).is_file()
    assert torch.equal(_weights(path)["lm_head.weight"], _weights(built[0])["lm_head.weight"])


def test_output_loads_with_auto_classes(built):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(built[0])
    model = AutoModelForCausalLM.from_pretrained(built[0])
    assert tokenizer("Q: 1+2=? A:")["input_ids"] and tokenizer.eos_token == "</s>"
    assert not model.config.tie_word_embeddings
    ids = tokenizer("Q: 1+2=? A:", return_tensors="pt", add_special_tokens=False)
    out = model.generate(**ids, max_new_tokens=3, do_sample=False)
    assert out.shape[1] <= ids["input_ids"].shape[1] + 3


def test_loss_decreases():
    from polyrl.policies.text import build_char_tokenizer, build_tiny_causal_lm

    tokenizer = build_char_tokenizer()
    model = build_tiny_causal_lm(tokenizer, "0.3m", seed=0)
    rows = warmup._read_rows("train")[:256]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        losses = warmup.supervised_finetune(model, tokenizer, rows, steps=20, lr=3e-3, batch_size=16, seed=0, warmup_steps=3)
    finally:
        torch.set_num_threads(threads)
    assert all(loss == loss for loss in losses)  # finite, no NaN
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:3]) / 3


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("POLYRL_CACHE", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("POLYRL_CACHE")
    assert str(default_cache_dir()) == os.path.join(os.path.expanduser("~"), ".cache", "polyrl", "models")


def test_info_of_non_warmup_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="polyrl_warmup.json"):
        warm_policy_info(tmp_path)


def test_packed_batch_equals_separate_examples():
    from polyrl.policies.text import build_char_tokenizer, build_tiny_causal_lm

    tokenizer = build_char_tokenizer()
    model = build_tiny_causal_lm(tokenizer, "0.3m", seed=0).eval()
    rows = warmup._read_rows("train")[:12]
    examples = [
        (
            tokenizer(row["prompt"], add_special_tokens=False)["input_ids"],
            tokenizer(row["solution"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id],
        )
        for row in rows
    ]
    input_ids, labels, position_ids, mask = warmup._pack_batch(examples, pad_token_id=tokenizer.pad_token_id)
    assert input_ids.shape[0] < len(examples)  # several examples share a row
    assert int((labels != -100).sum()) == sum(len(solution) for _, solution in examples)
    with torch.no_grad():
        packed = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, labels=labels).loss
        total, count = 0.0, 0
        for prompt_ids, solution_ids in examples:
            alone = model(
                input_ids=torch.tensor([prompt_ids + solution_ids]),
                labels=torch.tensor([[-100] * len(prompt_ids) + solution_ids]),
            ).loss
            total += float(alone) * len(solution_ids)
            count += len(solution_ids)
    # Mean loss over all solution tokens is the same packed or one by one.
    assert abs(float(packed) - total / count) < 1e-5


def test_model_fingerprint_is_in_the_key():
    assert warmup.model_fingerprint("0.3m") != warmup.model_fingerprint("3m")
    with pytest.raises(ValueError, match="unknown model size"):
        build_warm_policy("/nonexistent-cache", size="7b")


class _FixedEngine:
    """Returns fixed completions: a unit test of the scoring around a rollout engine."""

    def __init__(self, outputs):
        self.outputs = outputs
        self.settings = None

    def generate(self, prompts, settings):
        from polyrl.core.types import Completion

        self.settings = settings
        return [
            [
                Completion(
                    prompt_ids=[1],
                    completion_ids=list(range(length)),
                    text=text,
                    sampling_logprobs=[0.0] * length,
                    finish_reason=finish,
                )
            ]
            for text, length, finish in self.outputs[: len(prompts)]
        ]


def test_warmup_evaluation_scores_with_the_training_accuracy_definition():
    rows = [
        {"prompt": "Q: 1+1=? A:", "answer": 2},
        {"prompt": "Q: 2+2=? A:", "answer": 4},
        {"prompt": "Q: 3+3=? A:", "answer": 6},
    ]
    engine = _FixedEngine(
        [
            ("1 + 1 = 2 #### 2", 10, "stop"),  # correct, long form ("=" before ####)
            ("#### 04", 4, "stop"),  # correct: the accuracy reward matches 04 and 4 numerically
            ("6 6 6", 6, "length"),  # no answer: wrong, and truncated
        ]
    )
    result = warmup.evaluate_arithmetic(engine, rows, temperature=1.0, max_new_tokens=6, seed=3)
    assert (
        engine.settings.n == 1
        and engine.settings.temperature == 1.0
        and engine.settings.max_tokens == 6
        and engine.settings.seed == 3
    )
    assert result["accuracy"] == pytest.approx(2 / 3, abs=1e-12)  # 2 of 3 scored samples score > 0
    assert result["mean_length"] == pytest.approx((10 + 4 + 6) / 3, abs=1e-12)  # 20 / 3 tokens
    assert result["truncated_fraction"] == pytest.approx(1 / 3, abs=1e-12)  # one finish_reason "length"
    assert result["long_fraction"] == pytest.approx(1 / 3, abs=1e-12)  # only the first shows a step
    assert result["completions"] == ["1 + 1 = 2 #### 2", "#### 04", "6 6 6"]
