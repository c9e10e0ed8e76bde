"""The daemon's configuration: one TOML file validated by pydantic models.

Every field has a limit and a description; unknown keys are rejected with their dotted path.
Each capability owns its section model here so that there is exactly one place config is loaded.
CLI global flags (``--sysfs-root``, ``--state-dir``, ``--model-dir``) override the file.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from edgepilot.backends.armnn_options import ARMNN_DEVICES, ArmnnDevice, ArmnnSection
from edgepilot.backends.llamacpp.options import LlamacppSection
from edgepilot.backends.onnxrt_options import OnnxRuntimeSection
from edgepilot.backends.options import BackendOptions
from edgepilot.backends.tflite_options import TfliteSection
from edgepilot.errors import ConfigError
from edgepilot.formats.model_entry import ModelEntry

# Backend sections live beside their backends; re-exported here so callers keep one import.
__all__ = ["ARMNN_DEVICES", "ArmnnDevice", "ArmnnSection", "LlamacppSection",
           "ModelEntry", "OnnxRuntimeSection", "TfliteSection"]

DEFAULT_CONFIG_PATH = Path("/etc/edgepilot/edgepilot.toml")


def default_state_dir() -> Path:
    """systemd's ``$STATE_DIRECTORY`` under the unit, else a per-user state dir."""
    if env := os.environ.get("STATE_DIRECTORY"):
        return Path(env.split(":")[0])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "edgepilot"


class Section(BaseModel):
    """Base for every config section: unknown keys are errors, values are validated on set."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DaemonSection(Section):
    state_dir: Path | None = Field(
        None, description="Where journals, plan cache, spool and demo models live "
        "(default: $STATE_DIRECTORY, else ~/.local/state/edgepilot).")
    model_dir: Path | None = Field(
        None, description="Directory models are loaded from (default: <state_dir>/models).")
    sysfs_root: Path = Field(Path("/"), description="Root under which /sys and /proc are read.")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Log verbosity.")
    drain_timeout_s: float = Field(
        10.0, ge=0.1, le=300, description="How long SIGTERM waits for in-flight work to finish.")
    demo_models: bool = Field(
        True, description="Generate small demo models (GGUF, ONNX) into the model dir when no "
        "model is configured and the dir is empty.")


class HttpSection(Section):
    host: str = Field("127.0.0.1", min_length=1, max_length=255,
                      description="Address the HTTP API binds (loopback unless told otherwise).")
    port: int = Field(8470, ge=0, le=65535, description="HTTP port (0 picks a free one).")
    token: str | None = Field(
        None, min_length=8, max_length=4096,
        description="Bearer token required by mutating endpoints and by those that can start "
        "planning (GET /v1/plan/{model}); unset = no auth (loopback).")
    allow_unauthenticated: bool = Field(
        False, description="Serve a non-loopback host without a token. Off: the daemon refuses "
        "to start on such a host with no [http] token, since anyone who reaches the port could "
        "run models, start profiling and change DVFS profiles.")
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024, le=1024**3,
                                description="Largest request body accepted.")
    max_queue: int = Field(32, ge=1, le=10_000,
                           description="Requests waiting per device before 503.")


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


class DvfsSection(Section):
    profile: str | None = Field(
        None, min_length=1, max_length=64,
        description="Profile applied at start and restored at stop (see `edgepilot profile list`).")
    profile_dirs: list[Path] = Field(
        default_factory=list, max_length=16,
        description="Extra directories of profile TOML files, searched before the built-ins.")
    command_timeout_s: float = Field(
        10.0, ge=0.1, le=120, description="Timeout for nvpmodel/jetson_clocks.")
    nvpmodel: Path | None = Field(
        None, description="nvpmodel executable. Unset: looked up on PATH only when "
        "[daemon] sysfs_root is '/'; with any other root the nvpmodel steps are skipped.")
    jetson_clocks: Path | None = Field(
        None, description="jetson_clocks executable. Unset: looked up on PATH only when "
        "[daemon] sysfs_root is '/'; with any other root the jetson_clocks steps are skipped.")
    thermal_dwell_s: float = Field(
        30.0, ge=0, le=3600,
        description="Least time on a thermal fallback profile before returning to the one it "
        "replaced, so a board that cools fast does not flap between them.")
    slo_ms: float | None = Field(
        None, gt=0, le=3_600_000,
        description="Latency goal (p95, ms) for slo_model: at start the daemon applies the "
        "lowest-energy profile whose measured p95 meets it (measurements cached in the state "
        "dir), and re-picks a cooler one after a thermal fallback. Set with slo_model.")
    slo_model: str | None = Field(
        None, min_length=1, max_length=128,
        description="The ONNX/TFLite model (a name the daemon serves) slo_ms is about.")
    power_cap_w: float | None = Field(
        None, gt=0, le=10_000,
        description="Board power cap (W): while telemetry reads more, the biggest consumers' "
        "max clocks step down one table step per sample; they come back with hysteresis. "
        "Restored on stop like any profile write.")
    power_cap_hysteresis_w: float = Field(
        0.5, ge=0, le=1000,
        description="How far under power_cap_w the board must stay (and stay after a step "
        "up, from what that step saved) before a capped clock is raised again.")

    @model_validator(mode="after")
    def _slo_pair(self) -> DvfsSection:
        if (self.slo_ms is None) != (self.slo_model is None):
            given, missing = ("slo_ms", "slo_model") if self.slo_model is None \
                else ("slo_model", "slo_ms")
            raise ValueError(f"dvfs.{given} is set but dvfs.{missing} is not; set both "
                             "(slo_model: the model whose p95 latency slo_ms bounds) or neither")
        if self.slo_ms is not None and self.profile is not None:
            raise ValueError(f"dvfs.profile = {self.profile!r} and dvfs.slo_ms both choose the "
                             "profile applied at start; allowed: one of them")
        return self


class TelemetrySection(Section):
    sample_interval_s: float = Field(1.0, ge=0.1, le=3600,
                                     description="Sampling period (0.1 s = 10 Hz at most).")
    publish_interval_s: float = Field(5.0, ge=0.1, le=3600,
                                      description="MQTT telemetry publish period (at most one "
                                      "message per sample).")
    thermal_warn_c: float | None = Field(
        85.0, ge=20, le=150,
        description="A thermal zone at or above this emits a `thermal` event (None = off).")
    thermal_hysteresis_c: float = Field(
        5.0, ge=0, le=50,
        description="A hot zone is reported normal again once it is this far below the warning.")


class MqttTlsSection(Section):
    ca_file: Path | None = Field(None, description="CA bundle to verify the broker.")
    cert_file: Path | None = Field(None, description="Client certificate (mutual TLS).")
    key_file: Path | None = Field(None, description="Client private key (mutual TLS).")
    insecure: bool = Field(False, description="Skip hostname verification (testing only).")


class MqttSection(Section):
    enabled: bool = Field(True,
                          description="Connect to the broker (retries forever, never blocks).")
    host: str = Field("localhost", min_length=1, max_length=255, description="Broker host.")
    port: int = Field(1883, ge=1, le=65535, description="Broker port.")
    protocol: Literal["5", "3.1.1"] = Field("5", description="MQTT protocol version.")
    device_id: str = Field(default_factory=socket.gethostname, min_length=1, max_length=128,
                           pattern=r"^[A-Za-z0-9_.-]+$",
                           description="This board's name in topics (default: hostname).")
    client_id: str | None = Field(None, max_length=128,
                                  description="MQTT client id (default: edgepilot-<device_id>).")
    username: str | None = Field(None, max_length=256, description="Broker username.")
    password: str | None = Field(None, max_length=1024, description="Broker password.")
    tls: MqttTlsSection | None = Field(None, description="TLS settings; absent = plain TCP.")
    keepalive_s: int = Field(30, ge=5, le=3600, description="MQTT keepalive.")
    qos: Literal[0, 1, 2] = Field(
        1, description="QoS for telemetry, events and replies. 1: at least once (a consumer "
        "drops repeats by `seq`); 2 with MQTT 5: exactly once, also across broker restarts "
        "(persistent session, see session_expiry_s).")
    session_expiry_s: int = Field(
        3600, ge=10, le=7 * 86400,
        description="With qos = 2 on MQTT 5: how long the broker keeps this client's session "
        "(its unfinished QoS 2 handshakes) while the daemon is away.")
    topic_prefix: str = Field("edgepilot", min_length=1, max_length=64,
                              pattern=r"^[A-Za-z0-9_/-]+$", description="First topic level.")
    groups: list[str] = Field(default_factory=list, max_length=64,
                              description="Fleet groups: <prefix>/group/<g>/cmd/<verb> is handled.")
    buffer_size: int = Field(
        10_000, ge=10, le=10_000_000,
        description="Messages kept while the broker is away (oldest dropped).")
    spool: bool = Field(False, description="Also spool the buffer to the state dir.")
    # 4 MiB: an infer request carries tensors (a 224x224x3 float image is ~1.5 MB as JSON)
    max_payload_bytes: int = Field(4 * 1024 * 1024, ge=256, le=64 * 1024 * 1024,
                                   description="Largest command payload accepted (infer "
                                               "tensors included); larger ones get an error.")
    reconnect_min_s: float = Field(1.0, ge=0.05, le=60, description="First reconnect delay.")
    reconnect_max_s: float = Field(60.0, ge=0.1, le=3600, description="Reconnect backoff cap.")
    homeassistant_discovery: bool = Field(False, description="Publish Home Assistant discovery.")
    homeassistant_prefix: str = Field("homeassistant", min_length=1, max_length=64,
                                      description="Home Assistant discovery prefix.")


class BackendsSection(Section):
    enabled: list[str] | None = Field(
        None, description="Backends to use (default: every one installed).")
    memory_budget_mb: int = Field(0, ge=0, le=1 << 22,
                                  description="Model memory budget (0 = 80% of available RAM).")
    onnxruntime: OnnxRuntimeSection = Field(default_factory=OnnxRuntimeSection)
    tflite: TfliteSection = Field(default_factory=TfliteSection)
    armnn: ArmnnSection = Field(default_factory=ArmnnSection)
    llamacpp: LlamacppSection = Field(default_factory=LlamacppSection)

    def options_of(self, name: str) -> BackendOptions | None:
        """The ``[backends.<name>]`` section of backend ``name`` (None: a backend without
        one here); the backend takes it as its ``options_class``."""
        section = getattr(self, name) if name in type(self).model_fields else None
        return section if isinstance(section, BackendOptions) else None


class DispatchSection(Section):
    enabled: bool = Field(True, description="Plan tensor models per layer (else one target).")
    tolerance: float = Field(0.05, gt=0, le=1,
                             description="Default output error budget (relative L2 error).")
    profile_runs: int = Field(7, ge=1, le=1000, description="Timed runs per (layer, target).")
    warmup_runs: int = Field(2, ge=0, le=100, description="Untimed runs first.")
    drift_threshold: float = Field(0.5, gt=0, le=100,
                                   description="Relative observed/predicted drift that replans.")
    hysteresis: float = Field(0.05, ge=0, le=1,
                              description="Predicted gain a replan must beat to be applied.")
    targets: list[str] | None = Field(
        None, description="Targets the planner may use, 'backend/device/precision' (default: all).")
    metric: Literal["rel_l2", "cosine"] = Field(
        "rel_l2", description="Output error metric the tolerance is expressed in "
        "(relative L2 error or cosine distance against the fp32 reference).")
    calibration_inputs: int = Field(2, ge=1, le=64,
                                    description="Random calibration inputs errors are measured on.")
    max_layers: int = Field(48, ge=1, le=1024,
                            description="Most layers a model is cut into (tiny ones coalesced).")
    profile_passes: int = Field(
        2, ge=1, le=10, description="Passes over all (layer, target) cells when profiling; "
        "each cell keeps its lowest median (load on a shared board only adds time).")
    kernel_corpus: bool = Field(
        True, description="Predict layers from a per-board kernel corpus (synthetic one-operator "
        "models timed once per target on the first plan, cached in the state dir).")
    memory_budgets_mb: dict[str, int] = Field(
        default_factory=dict, description="Memory budget per device (cpu, gpu, npu ...) in MB; "
        "cpu defaults to [backends] memory_budget_mb when that is set.")
    calibration_dir: Path | None = Field(
        None, description="Real calibration samples: <dir>/<model>/*.npz (one sample each), "
        "<dir>/<model>.npz or <dir>/<model>/<input>.npy; used when their shapes match a plan's.")
    sample_requests: int = Field(
        0, ge=0, le=64, description="Recent real request inputs kept per model and shape "
        "signature to calibrate plans on (0 = off; opt-in: they stay in memory).")
    max_signatures: int = Field(
        4, ge=1, le=64, description="Input-shape signatures planned per model; the least "
        "recently used plan is dropped beyond this.")
    gguf_threads: list[int] | None = Field(
        None, min_length=1, max_length=16,
        description="Thread counts to measure for GGUF plans, each 1..256 (default: 1, half "
        "and all cores).")
    gguf_prompt_tokens: int = Field(32, ge=1, le=4096,
                                    description="Prompt length of the GGUF reference request.")
    gguf_decode_tokens: int = Field(16, ge=1, le=4096,
                                    description="Decoded tokens of the GGUF reference request.")

    @field_validator("gguf_threads")
    @classmethod
    def _thread_counts(cls, value: list[int] | None) -> list[int] | None:
        bad = [v for v in value or [] if not 1 <= v <= 256]
        if bad:
            raise ValueError(f"thread counts {bad} out of range; allowed 1..256")
        return value


class FleetSection(Section):
    share_plans: bool | None = Field(None, description="Adopt plans identical boards published "
                                     "over MQTT, publish this board's (default: [mqtt] enabled).")
    verify_tolerance: float = Field(0.10, gt=0, le=100, description="How far (relative) a "
                                    "shared plan's timings here may be from the published ones.")


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
