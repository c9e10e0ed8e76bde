"""Authenticated and mutual-TLS brokers: a real mosquitto with a password file, and one that
requires a client certificate signed by the test CA.

Right credentials connect; wrong ones are reported (log, ``mqtt_connected`` false and
``mqtt_error`` in telemetry) while the daemon keeps sampling and keeps retrying, so fixing the
broker side is enough to get it connected, without a restart.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from mqtt_fixtures import (
    Broker,
    InProcessDaemon,
    Recorder,
    make_client_cert,
    make_test_ca,
    wait_for,
)

BASE = "edgepilot/dev1"
WATCHER = {"username": "watcher", "password": "w-secret"}


@pytest.fixture
def auth_broker(tmp_path: Path) -> Broker:
    b = Broker(tmp_path / "authbroker",
               passwords={"edge": "right-secret", WATCHER["username"]: WATCHER["password"]})
    b.start()
    yield b  # type: ignore[misc]
    b.stop()


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_password_broker_accepts_the_right_credentials(tmp_path: Path, auth_broker: Broker,
                                                       protocol: str) -> None:
    rec = Recorder(auth_broker, [f"{BASE}/status", f"{BASE}/telemetry"], **WATCHER)
    d = InProcessDaemon(tmp_path / "state", auth_broker,
                        mqtt_cfg={"username": "edge", "password": "right-secret",
                                  "protocol": protocol}).start()
    try:
        wait_for(lambda: d.daemon.mqtt.link.connected, what="daemon connected with credentials")
        online = wait_for(lambda: rec.json_on(f"{BASE}/status"), what="status online")
        assert online[-1]["state"] == "online"
        rep = d.report()
        assert rep["mqtt_connected"] is True and "mqtt_error" not in rep
        wait_for(lambda: rep["seq"] in [m["seq"] for m in rec.json_on(f"{BASE}/telemetry")],
                 what="telemetry through the authenticated link")
    finally:
        d.stop()
        rec.close()


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_wrong_password_is_reported_and_retried_until_fixed(
        tmp_path: Path, auth_broker: Broker, protocol: str,
        caplog: pytest.LogCaptureFixture) -> None:
    rec = Recorder(auth_broker, [f"{BASE}/status", f"{BASE}/telemetry"], **WATCHER)
    caplog.set_level(logging.DEBUG, logger="edgepilot.mqtt")
    d = InProcessDaemon(tmp_path / "state", auth_broker,
                        mqtt_cfg={"username": "edge", "password": "wrong",
                                  "protocol": protocol}).start()
    try:
        link = d.daemon.mqtt.link
        # refused again and again: it keeps retrying with backoff
        wait_for(lambda: link.failed_connects >= 3, what="repeated refusals")
        assert not link.connected
        rep = d.report()  # the sampler still works and says why MQTT is down
        assert rep["mqtt_connected"] is False
        assert "refused" in rep["mqtt_error"] and "password" in rep["mqtt_error"].lower()
        errors = [r for r in caplog.records
                  if r.levelno >= logging.ERROR and r.name == "edgepilot.mqtt.link"]
        # said once at ERROR (naming the keys to check), repeats only at DEBUG
        assert len(errors) == 1, [r.getMessage() for r in errors]
        assert "[mqtt] username" in errors[0].getMessage()
        assert rec.json_on(f"{BASE}/status") == []  # never got in
        # the operator fixes the broker's password file: the retrying daemon gets in
        auth_broker.set_passwords({"edge": "wrong", **{WATCHER["username"]: WATCHER["password"]}})
        wait_for(lambda: link.connected, what="connected after the broker accepted the password")
        rep = d.report()
        assert rep["mqtt_connected"] is True and "mqtt_error" not in rep
        # the reports made while refused were buffered and now arrive, in order
        wait_for(lambda: rep["seq"] in [m["seq"] for m in rec.json_on(f"{BASE}/telemetry")],
                 what="buffered and live telemetry")
        seqs = [m["seq"] for m in rec.json_on(f"{BASE}/telemetry")]
        assert seqs == list(range(seqs[0], rep["seq"] + 1))
    finally:
        d.stop()
        rec.close()


# ---- mutual TLS ---------------------------------------------------------------------------
@pytest.fixture
def mtls(tmp_path: Path) -> tuple[Broker, Path, Path, Path]:
    pki = tmp_path / "pki"
    ca, server_cert, server_key = make_test_ca(pki)
    client_cert, client_key = make_client_cert(pki, "edge-dev1")
    b = Broker(tmp_path / "mtlsbroker", tls=(ca, server_cert, server_key),
               require_certificate=True)
    b.start()
    yield b, ca, client_cert, client_key  # type: ignore[misc]
    b.stop()


def test_mutual_tls_connects_with_the_client_certificate(
        tmp_path: Path, mtls: tuple[Broker, Path, Path, Path]) -> None:
    brk, ca, cert, key = mtls
    rec = Recorder(brk, [f"{BASE}/status"])  # the plain listener, to watch
    d = InProcessDaemon(tmp_path / "state", brk,
                        mqtt_cfg={"port": brk.tls_port,
                                  "tls": {"ca_file": str(ca), "cert_file": str(cert),
                                          "key_file": str(key)}}).start()
    try:
        wait_for(lambda: d.daemon.mqtt.link.connected, what="connected over mutual TLS")
        online = wait_for(lambda: rec.json_on(f"{BASE}/status"), what="online over mutual TLS")
        assert online[-1]["state"] == "online"
    finally:
        d.stop()
        rec.close()


def test_mutual_tls_refuses_a_client_without_a_certificate(
        tmp_path: Path, mtls: tuple[Broker, Path, Path, Path],
        caplog: pytest.LogCaptureFixture) -> None:
    brk, ca, _cert, _key = mtls
    rec = Recorder(brk, [f"{BASE}/status"])
    caplog.set_level(logging.DEBUG, logger="edgepilot.mqtt")
    d = InProcessDaemon(tmp_path / "state", brk,
                        mqtt_cfg={"port": brk.tls_port, "tls": {"ca_file": str(ca)}}).start()
    try:
        link = d.daemon.mqtt.link
        wait_for(lambda: link.failed_connects >= 2, what="TLS handshakes refused, retried")
        assert not link.connected
        rep = d.report()
        assert rep["mqtt_connected"] is False
        # the reason names TLS and what to check, not a generic "unreachable"
        assert "tls" in rep["mqtt_error"].lower() and "cert" in rep["mqtt_error"].lower()
        assert rec.json_on(f"{BASE}/status") == []
        warned = [r.getMessage() for r in caplog.records
                  if r.levelno >= logging.WARNING and r.name == "edgepilot.mqtt.link"]
        assert any("[mqtt.tls]" in m for m in warned), warned
    finally:
        d.stop()
        rec.close()


def test_untrusted_broker_certificate_is_reported(tmp_path: Path,
                                                  mtls: tuple[Broker, Path, Path, Path]) -> None:
    brk, _ca, cert, key = mtls
    other_ca, _c, _k = make_test_ca(tmp_path / "other-pki")  # not the CA that signed the broker
    d = InProcessDaemon(tmp_path / "state", brk,
                        mqtt_cfg={"port": brk.tls_port,
                                  "tls": {"ca_file": str(other_ca), "cert_file": str(cert),
                                          "key_file": str(key)}}).start()
    try:
        link = d.daemon.mqtt.link
        wait_for(lambda: link.failed_connects >= 2, what="verification failures, retried")
        rep = d.report()
        assert rep["mqtt_connected"] is False
        assert "ca_file" in rep["mqtt_error"] and "verif" in rep["mqtt_error"].lower()
    finally:
        d.stop()
