"""The daemon: one asyncio loop, services started in order and stopped in reverse.

This is the composition root, and only the entry points import it.
:meth:`Daemon.attach_capabilities` builds every component, in the order their constructors
need them, handing each the typed collaborators it uses; each capability's ``attach(...)``
registers its commands (closures over its component) and returns what it built, which the
daemon keeps. Services start in a fixed order of their own (stop is the reverse). HTTP starts
first (so ``/healthz`` answers during start-up, ``/readyz`` says why it is not ready yet),
READY=1 is sent once every service started. SIGTERM/SIGINT stop intake, drain with a
deadline, stop services in reverse order and exit 0; SIGHUP reloads the config (an invalid
one is kept out and logged).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import os
import signal
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from prometheus_client import CollectorRegistry, Gauge, Info

from edgepilot import __version__, config_file
from edgepilot import status as status_capability
from edgepilot.backends.backend_set import BackendSet
from edgepilot.board.board import Board
from edgepilot.command_registry import CommandRegistry
from edgepilot.config import Config, check_http_exposure, load_config
from edgepilot.dispatch import service as dispatch_service
from edgepilot.dispatch.dispatcher import Dispatcher
from edgepilot.dispatch.planning.cache import PlanCache
from edgepilot.dispatch.planning.shared import PlanExchange, fingerprint
from edgepilot.dvfs import service as dvfs_service
from edgepilot.dvfs.energy_policies import EnergyService
from edgepilot.dvfs.manager import ProfileManager
from edgepilot.errors import ConfigError, EdgepilotError
from edgepilot.events import EventBus
from edgepilot.formats.catalog import ModelCatalog
from edgepilot.http.api import HttpApi
from edgepilot.http.server import HttpServer
from edgepilot.mqtt import service as mqtt_service
from edgepilot.mqtt.service import MqttService
from edgepilot.readiness import Readiness
from edgepilot.sdnotify import Notifier, watchdog_interval_s
from edgepilot.serving import service as serving_service
from edgepilot.serving.core import Serving
from edgepilot.serving.devices import DeviceQueues
from edgepilot.serving.generate import Generator
from edgepilot.serving.registry import ModelRegistry
from edgepilot.status import StatusReport
from edgepilot.telemetry import service as telemetry_service
from edgepilot.telemetry.power_history import PowerHistory
from edgepilot.telemetry.sampler import TelemetrySampler
from edgepilot.telemetry.work import WorkMeter

log = logging.getLogger(__name__)
T = TypeVar("T")
SERVICE_STOP_MIN_S = 5.0
# every capability, in the order their services start
CAPABILITIES = ("status", "dvfs", "serving", "dispatch", "telemetry", "mqtt", "energy")


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
        # the board's power as telemetry reads it; serving records each finished request in
        # the work meter, which reads the request's energy off that power
        self.power = PowerHistory()
        self.work = WorkMeter(power=self.power)
        self.metrics = CollectorRegistry(auto_describe=True)
        self.notifier = Notifier()
        self.executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(4, (os.cpu_count() or 2) * 2), thread_name_prefix="edgepilot")
        self.readiness = Readiness()
        self.readiness.set("daemon", "starting")
        self.services: list[Service] = []
        self._stop_event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Built by attach_capabilities(); None where a capability is left out (tests attach
        # a few) and before it ran.
        self.board: Board | None = None
        self.profiles: ProfileManager | None = None
        self.status: StatusReport | None = None
        self.devices: DeviceQueues | None = None
        self.backends: BackendSet | None = None
        self.catalog: ModelCatalog | None = None
        self.models: ModelRegistry | None = None
        self.serving: Serving | None = None
        self.generator: Generator | None = None
        self.dispatcher: Dispatcher | None = None
        self.plan_exchange: PlanExchange | None = None
        self.telemetry: TelemetrySampler | None = None
        self.energy: EnergyService | None = None
        self.mqtt: MqttService | None = None
        self.http_server: HttpServer | None = None
        Info("edgepilot_build", "edgepilot version", registry=self.metrics).info(
            {"version": __version__})
        self._up = Gauge("edgepilot_up", "1 while the daemon is serving", registry=self.metrics)

    # ---- what components are handed -----------------------------------------------------------
    def current_config(self) -> Config:
        """The config in force (components read it when they act: SIGHUP replaces it)."""
        return self.config

    async def run_blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking work (sysfs, native inference) off the loop."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    @property
    def state_dir(self) -> Path:
        return self.config.state_dir

    @property
    def stopping(self) -> bool:
        return self.readiness.stopping

    def running_loop(self) -> asyncio.AbstractEventLoop | None:
        """The daemon's loop once it runs (None before: CLI use, tests building parts)."""
        return self._loop

    def http_url(self) -> str | None:
        return self.http_server.url if self.http_server is not None else None

    def http_api(self) -> HttpApi:
        """What the HTTP routes serve from."""
        def address() -> tuple[str, int]:
            server = self.http_server
            return (server.host, server.port) if server is not None \
                else (self.http_host, self.http_port)

        return HttpApi(config=self.current_config, commands=self.commands,
                       readiness=self.readiness, metrics=self.metrics,
                       started_at=self.started_at, address=address,
                       config_path=self.config_path, serving=self.serving,
                       generator=self.generator, dispatcher=self.dispatcher,
                       telemetry=self.telemetry)

    # ---- composition --------------------------------------------------------------------------
    def attach_capabilities(self, only: Collection[str] | None = None) -> None:
        """Build every component (or those of the capabilities in ``only``: tests), each
        from the ones it needs, and queue their services in start order (stop is the
        reverse: MQTT says "offline" before the board is restored; models unload before DVFS
        is put back)."""
        want = set(CAPABILITIES if only is None else only)
        unknown = want - set(CAPABILITIES)
        if unknown:
            raise ValueError(f"unknown capabilities {sorted(unknown)}; allowed: {CAPABILITIES}")
        cfg, live, run = self.config, self.current_config, self.run_blocking
        events, readiness = self.events, self.readiness
        services: dict[str, Service] = {}
        if want & {"dvfs", "energy"}:
            self.board = Board(cfg.daemon.sysfs_root)
            self.profiles = dvfs_service.make_manager(cfg, self.board, events)
        if "telemetry" in want:
            self.telemetry = telemetry_service.attach(
                self.commands, self.metrics, config=live, board=self.board,
                profiles=self.profiles, work=self.work, power=self.power, events=events,
                readiness=readiness, run_blocking=run, state_dir=cfg.state_dir)
            services["telemetry"] = self.telemetry
        if want & {"serving", "dispatch", "energy"}:
            # what serving and planning share: one queue per device, one instance per
            # runtime, one catalog of model names
            devices = self.devices = DeviceQueues(cfg.http.max_queue, self.running_loop)
            backends = self.backends = BackendSet(
                cfg.backends.options_of, cfg.backends.enabled, cfg.state_dir / "cache",
                emit=events.emit)
            catalog = self.catalog = ModelCatalog(cfg.model_dir, cfg.models)
            if want & {"dispatch", "energy"}:
                self.plan_exchange = self._plan_exchange(want)
                self.dispatcher = Dispatcher(
                    cfg, board=self.board, profiles=self.profiles, catalog=catalog,
                    emit=events.emit, run_blocking=run, backend_set=backends,
                    hold_devices=devices.hold_devices,
                    plan_cache=PlanCache(cfg.state_dir / "plans", shared=self.plan_exchange))
            if "dispatch" in want and self.dispatcher is not None:
                services["dispatch"] = dispatch_service.attach(
                    self.commands, self.dispatcher, events=events, readiness=readiness,
                    run_blocking=run, close_devices=devices.close)
            if "serving" in want:
                parts = serving_service.attach(
                    self.commands, cfg, live=live, catalog=catalog, backends=backends,
                    devices=devices, dispatcher=self.dispatcher, work=self.work,
                    events=events, readiness=readiness, run_blocking=run,
                    executor=self.executor)
                self.models, self.serving = parts.registry, parts.serving
                self.generator, services["serving"] = parts.generator, parts.service
            if "energy" in want and self.profiles is not None and self.dispatcher is not None:
                self.energy = EnergyService(
                    self.profiles, config=live, events=events, readiness=readiness,
                    run_blocking=run, dispatcher=self.dispatcher, sampler=self.telemetry,
                    hold_devices=devices.hold_devices)
                services["energy"] = self.energy
        if "dvfs" in want and self.profiles is not None:
            services["dvfs"] = dvfs_service.attach(
                self.commands, self.profiles, config=live, events=events,
                readiness=readiness, run_blocking=run, sampler=self.telemetry,
                choose_fallback=self.energy.slo.choose_fallback if self.energy else None)
        if "status" in want:
            config_file.attach(self.commands, self.config_path, cfg.state_dir,
                               reload=self.reload, run_blocking=run)
            self.status = status_capability.attach(
                self.commands, started_at=self.started_at, readiness=readiness,
                board=self.board, profiles=self.profiles,
                backend_names=self.backends.names if self.backends is not None else list,
                http_url=self.http_url)
        if "mqtt" in want:
            self.mqtt = mqtt_service.attach(
                cfg, events=events, commands=self.commands, serving=self.serving,
                status=self.status.snapshot if self.status is not None else dict,
                telemetry=self.telemetry, run_blocking=run, plan_exchange=self.plan_exchange,
                plan_parts=self.dispatcher.key_parts if self.dispatcher is not None else None)
            services["mqtt"] = self.mqtt
        self.services.extend(services[name] for name in CAPABILITIES if name in services)

    def _plan_exchange(self, want: set[str]) -> PlanExchange | None:
        """Plans shared with identical boards over the broker ([fleet] share_plans)."""
        cfg = self.config
        share = cfg.fleet.share_plans
        if not (cfg.mqtt.enabled if share is None else share) or "mqtt" not in want \
                or not cfg.mqtt.enabled:
            return None
        return PlanExchange(functools.partial(fingerprint, self.board), emit=self.events.emit,
                            source=cfg.mqtt.device_id, tolerance=cfg.fleet.verify_tolerance)

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
        self.attach_capabilities()
        self.http_server = HttpServer(self.http_api(), self.http_host, self.http_port)
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
            self.readiness.set("daemon", None)
            self._up.set(1)
            self.notifier.notify("READY=1", f"STATUS=serving on {self.http_server.url}")
            log.info("edgepilot %s serving on %s", __version__, self.http_server.url)
            await self._prepare_loads()
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
            self.readiness.stopping = True
            self._up.set(0)
            self.notifier.notify("STOPPING=1", "STATUS=stopping")
            await self._shutdown(started)
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog
            if self.backends is not None:
                self.backends.close_spares()
            self.executor.shutdown(wait=False, cancel_futures=True)
            self.notifier.close()
        return code

    async def _prepare_loads(self) -> None:
        """Once ready (earlier, it would slow the start it is meant to shorten): a spare worker
        and the GGUF headers read for the next load (:meth:`ModelRegistry.prepare_loads`)."""
        if self.models is None:
            return
        try:
            await self.run_blocking(self.models.prepare_loads)
        except EdgepilotError as exc:  # no spare: loads start their own worker, as before
            log.warning("no spare worker: %s", exc.message)

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
        loop = asyncio.get_running_loop()
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
        await self._prepare_loads()  # the reloaded backends' own
        self.events.emit("config.reloaded")
        self.notifier.notify("READY=1", "STATUS=serving (config reloaded)")
        log.info("config reloaded")
        return True
