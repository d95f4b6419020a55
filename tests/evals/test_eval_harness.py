"""The harness on scripted completions (hand-computed numbers) and on a real tiny model (HF engine)."""

from __future__ import annotations

import math
import re

import pytest

from polyrl.data.prompts import DataConfigError
from polyrl.evals import SuiteRunner, parse_suite
from polyrl.evals.suite import EvalError
from polyrl.rewards import CompositeReward, RewardBatch, RewardModuleError, RewardSpec

ROWS = [
    {"id": "a", "prompt": "Q: 1+1=? A:", "answer": "2"},
    {"id": "b", "prompt": "Q: 2+2=? A:", "answer": "4"},
    {"id": "c", "prompt": "Q: 3+3=? A:", "answer": "6"},
]
SCRIPT = {
    # 4 samples each; accuracy extracts the text after '####'. A trailing '…' marks truncation.
    "Q: 1+1=? A:": [" #### 2", " #### 3", " #### 2", " 1+1…"],  # c = 2
    "Q: 2+2=? A:": [" #### 5", " #### 5", " #### 5", " #### 5"],  # c = 0
    "Q: 3+3=? A:": [" #### 6", " 3+3=6 #### 6", " #### 6", " #### 6"],  # c = 4
}


def _suite(tmp_path, jsonl, **metrics):
    data = jsonl(tmp_path / "add.jsonl", ROWS)
    return parse_suite(
        {
            "name": "add",
            "datasets": [{"name": "add", "source": str(data)}],
            "generation": {"decoding": "sample", "n": 4, "max_tokens": 16},
            "metrics": {"accuracy": {"extract": "hash"}, "pass_at_k": [1, 2, 4], **metrics},
        }
    )


def test_eval_scripted_numbers_are_hand_computed(tmp_path, jsonl, scripted_engine):
    rewards = [{"module": "rouge_l"}, {"module": "length", "weight": 0.5}]
    suite = _suite(tmp_path, jsonl, rewards=rewards)
    engine = scripted_engine(SCRIPT)
    result = SuiteRunner(suite).run(engine)
    m = result.metrics
    assert engine.calls[0].n == 4 and engine.calls[0].temperature == 1.0
    # Accuracy over 12 samples: 2 + 0 + 4 correct.
    assert m["add/accuracy"] == pytest.approx(6 / 12)
    # pass@k per prompt, c = 2, 0, 4 of n = 4:
    #   k=1: 2/4, 0, 1             -> mean 0.5
    #   k=2: 1 − C(2,2)/C(4,2) = 5/6, 0, 1 -> mean 11/18
    #   k=4: 1, 0, 1               -> mean 2/3
    assert m["add/pass_at_1"] == pytest.approx(0.5)
    assert m["add/pass_at_2"] == pytest.approx(11 / 18)
    assert m["add/pass_at_4"] == pytest.approx(2 / 3)
    # Lengths (characters = tokens here): 7,7,7,4 | 7,7,7,7 | 7,13,7,7 → sum 87; sorted 4, 7×10, 13.
    assert m["add/length/mean"] == pytest.approx(87 / 12)
    assert m["add/length/median"] == 7.0
    # numpy's linear p90: position 0.9 × (12 − 1) = 9.9, between sorted[9] = 7 and sorted[10] = 7.
    assert m["add/length/p90"] == pytest.approx(7.0)
    assert m["add/length/max"] == 13.0
    assert m["add/length/truncated_share"] == pytest.approx(1 / 12)
    # Reward modules: exactly what the training composite gives on the same samples.
    batch = RewardBatch(
        prompts=[r["prompt"] for r in ROWS for _ in range(4)],
        completions=[t.rstrip("…") for r in ROWS for t in SCRIPT[r["prompt"]]],
        references=[[r["answer"]] for r in ROWS for _ in range(4)],
        fields=[{"id": r["id"], "answer": r["answer"]} for r in ROWS for _ in range(4)],
    )
    direct = CompositeReward([RewardSpec(**spec) for spec in rewards])
    direct.setup()
    expected = direct.score(batch)
    for key, value in expected.metrics().items():
        assert m[f"add/{key}"] == pytest.approx(value), key
    assert [row["reward"] for row in result.rows] == pytest.approx(expected.totals)
    # The per-sample table carries what the metrics were computed from.
    assert [row["correct"] for row in result.rows[:4]] == [1.0, 0.0, 1.0, 0.0]
    assert result.rows[3]["finish_reason"] == "length" and result.rows[3]["id"] == "a"
    assert result.datasets == {"add": {"prompts": 3, "samples": 12}}


def test_eval_unscored_samples_are_left_out_of_accuracy_and_pass_at_k(tmp_path, jsonl, scripted_engine):
    rows = [{"prompt": "Q: 1+1=? A:", "answer": "2"}, {"prompt": "Q: 2+2=? A:"}]  # the second has no gold answer
    suite = parse_suite(
        {
            "name": "u",
            "datasets": {"name": "u", "source": str(jsonl(tmp_path / "u.jsonl", rows))},
            "generation": {"decoding": "sample", "n": 4},
            "metrics": {"accuracy": {"extract": "hash"}, "pass_at_k": [2]},
        }
    )
    result = SuiteRunner(suite).run(scripted_engine(SCRIPT))
    assert result.metrics["u/accuracy"] == pytest.approx(0.5)
    assert result.metrics["u/accuracy/unscored"] == 4.0
    assert result.metrics["u/pass_at_2"] == pytest.approx(5 / 6)


def test_eval_limit_caps_the_suite_and_images_are_carried(tmp_path, jsonl, scripted_engine):
    from PIL import Image

    for i in range(3):  # image paths are relative to the data file's folder
        Image.new("RGB", (4, 4), (60 * i, 0, 0)).save(tmp_path / f"img{i}.png")
    rows = [{"prompt": "<image>" + p, "answer": "2", "image": f"img{i}.png"} for i, p in enumerate(SCRIPT)]
    suite = parse_suite(
        {
            "name": "i",
            "datasets": {"name": "i", "source": str(jsonl(tmp_path / "i.jsonl", rows)), "image_field": "image", "limit": 3},
        }
    )
    runner = SuiteRunner(suite, limit=2)
    assert [[image.getpixel((0, 0)) for image in s.images] for s in runner.datasets[0].samples] == [[(0, 0, 0)], [(60, 0, 0)]]
    assert "image" not in runner.datasets[0].samples[0].fields
    result = runner.run(scripted_engine({"<image>" + p: texts for p, texts in SCRIPT.items()}))
    assert result.datasets["i"] == {"prompts": 2, "samples": 2}


def test_eval_empty_split_and_failing_metric_name_the_culprit(tmp_path, jsonl, scripted_engine):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataConfigError, match="empty"):
        SuiteRunner(parse_suite({"name": "e", "datasets": {"source": str(empty)}}))
    boom = tmp_path / "boom.py"
    boom.write_text(
        "class Boom:\n    name = 'boom'\n    def setup(self):\n        pass\n"
        "    def score(self, batch):\n        raise ZeroDivisionError('no luck')\n"
    )
    suite = _suite(tmp_path, jsonl, rewards=[{"module": f"{boom}:Boom"}])
    with pytest.raises(RewardModuleError, match="'boom' raised ZeroDivisionError: no luck"):
        SuiteRunner(suite).run(scripted_engine(SCRIPT))


def test_eval_engine_returning_too_few_samples_is_an_error(tmp_path, jsonl, scripted_engine):
    short = {prompt: texts[:2] for prompt, texts in SCRIPT.items()}
    with pytest.raises(EvalError, match="n=4"):
        SuiteRunner(_suite(tmp_path, jsonl)).run(scripted_engine(short))


# -- a real model through the HF engine ----------------------------------------------------


def test_eval_real_model_greedy_accuracy_is_known_by_construction(tmp_path, jsonl, hf_engine):
    """Gold answers are the model's own greedy outputs for even rows and junk for odd rows,
    so greedy accuracy (``extract: full``) must be exactly the even rows' share."""
    from polyrl.core.types import PromptSample, SamplingSettings

    prompts = [f"Q: {i}+{i}=? A:" for i in range(6)]
    greedy = SamplingSettings(n=1, temperature=0.0, max_tokens=6, seed=0)
    outputs = [g[0].text for g in hf_engine.generate([PromptSample(p) for p in prompts], greedy)]
    rows = [{"prompt": p, "answer": out if i % 2 == 0 else "no such answer"} for i, (p, out) in enumerate(zip(prompts, outputs))]
    expected = sum(1 for i, out in enumerate(outputs) if i % 2 == 0 and out.strip()) / len(rows)
    suite = parse_suite(
        {
            "name": "own",
            "datasets": {"name": "own", "source": str(jsonl(tmp_path / "own.jsonl", rows))},
            "generation": {"decoding": "greedy", "max_tokens": 6},
            "metrics": {"accuracy": {"extract": "full"}},
        }
    )
    result = SuiteRunner(suite).run(hf_engine)
    assert expected > 0
    assert result.metrics["own/accuracy"] == pytest.approx(expected)
    assert [row["completion"] for row in result.rows] == outputs
    # Recomputed from the per-sample table, independently of the accuracy module.
    recomputed = [
        float(
            " ".join(r["completion"].split()).casefold() == " ".join(r["answer"].split()).casefold()
            and bool(r["completion"].strip())
        )
        for r in result.rows
    ]
    assert [r["correct"] for r in result.rows] == recomputed
    lengths = sorted(r["length"] for r in result.rows)
    assert result.metrics["own/length/median"] == pytest.approx((lengths[2] + lengths[3]) / 2)
    assert result.metrics["own/length/truncated_share"] == pytest.approx(
        sum(r["finish_reason"] == "length" for r in result.rows) / 6
    )


def test_eval_real_model_pass_at_k_matches_counts_from_the_table(tmp_path, jsonl, hf_engine):
    """Seeded sampling repeats exactly, so answers taken from a first run's sample 0 are hit again."""
    from polyrl.core.types import PromptSample

    prompts = [f"Q: {i}*2=? A:" for i in range(4)]
    base = {
        "name": "pk",
        "generation": {"decoding": "sample", "n": 4, "max_tokens": 5, "seed": 3},
        "metrics": {"accuracy": {"extract": "full"}, "pass_at_k": [1, 2, 3, 4]},
    }
    settings = parse_suite({**base, "datasets": {"source": "arithmetic"}}).generation.sampling_settings()
    first = hf_engine.generate([PromptSample(p) for p in prompts], settings)
    rows = [{"prompt": p, "answer": group[0].text if i < 3 else "never"} for i, (p, group) in enumerate(zip(prompts, first))]
    suite = parse_suite({**base, "datasets": {"name": "pk", "source": str(jsonl(tmp_path / "pk.jsonl", rows))}})
    result = SuiteRunner(suite).run(hf_engine)
    counts = {}
    for row in result.rows:
        counts.setdefault(row["prompt_index"], []).append(row["correct"])
    c = [int(sum(v)) for _, v in sorted(counts.items())]
    assert c[0] >= 1 and c[3] == 0  # sample 0 reproduced; the junk answer never hit
    for k in (1, 2, 3, 4):
        expected = sum(1 - math.comb(4 - ci, k) / math.comb(4, k) for ci in c) / 4
        assert result.metrics[f"pk/pass_at_{k}"] == pytest.approx(expected), k
    assert result.metrics["pk/accuracy"] == pytest.approx(sum(c) / 16)
    assert all(re.fullmatch(r"pk", row["dataset"]) for row in result.rows)
