"""An ONNX graph made concrete for one input-shape signature, so it can be cut anywhere.

Real exports often carry no ``value_info`` and have symbolic dims (``batch``, ``height``); a
segment cut out of such a graph has no shape or type for its boundary tensors, and a graph
whose dynamic dims were guessed as 1 fails inside the runtime. So before partitioning, for the
concrete input shapes of the plan:

1. the input dims are fixed and the graph is constant-folded by onnxruntime's basic optimizer
   with its fusions turned off (folding and eliminations only): shape arithmetic on fixed inputs
   (``Shape -> Gather -> Concat -> Reshape``) becomes constants instead of tensors that cross
   every cut;
2. ONNX shape inference (with data propagation) types every tensor it can;
3. tensors still without a concrete shape or type (custom-domain ops, data-dependent shapes)
   are measured: one run of the graph with those tensors exposed as outputs.

The result is written, with a ``value_info`` entry for every tensor, next to the plan cache
(keyed by the file's digest and the signature), and partial segments are cut from that copy.
The whole model is always the user's own file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from edgepilot.dispatch.graph.signature import Shapes, signature_of
from edgepilot.errors import PlanError, UnrunnableModel

log = logging.getLogger(__name__)

# protobuf cannot serialise a model past 2 GiB; larger graphs keep their weights external
_INLINE_LIMIT = 1_800_000_000
# onnxruntime's basic level also fuses; those rewrites change what the quantizers and the
# targets see (MatMul+Add -> Gemm escapes dynamic int8 and MatMulNBits, QDQ rewrites move
# quantization), so only folding and eliminations run. Unknown names are ignored by onnxruntime.
_NO_FUSIONS = ["MatMulAddFusion", "GemmTransposeFusion", "ConvAddFusion", "ConvMulFusion",
               "ConvBNFusion", "MatmulBNFusion", "DivMulFusion", "FuseReluClip", "PadFusion",
               "NotWhereFusion", "ReshapeFusion", "QDQPropagationTransformer",
               "EnsureUniqueDQForNodeUnit", "QDQS8ToU8Transformer", "WeightBiasQuantization",
               "DoubleQDQPairsRemover", "QDQFinalCleanupTransformer", "GeluFusionL1",
               "LayerNormFusionL1", "SimplifiedLayerNormFusion", "MatMulIntegerToFloatFusion",
               "DynamicQuantizeMatMulFusion", "QuickGeluFusion", "GeluFusion", "LayerNormFusion"]
# where the annotated copy keeps the sizes of measured tensors (their value_info dims stay
# symbolic: a data-dependent size such as a NonZero count is only that one sample's)
_MEASURED_KEY = "edgepilot.measured"


@dataclass(frozen=True)
class TensorInfo:
    """A tensor's numpy dtype and concrete shape for the signature."""

    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


@dataclass
class ConcreteGraph:
    """The annotated copy of a model for one signature and what was learned making it."""

    path: Path
    tensors: dict[str, TensorInfo]
    folded: bool
    measured: int          # tensors whose shape came from a run, not from inference
    # the annotated model when it was just made and not yet written to ``path``
    model: onnx.ModelProto | None = None
    # makes and writes it again once ``model`` was dropped unwritten
    rebuild: Callable[[], object] | None = None
    # values no tensor describes (a sequence, an absent optional): no segment can hand one on
    opaque: frozenset[str] = frozenset()

    def load(self) -> onnx.ModelProto:
        return self.model if self.model is not None else onnx.load(str(self.path))

    def write(self) -> None:
        """Write the annotated copy to ``path`` (partial segments are cut from that file)."""
        model, self.model = self.model, None
        if model is None:
            if not self.path.is_file() and self.rebuild is not None:
                self.rebuild()
            return
        tmp_out = self.path.with_suffix(f".tmp{os.getpid()}")
        if model.ByteSize() > _INLINE_LIMIT:
            onnx.save(model, str(tmp_out), save_as_external_data=True,
                      location=self.path.name + ".data")
        else:
            onnx.save(model, str(tmp_out))
        tmp_out.replace(self.path)


def _np_dtype(elem_type: int) -> str:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name


def _concrete(vi: onnx.ValueInfoProto) -> TensorInfo | None:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type") or not tt.elem_type or not tt.HasField("shape"):
        return None
    dims = []
    for d in tt.shape.dim:
        if not d.HasField("dim_value") or d.dim_value < 0:
            return None
        dims.append(int(d.dim_value))
    try:
        return TensorInfo(_np_dtype(tt.elem_type), tuple(dims))
    except (KeyError, TypeError):
        return None


def fix_inputs(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Set the graph inputs' dims to ``shapes`` (in place)."""
    for vi in model.graph.input:
        if vi.name not in shapes:
            continue
        shape = vi.type.tensor_type.shape
        del shape.dim[:]
        for d in shapes[vi.name]:
            shape.dim.add().dim_value = int(d)


def _fold(model: onnx.ModelProto, workdir: Path) -> onnx.ModelProto | None:
    """onnxruntime's basic-level optimisation of ``model`` (None when it cannot run it)."""
    import onnxruntime as ort

    if model.ByteSize() > _INLINE_LIMIT:
        return None
    out = workdir / "folded.onnx"
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.optimized_model_filepath = str(out)
    opts.log_severity_level = 4  # its errors reach us as exceptions, not on stderr too
    try:
        ort.InferenceSession(model.SerializeToString(), sess_options=opts,
                             providers=["CPUExecutionProvider"], disabled_optimizers=_NO_FUSIONS)
        folded = onnx.load(str(out))
    except Exception as exc:  # any refusal: cut the graph as it is
        log.info("constant folding skipped: %s", exc)
        return None
    # the optimizer keeps the opsets it was given; keep the model's own metadata too
    folded.ir_version = model.ir_version
    # before IR 4 an initializer is listed as a graph input too; one folded away (a weight
    # made by ConstantOfShape from it) must not stay behind as an input a run then requires
    real = {i.name for i in model.graph.input} - {i.name for i in model.graph.initializer}
    kept = {i.name for i in folded.graph.initializer} | real
    inputs = [vi for vi in folded.graph.input if vi.name in kept]
    if len(inputs) != len(folded.graph.input):
        del folded.graph.input[:]
        folded.graph.input.extend(inputs)
    return folded


def _infer(model: onnx.ModelProto) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception as exc:  # custom ops and opset gaps: measured below instead
        log.info("ONNX shape inference failed (%s); measuring tensor shapes", exc)
        return model


def _collect(model: onnx.ModelProto) -> dict[str, TensorInfo]:
    g = model.graph
    found: dict[str, TensorInfo] = {}
    for vi in [*g.input, *g.value_info, *g.output]:
        info = _concrete(vi)
        if info is not None:
            found[vi.name] = info
    for init in g.initializer:
        found[init.name] = TensorInfo(_np_dtype(init.data_type), tuple(int(d) for d in init.dims))
    for prop in model.metadata_props:
        if prop.key == _MEASURED_KEY:
            for name, (dtype, shape) in json.loads(prop.value).items():
                found[name] = TensorInfo(dtype, tuple(shape))
    return found


# the tensors a probe run exposes first; then as many as PROBE_SHARE of the memory available
# holds at the bytes per tensor seen so far. Every exposed tensor stays alive to the run's end:
# Kokoro TTS's thousands of intermediate tensors in one run took 13 GB.
FIRST_PROBE = 512
PROBE_SHARE = 0.25


def _measure(model: onnx.ModelProto, names: list[str],
             feed: Mapping[str, np.ndarray]) -> tuple[dict[str, TensorInfo], set[str]]:
    """Run ``model`` with ``names`` exposed as outputs, as few runs as memory allows (see
    :data:`FIRST_PROBE`): the dtypes and shapes of those that are tensors, and the names of
    those that are not (a sequence's list of tensors, an absent optional), which have
    neither."""
    import psutil

    found: dict[str, TensorInfo] = {}
    opaque: set[str] = set()
    todo, size, seen_bytes = list(names), FIRST_PROBE, 0
    while todo:
        part, todo = todo[:size], todo[size:]
        got, nbytes = _probe(model, part, feed)
        found.update({n: i for n, i in got.items() if i is not None})
        opaque.update(n for n, i in got.items() if i is None)
        seen_bytes += nbytes
        per = max(1.0, seen_bytes / max(1, len(found) + len(opaque)))
        # at most twice the last part: the first tensors are a model's smallest (a TTS
        # model's audio-length ones come late), so their mean is no bound for the rest
        size = max(FIRST_PROBE, min(2 * size, int(
            PROBE_SHARE * psutil.virtual_memory().available / per)))
        if todo:
            log.info("shape probe: %d tensors left, %d a run (%.0f KB each so far)",
                     len(todo), size, per / 1024)
    return found, opaque


def _probe(model: onnx.ModelProto, names: list[str], feed: Mapping[str, np.ndarray]
           ) -> tuple[dict[str, TensorInfo | None], int]:
    """One probe run: each of ``names`` as a :class:`TensorInfo` (None: no tensor), and the
    bytes they took."""
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    present = {o.name for o in probe.graph.output}
    for name in names:
        if name not in present:
            probe.graph.output.append(onnx.ValueInfoProto(name=name))
    opts = ort.SessionOptions()
    # optimisations may fuse away the very tensors asked for
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 4  # its errors reach us as exceptions, not on stderr too
    try:
        sess = ort.InferenceSession(probe.SerializeToString(), sess_options=opts,
                                    providers=["CPUExecutionProvider"])
        wanted = [o.name for o in sess.get_outputs() if o.name in set(names)]
        values = sess.run(wanted, dict(feed))
    except Exception as exc:
        # the model ran and failed on its inputs: on generated ones, the planner adds which
        # and where real samples go (a count or an index only its caller knows)
        failed = UnrunnableModel(f"cannot determine the shapes of {len(names)} tensors "
                                 f"(e.g. {names[0]!r}) by running the model: {exc}",
                                 field="model")
        failed.ran = True
        raise failed from None
    out: dict[str, TensorInfo | None] = {
        n: TensorInfo(v.dtype.name, tuple(v.shape)) if isinstance(v, np.ndarray) else None
        for n, v in zip(wanted, values, strict=True)}
    return out, sum(v.nbytes for v in values if isinstance(v, np.ndarray))


def _opaque(model: onnx.ModelProto, tensors: Mapping[str, TensorInfo]) -> frozenset[str]:
    return frozenset(t for n in model.graph.node for t in n.output if t and t not in tensors)


def _annotate(model: onnx.ModelProto, tensors: Mapping[str, TensorInfo],
              measured: Collection[str] = ()) -> None:
    g = model.graph
    io = {vi.name for vi in g.input} | {vi.name for vi in g.output}
    inits = {i.name for i in g.initializer}
    measured = set(measured)

    def value_info(t: str, info: TensorInfo) -> onnx.ValueInfoProto:
        # a measured size holds for the sample run only: a segment reading the tensor must
        # take other sizes, so its dims stay symbolic (the size is kept in the metadata)
        dims: Sequence[int | str] = (
            [f"{t}:{k}" for k in range(len(info.shape))] if t in measured else info.shape)
        return helper.make_tensor_value_info(
            t, helper.np_dtype_to_tensor_dtype(np.dtype(info.dtype)), dims)

    del g.value_info[:]
    for node in g.node:
        for t in node.output:
            info = tensors.get(t)
            if t and t not in io and t not in inits and info is not None:
                g.value_info.append(value_info(t, info))
    for vi in g.output:
        info = tensors.get(vi.name)
        if info is not None:
            vi.CopyFrom(value_info(vi.name, info))
    kept = [p for p in model.metadata_props if p.key != _MEASURED_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    if measured:
        model.metadata_props.add(key=_MEASURED_KEY, value=json.dumps(
            {t: [tensors[t].dtype, list(tensors[t].shape)] for t in measured}))


def concrete_graph(path: Path, model_sha256: str, shapes: Shapes, cache_dir: Path,
                   feed: Mapping[str, np.ndarray] | None = None,
                   write: bool = True) -> ConcreteGraph:
    """The model at ``path`` annotated for ``shapes`` (built once per file and signature).

    ``feed`` is one realistic input of those shapes, run only when inference leaves tensors
    unknown (data-dependent shapes depend on values: ids must be valid ids). ``write=False``
    keeps a new copy in memory until :meth:`ConcreteGraph.write` (a plan that runs the
    whole file never needs it on disk).
    """
    sig = signature_of(shapes)
    # "|2": measured tensors keep symbolic dims (entries made before hold them fixed)
    key = hashlib.sha256(f"{model_sha256}|{sig}|onnx{onnx.__version__}|2".encode()).hexdigest()
    out = cache_dir / f"{path.stem[:40]}-{key[:20]}.onnx"
    if out.is_file():
        try:
            model = onnx.load(str(out))
            tensors = _collect(model)
            return ConcreteGraph(out, tensors, folded=True, measured=0,
                                 opaque=_opaque(model, tensors))
        except Exception:  # a damaged cache entry is rebuilt
            log.warning("rebuilding damaged shape cache %s", out)
    try:
        model = onnx.load(str(path))
    except Exception as exc:
        raise PlanError(f"{path.name} is not a readable ONNX model: {exc}",
                        field="model") from None
    fix_inputs(model, shapes)
    cache_dir.mkdir(parents=True, exist_ok=True)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="edgepilot-fold-") as tmp:
        folded = _fold(model, Path(tmp))
    if folded is not None:
        model = folded
    inferred = _infer(model)
    tensors = _collect(inferred)
    g = model.graph
    missing = [t for n in g.node for t in n.output if t and t not in tensors]
    measured = 0
    if missing:
        if feed is None:
            raise PlanError(f"{len(missing)} tensors of {path.name} have no inferable shape "
                            f"(e.g. {missing[0]!r}) and no sample input was given",
                            field="model")
        found, opaque = _measure(model, missing, feed)
        tensors.update(found)
        measured = len(found)
        missing = list(found)
    else:
        opaque = set()
    still = [t for n in g.node for t in n.output if t and t not in tensors and t not in opaque]
    if still:
        raise PlanError(f"{path.name}: tensors {still[:3]} were neither inferred nor produced "
                        "by a run; cannot cut this graph", field="model")
    _annotate(model, tensors, missing)
    log.info("%s: shapes for %s (%s folded, %d tensors measured)", path.name, sig,
             "constant" if folded is not None else "not", measured)
    graph = ConcreteGraph(out, tensors, folded=folded is not None, measured=measured,
                          model=model, opaque=frozenset(opaque))
    if write:
        graph.write()
    return graph
