"""The generated reference sections: the schema walk, the registries, the layers, the markers."""

from __future__ import annotations

from pathlib import Path

import pytest

from polyrl.cli.docs_reference import generated_section, layers_from_importlinter, objectives_markdown, readme_headlines
from polyrl.config.reference import all_field_paths, allowed_values, schema_reference_markdown, type_name
from polyrl.config.schema import ExperimentConfig

ROOT = Path(__file__).resolve().parents[2]


def test_schema_reference_mentions_every_top_level_field_and_every_section():
    text = schema_reference_markdown()
    for name in ExperimentConfig.model_fields:
        assert f"| `{name}` |" in text, name
    for section in ("model", "model.builtin", "model.lora", "rollout.worker_resources", "train.value", "rewards[]"):
        assert f"## `{section}`" in text, section


def test_schema_reference_lists_nested_fields_with_type_default_and_allowed_values():
    text = schema_reference_markdown()
    paths = all_field_paths()
    assert "rollout.engine" in paths and "train.value.update_every" in paths and "rewards[].weight" in paths
    # rollout.engine: Literal["vllm", "hf"] = "vllm"
    assert "| `engine` | string | `vllm` | `vllm`, `hf` |" in text
    # rollout.top_p: Field(1.0, gt=0, le=1)
    assert "| `top_p` | number | `1.0` | > 0; ≤ 1 |" in text
    # name has no default.
    assert "| `name` | string | required | length ≥ 1 |" in text
    # A section field without a description of its own is described by its section's docstring.
    assert "| `rewards` | list of [mapping](#config-rewards) | `[{module: accuracy}]` |  | One reward term" in text


def test_type_names_and_bounds():
    from polyrl.config.rollout import RolloutConfig

    fields = RolloutConfig.model_fields
    assert type_name(fields["threads"].annotation) == "integer or null"
    assert type_name(fields["kv_cache_gb"].annotation) == "number or string"
    assert allowed_values(fields["threads"]) == "≥ 1"
    assert allowed_values(fields["kv_cache_gb"]) == "`auto`"


def test_descriptions_cannot_break_the_markdown():
    # model.builtin.task's description holds "<img>", which Markdown would read as an image tag.
    text = schema_reference_markdown()
    assert "<img>" not in text and "&lt;img&gt;" in text


def test_objectives_page_lists_every_registered_objective_and_its_params():
    from polyrl.algos.objectives import get_objective, list_objectives

    text = objectives_markdown()
    for spec in list_objectives():
        assert f"### `{spec.name}` {{ #objective-{spec.name} }}" in text
    ppo = get_objective("ppo")
    for param in set(ppo.params.model_fields) - {"high_prob_threshold"}:
        assert f"| `{param}` |" in text.split("{ #objective-ppo }")[1].split("### ")[0], param


def test_layers_match_importlinter_and_unknown_sections_are_refused():
    layers = layers_from_importlinter((ROOT / ".importlinter").read_text())
    assert layers[0] == "polyrl.cli" and layers[-1] == "polyrl.core"
    diagram = generated_section("layers", ROOT)
    assert diagram.startswith("<div><svg") and all(f">{layer}</text>" in diagram for layer in layers)
    assert diagram.count("<line ") == len(layers) - 1  # one arrow between each pair of neighbours
    with pytest.raises(KeyError, match="unknown generated section 'nope'"):
        generated_section("nope", ROOT)


def test_pytest_markers_section_lists_pyproject_markers():
    text = generated_section("pytest-markers", ROOT)
    for marker in ("slow", "vllm", "ray", "mlflow_server", "real_model"):
        assert f"| `{marker}` |" in text


def test_readme_headlines_take_the_section_and_make_its_links_relative_to_docs():
    readme = (
        "# x\n\n## Quick start\n\nrun it\n\n## Headline results\n\n**One.** See [Results](docs/results.md).\n\n"
        "![curve](docs/results/a/b.png)\n\n## Documentation\n\nthe pages\n"
    )
    assert readme_headlines(readme) == "**One.** See [Results](results.md).\n\n![curve](results/a/b.png)\n"
    with pytest.raises(ValueError, match="no '## Headline results' section"):
        readme_headlines("# x\n\n## Quick start\n")
    # The real README has the section, and none of its links still point into docs/.
    assert "](docs/" not in generated_section("readme-headlines", ROOT)
