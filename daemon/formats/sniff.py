"""What kind of model a file's first bytes say it is, for an error about a misnamed file.

The kind of a model is taken from its extension everywhere (``.onnx``, ``.tflite``, ``.gguf``);
a file saved under the wrong one failed with the parser's complaint alone ("Wire format was
corrupt", "no TFL3 identifier"). These checks only add the likely fix to such an error.
"""

from __future__ import annotations

from pathlib import Path

SUFFIXES = {"onnx": ".onnx", "tflite": ".tflite", "gguf": ".gguf"}
# an ONNX ModelProto opens with ir_version (field 1, varint: tag 0x08, a small value) and then
# one of its length-delimited fields: producer (2), graph (7), opset_import (8), ...
_ONNX_NEXT_TAGS = frozenset({0x12, 0x1A, 0x22, 0x2A, 0x32, 0x3A, 0x42, 0x52, 0x5A, 0x62, 0x72})


def kind_of_content(path: Path) -> str | None:
    """"tflite", "gguf" or "onnx" when the file's first bytes say so, else None."""
    try:
        with path.open("rb") as fh:
            head = fh.read(512)
    except OSError:
        return None
    if head[4:8] == b"TFL3":
        return "tflite"
    if head[:4] == b"GGUF":
        return "gguf"
    if len(head) > 2 and head[0] == 0x08 and 1 <= head[1] <= 15 and head[2] in _ONNX_NEXT_TAGS:
        return "onnx"
    return None


def misnamed(path: Path, kind: str) -> str:
    """``"; its bytes are a TFLite model (...): name it x.tflite"`` when ``path``, read as
    ``kind``, holds another kind of model; "" otherwise."""
    found = kind_of_content(path)
    if found is None or found == kind:
        return ""
    what = {"tflite": "a TFLite model (TFL3 identifier)", "gguf": "a GGUF model (GGUF magic)",
            "onnx": "an ONNX model (its protobuf header)"}[found]
    return f"; its bytes are {what}: name it {path.stem}{SUFFIXES[found]}"
