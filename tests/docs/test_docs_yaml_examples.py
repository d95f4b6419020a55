"""Every YAML example in the docs (and the README) is valid: an experiment against the schema,
an eval suite against the suite model.

A fenced ```yaml block is read as:
- an eval suite (``polyrl.evals.suite.parse_suite``) when its first line is ``# eval-suite`` or it
  has a top-level ``datasets`` key;
- a whole experiment when it has a top-level ``name``, validated as ``polyrl validate`` does (every
  arm resolved, the ``seeds`` key checked), without loading models, data or reward files;
- otherwise a fragment of one (a few sections; ``# fragment`` on its first line says so), validated
  merged onto a minimal base, so every key it shows is still checked;
- not at all when its first line is ``# not-polyrl-config`` (YAML for another tool).
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
    if first == "# not-polyrl-config":
        return
    data = safe_load_unique(body, source)
    assert isinstance(data, dict), f"{source}: a yaml example should be a mapping (or say # not-polyrl-config)"
    if first == "# eval-suite" or "datasets" in data:
        from polyrl.evals.suite import parse_suite

        parse_suite(data, source)
        return
    if first == "# fragment" or "name" not in data:
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
    # A fragment's keys are checked as they would be in a whole experiment.
    with pytest.raises(ConfigError, match="train.steps"):
        validate_example("train: {steps: 0}\n", "example.md")
    with pytest.raises(ConfigError, match="arms"):
        validate_example("name: x\narms: [grpo]\n", "example.md")
