"""uvicorn serving the FastAPI app inside the daemon's own loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Generator

import uvicorn

from edgepilot.errors import ConfigError
from edgepilot.http.api import HttpApi

log = logging.getLogger(__name__)


class _DrainCutFilter(logging.Filter):
    """Drop uvicorn's stack trace for a request the drain deadline cancelled: the shutdown log
    already says the deadline passed, and the trace reads like a crash to an operator."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, asyncio.CancelledError)


logging.getLogger("uvicorn.error").addFilter(_DrainCutFilter())


class _Server(uvicorn.Server):
    # The daemon owns SIGTERM/SIGINT (drain, restore DVFS, notify systemd); uvicorn must not
    # install its own handlers over ours.
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class HttpServer:
    """Binds the socket up front (so port 0 and bind errors are known at start) and serves."""

    def __init__(self, api: HttpApi, host: str, port: int) -> None:
        self.api = api
        self.host = host
        self.port = port
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._sock: socket.socket | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        from edgepilot.http.app import create_app

        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # IPPROTO_TCP named explicitly: asyncio disables Nagle (TCP_NODELAY) only on sockets
        # whose proto says TCP, and accepted sockets inherit the listener's. With proto 0, a
        # response written as headers then body waited for the client's delayed ACK: ~40 ms
        # added to every request on a keep-alive connection.
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise ConfigError(f"cannot bind HTTP on {self.host}:{self.port}: {exc.strerror}; "
                              "choose another [http] port or --port", field="http.port") from None
        sock.listen(128)
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        self._sock = sock
        config = uvicorn.Config(
            create_app(self.api), log_config=None, lifespan="off", access_log=False,
            timeout_graceful_shutdown=int(max(1, self.api.config().daemon.drain_timeout_s)),
            limit_concurrency=None, server_header=False)
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="http")
        while not self._server.started and not self._task.done():
            await asyncio.sleep(0.01)
        if self._task.done():
            self._task.result()
        log.info("HTTP listening on %s", self.url)

    async def stop(self, timeout: float) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout=timeout + 1)
        except TimeoutError:
            self._server.force_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, timeout=2)
        if self._sock is not None:
            self._sock.close()
