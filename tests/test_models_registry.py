"""Model registry on a real Daemon object: discovery, verification, budget, keep-alive, queue."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from models_fixtures import gguf_path, make_daemon, mlp_tflite  # noqa: F401 - fixtures

from edgepilot.errors import BusyError, ModelError, NotFoundError
from edgepilot.formats import files
from edgepilot.formats.demo import ensure_demo_models
from edgepilot.lifecycle import Daemon
from edgepilot.serving.devices import DeviceQueue
from edgepilot.serving.registry import ModelRegistry, ModelTooLarge


def mdir(tmp: Path) -> Path:
    (tmp / "models").mkdir(exist_ok=True)
    return tmp / "models"


def events(daemon: Daemon, kind: str) -> list[dict[str, Any]]:
    return [e for e in daemon.events.recent() if e["type"] == kind]


def test_dropped_files_are_named_by_stem_and_config_wins(tmp_path: Path, gguf_path: Path,  # noqa: F811
                                                          mlp_tflite: Path) -> None:  # noqa: F811
    d = make_daemon(tmp_path, models=[{"name": "chat", "file": "tiny.gguf"}])
    shutil.copy(gguf_path, mdir(tmp_path) / "tiny.gguf")
    shutil.copy(mlp_tflite, mdir(tmp_path) / "mlp.tflite")
    (mdir(tmp_path) / "notes.txt").write_text("not a model")
    listing = {m["name"]: m for m in d.models.listing()}
    assert set(listing) == {"chat", "mlp"}
    assert listing["chat"]["kind"] == "gguf" and listing["mlp"]["kind"] == "tflite"
    with pytest.raises(NotFoundError, match="available: chat, mlp"):
        d.models.catalog.entry("tiny")


def test_paths_escaping_the_model_dir_are_refused(tmp_path: Path, gguf_path: Path) -> None:  # noqa: F811
    outside = tmp_path / "outside.gguf"
    shutil.copy(gguf_path, outside)
    d = make_daemon(tmp_path, models=[{"name": "up", "file": "../outside.gguf"},
                                      {"name": "abs", "file": str(outside)},
                                      {"name": "link", "file": "link.gguf"}])
    (mdir(tmp_path) / "link.gguf").symlink_to(outside)
    for name in ("up", "abs", "link"):
        with pytest.raises(ModelError, match="outside the model dir") as err:
            asyncio.run(d.models.load(name))
        assert err.value.field == f"models.{name}.file"
        # a link is told to be one, with where it leads: the operator made it on purpose
        assert ("is a symlink to " + str(outside.resolve()) in err.value.message) == \
            (name == "link")
    assert d.models.loaded == {}


def test_sha256_is_verified_before_load(tmp_path: Path, mlp_tflite: Path) -> None:  # noqa: F811
    shutil.copy(mlp_tflite, mdir(tmp_path) / "mlp.tflite")
    good = files.sha256_of(mdir(tmp_path) / "mlp.tflite")
    d = make_daemon(tmp_path, models=[{"name": "good", "file": "mlp.tflite", "sha256": good},
                                      {"name": "bad", "file": "mlp.tflite", "sha256": "0" * 64}])
    with pytest.raises(ModelError, match="sha256") as err:
        asyncio.run(d.models.load("bad"))
    assert err.value.field == "models.bad.sha256"
    assert {m["name"]: m.get("error") for m in d.models.listing()}["bad"]
    lm = asyncio.run(d.models.load("good"))
    assert str(lm.executable.target) == "tflite/xnnpack/fp32"


def test_gguf_over_budget_is_refused_with_the_numbers(tmp_path: Path, gguf_path: Path) -> None:  # noqa: F811
    shutil.copy(gguf_path, mdir(tmp_path) / "tiny.gguf")
    d = make_daemon(tmp_path, backends={"memory_budget_mb": 8},
                    models=[{"name": "tiny", "file": "tiny.gguf", "n_ctx": 4096}])
    with pytest.raises(ModelTooLarge) as err:
        asyncio.run(d.models.load("tiny"))
    msg = err.value.message
    assert "budget is 8.0 MiB" in msg and "2 x 2 layers x 4096 ctx x 2 kv_heads x 16" in msg
    assert err.value.http_status == 507
    assert d.models.loaded == {}


def test_keep_alive_unloads_and_requests_reload(tmp_path: Path, mlp_tflite: Path) -> None:  # noqa: F811
    shutil.copy(mlp_tflite, mdir(tmp_path) / "mlp.tflite")
    d = make_daemon(tmp_path, models=[{"name": "m", "file": "mlp.tflite", "keep_alive_s": 0}])
    x = np.ones((1, 32), np.float32)

    async def scenario() -> None:
        res = await d.serving.infer("m", {"input": x})
        out, plan = res.outputs, res.plan
        assert plan == "single:tflite/xnnpack/fp32" and out["output"].shape == (1, 32)
        assert await d.models.reap() == ["m"]
        assert "m" not in d.models.loaded
        out2 = (await d.serving.infer("m", {"input": x})).outputs  # reloaded on demand
        np.testing.assert_array_equal(out["output"], out2["output"])

    asyncio.run(scenario())
    assert [e["model"] for e in events(d, "model.loaded")] == ["m", "m"]
    assert [e["reason"] for e in events(d, "model.unloaded")] == ["keep_alive"]


def test_models_in_use_are_not_reaped(tmp_path: Path, mlp_tflite: Path) -> None:  # noqa: F811
    shutil.copy(mlp_tflite, mdir(tmp_path) / "mlp.tflite")
    d = make_daemon(tmp_path, models=[{"name": "m", "file": "mlp.tflite", "keep_alive_s": 0}])

    async def scenario() -> None:
        lm = await d.models.acquire("m")
        assert await d.models.reap() == []
        d.models.release(lm)
        assert await d.models.reap() == ["m"]

    asyncio.run(scenario())


def test_commands_load_list_unload(tmp_path: Path, mlp_tflite: Path) -> None:  # noqa: F811
    shutil.copy(mlp_tflite, mdir(tmp_path) / "mlp.tflite")
    d = make_daemon(tmp_path)

    async def scenario() -> None:
        loaded = await d.commands.execute("model.load", {"name": "mlp"})
        assert loaded["loaded"] and loaded["target"] == "tflite/xnnpack/fp32"
        listing = await d.commands.execute("model.list", {})
        assert listing["models"][0]["loaded"] is True
        gone = await d.commands.execute("model.unload", {"name": "mlp"})
        assert gone == {"name": "mlp", "loaded": False, "was_loaded": True}
        with pytest.raises(NotFoundError):
            await d.commands.execute("model.load", {"name": "ghost"})

    asyncio.run(scenario())
    assert d.commands.get("model.load").mutating and not d.commands.get("model.list").mutating


def test_device_queue_serialises_and_refuses_past_its_limit() -> None:
    async def scenario() -> list[str]:
        q = DeviceQueue("tflite/xnnpack", max_waiting=1)
        order: list[str] = []

        async def job(tag: str) -> None:
            async with q.slot():
                order.append(f"{tag}+")
                await asyncio.sleep(0.05)
                order.append(f"{tag}-")

        first = asyncio.create_task(job("a"))
        await asyncio.sleep(0)  # a holds the device
        second = asyncio.create_task(job("b"))
        await asyncio.sleep(0)  # b waits in line
        with pytest.raises(BusyError, match="max_queue = 1") as err:
            await job("c")
        assert err.value.http_status == 503
        await asyncio.gather(first, second)
        return order

    assert asyncio.run(scenario()) == ["a+", "a-", "b+", "b-"]


def test_demo_models_are_made_once_and_load(tmp_path: Path) -> None:
    entries = ensure_demo_models(tmp_path / "models")
    assert [e.kind for e in entries] == ["gguf", "onnx"]
    for e in entries:
        assert files.sha256_of(tmp_path / "models" / e.file) == e.sha256
    assert ensure_demo_models(tmp_path / "models") == []  # not empty any more
    d = make_daemon(tmp_path)
    d.models.catalog.extra = entries

    async def scenario() -> None:
        for e in entries:
            lm = await d.models.load(e.name)
            assert lm.memory_bytes > 0

    asyncio.run(scenario())


def test_registry_reports_backends(tmp_path: Path) -> None:
    d = make_daemon(tmp_path, backends={"enabled": ["tflite", "llamacpp"]})
    assert isinstance(d.models, ModelRegistry)
    assert d.models.backend_names() == ["tflite", "llamacpp"]


def test_unload_waits_for_requests_holding_the_model(tmp_path: Path) -> None:
    from edgepilot.formats.onnx_gen import mlp_stack

    mlp_stack(mdir(tmp_path) / "m.onnx", widths=(8, 8), batch=1)
    d = make_daemon(tmp_path)
    x = np.ones((1, 8), np.float32)

    async def scenario() -> None:
        lm = await d.models.acquire("m")  # a request that holds the model, not yet on the device
        queue = d.devices.for_target(str(lm.executable.target))
        await queue.acquire()  # another request is on the device
        unload = asyncio.create_task(d.models.unload("m"))
        await asyncio.sleep(0.05)  # the unload is waiting now
        queue.release()
        await asyncio.sleep(0)
        try:  # the held request runs on the model it acquired, never on a closed one
            async with queue.slot():
                out = await d.run_blocking(lm.executable.run, {"x": x})
        finally:
            d.models.release(lm)
        assert out
        assert await unload is True
        assert "m" not in d.models.loaded
        out2 = (await d.serving.infer("m", {"x": x})).outputs  # loaded again on demand
        np.testing.assert_array_equal(next(iter(out.values())), next(iter(out2.values())))

    asyncio.run(scenario())
    assert [e["reason"] for e in events(d, "model.unloaded")] == ["request"]


def test_loading_unknown_names_keeps_nothing_for_them(tmp_path: Path) -> None:
    d = make_daemon(tmp_path)

    async def scenario() -> None:
        for i in range(50):  # client-chosen names over MQTT/HTTP must not grow the registry
            with pytest.raises(NotFoundError):
                await d.commands.execute("model.load", {"name": f"ghost-{i}"})

    asyncio.run(scenario())
    assert d.models._load_locks == {}


def test_max_loaded_models_unloads_the_idle_lru_and_never_one_in_flight(
        tmp_path: Path, mlp_tflite: Path) -> None:  # noqa: F811
    for name in ("a", "b", "c"):
        shutil.copy(mlp_tflite, mdir(tmp_path) / f"{name}.tflite")
    d = make_daemon(tmp_path, serving={"max_loaded_models": 2, "load_wait_s": 0.2})

    async def scenario() -> None:
        await d.models.load("a")
        await d.models.load("b")
        await d.models.acquire("a")  # a used after b: b is the least recently used
        a = d.models.loaded["a"]
        d.models.release(a)
        await d.models.load("c")
        assert set(d.models.loaded) == {"a", "c"}
        # every loaded model has a request in flight: the load waits, then a 503
        held = [await d.models.acquire("a"), await d.models.acquire("c")]
        with pytest.raises(BusyError, match="max_loaded_models is 2") as busy:
            await d.models.load("b")
        assert busy.value.http_status == 503 and busy.value.field == "model"
        assert set(d.models.loaded) == {"a", "c"}
        # one finishing within load_wait_s lets the load go on, unloading that one
        d.models.config.serving.load_wait_s = 30
        waiting = asyncio.create_task(d.models.load("b"))
        await asyncio.sleep(0.1)
        assert not waiting.done() and set(d.models.loaded) == {"a", "c"}
        d.models.release(held[1])
        await asyncio.wait_for(waiting, 30)
        assert set(d.models.loaded) == {"a", "b"}
        d.models.release(held[0])

    asyncio.run(scenario())
    assert [(e["model"], e["reason"]) for e in events(d, "model.unloaded")] \
        == [("b", "max_loaded_models"), ("c", "max_loaded_models")]
