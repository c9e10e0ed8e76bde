"""What the HTTP routes serve from: the daemon's components, handed over by the composition root.

``create_app`` keeps one :class:`HttpApi` on ``app.state.api``; a route reads only the part it
serves. Components a daemon may run without (planning, telemetry) are None there, and their
routes say so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fastapi import Request
from prometheus_client import CollectorRegistry

from edgepilot.command_registry import CommandRegistry
from edgepilot.config import ConfigSource
from edgepilot.dispatch.dispatcher import Dispatcher
from edgepilot.errors import NotFoundError
from edgepilot.readiness import Readiness
from edgepilot.serving.core import Serving
from edgepilot.serving.generate import Generator
from edgepilot.telemetry.sampler import TelemetrySampler


@dataclass(frozen=True)
class HttpApi:
    """The components behind the routes."""

    config: ConfigSource
    commands: CommandRegistry
    readiness: Readiness
    metrics: CollectorRegistry
    started_at: float
    # the address served: ``run --host/--port`` over the file, the port the kernel picked
    address: Callable[[], tuple[str, int]]
    config_path: Path | None = None
    serving: Serving | None = None
    generator: Generator | None = None
    dispatcher: Dispatcher | None = None
    telemetry: TelemetrySampler | None = None

    def need_serving(self) -> Serving:
        if self.serving is None:
            raise NotFoundError("models are not served by this daemon", field="model")
        return self.serving

    def need_generator(self) -> Generator:
        if self.generator is None:
            raise NotFoundError("models are not served by this daemon", field="model")
        return self.generator


def api_of(request: Request) -> HttpApi:
    """The :class:`HttpApi` of the app serving ``request``."""
    api: HttpApi = request.app.state.api
    return api
