"""Code, benchmarks, scripts and tests cite papers (title, arXiv id, section), never the internal
design notes the project was started from (by number and section): readers do not have those. What
came only from the notes and is polyrl's own design says so instead (tests/docs checks docs/)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# "seed", a space or dash, up to two backticks, then 00N (any case); or the notes' folder "seeds"
# + "/" (not the metric seeds/n). Built in pieces so this file does not match itself.
NOTE = re.compile("(?i)" + "seed" + r"[ -]`{0,2}0{2}\d|" + "seeds" + r"/(?!n\b)")


def test_the_code_cites_papers_not_the_design_notes():
    files = [path for folder in ("polyrl", "bench", "scripts", "tests") for path in sorted((ROOT / folder).rglob("*.py"))]
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if NOTE.search(line)
    ]
    assert not found, "cite the paper (title, arXiv id, section), or say it is polyrl's own design:\n" + "\n".join(found)


def test_the_pattern_finds_each_form_of_note_citation():
    seed = "seed"  # split so that this file does not match itself
    for line in (f"({seed} 000 §5.2)", f"{seed} ``003`` §7", f"S{seed[1:]} 003 table", f"{seed}-001", f"in {seed}s/x.md"):
        assert NOTE.search(line), line
    for line in ("3 seeds", "seeds/n", "seed 3", "the seed's run", "seed 100"):
        assert not NOTE.search(line), line


# "issue", a space, then a number: the project's own tracker, which a
# reader of the code cannot open. A link a reader can open (".../issues/123") does not match.
ISSUE = re.compile("(?i)" + r"\b" + "issue" + r"s?\s+#?\d+")


def test_the_code_cites_no_issue_numbers():
    files = [path for folder in ("polyrl", "bench", "scripts", "tests") for path in sorted((ROOT / folder).rglob("*.py"))]
    files += sorted((ROOT / "experiments").rglob("*.yaml")) + sorted((ROOT / "experiments").rglob("*.py"))
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if ISSUE.search(line)
    ]
    assert not found, "say what the change is about, or cite a paper, docs page or test instead:\n" + "\n".join(found)


def test_the_issue_pattern_finds_issue_numbers_but_not_links():
    word = "issue"  # split so that this file does not match itself
    for line in (f"({word} 38: refused)", f"{word.title()} #24", f"{word}s 8 and 9"):
        assert ISSUE.search(line), line
    for line in (f"github.com/vllm-project/vllm/{word}s/123", f"an {word} with 3 seeds", f"the {word}"):
        assert not ISSUE.search(line), line
