"""The health warnings an experiment's runs recorded (MLflow tags ``health.<check>``, set once per
check by the health hook), as a section of the comparison report: a reader comparing arms sees
that one arm's reward rose while its held-out score fell before reading its curves."""

from __future__ import annotations

from typing import Any, Iterable

HEALTH_TAG_PREFIX = "health."


def health_warnings(runs: dict[str, Iterable[Any]]) -> dict[str, list[tuple[str, str, str]]]:
    """Arm → ``(run name, check, message)`` for each ``health.*`` tag of the arm's runs (its run and
    its seed runs), in the order given; arms without warnings are left out."""
    out: dict[str, list[tuple[str, str, str]]] = {}
    for arm, arm_runs in runs.items():
        found = []
        for run in arm_runs:
            name = run.data.tags.get("mlflow.runName", run.info.run_id[:8])
            for key, value in sorted(run.data.tags.items()):
                if key.startswith(HEALTH_TAG_PREFIX):
                    found.append((name, key[len(HEALTH_TAG_PREFIX) :], value))
        if found:
            out[arm] = found
    return out


def with_health_section(report: str, warnings: dict[str, list[tuple[str, str, str]]]) -> str:
    """``report`` with a "Health warnings" section appended (``None found`` when there are none,
    so a reader knows the checks ran rather than that the section is missing)."""
    lines = ["", "## Health warnings", ""]
    if not warnings:
        lines.append("None: no health check fired in any arm.")
    for arm, items in warnings.items():
        for run, check, message in items:
            where = arm if run == arm else f"{arm} ({run})"
            lines.append(f"- **{where}** `{check}`: {message}")
    return report.rstrip("\n") + "\n" + "\n".join(lines) + "\n"
