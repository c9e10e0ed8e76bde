"""Small random-weight TFLite models written straight from the flatbuffer schema (no TensorFlow).

:func:`write_mlp_tflite` makes a stack of FULLY_CONNECTED(+RELU) blocks with a residual ADD and
a final LOGISTIC — enough operators for segment cutting and cross-runtime checks. With
``head="log_softmax"`` the last operator is LOG_SOFTMAX instead, which XNNPACK does not take:
the model for checking that a partly delegated graph is never reported as delegated.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from edgepilot.formats.tflite_graph import load, pack, schema


def new_model(description: bytes) -> tuple[Any, Any, Any]:
    """The schema module, an empty model (its one empty buffer) and its empty main subgraph."""
    s = schema()
    model = s.ModelT()
    model.version = 3
    model.description = description
    model.buffers = [s.BufferT()]
    sg = s.SubGraphT()
    sg.name = b"main"
    sg.tensors, sg.operators = [], []
    return s, model, sg


def add_tensor(model: Any, sg: Any, name: str, shape: list[int], ttype: int,
               data: np.ndarray | None = None, scales: Any = None, zeros: Any = None,
               axis: int = 0, variable: bool = False) -> int:
    """Append a tensor to ``sg``; its index. ``data``: a constant, in a buffer of its own (its
    bytes as they are); ``scales``: quantized, one scale per tensor or one per channel along
    ``axis``, with zero points ``zeros`` (default 0); ``variable``: state kept between
    invokes."""
    s = schema()
    t = s.TensorT()
    t.name, t.shape, t.type = name.encode(), np.array(shape, np.int32), ttype
    t.isVariable, t.buffer = variable, 0
    if scales is not None:
        q = s.QuantizationParametersT()
        q.scale = np.asarray(scales, dtype=np.float32).reshape(-1)
        q.zeroPoint = np.zeros(q.scale.size, np.int64) if zeros is None \
            else np.asarray(zeros, dtype=np.int64).reshape(-1)
        q.quantizedDimension = axis
        t.quantization = q
    if data is not None:
        buf = s.BufferT()
        buf.data = np.frombuffer(data.tobytes(), dtype=np.uint8)
        model.buffers.append(buf)
        t.buffer = len(model.buffers) - 1
    sg.tensors.append(t)
    return len(sg.tensors) - 1


def _float_tensor(model: Any, sg: Any, name: str, shape: list[int],
                  data: np.ndarray | None = None, variable: bool = False) -> int:
    """Append a float32 tensor to ``sg`` (``data``: a constant; ``variable``: state)."""
    return add_tensor(model, sg, name, shape, schema().TensorType.FLOAT32,
                      None if data is None else data.astype(np.float32), variable=variable)


def write_mlp_tflite(path: Path, *, width: int = 32, depth: int = 3, batch: int = 1,
                     seed: int = 0, head: Literal["logistic", "log_softmax"] = "logistic"
                     ) -> Path:
    """Write ``x[batch,width] -> (FC+RELU)×depth -> ADD(residual) -> head -> y``."""
    s, model, sg = new_model(b"edgepilot random MLP")
    rng = np.random.default_rng(seed)
    codes: dict[int, int] = {}

    def opcode(builtin: int) -> int:
        if builtin not in codes:
            codes[builtin] = len(codes)
        return codes[builtin]

    def tensor(name: str, shape: list[int], data: np.ndarray | None = None) -> int:
        return _float_tensor(model, sg, name, shape, data)

    def op(builtin: int, ins: list[int], outs: list[int], options: Any = None,
           options_type: int = 0) -> None:
        o = s.OperatorT()
        o.opcodeIndex = opcode(builtin)
        o.inputs = np.array(ins, dtype=np.int32)
        o.outputs = np.array(outs, dtype=np.int32)
        o.builtinOptionsType = options_type
        o.builtinOptions = options
        sg.operators.append(o)

    x = tensor("input", [batch, width])
    sg.inputs = [x]
    h = x
    first = None
    for i in range(depth):
        w = rng.standard_normal((width, width)).astype(np.float32) / np.sqrt(width)
        b = rng.standard_normal(width).astype(np.float32) * 0.1
        opts = s.FullyConnectedOptionsT()
        opts.fusedActivationFunction = s.ActivationFunctionType.RELU
        out = tensor(f"fc{i}", [batch, width])
        op(s.BuiltinOperator.FULLY_CONNECTED,
           [h, tensor(f"fc{i}/w", [width, width], w), tensor(f"fc{i}/b", [width], b)], [out],
           opts, s.BuiltinOptions.FullyConnectedOptions)
        first = out if first is None else first
        h = out
    add_opts = s.AddOptionsT()
    added = tensor("residual", [batch, width])
    op(s.BuiltinOperator.ADD, [h, first if first is not None else x], [added], add_opts,
       s.BuiltinOptions.AddOptions)
    y = tensor("output", [batch, width])
    if head == "log_softmax":
        op(s.BuiltinOperator.LOG_SOFTMAX, [added], [y], s.LogSoftmaxOptionsT(),
           s.BuiltinOptions.LogSoftmaxOptions)
    else:
        op(s.BuiltinOperator.LOGISTIC, [added], [y])
    sg.outputs = [y]
    model.subgraphs = [sg]
    model.operatorCodes = [None] * len(codes)
    for builtin, idx in codes.items():
        code = s.OperatorCodeT()
        code.builtinCode = builtin
        code.deprecatedBuiltinCode = min(builtin, 127)
        code.version = 1
        model.operatorCodes[idx] = code
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pack(model))
    return path


@dataclass(frozen=True)
class QuantFc:
    """What :func:`write_int8_fc_tflite` wrote, for computing its float reference."""

    path: Path
    weights: np.ndarray  # [out, in], dequantized
    bias: np.ndarray     # [out], dequantized
    in_scale: float
    in_zero: int
    out_scale: float
    out_zero: int

    def quantize_input(self, x: np.ndarray) -> np.ndarray:
        q = np.round(x / self.in_scale) + self.in_zero
        return np.clip(q, -128, 127).astype(np.int8)

    def dequantize_output(self, y: np.ndarray) -> np.ndarray:
        return (y.astype(np.float32) - self.out_zero) * self.out_scale

    def reference(self, xq: np.ndarray) -> np.ndarray:
        """Float result of the quantized input through the dequantized weights."""
        x = (xq.astype(np.float32) - self.in_zero) * self.in_scale
        return np.asarray(x @ self.weights.T + self.bias, np.float32)


def write_int8_fc_tflite(path: Path, *, width: int = 16, batch: int = 1,
                         seed: int = 0) -> QuantFc:
    """Write one fully int8 FULLY_CONNECTED (int8 in/out, int8 weights, int32 bias), the way
    a post-training-quantized model stores it: the probe for int8 TFLite / Arm NN targets."""
    s = schema()
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((width, width)).astype(np.float32) / np.sqrt(width)
    b = rng.standard_normal(width).astype(np.float32) * 0.1
    in_scale, in_zero = 4.0 / 255, -1             # inputs in about [-2, 2]
    w_scale = float(np.abs(w).max()) / 127
    wq = np.clip(np.round(w / w_scale), -127, 127).astype(np.int8)
    bq = np.round(b / (in_scale * w_scale)).astype(np.int32)
    # output range from the float result of inputs in range, with headroom
    bound = float(np.abs(w).sum(axis=1).max() * 2.0 + np.abs(b).max())
    out_scale, out_zero = 2 * bound / 255, 0
    model = s.ModelT()
    model.version = 3
    model.description = b"edgepilot int8 probe"
    model.buffers = [s.BufferT()]
    sg = s.SubGraphT()
    sg.name = b"main"
    sg.tensors = []

    def tensor(name: str, shape: list[int], ttype: int, scale: float, zero: int,
               data: np.ndarray | None = None) -> int:
        return add_tensor(model, sg, name, shape, ttype, data, [scale], [zero])

    x = tensor("input", [batch, width], s.TensorType.INT8, in_scale, in_zero)
    wt = tensor("fc/w", [width, width], s.TensorType.INT8, w_scale, 0, wq)
    bt = tensor("fc/b", [width], s.TensorType.INT32, in_scale * w_scale, 0, bq)
    y = tensor("output", [batch, width], s.TensorType.INT8, out_scale, out_zero)
    op = s.OperatorT()
    op.opcodeIndex = 0
    op.inputs = np.array([x, wt, bt], dtype=np.int32)
    op.outputs = np.array([y], dtype=np.int32)
    op.builtinOptionsType = s.BuiltinOptions.FullyConnectedOptions
    op.builtinOptions = s.FullyConnectedOptionsT()
    sg.operators = [op]
    sg.inputs, sg.outputs = [x], [y]
    model.subgraphs = [sg]
    code = s.OperatorCodeT()
    code.builtinCode = s.BuiltinOperator.FULLY_CONNECTED
    code.deprecatedBuiltinCode = s.BuiltinOperator.FULLY_CONNECTED
    code.version = 4  # the first FULLY_CONNECTED version with int8 kernels
    model.operatorCodes = [code]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pack(model))
    return QuantFc(path, (wq.astype(np.float32) * w_scale), (bq.astype(np.float32)
                   * in_scale * w_scale), in_scale, in_zero, out_scale, out_zero)


def write_two_signature_tflite(path: Path, keys: tuple[str, str] = ("encode", "decode")) -> Path:
    """Write a file of two signatures, as a model exported with several entry points is:
    ``keys[0]`` on subgraph 0 (``write_mlp_tflite``, width 32, a logistic head) and ``keys[1]``
    on subgraph 1 (width 16, two layers, a log-softmax head); the signature defs are written in
    reverse order, so that the one the interpreter runs by default is not the first listed."""
    s = schema()
    first = load(write_mlp_tflite(path.with_suffix(".a.tflite"), width=32, seed=1))
    second = load(write_mlp_tflite(path.with_suffix(".b.tflite"), width=16, depth=2, seed=2,
                                   head="log_softmax"))
    model = copy.deepcopy(first)
    codes = len(model.operatorCodes)
    buffers = len(model.buffers)
    model.operatorCodes.extend(second.operatorCodes)
    model.buffers.extend(second.buffers)
    sub = copy.deepcopy(second.subgraphs[0])
    sub.name = keys[1].encode()
    for t in sub.tensors:
        t.buffer = t.buffer + buffers if t.buffer else 0  # buffer 0 is the shared empty one
    for o in sub.operators:
        o.opcodeIndex += codes
    model.subgraphs.append(sub)
    defs = []
    for index in (1, 0):
        graph = model.subgraphs[index]
        d = s.SignatureDefT()
        d.signatureKey, d.subgraphIndex = keys[index].encode(), index
        d.inputs, d.outputs = [], []
        for ids, maps in ((graph.inputs, d.inputs), (graph.outputs, d.outputs)):
            for i in ids:
                m = s.TensorMapT()
                m.name, m.tensorIndex = graph.tensors[int(i)].name, int(i)
                maps.append(m)
        defs.append(d)
    model.signatureDefs = defs
    for part in (".a.tflite", ".b.tflite"):
        path.with_suffix(part).unlink()
    path.write_bytes(pack(model))
    return path


def write_stateful_svdf_tflite(path: Path, *, width: int = 8, filters: int = 8, memory: int = 4,
                               rank: int = 2, seed: int = 0) -> Path:
    """Write ``x[1,width] -> FC+RELU -> SVDF -> FC -> y``: the SVDF keeps its activation
    history in a variable tensor (``isVariable``) between invokes, as a streaming keyword
    spotter or a stateful LSTM export does, so the same input gives another output each call."""
    s, model, sg = new_model(b"edgepilot stateful SVDF")
    rng = np.random.default_rng(seed)
    units = filters // rank

    def tensor(name: str, shape: list[int], data: np.ndarray | None = None,
               variable: bool = False) -> int:
        return _float_tensor(model, sg, name, shape, data, variable)

    def weights(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32) / np.sqrt(shape[-1])

    def op(code: int, ins: list[int], outs: list[int], options: Any, kind: int) -> None:
        o = s.OperatorT()
        o.opcodeIndex, o.builtinOptionsType, o.builtinOptions = code, kind, options
        o.inputs, o.outputs = np.array(ins, np.int32), np.array(outs, np.int32)
        sg.operators.append(o)

    x = tensor("input", [1, width])
    h = tensor("fc0", [1, width])
    fc = s.FullyConnectedOptionsT()
    fc.fusedActivationFunction = s.ActivationFunctionType.RELU
    op(0, [x, tensor("fc0/w", [width, width], weights(width, width)),
           tensor("fc0/b", [width], np.zeros(width))], [h], fc,
       s.BuiltinOptions.FullyConnectedOptions)
    state = tensor("svdf/state", [1, memory * filters], variable=True)
    z = tensor("svdf", [1, units])
    svdf = s.SVDFOptionsT()
    svdf.rank = rank
    op(1, [h, tensor("svdf/wf", [filters, width], weights(filters, width)),
           tensor("svdf/wt", [filters, memory], weights(filters, memory)),
           tensor("svdf/b", [units], np.zeros(units)), state], [z], svdf,
       s.BuiltinOptions.SVDFOptions)
    y = tensor("output", [1, units])
    op(0, [z, tensor("fc1/w", [units, units], weights(units, units)),
           tensor("fc1/b", [units], np.zeros(units))], [y], s.FullyConnectedOptionsT(),
       s.BuiltinOptions.FullyConnectedOptions)
    sg.inputs, sg.outputs = [x], [y]
    model.subgraphs = [sg]
    model.operatorCodes = []
    for builtin in (s.BuiltinOperator.FULLY_CONNECTED, s.BuiltinOperator.SVDF):
        code = s.OperatorCodeT()
        code.builtinCode = code.deprecatedBuiltinCode = builtin
        code.version = 1
        model.operatorCodes.append(code)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pack(model))
    return path
