"""Sample tables with their images: one self-contained HTML page per table.

Image prompts are logged as an HTML artifact beside the JSON sample table (training:
``samples/step_<n>.html``; eval: ``samples.html``), one row per sample: the prompt's image(s),
prompt, completion, references, reward(s). MLflow's artifact viewer renders ``.html`` artifacts
in an iframe, so the whole step reads as one page: each image next to the text it was asked
about and the reward it earned. ``mlflow.log_image`` was not taken: it stores one file per image
with no link to its prompt, completion or reward (the viewer shows one image at a time); a
table with image cells (the shape of a W&B table with ``wandb.Image`` cells) keeps each image
with its sample.

The page is self-contained: images are embedded as base64 PNG ``data:`` URIs (no files beside
it, nothing fetched), no script, and every piece of user text (prompts, completions,
references, dataset names, field names) goes through :func:`html.escape`.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import numbers
from typing import Any, Iterable, Mapping, Sequence

# Longer sides are shrunk to this (aspect kept) so a table of real-size photos stays a few MB;
# smaller images (the 32x32 scenes) are embedded at their own size and only drawn larger.
MAX_EMBEDDED_SIDE = 256
# Tiny images are drawn at least this wide (nearest-neighbour, so pixels stay sharp).
MIN_DRAWN_SIDE = 96
# Row keys shown in the reward column, in this order, then every "reward/<label>".
SCORE_KEYS = ("reward", "correct", "cider_fast", "coco_CIDEr")

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;font-size:13px;margin:12px;color:#1a1a1a}
h1{font-size:15px;margin:0 0 8px}
table{border-collapse:collapse;width:100%}
th,td{border:1px solid #d0d7de;padding:6px;vertical-align:top;text-align:left}
th{background:#f6f8fa;position:sticky;top:0}
pre{margin:0;white-space:pre-wrap;word-break:break-word;font-family:ui-monospace,Menlo,Consolas,monospace}
img{image-rendering:pixelated;border:1px solid #d0d7de;margin:0 4px 4px 0}
.muted{color:#6e7781;font-size:12px}
ul{margin:0;padding-left:16px}
.turn{border-left:3px solid #d0d7de;padding-left:6px;margin-bottom:4px}
.turn.assistant{border-left-color:#1f883d}
"""


def has_images(images: Iterable[Sequence[Any]]) -> bool:
    return any(len(row_images) for row_images in images)


def png_bytes(image: Any) -> bytes:
    """``image`` (PIL) as PNG bytes, RGB, longest side at most :data:`MAX_EMBEDDED_SIDE`."""
    picture = image.convert("RGB")
    if max(picture.size) > MAX_EMBEDDED_SIDE:
        picture = picture.copy()
        picture.thumbnail((MAX_EMBEDDED_SIDE, MAX_EMBEDDED_SIDE))
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return buffer.getvalue()


def png_data_uri(image: Any) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(image)).decode("ascii")


def _image_tag(image: Any) -> str:
    width, height = image.size
    scale = max(1, math.ceil(MIN_DRAWN_SIDE / max(width, height, 1)))
    shown_w, shown_h = width, height
    if max(width, height) > MAX_EMBEDDED_SIDE:
        factor = MAX_EMBEDDED_SIDE / max(width, height)
        shown_w, shown_h, scale = max(1, round(width * factor)), max(1, round(height * factor)), 1
    return (
        f'<img src="{png_data_uri(image)}" width="{shown_w * scale}" height="{shown_h * scale}" '
        f'alt="image {width}x{height}" title="{width}x{height}">'
    )


def _text(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _format_score(value: Any) -> str:
    if value is None:
        return "unscored"
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return f"{float(value):.4g}"
    return str(value)


def _scores_cell(row: Mapping[str, Any]) -> str:
    keys = [k for k in SCORE_KEYS if k in row] + sorted(k for k in row if k.startswith("reward/"))
    if not keys:
        return '<span class="muted">none</span>'
    return "<br>".join(f"{_text(key)}: <b>{_text(_format_score(row[key]))}</b>" for key in keys)


def _references_cell(row: Mapping[str, Any]) -> str:
    references = [r for r in (row.get("references") or []) if r is not None]
    parts = []
    if references:
        parts.append("<ul>" + "".join(f"<li><pre>{_text(r)}</pre></li>" for r in references) + "</ul>")
    if row.get("answer") is not None and [str(row["answer"])] != [str(r) for r in references]:
        parts.append(f'<span class="muted">answer:</span> <pre>{_text(row["answer"])}</pre>')
    return "".join(parts) or '<span class="muted">none</span>'


def _episode_html(episode: Any) -> str:
    """An episode (``Completion.episode``, or its JSON) turn by turn: each message with its role,
    tool calls and errors, the turn's reward, and whether its tokens trained (policy turns) or
    not (prompt and observation tokens: no gradient)."""
    if isinstance(episode, str):
        episode = json.loads(episode)
    parts = []
    for turn in episode.get("turns", []):
        notes = [f"{turn.get('tokens', 0)} tokens", "trained" if turn.get("trained") else "not trained"]
        if turn.get("tool_calls"):
            notes.append(f"tool calls {turn['tool_calls']}, errors {turn.get('tool_errors', 0)}")
        if turn.get("role") == "assistant":
            notes.append(f"reward {_format_score(turn.get('reward'))}")
        parts.append(
            f'<div class="turn {_text(turn.get("role"))}"><b>{_text(turn.get("role"))}</b> '
            f'<span class="muted">{_text(" · ".join(notes))}</span><pre>{_text(turn.get("content"))}</pre></div>'
        )
    summary = (
        f"return {_format_score(episode.get('return'))} · {episode.get('assistant_turns', 0)} turns · "
        f"tool calls {episode.get('tool_calls', 0)} (errors {episode.get('tool_errors', 0)}) · ended: {episode.get('end', '')}"
    )
    return "".join(parts) + f'<div class="muted">{_text(summary)}</div>'


def _completion_cell(row: Mapping[str, Any]) -> str:
    if row.get("episode") is not None:
        return _episode_html(row["episode"])
    details = [
        f"{_text(key)} {_text(row[key])}" for key in ("length", "finish_reason", "modalities") if row.get(key) not in (None, "")
    ]
    return f"<pre>{_text(row.get('completion'))}</pre>" + (f'<div class="muted">{" · ".join(details)}</div>' if details else "")


def _where(row: Mapping[str, Any], index: int) -> str:
    parts = [f"{_text(key)} {_text(row[key])}" for key in ("step", "dataset", "id", "sample_index") if row.get(key) is not None]
    return f"{index}" + (f'<div class="muted">{"<br>".join(parts)}</div>' if parts else "")


def samples_html(rows: Sequence[Mapping[str, Any]], images: Sequence[Sequence[Any]], *, title: str) -> str:
    """One HTML page: a table with one ``<tr>`` per row (``images[i]`` are row i's PIL images)."""
    if len(rows) != len(images):
        raise ValueError(f"samples_html: {len(rows)} rows but {len(images)} image lists")
    body = []
    for index, (row, row_images) in enumerate(zip(rows, images)):
        pictures = "".join(_image_tag(image) for image in row_images) or '<span class="muted">no image</span>'
        body.append(
            '<tr class="sample">'
            f"<td>{_where(row, index)}</td><td>{pictures}</td><td><pre>{_text(row.get('prompt'))}</pre></td>"
            f"<td>{_completion_cell(row)}</td><td>{_references_cell(row)}</td><td>{_scores_cell(row)}</td></tr>"
        )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_text(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>{_text(title)}</h1><table><thead><tr><th>#</th><th>image(s)</th><th>prompt</th><th>completion</th>"
        f"<th>references</th><th>reward(s)</th></tr></thead><tbody>{''.join(body)}</tbody></table></body></html>\n"
    )
