"""A non-streamed generation whose client leaves stops: nobody will read its answer.

A streamed answer notices a client gone when its next chunk cannot be sent; a whole one is
sent only at its end, so without this a client that gave up (a timeout, a closed UI) left its
generation running to ``max_tokens`` or a full context, the device held all along.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import Request
from fastapi.responses import Response

log = logging.getLogger(__name__)
T = TypeVar("T")
# nginx's "client closed request": never seen by the client, only in access logs
CLIENT_GONE = 499


async def unless_client_leaves(request: Request, work: Awaitable[T]) -> T | Response:
    """``work``'s result; cancelled (which stops a generation at its next token) and a 499
    once the client disconnects first."""
    task = asyncio.ensure_future(work)

    async def left() -> None:
        # the body is read: the server's next message is the disconnect (or the end of the
        # response, which this never outlives)
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(left())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watch.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task  # the generation's own cleanup (its device given back) runs to its end
    log.info("%s %s: the client left before the answer; its generation was stopped",
             request.method, request.url.path)
    return Response(status_code=CLIENT_GONE)
