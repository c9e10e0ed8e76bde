"""Draw edgepilot's import graph and write its layer table, both from the code.

    .venv/bin/python scripts/import_graph.py          # rewrite docs/import-graph.{dot,svg} and
                                                     # the layer table in docs/architecture.md
    .venv/bin/python scripts/import_graph.py --check  # exit 1 when any of them is out of date

The graph is grimp's (the one import-linter checks, ``TYPE_CHECKING`` imports included) of the
package joined into one tree (``scripts/package-tree.sh``), drawn one node per package (a
subpackage of ``dispatch`` and ``backends`` is a node of its own) and one rank per layer of the
layers contract in pyproject.toml, top to bottom: every arrow should point down. graphviz
(``dot``, through pydot) lays it out; the SVG carries the sha256 of the DOT text it was drawn
from, so ``--check`` (and tests/test_import_graph.py) can tell a stale picture without graphviz.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import itertools
import re
import subprocess
import sys
import tempfile
import tomllib
from collections import Counter
from pathlib import Path

import grimp
import pydot

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
DOT_FILE = DOCS / "import-graph.dot"
SVG_FILE = DOCS / "import-graph.svg"
ARCHITECTURE = DOCS / "architecture.md"
TABLE_BEGIN = "<!-- layer table: scripts/import_graph.py writes it -->"
TABLE_END = "<!-- end of layer table -->"
# packages whose subpackages are drawn apart: the graph is still readable at that depth
SPLIT = ("edgepilot.dispatch", "edgepilot.backends")
# where a module of each top-level name lives in the checkout (the rest are under daemon/)
SOURCE_DIRS = {"backends": ROOT / "backends"}


def layers() -> list[list[str]]:
    """The layers contract's layers, top first, each a list of top-level module names."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contract = next(c for c in config["contracts"] if c["type"] == "layers")
    return [[m.strip() for m in re.split(r"[|:]", layer)] for layer in contract["layers"]]


def node_of(module: str) -> str:
    """The node a module is drawn in: its top-level package, or for ``SPLIT`` packages its
    subpackage (modules directly in a split package stay in the package's own node)."""
    parts = module.split(".")
    top = ".".join(parts[:2])
    if top in SPLIT and len(parts) > 3:
        return ".".join(parts[:3])
    return top


def build_graph() -> grimp.ImportGraph:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([str(ROOT / "scripts" / "package-tree.sh"), tmp, str(ROOT)], check=True)
        sys.path.insert(0, tmp)
        try:
            return grimp.build_graph("edgepilot", include_external_packages=False,
                                     exclude_type_checking_imports=False, cache_dir=None)
        finally:
            sys.path.remove(tmp)


def modules_of(graph: grimp.ImportGraph) -> list[str]:
    """The package's modules, less ``edgepilot`` itself (it holds ``__version__`` only)."""
    return sorted(m for m in graph.modules if m != "edgepilot")


def edges(graph: grimp.ImportGraph) -> Counter[tuple[str, str]]:
    """(importer node, imported node) -> how many module imports run between them."""
    out: Counter[tuple[str, str]] = Counter()
    for importer in modules_of(graph):
        for imported in graph.find_modules_directly_imported_by(importer):
            a, b = node_of(importer), node_of(imported)
            if a != b and imported != "edgepilot":
                out[(a, b)] += 1
    return out


def short(node: str) -> str:
    return node.removeprefix("edgepilot.")


def dot_text(graph: grimp.ImportGraph) -> str:
    """The DOT source: one rank per layer, top to bottom, nodes with their module counts."""
    modules = Counter(node_of(m) for m in modules_of(graph))
    dot = pydot.Dot("edgepilot", graph_type="digraph", rankdir="TB", ranksep="0.6",
                    nodesep="0.25", fontname="Helvetica", fontsize="11", newrank="true",
                    label="edgepilot imports (arrows point from importer to imported; "
                          "layers top to bottom)", labelloc="t")
    dot.set_node_defaults(shape="box", style="rounded,filled", fillcolor="#f4f4f4",
                          fontname="Helvetica", fontsize="10")
    dot.set_edge_defaults(color="#777777", arrowsize="0.6")
    placed: set[str] = set()
    firsts: list[str] = []
    for i, layer in enumerate(layers()):
        rank = pydot.Subgraph(f"layer{i}", rank="same")
        for top in layer:
            for node in sorted(n for n in modules if n == top or n.startswith(top + ".")):
                count = modules[node]
                label = f"{short(node)}\\n{count} module{'s' if count != 1 else ''}"
                rank.add_node(pydot.Node(f'"{short(node)}"', label=f'"{label}"'))
                placed.add(node)
                if len(firsts) == i:
                    firsts.append(node)
        dot.add_subgraph(rank)
    # invisible, heavy edges from layer to layer: the ranks stay in the contract's order
    # where no import happens to link two layers directly
    for a, b in itertools.pairwise(firsts):
        dot.add_edge(pydot.Edge(f'"{short(a)}"', f'"{short(b)}"', style="invis", weight="10"))
    missing = sorted(set(modules) - placed)
    if missing:
        raise SystemExit(f"modules in no layer of the layers contract: {missing}")
    for (a, b), n in sorted(edges(graph).items()):
        dot.add_edge(pydot.Edge(f'"{short(a)}"', f'"{short(b)}"',
                                penwidth=f"{min(3.0, 0.6 + 0.2 * n):.1f}", tooltip=f"{n} imports"))
    return str(dot.to_string())


def svg_of(dot: str) -> str:
    """The picture of ``dot``, stamped with the DOT text's sha256."""
    (graph,) = pydot.graph_from_dot_data(dot)
    graph.set_comment(f"dot sha256 {sha256(dot)}")
    return bytes(graph.create_svg()).decode()


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def summary(module_path: Path) -> str:
    """The first sentence of a module's (or package's) docstring."""
    init = module_path / "__init__.py" if module_path.is_dir() else module_path
    if not init.exists():
        return ""
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    return first.split(". ")[0].rstrip(".").replace("``", "`")


def source_of(top: str) -> Path:
    name = top.removeprefix("edgepilot.")
    base = SOURCE_DIRS.get(name)
    if base is not None:
        return base
    path = ROOT / "daemon" / name
    return path if path.is_dir() else path.with_suffix(".py")


def layer_table() -> str:
    """The layers as a markdown table, top first: each member's path and what it holds."""
    rows = ["| layer | package or module | what it holds |", "|---|---|---|"]
    for i, layer in enumerate(layers()):
        for j, top in enumerate(layer):
            path = source_of(top)
            parts = [path]
            if top in SPLIT:  # and its subpackages, each a node of the picture
                parts += sorted(p.parent for p in path.glob("*/__init__.py"))
            for k, part in enumerate(parts):
                shown = part.relative_to(ROOT).as_posix() + ("/" if part.is_dir() else "")
                layer_no = str(i + 1) if j == 0 and k == 0 else ""
                rows.append(f"| {layer_no} | `{shown}` | {summary(part)} |")
    return "\n".join(rows)


def with_table(text: str, table: str) -> str:
    begin, end = text.index(TABLE_BEGIN), text.index(TABLE_END)
    return text[:begin + len(TABLE_BEGIN)] + "\n" + table + "\n" + text[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when the checked-in picture or table is out of date")
    args = parser.parse_args(argv)
    dot = dot_text(build_graph())
    doc = ARCHITECTURE.read_text()
    new_doc = with_table(doc, layer_table())
    if args.check:
        stale = []
        if not DOT_FILE.exists() or DOT_FILE.read_text() != dot:
            stale.append(str(DOT_FILE.relative_to(ROOT)))
        if not SVG_FILE.exists() or f"dot sha256 {sha256(dot)}" not in SVG_FILE.read_text():
            stale.append(str(SVG_FILE.relative_to(ROOT)))
        if new_doc != doc:
            stale.append(f"{ARCHITECTURE.relative_to(ROOT)} (layer table)")
        if stale:
            print(f"out of date: {', '.join(stale)}; run .venv/bin/python "
                  "scripts/import_graph.py", file=sys.stderr)
            return 1
        return 0
    DOT_FILE.write_text(dot)
    SVG_FILE.write_text(svg_of(dot))
    ARCHITECTURE.write_text(new_doc)
    print(f"wrote {DOT_FILE.relative_to(ROOT)}, {SVG_FILE.relative_to(ROOT)} and the layer "
          f"table of {ARCHITECTURE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
