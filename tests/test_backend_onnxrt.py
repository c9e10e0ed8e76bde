"""OnnxRuntimeBackend on the real onnxruntime CPU EP with generated models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from edgepilot.backends import load_backend
from edgepilot.backends.base import Segment, Target
from edgepilot.backends.onnxrt import OnnxRuntimeBackend
from edgepilot.backends.onnxrt_options import default_threads
from edgepilot.errors import BackendError
from edgepilot.formats import onnx_gen


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture
def mlp(tmp_path: Path) -> Path:
    path = tmp_path / "mlp.onnx"
    onnx_gen.mlp_stack(path, widths=(128, 256, 256, 32), batch=4)
    return path


@pytest.fixture
def backend(tmp_path: Path) -> OnnxRuntimeBackend:
    b = load_backend("onnxruntime")
    assert isinstance(b, OnnxRuntimeBackend)
    b.cache_dir = tmp_path / "cache"
    return b


def test_probe_lists_cpu_precisions(backend: OnnxRuntimeBackend) -> None:
    names = {str(t) for t in backend.probe()}
    assert {"onnxruntime/cpu/fp32", "onnxruntime/cpu/int8", "onnxruntime/cpu/int4"} <= names
    assert not any("azure" in n.lower() for n in names)


def test_whole_model_precisions_run_and_differ(backend: OnnxRuntimeBackend, mlp: Path,
                                               tmp_path: Path) -> None:
    seg = Segment(mlp, "onnx", ("x",), ("y",))
    feed = onnx_gen.sample_inputs(mlp)[0]
    ref = backend.compile(seg, Target("onnxruntime", "cpu", "fp32")).run(feed)["y"]
    assert ref.shape == (4, 32)
    int8 = backend.compile(seg, Target("onnxruntime", "cpu", "int8"))
    int4 = backend.compile(seg, Target("onnxruntime", "cpu", "int4"))
    e8 = rel_l2(int8.run(feed)["y"], ref)
    e4 = rel_l2(int4.run(feed)["y"], ref)
    # quantized, so not exact; but still the same function
    assert 0 < e8 < 0.2
    assert 0 < e4 < 0.5
    fp32 = backend.compile(seg, Target("onnxruntime", "cpu", "fp32"))
    np.testing.assert_array_equal(fp32.run(feed)["y"], ref)  # fp32 graph left untouched
    assert int4.memory_bytes < int8.memory_bytes < fp32.memory_bytes
    # quantized variants are cached on disk and reused
    cached = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert any(n.endswith(".int8-dynamic.onnx") for n in cached)
    assert any(n.endswith(".int4.onnx") for n in cached)
    # the int4 variant really uses MatMulNBits
    int4_file = next(p for p in (tmp_path / "cache").iterdir() if p.name.endswith(".int4.onnx"))
    assert "MatMulNBits" in {n.op_type for n in onnx.load(str(int4_file)).graph.node}


def test_subgraph_segments_compose_to_the_whole(backend: OnnxRuntimeBackend, mlp: Path) -> None:
    model = onnx.load(str(mlp))
    cut = next(n.output[0] for n in model.graph.node if n.op_type == "Relu")
    fp32 = Target("onnxruntime", "cpu", "fp32")
    first = backend.compile(Segment(mlp, "onnx", ("x",), (cut,), (0, 1)), fp32)
    second = backend.compile(Segment(mlp, "onnx", (cut,), ("y",), (1, 2)), fp32)
    whole = backend.compile(Segment(mlp, "onnx", ("x",), ("y",)), fp32)
    feed = onnx_gen.sample_inputs(mlp)[0]
    mid = first.run(feed)
    assert list(mid) == [cut]
    np.testing.assert_allclose(second.run(mid)["y"], whole.run(feed)["y"], rtol=1e-5, atol=1e-5)


def test_bad_requests_raise_specific_errors(backend: OnnxRuntimeBackend, mlp: Path) -> None:
    seg = Segment(mlp, "onnx", ("x",), ("y",))
    with pytest.raises(BackendError) as err:
        backend.compile(seg, Target("onnxruntime", "cpu", "fp8"))
    assert err.value.field == "precision" and "fp32" in err.value.message
    with pytest.raises(BackendError) as err:
        backend.compile(Segment(mlp, "onnx", ("x",), ("nope",), (0, 1)),
                        Target("onnxruntime", "cpu", "fp32"))
    assert "nope" in err.value.message
    assert not backend.supports(Segment(mlp, "tflite", ("x",), ("y",)),
                                Target("onnxruntime", "cpu", "fp32"))
    assert not backend.supports(seg, Target("onnxruntime", "qnn", "int8"))
    exe = backend.compile(seg, Target("onnxruntime", "cpu", "fp32"))
    with pytest.raises(BackendError) as err:
        exe.run({"wrong": np.zeros((4, 128), np.float32)})
    assert err.value.field == "inputs"


def test_generators_are_deterministic(tmp_path: Path) -> None:
    for make in (onnx_gen.mlp_stack, onnx_gen.transformer_stack, onnx_gen.small_cnn):
        a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
        make(a)
        make(b)
        assert a.read_bytes() == b.read_bytes()


def _threads(exe: object) -> int:
    session = exe._session  # type: ignore[attr-defined]
    return int(session.get_session_options().intra_op_num_threads)


def test_single_thread_device_runs_the_cpu_provider_on_one_thread(
        backend: OnnxRuntimeBackend, mlp: Path) -> None:
    """``cpu-1t`` is offered beside ``cpu`` (this machine has two cores), takes every op as
    the CPU provider does, computes the same numbers, on one intra-op thread."""
    names = [str(t) for t in backend.probe()]
    assert {"onnxruntime/cpu-1t/fp32", "onnxruntime/cpu-1t/int8"} <= set(names)
    assert "onnxruntime/cpu-1t/int4" not in names
    # listed right after the default CPU device's targets, before other providers'
    assert names.index("onnxruntime/cpu-1t/fp32") > names.index("onnxruntime/cpu/int4")
    seg = Segment(mlp, "onnx", ("x",), ("y",))
    one = Target("onnxruntime", "cpu-1t", "fp32")
    assert backend.supports(seg, one)
    feed = onnx_gen.sample_inputs(mlp)[0]
    single = backend.compile(seg, one)
    default = backend.compile(seg, Target("onnxruntime", "cpu", "fp32"))
    np.testing.assert_allclose(single.run(feed)["y"], default.run(feed)["y"], rtol=1e-5,
                               atol=1e-6)
    assert _threads(single) == 1
    # a thread per core, as the runtime's default, but counted (so none is pinned)
    assert _threads(default) == default_threads() >= 2


@pytest.mark.parametrize("settings", [{"single_thread": False}, {"intra_op_threads": 1},
                                      {"providers": ["XnnpackExecutionProvider"]}])
def test_single_thread_device_withdrawn(settings: dict[str, object]) -> None:
    """Off by setting, where ``cpu`` is one thread already, or where the CPU provider is not
    among the configured ones."""
    from edgepilot.backends.onnxrt_options import OnnxRuntimeSection

    backend = OnnxRuntimeBackend(OnnxRuntimeSection.model_validate(settings))
    assert "cpu-1t" not in backend.devices()
    with pytest.raises(BackendError, match="not available here"):
        backend.compile(Segment(Path("x.onnx"), "onnx", ("x",), ("y",)),
                        Target("onnxruntime", "cpu-1t", "fp32"))


def test_single_thread_device_alone(mlp: Path) -> None:
    """``providers = ["cpu-1t"]`` offers the one-thread CPU device only."""
    from edgepilot.backends.onnxrt_options import OnnxRuntimeSection

    backend = OnnxRuntimeBackend(OnnxRuntimeSection(providers=["cpu-1t"]))
    assert backend.devices() == ["cpu-1t"]
    exe = backend.compile(Segment(mlp, "onnx", ("x",), ("y",)),
                          Target("onnxruntime", "cpu-1t", "int8"))
    assert _threads(exe) == 1


def test_a_provider_that_does_not_load_is_no_device_and_says_why(
        backend: OnnxRuntimeBackend, mlp: Path) -> None:
    # onnxruntime-gpu lists CUDA wherever it is installed; here (the CPU wheel) CUDA cannot
    # load either, and the same check must refuse it rather than time the CPU under its name
    assert backend._provider_loads("CUDAExecutionProvider") is False
    why = backend.unloadable["CUDAExecutionProvider"]
    assert "CUDAExecutionProvider" in why
    assert "cuda" not in backend.devices()
    with pytest.raises(BackendError, match="cuda"):
        backend.compile(Segment(mlp, "onnx", ("x",), ("y",)),
                        Target("onnxruntime", "cuda", "fp32"))


def test_sessions_never_fall_back_behind_our_back(backend: OnnxRuntimeBackend,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # onnxruntime's own fallback prints to stdout (into `plan --json`) and retries on another
    # provider under this target's name: every session the backend builds has it off
    from edgepilot.backends.onnxrt_variants import identity_model

    session = backend._session(identity_model(), "cpu", strict=True)
    assert session._enable_fallback is False
    session._enable_fallback = True  # what ort's own __init__ does: ignored
    assert session._enable_fallback is False
    assert capsys.readouterr().out == ""


def _pinned_threads() -> int:
    """Threads of this process confined to fewer CPUs than the process may use."""
    import os

    allowed = os.sched_getaffinity(0)
    pinned = 0
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        cpus = os.sched_getaffinity(int(task.name))
        pinned += cpus != allowed
    return pinned


def test_cpu_sessions_pin_no_worker_to_a_core(backend: OnnxRuntimeBackend, mlp: Path) -> None:
    """Left at its default count, onnxruntime pins every session's workers to cores 1..n-1;
    a caller the kernel then placed on core 1 shared it with its own worker: a 2-thread
    session ran 30% slower for as long as that lasted (19.5 ms against 15.0, the cpu/cpu-1t
    choice flipping between windows). The count is always explicit: no worker is pinned."""
    before = _pinned_threads()
    seg = Segment(mlp, "onnx", ("x",), ("y",))
    exes = [backend.compile(seg, Target("onnxruntime", "cpu", "fp32")) for _ in range(2)]
    for exe in exes:
        exe.run(onnx_gen.sample_inputs(mlp)[0])
    assert _pinned_threads() == before
