"""Reading a GGUF file's header and tensor table without loading it, to refuse a broken file up front.

A GGUF file cut short (an interrupted download) or a few bytes that start with ``GGUF`` used to
pass ``polyrl validate`` and fail at run time with a raw traceback from the GGUF reader. The
``gguf`` package's ``GGUFReader`` raises numpy errors on such files ("cannot reshape array...")
and builds a numpy array per vocabulary entry (slow for a large vocabulary), so the layout is
walked here instead, by the format's specification (ggml's docs/gguf.md): header (magic,
version, tensor count, metadata count), the metadata entries, the tensor infos (name, shape,
type, offset), then the tensor data from the next multiple of ``general.alignment``. Tensor byte
sizes come from the ``gguf`` package's own table (``GGML_QUANT_SIZES``). The result says what
is wrong in words, or nothing.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

HEADER_BYTES = 24  # magic (4), version (uint32), tensor count (uint64), metadata count (uint64)
DEFAULT_ALIGNMENT = 32
READABLE_VERSIONS = (2, 3)  # what gguf-py (and so transformers) reads
# Metadata value types (gguf.GGUFValueType) -> struct format of a scalar; 8 string, 9 array.
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9


class GGUFLayoutError(ValueError):
    """What is wrong with a GGUF file's layout, in words."""


@dataclass(frozen=True)
class GGUFLayout:
    version: int
    tensors: int
    metadata: int
    data_start: int
    data_end: int  # one past the last tensor byte
    size: int


class _Cursor:
    def __init__(self, data: mmap.mmap | bytes, order: str, size: int):
        self.data, self.order, self.size, self.at = data, order, size, HEADER_BYTES
        self.where = "the header"

    def take(self, fmt: str) -> tuple:
        width = struct.calcsize(self.order + fmt)
        if self.at + width > self.size:
            raise GGUFLayoutError(f"cut short: the file ends at byte {self.size:,}, inside {self.where}")
        values = struct.unpack_from(self.order + fmt, self.data, self.at)
        self.at += width
        return values

    def skip(self, width: int) -> None:
        if self.at + width > self.size:
            raise GGUFLayoutError(f"cut short: the file ends at byte {self.size:,}, inside {self.where}")
        self.at += width

    def string(self) -> str:
        (length,) = self.take("Q")
        start = self.at
        self.skip(length)
        return bytes(self.data[start : self.at]).decode("utf-8", errors="replace")

    def value(self, kind: int) -> object:
        if kind in SCALARS:
            return self.take(SCALARS[kind])[0]
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            element, count = self.take("IQ")
            if element in SCALARS:  # skipped whole: a vocabulary's scores are one jump, not 49k reads
                self.skip(count * struct.calcsize(self.order + SCALARS[element]))
            elif element in (STRING, ARRAY):
                for _ in range(count):
                    self.value(element)
            else:
                raise GGUFLayoutError(f"{self.where} is an array of unknown value type {element}")
            return None
        raise GGUFLayoutError(f"{self.where} has unknown value type {kind}")


def read_gguf_layout(path: str | Path) -> GGUFLayout:
    """The layout of the GGUF file ``path``; :class:`GGUFLayoutError` saying what is wrong."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)
    size = path.stat().st_size
    if size < HEADER_BYTES:
        raise GGUFLayoutError(f"it is {size} bytes, shorter than a GGUF header ({HEADER_BYTES} bytes): cut short")
    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"GGUF":
            raise GGUFLayoutError("it does not start with the bytes 'GGUF'")
        order = "<"
        (version,) = struct.unpack_from("<I", data, 4)
        if version not in READABLE_VERSIONS and struct.unpack_from(">I", data, 4)[0] in READABLE_VERSIONS:
            order, version = ">", struct.unpack_from(">I", data, 4)[0]  # a big-endian file
        if version not in READABLE_VERSIONS:
            raise GGUFLayoutError(f"GGUF version {version}; readable: {', '.join(map(str, READABLE_VERSIONS))}")
        tensors, metadata = struct.unpack_from(order + "QQ", data, 8)
        cursor = _Cursor(data, order, size)
        alignment = DEFAULT_ALIGNMENT
        for index in range(metadata):
            cursor.where = f"metadata entry {index + 1} of {metadata:,}"
            key = cursor.string()
            cursor.where = f"metadata entry {index + 1} of {metadata:,} ({key!r})"
            (kind,) = cursor.take("I")
            value = cursor.value(kind)
            if key == "general.alignment" and isinstance(value, int) and value > 0:
                alignment = value
        infos = []
        for index in range(tensors):
            cursor.where = f"the tensor table (tensor {index + 1} of {tensors:,})"
            name = cursor.string()
            (dims,) = cursor.take("I")
            shape = cursor.take(f"{dims}Q") if dims else ()
            kind, offset = cursor.take("IQ")
            try:
                block, type_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
            except (ValueError, KeyError):
                raise GGUFLayoutError(f"tensor {name!r} has unknown type {kind}") from None
            elements = 1
            for dim in shape:
                elements *= dim
            infos.append((name, offset, elements // block * type_bytes))
    data_start = -(-cursor.at // alignment) * alignment
    data_end = data_start
    for name, offset, length in infos:
        end = data_start + offset + length
        if end > size:
            raise GGUFLayoutError(
                f"cut short: tensor {name!r} needs bytes {data_start + offset:,} to {end:,}, but the file ends at byte {size:,}"
                f" (its tensors need at least {max(data_start + o + n for _, o, n in infos):,} bytes)"
            )
        data_end = max(data_end, end)
    if not infos:
        raise GGUFLayoutError(f"it holds no tensors (the header says {tensors} tensors, {metadata} metadata entries)")
    return GGUFLayout(version, tensors, metadata, data_start, data_end, size)
