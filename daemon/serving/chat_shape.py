"""A text completion in the shape of a chat answer: for chats whose prompt the daemon rendered
(:mod:`edgepilot.serving.templates`) and llama.cpp completed."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any


def completion_as_chat(result: dict[str, Any]) -> dict[str, Any]:
    """``create_completion``'s answer as ``create_chat_completion``'s."""
    choices = [{"index": c.get("index", 0),
                "message": {"role": "assistant", "content": c.get("text", "")},
                "logprobs": c.get("logprobs"), "finish_reason": c.get("finish_reason")}
               for c in result.get("choices") or []]
    return {**result, "id": "chat" + str(result.get("id", "")), "object": "chat.completion",
            "choices": choices}


async def chunks_as_chat(items: AsyncGenerator[Any, None]) -> AsyncGenerator[Any, None]:
    """Streamed completion chunks as chat chunks (the first carries the role); other items
    (the stream's end, an error) pass as they are."""
    first = True
    try:
        async for item in items:
            if not isinstance(item, dict):
                yield item
                continue
            choices = []
            for c in item.get("choices") or []:
                delta: dict[str, Any] = {"role": "assistant"} if first else {}
                if c.get("text"):
                    delta["content"] = c["text"]
                choices.append({"index": c.get("index", 0), "delta": delta,
                                "logprobs": c.get("logprobs"),
                                "finish_reason": c.get("finish_reason")})
            first = False
            yield {**item, "id": "chat" + str(item.get("id", "")),
                   "object": "chat.completion.chunk", "choices": choices}
    finally:
        await items.aclose()
