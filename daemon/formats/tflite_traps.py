"""TFLite files shaped like the real exports that trap runtimes, written from the schema.

Each is the smallest file with one trait that a real export had and that took planning or the
process down: a string input (a vocabulary lookup), a custom op no runtime here resolves (an NPU
vendor's precompiled dispatch op), an int8 ``ADD`` whose output scale is 0 (LiteRT aborts
preparing it) and a float convolution with per-channel int8 weights (dynamic-range
quantization's output: Arm NN aborts reducing it to fp16).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgepilot.formats.tflite_gen import add_tensor, new_model
from edgepilot.formats.tflite_graph import pack, schema


def _one_op_model(path: Path, description: bytes, types: dict[str, tuple[int, list[int]]],
                  ins: list[str], outs: list[str], builtin: int, custom: bytes = b"",
                  options: Any = None, options_type: int = 0,
                  scales: dict[str, float] | None = None, open_batch: bool = False) -> Path:
    """A file of one operator: ``types`` maps each tensor name to (TensorType, shape);
    ``scales`` quantizes the tensors it names (that scale, zero point 0); ``open_batch``
    leaves every tensor's first dim open in its signature (-1), as a dynamic-batch export."""
    s, model, sg = new_model(description)
    index = {}
    for name, (ttype, shape) in types.items():
        index[name] = add_tensor(model, sg, name, shape, ttype,
                                 scales=[scales[name]] if scales and name in scales else None)
        if open_batch and shape:
            sg.tensors[index[name]].shapeSignature = np.array([-1, *shape[1:]], np.int32)
    code = s.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = builtin
    code.customCode = custom or None
    model.operatorCodes = [code]
    o = s.OperatorT()
    o.opcodeIndex = 0
    o.inputs = np.array([index[n] for n in ins], dtype=np.int32)
    o.outputs = np.array([index[n] for n in outs], dtype=np.int32)
    o.builtinOptionsType, o.builtinOptions = options_type, options
    sg.operators.append(o)
    sg.inputs, sg.outputs = [index[n] for n in ins], [index[n] for n in outs]
    model.subgraphs = [sg]
    path.write_bytes(pack(model))
    return path


def write_string_gather_tflite(path: Path, *, words: int = 10, picks: int = 3) -> Path:
    """``GATHER(input: string[words], indices: int32[picks]) -> output: string[picks]``: a
    string input, as a vocabulary lookup exported to TFLite has."""
    s = schema()
    opts = s.GatherOptionsT()
    opts.axis = 0
    return _one_op_model(
        path, b"edgepilot string gather",
        {"input": (s.TensorType.STRING, [words]), "indices": (s.TensorType.INT32, [picks]),
         "output": (s.TensorType.STRING, [picks])},
        ["input", "indices"], ["output"], s.BuiltinOperator.GATHER, options=opts,
        options_type=s.BuiltinOptions.GatherOptions)


def write_custom_op_tflite(path: Path, op: str = "DISPATCH_OP", width: int = 8,
                           open_batch: bool = False) -> Path:
    """``x[1,width] -> CUSTOM op -> y``: a file whose only operator is a custom op no runtime
    here resolves (an NPU vendor's precompiled dispatch op, say; ``Flex...``: a Select
    TensorFlow op). ``open_batch``: the batch dim is -1 in the signatures."""
    s = schema()
    return _one_op_model(
        path, b"edgepilot custom op", {"x": (s.TensorType.FLOAT32, [1, width]),
                                       "y": (s.TensorType.FLOAT32, [1, width])},
        ["x"], ["y"], s.BuiltinOperator.CUSTOM, custom=op.encode(), open_batch=open_batch)


def write_zero_scale_add_tflite(path: Path, width: int = 4) -> Path:
    """An int8 ``ADD`` whose output scale is 0: it parses, and the interpreter aborts the
    process preparing it (a failed check, SIGABRT), as a broken quantizer's output does."""
    s = schema()
    int8 = s.TensorType.INT8
    return _one_op_model(
        path, b"edgepilot zero-scale add", {"a": (int8, [1, width]), "b": (int8, [1, width]),
                                            "y": (int8, [1, width])},
        ["a", "b"], ["y"], s.BuiltinOperator.ADD, options=s.AddOptionsT(),
        options_type=s.BuiltinOptions.AddOptions, scales={"a": 0.1, "b": 0.1, "y": 0.0})


def write_hybrid_conv_tflite(path: Path, *, size: int = 4, cin: int = 2, cout: int = 4,
                             seed: int = 0) -> Path:
    """``CONV_2D`` 3x3 SAME on a float ``x[1,size,size,cin]`` with int8 weights quantized per
    output channel and a float bias: how TFLite's dynamic-range quantization stores a float
    model's convolutions (the kernel dequantizes the weights; inputs and outputs stay float)."""
    s, model, sg = new_model(b"edgepilot hybrid conv")
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((cout, 3, 3, cin)).astype(np.float32)
    scales = np.abs(w).reshape(cout, -1).max(axis=1) / 127
    wq = np.clip(np.round(w / scales[:, None, None, None]), -127, 127).astype(np.int8)

    x = add_tensor(model, sg, "x", [1, size, size, cin], s.TensorType.FLOAT32)
    wt = add_tensor(model, sg, "w", [cout, 3, 3, cin], s.TensorType.INT8, wq, scales, axis=0)
    bt = add_tensor(model, sg, "b", [cout], s.TensorType.FLOAT32, np.zeros(cout, np.float32))
    y = add_tensor(model, sg, "y", [1, size, size, cout], s.TensorType.FLOAT32)
    opts = s.Conv2DOptionsT()
    opts.padding, opts.strideH, opts.strideW = s.Padding.SAME, 1, 1
    op = s.OperatorT()
    op.opcodeIndex = 0
    op.inputs, op.outputs = np.array([x, wt, bt], np.int32), np.array([y], np.int32)
    op.builtinOptionsType, op.builtinOptions = s.BuiltinOptions.Conv2DOptions, opts
    sg.operators, sg.inputs, sg.outputs = [op], [x], [y]
    model.subgraphs = [sg]
    code = s.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = s.BuiltinOperator.CONV_2D
    code.version = 3  # per-channel (hybrid) weights
    model.operatorCodes = [code]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pack(model))
    return path


def write_computed_block_tflite(path: Path, size: int = 4) -> Path:
    """``SPACE_TO_BATCH_ND(x, block_shape, paddings)`` with the block shape and paddings fed
    as inputs, as a cut of a dilated convolution hands them over (computed from the input's
    SHAPE upstream): Arm NN's parser reads them as constants and segfaults."""
    s = schema()
    opts = s.SpaceToBatchNDOptionsT()
    return _one_op_model(
        path, b"edgepilot computed block shape",
        {"x": (s.TensorType.FLOAT32, [1, size, size, 1]), "block": (s.TensorType.INT32, [2]),
         "pads": (s.TensorType.INT32, [2, 2]),
         "y": (s.TensorType.FLOAT32, [4, size // 2, size // 2, 1])},
        ["x", "block", "pads"], ["y"], s.BuiltinOperator.SPACE_TO_BATCH_ND, options=opts,
        options_type=s.BuiltinOptions.SpaceToBatchNDOptions)
