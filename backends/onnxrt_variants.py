"""ONNX graph surgery for the onnxruntime backend: cut a segment out, make precision variants.

* :func:`extract` cuts the subgraph between a segment's input and output tensor names;
* :func:`make_variant` turns an fp32 graph into ``int8`` (dynamic on CPU, QDQ for NPU-style
  providers), ``int4`` (weight-only ``MatMulNBits``) or ``fp16`` (io kept fp32);
* :class:`VariantCache` keeps every produced file in a directory keyed by the fp32 bytes, the
  precision recipe and the onnxruntime version, so a restart does not quantize again.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx

from edgepilot.errors import BackendError

log = logging.getLogger(__name__)


class _QuietQuantizer(logging.Filter):
    """onnxruntime's quantizers log advice to the root logger on every call; drop it."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        return not msg.startswith(("Please consider to run pre-processing",
                                   "Please check if the model is already quantized",
                                   "The original model opset version is",
                                   "Quantization parameters for tensor",
                                   "Ignore MatMul due to non constant B",
                                   "Inference failed or unsupported type to quantize"))


logging.getLogger().addFilter(_QuietQuantizer())
# the MatMulNBits quantizer logs every node at INFO through its own handler
logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)

# recipe name -> (precision, quantization style); the style is part of the cache key
RECIPES = {"fp32", "fp16", "int8-dynamic", "int8-qdq", "int4"}
INT4_BLOCK_SIZE = 32


def model_bytes(model: onnx.ModelProto) -> bytes:
    return bytes(model.SerializeToString(deterministic=True))


def identity_model() -> bytes:
    """The smallest model a provider can take (one float ``Identity``): whether the provider
    builds a session at all, before any real model is tried on it."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    return model_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                                         ir_version=8))


def extract(model: onnx.ModelProto, inputs: tuple[str, ...],
            outputs: tuple[str, ...]) -> onnx.ModelProto:
    """The subgraph computing ``outputs`` from ``inputs`` (initializers it needs included)."""
    from edgepilot.formats.onnx_graph import CutError, cut

    known = {vi.name for vi in model.graph.input} | {o for n in model.graph.node for o in n.output}
    missing = [t for t in (*inputs, *outputs) if t not in known]
    if missing:
        raise BackendError(f"segment names tensors not in the model: {', '.join(missing)}; "
                           "re-partition the model (the file changed?)", field="segment")
    try:
        return cut(model, inputs, outputs)
    except CutError as exc:
        raise BackendError(f"cannot cut segment {inputs}->{outputs}: {exc}",
                           field="segment") from None


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _calibration_reader(model: onnx.ModelProto, count: int = 8) -> object:
    from onnxruntime.quantization import CalibrationDataReader

    from edgepilot.formats.onnx_gen import sample_inputs

    class _Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it: Iterator[dict[str, np.ndarray]] = iter(
                sample_inputs(model, seed=1234, count=count))

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._it, None)

    return _Reader()


def make_variant(model: onnx.ModelProto, recipe: str, workdir: Path) -> onnx.ModelProto:
    """Produce the ``recipe`` variant of an fp32 model (see :data:`RECIPES`)."""
    if recipe == "fp32":
        return model
    # the quantizers edit their input in place; never let them touch a cached fp32 graph
    fp32, model = model, _copy(model)
    if recipe == "fp16":
        from onnxruntime.transformers.float16 import convert_float_to_float16

        out: onnx.ModelProto = convert_float_to_float16(model, keep_io_types=True)
        return out
    if recipe == "int4":
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        quant = MatMulNBitsQuantizer(model, bits=4, block_size=INT4_BLOCK_SIZE,
                                     is_symmetric=True)
        quant.process()
        result: onnx.ModelProto = quant.model.model
        # nothing packed (no constant-weight MatMul): the quantizer still adds its opset import,
        # and those few bytes made a target that is the fp32 model timed and planned as another
        return result if _has_op(result.graph, "MatMulNBits") else fp32
    src, dst = workdir / "src.onnx", workdir / "dst.onnx"
    onnx.save(model, str(src))
    _quantize(src, dst, recipe, model)
    return onnx.load(str(dst))


def _has_op(graph: onnx.GraphProto, op_type: str) -> bool:
    """Whether ``graph`` or any subgraph of it (Loop, If, Scan bodies) holds an ``op_type``."""
    return _op_counts(graph)[op_type] > 0


def _op_counts(graph: onnx.GraphProto, into: Counter[str] | None = None) -> Counter[str]:
    """How many nodes of each op type ``graph`` and its subgraphs hold."""
    counts: Counter[str] = Counter() if into is None else into
    for node in graph.node:
        counts[node.op_type] += 1
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                _op_counts(sub, counts)
    return counts


def variant_bytes(model: onnx.ModelProto, raw: bytes, recipe: str, workdir: Path) -> bytes:
    """:func:`make_variant`, serialized; ``raw`` is ``model`` serialized. The quantizers read
    and write files: they are given ``raw`` and their output is returned as written (the
    model is not copied, saved, loaded and serialized again: 0.1-0.2 s for a 23 MB encoder)."""
    if recipe not in ("int8-dynamic", "int8-qdq"):
        return model_bytes(make_variant(model, recipe, workdir))
    src, dst = workdir / "src.onnx", workdir / "dst.onnx"
    src.write_bytes(raw)
    _quantize(src, dst, recipe, model)
    data = dst.read_bytes()
    # nothing quantized (no op it quantizes outside If/Loop bodies, which it leaves alone: a
    # Silero VAD's LSTM): the fp32 bytes, so the variant is its twin and no plan says int8
    # for fp32 work; rewritten, its bytes differed and it was timed and served as int8
    same = _op_counts(onnx.load_from_string(data).graph) == _op_counts(model.graph)
    return raw if same else data


def _quantize(src: Path, dst: Path, recipe: str, model: onnx.ModelProto) -> None:
    """Quantize the file ``src`` (``model``) into ``dst`` with an int8 ``recipe``."""
    # numpy's RuntimeWarnings inside the quantizers (a constant tensor's zero range divided
    # by) reached the operator's terminal with a source line of onnxruntime's: nothing to act
    # on, since the variant's error is measured against the reference before any plan uses it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        _run_quantizer(src, dst, recipe, model)


def _run_quantizer(src: Path, dst: Path, recipe: str, model: onnx.ModelProto) -> None:
    if recipe == "int8-dynamic":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(src, dst, weight_type=QuantType.QInt8,
                         extra_options={"MatMulConstBOnly": True})
    elif recipe == "int8-qdq":
        from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

        quantize_static(src, dst, _calibration_reader(model),
                        quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
                        weight_type=QuantType.QInt8)
    else:
        raise BackendError(f"unknown precision recipe {recipe!r}; allowed: "
                           f"{', '.join(sorted(RECIPES))}", field="precision")


class VariantCache:
    """Precision variants on disk, keyed by fp32 bytes + recipe + onnxruntime version."""

    def __init__(self, directory: Path | None, runtime_version: str) -> None:
        self.directory = directory
        self.runtime_version = runtime_version
        self._lock = threading.Lock()

    def key(self, fp32: bytes, recipe: str) -> str:
        h = hashlib.sha256(fp32)
        h.update(f"|{recipe}|{self.runtime_version}|b{INT4_BLOCK_SIZE}".encode())
        return h.hexdigest()[:32]

    def get(self, model: onnx.ModelProto, recipe: str) -> bytes:
        """Serialized ``recipe`` variant of ``model``; built once, then read from disk."""
        raw = model_bytes(model)
        if recipe == "fp32":
            return raw
        key = self.key(raw, recipe)
        path = self.directory / f"{key}.{recipe}.onnx" if self.directory else None
        if path is not None and path.exists():
            return path.read_bytes()
        with tempfile.TemporaryDirectory(prefix="edgepilot-ort-") as tmp:
            try:
                data = variant_bytes(model, raw, recipe, Path(tmp))
            except BackendError:
                raise
            except Exception as exc:
                raise BackendError(f"onnxruntime could not make the {recipe} variant: "
                                   f"{type(exc).__name__}: {exc}", field="precision") from None
        if path is not None:
            with self._lock:
                path.parent.mkdir(parents=True, exist_ok=True)
                # write-then-rename so a crash never leaves a truncated model in the cache
                tmp_path = path.with_suffix(f".tmp{os.getpid()}")
                tmp_path.write_bytes(data)
                tmp_path.replace(path)
        return data
