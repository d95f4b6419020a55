"""The report's section on an ``until_resolved`` experiment: each round's decisions, in order.

The runner records the sequence on the experiment's MLflow parent run
(``sequential/decisions.json``, :mod:`polyrl.launch.rounds`); ``polyrl compare`` shows it here,
so the report says which verdicts the stopping rule reached, at how many seeds, and with which
repeated confidence intervals (docs/verdicts.md), beside the fixed-sample tables.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["read_sequence", "sequential_section"]


def read_sequence(client, parent_run_id: str) -> list[dict[str, Any]] | None:
    """The recorded rounds, oldest first; None when the experiment did not run until resolved."""
    import mlflow.artifacts

    try:
        text = mlflow.artifacts.load_text(
            f"{client.get_run(parent_run_id).info.artifact_uri.rstrip('/')}/sequential/decisions.json"
        )
    except Exception:  # noqa: BLE001 - no artifact: an experiment without until_resolved
        return None
    rounds = json.loads(text)
    return rounds if isinstance(rounds, list) and rounds else None


def _interval(decision: dict[str, Any]) -> str:
    if "mean" not in decision:
        return "no look yet (a look needs 2 seeds)"
    low, high = decision["low"], decision["high"]
    shown = f"[{low:.3g}, {high:.3g}]" if math.isfinite(low) and math.isfinite(high) else "unbounded"
    return f"{decision['mean']:.3g} {shown}"


def sequential_section(rounds: list[dict[str, Any]]) -> str:
    """Markdown: the last round's verdicts in words, then one row per round and comparison."""
    last = rounds[-1]
    lines = ["## Seeds added until resolved", ""]
    lines += [f"- {sentence}" for sentence in last.get("sentences", [])]
    lines += [
        "",
        "Each verdict comes from repeated confidence intervals over the rounds (docs/verdicts.md): their coverage "
        "holds over every look together, so stopping at the first decided look keeps the error rate; a comparison "
        "keeps the first verdict that decided it.",
        "",
        "| seeds | comparison | a − b, repeated CI | verdict |",
        "|---|---|---|---|",
    ]
    for entry in rounds:
        for name, decision in entry["decisions"].items():
            lines.append(f"| {entry['seeds']} | {name} | {_interval(decision)} | {decision['verdict']} |")
    if last.get("missing"):
        lines += ["", "Seed runs left out: " + "; ".join(last["missing"])]
    return "\n".join(lines) + "\n"
