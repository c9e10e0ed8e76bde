"""Input-shape signatures: the concrete shapes a plan is made for.

A plan is valid for one set of input shapes (batch included): the graph is cut on shapes
inferred for exactly those inputs, and every segment is timed on them. Shapes come from, in
order: ``--input-shape NAME=1x3x320x320`` (CLI), ``[[models]] input_shapes`` (config), the
model's own fixed dims, and in the daemon the first real request. Symbolic dims shared between
inputs (``input_ids[batch, seq]`` and ``attention_mask[batch, seq]``) are bound once, so naming
one input's shape can settle the others.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from edgepilot.backends.base import TensorSpec
from edgepilot.errors import PlanError, UnrunnableModel

log = logging.getLogger(__name__)

Shapes = dict[str, tuple[int, ...]]
# a dim larger than this is a typo, not a tensor an edge board will hold
MAX_DIM = 1 << 24


def parse_shape_arg(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME=1x3x320x320`` -> ``("NAME", (1, 3, 320, 320))``; ``NAME=`` is a scalar."""
    name, sep, dims = text.partition("=")
    if not sep or not name:
        raise PlanError(f"--input-shape {text!r}: expected NAME=DIMS, e.g. x=1x3x320x320",
                        field="input_shape")
    if not dims.strip():
        return name, ()
    try:
        shape = tuple(int(d) for d in dims.lower().split("x"))
    except ValueError:
        raise PlanError(f"--input-shape {text!r}: dims must be positive integers joined by "
                        "'x', e.g. 1x3x320x320", field="input_shape") from None
    try:
        check_dims(name, shape, "input_shape")
    except PlanError as exc:
        raise PlanError(f"--input-shape {text!r}: {exc.message}", field="input_shape") from None
    return name, shape


def check_dims(name: str, shape: Sequence[int], field: str) -> None:
    bad = [(i, d) for i, d in enumerate(shape) if not 1 <= int(d) <= MAX_DIM]
    if bad:
        # axis and value both named: "dim 0" read as the first axis where it was a size of 0
        axis, value = bad[0]
        raise PlanError(f"input {name!r}: axis {axis} is {value}, out of range; allowed "
                        f"1..{MAX_DIM}", field=field)


def shapes_of(inputs: Mapping[str, np.ndarray]) -> Shapes:
    """The signature of a real request."""
    return {name: tuple(int(d) for d in np.shape(arr)) for name, arr in inputs.items()}


def signature_of(shapes: Mapping[str, Sequence[int]]) -> str:
    """A stable text form, e.g. ``input_ids=1x128;attention_mask=1x128`` (sorted by name)."""
    return ";".join(f"{n}={'x'.join(str(d) for d in shapes[n])}" for n in sorted(shapes))


def _label(dim: int | str | None) -> str:
    return f" ({dim!r})" if isinstance(dim, str) else ""


def resolve_shapes(model: str, specs: Sequence[TensorSpec],
                   given: Mapping[str, Sequence[int]],
                   hint: str = "--input-shape NAME=DxDx... or [[models]] input_shapes",
                   defaults: Mapping[str, Sequence[int]] | None = None) -> Shapes:
    """Concrete shapes of every input of ``specs``: ``given`` first, then fixed dims, then
    ``defaults`` (a TFLite file's allocated shapes: what its interpreter runs unresized).

    Raises PlanError naming the input, the dim and where to set it when a dim stays unknown,
    and naming both values when ``given`` contradicts a dim the model fixes. A dim name shared
    by inputs fills in those not given; given shapes that disagree on it are taken as given.
    """
    names = [s.name for s in specs]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise PlanError(f"model {model!r} has no input {unknown[0]!r}; its inputs: "
                        f"{', '.join(names)}", field="input_shape")
    bound: dict[str, int] = {}
    out: Shapes = {}
    for spec in specs:
        if spec.name not in given:
            continue
        shape = tuple(int(d) for d in given[spec.name])
        check_dims(spec.name, shape, "input_shape")
        if not spec.rank_known:  # the file says nothing of its dims: the shape given is it
            out[spec.name] = shape
            continue
        if len(shape) != len(spec.shape):
            raise PlanError(f"model {model!r} input {spec.name!r} has {len(spec.shape)} dims "
                            f"{_fmt(spec.shape)}; the shape given has {len(shape)}: "
                            f"{'x'.join(map(str, shape)) or 'scalar'}"
                            + (f" (a scalar is written {spec.name}= with no dims)"
                               if not spec.shape else ""), field="input_shape")
        for k, (want, got) in enumerate(zip(spec.shape, shape, strict=True)):
            if isinstance(want, int) and want > 0 and want != got:
                raise PlanError(f"model {model!r} input {spec.name!r} dim {k} is fixed at "
                                f"{want} in the model; the shape given says {got}",
                                field="input_shape")
            if shared_symbol(want) and bound.setdefault(str(want), got) != got:
                # exporters reuse a name for unrelated lengths (tf2onnx's "N" for a voice
                # model's phonemes and its notes) and onnxruntime does not hold them equal:
                # shapes given are taken as given; the name fills in only shapes not given
                log.warning("model %s: dim %r is %d in one input and %d in %r, as given; "
                            "onnxruntime decides whether the model takes that",
                            model, want, bound[str(want)], got, spec.name)
        out[spec.name] = shape
    # every input whose shape stays unknown is named in one error: a VAD's audio and its
    # state took three runs of `plan`, each naming the next one
    missing: list[str] = []
    for spec in specs:
        if spec.name in out:
            continue
        if not spec.rank_known:
            missing.append(f"input {spec.name!r} declares no shape, not even its number of "
                           f"dims (e.g. {spec.name}=1x3x224x224 for an image)")
            continue
        if defaults is not None and spec.name in defaults and not any(
                shared_symbol(d) and d in bound for d in spec.shape):
            allocated = tuple(int(d) for d in defaults[spec.name])
            placeholder = _placeholder_dim(spec.shape, allocated)
            if placeholder is not None:
                # an open length or side the file allocates at 1: a model timed on one sample
                # or a 1x1 image is planned for work no request brings
                missing.append(f"input {spec.name!r} dim {placeholder} is dynamic "
                               f"{_fmt(spec.shape)} and the file allocates 1 there, a "
                               f"placeholder (e.g. {spec.name}={_example(spec.shape)})")
                continue
            out[spec.name] = allocated
            continue
        dims = [d if isinstance(d, int) and d > 0 else
                bound.get(str(d)) if shared_symbol(d) else None for d in spec.shape]
        open_dims = [k for k, d in enumerate(dims) if d is None]
        if open_dims:
            which = ", ".join(f"{k}{_label(spec.shape[k])}" for k in open_dims)
            missing.append(
                f"input {spec.name!r} dim{'s' if len(open_dims) > 1 else ''} {which} "
                f"{'are' if len(open_dims) > 1 else 'is'} dynamic {_fmt(spec.shape)} "
                f"(e.g. {spec.name}={_example(dims)})")
            continue
        out[spec.name] = tuple(int(d) for d in dims if d is not None)
    if missing:
        raise PlanError(f"model {model!r} " + "; ".join(missing) + "; give "
                        + ("its shape" if len(missing) == 1 else "their shapes")
                        + f" with {hint}", field="input_shape")
    return out


def _placeholder_dim(declared: Sequence[int | str | None], allocated: Sequence[int]
                     ) -> int | None:
    """The first dim past the batch that the file leaves open and allocates at 1 (None: the
    allocated shape is one a request may well bring: a batch of 1, a default side of 224)."""
    for k, (d, size) in enumerate(zip(declared, allocated, strict=False)):
        if k > 0 and not (isinstance(d, int) and d > 0) and size == 1:
            return k
    return None


def shared_symbol(dim: int | str | None) -> bool:
    """Whether a dim names a size shared by every tensor that uses the name (``batch``,
    ``seq``). Exporters write an *unnamed* dynamic dim as ``?``, an empty name, ``unk__N``
    (onnx shape inference's placeholders) or ``-1``: each of those is its own unknown, and
    two inputs both written ``?`` may well differ."""
    if not isinstance(dim, str):
        return False
    name = dim.strip()
    return bool(name) and name not in ("?", "-1") and not name.startswith("unk__")


def _fmt(shape: Sequence[int | str | None]) -> str:
    return "[" + ", ".join("?" if d is None or d == 0 else str(d) for d in shape) + "]"


def _example(shape: Sequence[int | str | None]) -> str:
    return "x".join(str(d) if isinstance(d, int) and d > 0 else "N" for d in shape) or "scalar"


def file_shapes(model: str, path: Path, specs: Sequence[TensorSpec]) -> Shapes:
    """The shapes a model is planned at when none were given: the file's own fixed dims (for
    TFLite, the shapes the file allocates where its signature says -1)."""
    defaults = None
    if path.suffix.lower() == ".tflite":  # flatbuffers only where TFLite is installed
        from edgepilot.dispatch.graph.tflite_layers import default_shapes

        defaults = default_shapes(path)
    try:
        return resolve_shapes(model, specs, {}, defaults=defaults)
    except PlanError:
        refuse_unregistered_ops(path)
        raise


def refuse_unregistered_ops(path: Path) -> None:
    """Raise UnrunnableModel, naming them, when an ONNX file uses operators onnxruntime has
    no schema for (a custom-op library's): asked before its shapes, which cannot help it."""
    if path.suffix.lower() != ".onnx":
        return
    from edgepilot.backends.onnxrt_ops import unregistered_ops
    from edgepilot.formats.onnx_outline import onnx_outline

    ops = unregistered_ops(onnx_outline(path))
    if ops:
        shown = ", ".join(ops[:6]) + (f" and {len(ops) - 6} more" if len(ops) > 6 else "")
        raise UnrunnableModel(f"{path.name}: no runtime here runs this model: onnxruntime "
                              f"registers no operator {shown} (a custom-op library's, such as "
                              "onnxruntime-extensions')", field="model")


def failure_hint(exc: UnrunnableModel, path: Path, specs: Sequence[TensorSpec], shapes: Shapes,
                 generated: Callable[[], str]) -> str:
    """What to add to a planning failure at shapes or values no one chose ("" for nothing):
    the placeholder shapes it ran at (:func:`open_dims_hint`) and, where the model ran,
    ``generated()`` (where real samples go); nothing after an operator the runtime lacks."""
    if operators_lacking(exc.message):
        return ""
    if any(phrase in exc.message for phrase in DAMAGED):
        # no shape changes a file cut short: a hint about shapes sent operators hunting
        return ("; the file (or its external data file beside it) is shorter than the model "
                "says: copy it again")
    return (open_dims_hint(path, specs, shapes) or given_dims_hint(path, specs, shapes)) + (
        generated() if exc.ran else "")


# what onnxruntime says of a model whose external data file is cut short or missing
DAMAGED = ("exceeds available data", "External data length", "external data file")


def operators_lacking(message: str) -> bool:
    """Whether a runtime's refusal names operators it lacks (a custom op the TFLite
    interpreter does not resolve, Select TensorFlow ops, an ONNX op with no schema here): no
    input shape or sample changes that, so no hint about them belongs after it."""
    from edgepilot.backends.tflite_executable import FLEX_OPS, UNRESOLVED

    return any(phrase in message for phrase in (UNRESOLVED, FLEX_OPS, "registers no operator",
                                                "is not a registered function/op"))


def given_dims_hint(path: Path, specs: Sequence[TensorSpec], shapes: Shapes) -> str:
    """What to add to an error of a model run at shapes given for its open dims: those
    shapes (a batch of 2 given for one input and 1 for another failed inside the model, in a
    Concat, and read as if no runtime could run the file); "" when no input has open dims."""
    defaults: Mapping[str, Sequence[int]] = {}
    if path.suffix.lower() == ".tflite":
        from edgepilot.dispatch.graph.tflite_layers import default_shapes

        defaults = default_shapes(path)
    given = [s for s in specs if s.name in shapes and tuple(shapes[s.name]) != tuple(
        defaults.get(s.name, ())) and (not s.rank_known or any(
            not (isinstance(d, int) and d > 0) for d in s.shape))]
    if not given:
        return ""
    shown = ", ".join(f"{s.name!r} {_fmt(s.shape) if s.rank_known else '(any)'} as "
                      f"{'x'.join(map(str, shapes[s.name])) or 'scalar'}" for s in given)
    return (f"; it ran at the shapes given for its open dims ({shown}): a size mismatch inside "
            "the model most often means those disagree with each other")


def open_dims_hint(path: Path, specs: Sequence[TensorSpec], shapes: Shapes) -> str:
    """What to add to an error of a TFLite model run at its file's placeholder shapes (the
    shapes it allocates where its signature says -1, taken when none were given): each such
    input, the shape it ran at, and how to give another ("" when there is none)."""
    if path.suffix.lower() != ".tflite":
        return ""  # an ONNX model's open dims are never guessed (resolve_shapes asks)
    from edgepilot.dispatch.graph.tflite_layers import default_shapes

    defaults = default_shapes(path)
    loose = [s for s in specs if s.name in shapes
             and any(not (isinstance(d, int) and d > 0) for d in s.shape)
             and tuple(shapes[s.name]) == tuple(defaults.get(s.name, ()))]
    if not loose:
        return ""
    shown = ", ".join(f"{s.name!r} {_fmt(s.shape)} as {'x'.join(map(str, shapes[s.name]))}"
                      for s in loose)
    first = loose[0]
    return (f"; it ran at the file's placeholder shapes for its open dims ({shown}): give the "
            f"shapes it is fed with --input-shape (e.g. {first.name}={_example(first.shape)}) "
            "or the model's [[models]] input_shapes")
