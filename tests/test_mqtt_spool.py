"""``edgepilot.mqtt.spool_info``: what the spool and seq files in the state dir hold (for doctor),
read from files a real daemon wrote while its broker was away."""

from __future__ import annotations

from pathlib import Path

from mqtt_fixtures import Broker, InProcessDaemon

from edgepilot.mqtt import spool_info


def test_spool_info_on_a_fresh_state_dir(tmp_path: Path) -> None:
    info = spool_info(tmp_path)
    assert info["spool_exists"] is False
    assert info["messages"] == 0 and info["size_bytes"] == 0
    assert info["first_seq"] is None and info["last_seq"] is None
    assert info["seq_recorded"] is None and info["errors"] == []


def test_spool_info_reads_what_the_daemon_spooled(tmp_path: Path) -> None:
    state = tmp_path / "state"
    absent = Broker(tmp_path / "never-started")  # nothing listens on its port
    d = InProcessDaemon(state, absent, mqtt_cfg={"spool": True}).start()
    try:
        seqs = [d.report()["seq"] for _ in range(4)]
        d.daemon.events.emit("model.loaded", name="m")  # an event: spooled, not telemetry
    finally:
        d.stop()
    info = spool_info(state)
    assert info["spool_exists"] is True
    assert info["size_bytes"] == (state / "mqtt-spool.jsonl").stat().st_size > 0
    assert info["messages"] == 5 and info["telemetry_messages"] == 4
    assert (info["first_seq"], info["last_seq"]) == (seqs[0], seqs[-1])
    assert info["seq_recorded"] == seqs[-1]  # a clean stop records the exact last seq
    assert info["unreadable_lines"] == 0 and info["errors"] == []

    # a torn last line (crash mid-write) and a garbled seq file are reported, not raised
    with open(state / "mqtt-spool.jsonl", "a", encoding="ascii") as fh:
        fh.write('{"topic": "edgepilot/dev1/tele')
    (state / "telemetry.seq").write_text("not a number\n")
    info = spool_info(state)
    assert info["messages"] == 5 and info["unreadable_lines"] == 1
    assert info["seq_recorded"] is None
    assert len(info["errors"]) == 1 and "telemetry.seq" in info["errors"][0]
