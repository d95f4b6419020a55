"""Caption suites: COCO metrics equal pycocoevalcap called directly; CIDEr from the reward module."""

from __future__ import annotations

import pytest

from polyrl.evals import SuiteRunner, parse_suite
from polyrl.evals.suite import EvalError
from polyrl.rewards import RewardBatch
from polyrl.rewards.builtins.cider import Cider

# Caption/reference text pairs stand in for images until the image modality exists.
ROWS = [
    {"prompt": "<image 1> Describe:", "references": ["A cat sits on the mat.", "The cat is on a mat!"]},
    {"prompt": "<image 2> Describe:", "references": ["A dog runs in the park.", "A brown dog running on grass."]},
    {"prompt": "<image 3> Describe:", "references": ["Two people ride bikes down a street.", "People cycling on a city road."]},
]
CAPTIONS = {
    "<image 1> Describe:": ["a cat on the mat.", "a dog on a mat"],
    "<image 2> Describe:": ["A dog is running in a park", ""],  # an empty caption scores 0, not an error
    "<image 3> Describe:": ["two people riding bikes on a street", "cycling people, city road"],
}


def _direct_pycocoevalcap(candidates: list[str], references: list[list[str]]) -> dict[str, float]:
    """The COCO caption evaluation as pycocoevalcap's COCOEvalCap does it (without SPICE).

    METEOR is pycocoevalcap's own ``Meteor`` object; the harness keeps one per process (its
    JVM takes ~20 s to load the paraphrase tables) and the same live instance is used here.
    """
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider as CocoCider
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    from polyrl.evals.coco import meteor_scorer

    tokenizer = PTBTokenizer()
    gts = tokenizer.tokenize({i: [{"caption": r} for r in refs] for i, refs in enumerate(references)})
    res = tokenizer.tokenize({i: [{"caption": c}] for i, c in enumerate(candidates)})
    out = {}
    bleu, _ = Bleu(4).compute_score(gts, res)
    out.update({f"coco/BLEU-{n + 1}": value for n, value in enumerate(bleu)})
    out["coco/METEOR"], _ = meteor_scorer().compute_score(gts, res)
    out["coco/ROUGE-L"], _ = Rouge().compute_score(gts, res)
    out["coco/CIDEr"], _ = CocoCider().compute_score(gts, res)
    return out


def test_eval_caption_suite_matches_pycocoevalcap(tmp_path, jsonl, scripted_engine):
    data = jsonl(tmp_path / "captions.jsonl", ROWS)
    suite = parse_suite(
        {
            "name": "cap",
            "kind": "caption",
            "datasets": {"name": "cap", "source": str(data)},
            "generation": {"decoding": "sample", "n": 2, "max_tokens": 20},
        }
    )
    result = SuiteRunner(suite).run(scripted_engine(CAPTIONS))
    candidates = [c for row in ROWS for c in CAPTIONS[row["prompt"]]]
    references = [row["references"] for row in ROWS for _ in range(2)]
    assert [r["completion"] for r in result.rows] == candidates
    direct = _direct_pycocoevalcap(candidates, references)
    for key, value in direct.items():
        assert result.metrics[f"cap/{key}"] == pytest.approx(float(value), abs=1e-9), key
    assert 0 < result.metrics["cap/coco/CIDEr"] and 0 < result.metrics["cap/coco/METEOR"] < 1
    # The fast in-process CIDEr is the training reward module, df from the split's references.
    module = Cider(corpus_references=[row["references"] for row in ROWS])
    fast = module.score(RewardBatch(prompts=[""] * 6, completions=candidates, references=references))
    assert result.metrics["cap/cider_fast"] == pytest.approx(sum(fast) / len(fast))
    assert [r["cider_fast"] for r in result.rows] == pytest.approx(fast)
    assert "cap/accuracy" not in result.metrics  # captions have no single answer


def test_eval_caption_metrics_without_java_name_java_17(tmp_path, jsonl, scripted_engine, monkeypatch):
    import polyrl.evals.coco as coco

    monkeypatch.setattr(coco.shutil, "which", lambda name: None)
    suite = parse_suite(
        {"name": "cap", "kind": "caption", "datasets": {"name": "cap", "source": str(jsonl(tmp_path / "c.jsonl", ROWS))}}
    )
    with pytest.raises(EvalError, match="Java 17"):
        SuiteRunner(suite).run(scripted_engine(CAPTIONS))
