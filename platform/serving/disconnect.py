"""A request ends when its client leaves: the watcher the engine's and the gateway's routes share.

Starlette already cancels a streaming response the moment its client disconnects (it listens for
``http.disconnect`` beside the stream, and the stream's cleanup releases what it held).
:func:`unless_client_leaves` gives a response still being computed the same end: the engine's
non-streaming answers (their sequences leave the batch at the next decode step) and the gateway's
proxied ones (its upstream connection closes, so the engine behind it sees the disconnect too).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from fastapi import Request
from fastapi.responses import Response

CLIENT_CLOSED_REQUEST = 499  # nginx's status for a request whose client left before its answer: logged, never read


async def client_left(request: Request) -> None:
    """Return once ``request``'s client has disconnected. Call it after the body is read: from then on the next
    message the server receives is the disconnect (or the end of the response)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_client_leaves(request: Request, work: Coroutine[Any, Any, Response]) -> Response:
    """``work``'s response; when the client disconnects first, ``work`` is cancelled at once (its cleanup runs
    before this returns) and the answer is a :data:`CLIENT_CLOSED_REQUEST` response nobody reads. An exception
    ``work`` raises is raised here."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(client_left(request))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        task.cancel()  # nothing once it is done
    await asyncio.wait((task,))
    return Response(status_code=CLIENT_CLOSED_REQUEST) if task.cancelled() else task.result()
