"""The ``infer`` command: a tensor model run through the command registry (MQTT and HTTP).

``{"model": NAME, "inputs": {NAME: {"data", "dtype", "shape"}}, "timeout_ms": N}`` (the
``/v1/infer`` JSON shape plus the model name) answers ``{"outputs": {NAME: {"data", "dtype",
"shape"}}, "plan", "latency_ms", "energy_j"}``. The MQTT transport's binary branch (an ``.npz``
payload with content type ``application/x-npz``) uses :func:`infer_npz` for the same request
with the tensors kept binary both ways.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edgepilot.command_registry import CommandRegistry, validation_to_command_error
from edgepilot.errors import CommandError
from edgepilot.formats.files import ResolvedModel
from edgepilot.formats.tensor_json import (
    tensors_from_json,
    tensors_from_npz,
    tensors_to_json,
    tensors_to_npz,
)
from edgepilot.serving.core import InferResult, Serving, Tensors
from edgepilot.serving.offload import off_loop

NPZ_CONTENT_TYPE = "application/x-npz"


class InferParams(BaseModel):
    """Params of ``infer``: the model, its inputs as JSON tensors, an optional deadline."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$",
                       description="Tensor model name (ONNX or TFLite; see model.list).")
    inputs: dict[str, Any] = Field(
        default_factory=dict,
        description='Input tensors: {NAME: {"data": [...], "dtype": "float32", "shape": [...]}}.')
    timeout_ms: float | None = Field(
        None, gt=0, le=3_600_000,
        description="How long the request may wait for its devices before it is refused.")


async def infer_decoded(serving: Serving, model: ResolvedModel,
                        decode: Callable[..., Tensors], *args: Any,
                        timeout_s: float | None = None) -> InferResult:
    """Decode a request's inputs off the loop (``decode(*args)``, bounded) and serve it.

    The caller resolves ``model`` first (``serving.tensor_model``), so an unknown or GGUF
    model is refused before any tensor is decoded. HTTP and both MQTT forms come here.
    """
    inputs = await off_loop(decode, *args)
    return await serving.infer(model.name, inputs, timeout_s=timeout_s, model=model)


def _timeout_s(params: InferParams) -> float | None:
    return None if params.timeout_ms is None else params.timeout_ms / 1000.0


async def serve(serving: Serving, params: InferParams) -> InferResult:
    """Run a JSON request on the serving layer.

    The model is resolved first, so an unknown or GGUF model is refused before any tensor is
    decoded.
    """
    return await infer_decoded(serving, serving.tensor_model(params.model), tensors_from_json,
                               params.inputs, "inputs", timeout_s=_timeout_s(params))


def npz_params(model: str | None, timeout_ms: str | None) -> InferParams:
    """Params of a binary request, from its MQTT 5 user properties (``model``, ``timeout_ms``)."""
    if model is None:
        raise CommandError("an application/x-npz infer request names its model in the MQTT 5 "
                           "user property 'model'", field="model")
    raw: dict[str, Any] = {"model": model}
    if timeout_ms is not None:
        raw["timeout_ms"] = timeout_ms
    try:
        return InferParams.model_validate(raw)
    except ValidationError as exc:
        raise validation_to_command_error(exc) from None


async def infer_npz(serving: Serving, payload: bytes, model: str | None,
                    timeout_ms: str | None) -> tuple[bytes, dict[str, str]]:
    """Serve a binary request: ``.npz`` in, ``.npz`` out plus ``plan``, ``latency_ms`` and
    ``energy_j`` as strings for the reply's user properties (``energy_j`` empty when unknown).
    Raises the same errors as the JSON command."""
    params = npz_params(model, timeout_ms)
    result = await infer_decoded(serving, serving.tensor_model(params.model), tensors_from_npz,
                                 payload, "inputs", timeout_s=_timeout_s(params))
    body = await off_loop(tensors_to_npz, result.outputs)
    meta = {"plan": result.plan, "latency_ms": f"{result.latency_ms:.3f}",
            "energy_j": "" if result.energy_j is None else repr(result.energy_j)}
    return body, meta


def register_infer(commands: CommandRegistry, serving: Serving) -> None:
    """Register ``infer`` (JSON tensors in and out) on the registry shared by HTTP and MQTT."""

    async def _infer(params: InferParams) -> dict[str, Any]:
        result = await serve(serving, params)
        return {"outputs": await off_loop(tensors_to_json, result.outputs),
                "plan": result.plan, "latency_ms": result.latency_ms,
                "energy_j": result.energy_j}

    commands.register("infer", InferParams, _infer,
                      summary="Run a tensor model: JSON tensors in, outputs, plan, latency, "
                              "energy out")
