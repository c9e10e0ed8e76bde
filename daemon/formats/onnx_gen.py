"""Deterministic ONNX model generators for tests, the demo and the benchmark.

Three families, built with :mod:`onnx.helper` only (nothing downloaded):

* :func:`mlp_stack` - a chain of ``MatMul + Add + Relu`` layers of chosen widths;
* :func:`transformer_stack` - pre-norm transformer blocks (single-head attention + FFN) whose FFN
  widths alternate between small and large, so that layers genuinely differ in arithmetic
  intensity (int8 pays off on the large MatMuls, not on the small ones);
* :func:`small_cnn` - Conv/Relu/MaxPool stages and a Gemm classifier.

Weights come from ``numpy.random.default_rng(seed)`` scaled by ``1/sqrt(fan_in)`` so activations
stay O(1) through deep stacks; the same arguments always give byte-identical files.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
# IR 9 is read by every onnxruntime >= 1.15 we may meet on a board
IR_VERSION = 9


class _Builder:
    """Collects nodes and initializers with unique, readable names."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def name(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}_{self._n}"

    def weight(self, prefix: str, shape: Sequence[int], fan_in: int,
               scale: float = 1.0) -> str:
        arr = (self.rng.standard_normal(shape) * (scale / np.sqrt(fan_in))).astype(np.float32)
        return self.const(prefix, arr)

    def const(self, prefix: str, arr: np.ndarray) -> str:
        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def node(self, op: str, inputs: Sequence[str], prefix: str, **attrs: Any) -> str:
        out = self.name(prefix)
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=out + "_node", **attrs))
        return out

    def linear(self, x: str, d_in: int, d_out: int, prefix: str) -> str:
        w = self.weight(prefix + "_w", (d_in, d_out), d_in)
        b = self.const(prefix + "_b", (self.rng.standard_normal(d_out) * 0.01).astype(np.float32))
        y = self.node("MatMul", [x, w], prefix + "_mm")
        return self.node("Add", [y, b], prefix + "_add")

    def model(self, name: str, inp: onnx.ValueInfoProto, out_name: str,
              out_shape: Sequence[int]) -> onnx.ModelProto:
        output = helper.make_tensor_value_info(out_name, TensorProto.FLOAT, list(out_shape))
        graph = helper.make_graph(self.nodes, name, [inp], [output], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="edgepilot.onnx_gen")
        model.ir_version = IR_VERSION
        model = onnx.shape_inference.infer_shapes(model)
        onnx.checker.check_model(model)
        return model


def _save(model: onnx.ModelProto, path: Path | None) -> onnx.ModelProto:
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(path))
    return model


def mlp_stack(path: Path | None = None, widths: Sequence[int] = (256, 1024, 1024, 1024, 256),
              batch: int = 8, seed: int = 0) -> onnx.ModelProto:
    """``len(widths) - 1`` dense layers ``widths[i] -> widths[i+1]``; Relu between them.

    Input ``x`` is ``[batch, widths[0]]``, output ``y`` is ``[batch, widths[-1]]``.
    """
    if len(widths) < 2 or min(widths) < 1 or batch < 1:
        raise ValueError("mlp_stack needs at least two positive widths and batch >= 1")
    b = _Builder(seed)
    x = "x"
    for i, (d_in, d_out) in enumerate(itertools.pairwise(widths)):
        x = b.linear(x, d_in, d_out, f"fc{i}")
        if i < len(widths) - 2:
            x = b.node("Relu", [x], f"relu{i}")
    y = b.node("Identity", [x], "y")
    inp = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, widths[0]])
    model = b.model("mlp_stack", inp, y, [batch, widths[-1]])
    return _save(_rename_output(model, y, "y"), path)


def label_classifier(path: Path | None = None, letters: int = 8, hidden: int = 32,
                     seed: int = 0) -> onnx.ModelProto:
    """Text in, text out, as a scikit-learn pipeline exports it: ``letters`` (strings,
    ``[1, letters]``) through an ``ai.onnx.ml`` LabelEncoder to ids, two dense layers, and the
    arg-max class named by a second LabelEncoder: ``label`` (strings, ``[1]``) and the class
    ``scores`` (float32, ``[1, 4]``)."""
    b = _Builder(seed)
    alphabet = [chr(ord("a") + i) for i in range(26)]
    ids = b.node("LabelEncoder", ["letters"], "encode", domain="ai.onnx.ml",
                 keys_strings=alphabet, values_int64s=list(range(26)), default_int64=26)
    x = b.node("Cast", [ids], "cast", to=TensorProto.FLOAT)
    x = b.node("Relu", [b.linear(x, letters, hidden, "fc0")], "relu0")
    scores = b.linear(x, hidden, 4, "fc1")
    best = b.node("ArgMax", [scores], "argmax", axis=1, keepdims=0)
    label = b.node("LabelEncoder", [best], "decode", domain="ai.onnx.ml",
                   keys_int64s=[0, 1, 2, 3], values_strings=["north", "east", "south", "west"],
                   default_string="none")
    b.nodes += [helper.make_node("Identity", [label], ["label"]),
                helper.make_node("Identity", [scores], ["scores"])]
    graph = helper.make_graph(
        b.nodes, "label_classifier",
        [helper.make_tensor_value_info("letters", TensorProto.STRING, [1, letters])],
        [helper.make_tensor_value_info("label", TensorProto.STRING, [1]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 4])], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid("ai.onnx.ml", 2)],
                              producer_name="edgepilot.onnx_gen")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return _save(model, path)


def transformer_stack(path: Path | None = None, n_blocks: int = 4, d_model: int = 256,
                      seq: int = 64, ffn_small: int = 128, ffn_large: int = 2048,
                      seed: int = 0) -> onnx.ModelProto:
    """Pre-norm transformer blocks on ``[seq, d_model]``; FFN width alternates small/large.

    Each block is ``x + Attn(LN(x))`` then ``x + FFN(LN(x))``; even blocks use ``ffn_small``,
    odd blocks ``ffn_large``. Only one tensor is live after each residual Add, which is where
    the partitioner cuts.
    """
    if n_blocks < 1 or d_model < 2 or seq < 1 or ffn_small < 1 or ffn_large < 1:
        raise ValueError("transformer_stack sizes must be positive")
    b = _Builder(seed)
    x = "x"
    inv_sqrt_d = b.const("scale", np.array(1.0 / np.sqrt(d_model), dtype=np.float32))
    for i in range(n_blocks):
        # attention sublayer
        h = _layernorm(b, x, d_model, f"b{i}_ln1")
        q = b.linear(h, d_model, d_model, f"b{i}_q")
        k = b.linear(h, d_model, d_model, f"b{i}_k")
        v = b.linear(h, d_model, d_model, f"b{i}_v")
        kt = b.node("Transpose", [k], f"b{i}_kt", perm=[1, 0])
        s = b.node("MatMul", [q, kt], f"b{i}_scores")
        s = b.node("Mul", [s, inv_sqrt_d], f"b{i}_scaled")
        p = b.node("Softmax", [s], f"b{i}_softmax", axis=-1)
        a = b.node("MatMul", [p, v], f"b{i}_attn")
        o = b.linear(a, d_model, d_model, f"b{i}_o")
        x = b.node("Add", [x, o], f"b{i}_res1")
        # feed-forward sublayer
        width = ffn_large if i % 2 else ffn_small
        h = _layernorm(b, x, d_model, f"b{i}_ln2")
        h = b.linear(h, d_model, width, f"b{i}_ff1")
        h = b.node("Relu", [h], f"b{i}_relu")
        h = b.linear(h, width, d_model, f"b{i}_ff2")
        x = b.node("Add", [x, h], f"b{i}_res2")
    inp = helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, d_model])
    model = b.model("transformer_stack", inp, x, [seq, d_model])
    return _save(_rename_output(model, x, "y"), path)


def small_cnn(path: Path | None = None, size: int = 64, channels: Sequence[int] = (16, 32, 64),
              classes: int = 10, seed: int = 0, head: Sequence[int] = (),
              batch: int = 1) -> onnx.ModelProto:
    """Conv3x3/Relu/MaxPool stages on ``[batch, 3, size, size]`` and a Gemm to ``classes``.

    ``head`` adds dense MatMul+Relu layers of those widths before the classifier: a model whose
    conv layers and dense layers favour different precisions (int8 pays on big MatMuls only).
    """
    if size < 2 ** len(channels) or not channels or classes < 1:
        raise ValueError("small_cnn: size must survive one 2x pool per stage")
    b = _Builder(seed)
    x, c_in, hw = "x", 3, size
    for i, c_out in enumerate(channels):
        w = b.weight(f"conv{i}_w", (c_out, c_in, 3, 3), c_in * 9, scale=1.4)
        bias = b.const(f"conv{i}_b", np.zeros(c_out, dtype=np.float32))
        x = b.node("Conv", [x, w, bias], f"conv{i}", pads=[1, 1, 1, 1], kernel_shape=[3, 3])
        x = b.node("Relu", [x], f"crelu{i}")
        x = b.node("MaxPool", [x], f"pool{i}", kernel_shape=[2, 2], strides=[2, 2])
        c_in, hw = c_out, hw // 2
    flat = c_in * hw * hw
    shape = b.const("flat_shape", np.array([batch, flat], dtype=np.int64))
    x = b.node("Reshape", [x, shape], "flatten")
    for i, width in enumerate(head):
        x = b.node("Relu", [b.linear(x, flat, width, f"head{i}")], f"hrelu{i}")
        flat = width
    w = b.weight("fc_w", (classes, flat), flat)
    bias = b.const("fc_b", np.zeros(classes, dtype=np.float32))
    y = b.node("Gemm", [x, w, bias], "fc", transB=1)
    inp = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, size, size])
    model = b.model("small_cnn", inp, y, [batch, classes])
    return _save(_rename_output(model, y, "y"), path)


def _layernorm(b: _Builder, x: str, d: int, prefix: str) -> str:
    scale = b.const(prefix + "_g", np.ones(d, dtype=np.float32))
    bias = b.const(prefix + "_b", np.zeros(d, dtype=np.float32))
    return b.node("LayerNormalization", [x, scale, bias], prefix, axis=-1, epsilon=1e-5)


def _rename_output(model: onnx.ModelProto, old: str, new: str) -> onnx.ModelProto:
    """Give the graph output a stable public name (``y``) whatever node produced it."""
    for node in model.graph.node:
        node.output[:] = [new if o == old else o for o in node.output]
        node.input[:] = [new if i == old else i for i in node.input]
    for out in model.graph.output:
        if out.name == old:
            out.name = new
    for vi in model.graph.value_info:
        if vi.name == old:
            vi.name = new
    return model


def sample_inputs(model: onnx.ModelProto | Path | str, seed: int = 0,
                  count: int = 1) -> list[dict[str, np.ndarray]]:
    """``count`` standard-normal input dicts matching the model's (static) float inputs.

    Symbolic dimensions are taken as 1. Used as calibration inputs by the profiler.
    """
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    rng = np.random.default_rng(seed)
    out: list[dict[str, np.ndarray]] = []
    for _ in range(count):
        feed: dict[str, np.ndarray] = {}
        for vi in model.graph.input:
            if vi.name in inits:
                continue
            tt = vi.type.tensor_type
            shape = [d.dim_value if d.HasField("dim_value") else 1 for d in tt.shape.dim]
            dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
            if np.issubdtype(dtype, np.floating):
                feed[vi.name] = rng.standard_normal(shape).astype(dtype)
            else:
                feed[vi.name] = rng.integers(0, 8, size=shape).astype(dtype)
        out.append(feed)
    return out
