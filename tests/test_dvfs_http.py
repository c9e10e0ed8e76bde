"""GET/PUT /v1/profile and the profile.* commands over a real HTTP socket."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
from board_fixtures import fake_board

from edgepilot.config import parse_config
from edgepilot.http.server import HttpServer
from edgepilot.lifecycle import Daemon

__all__ = ["fake_board"]
TOKEN = "s3cret-token"


def test_profile_endpoints(fake_board, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fake = fake_board("mt6989")
    before = fake.files()
    config = parse_config({"daemon": {"sysfs_root": str(fake.root),
                                      "state_dir": str(tmp_path / "state")},
                           "http": {"token": TOKEN, "port": 0}})
    daemon = Daemon(config)
    daemon.attach_capabilities({"dvfs"})
    services = daemon.services

    async def scenario() -> dict[str, Any]:
        await services[0].start()
        server = HttpServer(daemon.http_api(), "127.0.0.1", 0)
        await server.start()
        out: dict[str, Any] = {}
        try:
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
                out["get0"] = (await client.get("/v1/profile")).json()
                out["noauth"] = await client.put("/v1/profile", json={"name": "powersave"})
                auth = {"Authorization": f"Bearer {TOKEN}"}
                out["put"] = await client.put("/v1/profile", json={"name": "powersave"},
                                              headers=auth)
                out["bad"] = await client.put("/v1/profile", json={"name": "warp"}, headers=auth)
                out["extra"] = await client.put("/v1/profile", json={"name": "x", "y": 1},
                                                headers=auth)
                out["get1"] = (await client.get("/v1/profile")).json()
                out["list"] = await client.post("/v1/commands/profile.list", json={})
                out["restore"] = await client.post("/v1/commands/profile.restore", json={},
                                                   headers=auth)
        finally:
            await server.stop(timeout=5)
            await services[0].stop()
        return out

    out = asyncio.run(scenario())
    daemon.executor.shutdown()
    assert out["get0"]["active"] is None and out["get0"]["family"] == "dimensity-9300"
    # a fake root with no [dvfs] nvpmodel: the tool is reported skipped, never looked up
    assert out["get0"]["tools"]["nvpmodel"]["path"] is None
    assert out["get0"]["tools"]["nvpmodel"]["skipped"].startswith("sysfs_root is ")
    # no telemetry in this daemon: the guard says it is not watching
    assert out["get0"]["thermal"]["watching"] is False
    assert out["noauth"].status_code == 401
    assert out["put"].status_code == 200 and out["put"].json()["profile"] == "powersave"
    assert out["bad"].status_code == 404
    err = out["bad"].json()["error"]
    assert err["field"] == "name" and "allowed: balanced, inference, performance, powersave" \
        in err["message"]
    assert out["extra"].status_code == 400
    assert out["get1"]["active"] == "powersave"
    assert out["get1"]["cpu"]["policy4"]["max_khz"] == 1950000
    assert out["list"].status_code == 200
    assert fake.files() == before
