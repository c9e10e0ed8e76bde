"""The ``[backends.onnxruntime]`` config section, kept beside the backend that reads it.

The backend imports only this model, so it never reaches up into the daemon's config;
edgepilot.config composes it into ``[backends]``.
"""

from __future__ import annotations

import functools
import os

import psutil
from pydantic import Field

from edgepilot.backends.options import BackendOptions, Isolation


class OnnxRuntimeSection(BackendOptions):
    """``[backends.onnxruntime]``: unknown keys are errors, values are validated on set."""

    providers: list[str] | None = Field(
        None, max_length=16,
        description="Execution providers to offer as devices (default: every available one).")
    provider_options: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description="Per-provider options, e.g. QNNExecutionProvider = {backend_path = ...}.")
    intra_op_threads: int = Field(
        0, ge=0, le=256, description="0 = one per physical core (onnxruntime's own count), "
        "set explicitly so that no worker is pinned to a core.")
    single_thread: bool = Field(
        True, description="Offer `cpu-1t`, the CPU provider on one intra-op thread, as a target "
        "of its own (on a machine with more than one core): the planner picks it where it is "
        "faster, a sub-millisecond model or layer, and `cpu` (every core) elsewhere.")
    allow_spinning: bool = Field(
        False, description="Let idle intra-op threads spin for work (onnxruntime's default). "
        "Off: a daemon holds many sessions (models, plan segments) next to llama.cpp, and "
        "spinning threads of one steal the cores the next one needs.")
    isolation: Isolation = Field(
        "thread",
        description="Where compiled models run: 'thread' = inside the daemon; 'process' = in a "
                    "worker process per model (`edgepilot worker onnxruntime <model>`), tensors "
                    "passed through shared memory, so a native crash costs only that model's "
                    "requests and the worker is restarted.")


@functools.cache
def default_threads() -> int:
    """The intra-op threads onnxruntime's default would make (one per physical core), of the
    CPUs this process may run on, as an explicit count (see ``OnnxRuntimeBackend._session``)."""
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)
    physical = psutil.cpu_count(logical=False) or allowed
    return max(1, min(physical, allowed))
