"""Small random-weight TFLite models written straight from the flatbuffer schema (no TensorFlow).

:func:`write_mlp_tflite` makes a stack of FULLY_CONNECTED(+RELU) blocks with a residual ADD and
a final LOGISTIC — enough operators for segment cutting and cross-runtime checks. With
``head="log_softmax"`` the last operator is LOG_SOFTMAX instead, which XNNPACK does not take:
the model for checking that a partly delegated graph is never reported as delegated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np

from edgepilot.models.tflite_graph import _schema, pack


def write_mlp_tflite(path: Path, *, width: int = 32, depth: int = 3, batch: int = 1,
                     seed: int = 0, head: Literal["logistic", "log_softmax"] = "logistic"
                     ) -> Path:
    """Write ``x[batch,width] -> (FC+RELU)×depth -> ADD(residual) -> head -> y``."""
    s = _schema()
    rng = np.random.default_rng(seed)
    model = s.ModelT()
    model.version = 3
    model.description = b"edgepilot random MLP"
    model.buffers = [s.BufferT()]
    sg = s.SubGraphT()
    sg.tensors, sg.operators = [], []
    sg.name = b"main"
    codes: dict[int, int] = {}

    def opcode(builtin: int) -> int:
        if builtin not in codes:
            codes[builtin] = len(codes)
        return codes[builtin]

    def tensor(name: str, shape: list[int], data: np.ndarray | None = None) -> int:
        t = s.TensorT()
        t.name = name.encode()
        t.shape = np.array(shape, dtype=np.int32)
        t.type = s.TensorType.FLOAT32
        if data is None:
            t.buffer = 0
        else:
            buf = s.BufferT()
            buf.data = np.frombuffer(data.astype(np.float32).tobytes(), dtype=np.uint8)
            model.buffers.append(buf)
            t.buffer = len(model.buffers) - 1
        sg.tensors.append(t)
        return len(sg.tensors) - 1

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
