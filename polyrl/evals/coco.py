"""The standard COCO caption metrics through pycocoevalcap, as the COCO caption server computes them.

Captions and references are tokenised by pycocoevalcap's PTB tokenizer (Stanford CoreNLP,
lower-cased, punctuation removed), then scored with BLEU-1..4, METEOR 1.5, ROUGE-L and
CIDEr-D — the same scorers, in the same way, as ``pycocoevalcap.eval.COCOEvalCap`` (SPICE is
left out: it needs Stanford models that are downloaded on first use). The PTB tokenizer and
METEOR are Java programs, so Java (OpenJDK 17 here) must be on PATH.

CIDEr-D here takes its document frequencies from the evaluated references, as the COCO server
does; the in-process ``cider`` reward module reports beside it (``cider_fast``) with the
training reward's own tokenisation.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import shutil
import subprocess
from collections.abc import Mapping, Sequence

from polyrl.evals.suite import EvalError

# Report names of pycocoevalcap's methods.
METRIC_NAMES = {
    "Bleu_1": "BLEU-1",
    "Bleu_2": "BLEU-2",
    "Bleu_3": "BLEU-3",
    "Bleu_4": "BLEU-4",
    "METEOR": "METEOR",
    "ROUGE_L": "ROUGE-L",
    "CIDEr": "CIDEr",
}

JAVA_HINT = (
    "COCO caption metrics need Java: pycocoevalcap's PTB tokenizer and METEOR run `java`. "
    "Install Java 17 (e.g. `apt-get install openjdk-17-jre-headless`) and put `java` on PATH"
)


def require_java() -> str:
    """Path of ``java``; a clear error naming Java 17 when it is missing or does not start."""
    java = shutil.which("java")
    if java is None:
        raise EvalError(f"{JAVA_HINT}; no `java` found on PATH.")
    try:
        subprocess.run([java, "-version"], capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as error:
        raise EvalError(f"{JAVA_HINT}; `{java} -version` failed: {error}") from error
    return java


def ptb_tokenize(texts: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """PTB-tokenise ``{id: [caption, ...]}`` (pycocoevalcap's own tokenizer)."""
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    # One caption per line: newlines inside a caption would shift every later line.
    payload = {key: [{"caption": " ".join(str(t).split())} for t in values] for key, values in texts.items()}
    return PTBTokenizer().tokenize(payload)


_meteor = None


def meteor_scorer():
    """pycocoevalcap's METEOR, started once per process and reused.

    Starting it loads METEOR's paraphrase tables in a fresh JVM (slow: seconds to tens of seconds);
    periodic evaluation would pay that at every eval step. The process is stopped at exit.
    """
    global _meteor
    if _meteor is None or _meteor.meteor_p.poll() is not None:
        from pycocoevalcap.meteor.meteor import Meteor

        _meteor = Meteor()
        atexit.register(_close, _meteor)
    return _meteor


def _scorers():
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge

    return [
        (Bleu(4), ["Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4"]),
        (meteor_scorer(), ["METEOR"]),
        (Rouge(), ["ROUGE_L"]),
        (Cider(), ["CIDEr"]),
    ]


def _close(scorer) -> None:
    """Stop METEOR's java process (pycocoevalcap only does it at garbage collection)."""
    process = getattr(scorer, "meteor_p", None)
    if process is not None and process.poll() is None:
        with contextlib.suppress(Exception):
            process.stdin.close()
        process.kill()
        process.wait()


def coco_caption_metrics(
    candidates: Mapping[str, str], references: Mapping[str, Sequence[str]]
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Corpus scores and per-id scores of one candidate caption per id against its references.

    Returns ``({"BLEU-1": ..., "METEOR": ..., "ROUGE-L": ..., "CIDEr": ...}, {id: {...}})``.
    """
    if set(candidates) != set(references):
        raise ValueError("candidates and references must have the same ids")
    if not candidates:
        return {}, {}
    empty = [key for key, refs in references.items() if not refs]
    if empty:
        raise EvalError(f"COCO caption metrics need at least one reference per sample; none for {empty[:5]}")
    require_java()
    ids = list(candidates)
    gts = ptb_tokenize({key: list(references[key]) for key in ids})
    res = ptb_tokenize({key: [candidates[key]] for key in ids})
    corpus: dict[str, float] = {}
    per_id: dict[str, dict[str, float]] = {key: {} for key in ids}
    for scorer, methods in _scorers():
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # BLEU prints its length ratios
                score, scores = scorer.compute_score(gts, res)
        except Exception as error:  # noqa: BLE001 - java and scorer failures are reported alike
            _close(scorer)  # a METEOR process in an unknown state is not reused
            raise EvalError(f"COCO metric {methods[0]} (pycocoevalcap) failed: {type(error).__name__}: {error}") from error
        if len(methods) == 1:
            score, scores = [score], [scores]
        for method, value, values in zip(methods, score, scores):
            name = METRIC_NAMES[method]
            corpus[name] = float(value)
            for key, item in zip(gts.keys(), values):
                per_id[key][name] = float(item)
    return corpus, per_id
