"""What every backend's ``[backends.<name>]`` config section has in common.

Each backend declares its own section class (``Backend.options_class``), a subclass of
:class:`BackendOptions` kept beside it (``onnxrt_options.py`` ...), so a backend never reaches
up into the daemon's config and the config composes the sections into ``[backends]``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# where a backend's compiled models run: "thread" = in the daemon, "process" = a worker
Isolation = Literal["thread", "process"]


class BackendOptions(BaseModel):
    """A backend's section: unknown keys are errors, values are validated on set."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    isolation: Isolation = Field(
        "thread", description="Where compiled models run: 'thread' = inside the daemon; "
                              "'process' = in a worker process per model.")
