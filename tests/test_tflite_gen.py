"""The int8 probe model: every int8 TFLite target runs it, and they agree with its float math."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgepilot.backends import load_backend
from edgepilot.backends.base import Segment, Target
from edgepilot.formats.tflite_gen import write_int8_fc_tflite


def test_int8_fc_runs_alike_on_litert_and_armnn(tmp_path: Path) -> None:
    q = write_int8_fc_tflite(tmp_path / "q.tflite", width=16, batch=2, seed=3)
    xq = q.quantize_input(np.random.default_rng(4).uniform(-2, 2, (2, 16)))
    assert xq.dtype == np.int8
    seg = Segment(q.path, "tflite", ("input",), ("output",))
    outs = {}
    for target in (Target("tflite", "cpu", "int8"), Target("tflite", "xnnpack", "int8"),
                   Target("armnn", "CpuRef", "int8")):
        backend = load_backend(target.backend)
        assert backend.supports(seg, target), target
        # a float target must refuse the int8 file rather than run it in another precision
        assert not backend.supports(seg, Target(target.backend, target.device, "fp32"))
        exe = backend.compile(seg, target)
        out = exe.run({"input": xq})["output"]
        exe.close()
        assert out.dtype == np.int8 and out.shape == (2, 16)
        outs[str(target)] = out
    ref = q.reference(xq)
    for name, out in outs.items():
        got = q.dequantize_output(out)
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert err < 0.05, (name, err)
    # the three runtimes round the same way to within one quantization step
    first = next(iter(outs.values())).astype(np.int16)
    for out in outs.values():
        assert np.abs(out.astype(np.int16) - first).max() <= 1
