"""Log-probabilities of the sampled tokens, for OpenAI's ``logprobs`` / ``top_logprobs``.

llama-cpp-python computes logprobs only for a model loaded with ``logits_all`` (the logits of
every position kept: n_ctx x vocabulary floats, hundreds of MiB for a small model, and a slower
prefill for every request). Here a logits processor, first in the list so that it sees the
model's raw logits before penalties, grammar or temperature, takes the log-softmax of each
step's logits and keeps the sampled token's value and the ``top`` best alternatives; only the
last step's vector is held at a time. The result is OpenAI's chat shape
(``[{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]``), one entry per token
of the answer: the end-of-generation token is left out; ``token`` is the part of the answer's
text the token wrote (so the tokens concatenate to the text, as llama-cpp-python decodes it,
dropping bytes that are no UTF-8; a token cut by a ``stop`` string keeps the part before it),
``bytes`` the token's own bytes. A stream gives each chunk the entries of the tokens whose text
it completes (:meth:`LogprobRecorder.more`), so its chunks' entries are the whole answer's.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from edgepilot.backends.llamacpp.runtime import import_llama_cpp

MAX_TOP = 20  # OpenAI's limit on top_logprobs


class LogprobRecorder:
    """A llama-cpp-python logits processor recording one generation's token logprobs."""

    def __init__(self, llm: Any, top: int) -> None:
        self.llm = llm
        self.top = max(0, min(int(top), MAX_TOP))
        # per sampled token: (its logprob, the top ids, their logprobs)
        self.steps: list[tuple[float, np.ndarray, np.ndarray]] = []
        self._pending: np.ndarray | None = None  # the last step's log-softmax
        # a stream's progress through the answer: entries given, their bytes and text
        self._emitted, self._held, self._done, self._at = 0, b"", "", 0
        self._lock = threading.Lock()  # steps are recorded from the sampling thread too

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        x = np.asarray(scores, dtype=np.float32)
        peak = x.max()
        # float32 as llama.cpp's logits; the sum in float64 (a vocabulary of 10^5 terms)
        lse = peak + np.float32(np.log(np.exp(x - peak).sum(dtype=np.float64)))
        with self._lock:
            self._close(input_ids)
            self._pending = x - lse
        return scores

    def _close(self, input_ids: Any = None) -> None:
        """Record the pending step once its token is known: ``llm.sampled`` grew, or (called
        for the next step) it is the last of ``input_ids``, the tokens now in the context. A
        parallel model samples on the engine's thread while the request's thread appends to
        ``sampled``: the next step can come first."""
        lp = self._pending
        if lp is None:
            return
        sampled = self.llm.sampled
        if len(sampled) > len(self.steps):
            token = int(sampled[len(self.steps)])
        elif input_ids is not None and len(input_ids):
            token = int(input_ids[-1])
        else:
            return
        ids = np.zeros(0, dtype=np.int64)
        if self.top:
            ids = np.argpartition(-lp, self.top - 1)[:self.top]
            ids = ids[np.argsort(-lp[ids], kind="stable")]
        self.steps.append((float(lp[token]), ids, lp[ids]))
        self._pending = None

    def content(self, text: str | None) -> list[dict[str, Any]]:
        """OpenAI's ``logprobs.content`` for the answer ``text`` (after the generation)."""
        self._emitted, self._held, self._done, self._at = 0, b"", "", 0
        return self.more(text or "", final=True)

    def more(self, text: str, *, final: bool) -> list[dict[str, Any]]:
        """The entries not given yet whose text ``text`` (the answer so far) holds whole; with
        ``final``, every remaining one (the last cut where a stop string cut the answer)."""
        with self._lock:
            self._close()
        llama_cpp = import_llama_cpp()
        vocab = self.llm._model.vocab
        out: list[dict[str, Any]] = []
        sampled = self.llm.sampled
        while self._emitted < min(len(sampled), len(self.steps)):
            token = int(sampled[self._emitted])
            if (self._at >= len(text) and final) or llama_cpp.llama_vocab_is_eog(vocab, token):
                break
            piece = self._piece(token)
            # the text as llama-cpp-python decodes it (bytes that are no UTF-8 dropped): a
            # token whose bytes end a character carries it, one that starts it carries ""
            now = (self._held + piece).decode("utf-8", errors="ignore")
            mine = now[len(self._done):] if now.startswith(self._done) else ""
            if self._at + len(mine) > len(text):
                if not final:
                    break  # held back by the stream (a possible stop string): not yet
                mine = mine[:len(text) - self._at]  # a stop string cut the answer here
            logprob, ids, lps = self.steps[self._emitted]
            self._held, self._done, self._at = self._held + piece, now, self._at + len(mine)
            self._emitted += 1
            out.append({"token": mine, "logprob": logprob, "bytes": list(piece),
                        "top_logprobs": [self._entry(self._piece(int(i)), float(v))
                                         for i, v in zip(ids, lps, strict=True)]})
        return out

    def _piece(self, token: int) -> bytes:
        return bytes(self.llm.detokenize([token]))

    @staticmethod
    def _entry(piece: bytes, logprob: float) -> dict[str, Any]:
        return {"token": piece.decode("utf-8", errors="replace"), "logprob": logprob,
                "bytes": list(piece)}


def with_logprobs(params: dict[str, Any], llm: Any) -> tuple[dict[str, Any],
                                                             LogprobRecorder | None]:
    """``params`` without ``logprobs_top`` (the daemon's: how many alternatives per token,
    absent or None for no logprobs), with a recorder first among its logits processors."""
    top = params.pop("logprobs_top", None)
    if top is None:
        return params, None
    recorder = LogprobRecorder(llm, int(top))
    llama_cpp = import_llama_cpp()
    processors = llama_cpp.LogitsProcessorList([recorder,
                                                *(params.get("logits_processor") or [])])
    return {**params, "logits_processor": processors}, recorder


def chunk_text(chunk: dict[str, Any]) -> str:
    """The text a streamed chunk (chat or completion) adds."""
    choice = (chunk.get("choices") or [{}])[0]
    return str((choice.get("delta") or {}).get("content") or choice.get("text") or "")


def streamed(chunks: Iterable[dict[str, Any]], recorder: LogprobRecorder | None
             ) -> Iterator[dict[str, Any]]:
    """``chunks`` as they come, each (with a recorder) carrying the logprobs of the tokens
    whose text it completes; the last one, with its finish reason, flushes the rest."""
    text = ""
    for chunk in chunks:
        if recorder is not None and chunk.get("choices"):
            text += chunk_text(chunk)
            choice = chunk["choices"][0]
            choice["logprobs"] = {"content": recorder.more(
                text, final=bool(choice.get("finish_reason")))}
        yield chunk


def attach(out: dict[str, Any], recorder: LogprobRecorder | None, chat: bool) -> dict[str, Any]:
    """A whole answer with its first choice's ``logprobs`` set from ``recorder``."""
    if recorder is None:
        return out
    choice = out["choices"][0]
    text = choice["message"].get("content") if chat else choice.get("text")
    choice["logprobs"] = {"content": recorder.content(text)}
    return out
