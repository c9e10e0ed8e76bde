"""What a model file is made of, as the backends see it: its kind, segments and tensor specs.

These sit in formats, below backends, so file readers and graph cutters can name them without
importing the backend contract; edgepilot.backends.base re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ModelKind = Literal["gguf", "onnx", "tflite"]


@dataclass(frozen=True)
class Segment:
    """A contiguous piece of a model to compile as one unit.

    ``inputs``/``outputs`` are the tensor names crossing its boundary; for the whole model they
    are the model's own inputs and outputs. ``layers`` is the half-open range of partitioner
    layer indices it covers (``None`` = the whole model).
    """

    model_path: Path
    kind: ModelKind
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    layers: tuple[int, int] | None = None
    name: str = ""

    @property
    def is_whole(self) -> bool:
        return self.layers is None


@dataclass
class TensorSpec:
    """A model input or output: name, dtype, dims (a str or None for a dynamic dim).

    ``rank_known`` is False for an ONNX tensor that declares a type and no shape at all (not
    even how many dims): ``shape`` is then ``()`` and means nothing; any shape is taken."""

    name: str
    dtype: str
    shape: tuple[int | str | None, ...]
    rank_known: bool = True
