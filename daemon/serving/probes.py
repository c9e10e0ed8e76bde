"""Tiny known computations that prove each backend target works on this board.

Every probe builds its own small model in a scratch dir (nothing is downloaded), compiles it on
the target through the same backend contract the daemon serves with, runs it and checks the
numbers against an independent reference: ONNX's own reference evaluator for ONNX targets, the
TFLite interpreter's fp32 output for other TFLite targets, a deterministic greedy token for GGUF.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgepilot.backends import BACKENDS, load_backend
from edgepilot.backends.base import Backend, BackendUnavailable, Segment, Target
from edgepilot.config import Config
from edgepilot.dispatch.measuring.tolerance import tensor_error
from edgepilot.errors import EdgepilotError

log = logging.getLogger(__name__)

# quantized targets may differ from fp32 by this much (relative L2) and still PASS
# (tf32: fp32 storage, 10-bit-mantissa GPU math: 3.9e-4 on the probe model on an H200)
QUANT_TOLERANCE = {"fp32": 1e-4, "tf32": 1e-2, "fp16": 1e-2, "int8": 0.1, "int4": 0.25}


@dataclass
class TargetResult:
    """``status`` is PASS, FAIL, or SKIP when the probe model cannot exercise the target (an
    int8-only target and a float probe file): the target is listed, untested, with the reason."""

    target: str
    ok: bool
    reason: str
    ms: float | None = None
    status: str = ""

    def __post_init__(self) -> None:
        if not self.status:
            self.status = "PASS" if self.ok else "FAIL"


@dataclass
class BackendResult:
    name: str
    available: bool
    version: str | None = None
    reason: str = ""
    targets: list[TargetResult] = field(default_factory=list)


def _onnx_probe(backend: Backend, targets: list[Target], work: Path) -> list[TargetResult]:
    import onnx
    from onnx.reference import ReferenceEvaluator

    from edgepilot.formats.onnx_gen import mlp_stack, sample_inputs

    path = work / "probe.onnx"
    model = mlp_stack(path, widths=(16, 64, 16))
    feeds = sample_inputs(model)[0]
    ref_out: Any = ReferenceEvaluator(model).run(None, feeds)
    ref = np.asarray(ref_out[0])
    seg = Segment(path, "onnx", tuple(i.name for i in model.graph.input),
                  tuple(o.name for o in model.graph.output), name="probe")
    out_name = onnx.load(str(path)).graph.output[0].name
    return [_check(backend, seg, t, feeds, out_name, ref) for t in targets]


def _tflite_probe(backend: Backend, targets: list[Target], work: Path) -> list[TargetResult]:
    """Float targets run a float MLP checked against the TFLite interpreter called directly;
    int8 targets run a fully int8 layer checked against its float math."""
    from edgepilot.formats.tflite_gen import write_int8_fc_tflite, write_mlp_tflite

    path = work / "probe.tflite"
    if not path.exists():
        write_mlp_tflite(path, width=16, depth=2)
    seg = _whole_tflite_segment(path)
    feeds = {seg.inputs[0]: np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)}
    ref = _tflite_reference(path, feeds)
    quant = write_int8_fc_tflite(work / "probe-int8.tflite", width=16)
    qseg = _whole_tflite_segment(quant.path)
    xq = quant.quantize_input(np.random.default_rng(0).uniform(-2, 2, (1, 16)))
    results = []
    for t in targets:
        if t.precision == "int8":
            res = _check(backend, qseg, t, {qseg.inputs[0]: xq}, qseg.outputs[0],
                         quant.reference(xq), decode=quant.dequantize_output)
        else:
            res = _check(backend, seg, t, feeds, seg.outputs[0], ref)
        results.append(res)
    return results


def _tflite_reference(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray | None:
    """The TFLite interpreter's own output, called directly (None when it is not installed)."""
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        return None
    from edgepilot.backends.tflite import first_xnnpack

    with first_xnnpack():
        interp = Interpreter(model_path=str(path))
        interp.allocate_tensors()
    for d in interp.get_input_details():
        interp.set_tensor(d["index"], feeds[d["name"]])
    interp.invoke()
    return np.array(interp.get_tensor(interp.get_output_details()[0]["index"]))


def _whole_tflite_segment(path: Path) -> Segment:
    from edgepilot.formats.tflite_graph import io_names

    inputs, outputs = io_names(path)
    return Segment(path, "tflite", tuple(inputs), tuple(outputs), name="probe")


def _check(backend: Backend, seg: Segment, target: Target, feeds: dict[str, np.ndarray],
           out_name: str, ref: np.ndarray | None,
           decode: Callable[[np.ndarray], np.ndarray] | None = None) -> TargetResult:
    try:
        support = backend.supports(seg, target)
        if not support:
            return TargetResult(str(target), False, f"probe model not runnable here: "
                                f"{support.reason}", status="SKIP")
        exe = backend.compile(seg, target)
        try:
            t0 = time.perf_counter()
            out = exe.run(feeds)[out_name]
            ms = (time.perf_counter() - t0) * 1000
            if decode is not None:  # quantized output -> the real values it stands for
                out = decode(out)
        finally:
            exe.close()
    except EdgepilotError as exc:
        return TargetResult(str(target), False, exc.message)
    except Exception as exc:  # a broken native runtime must show up here, not crash doctor
        return TargetResult(str(target), False, f"{type(exc).__name__}: {exc}")
    if not np.all(np.isfinite(out)):
        return TargetResult(str(target), False, "output has NaN/Inf", ms)
    if ref is None:
        return TargetResult(str(target), True, f"ran, output shape {list(out.shape)}", ms)
    err = tensor_error(out, ref, "rel_l2")
    tol = QUANT_TOLERANCE.get(target.precision, 0.25)
    ok = err <= tol
    verdict = "matches" if ok else "differs from"
    return TargetResult(str(target), ok, f"{verdict} reference: rel. L2 error {err:.2e} "
                        f"(limit {tol:g})", ms)


def _gguf_probe(backend: Backend, targets: list[Target], work: Path) -> list[TargetResult]:
    from edgepilot.formats.gguf_gen import write_gguf

    path = work / "probe.gguf"
    write_gguf(path)
    results = []
    for t in targets:
        seg = Segment(path, "gguf", ("tokens",), ("logits",), name="probe")
        try:
            exe = backend.compile(seg, t)
            try:
                tokens = np.array([1, 2, 3], dtype=np.int32)
                out = exe.run({"tokens": tokens})
                logits = next(iter(out.values()))
            finally:
                exe.close()
            ok = bool(np.all(np.isfinite(logits))) and logits.size > 0
            results.append(TargetResult(str(t), ok, f"decoded 3 tokens, logits {list(logits.shape)}"
                                        if ok else "logits not finite"))
        except Exception as exc:
            results.append(TargetResult(str(t), False, f"{type(exc).__name__}: {exc}"))
    return results


def run_selftests(config: Config, names: list[str] | None = None,
                  backend_of: Callable[[str], Backend] | None = None,
                  stopping: Callable[[], bool] | None = None) -> list[BackendResult]:
    """Probe every backend (or ``names``) and run the tiny model on each of its targets.

    ``backend_of`` gives the backend instance to probe (the daemon's own, one per runtime);
    by default each is built here with its config section (``edgepilot doctor``). Once
    ``stopping()`` says so no further backend is probed (the results so far are returned): a
    daemon stopped while probing would otherwise wait at exit for every probe left."""
    out: list[BackendResult] = []
    with tempfile.TemporaryDirectory(prefix="edgepilot-doctor-") as tmp:
        work = Path(tmp)
        order = [n for n in ("onnxruntime", "tflite", "armnn", "llamacpp") if n in BACKENDS]
        for name in names or order:
            if stopping is not None and stopping():
                break
            res = BackendResult(name, available=False)
            out.append(res)
            try:
                backend = (backend_of(name) if backend_of is not None
                           else load_backend(name, config.backends.options_of(name)))
                targets = backend.probe()
                res.available, res.version = True, backend.version()
            except BackendUnavailable as exc:
                res.reason = exc.message
                continue
            except Exception as exc:
                res.reason = f"{type(exc).__name__}: {exc}"
                continue
            try:
                if name == "onnxruntime":
                    res.targets = _onnx_probe(backend, targets, work)
                    # listed by the runtime, unable to load here: a FAIL an operator can act on
                    res.targets += [
                        TargetResult(f"onnxruntime/{provider}", ok=False, reason=why)
                        for provider, why in getattr(backend, "unloadable", {}).items()]
                elif name in ("tflite", "armnn"):
                    res.targets = _tflite_probe(backend, targets, work)
                elif name == "llamacpp":
                    res.targets = _gguf_probe(backend, targets, work)
            except Exception as exc:
                log.exception("self-test of %s failed", name)
                res.reason = f"self-test could not run: {type(exc).__name__}: {exc}"
    return out


def as_dicts(results: list[BackendResult]) -> list[dict[str, Any]]:
    return [asdict(r) for r in results]


def target_status(results: list[BackendResult]) -> dict[str, str]:
    """``{target: PASS | FAIL | SKIP}`` over every probed target."""
    return {t.target: t.status for r in results for t in r.targets}
