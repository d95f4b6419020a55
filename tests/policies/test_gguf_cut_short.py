"""A GGUF file cut short (an interrupted download) is refused up front, naming the file and
what is wrong (docs/bad-input.md). Before, only the magic bytes were checked: ``validate`` said ok and
the run died with a raw traceback from the GGUF reader ("cannot reshape array ...")."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

pytest.importorskip("gguf")

import gguf  # noqa: E402
import numpy as np  # noqa: E402

from polyrl.cli.main import app  # noqa: E402
from polyrl.config.schema import ConfigError  # noqa: E402
from polyrl.policies.gguf_header import read_gguf_layout  # noqa: E402
from polyrl.policies.pretrained import check_gguf_file  # noqa: E402


def write_small_gguf(path):
    """Two F32 tensors: a 64×64 (16,384 bytes) and a 16 (64 bytes), after the header and metadata."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_token_list(["a", "b", "c"])
    writer.add_tensor("a.weight", np.ones((64, 64), np.float32))
    writer.add_tensor("b.weight", np.ones((16,), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_whole_file_reads_and_its_tensors_end_where_the_file_ends(tmp_path):
    path = write_small_gguf(tmp_path / "whole.gguf")
    layout = read_gguf_layout(path)
    assert (layout.version, layout.tensors, layout.metadata) == (3, 2, 3)  # metadata: architecture, block count, tokens
    # b.weight starts at the next 32-byte boundary after a.weight's 16,384 bytes and holds 64:
    assert layout.data_end == layout.size == layout.data_start + 16_384 + 64
    assert check_gguf_file(path) == path
    # the reader the conversion uses agrees on where the data starts
    assert gguf.GGUFReader(str(path)).data_offset == layout.data_start


@pytest.mark.parametrize(
    "keep, says",
    [
        (lambda n: 10, "it is 10 bytes, shorter than a GGUF header (24 bytes): cut short"),
        (lambda n: 40, "cut short: the file ends at byte 40, inside metadata entry 1 of 3"),
        (lambda n: n - 100, "cut short: tensor 'a.weight' needs bytes"),
        (lambda n: n - 1, "cut short: tensor 'b.weight' needs bytes"),
    ],
    ids=["shorter-than-a-header", "inside-the-metadata", "inside-the-first-tensor", "one-byte-short"],
)
def test_a_file_cut_short_is_refused_naming_the_file_and_what_is_wrong(tmp_path, keep, says):
    whole = write_small_gguf(tmp_path / "whole.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: keep(len(whole))])
    with pytest.raises(ConfigError) as info:
        check_gguf_file(cut)  # before: returned the path (it starts with GGUF)
    message = str(info.value)
    assert message.startswith(f"model.path: '{cut}' is not a whole GGUF file: ") and says in message, message


def test_gguf_magic_followed_by_noise_is_refused(tmp_path):
    noise = tmp_path / "noise.gguf"
    noise.write_bytes(b"GGUF" + bytes(range(200)))
    with pytest.raises(ConfigError, match=r"noise.gguf' is not a whole GGUF file: GGUF version \d+; readable: 2, 3"):
        check_gguf_file(noise)


def test_validate_and_run_refuse_a_cut_gguf_before_anything_starts(tmp_path, monkeypatch):
    whole = write_small_gguf(tmp_path / "whole.gguf").read_bytes()
    (tmp_path / "model.gguf").write_bytes(whole[: len(whole) // 2])
    config = {
        "name": "cut",
        "model": {"path": "model.gguf"},
        "rollout": {"engine": "hf"},
        "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "progress": False},
        "checkpoint": {"dir": str(tmp_path / "runs")},
    }
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.chdir(tmp_path)
    for command in ("validate", "run"):
        result = CliRunner().invoke(app, [command, "exp.yaml"])
        assert result.exit_code == 2, result.output  # before: validate said ok; run gave a traceback
        assert "Traceback" not in result.output and result.output.count("error:") == 1, result.output
        assert "model.path: 'model.gguf' is not a whole GGUF file: cut short: tensor 'a.weight'" in result.output
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "runs").exists()
