"""Whether the TFLite interpreter survives preparing a file, asked in a child process first.

LiteRT's kernels end the process on some files that parse fine (a quantized ADD whose output
scale is 0 aborts in ``QuantizeMultiplierSmallerThanOneExp``), and the raw runtime dies on such a
file the same way. So the first time a file is seen, a child builds and allocates it as the raw
runtime would (:mod:`.child_check`); a child killed by a signal makes the file unrunnable.
"""

from __future__ import annotations

from pathlib import Path

from edgepilot.backends.child_check import crash
from edgepilot.errors import UnrunnableModel

# the raw runtime on the file: ai_edge_litert, else tflite_runtime (as the backend picks)
_CHILD = """
import sys
try:
    from ai_edge_litert.interpreter import Interpreter
except ImportError:
    from tflite_runtime.interpreter import Interpreter
try:
    Interpreter(model_path=sys.argv[1]).allocate_tensors()
except Exception:
    pass
"""


def check(path: Path) -> None:
    """Raise :class:`UnrunnableModel` when the interpreter crashes preparing ``path`` (asked once
    per file version; a few hundred ms, the child's start)."""
    died = crash(_CHILD, path)
    if died:
        raise UnrunnableModel(f"{path.name}: the TFLite interpreter crashes preparing this file "
                              f"({died}); the raw runtime does the same, so no TFLite target "
                              "can run it", field="model")
