"""The ONNX outline planning reads before a plan exists: the graph as parsed, the weights'
bytes left out, parsed once per file version."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper
from real_models import by_name

from edgepilot.dispatch.graph.samples import onnx_rules
from edgepilot.formats.io import tensor_specs
from edgepilot.formats.onnx_gen import mlp_stack
from edgepilot.formats.onnx_outline import KEEP_ELEMENTS, onnx_outline


def test_the_outline_is_the_graph_without_the_weights_bytes() -> None:
    path = by_name("minilm").path  # a real export: int64 ids, a 23 MB encoder
    full = onnx.load(str(path))
    outline = onnx_outline(path)
    g, o = full.graph, outline.graph
    assert [(n.op_type, n.name, list(n.input), list(n.output)) for n in o.node] == \
        [(n.op_type, n.name, list(n.input), list(n.output)) for n in g.node]
    assert [i.name for i in o.input] == [i.name for i in g.input]
    assert [i.name for i in o.output] == [i.name for i in g.output]
    assert [(i.name, list(i.dims), i.data_type) for i in o.initializer] == \
        [(i.name, list(i.dims), i.data_type) for i in g.initializer]
    small = [i for i in g.initializer if int(np.prod(i.dims)) <= KEEP_ELEMENTS]
    assert small  # shape constants keep their values: what the input rules read
    kept = {i.name: i for i in o.initializer}
    for init in small:
        assert np.array_equal(numpy_helper.to_array(kept[init.name]),
                              numpy_helper.to_array(init))
    assert outline.ByteSize() < full.ByteSize() / 50
    specs = tensor_specs(path, "onnx")[0]
    assert onnx_rules(outline, specs) == onnx_rules(full, specs)


def test_one_parse_per_file_version(tmp_path: Path) -> None:
    path = tmp_path / "mlp.onnx"
    mlp_stack(path, widths=(16, 32, 8), batch=2)
    first = onnx_outline(path)
    assert onnx_outline(path) is first
    mlp_stack(path, widths=(16, 64, 8), batch=2)  # replaced in place: a new version
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    second = onnx_outline(path)
    assert second is not first
    assert [list(i.dims) for i in second.graph.initializer] != \
        [list(i.dims) for i in first.graph.initializer]
