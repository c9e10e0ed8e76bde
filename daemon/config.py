"""The daemon's configuration: one TOML file validated by pydantic models.

Every field has a limit and a description; unknown keys are rejected with their dotted path.
Each capability owns its section model (:mod:`edgepilot.config_sections`, backend sections beside
their backends); this module assembles them, so that there is exactly one place config is loaded.
CLI global flags (``--sysfs-root``, ``--state-dir``, ``--model-dir``) override the file.
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator

from edgepilot.backends.armnn_options import ARMNN_DEVICES, ArmnnDevice, ArmnnSection
from edgepilot.backends.llamacpp.options import LlamacppSection
from edgepilot.backends.onnxrt_options import OnnxRuntimeSection
from edgepilot.backends.tflite_options import TfliteSection
from edgepilot.config_sections import (
    BackendsSection,
    DaemonSection,
    DispatchSection,
    DvfsSection,
    FleetSection,
    HttpSection,
    MqttSection,
    MqttTlsSection,
    Section,
    ServingSection,
    TelemetrySection,
)
from edgepilot.errors import ConfigError
from edgepilot.formats.model_entry import ModelEntry

# Sections live in config_sections (backend ones beside their backends); re-exported here so
# callers keep one import.
__all__ = ["ARMNN_DEVICES", "ArmnnDevice", "ArmnnSection", "BackendsSection", "DaemonSection",
           "DispatchSection", "DvfsSection", "FleetSection", "HttpSection", "LlamacppSection",
           "ModelEntry", "MqttSection", "MqttTlsSection", "OnnxRuntimeSection", "Section",
           "ServingSection", "TelemetrySection", "TfliteSection"]

DEFAULT_CONFIG_PATH = Path("/etc/edgepilot/edgepilot.toml")


def default_state_dir() -> Path:
    """systemd's ``$STATE_DIRECTORY`` under the unit, else a per-user state dir."""
    if env := os.environ.get("STATE_DIRECTORY"):
        return Path(env.split(":")[0])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "edgepilot"


def is_loopback_host(host: str) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ::1); any other name or address, the
    wildcard ones (0.0.0.0, ::) included, can be reached from outside the board."""
    if host.strip().lower() in ("localhost", "localhost.", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def check_http_exposure(host: str, http: HttpSection) -> None:
    """Refuse to serve ``host`` unauthenticated unless loopback or explicitly allowed.

    ``host`` is the address actually bound (``run --host`` overrides ``[http] host``).
    """
    if http.token or http.allow_unauthenticated or is_loopback_host(host):
        return
    raise ConfigError(
        f"[http] host {host!r} is not a loopback address and [http] token is not set: anyone "
        "who reaches the port could run models and change the board's profile; set [http] "
        "token, bind [http] host = \"127.0.0.1\", or set [http] allow_unauthenticated = true",
        field="http.token")


class Config(Section):
    """The whole configuration file."""

    daemon: DaemonSection = Field(default_factory=DaemonSection)
    http: HttpSection = Field(default_factory=HttpSection)
    dvfs: DvfsSection = Field(default_factory=DvfsSection)
    telemetry: TelemetrySection = Field(default_factory=TelemetrySection)
    mqtt: MqttSection = Field(default_factory=MqttSection)
    backends: BackendsSection = Field(default_factory=BackendsSection)
    models: list[ModelEntry] = Field(default_factory=list, max_length=256)
    dispatch: DispatchSection = Field(default_factory=DispatchSection)
    fleet: FleetSection = Field(default_factory=FleetSection)
    serving: ServingSection = Field(default_factory=ServingSection)

    @field_validator("models")
    @classmethod
    def _unique_names(cls, models: list[ModelEntry]) -> list[ModelEntry]:
        names = [m.name for m in models]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"model names must be unique; repeated: {', '.join(dupes)}")
        return models

    @property
    def state_dir(self) -> Path:
        return self.daemon.state_dir or default_state_dir()

    @property
    def model_dir(self) -> Path:
        return self.daemon.model_dir or self.state_dir / "models"


# The config in force, read when a component acts: SIGHUP replaces it as a whole, so a
# component handed this reads the reloaded file from then on.
ConfigSource = Callable[[], Config]


def format_validation_error(exc: ValidationError, source: str) -> str:
    """Name each failing key by its dotted path, with pydantic's message of what is allowed."""
    lines = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "(root)"
        if err["type"] == "extra_forbidden":
            lines.append(f"{source}: unknown key '{path}'")
        else:
            lines.append(f"{source}: '{path}': {err['msg']}")
    return "\n".join(lines)


def first_error_field(exc: ValidationError) -> str | None:
    errs = exc.errors()
    return ".".join(str(p) for p in errs[0]["loc"]) if errs else None


def parse_config(data: dict[str, Any], source: str = "config") -> Config:
    """Validate a parsed TOML document; raise ConfigError naming every bad key."""
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source),
                          field=first_error_field(exc)) from None


def load_config(path: Path | None, overrides: dict[str, Any] | None = None) -> Config:
    """Load ``path`` (or the embedded default when None) and apply ``daemon`` overrides.

    ``overrides`` maps DaemonSection field names (state_dir, model_dir, sysfs_root) to values
    from CLI flags; None values are ignored.
    """
    data: dict[str, Any] = {}
    source = "embedded default"
    if path is not None:
        source = str(path)
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist; create it (see "
                              "systemd/edgepilot.toml.example) or omit --config") from None
        except PermissionError:
            raise ConfigError(f"config file {path} is not readable by this user") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    for key, value in (overrides or {}).items():
        if value is not None:
            data.setdefault("daemon", {})[key] = str(value)
    return parse_config(data, source)


def resolve_config_path(cli_path: Path | None) -> Path | None:
    """--config wins; else the system file when it exists; else the embedded default (None)."""
    if cli_path is not None:
        return cli_path
    return DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.exists() else None
