"""Several choices in one OpenAI request: a list of prompts (``/v1/completions``) and ``n``.

LangChain's ``OpenAI`` LLM sends up to 20 prompts in one ``/v1/completions`` request, and
``n`` asks for several answers to one prompt. A board generates them one after another (one
model, one context): choice ``i * n + j`` is prompt ``i``'s ``j``-th answer, as OpenAI numbers
them. A request's ``seed`` gives its first answer to each prompt that seed and the next ones
``seed + j``, so ``n`` answers are not one answer ``n`` times. Usage adds up every answer's
tokens; a prompt's tokens count once per answer, since each answer evaluates it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from edgepilot.errors import CommandError
from edgepilot.serving.generate import StreamEnd, energy_usage

# an edge board runs the answers in turn: 32 answers of a 1-3 B model are minutes already
MAX_CHOICES = 32

Job = tuple[Any, dict[str, Any]]  # (prompt, llama params)


def jobs_of(prompts: list[Any], n: int, params: dict[str, Any]) -> list[Job]:
    """What to generate, in choice order; a request over :data:`MAX_CHOICES` is refused."""
    if len(prompts) * n > MAX_CHOICES:
        field = "n" if len(prompts) == 1 else "prompt"
        raise CommandError(f"{len(prompts)} prompt(s) x n={n} asks for {len(prompts) * n} "
                           f"answers; at most {MAX_CHOICES} per request (generated one after "
                           "another)", field=field)
    out: list[Job] = []
    for prompt in prompts:
        for j in range(n):
            seeded = params if j == 0 or params.get("seed") is None \
                else {**params, "seed": int(params["seed"]) + j}
            out.append((prompt, seeded))
    return out


def merged(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """One answer holding every answer's choice (renumbered in order) and their summed usage."""
    first = dict(answers[0])
    choices: list[dict[str, Any]] = []
    for answer in answers:
        for choice in answer.get("choices") or []:
            choices.append({**choice, "index": len(choices)})
    first["choices"] = choices
    usages = [a["usage"] for a in answers if isinstance(a.get("usage"), dict)]
    if len(answers) > 1 and usages:
        first["usage"] = _summed(usages)
    return first


COUNT_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")


def _summed(usages: list[dict[str, Any]]) -> dict[str, Any]:
    counts = {k: sum(int(u.get(k) or 0) for u in usages) for k in COUNT_KEYS}
    joules = [u.get("energy_j") for u in usages]
    energy = None if any(j is None for j in joules) else float(sum(joules))  # type: ignore[arg-type]
    return {**counts, **energy_usage(energy, counts["completion_tokens"])}


async def chained(jobs: list[Job], start: Callable[[Any, dict[str, Any]], Awaitable[Any]],
                  first: Any) -> AsyncGenerator[Any, None]:
    """The streams of ``jobs`` one after another, as one stream: each chunk's choice renumbered
    to its place, one :class:`StreamEnd` at the end with the summed usage (None when any
    stream failed). ``first`` is the first job's stream, begun by the caller (a full queue is
    still the request's 503); ``start`` begins each later one's."""
    usages: list[dict[str, Any]] = []
    energy: list[float | None] = []
    failed = False
    for k, (prompt, params) in enumerate(jobs):
        try:
            items = first if k == 0 else await start(prompt, params)
        except Exception as exc:  # a later answer's admission: the stream has begun
            yield exc
            failed = True
            break
        try:
            async for item in items:
                if isinstance(item, StreamEnd):
                    failed = failed or item.usage is None
                    usages.append(dict(item.usage or {}))
                    energy.append(item.energy.get("energy_j"))
                    break
                if isinstance(item, dict):
                    item = {**item, "choices": [{**c, "index": k}
                                                for c in item.get("choices") or []]}
                yield item
        finally:
            await items.aclose()
    summed = _summed([{**u, "energy_j": e} for u, e in zip(usages, energy, strict=True)]) \
        if usages else {}
    yield StreamEnd(None if failed or not usages else {k: summed[k] for k in COUNT_KEYS},
                    {"energy_j": summed.get("energy_j"),
                     "joules_per_token": summed.get("joules_per_token")})
