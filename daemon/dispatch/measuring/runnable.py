"""Before profiling: which target is the reference, and layers the reference runs alone.

The reference is the model as its own runtime runs it: the first of the candidate targets
(:func:`edgepilot.dispatch.targets.reference_targets`) that builds and runs the whole file. A
file none of them runs is an :class:`UnrunnableModel` (HTTP 422, exit 2) in one line naming
the file and what failed (for TFLite, the operator the interpreter could not resolve). Then
every layer must run alone on the reference, since profiling feeds each layer the
reference's own boundary tensors; a layer it cannot run alone is merged with its neighbour
until it can (at worst the whole model, which it runs).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from edgepilot.backends.base import Backend, Executable, Target
from edgepilot.dispatch.graph.partition import Partition, merge_all, merge_layers
from edgepilot.dispatch.measuring.budget import whole_only
from edgepilot.errors import EdgepilotError, PlanError, UnrunnableModel

log = logging.getLogger(__name__)
Feed = dict[str, np.ndarray]


def owned(out: Mapping[str, np.ndarray]) -> Feed:
    """``out`` copied into memory of its own. An onnxruntime output lives in its session's
    arena and keeps the whole arena alive, however small the output and long closed the
    session: outputs kept for the whole of planning (every layer's, Kokoro TTS) held 4.7 GB
    of arenas where the copies take 0.6 GB."""
    return {k: np.array(v) for k, v in out.items()}


@dataclass
class Reference:
    """The reference found for a model: what planning starts from."""

    target: Target
    outputs: list[Feed]        # its outputs on the calibration inputs
    merges: list[str]          # why layers were merged (it could not run them alone; budget)
    ms: list[float]            # its run of each calibration input (the first one cold)
    # its whole-model executable, open, when the model is one layer (its timing reuses it)
    spare: Executable | None = None
    budgeted: bool = False     # merged into one layer for the planning budget (budget.py)


def budget_first(whole: Partition, backends: Mapping[str, Backend], targets: list[Target],
                 feeds: Sequence[Feed], budget_s: float) -> Reference:
    """The reference found on the file as one layer, before any cut (``shell.whole_outline``),
    ``budgeted`` when the planning budget plans the model whole: then nothing is cut or
    probed at all. Otherwise :func:`reference_for` takes it as ``known`` (not run again)."""
    ms: list[float] = []
    # the first input only: a TTS model's second calibration input ran 85 s to its first's 11
    ref, outputs, exe = pick_reference(whole, backends, _candidates(whole, targets), feeds[:1],
                                       keep=True, ms=ms)
    assert exe is not None
    why = whole_only(ms, None, len(targets), budget_s)
    if why is not None:  # that was a fresh session's first run (3-4x a warm one): once more
        warm = _timed_run(exe, feeds[0])[1]
        ms = [min(ms[0], warm)]
        why = whole_only(ms, None, len(targets), budget_s)
    if why is not None:
        log.info("%s: %s", whole.model_path.name, why)
        return Reference(ref, outputs, [why], ms, exe, True)
    try:  # planned per layer: every input's reference outputs, as usual
        for feed in feeds[1:]:
            out, took = _timed_run(exe, feed)
            outputs.append(out)
            ms.append(took)
    except EdgepilotError:  # an input this candidate cannot run: the search over all inputs
        exe.close()
        ms = []
        ref, outputs, exe = pick_reference(whole, backends, _candidates(whole, targets), feeds,
                                           keep=True, ms=ms)
    return Reference(ref, outputs, [], ms, exe)


def _timed_run(exe: Executable, feed: Feed) -> tuple[Feed, float]:
    t0 = time.perf_counter()
    out = owned(exe.run(dict(feed)))
    return out, (time.perf_counter() - t0) * 1e3


def reference_for(part: Partition, backends: Mapping[str, Backend], targets: list[Target],
                  feeds: Sequence[Feed], budget_s: float = 0.0,
                  known: Reference | None = None) -> Reference:
    """The reference target, its outputs on ``feeds``, and the layer merges it needed; a
    model whose per-layer profile the planning budget cannot pay for is merged into one layer
    (``budget.py``). ``known``: the reference :func:`budget_first` found on the whole file,
    its executable open (the budget was decided there)."""
    ms: list[float] = list(known.ms) if known is not None else []
    ref, outputs, exe = (known.target, known.outputs, known.spare) if known is not None \
        else pick_reference(part, backends, _candidates(part, targets), feeds, keep=True, ms=ms)
    assert exe is not None
    why = whole_only(ms, len(part.layers), len(targets), budget_s) if known is None else None
    if why is not None:
        log.info("%s: %s", part.model_path.name, why)
        merge_all(part)
        merges = [why]
    else:
        merges = runnable_layers(part, backends[ref.backend], ref, feeds[0])
    if len(part.layers) > 1 or part.stateful:
        exe.close()
        return Reference(ref, outputs, merges, ms)
    return Reference(ref, outputs, merges, ms, exe, why is not None)


def _candidates(part: Partition, targets: list[Target]) -> list[Target]:
    from edgepilot.dispatch.targets import reference_targets

    precision = "fp32"
    if part.kind == "tflite":
        from edgepilot.backends.tflite import file_precision

        precision = file_precision(part.model_path)
    return reference_targets(targets, part.kind, precision)


def reference_named(part: Partition, targets: list[Target], name: str) -> Target | None:
    """The candidate reference called ``name`` here (nothing built), None if it is not one."""
    return next((t for t in _candidates(part, targets) if str(t) == name), None)


def reference_outputs(part: Partition, backends: Mapping[str, Backend],
                      targets: list[Target], feeds: Sequence[Feed], name: str) -> list[Feed]:
    """The outputs of the reference called ``name`` on ``feeds`` (else of the first candidate
    that runs the whole model), for a plan whose check did not need them until now."""
    candidates = sorted(_candidates(part, targets), key=lambda t: str(t) != name)  # it first
    return pick_reference(part, backends, candidates, feeds)[1]


def published_reference(part: Partition, backends: Mapping[str, Backend],
                        targets: list[Target], feeds: Sequence[Feed], name: str,
                        keep: bool = False
                        ) -> tuple[Target, list[Feed], Executable | None] | None:
    """The reference a board of the same kind found (``name``) and its outputs here, when it
    is one of this board's candidates and runs the whole model here; None: search as usual.
    ``keep``: its executable is returned open (the plan runs the whole model on it).

    A plan adopted from such a board needs no search: the candidates that failed there fail
    here, and the layers it had to merge are in its published layer list."""
    found = reference_named(part, targets, name)
    if found is None:
        return None
    try:
        return pick_reference(part, backends, [found], feeds, keep)
    except UnrunnableModel:
        return None


def pick_reference(part: Partition, backends: Mapping[str, Backend],
                   candidates: Sequence[Target], feeds: Sequence[Feed], keep: bool = False,
                   ms: list[float] | None = None
                   ) -> tuple[Target, list[Feed], Executable | None]:
    """The first candidate that runs the whole model, its outputs on ``feeds``, and (``keep``)
    its executable, open; ``ms`` is filled with its run of each feed."""
    reasons: list[tuple[str, str]] = []
    ran = False
    for target in candidates:
        backend = backends.get(target.backend)
        if backend is None:
            continue
        try:
            exe = backend.compile(part.segment(0, len(part.layers)), target)
            kept, ran = None, True
            try:
                runs = [_timed_run(exe, feed) for feed in feeds]
                outputs = [out for out, _ in runs]
                if ms is not None:
                    ms.extend(took for _, took in runs)
                kept = exe if keep else None
                return target, outputs, kept
            finally:
                if kept is None:
                    exe.close()
        except EdgepilotError as exc:
            log.info("reference %s cannot run %s: %s", target, part.model_path.name,
                     exc.message)
            reasons.append((str(target), _strip(exc.message, part)))
    by_reason: dict[str, list[str]] = {}
    for name, reason in reasons:
        by_reason.setdefault(reason, []).append(name)
    shown = "; ".join(f"{r} ({', '.join(ts)})" for r, ts in by_reason.items()) \
        or "no target takes this kind of model"
    failed = UnrunnableModel(f"{part.model_path.name}: no runtime here runs this model: "
                             f"{shown}", field="model")
    failed.ran = ran
    raise failed


def _strip(message: str, part: Partition) -> str:
    """The reason in one line, without the 'could not build FILE on TARGET:' prefix the
    error line already says."""
    text = " ".join(message.split())
    text = re.sub(rf"^.*?{re.escape(part.model_path.name)} on \S+: ", "", text)
    # "onnxruntime refused STEM[0:1] on T: why" (a segment's name, not the file's)
    text = re.sub(rf"^(\w+) refused {re.escape(part.model_path.stem)}\[\d+:\d+\] on \S+: ",
                  r"\1: ", text)
    # "onnxruntime failed on T: why": the targets are listed after the reason, once for all
    text = re.sub(r"^(\w+) failed on \S+: ", r"\1: ", text)
    # a native log repeats one complaint per tensor, sentences run together ("3.Tensor 33")
    seen: list[str] = []
    for sentence in re.split(r"(?<=[.!?])\s*(?=[A-Z])", text):
        if sentence and sentence not in seen:
            seen.append(sentence)
    text = " ".join(seen)
    return text if len(text) <= 300 else text[:300].rsplit(" ", 1)[0] + " ..."


def runnable_layers(part: Partition, backend: Backend, reference: Target,
                    feed: Feed) -> list[str]:
    """Merge (in place) every layer the reference cannot run alone with a neighbour; one line
    per merge saying why (kept in the plan's exclusions)."""
    notes: list[str] = []
    env = dict(feed)
    i = 0
    while i < len(part.layers) and len(part.layers) > 1:
        try:
            missing = [k for k in exe_inputs(part, i) if k not in env]
            if missing:  # a tensor the partition took for an input no earlier layer writes
                raise PlanError(f"it reads {missing[0]!r}, which no earlier layer writes",
                                field="model")
            exe = backend.compile(part.segment(i, i + 1), reference)
            try:
                out = owned(exe.run({k: env[k] for k in exe_inputs(part, i)}))
            finally:
                exe.close()
        except EdgepilotError as exc:
            first = i if i + 1 < len(part.layers) else i - 1
            # both indices and the count: read from a plan of one layer, "its neighbour"
            # named a layer no longer there
            notes.append(f"layers {first} and {first + 1} of {len(part.layers)} run as one: "
                         f"{reference} cannot run layer {i} alone: {exc.message}")
            merge_layers(part, first)
            if first < i:  # the merged layer starts earlier: its inputs come from the start
                env, i = dict(feed), 0
            continue
        env.update(out)
        i += 1
    return notes


def exe_inputs(part: Partition, i: int) -> tuple[str, ...]:
    """The tensors layer ``i`` reads (the model's own inputs for a one-layer model)."""
    return part.segment(i, i + 1).inputs
