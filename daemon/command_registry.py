"""Commands shared by HTTP and MQTT: one registry, one validation, one error shape.

A capability registers a verb with a pydantic params model and an async handler, a closure over
the component it drives (``handler(params)``). Transports call
:meth:`CommandRegistry.execute` and turn the result into ``{"ok": true, "result": ...}`` or the
exception into ``{"ok": false, "error": {"code", "message", "field"}}`` via :func:`reply_for`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from edgepilot.errors import CommandError, EdgepilotError, NotFoundError

log = logging.getLogger(__name__)


class NoParams(BaseModel):
    """Params model for verbs that take none (extra keys still rejected)."""

    model_config = ConfigDict(extra="forbid")


# the verb's validated params (an instance of its params model) -> the result's plain data
Handler = Callable[[Any], Awaitable[Any]]


@dataclass(frozen=True)
class Command:
    verb: str
    params: type[BaseModel]
    handler: Handler
    mutating: bool
    summary: str


class CommandRegistry:
    """Verbs by name. Registration happens once at daemon start; lookups are read-only after."""

    def __init__(self) -> None:
        self._commands: dict[str, Command] = {}

    def register(self, verb: str, params: type[BaseModel], handler: Handler, *,
                 mutating: bool = False, summary: str = "") -> None:
        if verb in self._commands:
            raise ValueError(f"command {verb!r} registered twice")
        self._commands[verb] = Command(verb, params, handler, mutating, summary)

    def verbs(self) -> list[str]:
        return sorted(self._commands)

    def get(self, verb: str) -> Command:
        try:
            return self._commands[verb]
        except KeyError:
            raise NotFoundError(
                f"unknown command {verb!r}; allowed: {', '.join(self.verbs())}",
                field="verb") from None

    def validate(self, verb: str, payload: Any) -> tuple[Command, BaseModel]:
        """Look the verb up and validate its params; raise CommandError naming the field."""
        cmd = self.get(verb)
        if payload is None:
            payload = {}
        if not isinstance(payload, dict):
            raise CommandError("command parameters must be a JSON object", field="params")
        try:
            params = cmd.params.model_validate(payload)
        except ValidationError as exc:
            raise validation_to_command_error(exc) from None
        return cmd, params

    async def execute(self, verb: str, payload: Any) -> Any:
        """Validate ``payload`` for ``verb`` and run its handler."""
        cmd, params = self.validate(verb, payload)
        return await cmd.handler(params)


def validation_to_command_error(exc: ValidationError, prefix: str = "") -> CommandError:
    """Turn pydantic's error into one CommandError naming the first bad field and what it allows."""
    errs = exc.errors()
    first = errs[0] if errs else {"loc": (), "msg": str(exc), "type": ""}
    field = ".".join(str(p) for p in (prefix, *first["loc"]) if p != "") or None
    if first["type"] == "extra_forbidden":
        message = f"unknown field '{field}'"
    elif first["type"] == "missing":
        message = f"field '{field}' is required"
    else:
        message = f"field '{field}': {first['msg']}"
    if len(errs) > 1:
        message += f" (and {len(errs) - 1} more problem(s))"
    return CommandError(message, field=field)


def error_body(exc: BaseException) -> dict[str, Any]:
    """The one error shape shared by HTTP and MQTT."""
    if isinstance(exc, EdgepilotError):
        return {"code": exc.code, "message": exc.message, "field": exc.field}
    log.exception("unexpected error in command", exc_info=exc)
    return {"code": "internal", "message": f"internal error: {type(exc).__name__}: {exc}",
            "field": None}


def reply_for(result: Any = None, exc: BaseException | None = None) -> dict[str, Any]:
    if exc is not None:
        return {"ok": False, "error": error_body(exc)}
    return {"ok": True, "result": result}
