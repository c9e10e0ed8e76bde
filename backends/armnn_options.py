"""The ``[backends.armnn]`` config section, kept beside the backend that reads it.

The backend imports only this model, so it never reaches up into the daemon's config;
edgepilot.config composes it into ``[backends]``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from edgepilot.backends.options import BackendOptions, Isolation

ArmnnDevice = Literal["CpuAcc", "GpuAcc", "CpuRef"]
ARMNN_DEVICES: tuple[ArmnnDevice, ...] = ("CpuAcc", "GpuAcc", "CpuRef")


class ArmnnSection(BackendOptions):
    """``[backends.armnn]``: unknown keys are errors, values are validated on set."""

    preferred: list[ArmnnDevice] = Field(
        default_factory=lambda: list(ARMNN_DEVICES), min_length=1,
        description="Arm NN backend preference order.")
    isolation: Isolation = Field(
        "thread",
        description="Where compiled models run: 'thread' = inside the daemon; 'process' = in a "
                    "worker process per model (`edgepilot worker armnn <model>`), tensors passed "
                    "through shared memory, so a native crash costs only that model's requests "
                    "and the worker is restarted.")
