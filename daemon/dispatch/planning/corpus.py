"""The per-board kernel corpus: synthetic single-operator models timed once per target.

The sweep covers the operators the partitioner meets in the models served here: MatMul over
(m, k, n), MatMul between two activations, Conv over batch/channels/spatial size, and the
elementwise, normalisation, softmax, transpose and pooling operators over tensor sizes. Each
kernel is written as an ONNX file, compiled by the target's backend exactly like a layer (so the
int8/int4 targets time their quantized variants) and timed with the profiler's method
(:func:`timing.median_ms`). A one-operator model of 16 floats gives the per-call cost, which
every kernel's time is taken net of.

Corpora are cached per target under ``<state_dir>/corpus/``, keyed by the board, the DVFS
profile, the target's runtime version and the sweep itself: any change measures again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgepilot.backends.base import Backend, Segment, Target
from edgepilot.dispatch.graph.partition import Partition
from edgepilot.dispatch.measuring.timing import MIN_TIMED_MS, median_ms
from edgepilot.dispatch.planning.cache import read_keyed, write_atomic
from edgepilot.dispatch.planning.kernels import (
    KernelModel,
    KernelPoint,
    OpFeatures,
    family_of,
    fit_model,
)
from edgepilot.errors import EdgepilotError
from edgepilot.formats.graph_node import Node

log = logging.getLogger(__name__)

FORMAT = 1
Progress = Callable[[int, int, str], None]
CALL = ("Call", (1, 16))


@dataclass(frozen=True)
class KernelSpec:
    """One synthetic kernel: an operator and its dimensions (see :func:`kernel_model`)."""

    op: str
    dims: tuple[int, ...]

    @property
    def name(self) -> str:
        return f"{self.op}_{'x'.join(map(str, self.dims))}"


def default_sweep() -> list[KernelSpec]:
    """The sweep timed on every target (about 90 kernels, ~5-20 s per target here)."""
    specs = [KernelSpec(*CALL)]
    grid = (64, 256, 1024, 2048)
    for m in (4, 64):
        specs += [KernelSpec("MatMul", (m, k, n)) for k in grid for n in grid]
    for m in (1, 16, 256):
        specs += [KernelSpec("MatMul", (m, k, n))
                  for k, n in ((256, 256), (1024, 1024), (256, 2048), (2048, 256))]
    specs += [KernelSpec("MatMulAct", d) for d in
              ((64, 256, 64), (64, 64, 256), (16, 64, 16), (256, 256, 256), (128, 128, 128))]
    specs += [KernelSpec("Conv", d) for d in  # (batch, c_in, c_out, hw), 3x3, pad 1
              ((1, 3, 16, 64), (1, 16, 32, 32), (1, 32, 64, 16), (4, 3, 16, 32), (4, 16, 32, 16),
               (1, 3, 16, 32), (1, 16, 32, 16), (1, 32, 64, 32), (1, 64, 64, 16), (4, 32, 64, 8),
               (1, 16, 16, 64), (2, 8, 16, 32))]
    sizes = ((4, 512), (64, 256), (64, 2048), (256, 4096))
    for op in ("Add", "AddBias", "Mul", "Relu", "Softmax", "LayerNormalization", "Transpose"):
        specs += [KernelSpec(op, s) for s in sizes]
    specs += [KernelSpec("MaxPool", d) for d in ((1, 16, 64), (1, 32, 32), (4, 16, 32),
                                                  (1, 64, 16))]
    return specs


def sweep_hash(specs: Sequence[KernelSpec]) -> str:
    return hashlib.sha256(repr([(s.op, s.dims) for s in specs]).encode()).hexdigest()[:16]


def kernel_model(spec: KernelSpec, seed: int = 0) -> onnx.ModelProto:
    """The one-operator ONNX model of ``spec`` (inputs named ``x`` / ``y``, output ``z``)."""
    rng = np.random.default_rng(seed)
    f32 = TensorProto.FLOAT
    inits: list[onnx.TensorProto] = []
    inputs: list[tuple[str, list[int]]] = []
    op, d = spec.op, spec.dims

    def weight(name: str, shape: Sequence[int], fan_in: int) -> str:
        arr = (rng.standard_normal(shape) / np.sqrt(max(fan_in, 1))).astype(np.float32)
        inits.append(numpy_helper.from_array(arr, name))
        return name

    attrs: dict[str, Any] = {}
    if op == "MatMul":
        m, k, n = d
        inputs, args, node_op = [("x", [m, k])], ["x", weight("w", (k, n), k)], "MatMul"
    elif op == "MatMulAct":
        m, k, n = d
        inputs, args, node_op = [("x", [m, k]), ("y", [k, n])], ["x", "y"], "MatMul"
    elif op == "Conv":
        b, ci, co, hw = d
        inputs = [("x", [b, ci, hw, hw])]
        args = ["x", weight("w", (co, ci, 3, 3), ci * 9), weight("b", (co,), 1)]
        node_op, attrs = "Conv", {"pads": [1, 1, 1, 1], "kernel_shape": [3, 3]}
    elif op == "MaxPool":
        b, c, hw = d
        inputs, args = [("x", [b, c, hw, hw])], ["x"]
        node_op, attrs = "MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2]}
    elif op == "Add":
        inputs, args, node_op = [("x", list(d)), ("y", list(d))], ["x", "y"], "Add"
    elif op == "AddBias":
        inputs, args, node_op = [("x", list(d))], ["x", weight("b", (d[-1],), 1)], "Add"
    elif op == "Mul":
        inits.append(numpy_helper.from_array(np.array(0.125, dtype=np.float32), "s"))
        inputs, args, node_op = [("x", list(d))], ["x", "s"], "Mul"
    elif op == "LayerNormalization":
        inputs, args = [("x", list(d))], ["x", weight("g", (d[-1],), 1), weight("b", (d[-1],), 1)]
        node_op, attrs = op, {"axis": -1, "epsilon": 1e-5}
    elif op in ("Relu", "Softmax", "Transpose", "Call"):
        inputs, args = [("x", list(d))], ["x"]
        node_op = "Relu" if op == "Call" else op
        attrs = {"axis": -1} if op == "Softmax" else {"perm": [1, 0]} if op == "Transpose" else {}
    else:
        raise ValueError(f"unknown kernel op {op!r}")
    node = helper.make_node(node_op, args, ["z"], name=f"{spec.name}_node", **attrs)
    graph = helper.make_graph([node], spec.name,
                              [helper.make_tensor_value_info(n, f32, s) for n, s in inputs],
                              [helper.make_tensor_value_info("z", f32, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="edgepilot.corpus")
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def node_features(node: Node, tensor_bytes: Mapping[str, int]) -> OpFeatures | None:
    """A partition node as corpus features (None for operators that cost nothing)."""
    fam = family_of(node.op, node.weight_bytes)
    if fam is None:
        return None
    return OpFeatures(fam, float(node.flops), float(node.weight_bytes),
                      float(sum(tensor_bytes.get(t, 0) for t in node.inputs)),
                      float(sum(tensor_bytes.get(t, 0) for t in node.outputs)))


def layer_ops(part: Partition, i: int) -> list[OpFeatures]:
    """Features of every priced operator of layer ``i``."""
    layer = part.layers[i]
    out = []
    for node in part.nodes[layer.start:layer.end]:
        f = node_features(node, part.tensor_bytes)
        if f is not None:
            out.append(f)
    return out


def _feed(model: onnx.ModelProto, rng: np.random.Generator) -> dict[str, np.ndarray]:
    feed = {}
    for vi in model.graph.input:
        shape = [dim.dim_value for dim in vi.type.tensor_type.shape.dim]
        feed[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return feed


def measure_corpus(pairs: Sequence[tuple[Backend, Target]], specs: Sequence[KernelSpec], *,
                   runs: int = 7, warmup: int = 2, passes: int = 3,
                   progress: Progress | None = None
                   ) -> dict[str, tuple[float, list[KernelPoint]]]:
    """Time every kernel of ``specs`` on every target: ``{target: (call_ms, points)}``.

    Each kernel is timed on all targets in a row and the sweep is run ``passes`` times over;
    each (kernel, target) keeps its lowest median. Load on a shared board comes in spells of
    seconds and only ever adds time: interleaving puts every target through the same spells,
    and the lowest of medians taken far apart leaves most spells out (like the profiler's
    layers). Kernels a target does not support are skipped (their family falls back to the
    Add fit, or to no prediction at all).
    """
    from edgepilot.dispatch.graph.onnx_layers import read_onnx

    rng = np.random.default_rng(0)
    best: dict[tuple[str, str], float] = {}
    skipped: set[tuple[str, str]] = set()
    feats: dict[str, OpFeatures | None] = {}
    total, done = len(specs) * max(1, passes) * len(pairs), 0
    with tempfile.TemporaryDirectory(prefix="edgepilot-corpus-") as tmp:
        for _ in range(max(1, passes)):
            for spec in specs:
                model = kernel_model(spec)
                path = Path(tmp) / f"{spec.name}.onnx"
                if not path.exists():
                    onnx.save(model, str(path))
                nodes, ins, outs, sizes = read_onnx(path)
                feats[spec.name] = None if spec.op == "Call" else node_features(nodes[0], sizes)
                seg = Segment(path, "onnx", tuple(ins), tuple(outs), None, spec.name)
                feed = _feed(model, rng)
                for backend, target in pairs:
                    done += 1
                    key = (str(target), spec.name)
                    if key in skipped:
                        continue
                    ms = _time_kernel(backend, target, seg, feed, runs, warmup)
                    if ms is None:
                        skipped.add(key)
                        continue
                    best[key] = min(ms, best.get(key, ms))
                    if progress:
                        progress(done, total, f"kernel {spec.name} on {target}")
    out: dict[str, tuple[float, list[KernelPoint]]] = {}
    for _, target in pairs:
        name = str(target)
        call = next((best[(name, s.name)] for s in specs
                     if s.op == "Call" and (name, s.name) in best), 0.0)
        points = [KernelPoint(k, f, max(best[(name, k)] - call, 0.0))
                  for k, f in feats.items() if f is not None and (name, k) in best]
        out[name] = (call, points)
    return out


def _time_kernel(backend: Backend, target: Target, seg: Segment, feed: dict[str, np.ndarray],
                 runs: int, warmup: int) -> float | None:
    try:
        if not backend.supports(seg, target):
            return None
        exe = backend.compile(seg, target)
    except EdgepilotError as exc:
        log.info("corpus kernel %s skipped on %s: %s", seg.name, target, exc.message)
        return None
    try:
        return median_ms(lambda: exe.run(feed), runs, warmup, MIN_TIMED_MS)
    finally:
        exe.close()


class CorpusStore:
    """Loads each target's corpus from the state dir, or measures and caches it."""

    def __init__(self, directory: Path, key_parts: Mapping[str, Any],
                 specs: Sequence[KernelSpec] | None = None, *, runs: int = 7,
                 warmup: int = 2, passes: int = 3) -> None:
        self.directory = Path(directory)
        self.key_parts = dict(key_parts)
        self.specs = list(specs) if specs is not None else default_sweep()
        self.runs = runs
        self.warmup = warmup
        self.passes = passes
        self.models: dict[str, KernelModel | None] = {}
        self.measured: list[str] = []      # targets measured (not loaded) by this store
        self.unmeasured: list[Target] = []  # asked for without measuring, not cached yet
        self.seconds = 0.0                 # time spent measuring

    def key(self, target: Target, runtime_version: str) -> str:
        """Cache key: board, profile (``key_parts``), target, its runtime, the sweep, method."""
        parts = {"format": FORMAT, **self.key_parts, "target": str(target),
                 "runtime": runtime_version, "sweep": sweep_hash(self.specs),
                 "runs": self.runs, "passes": self.passes}
        blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:24]

    def path(self, target: Target, key: str) -> Path:
        safe = str(target).replace("/", "_")
        return self.directory / f"{safe}-{key}.json"

    def for_targets(self, backends: Mapping[str, Backend], targets: Sequence[Target],
                    progress: Progress | None = None, measure: bool = True
                    ) -> dict[str, KernelModel]:
        """Kernel models of ``targets`` (loaded, else measured together and cached; with
        ``measure`` False those not in the state dir are left out and listed in
        :attr:`unmeasured`); targets that run no ONNX kernel (TFLite, Arm NN) are left out."""
        pending: list[tuple[Backend, Target, Path, str]] = []
        for target in targets:
            backend = backends.get(target.backend)
            if backend is None or str(target) in self.models:
                continue
            key = self.key(target, str(backend.version() or "?"))
            path = self.path(target, key)
            data = read_keyed(path, key, FORMAT, "kernel corpus")
            if data is None:
                pending.append((backend, target, path, key))
            else:
                self.models[str(target)] = _fit(data)
        self.unmeasured = [t for _, t, _, _ in pending]
        if pending and measure:
            t0 = time.perf_counter()
            results = measure_corpus([(b, t) for b, t, _, _ in pending], self.specs,
                                     runs=self.runs, warmup=self.warmup, passes=self.passes,
                                     progress=progress)
            self.seconds += time.perf_counter() - t0
            for _, target, path, key in pending:
                call, points = results[str(target)]
                data = {"format": FORMAT, "key": key, "target": str(target), "call_ms": call,
                        "points": [p.as_dict() for p in points]}
                write_atomic(path, data)
                self.measured.append(str(target))
                self.models[str(target)] = _fit(data)
            log.info("kernel corpus for %s: %d kernels in %.1f s",
                     ", ".join(str(t) for _, t, _, _ in pending), len(self.specs),
                     time.perf_counter() - t0)
        return {str(t): m for t in targets if (m := self.models.get(str(t))) is not None}


def _fit(data: Mapping[str, Any]) -> KernelModel | None:
    points = [KernelPoint.from_dict(p) for p in data["points"]]
    return fit_model(str(data["target"]), float(data["call_ms"]), points) if points else None


class CorpusStores:
    """One :class:`CorpusStore` per (board, DVFS profile): clocks change every kernel's time,
    so a profile switch plans from that profile's own corpus."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._stores: dict[str, CorpusStore] = {}
        self._lock = threading.Lock()
        self._measuring = threading.Lock()
        # (board, profile) key -> (its parts, targets asked for without measuring)
        self._wanted: dict[str, tuple[dict[str, Any], set[Target]]] = {}

    @staticmethod
    def _key(parts: Mapping[str, Any]) -> str:
        return json.dumps(parts, sort_keys=True, default=str)

    def store(self, parts: Mapping[str, Any]) -> CorpusStore:
        key = self._key(parts)
        with self._lock:
            found = self._stores.get(key)
            if found is None:
                found = self._stores[key] = CorpusStore(self.directory, parts)
            return found

    def fits(self, parts: Mapping[str, Any], backends: Mapping[str, Backend],
             targets: list[Target], progress: Callable[[int, int, str], None] | None,
             measure: bool = True) -> dict[str, KernelModel]:
        """Kernel-corpus fits of ``targets``: measured on first use, then cached. ``measure``
        False: only those cached; the others are remembered for :meth:`measure_wanted`."""
        store = self.store(parts)
        with self._measuring:  # two models planned at once measure the corpus once
            got = store.for_targets(backends, targets, progress, measure)
        if not measure and store.unmeasured:
            with self._lock:
                self._wanted.setdefault(self._key(parts), (dict(parts), set()))[1].update(
                    store.unmeasured)
        return got

    def measure_wanted(self, backends: Mapping[str, Backend],
                       progress: Callable[[int, int, str], None] | None) -> None:
        """Measure (and cache) the corpus of every target a plan found none for. An error
        (a stopping daemon's progress raising) leaves them wanted for the next time."""
        with self._lock:
            wanted, self._wanted = self._wanted, {}
        for key, (parts, targets) in wanted.items():
            todo = sorted(targets, key=str)
            log.info("measuring the kernel corpus of %s (once per board and DVFS profile)",
                     ", ".join(map(str, todo)))
            try:
                self.fits(parts, backends, todo, progress)
            except EdgepilotError as exc:
                log.info("kernel corpus not measured: %s", exc.message)
                with self._lock:
                    self._wanted.setdefault(key, (parts, set()))[1].update(todo)
                return
