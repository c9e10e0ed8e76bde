"""The daemon: one asyncio loop, services started in order and stopped in reverse.

This is the composition root. Capabilities are attached in :meth:`Daemon.attach_capabilities`,
written out in order: each ``attach(daemon) -> list[Service]`` builds its component with its
real type (``daemon.board``, ``daemon.serving`` ...), registers its commands on
``daemon.commands`` and returns the services to start; the few links between components that
are made after both exist (the dispatcher into the registry and the serving layer) are made
there too, in plain sight. HTTP starts first (so
``/healthz`` answers during start-up, ``/readyz`` says why it is not ready yet), READY=1 is sent
once every service started. SIGTERM/SIGINT stop intake, drain with a deadline, stop services in
reverse order and exit 0; SIGHUP reloads the config (an invalid one is kept out and logged).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from prometheus_client import CollectorRegistry, Gauge, Info

from edgepilot import __version__
from edgepilot.command_registry import CommandRegistry
from edgepilot.config import Config, check_http_exposure, load_config
from edgepilot.errors import ConfigError, EdgepilotError
from edgepilot.events import EventBus
from edgepilot.sdnotify import Notifier, watchdog_interval_s
from edgepilot.telemetry.work import WorkMeter

if TYPE_CHECKING:
    from edgepilot.backends.backend_set import BackendSet
    from edgepilot.board.board import Board
    from edgepilot.dispatch.dispatcher import Dispatcher
    from edgepilot.dvfs.manager import ProfileManager
    from edgepilot.http.server import HttpServer
    from edgepilot.mqtt.service import MqttService
    from edgepilot.serving.core import Serving
    from edgepilot.serving.devices import DeviceQueues
    from edgepilot.serving.generate import Generator
    from edgepilot.serving.registry import ModelRegistry
    from edgepilot.telemetry.sampler import TelemetrySampler

log = logging.getLogger(__name__)
T = TypeVar("T")
SERVICE_STOP_MIN_S = 5.0

@runtime_checkable
class Service(Protocol):
    """Something with a start and a stop. ``stop`` must be safe to call after a failed start."""

    name: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class Daemon:
    """Holds the config and every component; owns the loop's lifecycle."""

    def __init__(self, config: Config, config_path: Path | None = None,
                 http_host: str | None = None, http_port: int | None = None,
                 overrides: dict[str, Any] | None = None) -> None:
        self.config = config
        self.config_path = config_path
        # CLI flags (--state-dir ...) keep winning over the file across SIGHUP reloads
        self.overrides = dict(overrides or {})
        self.http_host = http_host or config.http.host
        self.http_port = http_port if http_port is not None else config.http.port
        self.started_at = time.time()
        self.commands = CommandRegistry()
        self.events = EventBus()
        # serving code records each finished request here; telemetry reads it
        self.work = WorkMeter()
        self.metrics = CollectorRegistry(auto_describe=True)
        self.notifier = Notifier()
        self.executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(4, (os.cpu_count() or 2) * 2), thread_name_prefix="edgepilot")
        # component -> reason it is not ready (absent or None = ready)
        self.readiness: dict[str, str | None] = {"daemon": "starting"}
        self.services: list[Service] = []
        self.stopping = False
        self._stop_event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Built by the capabilities in attach_capabilities(), in that order. None only before
        # then, or where a capability is switched off (dispatch disabled still has one).
        self.board: Board | None = None
        self.profiles: ProfileManager | None = None
        self.devices: DeviceQueues
        self.backends: BackendSet
        self.models: ModelRegistry
        self.serving: Serving
        self.generator: Generator
        self.dispatcher: Dispatcher
        self.telemetry: TelemetrySampler | None = None
        self.mqtt: MqttService | None = None
        self.http_server: HttpServer | None = None
        Info("edgepilot_build", "edgepilot version", registry=self.metrics).info(
            {"version": __version__})
        self._up = Gauge("edgepilot_up", "1 while the daemon is serving", registry=self.metrics)

    # ---- helpers for components -------------------------------------------------------------
    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("daemon loop not running")
        return self._loop

    async def run_blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking work (sysfs, native inference) off the loop."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def set_ready(self, component: str, reason: str | None = None) -> None:
        """Mark a component ready (reason None) or not ready with an operator-readable reason."""
        self.readiness[component] = reason

    def not_ready_reasons(self) -> dict[str, str]:
        return {k: v for k, v in self.readiness.items() if v}

    @property
    def state_dir(self) -> Path:
        return self.config.state_dir

    @property
    def model_dir(self) -> Path:
        return self.config.model_dir

    def running_loop(self) -> asyncio.AbstractEventLoop | None:
        """The daemon's loop once it runs (None before: CLI use, tests building parts)."""
        return self._loop

    def attach_capabilities(self) -> None:
        """Build every component, in start order (stop is the reverse: MQTT says "offline"
        before the board is restored; models unload before DVFS is put back)."""
        from edgepilot import status
        from edgepilot.dispatch import service as dispatch_service
        from edgepilot.dvfs import energy_policies as energy_service
        from edgepilot.dvfs import service as dvfs_service
        from edgepilot.mqtt import service as mqtt_service
        from edgepilot.serving import service as serving_service
        from edgepilot.telemetry import service as telemetry_service

        self.services.extend(status.attach(self))
        self.services.extend(dvfs_service.attach(self))
        self.services.extend(serving_service.attach(self))
        self.services.extend(dispatch_service.attach(self))
        # the registry loads GGUF models with their plan and counts plan executables in its
        # memory budget; the serving layer runs planned requests: both need the dispatcher,
        # which itself finds model files through the registry
        self.models.dispatcher = self.dispatcher
        self.serving.dispatcher = self.dispatcher
        self.services.extend(telemetry_service.attach(self))
        self.services.extend(mqtt_service.attach(self))
        # SLO pick and power cap: read telemetry, publish events, stop before DVFS restores
        self.services.extend(energy_service.attach(self))

    # ---- lifecycle ----------------------------------------------------------------------------
    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT; return the process exit code."""
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"state dir {self.state_dir} cannot be created ({exc.strerror}); "
                              "point --state-dir or [daemon] state_dir at a writable directory",
                              field="daemon.state_dir") from None
        self._install_signals()
        from edgepilot.http.server import HttpServer

        self.attach_capabilities()
        self.http_server = HttpServer(self, self.http_host, self.http_port)
        await self.http_server.start()
        self.notifier.notify(f"STATUS=starting; HTTP on {self.http_server.url}")
        watchdog = asyncio.create_task(self._watchdog(), name="watchdog")
        started: list[Service] = []
        code = 0
        try:
            for svc in self.services:
                log.info("starting %s", svc.name)
                self.notifier.notify(f"STATUS=starting {svc.name}")
                await svc.start()
                started.append(svc)
            self.set_ready("daemon", None)
            self._up.set(1)
            self.notifier.notify("READY=1", f"STATUS=serving on {self.http_server.url}")
            log.info("edgepilot %s serving on %s", __version__, self.http_server.url)
            await self._stop_event.wait()
        except EdgepilotError as exc:
            log.error("start-up failed: %s", exc.message)
            self.notifier.notify(f"STATUS=start-up failed: {exc.message}")
            code = 1
        except Exception as exc:
            # an unexpected fault still shuts down in order: restore DVFS, say offline
            log.exception("start-up failed unexpectedly")
            self.notifier.notify(f"STATUS=start-up failed: {type(exc).__name__}: {exc}")
            code = 1
        finally:
            self.stopping = True
            self._up.set(0)
            self.notifier.notify("STOPPING=1", "STATUS=stopping")
            await self._shutdown(started)
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog
            self.executor.shutdown(wait=False, cancel_futures=True)
            self.notifier.close()
        return code

    def request_stop(self) -> None:
        if self._stop_event is not None and not self._stop_event.is_set():
            log.info("stop requested")
            self._stop_event.set()

    async def _shutdown(self, started: list[Service]) -> None:
        deadline = time.monotonic() + self.config.daemon.drain_timeout_s
        if self.http_server is not None:
            await self.http_server.stop(timeout=max(0.1, deadline - time.monotonic()))
        for svc in reversed(started):
            # the drain deadline bounds waiting for requests; putting the board back (DVFS
            # restore) and saying "offline" still get a few seconds each after it has passed
            remaining = max(SERVICE_STOP_MIN_S, deadline - time.monotonic())
            try:
                await asyncio.wait_for(svc.stop(), timeout=remaining)
            except TimeoutError:
                log.error("%s did not stop within %.1fs; continuing shutdown", svc.name, remaining)
            except EdgepilotError as exc:  # expected and explained: no stack trace
                log.error("stopping %s: %s; continuing shutdown", svc.name, exc.message)
            except Exception:
                log.exception("stopping %s failed; continuing shutdown", svc.name)

    def _install_signals(self) -> None:
        loop = self.loop
        loop.add_signal_handler(signal.SIGTERM, self.request_stop)
        loop.add_signal_handler(signal.SIGINT, self.request_stop)
        loop.add_signal_handler(signal.SIGHUP, lambda: asyncio.ensure_future(self.reload()))

    async def _watchdog(self) -> None:
        # Pinged from the loop itself, so a loop stuck in blocking code misses pings and
        # systemd restarts us.
        interval = watchdog_interval_s()
        if interval is None:
            return
        while True:
            self.notifier.notify("WATCHDOG=1")
            await asyncio.sleep(interval)

    async def reload(self) -> bool:
        """Re-read the config file; keep the old config when the new one is invalid."""
        self.notifier.notify("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")
        try:
            new = load_config(self.config_path, self.overrides)
            # a token taken out while the API listens beyond loopback: refused like at start
            check_http_exposure(self.http_host, new.http)
            for svc in self.services:
                # what only the running daemon can judge (a profile this board lacks, a model
                # path outside the model dir): refuse the file instead of half-applying it
                check = getattr(svc, "check", None)
                if check is not None:
                    await check(new)
        except EdgepilotError as exc:
            log.error("reload rejected, keeping the running config: %s", exc.message)
            self.events.emit("config.rejected", message=exc.message)
            self.notifier.notify("READY=1", "STATUS=reload rejected; serving with old config")
            return False
        old, self.config = self.config, new
        if (old.http.host, old.http.port) != (new.http.host, new.http.port):
            log.warning("[http] host/port changed; the listener moves only on restart "
                        "(systemctl restart edgepilot)")
        for svc in self.services:
            hook = getattr(svc, "reload", None)
            if hook is not None:
                try:
                    await hook(old, new)
                except EdgepilotError as exc:
                    log.error("%s could not apply the new config: %s", svc.name, exc.message)
        self.events.emit("config.reloaded")
        self.notifier.notify("READY=1", "STATUS=serving (config reloaded)")
        log.info("config reloaded")
        return True
