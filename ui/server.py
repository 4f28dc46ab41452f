"""The console as one ASGI app: Streamlit's pages (``app.py``) and the console's own session routes beside them.

``posttrain console`` runs ``streamlit run`` on this file. The routes turn a login into the signed HttpOnly cookie
that keeps the user logged in across reloads and tabs (:mod:`posttrain.platform.sessions`):

- ``POST /_posttrain/session`` with a login's one-time code as its body: 204 and the cookie (``HttpOnly``,
  ``SameSite=Strict``, ``Secure`` behind HTTPS, as long as the session lasts); 403 for a code that is unknown, spent
  or expired.
- ``POST /_posttrain/logout``: the session the cookie names is revoked (when the page has not done it already) and
  the cookie dropped.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from posttrain.platform import sessions

MAX_BODY_BYTES = 1024


async def hand_off(request: Request) -> Response:
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        return PlainTextResponse("a login code is under 100 characters", status_code=413)
    try:
        cookie, max_age = await run_in_threadpool(sessions.redeem, body.decode("utf-8", "replace").strip())
    except sessions.SessionRefused as exc:
        return PlainTextResponse(str(exc), status_code=403)
    response = Response(status_code=204)
    response.set_cookie(sessions.COOKIE, cookie, max_age=max_age, path="/", httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")  # fmt: skip
    return response


async def log_out(request: Request) -> Response:
    if cookie := request.cookies.get(sessions.COOKIE):
        await run_in_threadpool(sessions.end_cookie, cookie)
    response = Response(status_code=204)
    response.delete_cookie(sessions.COOKIE, path="/", httponly=True, samesite="strict")
    return response


app = st.App(
    Path(__file__).with_name("app.py"),
    routes=[
        Route(sessions.HANDOFF_ROUTE, hand_off, methods=["POST"]),
        Route(sessions.LOGOUT_ROUTE, log_out, methods=["POST"]),
    ],
)
