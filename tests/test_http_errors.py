"""Every HTTP error in the one documented shape, over real HTTP to a real daemon (issue 11).

Holes 1, 5 and 9 of the hardening issue: JSON nested deeper than the parser recurses (a plain
500 before), errors Starlette/FastAPI raise themselves (404, 405, unreadable bodies, validation
errors; ``{"detail": ...}`` before), a chunked over-limit body on ``/v1/chat/completions`` (a
400 ``detail`` before), and ``/v1/config`` reporting the port actually bound (8470 before).
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_proc import DaemonProcess
from models_fixtures import module_tmp  # noqa: F401 - fixture

from edgepilot.formats.onnx_gen import mlp_stack

TOKEN = "errors-token-1234"
LIMIT = 4096
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ERROR_KEYS = {"code", "message", "field", "type", "param"}


@pytest.fixture(scope="module")
def daemon(module_tmp: Path) -> Iterator[DaemonProcess]:  # noqa: F811
    models = module_tmp / "models"
    models.mkdir()
    mlp_stack(models / "mlp.onnx", widths=(8, 8), batch=1)
    d = DaemonProcess(module_tmp, "[mqtt]\nenabled = false\n[daemon]\ndemo_models = false\n"
                                  f'[http]\nmax_body_bytes = {LIMIT}\ntoken = "{TOKEN}"\n'
                                  "[dispatch]\nenabled = false\n",
                      extra_args=["--model-dir", str(models)])
    d.start()
    d.wait_for("/readyz", timeout=120)
    yield d
    assert d.stop() == 0


def raw_request(d: DaemonProcess, method: str, path: str, body: bytes | Iterator[bytes] | None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """One request through http.client (urllib cannot send chunked bodies or odd methods)."""
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=60)
    try:
        chunked = body is not None and not isinstance(body, bytes)
        conn.request(method, path, body=body, headers=headers or {}, encode_chunked=chunked)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def check_error(status: int, headers: dict[str, str], raw: bytes, want_status: int,
                want_code: str | None = None) -> dict[str, Any]:
    """The body is ``{"error": {code, message, field, type, param}}`` and nothing else."""
    assert status == want_status, (status, raw[:500])
    assert headers.get("content-type", "").startswith("application/json"), headers
    body = json.loads(raw)
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == ERROR_KEYS, err
    assert isinstance(err["message"], str) and err["message"], err
    if want_code is not None:
        assert err["code"] == want_code, err
    return dict(err)


def test_unknown_route_is_404_in_the_error_shape(daemon: DaemonProcess) -> None:
    err = check_error(*raw_request(daemon, "GET", "/v2/nothing-here", None), 404, "not_found")
    assert "/v2/nothing-here" in err["message"] and err["field"] == "path"


def test_wrong_method_is_405_in_the_error_shape_with_allow(daemon: DaemonProcess) -> None:
    status, headers, raw = raw_request(daemon, "DELETE", "/healthz", None)
    err = check_error(status, headers, raw, 405, "method_not_allowed")
    assert "GET" in headers.get("allow", ""), headers
    assert "DELETE" in err["message"] and err["field"] == "method"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/commands/status",
                                  "/v1/infer/mlp", "/v1/completions"])
def test_a_body_that_is_not_utf8_is_400_in_the_error_shape(daemon: DaemonProcess,
                                                          path: str) -> None:
    body = b'{"model": "\xff\xfe\xfa"}'
    err = check_error(*raw_request(daemon, "POST", path, body,
                                   {"Content-Type": "application/json", **AUTH}), 400)
    assert err["field"] == "body" and err["code"] == "bad_request", err


@pytest.mark.parametrize("path", ["/v1/infer/mlp", "/v1/commands/status",
                                  "/v1/chat/completions"])
def test_json_nested_deeper_than_the_parser_recurses_is_400(daemon: DaemonProcess,
                                                           path: str) -> None:
    # 1,500 deep: past Python's default recursion limit (1,000), inside the body limit;
    # refused before any parser (FastAPI's on the OpenAI routes) goes down that far
    deep = b"[" * 1500 + b"]" * 1500
    status, headers, raw = raw_request(daemon, "POST", path, b'{"inputs": ' + deep + b"}",
                                       {"Content-Type": "application/json", **AUTH})
    err = check_error(status, headers, raw, 400, "bad_request")
    assert err["field"] == "body" and "nested more than 256 levels" in err["message"], err
    # the daemon is still answering
    assert daemon.request("GET", "/healthz")[0] == 200
    # Ollama's routes too, in Ollama's error shape; as deep as a tensor gets is parsed
    status, _, raw = raw_request(daemon, "POST", "/api/chat", deep,
                                 {"Content-Type": "application/json"})
    assert status == 400 and "nested more than 256 levels" in json.loads(raw)["error"], raw
    shallow = b'{"inputs": {"x": ' + b"[" * 8 + b"0.5" + b"]" * 8 + b"}}"
    status, _, raw = raw_request(daemon, "POST", path, shallow,
                                 {"Content-Type": "application/json", **AUTH})
    assert status != 500 and b"nested" not in raw, raw[:300]


@pytest.mark.parametrize(("method", "path", "body"), [
    ("POST", "/v1/chat/completions", {"messages": 5}),
    ("POST", "/v1/completions", {"model": "x", "prompt": "p", "max_tokens": "many"}),
    ("PUT", "/v1/profile", {"nope": 1}),
    ("GET", "/v1/plan/mlp?wait=perhaps", None),
    ("POST", "/v1/chat/completions", [1, 2, 3]),
])
def test_validation_errors_of_every_kind_are_400_in_the_error_shape(
        daemon: DaemonProcess, method: str, path: str, body: Any) -> None:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **AUTH} if data is not None else AUTH
    err = check_error(*raw_request(daemon, method, path, data, headers), 400, "bad_request")
    assert err["field"], err


def test_a_chunked_body_over_the_limit_is_413_in_the_error_shape(daemon: DaemonProcess) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"model": "chat", "messages": [{"role": "user", "content": "'
        for _ in range(4):
            yield b"x" * 1500  # no Content-Length: the limit is found while reading
        yield b'"}]}'

    for path in ("/v1/chat/completions", "/v1/commands/status", "/v1/infer/mlp"):
        err = check_error(*raw_request(daemon, "POST", path, chunks(),
                                       {"Content-Type": "application/json", **AUTH}),
                          413, "payload_too_large")
        assert str(LIMIT) in err["message"] and err["field"] == "body", err


def test_a_declared_length_over_the_limit_is_413_in_the_error_shape(
        daemon: DaemonProcess) -> None:
    check_error(*raw_request(daemon, "POST", "/v1/chat/completions", b"x" * (LIMIT + 1),
                             {"Content-Type": "application/json"}), 413, "payload_too_large")


def test_plan_route_needs_the_token_when_one_is_set(daemon: DaemonProcess) -> None:
    err = check_error(*raw_request(daemon, "GET", "/v1/plan/mlp", None), 401, "unauthorized")
    assert err["field"] == "authorization"
    # with the token: 202 with the progress (planning in the background), never a wait
    status, headers, raw = raw_request(daemon, "GET", "/v1/plan/mlp", None, AUTH)
    assert status in (200, 202), raw[:300]
    if status == 202:
        assert json.loads(raw)["state"] == "planning" and headers["retry-after"] == "1"
    # the plan.get command can start planning too: the same guard
    err = check_error(*raw_request(daemon, "POST", "/v1/commands/plan.get",
                                   json.dumps({"model": "mlp"}).encode(),
                                   {"Content-Type": "application/json"}), 401, "unauthorized")


def test_config_reports_the_port_run_chose(daemon: DaemonProcess) -> None:
    assert daemon.port != 8470
    status, body = daemon.request("GET", "/v1/config")
    assert status == 200
    assert body["config"]["http"]["port"] == daemon.port
    assert body["config"]["http"]["token"] == "***"


def test_a_generation_body_over_its_own_limit_is_413_before_parsing(tmp_path: Path) -> None:
    """Chat bodies are parsed by FastAPI on the loop: they are bounded far below the tensor
    limit (no prompt of megabytes fits a context), so a huge one never stalls the loop."""
    from edgepilot.http.app import GENERATION_MAX_BODY

    d = DaemonProcess(tmp_path, "[mqtt]\nenabled = false\n[daemon]\ndemo_models = false\n")
    d.start()
    try:
        big = b'{"model": "m", "prompt": "' + b"x" * GENERATION_MAX_BODY + b'"}'
        err = check_error(*raw_request(d, "POST", "/v1/completions", big,
                                       {"Content-Type": "application/json"}), 413,
                          "payload_too_large")
        assert str(GENERATION_MAX_BODY) in err["message"] and "context" in err["message"]
        # the same size is fine for tensors (up to [http] max_body_bytes): refused for the
        # model, not the size
        status, _, _ = raw_request(d, "POST", "/v1/infer/none", big,
                                   {"Content-Type": "application/json"})
        assert status == 404
    finally:
        assert d.stop() == 0
