"""A model compiled whole on its kind's default target (what the registry loads when no plan
splits it): the first installed backend of :data:`DEFAULT_TARGETS` that supports the file."""

from __future__ import annotations

import re

from edgepilot.backends.backend_set import BackendSet
from edgepilot.backends.base import Backend, BackendUnavailable, Executable, Segment, Target
from edgepilot.errors import BackendError, UnrunnableModel
from edgepilot.formats import files
from edgepilot.formats.io import tensor_specs

# default target per kind: first of these whose backend is installed and supports the file
DEFAULT_TARGETS: dict[str, list[tuple[str, str]]] = {
    "onnx": [("onnxruntime", "cpu")],
    "tflite": [("tflite", "xnnpack"), ("tflite", "cpu")],
    "gguf": [("llamacpp", "cpu")],
}


def default_target(backends: BackendSet, model: files.ResolvedModel
                   ) -> tuple[Backend, Target, Segment]:
    """First installed target that runs the whole model (see DEFAULT_TARGETS)."""
    ins, outs = tensor_specs(model.path, model.kind)
    segment = Segment(model.path, model.kind,  # type: ignore[arg-type]
                      tuple(s.name for s in ins), tuple(s.name for s in outs), None,
                      model.name)
    reasons = []
    for backend_name, device in DEFAULT_TARGETS[model.kind]:
        try:
            backend = backends.get(backend_name)
            targets = [t for t in backend.probe() if t.device == device]
        except BackendUnavailable as exc:
            reasons.append(exc.message)
            continue
        for target in targets:
            support = backend.supports(segment, target)
            if support:
                return backend, target, segment
            reasons.append(f"{target}: {support.reason}")
    raise BackendError(f"no installed backend can run {model.name!r}: " + "; ".join(reasons),
                       field="model")


def compile_whole(backends: BackendSet, model: files.ResolvedModel) -> Executable:
    """The whole model on its default target; a file that target cannot build (an op no
    runtime resolves) is an UnrunnableModel (HTTP 422) naming the file and the reason."""
    try:
        backend, target, segment = default_target(backends, model)
        return backend.compile(segment, target)
    except BackendError as exc:
        reason = re.sub(rf"^.*?{re.escape(model.path.name)} on \S+: ", "",
                        " ".join(exc.message.split()))
        raise UnrunnableModel(f"{model.path.name}: no runtime here runs this model: "
                              f"{reason}", field="model") from None
