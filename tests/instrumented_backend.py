"""An instrumented onnxruntime backend for serving tests: two devices, every run recorded.

It is the real onnxruntime backend (real sessions on the CPU provider) with one more device,
``testnpu``, standing in for an accelerator this machine lacks: its segments run on the CPU
provider too, but the serving layer sees (and queues) it as a separate physical device. Every
``run`` records how many runs were inside each device at that moment, so a test can prove
that no two ever overlap in one device and that two devices do work at the same time.
Registered under the name ``onnxruntime`` (the backends registry maps names to classes).
"""

from __future__ import annotations

import hashlib
import threading
import time

import numpy as np

from edgepilot.backends.base import Executable, Segment, Support, Target
from edgepilot.backends.onnxrt import OnnxRuntimeBackend, OrtExecutable

SPEC = "instrumented_backend:InstrumentedBackend"
DEVICES = ("cpu", "testnpu")


class Recorder:
    """Per device: runs inside now, the most ever inside at once; and the most devices busy
    at once across the process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.inside: dict[str, int] = dict.fromkeys(DEVICES, 0)
        self.max_inside: dict[str, int] = dict.fromkeys(DEVICES, 0)
        self.max_devices_busy = 0
        self.runs: dict[str, int] = dict.fromkeys(DEVICES, 0)
        self.hold_s = 0.02  # each run stays inside its device this long, so overlaps would show

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]

    def enter(self, device: str) -> None:
        with self.lock:
            self.inside[device] += 1
            self.runs[device] += 1
            self.max_inside[device] = max(self.max_inside[device], self.inside[device])
            busy = sum(1 for n in self.inside.values() if n)
            self.max_devices_busy = max(self.max_devices_busy, busy)

    def leave(self, device: str) -> None:
        with self.lock:
            self.inside[device] -= 1


RECORDER = Recorder()


class RecordedExecutable(Executable):
    def __init__(self, inner: Executable, target: Target) -> None:
        self.inner = inner
        self.target = target
        self.inputs = inner.inputs
        self.outputs = inner.outputs

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        RECORDER.enter(self.target.device)
        try:
            out = self.inner.run(inputs)
            time.sleep(RECORDER.hold_s)
            return out
        finally:
            RECORDER.leave(self.target.device)

    @property
    def memory_bytes(self) -> int:
        return self.inner.memory_bytes

    def close(self) -> None:
        self.inner.close()


class InstrumentedBackend(OnnxRuntimeBackend):
    def devices(self) -> list[str]:
        return list(DEVICES)

    def probe(self) -> list[Target]:
        return [Target(self.name, dev, "fp32") for dev in DEVICES]

    def supports(self, segment: Segment, target: Target) -> Support:
        if target.device == "testnpu" and target.precision == "fp32":
            return super().supports(segment, Target(self.name, "cpu", "fp32"))
        return super().supports(segment, target)

    def compile(self, segment: Segment, target: Target) -> Executable:
        # what the parent does for cpu, without its check that the device is a real provider
        cpu = Target(self.name, "cpu", target.precision)
        data = self._variants.get(self.segment_model(segment), self._recipe(cpu))
        session = self._session(data, "cpu", strict=True)
        inner = OrtExecutable(session, target, len(data), hashlib.sha256(data).hexdigest())
        return RecordedExecutable(inner, target)
