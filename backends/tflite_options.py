"""The ``[backends.tflite]`` config section, kept beside the backend that reads it.

The backend imports only this model, so it never reaches up into the daemon's config;
edgepilot.config composes it into ``[backends]``.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from edgepilot.backends.options import BackendOptions, Isolation


class TfliteSection(BackendOptions):
    """``[backends.tflite]``: unknown keys are errors, values are validated on set."""

    delegates: dict[str, Path] = Field(
        default_factory=dict, description="External delegates by device name -> .so path.")
    threads: int = Field(0, ge=0, le=256, description="0 = runtime default.")
    isolation: Isolation = Field(
        "thread",
        description="Where compiled models run: 'thread' = inside the daemon; 'process' = in a "
                    "worker process per model (`edgepilot worker tflite <model>`), tensors passed "
                    "through shared memory, so a native crash costs only that model's requests "
                    "and the worker is restarted.")
