"""Reading YAML the one safe way: ``safe_load`` semantics, and duplicate keys refused.

PyYAML keeps the last of two equal keys in a mapping without a word, so a second ``train:``
block silently replaces the first. :func:`safe_load_unique` refuses it, naming the key and both
lines; merge keys (``<<: *anchor``) may still be overridden, as YAML intends.
"""

from __future__ import annotations

from typing import Any

import yaml

from polyrl.core.errors import PolyrlError


class YAMLFileError(PolyrlError, ValueError):
    """A YAML text that cannot be read: invalid, or with a key repeated in one mapping."""


class _DuplicateKey(Exception):
    def __init__(self, key: Any, first_line: int, line: int) -> None:
        super().__init__(key, first_line, line)
        self.key, self.first_line, self.line = key, first_line, line


class _UniqueKeySafeLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                seen = key in first_lines
            except TypeError:  # unhashable key: SafeLoader reports it below
                continue
            if seen:
                raise _DuplicateKey(key, first_lines[key], key_node.start_mark.line + 1)
            first_lines[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def safe_load_unique(text: str, source: str) -> Any:
    """``yaml.safe_load(text)``, refusing a key repeated in one mapping.

    Raises :class:`YAMLFileError` (a ``PolyrlError``) whose message starts with ``source``:
    ``<source>: duplicate key 'train' at line 9 (first at line 2)`` or
    ``<source>: not valid YAML: ...``.
    """
    try:
        return yaml.load(text, Loader=_UniqueKeySafeLoader)  # noqa: S506 - a SafeLoader subclass
    except _DuplicateKey as duplicate:
        raise YAMLFileError(
            f"{source}: duplicate key {duplicate.key!r} at line {duplicate.line} (first at line "
            f"{duplicate.first_line}); YAML would keep only the last one, so remove one of them"
        ) from None
    except yaml.YAMLError as error:
        raise YAMLFileError(f"{source}: not valid YAML: {error}") from None
