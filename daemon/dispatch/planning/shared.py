"""Plans shared between identical boards: the fingerprint a plan is shared under, the store of
plans other boards published (a transport, MQTT, fills it) and the checks one passes before use.

A board of a kind measures a model once; the boards of the same fingerprint adopt its plan after
a short verification instead of measuring it again. The fingerprint hashes what a measured plan
depends on: the board's identity (device-tree model, compatible strings, family), its CPU
policies with their frequency tables, its devfreq devices with theirs, the runtimes and their
versions, the edgepilot version and the DVFS profile in force. A unit's serial number, clocks
and temperatures are not in it.

A published plan is data, never code. It is used only when it parses, names the model file's
sha256 and signature it was published under, cuts the model at the same layers as this board
does and uses only targets this board has; then it is planned and timed here (the plan end to
end, and each segment) and adopted only when those figures are within ``tolerance`` of the
published ones. Anything else is ignored with one ``plan.rejected`` event and the board plans
itself.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from edgepilot.board.board import Board
from edgepilot.dispatch.measuring.cells import LatencyTable

log = logging.getLogger(__name__)

FORMAT = 1
Emit = Callable[..., Any]
# (topic suffix "<fingerprint>/<model sha256>/<signature>", payload): the transport's publish
Publisher = Callable[[str, bytes], None]
# times the plan being verified once more: (end-to-end median ms, each segment's median ms,
# the fastest run end to end then per segment)
Retime = Callable[[], tuple[float, list[float], list[float]]]
_SHA_CHARS = frozenset("0123456789abcdef")


def fingerprint(board: Board | None, parts: Mapping[str, Any]) -> str:
    """16 hex digits naming boards whose measured plans are interchangeable. ``parts`` is the
    dispatcher's key parts (``profile``, ``runtimes``, ``edgepilot``)."""
    blob: dict[str, Any] = {"format": FORMAT, "profile": parts.get("profile"),
                            "runtimes": parts.get("runtimes"),
                            "edgepilot": parts.get("edgepilot")}
    if board is not None:
        blob["identity"] = board.identity.as_dict()
        blob["cpu"] = sorted([list(p.cpus), list(p.frequencies), p.hw_min_khz, p.hw_max_khz]
                             for p in board.policies())
        blob["devfreq"] = sorted([d.name, d.kind, list(d.frequencies)]
                                 for d in board.devfreq())
    text = json.dumps(blob, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def signature_segment(signature: str) -> str:
    """The signature as one topic level: itself when it is a safe one, else its hash (input
    names may hold '/', '+' or '#')."""
    if signature and len(signature) <= 200 and not any(c in signature for c in "/+#\0"):
        return signature
    return "sig-" + hashlib.sha256(signature.encode()).hexdigest()[:16]


class PlanExchange:
    """Plans published for this board's fingerprint, kept in memory as the transport receives
    them (retained messages), and the way this board's own plans go out.

    ``offer`` runs on the transport's thread, ``find``/``adopt``/``publish`` in the planning
    thread; one lock guards the store."""

    def __init__(self, fingerprint_of: Callable[[Mapping[str, Any]], str], *, emit: Emit,
                 source: str | None = None, tolerance: float = 0.10,
                 wait_s: float = 3.0) -> None:
        """``source``: this board's name in what it publishes; ``tolerance``: how far
        (relative) this board's timings may be from the published ones; ``wait_s``: how long
        a plan waits for the broker's retained plans to arrive."""
        self.fingerprint_of = fingerprint_of
        self.source = source
        self.emit = emit
        self.tolerance = tolerance
        self.wait_s = wait_s
        # set by the transport once it subscribed and the retained plans had time to arrive;
        # a plan waits for that only while a subscription is under way (``subscribing``), not
        # while the broker is away: then it plans itself at once
        self.ready = threading.Event()
        self.subscribing = False
        self._lock = threading.Lock()
        # (fingerprint, sha256, signature level) -> (the topic it came on, the plan)
        self._docs: dict[tuple[str, str, str], tuple[str, dict[str, Any]]] = {}
        self._publisher: Publisher | None = None
        self.adopted = 0
        self.published = 0

    def connect(self, publisher: Publisher | None) -> None:
        """Where this board's plans are published (None: nowhere, the transport is gone)."""
        self._publisher = publisher

    # ---- receiving (the transport's thread) --------------------------------------------------
    def offer(self, topic: str, fp: str, sha: str, sig: str, payload: bytes) -> None:
        """A retained plan message; an empty one clears the topic. Never raises: a bad message
        is one ``plan.rejected`` event."""
        if not payload:
            with self._lock:
                self._docs.pop((fp, sha, sig), None)
            return
        try:
            doc = json.loads(payload)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            self.reject(topic, f"not JSON: {exc}")
            return
        why = _malformed(doc, fp, sha, sig)
        if why is not None:
            self.reject(topic, why)
            return
        with self._lock:
            self._docs[(fp, sha, sig)] = (topic, doc)

    def reject(self, topic: str, reason: str, **fields: Any) -> None:
        """Ignore a published plan, with one ``plan.rejected`` event saying why."""
        log.warning("ignoring the shared plan on %s: %s", topic, reason)
        self.emit("plan.rejected", topic=topic, reason=reason, **fields)

    # ---- using (the planning thread) ---------------------------------------------------------
    def peek(self, parts: Mapping[str, Any], model_sha: str, signature: str
             ) -> dict[str, Any] | None:
        """The published plan ``find`` would look at, unchecked and without an event (what it
        says about the model file is checked by ``find``)."""
        if self.subscribing:
            self.ready.wait(self.wait_s)
        key = (self.fingerprint_of(parts), model_sha, signature_segment(signature))
        with self._lock:
            return self._docs.get(key, ("", None))[1]

    def find(self, parts: Mapping[str, Any], model_sha: str, signature: str,
             layers: Sequence[str], targets: Sequence[str],
             fits: Callable[[list[str]], bool] | None = None) -> dict[str, Any] | None:
        """A published plan for this model and signature that fits this board, or None.

        ``fits``: whether this board's layers can be made the published ones (merging
        neighbours as the publisher's reference did); without it they must equal ``layers``."""
        fp = self.fingerprint_of(parts)
        if self.subscribing:
            self.ready.wait(self.wait_s)
        key = (fp, model_sha, signature_segment(signature))
        with self._lock:
            topic, doc = self._docs.get(key, ("", None))
        if doc is None:
            return None
        why = None
        if not (fits(list(doc["layers"])) if fits is not None
                else list(doc["layers"]) == list(layers)):
            why = (f"layer boundaries differ: {len(doc['layers'])} layers published, " + (
                f"{len(layers)} here" if fits is None else "not how the model file is cut here"))
        else:
            missing = sorted(set(_targets_of(doc)) - set(targets))
            if missing:
                why = (f"names targets this board lacks: {', '.join(missing)}; this board "
                       f"has: {', '.join(targets)}")
        if why is not None:
            with self._lock:  # one event per message, not one per lookup
                if self._docs.get(key, ("", None))[1] is doc:
                    del self._docs[key]
            self.reject(topic, why, model_sha256=model_sha)
            return None
        return doc

    def adopt(self, doc: dict[str, Any], name: str, segments: Sequence[tuple[str, int, int]],
              measured_ms: float | None, segment_ms: Sequence[float], spent_s: float,
              retime: Retime | None = None, fastest: Sequence[float] = ()) -> bool:
        """Whether the plan just made from ``doc`` holds on this board: its end-to-end time and
        each segment's within ``tolerance`` of the published figures (``plan.adopted``; else
        ``plan.rejected`` and the caller measures).

        ``fastest``: this board's fastest run, end to end then per segment; compared with the
        publisher's (``fastest_ms``) when it published them, since load from other processes
        only ever slows a run and the fastest of a few runs is the one it disturbed least
        (medians of two loaded machines can differ by more than the tolerance). ``retime``
        times the plan once more when the first timing misses; the faster of the two is
        compared."""
        mine = [measured_ms, *segment_ms] if measured_ms is not None else []
        why = self._differs(doc, segments, mine, list(fastest))
        if why is not None and retime is not None and mine:
            again, per, quick = retime()
            mine = [min(a, b) for a, b in zip(mine, [again, *per], strict=False)]
            fastest = [min(a, b) for a, b in zip(fastest, quick, strict=False)] or quick
            why = self._differs(doc, segments, mine, list(fastest))
        if why is not None:
            self.reject(self._topic_of(doc), f"verification: {why}", model=name)
            return False
        published = doc["plan"]
        self.adopted += 1
        planning_s = float(doc["planning_s"])
        self.emit("plan.adopted", model=name, signature=doc["signature"],
                  fingerprint=doc["fingerprint"], source=doc.get("device_id"),
                  adopt_s=round(spent_s, 3), planning_s=round(planning_s, 3),
                  ratio=round(spent_s / planning_s, 4) if planning_s > 0 else None,
                  measured_ms=mine[0], published_ms=published["measured_ms"])
        return True

    def _differs(self, doc: dict[str, Any], segments: Sequence[tuple[str, int, int]],
                 median: list[float], fastest: list[float]) -> str | None:
        """How this board's timing of a published plan misses its figures (None: it holds):
        fastest runs against fastest runs where both are known, else medians."""
        theirs: list[float] = [float(doc["plan"]["measured_ms"]), *doc["segment_ms"]]
        mine, what = median, "median"
        if fastest and len(doc.get("fastest_ms") or ()) == len(fastest):
            theirs, mine, what = [float(x) for x in doc["fastest_ms"]], fastest, "fastest run"
        if not mine or not _close(mine[0], theirs[0], self.tolerance):
            return (f"end to end {mine[0] if mine else None} ms here vs {theirs[0]} ms "
                    f"published ({what}, tolerance {self.tolerance:.0%})")
        if [[t, s, e] for t, s, e in segments] != _segments_of(doc["plan"]):
            return None
        for k, (a, b) in enumerate(zip(mine[1:], theirs[1:], strict=False)):
            if not _close(a, b, self.tolerance):
                return (f"segment {k}: {a:.4f} ms here vs {b:.4f} ms published ({what}, "
                        f"tolerance {self.tolerance:.0%})")
        return None

    def publish(self, parts: Mapping[str, Any], doc: dict[str, Any]) -> None:
        """Publish a plan this board measured (retained, so boards that come later find it)."""
        publisher = self._publisher
        fp = self.fingerprint_of(parts)
        full = {"format": FORMAT, "fingerprint": fp, "device_id": self.source, **doc}
        suffix = f"{fp}/{doc['model_sha256']}/{signature_segment(doc['signature'])}"
        with self._lock:
            self._docs[(fp, doc["model_sha256"], signature_segment(doc["signature"]))] = \
                (suffix, full)
        if publisher is None:
            return
        publisher(suffix, json.dumps(full, separators=(",", ":"), default=str).encode())
        self.published += 1
        self.emit("plan.published", model=doc.get("model"), signature=doc["signature"],
                  fingerprint=fp, planning_s=doc.get("planning_s"))


    def drop(self, doc: dict[str, Any], reason: str, **fields: Any) -> None:
        """Refuse a plan ``find`` returned: one ``plan.rejected`` event, and it is not found
        again."""
        topic = self._topic_of(doc)
        with self._lock:
            for key, (_, held) in list(self._docs.items()):
                if held is doc:
                    del self._docs[key]
        self.reject(topic, reason, **fields)

    def _topic_of(self, doc: dict[str, Any]) -> str:
        with self._lock:
            return next((t for t, d in self._docs.values() if d is doc), "")


def _close(mine: float, theirs: float, tolerance: float) -> bool:
    return theirs > 0 and abs(mine / theirs - 1.0) <= tolerance


def published_segments(doc: Mapping[str, Any]) -> list[tuple[str, int, int]]:
    """The (target, start, end) segments of a published plan (one ``find`` returned)."""
    return [(str(t), int(s), int(e)) for t, s, e in _segments_of(doc["plan"])]


def _segments_of(plan: Mapping[str, Any]) -> list[list[Any]]:
    return [[seg["target"], *seg["layers"]] for seg in plan["segments"]]


def _targets_of(doc: Mapping[str, Any]) -> list[str]:
    return [*doc["profile"]["targets"], *(seg["target"] for seg in doc["plan"]["segments"])]


def _malformed(doc: Any, fp: str, sha: str, sig: str) -> str | None:
    """Why a published plan cannot be one (None: its shape is sound; what it says about the
    model and the board is checked when a plan is looked up)."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    if doc.get("format") != FORMAT:
        return f"format {doc.get('format')!r}; this daemon reads format {FORMAT}"
    if doc.get("fingerprint") != fp:
        return f"fingerprint {doc.get('fingerprint')!r} does not match its topic's {fp!r}"
    got = doc.get("model_sha256")
    if not isinstance(got, str) or len(got) != 64 or not set(got) <= _SHA_CHARS or got != sha:
        return f"model_sha256 {str(got)[:80]!r} does not match its topic's {sha!r}"
    if not isinstance(doc.get("signature"), str) or signature_segment(doc["signature"]) != sig:
        return f"signature {str(doc.get('signature'))[:80]!r} does not match its topic's {sig!r}"
    layers = doc.get("layers")
    if not isinstance(layers, list) or not all(isinstance(x, str) for x in layers):
        return "layers must be a list of layer names"
    try:
        table = LatencyTable.from_dict(doc["profile"])
        _require(len(table.cells) == len(layers), "one profile row per layer")
        segs = _segments_of(doc["plan"])
        _require(bool(segs) and all(isinstance(t, str) and 0 <= s < e <= len(layers)
                                    for t, s, e in segs), "segments within the layers")
        _require([s for _, s, _ in segs] == [0, *(e for _, _, e in segs[:-1])]
                 and segs[-1][2] == len(layers), "segments covering every layer once")
        _require(float(doc["plan"]["measured_ms"]) > 0, "a measured end-to-end time")
        _require(all(float(x) > 0 for x in doc["segment_ms"]), "segment times")
        _require(float(doc["planning_s"]) >= 0, "a planning time")
        _require(all(float(x) > 0 for x in doc.get("fastest_ms") or ()), "fastest runs")
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        return f"not a plan: {type(exc).__name__} {exc}"
    return None


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(f"needs {what}")
