"""build_cached: a model folder is published whole under its key, or not at all."""

import json

import pytest
import torch

from polyrl.policies.cache import COMPLETE_MARKER, INFO_FILE, build_cached, is_complete
from polyrl.runtime.threads import torch_threads


def _writer(tag):
    def write(folder):
        (folder / "config.json").write_text("{}")
        (folder / "model.safetensors").write_text(tag)
        return {"tag": tag}

    return write


def test_publishes_a_complete_folder_and_keeps_a_complete_one_unless_forced(tmp_path):
    final = tmp_path / "key"
    assert build_cached(final, _writer("first")) == final
    assert is_complete(final) and json.loads((final / INFO_FILE).read_text()) == {"tag": "first"}
    assert (final / COMPLETE_MARKER).read_text().strip() == "key"
    build_cached(final, _writer("second"))  # a concurrent build of the same key finished first: kept
    assert (final / "model.safetensors").read_text() == "first"
    build_cached(final, _writer("third"), force=True)
    assert (final / "model.safetensors").read_text() == "third"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["key"]  # no temporary folder left


def test_a_failed_build_leaves_nothing(tmp_path):
    def fail(folder):
        (folder / "config.json").write_text("{}")
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError):
        build_cached(tmp_path / "key", fail)
    assert list(tmp_path.iterdir()) == []


def test_torch_threads_restores_the_count():
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
