"""One exception hierarchy for edgepilot.

Every message says what went wrong *and* what an operator can do next. Callers map these to
HTTP statuses / MQTT error replies by type, never by parsing message text.
"""

from __future__ import annotations


class EdgepilotError(Exception):
    """Base of every error edgepilot raises on purpose.

    ``code`` is a stable machine-readable identifier used in HTTP and MQTT error replies;
    ``field`` names the offending input field (dotted path) when there is one.
    """

    code = "internal"
    http_status = 500
    # seconds a client should wait before asking again (HTTP's Retry-After), for an error that
    # passes by itself (a full queue, a worker being restarted); None: retrying does not help
    retry_after_s: int | None = None

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class ConfigError(EdgepilotError):
    """The configuration file or a CLI flag is invalid."""

    code = "config_invalid"
    http_status = 400


class BoardError(EdgepilotError):
    """Reading or writing the board's sysfs/procfs failed in a way that needs attention."""

    code = "board_error"
    http_status = 500


class ProfileError(EdgepilotError):
    """A DVFS profile is invalid for this board or could not be applied (and was rolled back)."""

    code = "profile_error"
    http_status = 409


class BackendError(EdgepilotError):
    """An inference runtime is missing, refused a model/segment, or failed while running it."""

    code = "backend_error"
    http_status = 500


class ModelError(EdgepilotError):
    """A model is unknown, unverifiable, too big for the memory budget or outside the model dir."""

    code = "model_error"
    http_status = 400


class UnrunnableModel(ModelError):
    """A model file that no installed runtime can run (an operator none resolves, a file it
    refuses): the request cannot be processed as sent, whatever the daemon does."""

    code = "model_unrunnable"
    http_status = 422
    # whether some runtime built the model and failed running it (on inputs that may be the
    # cause), not only refused to load it
    ran = False

    def with_hint(self, hint: str) -> UnrunnableModel:
        """The same error with ``hint`` (what to do about it) appended."""
        again = UnrunnableModel(self.message + hint, field=self.field)
        again.ran = self.ran
        return again


class PlanError(EdgepilotError):
    """The dispatcher could not build, check or apply a plan."""

    code = "plan_error"
    http_status = 500


class CommandError(EdgepilotError):
    """A command (HTTP or MQTT) was malformed: unknown verb, bad field, oversize payload."""

    code = "bad_request"
    http_status = 400


class NotFoundError(CommandError):
    """The command names something that does not exist (a model, a profile, a verb)."""

    code = "not_found"
    http_status = 404


class BusyError(EdgepilotError):
    """A queue limit was reached; the caller should retry later."""

    code = "busy"
    http_status = 503
    retry_after_s = 1


class ModelUnloading(BackendError):
    """The model is being unloaded under the request (keep_alive, max_loaded_models, an
    operator): the next request loads it again."""

    code = "model_unloading"
    http_status = 503
    retry_after_s = 1


class GrammarAborted(CommandError):
    """A grammar (from ``format``, ``response_format`` or ``tools``) that made llama.cpp abort
    the model's worker once: refused from then on rather than crash it again."""

    code = "grammar_aborted"


class ContextOverflow(CommandError):
    """The prompt does not fit the model's context window (the client's input: a 400). Its
    code is OpenAI's, which clients act on (litellm's ContextWindowExceededError and the
    fallbacks and trimming it triggers)."""

    code = "context_length_exceeded"


class InputRejected(CommandError):
    """The model itself, run whole on its own runtime, refused the request's values (a token id
    past its vocabulary, a sequence longer than its positions, lengths that do not agree): the
    client's data, not a fault of any target, so nothing is excluded or replanned."""

    code = "input_rejected"
    http_status = 422


class DeadlineExceeded(EdgepilotError):
    """A request's deadline passed before it could run; nothing was computed for it."""

    code = "deadline_exceeded"
    http_status = 504
