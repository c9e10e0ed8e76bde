"""Graphs made concrete for one input-shape signature (fold, infer, measure, cache) and cutting
them: shape arithmetic folded away, ``If`` branches kept with the outer tensors they read."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgepilot.backends.base import Target
from edgepilot.backends.onnxrt import OnnxRuntimeBackend
from edgepilot.dispatch.graph.onnx_shapes import concrete_graph
from edgepilot.dispatch.graph.partition import Partition, partition
from edgepilot.errors import PlanError
from edgepilot.formats import files
from edgepilot.formats.onnx_graph import CutError, cut, implicit_inputs

FP32 = Target("onnxruntime", "cpu", "fp32")
SHAPE_OPS = {"Shape", "Gather", "Slice", "Concat"}


@pytest.fixture
def backend(tmp_path: Path) -> OnnxRuntimeBackend:
    return OnnxRuntimeBackend(cache_dir=tmp_path / "ort-cache")


def _w(rng: np.random.Generator, name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array((0.3 * rng.standard_normal(shape)).astype(np.float32), name)


def _i64(name: str, values: Sequence[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _save(path: Path, nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
          outputs: list[onnx.ValueInfoProto], inits: list[onnx.TensorProto],
          opsets: Sequence[tuple[str, int]] = (("", 17),)) -> Path:
    graph = helper.make_graph(nodes, path.stem, inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    assert not model.graph.value_info          # nothing typed but the graph's own inputs
    onnx.save(model, str(path))
    return path


def shape_arith_model(path: Path) -> Path:
    """x[batch, 8] -> MatMul+Add -> Relu -> Reshape to [batch, 4, 8] by Shape->Gather->Concat
    -> MatMul -> Tanh -> Reshape to [batch, 32] by Shape->Slice->Concat -> MatMul -> Relu
    -> MatMul -> y[batch, 4]."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"]),
        helper.make_node("Add", ["h1", "b1"], ["h1b"]),
        helper.make_node("Relu", ["h1b"], ["r1"]),
        helper.make_node("Shape", ["r1"], ["s1"]),
        helper.make_node("Gather", ["s1", "i0"], ["n1"], axis=0),
        helper.make_node("Concat", ["n1", "tail1"], ["shape1"], axis=0),
        helper.make_node("Reshape", ["r1", "shape1"], ["rr"]),
        helper.make_node("MatMul", ["rr", "w2"], ["m2"]),
        helper.make_node("Tanh", ["m2"], ["t2"]),
        helper.make_node("Shape", ["t2"], ["s2"]),
        helper.make_node("Slice", ["s2", "start", "stop"], ["n2"]),
        helper.make_node("Concat", ["n2", "tail2"], ["shape2"], axis=0),
        helper.make_node("Reshape", ["t2", "shape2"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w3"], ["h3"]),
        helper.make_node("Relu", ["h3"], ["r3"]),
        helper.make_node("MatMul", ["r3", "w4"], ["y"]),
    ]
    inits = [_w(rng, "w1", 8, 32), _w(rng, "b1", 32), _i64("i0", [0]), _i64("tail1", [4, 8]),
             _w(rng, "w2", 8, 8), _i64("start", [0]), _i64("stop", [1]), _i64("tail2", [32]),
             _w(rng, "w3", 32, 32), _w(rng, "w4", 32, 4)]
    return _save(path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                             ["batch", 8])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], inits)


def if_model(path: Path) -> Path:
    """x[batch, 4] -> MatMul -> Relu -> a[batch, 64] -> If(flag) -> MatMul -> y[batch, 4]: the
    branches read ``a`` (made by the node before), ``x`` (a graph input, read nowhere else) and
    ``one`` (an outer initializer) from the enclosing graph, none of them an input of the If."""
    rng = np.random.default_rng(1)
    then_g = helper.make_graph(
        [helper.make_node("Add", ["a", "one"], ["t0"]),
         helper.make_node("ReduceSum", ["x"], ["xs"], keepdims=1),
         helper.make_node("Add", ["t0", "xs"], ["t_out"])], "then", [],
        [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, None)])
    else_g = helper.make_graph(
        [helper.make_node("Constant", [], ["two"],
                          value=numpy_helper.from_array(np.array(2.0, np.float32))),
         helper.make_node("Mul", ["a", "two"], ["e_out"])], "else", [],
        [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, None)])
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["a"]),
        helper.make_node("If", ["flag"], ["br"], then_branch=then_g, else_branch=else_g),
        helper.make_node("MatMul", ["br", "w2"], ["y"]),
    ]
    inits = [_w(rng, "w1", 4, 64), _w(rng, "w2", 64, 4),
             numpy_helper.from_array(np.array(1.0, np.float32), "one")]
    return _save(path, nodes,
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
                  helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], inits)


def unknown_shape_model(path: Path, op: str) -> Path:
    """A tensor ONNX shape inference cannot size: NonZero (data-dependent) or a com.microsoft
    op (a domain ONNX does not know)."""
    rng = np.random.default_rng(2)
    if op == "NonZero":
        odd = [helper.make_node("NonZero", ["r"], ["u"]),
               helper.make_node("Cast", ["u"], ["uf"], to=TensorProto.FLOAT),
               helper.make_node("ReduceSum", ["uf"], ["z"], keepdims=0)]
        z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [])
        opsets: tuple[tuple[str, int], ...] = (("", 17),)
    else:
        odd = [helper.make_node("Gelu", ["r"], ["u"], domain="com.microsoft"),
               helper.make_node("Neg", ["u"], ["uf"]),
               helper.make_node("ReduceSum", ["uf"], ["z"], keepdims=0)]
        z = helper.make_tensor_value_info("z", TensorProto.FLOAT, None)
        opsets = (("", 17), ("com.microsoft", 1))
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]), *odd,
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    return _save(path, nodes,
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3]), z],
                 [_w(rng, "w1", 6, 6), _w(rng, "w2", 6, 3)], opsets)


def _init(path: Path, name: str) -> onnx.TensorProto:
    return next(i for i in onnx.load(str(path)).graph.initializer if i.name == name)


def chain(part: Partition, backend: OnnxRuntimeBackend, feed: dict[str, np.ndarray]
          ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(every layer on its own, fed by the ones before; the whole model)."""
    env = dict(feed)
    for i in range(len(part.layers)):
        seg = part.segment(i, i + 1)
        assert not seg.is_whole and seg.model_path == part.graph_path
        env.update(backend.compile(seg, FP32).run(env))
    whole = backend.compile(part.segment(0, len(part.layers)), FP32).run(feed)
    return env, whole


# ---- shape arithmetic -----------------------------------------------------------------------
@pytest.mark.parametrize("batch", [1, 3])
def test_shape_arithmetic_is_folded_and_segments_chain(tmp_path: Path, batch: int,
                                                       backend: OnnxRuntimeBackend) -> None:
    path = shape_arith_model(tmp_path / "arith.onnx")
    part = partition(path, shapes={"x": (batch, 8)}, cache_dir=tmp_path / "graphs")
    assert len(part.layers) > 1
    assert part.shapes == {"x": (batch, 8)}
    assert part.graph_path is not None and part.graph_path.parent == tmp_path / "graphs"
    concrete = onnx.load(str(part.graph_path))
    ops = [n.op_type for n in concrete.graph.node]
    # the shape arithmetic became constants; nothing else was rewritten (no Gemm fusion)
    original = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert "Shape" not in ops
    assert ops == [op for op in original if op not in SHAPE_OPS]
    # every tensor is typed for this signature
    typed = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
             for vi in concrete.graph.value_info}
    assert typed["rr"] == [batch, 4, 8] and typed["flat"] == [batch, 32]
    assert all(n.op not in SHAPE_OPS for n in part.nodes)
    feed = {"x": np.random.default_rng(5).standard_normal((batch, 8)).astype(np.float32)}
    env, whole = chain(part, backend, feed)
    assert whole["y"].shape == (batch, 4)
    np.testing.assert_allclose(env["y"], whole["y"], rtol=1e-5, atol=1e-6)


# ---- If with outer-scope inputs -------------------------------------------------------------
def test_if_branches_keep_their_outer_inputs(tmp_path: Path,
                                            backend: OnnxRuntimeBackend) -> None:
    path = if_model(tmp_path / "if.onnx")
    x = np.random.default_rng(6).standard_normal((2, 4)).astype(np.float32)
    part = partition(path, shapes={"x": (2, 4), "flag": ()}, cache_dir=tmp_path / "graphs",
                     feed={"x": x, "flag": np.array(True)}, min_layer_flops=1)
    assert len(part.layers) > 1
    (lay,) = [lay for lay in part.layers if "If" in lay.op_types]
    # the tensors the branches read cross into the If's layer as its inputs
    assert lay.start > 0 and {"a", "x", "flag"} <= set(lay.inputs)
    ys = []
    for flag in (True, False):
        feed = {"x": x, "flag": np.array(flag)}
        env, whole = chain(part, backend, feed)
        np.testing.assert_allclose(env["y"], whole["y"], rtol=1e-5, atol=1e-6)
        ys.append(whole["y"])
    assert not np.allclose(ys[0], ys[1])     # both branches were taken


def test_cut_takes_outer_scope_inputs_and_refuses_missing_graph_inputs(tmp_path: Path) -> None:
    path = if_model(tmp_path / "if.onnx")
    model = onnx.load(str(path))
    if_node = next(n for n in model.graph.node if n.op_type == "If")
    assert set(implicit_inputs(if_node)) == {"a", "one", "x"}
    graph = concrete_graph(path, files.sha256_of(path), {"x": (2, 4), "flag": ()},
                           tmp_path / "graphs", feed={"x": np.zeros((2, 4), np.float32),
                                                      "flag": np.array(True)})
    concrete = graph.load()
    # x is read only inside the branches: leaving it out of the boundary is an error
    with pytest.raises(CutError, match="'x'"):
        cut(concrete, ["a", "flag"], ["br"])
    # flag is the If's own input, needed for y
    with pytest.raises(CutError, match="'flag'"):
        cut(concrete, ["a", "x"], ["y"])
    sub = cut(concrete, ["a", "flag", "x"], ["br"])
    assert [i.name for i in sub.graph.input] == ["a", "flag", "x"]
    assert [n.op_type for n in sub.graph.node] == ["If"]
    assert {i.name for i in sub.graph.initializer} == {"one"}    # read only by a branch
    onnx.checker.check_model(sub)
    import onnxruntime as ort

    sess = ort.InferenceSession(sub.SerializeToString(), providers=["CPUExecutionProvider"])
    a = np.arange(128, dtype=np.float32).reshape(2, 64)
    x = np.full((2, 4), 0.5, np.float32)
    np.testing.assert_allclose(sess.run(None, {"a": a, "flag": np.array(True), "x": x})[0],
                               a + 1 + 4.0)
    np.testing.assert_allclose(sess.run(None, {"a": a, "flag": np.array(False), "x": x})[0],
                               2 * a)


# ---- tensors only a run can size ------------------------------------------------------------
@pytest.mark.parametrize("op", ["NonZero", "com.microsoft.Gelu"])
def test_unknown_shapes_are_measured_with_a_feed(tmp_path: Path, op: str) -> None:
    path = unknown_shape_model(tmp_path / "odd.onnx", op.rsplit(".", 1)[-1])
    digest = files.sha256_of(path)
    shapes = {"x": (4, 6)}
    with pytest.raises(PlanError) as err:
        concrete_graph(path, digest, shapes, tmp_path / "no-feed")
    assert err.value.field == "model" and "no sample input" in err.value.message
    assert not list((tmp_path / "no-feed").glob("*.onnx"))      # nothing half-made cached
    x = np.random.default_rng(7).standard_normal((4, 6)).astype(np.float32)
    graph = concrete_graph(path, digest, shapes, tmp_path / "graphs", feed={"x": x})
    assert graph.measured > 0
    r = np.maximum(x @ numpy_helper.to_array(_init(path, "w1")), 0)
    if op == "NonZero":
        assert graph.tensors["u"].shape == (2, int(np.count_nonzero(r)))
        assert graph.tensors["u"].dtype == "int64"
    else:
        assert graph.tensors["u"].shape == (4, 6)
    assert graph.tensors["uf"].shape == graph.tensors["u"].shape
    assert graph.tensors["y"].shape == (4, 3)
    # the annotated copy types the measured tensors for the cut (type and rank; the size was
    # this sample's, so the dims stay symbolic) and keeps their measured sizes
    vi = {v.name: v for v in graph.load().graph.value_info}["u"]
    tt = vi.type.tensor_type
    assert tt.elem_type == (TensorProto.INT64 if op == "NonZero" else TensorProto.FLOAT)
    assert len(tt.shape.dim) == 2 and not any(d.HasField("dim_value") for d in tt.shape.dim)
    assert concrete_graph(path, digest, shapes, tmp_path / "graphs").tensors == graph.tensors


def test_a_cut_through_a_data_dependent_tensor_takes_other_counts(
        tmp_path: Path, backend: OnnxRuntimeBackend) -> None:
    """The measured size of a NonZero output is one sample's: a segment reading it must run
    requests with another count (the size still counts for the partitioner)."""
    rng = np.random.default_rng(9)
    path = _save(tmp_path / "nz.onnx",
                 [helper.make_node("MatMul", ["x", "w1"], ["h"]),
                  helper.make_node("Relu", ["h"], ["r"]),
                  helper.make_node("NonZero", ["r"], ["u"]),
                  helper.make_node("Cast", ["u"], ["uf"], to=TensorProto.FLOAT),
                  helper.make_node("Abs", ["uf"], ["m"]),
                  helper.make_node("ReduceSum", ["m"], ["z"], keepdims=0)],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])],
                 [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
                 [_w(rng, "w1", 6, 6)])
    w1 = numpy_helper.to_array(_init(path, "w1"))
    x1 = rng.standard_normal((4, 6)).astype(np.float32)
    x2 = x1.copy()
    x2[0] = np.linalg.lstsq(w1.T, np.ones(6, np.float32), rcond=None)[0]  # a row all > 0
    counts = [int(np.count_nonzero(np.maximum(x @ w1, 0))) for x in (x1, x2)]
    assert counts[0] != counts[1]
    for _ in ("built", "loaded from the cache"):
        part = partition(path, shapes={"x": (4, 6)}, cache_dir=tmp_path / "graphs",
                         feed={"x": x1}, min_layer_flops=1)
        (lay,) = [lay for lay in part.layers if lay.inputs == ("u",)]
        assert part.tensor_bytes["u"] == 2 * counts[0] * 8 and lay.in_bytes > 0
        for x, n in zip((x1, x2), counts, strict=True):
            env, whole = chain(part, backend, {"x": x})
            assert env["u"].shape == (2, n)
            np.testing.assert_allclose(env["z"], whole["z"])


def test_concrete_graph_is_cached_per_file_and_signature(tmp_path: Path) -> None:
    path = unknown_shape_model(tmp_path / "odd.onnx", "NonZero")
    digest = files.sha256_of(path)
    cache = tmp_path / "graphs"
    feed = {"x": np.abs(np.random.default_rng(8).standard_normal((4, 6))).astype(np.float32)}
    first = concrete_graph(path, digest, {"x": (4, 6)}, cache, feed=feed)
    stamp = first.path.stat().st_mtime_ns
    # no feed needed the second time: nothing is measured again, and what was is kept
    again = concrete_graph(path, digest, {"x": (4, 6)}, cache)
    assert again.path == first.path and again.path.stat().st_mtime_ns == stamp
    assert again.measured == 0
    assert again.tensors == first.tensors
    # another signature is another graph
    other = concrete_graph(path, digest, {"x": (2, 6)}, cache, feed={"x": feed["x"][:2]})
    assert other.path != first.path and other.tensors["h"].shape == (2, 6)
    assert first.path.stat().st_mtime_ns == stamp
    # a damaged entry is rebuilt
    first.path.write_bytes(b"not a model")
    rebuilt = concrete_graph(path, digest, {"x": (4, 6)}, cache, feed=feed)
    assert rebuilt.path == first.path and rebuilt.measured > 0
    assert rebuilt.tensors == first.tensors


def test_partition_reuses_the_cached_graph(tmp_path: Path) -> None:
    path = shape_arith_model(tmp_path / "arith.onnx")
    one = partition(path, shapes={"x": (2, 8)}, cache_dir=tmp_path / "graphs")
    assert one.graph_path is not None
    stamp = one.graph_path.stat().st_mtime_ns
    two = partition(path, shapes={"x": (2, 8)}, cache_dir=tmp_path / "graphs")
    assert two.graph_path == one.graph_path
    assert one.graph_path.stat().st_mtime_ns == stamp
    assert [lay.name for lay in two.layers] == [lay.name for lay in one.layers]
    assert two.tensor_bytes == one.tensor_bytes


def test_a_lazy_partition_writes_its_graph_when_a_partial_segment_needs_it(
        tmp_path: Path) -> None:
    """A plan adopted from a board of the same kind often runs the whole file: its annotated
    copy is written when the first partial segment is cut (or later, in the background)."""
    path = shape_arith_model(tmp_path / "arith.onnx")
    lazy = partition(path, shapes={"x": (2, 8)}, cache_dir=tmp_path / "graphs", lazy=True,
                     min_layer_flops=1)
    assert lazy.graph_path is not None and not lazy.graph_path.exists()
    assert len(lazy.layers) > 1
    assert lazy.segment(0, len(lazy.layers)).model_path == path and not lazy.graph_path.exists()
    assert lazy.segment(0, 1).model_path == lazy.graph_path and lazy.graph_path.is_file()
    eager = partition(path, shapes={"x": (2, 8)}, cache_dir=tmp_path / "other",
                      min_layer_flops=1)
    assert eager.graph_path is not None and eager.graph_path.is_file()
    assert [lay.name for lay in eager.layers] == [lay.name for lay in lazy.layers]
    assert onnx.load(str(eager.graph_path)) == onnx.load(str(lazy.graph_path))
    # released unwritten (planned, serving the whole file): made again when a replan cuts
    again = partition(path, shapes={"x": (2, 8)}, cache_dir=tmp_path / "again", lazy=True,
                      min_layer_flops=1)
    again.release_graph()
    assert again.pending is not None and again.pending.model is None
    assert again.graph_path is not None and not again.graph_path.exists()
    assert again.segment(1, 2).model_path == again.graph_path and again.graph_path.is_file()
    assert onnx.load(str(again.graph_path)) == onnx.load(str(eager.graph_path))


def test_the_shape_probe_runs_in_memory_sized_parts_with_the_same_result(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every tensor a probe run exposes stays alive to its end (Kokoro TTS: 13 GB in one run);
    in parts of what the memory available holds, the shapes found are the same."""
    import sys

    from edgepilot.dispatch.graph import onnx_shapes

    sys.path.insert(0, str(Path(__file__).parent))
    from real_models import by_name

    model = onnx.load(str(by_name("ppocr-rec").path))
    onnx_shapes.fix_inputs(model, {"x": (1, 3, 48, 160)})
    names = [t for n in model.graph.node for t in n.output if t]
    feed = {"x": np.random.default_rng(0).random((1, 3, 48, 160), dtype=np.float32)}
    whole, nbytes = onnx_shapes._probe(model, names, feed)
    assert nbytes > 0 and len(whole) == len(names)
    runs: list[int] = []
    probe = onnx_shapes._probe

    def counted(*args: object) -> tuple[dict[str, object], int]:
        runs.append(len(args[1]))  # type: ignore[arg-type]
        return probe(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(onnx_shapes, "_probe", counted)
    monkeypatch.setattr(onnx_shapes, "FIRST_PROBE", 40)
    monkeypatch.setattr(onnx_shapes, "PROBE_SHARE", 1e-12)  # memory for the fewest at a time
    found, opaque = onnx_shapes._measure(model, names, feed)
    assert len(runs) > 2 and runs[0] == 40 and sum(runs) == len(names)
    assert found == {n: i for n, i in whole.items() if i is not None} and not opaque
