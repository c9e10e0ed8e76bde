"""A native runtime's message is dropped from fd 2, and another thread's line written in the
middle of it is not: LiteRT writes severity, message and newline in three writes."""

from __future__ import annotations

import os

import pytest

from edgepilot.backends.native_log import stderr_without
from edgepilot.backends.tflite import XNNPACK_LINE


def test_a_line_written_inside_a_native_message_survives_its_filter(
        capfd: pytest.CaptureFixture[str]) -> None:
    ours = b"2026-12-04 17:39:59,600 INFO corpus: measuring the kernel corpus\n"
    with stderr_without([XNNPACK_LINE]) as dropped:
        # the three writes of LiteRT's MinimalLogger, the daemon's log line between two of them
        os.write(2, b"INFO: ")
        os.write(2, XNNPACK_LINE)
        os.write(2, ours)
        os.write(2, b"\n")
        # and a native message on a line of its own, then a line of ours after it
        os.write(2, b"INFO: " + XNNPACK_LINE + b"\n")
        os.write(2, b"after\n")
    err = capfd.readouterr().err
    assert err == ours.decode() + "after\n"
    assert dropped == [XNNPACK_LINE, XNNPACK_LINE]
