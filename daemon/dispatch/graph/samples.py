"""Inputs that look like real inputs, for profiling, calibration and the accuracy guard.

Random N(0, 1) everywhere is nonsense for most real models: token ids past the embedding
table make ``Gather`` fail, a sample-rate input compared with 16000 takes a branch no real
caller takes, a recurrent state is zero at the start of a stream. So, in order of preference:

1. **real samples** from ``[dispatch] calibration_dir``: ``<dir>/<model>/*.npz`` (one sample a
   file, one array per input), ``<dir>/<model>.npz`` (one sample) or ``<dir>/<model>/<input>.npy``
   (one sample per input file); only samples of the plan's shapes are used;
2. **recent requests** the daemon kept (``[dispatch] sample_requests``, opt-in);
3. **generated** inputs guided by the graph: integer inputs that index a table (``Gather``,
   ``Embedding``) stay below its row count, masks are 1, token-type ids 0, positions count up,
   integers compared with constants take those constants, state tensors start at 0, images
   are in [0, 1), a float scalar or vector of at most three is a control (a TTS model's
   ``speed`` or ``scales``) and is 1, everything else is N(0, 1).

Every plan says which source and which rule each input got (``inputs_used`` in its JSON).
"""

from __future__ import annotations

import logging
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgepilot.backends.base import TensorSpec
from edgepilot.dispatch.graph.signature import Shapes
from edgepilot.errors import PlanError

log = logging.getLogger(__name__)

Feed = dict[str, np.ndarray]
# ops an integer tensor passes through unchanged in meaning on its way to a Gather
_PASS = {"Cast", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity", "Expand", "Slice",
         "Transpose", "Tile", "Concat", "Split", "Gather"}
_MASK = re.compile(r"mask", re.I)
# what an attention mask's values meet on its way into the scores (after Cast to float)
_MASK_OPS = {"Sub", "Mul", "Where", "Not", "CumSum", "ReduceSum", "Less", "Greater", "And"}
_TYPE_IDS = re.compile(r"token_?type|segment", re.I)
_POSITIONS = re.compile(r"position", re.I)
_RATE = re.compile(r"(^|_)(sr|sample_?rate|sampling_?rate)$", re.I)
_STATE = re.compile(r"(^|[_.\-/])(state|states|hidden|cache|past|h0|c0|h|c|mem|memory)"
                    r"([_.\-/:0-9]|$)", re.I)


@dataclass
class Rule:
    """How one input is generated: ``kind`` and its parameters."""

    kind: str                   # ids | ones | zeros | arange | choice | uniform | normal | full
    high: int = 0               # ids: exclusive upper bound
    values: list[float] = field(default_factory=list)   # choice
    low: float = 0.0            # uniform
    top: float = 1.0            # uniform

    def describe(self) -> str:
        if self.kind == "ids":
            return f"ids in [0, {self.high})"
        if self.kind == "choice":
            return "one of " + ", ".join(f"{v:g}" for v in self.values)
        if self.kind == "uniform":
            return f"uniform in [{self.low:g}, {self.top:g})"
        return {"ones": "ones (mask)", "zeros": "zeros", "arange": "0, 1, 2, ... (positions)",
                "normal": "N(0, 1)"}.get(self.kind, self.kind)


@dataclass
class Samples:
    """Calibration inputs and where they came from (shown in the plan)."""

    feeds: list[Feed]
    source: str                      # calibration_dir | requests | generated
    rules: dict[str, str] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {"source": self.source, "count": len(self.feeds), "inputs": dict(self.rules)}

    def generated_hint(self, specs: Sequence[TensorSpec], model: str) -> str:
        """What to add to an error of a model that failed on generated inputs with integer
        inputs among them (a size, an index, a shape only its caller knows): which, and
        where real samples go ("" otherwise)."""
        ints = [s.name for s in specs if s.name in self.rules and not _is_float(s.dtype)
                and s.dtype not in ("bool", "object")]
        if self.source != "generated" or not ints:
            return ""
        shown = ", ".join(f"{n!r} {self.rules[n]}" for n in ints)
        return (f"; it ran on generated inputs ({shown}): where an integer input holds sizes, "
                f"indices or a shape, put real samples in [dispatch] calibration_dir "
                f"(<dir>/{model}.npz, one array per input)")


# ---- graph hints (ONNX) ----------------------------------------------------------------------
def rules_for(path: Path, kind: str, specs: Sequence[TensorSpec]) -> dict[str, Rule]:
    """How each input of the model at ``path`` is generated when no real sample is at hand:
    from how an ONNX graph uses it, else from its name, type and shape."""
    if kind != "onnx":
        return {s.name: name_rule(s) for s in specs}
    from edgepilot.formats.onnx_outline import onnx_outline

    try:
        model = onnx_outline(path)
    except Exception as exc:
        raise PlanError(f"{path.name} is not a readable ONNX model: {exc}",
                        field="model") from None
    return onnx_rules(model, specs)


def onnx_rules(model: Any, specs: Sequence[TensorSpec]) -> dict[str, Rule]:
    """Rules for the inputs of an ONNX ``ModelProto`` read from how the graph uses them."""
    g = model.graph
    dims: dict[str, list[int]] = {i.name: list(i.dims) for i in g.initializer}
    consts: dict[str, np.ndarray] = {}
    from onnx import numpy_helper

    for init in g.initializer:
        if int(np.prod(init.dims)) <= 16:
            consts[init.name] = numpy_helper.to_array(init)
    consumers: dict[str, list[Any]] = {}
    producer: dict[str, Any] = {}
    for n in g.node:
        for t in n.input:
            consumers.setdefault(t, []).append(n)
        for o in n.output:
            producer[o] = n
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    arr = numpy_helper.to_array(a.t)
                    dims[n.output[0]] = list(arr.shape)
                    if arr.size <= 16:
                        consts[n.output[0]] = arr

    def table_rows(t: str, axis: int) -> int | None:
        seen = 0
        while seen < 8:
            if dims.get(t):
                return int(dims[t][axis])
            p = producer.get(t)
            # a quantized table is dequantized on the way (Cast, then Mul by its scale)
            if p is None or p.op_type not in ("DequantizeLinear", "Cast", "Identity", "Mul",
                                              "Div", "Add", "Sub"):
                return None
            t, seen = p.input[0], seen + 1
        return None

    def walk(start: str, rank: int) -> Rule | None:
        todo, seen = [start], {start}
        compared: list[float] = []
        masks = False  # it reaches arithmetic on its values, as an attention mask does
        tables: list[int] = []  # every table it indexes: one input's channels may index
        while todo:             # tables of 139 and 6227 rows (a word segmenter's)
            t = todo.pop()
            for n in consumers.get(t, []):
                if n.op_type == "Gather" and len(n.input) > 1 and n.input[1] == t:
                    axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
                    rows = table_rows(n.input[0], axis)
                    if rows:
                        tables.append(rows)
                if n.op_type == "Equal":
                    other = n.input[1] if n.input[0] == t else n.input[0]
                    if other in consts:
                        compared.extend(float(v) for v in np.ravel(consts[other]))
                masks = masks or n.op_type in _MASK_OPS
                if n.op_type in _PASS and n.input and n.input[0] == t:
                    for o in n.output:
                        if o not in seen:
                            seen.add(o)
                            todo.append(o)
        if tables:
            return Rule("ids", high=min(tables))
        if compared:
            return Rule("choice", values=sorted(set(compared), reverse=True))
        if masks and rank >= 2:
            # a [batch, sequence] integer that no table is indexed by and whose values are
            # computed with (``(1 - mask) * -10000``, a CumSum of positions): a mask, whatever
            # its export called it (``onnx::Unsqueeze_1``). Drawn as small ids it was 0..7, the
            # softmax saturated, and an int8 tagger 0.49 off on real text checked at 0.0
            return Rule("ones")
        return None

    rules: dict[str, Rule] = {}
    for spec in specs:
        rule = walk(spec.name, len(spec.shape) if spec.rank_known else 0) \
            if not _is_float(spec.dtype) else None
        rules[spec.name] = rule or name_rule(spec)
    return rules


def _is_float(dtype: str) -> bool:
    return np.issubdtype(np.dtype(dtype), np.floating)


def name_rule(spec: TensorSpec) -> Rule:
    """The rule an input gets from its name, type and shape alone."""
    name, dtype = spec.name, np.dtype(spec.dtype)
    if dtype == np.bool_:
        return Rule("ones") if _MASK.search(name) else Rule("choice", values=[0.0, 1.0])
    if not np.issubdtype(dtype, np.floating):
        if _MASK.search(name):
            return Rule("ones")
        if _TYPE_IDS.search(name):
            return Rule("zeros")
        if _POSITIONS.search(name):
            return Rule("arange")
        if _RATE.search(name):
            return Rule("choice", values=[16000.0])
        if dtype in (np.int8, np.uint8):
            # a quantized tensor: its whole range is meaningful
            info = np.iinfo(dtype)
            return Rule("uniform", low=float(info.min), top=float(info.max) + 1)
        return Rule("ids", high=8)
    if _STATE.search(name):
        return Rule("zeros")
    if _MASK.search(name):
        return Rule("ones")
    shape = spec.shape
    if not spec.rank_known:
        return Rule("normal")
    if len(shape) <= 1 and all(isinstance(d, int) and d <= 3 for d in shape):
        # a speed or length scale: drawn from N(0, 1) it was near 0 or negative, and
        # Kokoro TTS at speed 0.02 writes 50x the audio (68 s a run instead of 1.4 s)
        return Rule("choice", values=[1.0])
    if len(shape) == 4 and (shape[1] in (1, 3, 4) or shape[3] in (1, 3, 4)):
        return Rule("uniform", low=0.0, top=1.0)   # an image
    return Rule("normal")


def generate(specs: Sequence[TensorSpec], shapes: Shapes, rules: Mapping[str, Rule],
             count: int, seed: int = 0) -> Samples:
    """``count`` inputs of ``shapes`` drawn by ``rules`` (name rules for inputs without)."""
    rng = np.random.default_rng(seed)
    feeds: list[Feed] = []
    used = {s.name: rules.get(s.name) or name_rule(s) for s in specs}
    for _ in range(max(1, count)):
        feed: Feed = {}
        for spec in specs:
            feed[spec.name] = _draw(used[spec.name], shapes[spec.name], np.dtype(spec.dtype),
                                    rng)
        feeds.append(feed)
    return Samples(feeds, "generated", {n: r.describe() for n, r in used.items()})


def _draw(rule: Rule, shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator
          ) -> np.ndarray:
    if dtype.kind in "OSU":  # text (a label encoder's, a tokenizer's): letters, not numbers
        letters = np.array(list(string.ascii_lowercase), dtype=object)
        return letters[rng.integers(0, len(letters), size=shape)]
    if rule.kind == "ids":
        return rng.integers(0, max(1, rule.high), size=shape).astype(dtype)
    if rule.kind == "ones":
        return np.ones(shape, dtype=dtype)
    if rule.kind == "zeros":
        return np.zeros(shape, dtype=dtype)
    if rule.kind == "arange":
        last = shape[-1] if shape else 1
        return np.broadcast_to(np.arange(last), shape).astype(dtype) if shape \
            else np.zeros((), dtype)
    if rule.kind == "choice":
        return np.full(shape, rule.values[0] if rule.values else 0, dtype=dtype)
    if rule.kind == "uniform":
        if np.issubdtype(dtype, np.integer):
            return rng.integers(int(rule.low), int(rule.top), size=shape).astype(dtype)
        return rng.uniform(rule.low, rule.top, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


# ---- real samples ----------------------------------------------------------------------------
def from_dir(directory: Path, model: str, specs: Sequence[TensorSpec], shapes: Shapes,
             limit: int) -> list[Feed]:
    """Samples of ``shapes`` for ``model`` under ``directory`` (see the module docstring)."""
    base = Path(directory)
    found: list[Feed] = []
    single = base / f"{model}.npz"
    folder = base / model
    files = [single] if single.is_file() else []
    if folder.is_dir():
        files.extend(sorted(folder.glob("*.npz")))
    for f in files:
        found.append(_load_npz(f))
    if folder.is_dir():
        npy = {p.stem: p for p in folder.glob("*.npy")}
        if npy and all(s.name in npy for s in specs):
            found.append({s.name: _load_npy(npy[s.name]) for s in specs})
    names = {s.name for s in specs}
    fitting: list[Feed] = []
    for feed in found:
        missing = names - set(feed)
        if missing:
            raise PlanError(f"calibration sample for {model!r} lacks input(s) "
                            f"{', '.join(sorted(missing))}", field="dispatch.calibration_dir")
        if all(tuple(feed[n].shape) == shapes[n] for n in names):
            fitting.append({s.name: feed[s.name].astype(np.dtype(s.dtype), copy=False)
                            for s in specs})
    return fitting[:limit]


def _load_npz(path: Path) -> Feed:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: np.asarray(data[k]) for k in data.files}
    except (OSError, ValueError) as exc:
        raise PlanError(f"calibration sample {path} is not a readable .npz: {exc}",
                        field="dispatch.calibration_dir") from None


def _load_npy(path: Path) -> np.ndarray:
    try:
        return np.asarray(np.load(path, allow_pickle=False))
    except (OSError, ValueError) as exc:
        raise PlanError(f"calibration sample {path} is not a readable .npy: {exc}",
                        field="dispatch.calibration_dir") from None


def pick(specs: Sequence[TensorSpec], shapes: Shapes, rules: Mapping[str, Rule], count: int,
         model: str, calibration_dir: Path | None = None,
         recent: Sequence[Feed] = ()) -> Samples:
    """The best calibration inputs available, in the order of the module docstring."""
    if calibration_dir is not None:
        feeds = from_dir(calibration_dir, model, specs, shapes, count)
        if feeds:
            return Samples(feeds, "calibration_dir",
                           {s.name: f"{len(feeds)} real sample(s)" for s in specs})
        log.info("no calibration sample of %s in %s has the plan's shapes; generating inputs",
                 model, calibration_dir)
    names = {s.name for s in specs}
    fitting = [f for f in recent if set(f) >= names
               and all(tuple(np.shape(f[n])) == shapes[n] for n in names)]
    if fitting:
        feeds = [{s.name: np.asarray(f[s.name]) for s in specs} for f in fitting[-count:]]
        return Samples(feeds, "requests", {s.name: f"{len(feeds)} recent request(s)"
                                           for s in specs})
    return generate(specs, shapes, rules, count)
