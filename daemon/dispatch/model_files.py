"""The model files the dispatcher plans, and the input shapes to plan a model for."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from edgepilot.config import Config
from edgepilot.dispatch.graph.signature import Shapes, refuse_unregistered_ops, resolve_shapes
from edgepilot.errors import PlanError
from edgepilot.formats.io import tensor_specs

PLANNED_KINDS = {".onnx": "onnx", ".tflite": "tflite", ".gguf": "gguf"}


def planning_shapes(config: Config, name: str, path: Path,
                    given: Mapping[str, Sequence[int]] | None) -> Shapes:
    """The input shapes to plan ``name`` for: ``given`` (CLI flag or a request) over the
    config's ``input_shapes``, then the file's fixed dims (PlanError naming the input and dim
    when one stays unknown)."""
    kind = PLANNED_KINDS[path.suffix.lower()]
    specs = tensor_specs(path, kind)[0]
    entry = next((e for e in config.models if e.name == name), None)
    merged: dict[str, Sequence[int]] = dict(entry.input_shapes or {}) if entry else {}
    merged.update(given or {})
    defaults = None
    if kind == "tflite":
        from edgepilot.dispatch.graph.tflite_layers import default_shapes

        defaults = default_shapes(path)
    try:
        return resolve_shapes(name, specs, merged, defaults=defaults)
    except PlanError:
        refuse_unregistered_ops(path)
        raise
