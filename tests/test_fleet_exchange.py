"""The checks a shared plan passes before a board uses it (dispatch/planning/shared.py), on a
plan a real dispatcher made: the fingerprint separates board kinds and DVFS profiles, a plan
whose figures do not hold here is refused, malformed messages are one event each."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from board_fixtures import build_tree
from plan_reasons import planned_here

from edgepilot.board.board import Board
from edgepilot.config import parse_config
from edgepilot.dispatch.dispatcher import Dispatcher
from edgepilot.dispatch.model_dispatch import ModelDispatch
from edgepilot.dispatch.planning.cache import PlanCache
from edgepilot.dispatch.planning.shared import PlanExchange, fingerprint, signature_segment
from edgepilot.formats.onnx_gen import mlp_stack

PARTS = {"profile": "balanced", "runtimes": {"onnxruntime": "1.0"}, "edgepilot": "0.1.0"}


def test_fingerprint_is_the_board_kind_runtimes_and_profile(tmp_path: Path) -> None:
    orin1, orin2 = build_tree(tmp_path / "o1", "orin"), build_tree(tmp_path / "o2", "orin")
    rpi = build_tree(tmp_path / "r", "rpi5")
    try:
        fp = fingerprint(Board(orin1.root), PARTS)
        assert fingerprint(Board(orin2.root), PARTS) == fp
        assert fingerprint(Board(rpi.root), PARTS) != fp
        assert fingerprint(Board(orin2.root), {**PARTS, "profile": "powersave"}) != fp
        assert fingerprint(Board(orin2.root), {**PARTS, "runtimes": {"onnxruntime": "1.1"}}) != fp
    finally:
        for fake in (orin1, orin2, rpi):
            fake.close()


class Recorded:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def __call__(self, kind: str, **fields: Any) -> None:
        self.events.append({"type": kind, **fields})


def published_plan(tmp_path: Path, widths: tuple[int, ...] = (32, 64, 32), batch: int = 2,
                   **dispatch: Any) -> tuple[dict[str, Any], Dispatcher]:
    """Plan a real model with a dispatcher whose exchange captures what it publishes."""
    models = tmp_path / "models"
    models.mkdir()
    mlp_stack(models / "mlp.onnx", widths=widths, batch=batch)
    cfg = parse_config({"daemon": {"state_dir": str(tmp_path / "s1"), "model_dir": str(models),
                                   "demo_models": False},
                        "dispatch": {"kernel_corpus": False, "profile_runs": 3, **dispatch}})
    out: list[bytes] = []
    exchange = PlanExchange(lambda parts: "f" * 16, emit=Recorded(), wait_s=0)
    exchange.connect(lambda suffix, payload: out.append(payload))
    d = Dispatcher(cfg, plan_cache=PlanCache(tmp_path / "s1" / "plans", shared=exchange))
    d.plan_for("mlp")
    assert len(out) == 1
    return json.loads(out[0]), d


@pytest.fixture
def doc(tmp_path: Path) -> dict[str, Any]:
    return published_plan(tmp_path)[0]


def offer(doc: Any, *, sha: str | None = None, raw: bytes | None = None
          ) -> tuple[PlanExchange, Recorded]:
    emit = Recorded()
    ex = PlanExchange(lambda parts: "f" * 16, emit=emit, wait_s=0)
    sig = signature_segment(doc["signature"]) if isinstance(doc, dict) else "x"
    sha = sha or (doc["model_sha256"] if isinstance(doc, dict) else "0" * 64)
    ex.offer(f"p/fleet/plans/{'f' * 16}/{sha}/{sig}", "f" * 16, sha, sig,
             raw if raw is not None else json.dumps(doc).encode())
    return ex, emit


def test_a_sound_plan_is_found_and_adopted_when_its_figures_hold(doc: dict[str, Any]) -> None:
    ex, emit = offer(doc)
    got = ex.find(PARTS, doc["model_sha256"], doc["signature"], doc["layers"], doc["targets"])
    assert got == doc and not emit.events
    segs = [(s["target"], *s["layers"]) for s in doc["plan"]["segments"]]
    ms = doc["plan"]["measured_ms"]
    assert ex.adopt(doc, "mlp", segs, ms * 1.05, [t * 0.95 for t in doc["segment_ms"]], 0.1)
    assert [e["type"] for e in emit.events] == ["plan.adopted"]
    assert emit.events[0]["planning_s"] == doc["planning_s"]
    # 10% is the bound: 20% slower end to end, or one segment, is not this board's plan
    assert not ex.adopt(doc, "mlp", segs, ms * 1.2, doc["segment_ms"], 0.1)
    assert not ex.adopt(doc, "mlp", segs, ms, [t * 1.2 for t in doc["segment_ms"]], 0.1)
    assert [e["type"] for e in emit.events] == ["plan.adopted", "plan.rejected",
                                               "plan.rejected"]
    assert emit.events[1]["reason"].startswith("verification: end to end")
    assert emit.events[2]["reason"].startswith("verification: segment 0")
    # a timing that misses is taken once more, and the faster of the two is compared: load
    # from other processes only slows a run; a plan that is slower twice is still refused
    again = [(ms, list(doc["segment_ms"]), [])]
    assert ex.adopt(doc, "mlp", segs, ms * 1.5, doc["segment_ms"], 0.1,
                    retime=lambda: again.pop())
    assert not again and emit.events[-1]["type"] == "plan.adopted"
    assert not ex.adopt(doc, "mlp", segs, ms * 1.5, doc["segment_ms"], 0.1,
                        retime=lambda: (ms * 1.3, list(doc["segment_ms"]), []))
    assert emit.events[-1]["reason"].startswith("verification: end to end")
    # the publisher's fastest run is compared with this board's: two medians taken under
    # different loads may differ by more than the tolerance while the fastest runs agree
    fastest = doc["fastest_ms"]
    # (the fastest runs come from another timing than measured_ms: no order between them)
    assert len(fastest) == 1 + len(doc["segment_ms"]) and all(f > 0 for f in fastest)
    assert ex.adopt(doc, "mlp", segs, ms * 1.5, doc["segment_ms"], 0.1,
                    fastest=[f * 1.05 for f in fastest])
    assert not ex.adopt(doc, "mlp", segs, ms, doc["segment_ms"], 0.1,
                        fastest=[f * 1.3 for f in fastest])
    assert "fastest run" in emit.events[-1]["reason"]


@pytest.mark.parametrize("change, reason", [
    (lambda d: d.update(format=99), "format 99"),
    (lambda d: d.update(fingerprint="0" * 16), "fingerprint"),
    (lambda d: d["plan"]["segments"].pop(), "not a plan"),
    (lambda d: d["profile"].update(cells="x"), "not a plan"),
    (lambda d: d.update(segment_ms=[-1.0]), "not a plan"),
    (lambda d: d.update(fastest_ms=[0.0]), "not a plan"),
    (lambda d: d.update(layers="all"), "layers must be"),
])
def test_a_malformed_plan_is_one_event_and_never_found(doc: dict[str, Any], change: Any,
                                                       reason: str) -> None:
    change(doc)
    ex, emit = offer(doc)
    assert [e["type"] for e in emit.events] == ["plan.rejected"]
    assert emit.events[0]["reason"].startswith(reason), emit.events[0]["reason"]
    assert ex.find(PARTS, doc["model_sha256"], str(doc["signature"]), ["x"], ["y"]) is None
    assert len(emit.events) == 1


def test_not_json_and_wrong_sha_and_missing_target(doc: dict[str, Any]) -> None:
    assert offer(doc, raw=b"\xff{")[1].events[0]["reason"].startswith("not JSON")
    assert offer(doc, sha="a" * 64)[1].events[0]["reason"].startswith("model_sha256")
    ex, emit = offer(doc)
    assert ex.find(PARTS, doc["model_sha256"], doc["signature"], doc["layers"],
                   ["tflite/cpu/fp32"]) is None
    assert emit.events[0]["reason"].startswith("names targets this board lacks")
    # refused once: the next lookup neither finds it nor reports it again
    assert ex.find(PARTS, doc["model_sha256"], doc["signature"], doc["layers"],
                   doc["targets"]) is None
    assert len(emit.events) == 1
    ex, emit = offer(doc)
    assert ex.find(PARTS, doc["model_sha256"], doc["signature"], doc["layers"][:-1],
                   doc["targets"]) is None
    assert emit.events[0]["reason"].startswith("layer boundaries differ")


def second_board(tmp_path: Path, first: Dispatcher, ex: PlanExchange, state: str) -> Dispatcher:
    """Another board of the kind: the same config, its own state dir, ``ex`` its exchange."""
    ex.tolerance = 50.0  # timing noise of a shared CI machine is not what this checks
    cfg = first.config.model_copy(update={"daemon": first.config.daemon.model_copy(
        update={"state_dir": tmp_path / state})})
    return Dispatcher(cfg, plan_cache=PlanCache(tmp_path / state / "plans", shared=ex))


def test_a_second_dispatcher_adopts_instead_of_measuring(tmp_path: Path) -> None:
    doc, first = published_plan(tmp_path)
    ex, emit = offer(doc)
    published: list[bytes] = []
    ex.connect(lambda suffix, payload: published.append(payload))
    second = second_board(tmp_path, first, ex, "s2")
    body = second.plan_for("mlp")
    assert body["reason"] == "fleet" and body["from_cache"]
    assert body["segments"] == doc["plan"]["segments"]
    assert [e["type"] for e in emit.events] == ["plan.adopted"] and not published
    # a whole-file plan is adopted on the published layer names, the model not cut; a replan
    # cuts it, and this board's layers are the published ones
    md = second.latest("mlp")
    assert isinstance(md, ModelDispatch) and md.part is not None
    assert md.part.make_real is not None and not md.part.nodes
    md.replan("command", force=True)
    assert md.part.make_real is None and md.part.nodes
    assert [lay.name for lay in md.part.layers] == doc["layers"]
    assert [e["type"] for e in emit.events] == ["plan.adopted"]


def test_a_plan_its_digests_vouch_for_builds_no_reference(tmp_path: Path) -> None:
    """A whole-file plan on a target other than the reference: when this board's outputs of
    the plan hash as the publisher's did on the same inputs, its output error is the
    published one and the fp32 reference is not built (made later only if asked for)."""
    # int8 is several times faster than fp32 on this MLP: the plan is int8's whole file
    doc, first = published_plan(tmp_path, widths=(256, 1024, 1024, 256), batch=8,
                                tolerance=0.1,
                                targets=["onnxruntime/cpu/fp32", "onnxruntime/cpu/int8"])
    assert [s["target"] for s in doc["plan"]["segments"]] == ["onnxruntime/cpu/int8"]
    assert doc["profile"]["reference"] == "onnxruntime/cpu/fp32"
    assert len(doc["inputs_sha256"]) == len(doc["outputs_sha256"]) == 64
    error = doc["plan"]["error"]
    assert 0 < error < 0.1

    def adopt(published: dict[str, Any], state: str) -> ModelDispatch:
        ex, emit = offer(published)
        board = second_board(tmp_path, first, ex, state)
        body = board.plan_for("mlp")
        assert body["reason"] == "fleet" and [e["type"] for e in emit.events] == ["plan.adopted"]
        md = board.latest("mlp")
        assert isinstance(md, ModelDispatch) and md.plan is not None
        return md

    md = adopt(doc, "s2")
    assert not md.check.reference_made and md.plan.error == error  # vouched: nothing built
    assert md.compiled is not None
    assert md.check_error(md.compiled) == pytest.approx(error, rel=1e-6)  # the reference, now
    assert md.check.reference_made
    # one bit of the outputs otherwise: the reference is built and the error measured here
    other = copy.deepcopy(doc)
    other["outputs_sha256"] = ("0" if doc["outputs_sha256"][0] != "0" else "1") + \
        doc["outputs_sha256"][1:]
    md = adopt(other, "s3")
    assert md.check.reference_made and md.plan.error == pytest.approx(error, rel=1e-6)
    # other calibration inputs: the digest says nothing here, the reference is built first
    other = copy.deepcopy(doc)
    other["inputs_sha256"] = "0" * 64
    md = adopt(other, "s4")
    assert md.check.reference_made and md.plan.error == pytest.approx(error, rel=1e-6)


def test_published_layer_names_this_file_does_not_cut_are_refused(tmp_path: Path) -> None:
    doc, first = published_plan(tmp_path)
    assert len(doc["plan"]["segments"]) == 1  # the whole file, adopted without cutting it
    # names that are not this file's operators: refused before use (one event), measured here
    alien = copy.deepcopy(doc)
    alien["layers"][1] = "L1:Add:no_such_node"
    ex, emit = offer(alien)
    body = second_board(tmp_path, first, ex, "s2").plan_for("mlp")
    assert planned_here(body["reason"]) and not body["from_cache"]
    assert [e["type"] for e in emit.events] == ["plan.rejected"]
    assert emit.events[0]["reason"].startswith("layer boundaries differ")
    # this file's operators, in order, but cut finer than this board cuts it: served whole as
    # published, refused (one event) when a replan needs the layers, then measured here
    finer = copy.deepcopy(doc)
    finer["layers"][2:2] = ["L2:Relu:relu0_5_node"]
    finer["layers"][3] = "L3" + finer["layers"][3][2:]
    finer["profile"]["cells"][2:2] = [finer["profile"]["cells"][1]]
    finer["plan"]["layers"][2:2] = [finer["plan"]["layers"][1]]
    finer["plan"]["segments"][0]["layers"] = [0, 4]
    ex, emit = offer(finer)
    second = second_board(tmp_path, first, ex, "s3")
    assert second.plan_for("mlp")["reason"] == "fleet"
    md = second.latest("mlp")
    assert isinstance(md, ModelDispatch)
    changed, plan = md.replan("command", force=True)
    assert changed and planned_here(plan.reason) and len(plan.layers) == len(doc["layers"])
    assert [e["type"] for e in emit.events] == ["plan.adopted", "plan.rejected"]
    assert emit.events[1]["reason"].startswith("layer boundaries differ")
    # what is published now for the file is this board's own plan, measured on its own cut
    assert ex.peek(PARTS, doc["model_sha256"], doc["signature"])["layers"] == doc["layers"]


def test_the_mqtt_side_reads_only_plan_topics_and_refuses_oversize_ones() -> None:
    import asyncio

    from edgepilot.mqtt.plan_share import PlanShare

    emit = Recorded()
    ex = PlanExchange(lambda parts: "f" * 16, emit=emit, wait_s=0)
    share = PlanShare(ex, "p", parts=dict, run_blocking=asyncio.to_thread, max_bytes=100)
    assert not share.on_message("p/dev1/cmd/status", b"{}")  # a command: not ours
    assert share.on_message(f"p/fleet/plans/{'f' * 16}/{'0' * 64}/x", b"{" * 101)
    assert share.on_message("p/fleet/plans/only/two", b"{}")
    assert [e["reason"].split(",")[0] for e in emit.events] == [
        "101 bytes", "not a plan topic: <prefix>/fleet/plans/<fingerprint>/<model sha256>/"
                     "<signature>"]
