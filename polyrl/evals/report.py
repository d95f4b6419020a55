"""Eval reports (JSON + markdown) and the side-by-side comparison of several models.

Reports are written all-or-nothing: files go to a hidden staging folder beside the target,
and only a finished eval swaps it in (rename). A crashed or failing eval therefore leaves the
previous report of the same suite and model untouched.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from polyrl.core.folders import replace_dir

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
SAMPLES_JSONL = "samples.jsonl"
COMPARISON_JSON = "comparison.json"
COMPARISON_MD = "comparison.md"
EXAMPLES_IN_MARKDOWN = 8


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return str(value)


def _clean(value: Any) -> Any:
    """NaN/inf → None so the JSON is standard (``json`` would write bare NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def to_json(data: Any) -> str:
    return json.dumps(_clean(data), indent=2, default=_json_default) + "\n"


def write_atomic_dir(out_dir: Path, files: dict[str, str]) -> Path:
    """Write ``files`` as the whole content of ``out_dir``, replacing it only when all are written."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    token = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging = out_dir.with_name(f".{out_dir.name}.partial-{token}")
    staging.mkdir()
    try:
        for name, text in files.items():
            (staging / name).write_text(text)
        replace_dir(staging, out_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def write_atomic_file(path: Path, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    staging.write_text(text)
    os.replace(staging, path)
    return path


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def _cell(text: Any) -> str:
    flat = " ".join(str(text).split()).replace("|", "\\|")
    return flat if len(flat) <= 80 else flat[:79] + "…"


def render_markdown(report: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    lines = [
        f"# Eval `{report['suite']}` · `{report['model']['slug']}`",
        "",
        f"- model: `{report['model']['ref']}` → `{report['model']['path']}`",
    ]
    if report["model"].get("run_id"):
        lines.append(f"- evaluates run `{report['model']['run_id']}` at step {report['model'].get('step')}")
    lines += [
        f"- engine: {report['engine']} · generation: {json.dumps(report['generation'])}",
        f"- samples: {json.dumps(report['datasets'])} · {report['seconds']:.1f} s",
    ]
    if report.get("mlflow_run_id"):
        lines.append(f"- MLflow eval run: `{report['mlflow_run_id']}` ({report.get('tracking_uri')})")
    lines += ["", "| metric | value |", "|---|---|"]
    lines += [f"| {key} | {_fmt(value)} |" for key, value in sorted(report["metrics"].items())]
    if rows:
        lines += [
            "",
            f"## First {min(EXAMPLES_IN_MARKDOWN, len(rows))} samples",
            "",
            "| dataset | prompt | completion | answer | correct |",
            "|---|---|---|---|---|",
        ]
        for row in rows[:EXAMPLES_IN_MARKDOWN]:
            lines.append(
                f"| {row['dataset']} | {_cell(row['prompt'])} | {_cell(row['completion'])} | "
                f"{_cell(row.get('answer') or '')} | {_fmt(row.get('correct'))} |"
            )
    return "\n".join(lines) + "\n"


def report_files(report: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, str]:
    return {
        REPORT_JSON: to_json(report),
        REPORT_MD: render_markdown(report, rows),
        SAMPLES_JSONL: "".join(json.dumps(_clean(row), default=_json_default) + "\n" for row in rows),
    }


def comparison_table(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"models": [slug...], "metrics": {metric: {slug: value}}}`` over the union of metrics."""
    slugs = [r["model"]["slug"] for r in reports]
    names = sorted({key for r in reports for key in r["metrics"]})
    return {
        "suite": reports[0]["suite"] if reports else None,
        "models": [
            {
                "slug": r["model"]["slug"],
                "ref": r["model"]["ref"],
                "run_id": r["model"].get("run_id"),
                "mlflow_run_id": r.get("mlflow_run_id"),
            }
            for r in reports
        ],
        "metrics": {name: {slug: r["metrics"].get(name) for slug, r in zip(slugs, reports)} for name in names},
    }


def render_comparison(table: dict[str, Any]) -> str:
    slugs = [m["slug"] for m in table["models"]]
    lines = [f"# Eval `{table['suite']}`: {len(slugs)} models side by side", ""]
    lines += [
        f"- `{m['slug']}`: `{m['ref']}`" + (f" (eval run `{m['mlflow_run_id']}`)" if m.get("mlflow_run_id") else "")
        for m in table["models"]
    ]
    lines += ["", "| metric | " + " | ".join(slugs) + " |", "|---|" + "---|" * len(slugs)]
    for name, values in table["metrics"].items():
        lines.append(f"| {name} | " + " | ".join(_fmt(values.get(slug)) for slug in slugs) + " |")
    return "\n".join(lines) + "\n"


def write_comparison(out_dir: Path, reports: list[dict[str, Any]]) -> tuple[Path, Path]:
    table = comparison_table(reports)
    json_path = write_atomic_file(Path(out_dir) / COMPARISON_JSON, to_json(table))
    md_path = write_atomic_file(Path(out_dir) / COMPARISON_MD, render_comparison(table))
    return json_path, md_path
