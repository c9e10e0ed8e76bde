"""The operators onnxruntime registers, and a file's operators it does not.

A file built on a custom-op library (onnxruntime-extensions' tokenizers and image decoders in
``ai.onnx.contrib`` or ``com.microsoft.extensions``) names operators no schema here defines:
no input shape makes it run, so the question of its shapes is not worth asking first.
"""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def registered() -> frozenset[tuple[str, str]]:
    """(domain, operator) of every schema this onnxruntime registers ("" for ONNX's own);
    empty where the build does not list them (then nothing is judged)."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as ort_c

        schemas = ort_c.get_all_operator_schema()
    except (ImportError, AttributeError):
        return frozenset()
    return frozenset((s.domain or "", s.name) for s in schemas)


def unregistered_ops(model: Any) -> list[str]:
    """``domain:Operator`` of each node (in subgraphs too) that no onnxruntime schema and no
    function of the file defines, sorted."""
    known = registered()
    if not known:
        return []
    local = {(f.domain, f.name) for f in model.functions}
    found: set[str] = set()

    def walk(graph: Any) -> None:
        for node in graph.node:
            domain = "" if node.domain in ("", "ai.onnx") else node.domain
            if (domain, node.op_type) not in known and (node.domain, node.op_type) not in local:
                found.add(f"{domain}:{node.op_type}" if domain else node.op_type)
            for attr in node.attribute:
                for sub in ([attr.g] if attr.HasField("g") else list(attr.graphs)):
                    walk(sub)

    walk(model.graph)
    return sorted(found)
