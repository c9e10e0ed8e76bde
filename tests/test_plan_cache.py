"""Plan cache: a restart reuses the profile; a changed model or runtime version does not."""

from __future__ import annotations

from pathlib import Path

import dispatch_fixtures

from edgepilot.backends.base import Target
from edgepilot.backends.onnxrt import OnnxRuntimeBackend
from edgepilot.dispatch.model_dispatch import DispatchOptions, ModelDispatch
from edgepilot.dispatch.planning.cache import PlanCache
from edgepilot.formats import onnx_gen

transformer_path = dispatch_fixtures.transformer_path
ort_backend = dispatch_fixtures.ort_backend
TARGETS = [Target("onnxruntime", "cpu", "fp32"), Target("onnxruntime", "cpu", "int8")]


def dispatch(path: Path, backend: OnnxRuntimeBackend, cache: PlanCache, profiled: list[str],
             runtime: str = "ort-1") -> ModelDispatch:
    return ModelDispatch("tf", path, {"onnxruntime": backend}, TARGETS,
                         DispatchOptions(runs=3, warmup=1), cache=cache,
                         key_parts={"board": "test", "runtimes": {"onnxruntime": runtime}},
                         progress=lambda done, total, label: profiled.append(label))


def test_restart_reuses_the_cached_plan(tmp_path: Path, transformer_path: Path,
                                        ort_backend: OnnxRuntimeBackend) -> None:
    cache = PlanCache(tmp_path / "plans")
    profiled: list[str] = []
    first = dispatch(transformer_path, ort_backend, cache, profiled).prepare()
    assert profiled and len(list((tmp_path / "plans").glob("tf-*.json"))) == 1
    profiled.clear()
    restarted = dispatch(transformer_path, ort_backend, cache, profiled)
    plan = restarted.prepare()
    assert profiled == [] and restarted.from_cache  # no re-profiling
    # a split that beat one target is "cache"; a single-target verdict (timed side by side on
    # the first run) is kept with the profile and restored with its own reason
    assert plan.hash == first.hash
    assert plan.reason == ("cache" if first.reason == "initial" else first.reason)
    # a runtime upgrade invalidates it
    dispatch(transformer_path, ort_backend, cache, profiled, runtime="ort-2").prepare()
    assert profiled
    # so does a changed model file
    profiled.clear()
    onnx_gen.transformer_stack(transformer_path, n_blocks=2, d_model=64, seq=16, ffn_small=32,
                               ffn_large=256, seed=7)
    changed = dispatch(transformer_path, ort_backend, cache, profiled)
    changed.prepare()
    assert profiled and not changed.from_cache


def test_corrupt_cache_file_is_ignored(tmp_path: Path, transformer_path: Path,
                                       ort_backend: OnnxRuntimeBackend) -> None:
    cache = PlanCache(tmp_path / "plans")
    profiled: list[str] = []
    dispatch(transformer_path, ort_backend, cache, profiled).prepare()
    for f in (tmp_path / "plans").glob("*.json"):
        f.write_text("{not json")
    profiled.clear()
    md = dispatch(transformer_path, ort_backend, cache, profiled)
    md.prepare()
    assert profiled and not md.from_cache
