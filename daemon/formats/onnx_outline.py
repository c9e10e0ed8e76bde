"""An ONNX file's outline: its graph without the contents of its large initializers, parsed once.

Before a plan exists, planning asks one file several questions (its inputs and outputs, how
the graph uses each input, its operators in order); each parse of a 23 MB encoder costs
35-45 ms on a 2-core board. The outline is parsed once per file version (path, mtime, size) and
keeps the graph with every initializer's name, type and dims but only the values of small ones
(what the questions read): kilobytes held, not the model's size. It is for reading: nothing
runs it, and no caller may change it (the next caller gets the same object).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from edgepilot.formats.file_cache import per_file

# initializers of up to this many elements keep their values (shape and axis constants)
KEEP_ELEMENTS = 64


@per_file(maxsize=4)
def onnx_outline(path: Path) -> onnx.ModelProto:
    """The outline of the ONNX file at ``path``; raises what ``onnx.load`` raises."""
    model = onnx.load(str(path), load_external_data=False)
    g = model.graph
    out = onnx.ModelProto(ir_version=model.ir_version, producer_name=model.producer_name,
                          producer_version=model.producer_version, domain=model.domain,
                          model_version=model.model_version)
    out.opset_import.extend(model.opset_import)
    og = out.graph
    og.name = g.name
    for field in ("node", "input", "output", "value_info"):
        getattr(og, field).extend(getattr(g, field))
    for init in g.initializer:
        if int(np.prod(init.dims)) <= KEEP_ELEMENTS:
            og.initializer.append(init)
        else:  # a new message: the outline's arena holds none of the weights' bytes
            og.initializer.append(onnx.TensorProto(
                name=init.name, dims=init.dims, data_type=init.data_type,
                data_location=init.data_location, external_data=init.external_data))
    return out
