"""``POST /v1/infer/{model}``: tensors in, tensors out, for ONNX and TFLite models.

JSON body: ``{"inputs": {NAME: {"data": [...], "dtype": "float32", "shape": [...]}}}``; or a
``.npy`` body (``Content-Type: application/x-npy``) for a model with one input (or the input
named by ``?input=NAME``). The answer is ``{"outputs": {NAME: {"data", "dtype", "shape"}},
"plan": HASH, "latency_ms": ..., "energy_j": ...}``, or ``.npy`` bytes of one output when the
request says ``Accept: application/x-npy`` (plan, latency and energy then travel in
``X-Plan``/``X-Latency-Ms``/``X-Energy-J``). ``energy_j`` is the board energy attributed to the
request (see :meth:`edgepilot.telemetry.work.WorkMeter.end`); null (no ``X-Energy-J``) on a
board without a power sensor.

The request is the serving layer's (:class:`edgepilot.serving.core.Serving`): it runs on the
dispatcher's plan for the request's input shapes when there is one, otherwise whole on its
default target (``plan`` is ``single:<target>``) while a plan for those shapes is made in the
background. ``?timeout_ms=`` bounds how long it may wait for its devices (504 after).
"""

from __future__ import annotations

import io
import json
import logging

import numpy as np
from fastapi import APIRouter, Request, Response

from edgepilot.errors import CommandError
from edgepilot.formats.tensor_json import storable, tensors_from_json, tensors_to_json
from edgepilot.formats.tensors import ALLOWED_DTYPES, JSON_DTYPES
from edgepilot.http.api import api_of
from edgepilot.http.bodies import parse_json
from edgepilot.serving.infer_command import infer_decoded
from edgepilot.serving.offload import off_loop

log = logging.getLogger(__name__)
router = APIRouter()
NPY_TYPES = ("application/x-npy", "application/octet-stream")


def decode_json_inputs(raw: bytes) -> dict[str, np.ndarray]:
    """Parse the JSON request body into arrays, naming the field at fault (blocking: called
    off the event loop, since megabytes of JSON lists take a second to turn into arrays)."""
    body = parse_json(raw)
    if not isinstance(body, dict) or not isinstance(body.get("inputs"), dict):
        raise CommandError('body must be {"inputs": {NAME: {"data", "dtype", "shape"}}}',
                           field="inputs")
    extra = sorted(set(body) - {"inputs"})
    if extra:
        raise CommandError(f"unknown field '{extra[0]}'", field=extra[0])
    return tensors_from_json(body["inputs"], "inputs")


def decode_npy(raw: bytes, name: str) -> dict[str, np.ndarray]:
    try:
        arr = np.load(io.BytesIO(raw), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise CommandError(f"body is not a .npy array: {exc}", field="body") from None
    if arr.dtype.kind == "U":  # text (a string input), stored without pickles
        return {name: arr.astype(object)}
    if str(arr.dtype) not in ALLOWED_DTYPES:
        raise CommandError(f".npy dtype {arr.dtype} is not allowed; allowed: "
                           f"{', '.join(ALLOWED_DTYPES)}", field=f"inputs.{name}.dtype")
    return {name: arr}


# The route reads its body itself (JSON parsed off the loop, or .npy bytes), so FastAPI cannot
# derive the request body: documented here for /openapi.json (and the schemathesis suite)
_TENSOR = {"type": "object", "required": ["data"], "additionalProperties": False,
           "properties": {"data": {"description": "values, flat or nested"},
                          "dtype": {"type": "string", "enum": list(JSON_DTYPES)},
                          "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}}}}
INFER_OPENAPI = {
    "parameters": [
        {"name": "timeout_ms", "in": "query", "required": False,
         "description": "how long the request may wait for its devices (504 after)",
         "schema": {"type": "number", "exclusiveMinimum": 0, "maximum": 3_600_000}},
        {"name": "input", "in": "query", "required": False,
         "description": "the input a .npy body is for (models with several inputs)",
         "schema": {"type": "string"}},
        {"name": "output", "in": "query", "required": False,
         "description": "the output answered as .npy (Accept: application/x-npy)",
         "schema": {"type": "string"}}],
    "requestBody": {"required": True, "content": {
        "application/json": {"schema": {
            "type": "object", "required": ["inputs"], "additionalProperties": False,
            "properties": {"inputs": {"type": "object", "additionalProperties": _TENSOR}}}},
        "application/x-npy": {"schema": {"type": "string", "format": "binary"}}}},
}


@router.post("/v1/infer/{model}", summary="Run a tensor model (JSON or .npy)",
             openapi_extra=INFER_OPENAPI)
async def infer(model: str, request: Request) -> Response:
    serving = api_of(request).need_serving()
    resolved = serving.tensor_model(model)
    timeout_ms = request.query_params.get("timeout_ms")
    timeout_s = _timeout_s(timeout_ms)
    raw = await request.body()
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype in NPY_TYPES:
        name = request.query_params.get("input")
        if name is None:
            in_specs = await serving.input_specs(resolved)
            if len(in_specs) != 1:
                raise CommandError(f"model {model!r} has inputs {[s.name for s in in_specs]}; "
                                   "name one with ?input=NAME or send JSON", field="input")
            name = in_specs[0].name
        result = await infer_decoded(serving, resolved, decode_npy, raw, name,
                                     timeout_s=timeout_s)
    else:
        result = await infer_decoded(serving, resolved, decode_json_inputs, raw,
                                     timeout_s=timeout_s)
    outputs, plan = result.outputs, result.plan
    if "application/x-npy" in request.headers.get("accept", ""):
        wanted = request.query_params.get("output") or (next(iter(outputs))
                                                        if len(outputs) == 1 else None)
        if wanted not in outputs:
            raise CommandError(f"name one output with ?output=NAME; outputs: {sorted(outputs)}",
                               field="output")
        buf = io.BytesIO()
        np.save(buf, storable(outputs[wanted]), allow_pickle=False)
        headers = {"X-Plan": plan, "X-Latency-Ms": str(result.latency_ms),
                   "X-Output-Name": wanted}
        if result.energy_j is not None:
            headers["X-Energy-J"] = repr(result.energy_j)
        return Response(buf.getvalue(), media_type="application/x-npy", headers=headers)
    body = {"outputs": tensors_to_json(outputs), "plan": plan,
            "latency_ms": result.latency_ms, "energy_j": result.energy_j}
    return Response(await off_loop(json.dumps, body), media_type="application/json")


def _timeout_s(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        ms = float(text)
    except ValueError:
        ms = -1.0
    if not 0 < ms <= 3_600_000:
        raise CommandError(f"timeout_ms must be a number of milliseconds in (0, 3600000]; got "
                           f"{text!r}", field="timeout_ms")
    return ms / 1000.0
