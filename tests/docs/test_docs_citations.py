"""Hand-written docs text that must follow the code: the preset paragraph of docs/objectives.md
against the objective registry, and citations that readers can follow (papers, not the
internal design notes the project was started from)."""

from __future__ import annotations

import re
from pathlib import Path

from polyrl.algos.objectives import list_objectives
from polyrl.config.presets import OBJECTIVE_PRESETS

ROOT = Path(__file__).resolve().parents[2]


def _preset_paragraph() -> str:
    text = (ROOT / "docs" / "objectives.md").read_text()
    start = text.index("Size presets (")
    return text[start : text.index("Explicit YAML keys always win.", start)]


def _names_in_item(paragraph: str, lead: str) -> set[str]:
    items = re.split(r"^- ", paragraph.split("\n\n")[1], flags=re.MULTILINE)  # the bulleted list
    item = next(line for line in items if line.startswith(lead))
    return set(re.findall(r"`([a-z_]+)`", item.split(":", 1)[1]))


def test_the_preset_paragraph_lists_each_registered_objective_under_its_clip_rule():
    paragraph = _preset_paragraph()
    symmetric, gap, own = set(), set(), set()
    for spec in list_objectives():
        if spec.preset_clip is None:
            own.add(spec.name)
            continue
        clip = spec.preset_clip(0.2)
        (symmetric if clip["clip_low"] == clip["clip_high"] == 0.2 else gap).add(spec.name)
    assert _names_in_item(paragraph, "`clip_low = clip_high = ε`") == symmetric
    # dapo: preset_clip(0.2) gives 0.2 / 0.28, the gap of 0.08 the paragraph states.
    assert _names_in_item(paragraph, "`clip_low = ε`, `clip_high = ε + 0.08`") == gap
    assert all(spec.preset_clip(0.2)["clip_high"] == 0.28 for spec in list_objectives() if spec.name in gap)
    # The "own scale" item also names what bounds each ratio in parentheses; only names in backticks count.
    assert _names_in_item(paragraph, "no clip from the preset") == own
    for name in OBJECTIVE_PRESETS:
        assert f"`{name}`" in paragraph.split("objective preset", 1)[1], name


# A design-note citation ("seed", a space, dash or backtick, then 00N; or the notes' folder
# "seeds" + "/"): documents readers of the repository do not have. Random seeds ("3 seeds",
# the metric named seeds, slash, n) do not match.
DESIGN_NOTE_CITATION = re.compile(r"seed[ -]`?0{2}\d|seeds[/](?!n\b)")


def test_docs_and_the_config_schema_cite_papers_not_the_design_notes():
    files = sorted((ROOT / "docs").rglob("*.md")) + sorted((ROOT / "polyrl" / "config").glob("*.py"))
    files += sorted((ROOT / "experiments").rglob("*.yaml")) + [ROOT / "README.md"]
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if DESIGN_NOTE_CITATION.search(line)
    ]
    assert not found, "cite the paper (title, arXiv id, section) instead:\n" + "\n".join(found)


# "issue", a space, then a number (the same pattern as tests/test_code_citations.py); a link a reader
# can open (".../issues/123") does not match.
ISSUE = re.compile("(?i)" + r"\b" + "issue" + r"s?\s+#?\d+")


def test_docs_cite_no_issue_numbers():
    """The project's issue numbers are not something a reader of the docs can open;
    a dated note, a docs page or a test is."""
    files = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / name for name in ("README.md", "CONTRIBUTING.md", "AGENTS.md")]
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in files
        if path.exists()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if ISSUE.search(line)
    ]
    assert not found, "cite what a reader can open instead:\n" + "\n".join(found)
