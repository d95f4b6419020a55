"""Why the in-process vLLM engine could not start on a model folder, said in one message.

vLLM's own failure to start (an architecture this vLLM build does not run, a config it reads
differently, a compiled kernel it lacks: :mod:`polyrl.engines.vllm_kernels`) is a long traceback
through its engine core; :class:`EngineStartError` names the model, its architecture and the
engine that samples any model transformers can run (``rollout.engine: hf``) instead. The judge's
own vLLM engine (:mod:`polyrl.reward_models.judge_engines`) catches it to name the judge's field.
"""

from __future__ import annotations

import json
from pathlib import Path

from polyrl.core.errors import PolyrlError

__all__ = ["EngineStartError"]


class EngineStartError(PolyrlError, RuntimeError):
    """vLLM could not start on a model folder (an architecture this vLLM build does not run, or a
    config it reads differently): one message naming the model and its architecture, and the
    engine that samples any model transformers can run, instead of vLLM's traceback."""

    def __init__(self, model_path: str, error: BaseException):
        architecture = _architecture_of(model_path)
        super().__init__(
            f"rollout.engine: vllm could not start on {model_path!r} ({architecture}): "
            f"{type(error).__name__}: {error}; set rollout.engine: hf to sample with transformers "
            "(the learner's own forward), or use a model this vLLM build supports"
        )


def _architecture_of(model_path: str) -> str:
    try:
        config = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "no readable config.json"
    names = config.get("architectures") or [config.get("model_type", "unknown")]
    return ", ".join(map(str, names))
