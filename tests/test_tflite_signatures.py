"""A TFLite file of several signatures (a model exported with more than one entry point) plans
and serves the signature the interpreter runs by default (the one on subgraph 0, whichever order
the signature defs are listed in), within tolerance of the raw interpreter's runner for that
signature; the plan names it and the signatures it does not serve, and the CLI says so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from ai_edge_litert.interpreter import Interpreter

from edgepilot.config import Config
from edgepilot.dispatch.dispatcher import Dispatcher
from edgepilot.dispatch.measuring.tolerance import output_error
from edgepilot.dispatch.model_dispatch import ModelDispatch
from edgepilot.formats.tflite_gen import write_two_signature_tflite


def test_the_default_signature_is_planned_and_served_and_the_others_named(tmp_path: Path
                                                                           ) -> None:
    path = write_two_signature_tflite(tmp_path / "two.tflite")
    raw = Interpreter(model_path=str(path))
    assert list(raw.get_signature_list()) == ["decode", "encode"]  # subgraph 0 listed last
    config = Config.model_validate({
        "daemon": {"state_dir": str(tmp_path / "state"), "demo_models": False},
        "backends": {"enabled": ["tflite", "onnxruntime"]},
        "dispatch": {"profile_runs": 3, "warmup_runs": 1, "kernel_corpus": False}})
    md = Dispatcher(config).get(str(path), None)
    assert isinstance(md, ModelDispatch)
    md.prepare()
    plan = md.explain()
    assert plan["signatures"] == {"served": "encode", "others": ["decode"]}
    assert plan["input_shapes"] == {"input": [1, 32]}
    assert md.compiled is not None
    x = np.random.default_rng(3).standard_normal((1, 32)).astype(np.float32)
    got, _ = md.compiled.run({"input": x})
    want = raw.get_signature_runner("encode")(input=x)
    assert set(got) == set(want) == {"output"}
    assert output_error(got, want, md.opts.metric) <= plan["tolerance"]
    # the other signature is another function: its answer is not what is served
    assert raw.get_signature_runner("decode")(input=x[:, :16])["output"].shape == (1, 16)

    cli = [sys.executable, "-m", "edgepilot", "--state-dir", str(tmp_path / "cli"), "plan",
           str(path)]
    human = subprocess.run(cli, capture_output=True, text=True, timeout=240)
    assert human.returncode == 0, human.stderr
    assert "signature encode planned and served; not served: decode" in human.stdout
    as_json = subprocess.run([*cli, "--json"], capture_output=True, text=True, timeout=240)
    assert json.loads(as_json.stdout)["signatures"]["others"] == ["decode"]
