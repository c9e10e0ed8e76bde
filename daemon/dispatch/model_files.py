"""What a model name means to the dispatcher: its file, its tolerance override, and the input
shapes to plan it for."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from edgepilot.config import Config
from edgepilot.dispatch.graph.signature import Shapes, resolve_shapes
from edgepilot.errors import NotFoundError
from edgepilot.formats.io import tensor_specs

PLANNED_KINDS = {".onnx": "onnx", ".tflite": "tflite", ".gguf": "gguf"}


def resolve_model(config: Config, name: str,
                  resolver: Callable[[str], object] | None = None
                  ) -> tuple[str, Path, float | None]:
    """Model name (or path) -> (name, file, tolerance override).

    ``resolver`` is the model registry's (verified, inside the model dir) when there is one;
    without it (the CLI) a config entry, a file stem in the model dir or a path will do.
    """
    tolerance = next((e.tolerance for e in config.models if e.name == name), None)
    if resolver is not None:
        return name, Path(str(resolver(name))), tolerance
    for entry in config.models:
        if entry.name == name:
            return name, config.model_dir / entry.file, entry.tolerance
    model_dir = config.model_dir
    for suffix in PLANNED_KINDS:
        cand = model_dir / f"{name}{suffix}"
        if cand.is_file():
            return name, cand, None
    path = Path(name)
    if path.is_file():
        return path.stem, path, None
    known = sorted({e.name for e in config.models} | {
        p.stem for p in model_dir.glob("*") if p.suffix in PLANNED_KINDS}) \
        if model_dir.is_dir() else sorted(e.name for e in config.models)
    raise NotFoundError(f"unknown model {name!r}; known: {', '.join(known) or 'none'} "
                        f"(model dir {model_dir})", field="model")


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
    return resolve_shapes(name, specs, merged, defaults=defaults)
