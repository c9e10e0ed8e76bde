"""The sections of the daemon's configuration file, one pydantic model each.

:mod:`edgepilot.config` assembles them into :class:`~edgepilot.config.Config` and loads the
file; it re-exports every section, so callers import them from there. Every field has a limit
and a description; unknown keys are rejected with their dotted path.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from edgepilot.backends.armnn_options import ArmnnSection
from edgepilot.backends.llamacpp.options import LlamacppSection
from edgepilot.backends.onnxrt_options import OnnxRuntimeSection
from edgepilot.backends.options import BackendOptions
from edgepilot.backends.tflite_options import TfliteSection


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
    cors_origins: list[str] = Field(
        default_factory=list, description="Browser origins (e.g. https://chat.example.org) "
        "allowed to call the language-model routes, beyond the loopback host and app://, "
        "file://, tauri://, vscode-webview:// pages, which are always allowed (Ollama's "
        "OLLAMA_ORIGINS).")
    max_queue: int = Field(32, ge=1, le=10_000,
                           description="Requests waiting per device before 503.")


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
    planning_budget_s: float = Field(
        90.0, ge=0, le=86400, description="Seconds a model's planning aims to fit in: a model "
        "whose per-layer profile would take over half of it (a multi-second TTS run on five "
        "targets) is planned whole, each target timed on the whole model (0 = no budget).")
    kernel_corpus: bool = Field(
        True, description="Predict layers' roofline_ms from a per-board kernel corpus "
        "(synthetic one-operator models timed once per target after the daemon's first plan, "
        "cached in the state dir; no plan waits for it).")
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


class ServingSection(Section):
    max_loaded_models: int = Field(
        0, ge=0, le=256,
        description="Most models resident at once (0 = no limit but the memory budget). A load "
        "past it first unloads the least recently used model with no request in flight; when "
        "every loaded model has requests in flight it waits up to load_wait_s for one to "
        "finish, then answers 503.")
    load_wait_s: float = Field(
        30.0, ge=0, le=3600,
        description="How long a load past max_loaded_models waits for a loaded model to be "
        "idle before answering 503 (0 = answer at once).")
