"""Images checked before anything starts: ``polyrl validate`` and the pre-flight of ``polyrl run``
open and decode every image of the rows an arm trains on, refuse one above
``data.max_image_pixels`` naming the row, the file and the limit, say how many they checked and
how long it took, and a data error leaves no MLflow run and no experiment folder behind."""

from __future__ import annotations

import io
import json
import struct
import zlib
from pathlib import Path

import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

from polyrl.cli.main import app
from polyrl.core.errors import PolyrlError
from polyrl.data.image_rows import open_image


def header_only_png(path: Path, width: int, height: int) -> Path:
    """A PNG whose header declares width×height and that holds no pixel data: what a
    decompression bomb looks like to a reader that trusts the header."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) + chunk(b"IEND", b"")
    )
    return path


def _rows(folder: Path, count: int, *, bad: dict[int, str] | None = None) -> Path:
    (folder / "img").mkdir(exist_ok=True)
    rows = []
    for index in range(count):
        name = f"img/{index}.png"
        Image.new("RGB", (16, 16), (index * 40 % 256, 0, 0)).save(folder / name)
        rows.append({"prompt": "<image>What colour?", "answer": "red", "images": [(bad or {}).get(index, name)]})
    path = folder / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _experiment(folder: Path, data: dict) -> Path:
    config = {
        "name": "pics",
        "model": {"builtin": {"task": "vqa"}},
        "data": data,
        "rewards": [{"module": "accuracy"}],
        "rollout": {"engine": "hf"},
        "train": {"steps": 1},
        "tracking": {"uri": f"sqlite:///{folder / 'mlflow.db'}"},
        "checkpoint": {"dir": str(folder / "runs")},
    }
    path = folder / "exp.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _invoke(folder: Path, monkeypatch, *args: str) -> tuple[int, str]:
    monkeypatch.chdir(folder)
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, " ".join(result.output.split())


def test_validate_and_run_find_a_missing_image_in_a_later_row_before_any_run_exists(tmp_path, monkeypatch):
    data = _rows(tmp_path, 6, bad={3: "img/missing.png"})
    path = _experiment(tmp_path, {"source": str(data)})
    for command in ("validate", "run"):
        code, output = _invoke(tmp_path, monkeypatch, command, str(path))
        # Before: validate said ok (it read only row 0), and run failed after creating its MLflow runs.
        assert code == 2, output
        assert "row 3: field 'images'[0]: image file 'img/missing.png' not found" in output, output
        assert "Traceback" not in output
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "runs").exists()  # no half-created run

    # A file that is cut short is found by decoding it (a truncated JPEG passes Pillow's verify()),
    # and data.limit bounds the rows checked to those trained on.
    data = _rows(tmp_path, 6, bad={5: "img/cut.jpg"})
    jpeg = io.BytesIO()
    Image.effect_noise((64, 64), 50).convert("RGB").save(jpeg, "JPEG")
    (tmp_path / "img" / "cut.jpg").write_bytes(jpeg.getvalue()[: len(jpeg.getvalue()) // 2])
    code, output = _invoke(tmp_path, monkeypatch, "validate", str(_experiment(tmp_path, {"source": str(data), "limit": 5})))
    assert code == 0, output
    assert "images: 5 in 5 rows of" in output and "decoded and within data.max_image_pixels (89,478,485) in" in output, output
    code, output = _invoke(tmp_path, monkeypatch, "validate", str(_experiment(tmp_path, {"source": str(data)})))
    assert (
        code == 2
        and "row 5: field 'images'[0]: image file 'img/cut.jpg' is not a readable image (OSError: image file is truncated"
        in output
    ), output


def test_an_image_above_the_pixel_limit_is_refused_naming_row_file_and_limit(tmp_path, monkeypatch):
    data = _rows(tmp_path, 3)
    header_only_png(tmp_path / "img" / "huge.png", 15000, 15000)
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    rows[2]["images"] = ["img/huge.png"]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    code, output = _invoke(tmp_path, monkeypatch, "validate", str(_experiment(tmp_path, {"source": str(data)})))
    # Before: a raw DecompressionBombError traceback.
    assert code == 2, output
    assert "row 2: field 'images'[0]: image file 'img/huge.png' is above the limit data.max_image_pixels = 89,478,485" in output
    assert "Traceback" not in output and "DecompressionBombError:" not in output.split("(")[0]

    # The limit is a setting: a small one refuses the 16×16 images, naming their size.
    code, output = _invoke(
        tmp_path, monkeypatch, "validate", str(_experiment(tmp_path, {"source": str(data), "max_image_pixels": 200}))
    )
    assert (
        code == 2
        and "row 0: field 'images'[0]: image file 'img/0.png' is 16×16 = 256 pixels, above the limit data.max_image_pixels = 200"
        in output
    ), output


def test_the_pixel_limit_applies_from_the_header_and_defaults_to_pillows(tmp_path):
    from polyrl.config.schema import DataConfig
    from polyrl.data.image_rows import DEFAULT_MAX_IMAGE_PIXELS

    assert DataConfig().max_image_pixels == DEFAULT_MAX_IMAGE_PIXELS == 89_478_485
    huge = header_only_png(tmp_path / "huge.png", 15000, 15000)  # 225,000,000 pixels: above twice Pillow's limit
    wide = header_only_png(tmp_path / "wide.png", 10000, 10000)  # between Pillow's limit and twice it: Pillow only warns
    for path, said in ((huge, "is above the limit"), (wide, "is 10000×10000 = 100,000,000 pixels, above the limit")):
        with pytest.raises(PolyrlError, match=said):
            open_image(str(path), index=7, field="images", position=0)
    # A limit above Pillow's lets the header through; this file has no pixels, so it is then unreadable.
    with pytest.raises(PolyrlError, match="row 7: field 'images'\\[0\\]: image file .* is not a readable image"):
        open_image(str(huge), index=7, field="images", position=0, max_pixels=300_000_000)
