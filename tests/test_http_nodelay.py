"""The HTTP server's connections send small writes at once (Nagle off).

A response is written as headers then body; with Nagle's algorithm on, the body waits for the
client's ACK of the headers, which a client on a keep-alive connection delays by up to 40 ms:
every request but a connection's first took ~45 ms longer (measured: 48 ms for a 0.5 ms
inference). asyncio turns Nagle off only on sockets whose proto says TCP.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from edgepilot.config import parse_config
from edgepilot.http.server import HttpServer
from edgepilot.lifecycle import Daemon


def test_every_accepted_connection_has_nagle_off(tmp_path: Path) -> None:
    d = Daemon(parse_config({"daemon": {"state_dir": str(tmp_path), "demo_models": False},
                             "mqtt": {"enabled": False}}))
    d.attach_capabilities({"status"})

    async def scenario() -> list[int]:
        server = HttpServer(d.http_api(), "127.0.0.1", 0)
        await server.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            for _ in range(2):  # keep-alive: the same connection twice
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                await writer.drain()
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                await reader.readexactly(length)
            assert server._server is not None
            flags = [c.transport.get_extra_info("socket").getsockopt(
                         socket.IPPROTO_TCP, socket.TCP_NODELAY)
                     for c in server._server.server_state.connections]
            writer.close()
            return flags
        finally:
            await server.stop(1.0)

    flags = asyncio.run(scenario())
    assert flags and all(flags), flags
