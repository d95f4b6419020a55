"""Every leaf field of the experiment YAML carries a description, so the generated reference
(docs/config_reference.md) has no empty cell, and the YAML-boolean trap of enum fields that allow
"off" is closed."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
import yaml
from pydantic import BaseModel

import polyrl.config
from polyrl.config.base import ConfigError
from polyrl.config.experiment import resolve_arms
from polyrl.config.reference import _nested_models, iter_sections


def _config_models() -> list[tuple[str, type[BaseModel]]]:
    """Every section reachable from ExperimentConfig (by its YAML path), plus every pydantic model
    defined in a polyrl.config module that the walk does not reach (a section not wired in yet)."""
    found = list(iter_sections())
    reached = {model for _, model in found}
    for module_info in pkgutil.iter_modules(polyrl.config.__path__):
        module = importlib.import_module(f"polyrl.config.{module_info.name}")
        for _, model in inspect.getmembers(module, inspect.isclass):
            if issubclass(model, BaseModel) and model.__module__ == module.__name__ and model not in reached:
                reached.add(model)
                found.append((f"({model.__module__}.{model.__qualname__})", model))
    return found


def test_every_leaf_field_has_a_description():
    missing = []
    for path, model in _config_models():
        for name, field in model.model_fields.items():
            if _nested_models(field.annotation):
                continue  # a section: the reference describes it by its own docstring and table
            if not (field.description or "").strip():
                missing.append(f"{path}.{name}" if path else name)
    assert not missing, "fields without Field(description=...): " + ", ".join(missing)


def test_every_section_has_a_docstring():
    # The reference opens each section's table with its docstring's first paragraph, and the parent
    # table describes the section by its first sentence.
    missing = [path for path, model in iter_sections()[1:] if not (model.__doc__ or "").strip()]
    assert not missing, "sections without a class docstring: " + ", ".join(missing)


def test_the_walk_covers_the_known_sections():
    paths = {path for path, _ in _config_models()}
    for section in ("", "rollout", "train", "train.value", "health", "advantage.overlong", "modalities.image", "rewards[]"):
        assert section in paths, section


def _resolve(text: str):
    return resolve_arms(yaml.safe_load(text), source="t.yaml")["main"]


def test_unquoted_off_in_an_enum_that_allows_off_means_off():
    # YAML 1.1 reads an unquoted off as false: the schema takes it for the "off" it allows.
    assert yaml.safe_load("mode: off") == {"mode": False}
    config = _resolve("name: t\nadvantage: {overlong: {mode: off}}\n")
    assert config.advantage.overlong.mode == "off"
    config = _resolve("name: t\nadvantage: {overlong: {mode: soft_punishment}}\n")
    assert config.advantage.overlong.mode == "soft_punishment"


def test_unquoted_on_is_still_refused_with_the_allowed_values():
    # "on" is no allowed value of overlong.mode, so true (an unquoted on) must not be read as anything.
    with pytest.raises(ConfigError) as error:
        _resolve("name: t\nadvantage: {overlong: {mode: on}}\n")
    message = str(error.value)
    assert "advantage.overlong.mode" in message and "soft_punishment" in message


def test_every_enum_that_allows_a_yaml_boolean_word_accepts_the_boolean():
    """A Literal field whose choices include off/on/yes/no/true/false must map the bool YAML makes
    of the unquoted word back to it, or say to quote it; today only advantage.overlong.mode."""
    from typing import Literal, get_args, get_origin

    words = {"off": False, "no": False, "false": False, "on": True, "yes": True, "true": True}
    checked = []
    for path, model in _config_models():
        for name, field in model.model_fields.items():
            annotation = field.annotation
            choices = list(get_args(annotation)) if get_origin(annotation) is Literal else []
            for word in (c for c in choices if isinstance(c, str) and c.lower() in words):
                validated = model.__pydantic_validator__.validate_assignment(model.model_construct(), name, words[word.lower()])
                assert getattr(validated, name) == word, f"{path}.{name}: {words[word.lower()]} is not read as {word!r}"
                checked.append(f"{path}.{name}")
    assert "advantage.overlong.mode" in checked
