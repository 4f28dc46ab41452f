"""Disabling and enabling console users (admins): the command line's ``posttrain users disable|enable`` and the
console's Users page call these.

A disabled user is refused at their next request, wherever they come from: a console session is logged
out on its next run (:func:`posttrain.platform.auth.refresh_identity`), an action they call is refused
(:func:`posttrain.platform.auth.require`), a login fails, and the API keys they created are refused
(:func:`posttrain.platform.api_keys.check_key`). Enabling them again lets them log in, and their keys work
again; nothing else about the account changes either way. The last enabled admin cannot be disabled::

    disable_user(admin, "ann")     # ann's session, her actions and her keys are refused from now on
    enable_user(admin, "ann")      # she logs in again; her keys work again
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlmodel import col, func, select

from posttrain.platform.auth import AuthError, Identity, action, revoke_sessions
from posttrain.platform.db.engine import session
from posttrain.platform.db.models import ApiKey, AuditLog, Role, User


@dataclass(frozen=True)
class AccountChange:
    """What :func:`disable_user` or :func:`enable_user` did: the user, whether the account is disabled now,
    and how many unrevoked API keys that user created (refused while the account is disabled)."""

    username: str
    disabled: bool
    keys: int


@action("user.disable", Role.admin)
def disable_user(identity: Identity, username: str, *, url: str | None = None) -> AccountChange:
    """Disable ``username`` (admins): refused at their next request, with the keys they created."""
    return _set_disabled(identity, username, True, url)


@action("user.enable", Role.admin)
def enable_user(identity: Identity, username: str, *, url: str | None = None) -> AccountChange:
    """Enable ``username`` again (admins): they log in again, and the keys they created work again."""
    return _set_disabled(identity, username, False, url)


def _set_disabled(identity: Identity, username: str, disabled: bool, url: str | None) -> AccountChange:
    verb = "disable" if disabled else "enable"
    with session(url) as s:
        user = s.exec(select(User).where(User.username == username)).first()
        if user is None:
            raise AuthError(f"no user named {username!r}: `posttrain users list` shows the users there are")
        if user.disabled == disabled:
            raise AuthError(f"{username} is {verb}d already")
        if disabled and user.role is Role.admin and _enabled_admins(s) <= 1:
            raise AuthError(f"{username} is the last enabled admin: make another user an admin first "
                            "(`posttrain users add NAME --role admin`), then disable this one")  # fmt: skip
        user.disabled = disabled
        s.add(user)
        keys = _keys_created_by(s, username)
        ended = {"sessions_ended": revoke_sessions(s, username)} if disabled else {}  # logged out everywhere at once
        s.add(AuditLog(username=identity.username, action=f"user.{verb}", target=username,
                       details={"keys": keys, **ended}))  # fmt: skip
    return AccountChange(username, disabled, keys)


def _enabled_admins(s) -> int:
    """How many admins are enabled, their rows locked (PostgreSQL) until the transaction ends: of two admins
    disabling each other at once, the second sees the first's change (SQLite serialises writers itself)."""
    stmt = select(User.id).where(User.role == Role.admin, col(User.disabled).is_(False)).with_for_update()
    return len(s.exec(stmt).all())


def _keys_created_by(s, username: str) -> int:
    stmt = (
        select(func.count()).select_from(ApiKey).where(ApiKey.created_by == username, col(ApiKey.revoked_at).is_(None))
    )
    return int(s.exec(stmt).one())
