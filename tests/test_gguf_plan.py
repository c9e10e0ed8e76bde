"""GGUF plans: candidate selection under budgets, real llama.cpp measurement, cache, serving."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edgepilot.config import parse_config
from edgepilot.dispatch.dispatcher import Dispatcher
from edgepilot.dispatch.gguf.plans import GgufDispatch
from edgepilot.dispatch.gguf.select import (
    Candidate,
    Footprint,
    Measurement,
    candidates,
    footprint,
    gpu_layer_candidates,
    select,
    thread_candidates,
)
from edgepilot.errors import PlanError
from edgepilot.formats.gguf_gen import GgufSpec, write_gguf
from edgepilot.formats.gguf_info import COMPUTE_OVERHEAD_BYTES, read_gguf_info
from edgepilot.lifecycle import Daemon

MiB = 2**20
PLAN_KEYS = {"model", "hash", "predicted_ms", "measured_ms", "layers"}
LAYER_KEYS = {"name", "target", "predicted_ms", "measured_ms", "runner_up"}


# ---- pure selection ---------------------------------------------------------------------------
def table(rows: list[tuple[int, int, float, float]]) -> list[Measurement]:
    """(threads, n_gpu_layers, prefill ms/token, decode ms/token) rows."""
    return [Measurement(t, g, p, d) for t, g, p, d in rows]


def gpu_footprints(ms: list[Measurement], per_layer_mib: int) -> dict[Candidate, Footprint]:
    return {m.candidate: Footprint(cpu=100 * MiB, gpu=m.n_gpu_layers * per_layer_mib * MiB)
            for m in ms}


def test_budget_restricts_gpu_layers_to_what_fits() -> None:
    measured = table([(4, 0, 1.0, 20.0), (4, 2, 0.5, 10.0), (4, 4, 0.2, 5.0),
                      (2, 4, 0.3, 6.0)])
    fps = gpu_footprints(measured, per_layer_mib=100)
    # no GPU budget: all four blocks offloaded is fastest
    assert select(measured, fps, {}, 32, 16).chosen.candidate == Candidate(4, 4)
    # 250 MiB of GPU memory: 4 blocks (400 MiB) do not fit, 2 blocks do
    choice = select(measured, fps, {"gpu": 250 * MiB}, 32, 16)
    assert choice.chosen.candidate == Candidate(4, 2)
    assert choice.runner_up is not None and choice.runner_up.candidate == Candidate(4, 0)
    verdicts = {(v["n_threads"], v["n_gpu_layers"]): v for v in choice.verdicts}
    assert not verdicts[(4, 4)]["eligible"]
    assert "gpu needs 400.0 MiB, budget 250.0 MiB" in verdicts[(4, 4)]["reason"]
    assert verdicts[(4, 2)]["eligible"]


def test_choice_weighs_prefill_and_decode_of_the_reference_request() -> None:
    # 1 thread decodes faster, 2 threads prefill much faster: the request length decides
    measured = table([(1, 0, 4.0, 10.0), (2, 0, 1.0, 12.0)])
    fps = gpu_footprints(measured, 0)
    assert select(measured, fps, {}, 32, 16).chosen.n_threads == 2   # 224 ms < 288 ms
    assert select(measured, fps, {}, 1, 64).chosen.n_threads == 1    # 644 ms < 769 ms


def test_ties_prefer_fewer_threads_and_failed_loads_are_skipped() -> None:
    measured = table([(2, 0, 1.0, 5.0), (1, 0, 1.0, 5.0)])
    measured.append(Measurement(4, 0, None, None, "llama.cpp could not load it"))
    choice = select(measured, gpu_footprints(measured, 0), {}, 8, 8)
    assert choice.chosen.n_threads == 1
    failed = next(v for v in choice.verdicts if v["n_threads"] == 4)
    assert failed["eligible"] is False and "could not load" in failed["reason"]


def test_nothing_fits_is_a_plan_error_naming_the_budget() -> None:
    measured = table([(1, 0, 1.0, 5.0)])
    with pytest.raises(PlanError, match=r"cpu needs 100\.0 MiB, budget 50\.0 MiB") as err:
        select(measured, gpu_footprints(measured, 0), {"cpu": 50 * MiB}, 8, 8)
    assert err.value.field == "dispatch.memory_budgets_mb"


def test_candidates_without_gpu_are_cpu_only() -> None:
    assert gpu_layer_candidates(8, gpu=False) == [0]
    assert gpu_layer_candidates(8, gpu=True) == [0, 2, 4, 6, 8]
    assert thread_candidates(8) == [1, 4, 8]
    assert thread_candidates(2, configured=3) == [1, 2, 3]
    assert thread_candidates(8, listed=[3, 3, 1]) == [1, 3]
    assert candidates(4, False, [1, 2]) == [Candidate(1, 0), Candidate(2, 0)]


def test_footprint_moves_blocks_and_their_kv_to_the_gpu(tmp_path: Path) -> None:
    info = read_gguf_info(write_gguf(tmp_path / "m.gguf", GgufSpec(n_layers=4)))
    blocks = info.weights_bytes // 2
    none = footprint(info, blocks, 0, 512, "f16")
    assert none == Footprint(cpu=info.estimate_bytes(512, "f16"), gpu=0)
    half = footprint(info, blocks, 2, 512, "f16")
    moved = (blocks + info.kv_bytes(512, "f16")) // 2
    assert half.gpu == moved + COMPUTE_OVERHEAD_BYTES
    assert half.cpu == none.cpu - moved


# ---- real llama.cpp ---------------------------------------------------------------------------
def config(tmp: Path, **dispatch: Any) -> Any:
    return parse_config({"daemon": {"state_dir": str(tmp / "state"),
                                    "model_dir": str(tmp / "models"), "demo_models": False},
                         "mqtt": {"enabled": False},
                         "dispatch": {"gguf_prompt_tokens": 8, "gguf_decode_tokens": 4,
                                      **dispatch}})


def check_shape(plan: dict[str, Any], n_blocks: int) -> None:
    assert set(plan) >= PLAN_KEYS and len(plan["hash"]) == 10
    assert [lay["name"] for lay in plan["layers"]] == [f"blk.{i}" for i in range(n_blocks)]
    for lay in plan["layers"]:
        assert set(lay) >= LAYER_KEYS
        assert lay["target"] == "llamacpp/cpu/q8_0"
        assert lay["runner_up"] is None  # no other device on a CPU-only build
    assert plan["predicted_ms"] > 0 and plan["measured_ms"] > 0
    assert plan["note"] == (f"this llama.cpp build has no GPU backend: all {n_blocks} blocks on "
                            f"cpu; n_threads {plan['n_threads']} chosen from "
                            f"{sorted({c['n_threads'] for c in plan['candidates']})} by "
                            "measured prefill/decode speed")
    assert plan["n_gpu_layers"] == 0 and plan["gpu_offload"] is False
    assert plan["segments"] == [{"target": "llamacpp/cpu/q8_0", "layers": [0, n_blocks]}]


def test_gguf_plan_measures_caches_and_says_it_is_cpu_only(tmp_path: Path) -> None:
    write_gguf(tmp_path / "models" / "chat.gguf", GgufSpec(n_layers=3))
    cfg = config(tmp_path, gguf_threads=[1, 2])
    md = Dispatcher(cfg).get("chat")
    assert isinstance(md, GgufDispatch)
    plan = md.explain()
    check_shape(plan, 3)
    assert not plan["from_cache"]
    assert {(c["n_threads"], c["n_gpu_layers"]) for c in plan["candidates"]} == {(1, 0), (2, 0)}
    assert all(c["eligible"] and c["decode_ms_per_token"] > 0 for c in plan["candidates"])
    # a new dispatcher (a restart) reads the measurements back instead of measuring
    again = Dispatcher(cfg).plan_for("chat")
    assert again["from_cache"] and again["hash"] == plan["hash"]
    assert again["candidates"] == plan["candidates"]
    # a changed file is a different key: measured again
    write_gguf(tmp_path / "models" / "chat.gguf", GgufSpec(n_layers=3, seed=1))
    assert not Dispatcher(cfg).plan_for("chat")["from_cache"]


def test_cpu_budget_too_small_is_refused_with_the_numbers(tmp_path: Path) -> None:
    write_gguf(tmp_path / "models" / "chat.gguf", GgufSpec())
    cfg = config(tmp_path, gguf_threads=[1], memory_budgets_mb={"cpu": 1})
    with pytest.raises(PlanError, match=r"budget 1\.0 MiB") as err:
        Dispatcher(cfg).plan_for("chat")
    assert err.value.field == "dispatch.memory_budgets_mb"


def test_registry_loads_gguf_with_the_plans_threads(tmp_path: Path) -> None:
    write_gguf(tmp_path / "models" / "chat.gguf", GgufSpec())
    (tmp_path / "models").mkdir(exist_ok=True)

    def daemon() -> Daemon:
        cfg = config(tmp_path, gguf_threads=[1])
        # in this process: the test reads the loaded llama's own thread counts (the worker
        # process path is covered in test_llama_worker.py)
        cfg.backends.llamacpp.isolation = "thread"
        d = Daemon(cfg)
        d.attach_capabilities({"serving", "dispatch"})
        return d

    d = daemon()
    lm = asyncio.run(d.models.load("chat"))
    # no plan yet: llama-cpp-python's default batch threads (every core)
    assert lm.executable.llm.n_threads_batch == (os.cpu_count() or 1)
    asyncio.run(d.models.unload("chat"))
    plan = d.dispatcher.plan_for("chat")
    assert plan["n_threads"] == 1
    # a restarted daemon finds the plan in the cache and loads the model with it
    d2 = daemon()
    lm2 = asyncio.run(d2.models.load("chat"))
    llm = lm2.executable.llm
    assert (llm.n_threads, llm.n_threads_batch) == (1, 1)
    assert lm2.executable.n_gpu_layers == 0
    out = lm2.executable.chat([{"role": "user", "content": "hello"}],
                              max_tokens=2, temperature=0)
    assert out["choices"][0]["message"]["role"] == "assistant"
    asyncio.run(d2.models.close())


def cli(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cfg = tmp / "edgepilot.toml"
    cfg.write_text("[dispatch]\ngguf_prompt_tokens = 8\ngguf_decode_tokens = 4\n"
                   "[mqtt]\nenabled = false\n")
    return subprocess.run(
        [sys.executable, "-m", "edgepilot", "--config", str(cfg), "--state-dir", str(tmp / "st"),
         "--model-dir", str(tmp / "models"), *args],
        capture_output=True, text=True, timeout=240, check=False)


def test_plan_cli_on_the_demo_chat_model(tmp_path: Path) -> None:
    res = cli(tmp_path, "plan", "demo-chat", "--json")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    check_shape(plan, 2)
    assert plan["model"] == "demo-chat"
    text = cli(tmp_path, "plan", "demo-chat")
    assert text.returncode == 0, text.stderr
    assert "no GPU backend: all 2 blocks on cpu" in text.stdout
    assert "(measurements from cache)" in text.stdout
    bench = cli(tmp_path, "bench", "demo-chat")
    assert bench.returncode == 2 and "edgepilot plan demo-chat" in bench.stderr


def test_gguf_plan_over_http_and_commands(tmp_path: Path, daemon_factory: Any) -> None:
    write_gguf(tmp_path / "models" / "chat.gguf", GgufSpec())
    cfg = (f'[daemon]\nmodel_dir = "{tmp_path / "models"}"\ndemo_models = false\n'
           "[dispatch]\ngguf_prompt_tokens = 8\ngguf_decode_tokens = 4\ngguf_threads = [1]\n"
           "[mqtt]\nenabled = false\n")
    d = daemon_factory(cfg).start()
    try:
        status, plan = d.request("GET", "/v1/plan/chat?wait=true")
        assert status == 200, plan
        check_shape(plan, 2)
        status, reply = d.request("POST", "/v1/commands/plan.get", {"model": "chat"})
        assert status == 200 and reply["result"]["hash"] == plan["hash"]
        status, reply = d.request("POST", "/v1/commands/plan.replan", {"model": "chat"})
        assert status == 200 and reply["result"]["n_threads"] == 1
    finally:
        d.stop()


def test_a_clock_event_that_moved_no_profile_leaves_a_gguf_plan_alone(tmp_path: Path) -> None:
    """A thermal report that moved no profile re-predicts only the models whose clocks moved;
    a GGUF plan is not re-timed on clocks, so it is never one of them (it used to fail the
    whole re-prediction: a GGUF plan has no clocks to compare)."""
    write_gguf(tmp_path / "models" / "chat.gguf", GgufSpec())
    d = Dispatcher(config(tmp_path, gguf_threads=[1]))
    plan = d.plan_for("chat")
    assert d.clocks_changed("thermal", only_if_moved=True) is False
    assert not d.clock_replans and d.plan_for("chat")["hash"] == plan["hash"]
    assert d.clocks_changed("profile.applied") is True  # a profile move re-predicts it all
    assert list(d.clock_replans) == ["profile.applied"]
