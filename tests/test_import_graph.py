"""docs/architecture.md's layer table and the import-graph picture are the code's: regenerated
by scripts/import_graph.py, they come out exactly as checked in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_layer_table_and_the_picture_are_current() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_graph.py"), "--check"],
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_picture_ranks_every_layer_and_has_no_upward_arrow() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import import_graph
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    graph = import_graph.build_graph()
    rank = {top: i for i, layer in enumerate(import_graph.layers()) for top in layer}

    def layer_of(node: str) -> int:
        return rank[".".join(node.split(".")[:2])]

    arrows = import_graph.edges(graph)
    assert ("edgepilot.lifecycle", "edgepilot.serving") in arrows
    # an import from a lower layer up would be an arrow pointing up (import-linter forbids it)
    assert [(a, b) for a, b in arrows if layer_of(a) > layer_of(b)] == []
    dot = (ROOT / "docs" / "import-graph.dot").read_text()
    assert all(f'"{import_graph.short(n)}"' in dot
               for n in {import_graph.node_of(m) for m in import_graph.modules_of(graph)})
