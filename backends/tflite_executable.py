"""One warm TFLite interpreter as an executable, and a runtime's error in one line.

Kept apart from :mod:`.tflite` (the backend: probing, delegates, support, building): this is
what runs, calls serialised, resized to a call's shapes, state reset between users.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from edgepilot.backends.base import Executable, Target, TensorSpec
from edgepilot.errors import BackendError

# what one_line says of a file's operators the interpreter lacks: no input shape changes that
UNRESOLVED = "is not resolved by the TFLite interpreter"
FLEX_OPS = "the file uses Select TensorFlow (Flex) ops; this interpreter has no Flex delegate"


def one_line(exc: BaseException) -> str:
    """A runtime's error as one line: the op an interpreter could not resolve named first (its
    message is several lines with a link), otherwise the message with whitespace collapsed."""
    text = " ".join(str(exc).split())
    # LiteRT appends "Node number N (OP) failed to ..." to a kernel's message with no break
    text = re.sub(r"(?<=[a-z0-9])(?=Node number \d)", ". ", text)
    half = len(text) // 2
    if text and text[:half] == text[half:]:  # the interpreter reports some failures twice
        text = text[:half]
    op = re.search(r"unresolved custom op: (\S+?)\.? ", text + " ")
    if op:
        return f"custom op {op.group(1)} {UNRESOLVED}"
    if "Select TensorFlow op" in text:
        return FLEX_OPS
    return text[:300]


class TfliteExecutable(Executable):
    """One warm interpreter; calls are serialised (an interpreter is not re-entrant)."""

    _feed: list[tuple[str, int, tuple[int, ...]]]   # (name, tensor index, shape allocated)

    def __init__(self, interp: Any, target: Target, model_bytes: int,
                 allocated: bool = True,
                 rebuild: Callable[[], tuple[Any, bool]] | None = None) -> None:
        self.interp = interp
        self._rebuild = rebuild  # a new interpreter, for a file of resource variables
        self.target = target
        self._bytes = model_bytes
        self._lock = threading.Lock()
        self._in = {d["name"]: d for d in interp.get_input_details()}
        self._out = {d["name"]: d for d in interp.get_output_details()}
        self.inputs = [TensorSpec(n, np.dtype(d["dtype"]).name, tuple(
            int(x) for x in d["shape"])) for n, d in self._in.items()]
        self.outputs = [TensorSpec(n, np.dtype(d["dtype"]).name, tuple(
            int(x) for x in d["shape"])) for n, d in self._out.items()]
        self._index()
        if not allocated:  # a shape no array has: the first call resizes, which allocates
            self._feed = [(name, index, (-1,)) for name, index, _ in self._feed]

    @property
    def memory_bytes(self) -> int:
        return self._bytes

    def _index(self) -> None:
        """(name, tensor index, shape) of the inputs and (name, index) of the outputs: read
        once per allocation, not per call (a streaming model runs in ~10 µs)."""
        self._feed = [(d["name"], int(d["index"]), tuple(int(x) for x in d["shape"]))
                      for d in self.interp.get_input_details()]
        self._fetch = [(d["name"], int(d["index"])) for d in self.interp.get_output_details()]

    def _resize(self, inputs: dict[str, np.ndarray]) -> None:
        """Resize the interpreter to the inputs' shapes (dynamic batch): TFLite propagates
        the new shapes through the graph at ``allocate_tensors``."""
        for name, index, shape in self._feed:
            want = tuple(np.shape(inputs[name]))
            if want != shape:
                try:
                    self.interp.resize_tensor_input(index, list(want), strict=False)
                except (ValueError, RuntimeError) as exc:
                    raise BackendError(f"input {name!r}: cannot run shape {list(want)}: {exc}",
                                       field=f"inputs.{name}") from None
        try:
            self.interp.allocate_tensors()
        except (ValueError, RuntimeError) as exc:
            why = one_line(exc)
            if why == FLEX_OPS or why.endswith(UNRESOLVED):  # whatever the shapes
                raise BackendError(why, field="model") from None
            raise BackendError(f"TFLite cannot run input shapes "
                               f"{ {n: list(np.shape(inputs[n])) for n, _, _ in self._feed} }: "
                               f"{why}", field="inputs") from None
        self._index()

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock:
            interp = self.interp
            try:
                for name, index, shape in self._feed:
                    value = inputs[name]
                    if value.shape != shape:
                        self._resize(inputs)
                        return self.run_locked(inputs)
                    interp.set_tensor(index, value)
            except KeyError:
                missing = sorted(set(self._in) - set(inputs))
                raise BackendError(f"missing input(s) {missing}; this segment takes "
                                   f"{sorted(self._in)}", field=f"inputs.{missing[0]}") from None
            except ValueError as exc:
                raise BackendError(f"input {name!r}: {exc}", field=f"inputs.{name}") from None
            return self._invoke()

    def reset_state(self) -> None:
        """Fresh state for the next call. LiteRT's ``reset_all_variables`` resets variable
        tensors only: a file keeping state in resource variables (a streaming wake-word
        model) gets a new interpreter, or the state planning left in it leaked into the
        first requests (a wake score rising to 6/255 on silence)."""
        with self._lock:
            if self._rebuild is None:
                self.interp.reset_all_variables()
                return
            self.interp, allocated = self._rebuild()
            self._index()
            if not allocated:
                self._feed = [(name, index, (-1,)) for name, index, _ in self._feed]

    def run_locked(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One call after a resize (the lock is held by the caller)."""
        interp = self.interp
        for name, index, _ in self._feed:
            try:
                interp.set_tensor(index, inputs[name])
            except ValueError as exc:
                raise BackendError(f"input {name!r}: {exc}", field=f"inputs.{name}") from None
        return self._invoke()

    def _invoke(self) -> dict[str, np.ndarray]:
        """Invoke and fetch; a kernel or delegate failing at run time is a BackendError (the
        planner records it as that target's fact), never a bare RuntimeError."""
        try:
            self.interp.invoke()
        except (RuntimeError, ValueError) as exc:
            raise BackendError(f"TFLite failed to invoke on {self.target}: "
                               f"{one_line(exc)}") from None
        return {name: self.interp.get_tensor(index).copy() for name, index in self._fetch}
