"""Console sessions that survive a reload: a signed, expiring HttpOnly cookie naming a session row.

A password login in the console starts a session (:func:`start`): a row in ``console_session`` with its expiry, and
a one-time handoff code (60 s, single use, kept hashed). The page hands the code to the console's own route
(``POST /_posttrain/session``, :mod:`posttrain.ui.server`), which redeems it (:func:`redeem`) and answers with the
cookie: ``<session id>.<expiry>`` signed with HMAC-SHA256 under a key kept once in ``<data_dir>/console`` (0600),
``HttpOnly`` (page scripts never read it), ``SameSite=Strict``. The code goes through the page, never the cookie.

A reload, or a second tab, sends the cookie with the page's connection; :func:`resume` checks the signature, the
expiry, that the row is not revoked and that the user exists and is enabled, and gives the identity with its
current role. A forged or altered cookie fails the signature; an expired one fails the expiry, in the cookie and in
the row. Logout revokes the row (:func:`end`); a password change or a disabled account revokes every row of the
user (:func:`posttrain.platform.auth.revoke_sessions`), and every page run checks its session is still live.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from datetime import timedelta
from pathlib import Path

from sqlmodel import select

from posttrain.platform.auth import Identity, audit, kept_secret
from posttrain.platform.db.engine import session
from posttrain.platform.db.models import ConsoleSession, User, utcnow
from posttrain.platform.settings import get_settings

COOKIE = "posttrain_session"
HANDOFF_ROUTE = "/_posttrain/session"  # the console's route that turns a login's one-time code into the cookie
LOGOUT_ROUTE = "/_posttrain/logout"  # and the one that drops it
HANDOFF_TTL = timedelta(seconds=60)
MAX_COOKIE_CHARS = 200  # a real cookie is about 70; anything longer is refused before it is parsed


class SessionRefused(ValueError):
    """A handoff code that is unknown, used or expired (the message never repeats it)."""


def _key() -> bytes:
    return kept_secret(Path(get_settings().data_dir) / "console", "session_key").encode()


def _sign(payload: str) -> str:
    mac = hmac.new(_key(), payload.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).decode().rstrip("=")


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def start(identity: Identity, *, url: str | None = None) -> tuple[int, str]:
    """A new session of ``identity`` (after its password was checked): its id, and the one-time code the page hands
    to the console's session route for the cookie."""
    code = secrets.token_urlsafe(32)
    now = utcnow()
    hours = get_settings().console_session_hours
    row = ConsoleSession(username=identity.username, created_at=now, expires_at=now + timedelta(hours=hours),
                         handoff_sha256=_sha256(code), handoff_expires_at=now + HANDOFF_TTL)  # fmt: skip
    with session(url) as s:
        s.add(row)
        s.flush()
        assert row.id is not None
        sid = row.id
    return sid, code


def redeem(code: str, *, url: str | None = None) -> tuple[str, int]:
    """The cookie for the session whose handoff code is ``code`` (once: the code is spent), and its max-age in
    seconds; :class:`SessionRefused` for an unknown, spent or expired code, or a revoked session."""
    now = utcnow()
    with session(url) as s:
        row = s.exec(select(ConsoleSession).where(ConsoleSession.handoff_sha256 == _sha256(code[:100]))).first()
        if row is None or row.revoked_at is not None or row.handoff_expires_at is None:
            raise SessionRefused("unknown or spent login code: log in again")
        if row.handoff_expires_at <= now:
            raise SessionRefused("the login code expired: log in again")
        row.handoff_sha256, row.handoff_expires_at = None, None
        s.add(row)
        expires = int(row.expires_at.timestamp())
        payload = f"{row.id}.{expires}"
    return f"{payload}.{_sign(payload)}", max(0, expires - int(now.timestamp()))


def _verified(cookie: str) -> tuple[int, int] | None:
    """The session id and expiry a cookie names, when its signature is ours; None for anything else."""
    if not cookie or len(cookie) > MAX_COOKIE_CHARS:
        return None
    parts = cookie.split(".")
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    payload = f"{parts[0]}.{parts[1]}"
    if not hmac.compare_digest(_sign(payload), parts[2]):
        return None
    return int(parts[0]), int(parts[1])


def resume(cookie: str, *, url: str | None = None) -> tuple[Identity, int] | None:
    """The identity (with its current role) and session id a browser's cookie stands for; None when the cookie is
    forged or altered, expired, or its session revoked, or the user is gone or disabled."""
    named = _verified(cookie)
    if named is None:
        return None
    sid, expires = named
    now = utcnow()
    if expires <= now.timestamp():
        return None
    with session(url, read_only=True) as s:
        row = s.get(ConsoleSession, sid)
        if row is None or row.revoked_at is not None or row.expires_at <= now:
            return None
        user = s.exec(select(User).where(User.username == row.username)).first()
        if user is None or user.disabled:
            return None
        return Identity(user.username, user.role), sid


def live(sid: int, *, url: str | None = None) -> bool:
    """Whether session ``sid`` may still be used (not revoked, not expired): every page run asks."""
    with session(url, read_only=True) as s:
        row = s.get(ConsoleSession, sid)
        return row is not None and row.revoked_at is None and row.expires_at > utcnow()


def end(sid: int, username: str, *, url: str | None = None) -> None:
    """Log session ``sid`` out (its cookie is refused from now on, in every tab)."""
    _revoke(sid, url)
    audit(username, "logout", target=f"session {sid}")


def end_cookie(cookie: str, *, url: str | None = None) -> None:
    """Log out the session a browser's cookie names, when the cookie is ours (the logout route)."""
    if (named := _verified(cookie)) is not None:
        _revoke(named[0], url)


def _revoke(sid: int, url: str | None) -> None:
    with session(url) as s:
        row = s.get(ConsoleSession, sid)
        if row is not None and row.revoked_at is None:
            row.revoked_at = utcnow()
            row.handoff_sha256 = None
            s.add(row)
