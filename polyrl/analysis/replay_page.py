"""The samples a reward replay moved most, as a rollout-inspector page: every sample of each
top mover's group (so a reader sees what it was ranked against), each card labelled with the
step, the group and its advantage before and after, its reward components shown as the run
scored them and as the candidate does (``run:``/``new:``). ``#group=<k>`` opens the page on the
k-th group, side by side; ``polyrl replay`` prints that link beside each top sample.
"""

from __future__ import annotations

from typing import Any

from polyrl.tracking.inspector import inspector_html, inspector_rows


def _signed(value: float | None) -> str:
    return "–" if value is None else f"{value:+.3f}"


def movers_page(groups: list[dict[str, Any]], *, title: str) -> str:
    """The page of :attr:`polyrl.analysis.replay.ReplayReport.groups`; the advantage shown and
    sorted by is the candidate's."""
    samples: list[dict[str, Any]] = []
    parts: dict[str, list[float | None]] = {}
    for group in groups:
        # The inspector groups by prompt text: the step and group keep two groups of one prompt apart.
        prompt = f"step {group['step']} group {group['group']}\n{group['prompt']}"
        for sample in group["samples"]:
            samples.append(
                {
                    "prompt": prompt,
                    "completion": sample["text"],
                    "reward": None,
                    "length": sample["n"],
                    "finish_reason": sample["finish"],
                    "advantage": sample["new_advantage"],
                    "label": f"step {group['step']} group {group['group']} · advantage "
                    f"{_signed(sample['old_advantage'])} → {_signed(sample['new_advantage'])}",
                }
            )
    labels = [("run", k) for k in groups[0]["samples"][0]["old_scores"]] if groups else []
    labels += [("new", k) for k in groups[0]["samples"][0]["new_scores"]] if groups else []
    for side, label in labels:
        key = "old_scores" if side == "run" else "new_scores"
        parts[f"{side}:{label}"] = [s[key].get(label) for g in groups for s in g["samples"]]
    prompts = list(dict.fromkeys(s["prompt"] for s in samples))
    return inspector_html(inspector_rows(samples, parts=parts), title=title, prompts=prompts)
