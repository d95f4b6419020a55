"""Every YAML example in the docs (and the README) is valid: an experiment against the schema,
an eval suite against the suite model.

A fenced ```yaml block is read by its first line:
- ``# fragment``: part of an experiment (a few sections); validated merged onto a minimal base;
- ``# eval-suite``: an eval suite (``polyrl.evals.suite.parse_suite``);
- otherwise a whole experiment, validated as ``polyrl validate`` does (every arm resolved, the
  ``seeds`` key checked), without loading models, data or reward files.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from polyrl.config.schema import deep_merge, resolve_arms, safe_load_unique
from polyrl.config.seeds import experiment_seeds

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
FENCE = re.compile(r"^```yaml[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
MINIMAL_BASE = {"name": "docs_fragment"}


def yaml_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, body) of each fenced yaml block."""
    return [(text[: match.start()].count("\n") + 1, match.group(1)) for match in FENCE.finditer(text)]


def _examples() -> list:
    examples = []
    for page in PAGES:
        for line, body in yaml_blocks(page.read_text()):
            examples.append(pytest.param(page, body, id=f"{page.relative_to(ROOT)}:{line}"))
    return examples


def validate_example(body: str, source: str) -> None:
    """Raise the schema's own error (naming the field path) when the example is not valid."""
    first = body.lstrip().splitlines()[0].strip() if body.strip() else ""
    data = safe_load_unique(body, source)
    if first == "# eval-suite":
        from polyrl.evals.suite import parse_suite

        parse_suite(data, source)
        return
    assert isinstance(data, dict), f"{source}: a yaml example should be a mapping"
    if first == "# fragment":
        data = deep_merge(MINIMAL_BASE, data)
    resolve_arms(data, source=source)
    experiment_seeds(data, source=source)


def test_the_pages_hold_yaml_examples():
    assert len(_examples()) >= 8


@pytest.mark.parametrize(("page", "body"), _examples())
def test_yaml_example_is_valid(page: Path, body: str):
    validate_example(body, str(page.relative_to(ROOT)))


def test_an_invalid_example_is_caught():
    from polyrl.config.schema import ConfigError

    with pytest.raises(ConfigError, match="rollout.engine"):
        validate_example("# fragment\nrollout: {engine: tgi}\n", "example.md")
    with pytest.raises(ConfigError, match="name"):
        validate_example("rollout: {engine: vllm}\n", "example.md")  # a whole experiment needs its name
