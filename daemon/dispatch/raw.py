"""The runtime on a model file as its user would run it instead of edgepilot: onnxruntime or
the LiteRT interpreter on the whole file with their default settings (the bench's ``raw``
variant, and the reference the corpus tests compare served outputs with)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edgepilot.dispatch.model_dispatch import ModelDispatch

Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def raw_runner(md: ModelDispatch) -> Runner:
    """The runtime on the whole file with its default settings, bypassing edgepilot (and
    resized to the plan's input shapes where the file's own differ)."""
    path = md.path
    if path.suffix.lower() == ".onnx":
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.log_severity_level = 3  # warnings (shape merges, unused initializers) are noise here
        backend = md.backends.get("onnxruntime")
        if not getattr(getattr(backend, "settings", None), "allow_spinning", False):
            # the same thread policy as edgepilot's sessions: in one process, a spinning
            # session's idle workers slow every other session down (seen here 2x), so an
            # in-process comparison with different policies measures the spinning, not us
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sess = ort.InferenceSession(str(path), sess_options=opts, providers=_raw_providers(md))
        names = [o.name for o in sess.get_outputs()]

        def run_onnx(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return dict(zip(names, sess.run(names, feed), strict=True))

        return run_onnx
    from ai_edge_litert.interpreter import Interpreter

    from edgepilot.backends.tflite import first_xnnpack

    with first_xnnpack():
        interp = Interpreter(model_path=str(path))
        for d in interp.get_input_details():
            shape = (md.shapes or {}).get(d["name"])
            if shape is not None and tuple(shape) != tuple(int(x) for x in d["shape"]):
                interp.resize_tensor_input(d["index"], list(shape), strict=False)
        interp.allocate_tensors()
    ins = {d["name"]: d["index"] for d in interp.get_input_details()}
    outs = {d["name"]: d["index"] for d in interp.get_output_details()}

    def run_tflite(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for name, idx in ins.items():
            interp.set_tensor(idx, feed[name])
        interp.invoke()
        return {name: interp.get_tensor(idx).copy() for name, idx in outs.items()}

    return run_tflite


def _raw_providers(md: ModelDispatch) -> list[str]:
    # on a GPU machine its user runs the GPU: CUDA where it loads here, else the CPU
    backend = md.backends.get("onnxruntime")
    user_providers = getattr(backend, "user_providers", None)
    return list(user_providers()) if user_providers else ["CPUExecutionProvider"]


def raw_runtime(md: ModelDispatch) -> str:
    """What :func:`raw_runner` runs the file on, for the bench JSON."""
    if md.path.suffix.lower() == ".onnx":
        return "onnxruntime " + ", ".join(_raw_providers(md))
    return "LiteRT interpreter (XNNPACK delegate)"
