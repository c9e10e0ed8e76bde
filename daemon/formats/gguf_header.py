"""A GGUF header reader that reads only what it is asked for.

``gguf.GGUFReader`` builds a numpy view of every key, every array item and every tensor: for a
real instruct model that is the whole token table (~49k strings), its scores, types and ~49k
merges, and it costs seconds. llama.cpp itself loads the same file in about a tenth of a second.
This reader walks the key/value section with ``struct`` over an mmap, decodes the keys it is
asked for, steps over the rest (numeric arrays in one jump, string arrays by their lengths
only), then reads the tensor infos (name, dims, type, offset) to size every tensor.

Layout (little-endian; GGUF v2/v3): ``magic "GGUF"``, ``u32 version``, ``u64 n_tensors``,
``u64 n_kv``, then ``n_kv`` × (string key, u32 type, value), then ``n_tensors`` × (string name,
u32 n_dims, u64 dims[n_dims], u32 ggml type, u64 offset), padding to ``general.alignment``, and
the tensor data. A string is ``u64 length`` + UTF-8 bytes; an array is ``u32 item type``,
``u64 count``, items.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable, Container
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgepilot.errors import ModelError

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# GGUF value types -> struct format of one item (strings and arrays are handled apart)
_STRING, _ARRAY = 8, 9
_SCALARS: dict[int, str] = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?",
                            10: "Q", 11: "q", 12: "d"}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's entry in the header: enough to know its type and size in bytes."""

    name: str
    dims: tuple[int, ...]
    ggml_type: int
    type_name: str          # lower-case ggml type, e.g. "q4_1"
    offset: int             # from the start of the data section
    n_bytes: int


@dataclass(frozen=True)
class GgufHeader:
    """The keys that were asked for, every tensor's info, and where the data starts."""

    version: int
    fields: dict[str, Any]
    tensors: list[TensorInfo]
    data_offset: int
    file_size: int


class _Corrupt(Exception):
    """Internal: the header does not parse; turned into a ModelError naming the file."""


def _ggml_types() -> dict[int, tuple[str, int, int]]:
    """ggml type id -> (name, block size, bytes per block), from the ``gguf`` package."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    return {int(t): (t.name.lower(), *GGML_QUANT_SIZES[t]) for t in GGMLQuantizationType
            if t in GGML_QUANT_SIZES}


class _Cursor:
    """Reads little- (or big-) endian values from a buffer, raising _Corrupt past its end."""

    def __init__(self, buf: Any, size: int, order: str) -> None:
        self.buf = buf
        self.size = size
        self.order = order
        self.pos = 0
        self._u32 = struct.Struct(order + "I")
        self._u64 = struct.Struct(order + "Q")

    def need(self, n: int) -> None:
        if n < 0 or self.pos + n > self.size:
            raise _Corrupt(f"it ends at byte {self.size} where {n} more bytes are expected at "
                           f"byte {self.pos} (truncated?)")

    def u32(self) -> int:
        self.need(4)
        (v,) = self._u32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return int(v)

    def u64(self) -> int:
        self.need(8)
        (v,) = self._u64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return int(v)

    def string(self) -> str:
        n = self.u64()
        self.need(n)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _Corrupt(f"a string at byte {self.pos - n} is not UTF-8 ({exc.reason})"
                           ) from None

    def skip_strings(self, count: int) -> None:
        # the token table: tens of thousands of strings, only their lengths are read
        unpack, buf, pos, size = self._u64.unpack_from, self.buf, self.pos, self.size
        for _ in range(count):
            if pos + 8 > size:
                self.pos = pos
                self.need(8)
            pos += 8 + unpack(buf, pos)[0]
        self.pos = pos
        if pos > size:
            self.pos = size
            raise _Corrupt(f"a string array runs past the end of the file at byte {size} "
                           "(truncated?)")

    def scalar(self, vtype: int) -> Any:
        fmt = _SCALARS[vtype]
        n = struct.calcsize(fmt)
        self.need(n)
        (v,) = struct.unpack_from(self.order + fmt, self.buf, self.pos)
        self.pos += n
        return v

    def value(self, vtype: int, want: bool) -> Any:
        """The value of type ``vtype`` (decoded when ``want``, else stepped over: None)."""
        if vtype == _STRING:
            if want:
                return self.string()
            n = self.u64()
            self.need(n)
            self.pos += n
            return None
        if vtype in _SCALARS:
            return self.scalar(vtype)
        if vtype != _ARRAY:
            raise _Corrupt(f"unknown value type {vtype} at byte {self.pos - 4}")
        itype, count = self.u32(), self.u64()
        if itype == _STRING:
            if want:
                return [self.string() for _ in range(count)]
            self.skip_strings(count)
            return None
        if itype not in _SCALARS:
            raise _Corrupt(f"unsupported array item type {itype} at byte {self.pos - 12}")
        fmt = _SCALARS[itype]
        n = struct.calcsize(fmt) * count
        self.need(n)
        out = (list(struct.unpack_from(f"{self.order}{count}{fmt}", self.buf, self.pos))
               if want else None)
        self.pos += n
        return out


def read_header(path: Path, want: Container[str] | Callable[[str], bool]) -> GgufHeader:
    """Read ``path``'s header: the keys ``want`` names (a set, or a predicate on the key) and
    every tensor's info. Nothing past the tensor infos is read.

    ModelError (naming the file) when it is not a GGUF, has a version this reader does not
    know, or is truncated/corrupt (a header running past the end, a tensor whose data would).
    """
    wanted: Callable[[str], bool] = want if callable(want) else want.__contains__
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            if size < 24:
                raise ModelError(f"{path.name} is not a GGUF file: {size} bytes, shorter than "
                                 "a GGUF header", field="file")
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(buf, size, wanted, path)
    except OSError as exc:
        raise ModelError(f"{path.name} cannot be read: {exc.strerror or exc}",
                         field="file") from None
    except _Corrupt as exc:
        raise ModelError(f"{path.name} is a truncated or corrupt GGUF file: {exc}; replace the "
                         "file (e.g. download it again)", field="file") from None


def _parse(buf: Any, size: int, wanted: Callable[[str], bool], path: Path) -> GgufHeader:
    if bytes(buf[:4]) != MAGIC:
        raise ModelError(f"{path.name} is not a GGUF file (it starts with {bytes(buf[:4])!r}, "
                         f"not {MAGIC!r})", field="file")
    (version,) = struct.unpack_from("<I", buf, 4)
    order = "<"
    if version & 0xFFFF == 0:  # written on a big-endian host: every number is byte-swapped
        (version,) = struct.unpack_from(">I", buf, 4)
        order = ">"
    if version not in SUPPORTED_VERSIONS:
        raise ModelError(f"{path.name} is GGUF version {version}; supported: "
                         f"{', '.join(map(str, SUPPORTED_VERSIONS))} (convert it with a "
                         "current llama.cpp)", field="file")
    cur = _Cursor(buf, size, order)
    cur.pos = 8
    n_tensors, n_kv = cur.u64(), cur.u64()
    # every entry takes at least 12 bytes: counts beyond the file are corruption, not a loop
    if (n_tensors + n_kv) * 12 > size:
        raise _Corrupt(f"it claims {n_tensors} tensors and {n_kv} keys in {size} bytes")
    fields: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        vtype = cur.u32()
        value = cur.value(vtype, wanted(key) or key == "general.alignment")
        if value is not None:
            fields[key] = value
    types = _ggml_types()
    infos: list[tuple[str, tuple[int, ...], int, int]] = []
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.u32()
        if n_dims > 8:
            raise _Corrupt(f"tensor {name!r} claims {n_dims} dimensions")
        dims = tuple(cur.u64() for _ in range(n_dims))
        infos.append((name, dims, cur.u32(), cur.u64()))
    align = int(fields.get("general.alignment", DEFAULT_ALIGNMENT)) or DEFAULT_ALIGNMENT
    data_offset = -(-cur.pos // align) * align
    tensors = []
    for name, dims, gtype, offset in infos:
        if gtype not in types:
            raise _Corrupt(f"tensor {name!r} has unknown ggml type {gtype}")
        tname, block, type_size = types[gtype]
        n = 1
        for d in dims:
            n *= d
        n_bytes = n * type_size // block
        end = data_offset + offset + n_bytes
        if end > size:
            raise _Corrupt(f"tensor {name!r} ends at byte {end}, past the end of the file at "
                           f"byte {size} (truncated?)")
        tensors.append(TensorInfo(name, dims, gtype, tname, offset, n_bytes))
    return GgufHeader(int(version), fields, tensors, data_offset, size)
