"""A polyrl training run named as a model: ``run:<run_id>[@<step>]`` (``polyrl eval --model``,
``polyrl export``, a distillation teacher's ``distill.teacher.run``)."""

from __future__ import annotations

__all__ = ["RUN_PREFIX", "split_run_ref"]

RUN_PREFIX = "run:"


def split_run_ref(ref: str) -> tuple[str, int | None]:
    """``run:<run_id>[@<step>]`` (``run:`` optional) → ``(run id, step or None)``; a ``ValueError``
    saying what is wrong otherwise."""
    body = ref[len(RUN_PREFIX) :] if ref.startswith(RUN_PREFIX) else ref
    run_id, at, step = body.partition("@")
    if not run_id:
        raise ValueError("expected run:<run_id> or run:<run_id>@<step> (a polyrl training run's MLflow id)")
    if at and not step.isdigit():
        raise ValueError(f"the step after '@' must be an integer, got {step!r} (expected run:<run_id>@<step>)")
    return run_id, int(step) if step else None
