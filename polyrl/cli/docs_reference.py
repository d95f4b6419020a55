"""Reference sections of the documentation site, generated from the live code at build time.

``docs/hooks/generate.py`` (an MkDocs hook) replaces each ``<!-- polyrl-generated: NAME -->``
line of a page with :func:`generated_section` ``(NAME)``, so the reference tables read the
registries and the schema of the code being documented: an objective registered today is on
the page at the next ``make docs``, without anyone editing a page. The sections:

- ``config-reference``: every field of the experiment YAML (``polyrl.config.reference``);
- ``objectives`` / ``advantages``: the registered objectives and advantage estimators with their
  paper, deviations and typed parameters (what ``polyrl objectives show NAME`` prints);
- ``rewards``: the built-in reward modules and their constructor parameters;
- ``layers``: the import layers of ``.importlinter`` as a diagram (inline SVG) and a table;
- ``pytest-markers``: the test markers declared in ``pyproject.toml``;
- ``readme-headlines``: the README's "Headline results" section, its links made relative to
  ``docs/``, so the site's home page and the README cannot give different headlines.
"""

from __future__ import annotations

import configparser
import inspect
import tomllib
from pathlib import Path
from typing import Callable

from polyrl.algos.advantages import list_advantages
from polyrl.algos.objectives import list_objectives
from polyrl.algos.objectives.registry import ObjectiveParams
from polyrl.algos.params import Params, describe_param
from polyrl.cli.plugin_kit import describe_params
from polyrl.config.reference import schema_reference_markdown
from polyrl.rewards.registry import registered_rewards

MARKER = "<!-- polyrl-generated: {name} -->"


def _text(text: str) -> str:
    """Prose from the code as Markdown: one line, nothing read as HTML, emphasis or a table cell edge."""
    text = " ".join(str(text).split())
    for raw, safe in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("*", "\\*"), ("|", "\\|")):
        text = text.replace(raw, safe)
    return text


def _default(value: object) -> str:
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def params_table(model: type[Params], *, skip: tuple[str, ...] = ()) -> str:
    """A parameter model as a table: name, what it accepts, default, meaning."""
    rows = ["| param | allowed | default | meaning |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        cells = (f"`{name}`", _text(describe_param(model, name)), _default(field.default), _text(field.description or ""))
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) if len(rows) > 2 else "No parameters of its own."


def objectives_markdown() -> str:
    """Every registered objective: a summary table, then one section each."""
    specs = list_objectives()
    lines = [
        "| objective | what it is | default aggregation | default advantage | paper |",
        "|---|---|---|---|---|",
    ]
    for spec in specs:
        lines.append(
            f"| [`{spec.name}`](#objective-{spec.name}) | {_text(spec.description)} | `{spec.default_aggregation}` "
            f"| `{spec.default_advantage}` | {_text(spec.paper)} |"
        )
    shared = tuple(ObjectiveParams.model_fields)
    for spec in specs:
        lines += [
            "",
            f"### `{spec.name}` {{ #objective-{spec.name} }}",
            "",
            _text(spec.description),
            "",
            f"- **Paper**: {_text(spec.paper)}",
            f"- **Deviations from the paper**: {_text(spec.deviations) if spec.deviations else 'none recorded'}",
            f"- **Defaults**: aggregation `{spec.default_aggregation}`, advantage estimator `{spec.default_advantage}`",
            "- **Presets**: "
            + ("a preset's ε sets its clip bounds" if spec.preset_clip else "a preset leaves its clip scale alone"),
            "- **Batch-level step**: "
            + ("chosen once per mini-batch before the micro-batches (`prepare`)" if spec.prepare else "none"),
            "",
            f"`objective.params` (`{spec.params.__module__}.{spec.params.__qualname__}`):",
            "",
            params_table(spec.params, skip=shared),
        ]
    lines += [
        "",
        "### Parameters every objective accepts { #objective-shared-params }",
        "",
        params_table(ObjectiveParams),
        "",
        "`kl_coef`, `kl_estimator` and `entropy_coef` are set under `train.*`, never in `objective.params`.",
    ]
    return "\n".join(lines) + "\n"


def advantages_markdown() -> str:
    """Every registered advantage estimator: a summary table, then one section each."""
    specs = list_advantages()
    lines = ["| estimator | what it is | needs | paper |", "|---|---|---|---|"]
    for spec in specs:
        needs = ", ".join(f"`{name}`" for name in spec.requires)
        lines.append(f"| [`{spec.name}`](#advantage-{spec.name}) | {_text(spec.description)} | {needs} | {_text(spec.paper)} |")
    for spec in specs:
        lines += [
            "",
            f"### `{spec.name}` {{ #advantage-{spec.name} }}",
            "",
            _text(spec.description),
            "",
            f"- **Paper**: {_text(spec.paper)}",
            f"- **Needs**: {', '.join(f'`{name}`' for name in spec.requires)}"
            + ("; also trains a critic (value targets)" if spec.value_targets else ""),
            "",
            "`advantage.params`:",
            "",
            params_table(spec.params),
        ]
    return "\n".join(lines) + "\n"


def rewards_markdown() -> str:
    """The built-in reward modules (registered in ``polyrl.rewards.builtins`` and ``polyrl.reward_models``) and their parameters."""
    lines = ["| module | what it scores | parameters (constructor) |", "|---|---|---|"]
    for name, cls in registered_rewards().items():
        if not cls.__module__.startswith(("polyrl.rewards.", "polyrl.reward_models.")):
            continue  # registered by a test or a user file in this process: not part of polyrl
        doc = inspect.getdoc(cls) or ""
        summary = doc.split("\n\n")[0] if doc else ""
        # <code> rather than backticks: entities are decoded there, so '<img>' and '|' stay text.
        params = "<br>".join(f"<code>{_text(param).replace(chr(92) + '|', '&#124;')}</code>" for param in describe_params(cls))
        lines.append(f"| `{name}` | {_text(summary)} | {params} |")
    return "\n".join(lines) + "\n"


def pytest_markers_markdown(pyproject_text: str) -> str:
    """The test markers declared in pyproject.toml, as a table (what each one says a test needs)."""
    markers = tomllib.loads(pyproject_text)["tool"]["pytest"]["ini_options"].get("markers", [])
    rows = ["| marker | what the test needs |", "|---|---|"]
    for marker in markers:
        name, _, meaning = marker.partition(":")
        rows.append(f"| `{name.strip()}` | {_text(meaning.strip())} |")
    return "\n".join(rows) + "\n"


def layers_from_importlinter(text: str) -> list[str]:
    """The layer contract's packages, top (may import everything below) to bottom."""
    parser = configparser.ConfigParser()
    parser.read_string(text)
    for section in parser.sections():
        if parser.get(section, "type", fallback="") == "layers":
            return [line.strip() for line in parser.get(section, "layers").splitlines() if line.strip()]
    raise ValueError("no layers contract in .importlinter")


def layers_diagram(text: str) -> str:
    """The layers as an inline SVG (no JavaScript, so it shows offline too): one box per package,
    top to bottom, each arrow pointing the way imports may go; then the same as a table."""
    layers = layers_from_importlinter(text)
    box_w, box_h, gap, left, top = 240, 26, 16, 20, 10
    height = top * 2 + len(layers) * box_h + (len(layers) - 1) * gap
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{box_w + 2 * left}" height="{height}" '
        f'viewBox="0 0 {box_w + 2 * left} {height}" role="img" aria-label="polyrl import layers, top to bottom">',
        '<defs><marker id="polyrl-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" markerHeight="6" '
        'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="currentColor"/></marker></defs>',
    ]
    for index, layer in enumerate(layers):
        y = top + index * (box_h + gap)
        parts.append(
            f'<rect x="{left}" y="{y}" width="{box_w}" height="{box_h}" rx="4" fill="none" stroke="currentColor"/>'
            f'<text x="{left + box_w / 2}" y="{y + box_h / 2 + 5}" text-anchor="middle" font-family="monospace" '
            f'font-size="14" fill="currentColor">{layer}</text>'
        )
        if index + 1 < len(layers):
            x, y0 = left + box_w / 2, y + box_h
            parts.append(
                f'<line x1="{x}" y1="{y0}" x2="{x}" y2="{y0 + gap - 1}" stroke="currentColor" marker-end="url(#polyrl-arrow)"/>'
            )
    parts.append("</svg>")
    table = ["", "| height | package |", "|---|---|"]
    table += [f"| {len(layers) - index} | `{layer}` |" for index, layer in enumerate(layers)]
    return "<div>" + "".join(parts) + "</div>\n" + "\n".join(table) + "\n"


README_HEADLINES = "## Headline results"


def readme_headlines(readme_text: str) -> str:
    """The body of the README's "Headline results" section (up to the next ``## `` heading), with
    its links and images into ``docs/`` made relative to the docs folder; a ``ValueError`` when the
    README has no such section."""
    start = readme_text.find(f"\n{README_HEADLINES}\n")
    if start < 0:
        raise ValueError(f"README.md has no '{README_HEADLINES}' section for the home page")
    body = readme_text[start + len(README_HEADLINES) + 2 :]
    end = body.find("\n## ")
    body = body if end < 0 else body[:end]
    return body.replace("](docs/", "](").strip() + "\n"


# Each generator takes the repository root (where .importlinter lives).
GENERATORS: dict[str, Callable[[Path], str]] = {
    "config-reference": lambda root: schema_reference_markdown(),
    "objectives": lambda root: objectives_markdown(),
    "advantages": lambda root: advantages_markdown(),
    "rewards": lambda root: rewards_markdown(),
    "layers": lambda root: layers_diagram((root / ".importlinter").read_text()),
    "pytest-markers": lambda root: pytest_markers_markdown((root / "pyproject.toml").read_text()),
    "readme-headlines": lambda root: readme_headlines((root / "README.md").read_text()),
}


def generated_section(name: str, root: Path) -> str:
    """The Markdown of one generated section; a ``KeyError`` naming the known ones otherwise."""
    if name not in GENERATORS:
        raise KeyError(f"unknown generated section {name!r}; known: {', '.join(GENERATORS)}")
    return GENERATORS[name](root)
