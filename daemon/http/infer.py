"""``POST /v1/infer/{model}``: tensors in, tensors out, for ONNX and TFLite models.

JSON body: ``{"inputs": {NAME: {"data": [...], "dtype": "float32", "shape": [...]}}}``; or a
``.npy`` body (``Content-Type: application/x-npy``) for a model with one input (or the input
named by ``?input=NAME``). The answer is ``{"outputs": {NAME: {"data", "dtype", "shape"}},
"plan": HASH, "latency_ms": ..., "energy_j": ...}``, or ``.npy`` bytes of one output when the
request says ``Accept: application/x-npy`` (plan, latency and energy then travel in
``X-Plan``/``X-Latency-Ms``/``X-Energy-J``). ``energy_j`` is the board energy attributed to the
request (see :meth:`edgepilot.telemetry.work.WorkMeter.end`); null (no ``X-Energy-J``) on a
board without a power sensor.

The model runs through the dispatcher's plan for the request's input shapes when there is one;
otherwise whole on its default target (``plan`` is ``single:<target>``) while a plan for those
shapes is made in the background.
"""

from __future__ import annotations

import io
import json
import logging
import time
from typing import Any

import numpy as np
from fastapi import APIRouter, Request, Response

from edgepilot.errors import BackendError, CommandError, NotFoundError, PlanError
from edgepilot.formats.io import tensor_specs
from edgepilot.serving.registry import ModelRegistry
from edgepilot.formats.tensors import ALLOWED_DTYPES, check_inputs

log = logging.getLogger(__name__)
router = APIRouter()
NPY_TYPES = ("application/x-npy", "application/octet-stream")


def decode_json_inputs(raw: bytes) -> dict[str, np.ndarray]:
    """Parse the JSON request body into arrays, naming the field at fault."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CommandError(f"body is not JSON: {exc}", field="body") from None
    if not isinstance(body, dict) or not isinstance(body.get("inputs"), dict):
        raise CommandError('body must be {"inputs": {NAME: {"data", "dtype", "shape"}}}',
                           field="inputs")
    extra = sorted(set(body) - {"inputs"})
    if extra:
        raise CommandError(f"unknown field '{extra[0]}'", field=extra[0])
    out = {}
    for name, spec in body["inputs"].items():
        field = f"inputs.{name}"
        if not isinstance(spec, dict) or "data" not in spec:
            raise CommandError(f"input {name!r} must be an object with data, dtype, shape",
                               field=field)
        unknown = sorted(set(spec) - {"data", "dtype", "shape"})
        if unknown:
            raise CommandError(f"unknown field '{field}.{unknown[0]}'",
                               field=f"{field}.{unknown[0]}")
        dtype = spec.get("dtype", "float32")
        if dtype not in ALLOWED_DTYPES:
            raise CommandError(f"input {name!r}: dtype {dtype!r} is not allowed; allowed: "
                               f"{', '.join(ALLOWED_DTYPES)}", field=f"{field}.dtype")
        try:
            arr = np.asarray(spec["data"], dtype=dtype)
        except (ValueError, TypeError, OverflowError) as exc:
            raise CommandError(f"input {name!r}: data is not a {dtype} array: {exc}",
                               field=f"{field}.data") from None
        shape = spec.get("shape")
        if shape is not None:
            if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0
                                                    for d in shape)):
                raise CommandError(f"input {name!r}: shape must be a list of non-negative "
                                   "integers", field=f"{field}.shape")
            if int(np.prod(shape)) != arr.size:
                raise CommandError(f"input {name!r}: {arr.size} values do not fill shape "
                                   f"{shape}", field=f"{field}.shape")
            arr = arr.reshape(shape)
        out[str(name)] = arr
    return out


def decode_npy(raw: bytes, name: str) -> dict[str, np.ndarray]:
    try:
        arr = np.load(io.BytesIO(raw), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise CommandError(f"body is not a .npy array: {exc}", field="body") from None
    if str(arr.dtype) not in ALLOWED_DTYPES:
        raise CommandError(f".npy dtype {arr.dtype} is not allowed; allowed: "
                           f"{', '.join(ALLOWED_DTYPES)}", field=f"inputs.{name}.dtype")
    return {name: arr}


def encode_outputs(outputs: dict[str, np.ndarray]) -> dict[str, Any]:
    return {name: {"data": np.asarray(a).ravel().tolist(), "dtype": str(np.asarray(a).dtype),
                   "shape": list(np.asarray(a).shape)} for name, a in outputs.items()}


async def run_model(daemon: Any, name: str, inputs: dict[str, np.ndarray]
                    ) -> tuple[dict[str, np.ndarray], str]:
    """Through the dispatcher's plan when it has one, else whole on the default target."""
    registry: ModelRegistry = daemon.models
    dispatcher = daemon.dispatcher
    if (dispatcher is not None and daemon.config.dispatch.enabled
            and dispatcher.has_plan(name, inputs)):
        try:
            outputs, plan = await dispatcher.infer(name, inputs)
            return outputs, str(plan)
        except (PlanError, BackendError, NotFoundError) as exc:
            # planning profiles with sample inputs and can fail where the request's own
            # shapes run fine; the whole model on its default target is the safe answer
            log.warning("dispatcher could not run %s (%s); running it whole", name,
                        exc.message)
    return await registry.run_tensor(name, inputs)


@router.post("/v1/infer/{model}", summary="Run a tensor model (JSON or .npy)")
async def infer(model: str, request: Request) -> Response:
    daemon = request.app.state.daemon
    registry: ModelRegistry = daemon.models
    resolved = registry.resolve(model)
    if resolved.kind == "gguf":
        raise CommandError(f"model {model!r} is a GGUF language model; use "
                           "POST /v1/chat/completions or /v1/completions", field="model")
    in_specs, _ = await daemon.run_blocking(tensor_specs, resolved.path, resolved.kind)
    raw = await request.body()
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype in NPY_TYPES:
        name = request.query_params.get("input")
        if name is None:
            if len(in_specs) != 1:
                raise CommandError(f"model {model!r} has inputs {[s.name for s in in_specs]}; "
                                   "name one with ?input=NAME or send JSON", field="input")
            name = in_specs[0].name
        inputs = decode_npy(raw, name)
    else:
        inputs = decode_json_inputs(raw)
    check_inputs(in_specs, inputs)
    req = daemon.work.begin(model)
    try:
        outputs, plan = await run_model(daemon, model, inputs)
    except BaseException:  # cancelled too: the request must stop counting as busy
        daemon.work.end(req, ok=False)
        raise
    done = time.monotonic()
    energy_j = daemon.work.end(req, plan=plan, now=done)
    latency_ms = round((done - req.started) * 1000, 3)
    if "application/x-npy" in request.headers.get("accept", ""):
        wanted = request.query_params.get("output") or (next(iter(outputs))
                                                        if len(outputs) == 1 else None)
        if wanted not in outputs:
            raise CommandError(f"name one output with ?output=NAME; outputs: {sorted(outputs)}",
                               field="output")
        buf = io.BytesIO()
        np.save(buf, np.asarray(outputs[wanted]), allow_pickle=False)
        headers = {"X-Plan": plan, "X-Latency-Ms": str(latency_ms), "X-Output-Name": wanted}
        if energy_j is not None:
            headers["X-Energy-J"] = repr(energy_j)
        return Response(buf.getvalue(), media_type="application/x-npy", headers=headers)
    body = {"outputs": encode_outputs(outputs), "plan": plan, "latency_ms": latency_ms,
            "energy_j": energy_j}
    return Response(json.dumps(body), media_type="application/json")
