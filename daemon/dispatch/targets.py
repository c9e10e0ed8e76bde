"""What the dispatcher plans over: loaded backends, their targets, clocks and versions."""

from __future__ import annotations

import logging

from edgepilot.backends.base import Backend, Target
from edgepilot.board.board import Board
from edgepilot.config import Config
from edgepilot.errors import ConfigError, EdgepilotError

log = logging.getLogger(__name__)


def memory_budgets(config: Config) -> dict[str, float]:
    """Bytes each device may hold (``[dispatch] memory_budgets_mb``; the CPU's defaults to
    ``[backends] memory_budget_mb``)."""
    mb = config.backends.memory_budget_mb
    budgets: dict[str, float] = {
        k: v * 1024 * 1024 for k, v in config.dispatch.memory_budgets_mb.items()}
    if mb:
        budgets.setdefault("cpu", mb * 1024 * 1024)
    return budgets


def available_targets(backends: dict[str, Backend], allowed: list[str] | None) -> list[Target]:
    """Targets of the loaded backends, filtered by ``[dispatch] targets``."""
    found: list[Target] = []
    for backend in backends.values():
        try:
            found.extend(backend.probe())
        except EdgepilotError as exc:
            log.warning("probe of %s failed: %s", backend.name, exc.message)
    if allowed is None:
        return found
    names = {str(t) for t in found}
    unknown = [a for a in allowed if a not in names]
    if unknown:
        raise ConfigError(f"dispatch.targets names {', '.join(unknown)}, not available here; "
                          f"allowed: {', '.join(sorted(names))}", field="dispatch.targets")
    return [t for t in found if str(t) in allowed]


def reference_target(targets: list[Target], kind: str, precision: str = "fp32") -> Target:
    """The target a model's accuracy is measured against: the model as the user gave it, run
    as its own runtime runs it by default: ORT CPU with the file as it is (recipe ``fp32`` =
    no conversion) for ONNX; for TFLite the interpreter with its default delegate (XNNPACK),
    in the file's own types (``precision``: ``int8`` for a quantized file). Not the builtin
    kernels: on an int8 file they round differently (an int8 MobileNetV2: 0.094 apart), and
    measured against them the plan kept off XNNPACK, 6x slower than the runtime a user runs
    and 8.5% off its outputs."""
    if kind == "onnx":
        want = Target("onnxruntime", "cpu", "fp32")
        if want in targets:
            return want
        raise ConfigError("onnxruntime/cpu/fp32 (the ONNX file as given) is the reference for "
                          "an ONNX model's accuracy; allow it in [dispatch] targets",
                          field="dispatch.targets")
    if kind == "tflite":
        order = [Target("tflite", "xnnpack", precision), Target("tflite", "cpu", precision)]
        own = [t for t in order if t in targets] or [
            t for t in targets if t.backend == "tflite" and t.precision == precision]
        if own:
            return own[0]
        raise ConfigError(f"tflite/xnnpack/{precision} (the TFLite file in its own types) is the "
                          "reference for this model's accuracy; enable the tflite backend and "
                          "allow it in [dispatch] targets", field="dispatch.targets")
    raise ConfigError(f"no reference target for a {kind} model; allowed kinds: onnx, tflite",
                      field="model")


def reference_targets(targets: list[Target], kind: str, precision: str = "fp32"
                      ) -> list[Target]:
    """The reference first, then the other targets of its runtime and precision: the first
    that runs the whole file becomes the reference (a TFLite file XNNPACK's interpreter
    cannot build falls back to the builtin kernels, ``cpu``)."""
    first = reference_target(targets, kind, precision)
    return [first, *(t for t in targets if t != first and t.backend == first.backend
                     and t.precision == first.precision)]


def board_freqs(board: Board | None) -> dict[str, float]:
    """Current clocks per device kind in kHz (cpu = fastest policy); {} without a board."""
    if board is None:
        return {}
    try:
        sample = board.sample()
    except Exception as exc:  # a sysfs hiccup must not break planning; plan at scale 1
        log.debug("board sample failed: %s", exc)
        return {}
    out: dict[str, float] = {}
    cpu = [float(p.get("cur_khz") or 0) for p in (sample.cpu or {}).values()]
    if any(cpu):
        out["cpu"] = max(cpu)
    for dev in (sample.devfreq or {}).values():
        kind, hz = dev.get("kind"), float(dev.get("cur_hz") or 0)
        if kind in ("gpu", "npu") and hz:
            out[kind] = max(out.get(kind, 0.0), hz / 1000)
    return out


def board_id(board: Board | None) -> str:
    """``family:model`` of the board plans are keyed by ("unknown" without one)."""
    if board is None:
        return "unknown"
    data = board.identity.as_dict()
    return f"{data.get('family') or 'generic'}:{data.get('model') or 'unknown'}"


def runtime_versions(backends: dict[str, Backend]) -> dict[str, str]:
    return {name: str(b.version() or "?") for name, b in sorted(backends.items())}
