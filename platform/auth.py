"""Users, roles, password login and the audit log.

Passwords are hashed with argon2id (salted, deliberately slow). Repeated
failures lock an account for a growing delay, and every login, failure and
change is written to the audit log. Roles are ordered: a viewer reads, an
operator also uploads, launches and stops, an admin also manages users and
settings.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlmodel import col, func, select

from posttrain.platform.db.engine import session
from posttrain.platform.db.models import AuditLog, Role, User, utcnow

MIN_PASSWORD_LENGTH = 10
FREE_FAILURES = 3  # failures before an account is locked for a while
# Every refused login gets this one message: a locked account, a wrong password and a name that
# does not exist read the same, so the message tells nobody which usernames exist.
REFUSED = "wrong username or password (after repeated failures, logins are refused for a while: try again later)"
MAX_LOCK_S = 900
FAILURE_DELAY_S = 0.5  # every failed attempt also costs the caller this long

ROLE_RANK = {Role.viewer: 0, Role.operator: 1, Role.admin: 2}

_hasher = PasswordHasher()  # argon2id, salted


class AuthError(ValueError):
    """A login or user change was refused; the message says why (never which part was wrong)."""


@dataclass(frozen=True)
class Identity:
    """Who is logged in, as pages and commands see it."""

    username: str
    role: Role

    def can(self, needed: Role) -> bool:
        return ROLE_RANK[self.role] >= ROLE_RANK[needed]


def audit(username: str, action: str, target: str = "", details: dict[str, Any] | None = None, *, url: str | None = None) -> None:
    with session(url) as s:
        s.add(AuditLog(username=username, action=action, target=target, details=details or {}))


def hash_password(password: str) -> str:
    if len(password) < MIN_PASSWORD_LENGTH:
        raise AuthError(f"a password needs at least {MIN_PASSWORD_LENGTH} characters")
    return _hasher.hash(password)


def create_user(username: str, password: str, role: Role = Role.viewer, *, by: str = "system", url: str | None = None) -> Identity:
    username = username.strip()
    if not username or len(username) > 128 or any(c.isspace() for c in username):
        raise AuthError("a username is 1-128 characters without spaces")
    digest = hash_password(password)
    with session(url) as s:
        if s.exec(select(User).where(User.username == username)).first() is not None:
            raise AuthError(f"user {username!r} already exists")
        s.add(User(username=username, password_hash=digest, role=role))
        s.add(AuditLog(username=by, action="user.create", target=username, details={"role": role.value}))
    return Identity(username, role)


def set_password(username: str, password: str, *, by: str = "system", url: str | None = None) -> None:
    digest = hash_password(password)
    with session(url) as s:
        user = _user(s, username)
        user.password_hash = digest
        user.failed_logins = 0
        user.locked_until = None
        s.add(user)
        s.add(AuditLog(username=by, action="user.password", target=username))


def set_role(username: str, role: Role, *, by: str = "system", url: str | None = None) -> None:
    with session(url) as s:
        user = _user(s, username)
        if user.role is Role.admin and role is not Role.admin and _admin_count(s) <= 1:
            raise AuthError("the last admin cannot lose the admin role")
        user.role = role
        s.add(user)
        s.add(AuditLog(username=by, action="user.role", target=username, details={"role": role.value}))


def list_users(*, url: str | None = None) -> list[User]:
    with session(url, read_only=True) as s:
        return list(s.exec(select(User).order_by(User.username)).all())


def has_admin(*, url: str | None = None) -> bool:
    with session(url, read_only=True) as s:
        return _admin_count(s) > 0


def _admin_count(s) -> int:  # type: ignore[no-untyped-def]
    stmt = select(func.count()).select_from(User).where(User.role == Role.admin, col(User.disabled).is_(False))
    return int(s.exec(stmt).one())


def _user(s, username: str) -> User:  # type: ignore[no-untyped-def]
    user = s.exec(select(User).where(User.username == username)).first()
    if user is None:
        raise AuthError(f"no user named {username!r}")
    return user


def lock_seconds(failures: int) -> float:
    """How long an account stays locked after ``failures`` consecutive failures."""
    if failures < FREE_FAILURES:
        return 0.0
    return float(min(MAX_LOCK_S, 2 ** (failures - FREE_FAILURES + 1)))


def _plausible_username(username: str) -> bool:
    """What ``create_user`` could have stored: 1-128 printable characters, no spaces. Anything else
    (NUL bytes, control characters, unpaired surrogates, megabytes) is refused before the database."""
    return (
        isinstance(username, str)
        and 0 < len(username) <= 128
        and all(c.isprintable() and not c.isspace() for c in username)
        and not any(0xD800 <= ord(c) <= 0xDFFF for c in username)
    )


def _shown(username: str) -> str:
    """A username as the audit log may record it: printable, encodable, at most 128 characters."""
    text = "".join(c if c.isprintable() and not 0xD800 <= ord(c) <= 0xDFFF else "?" for c in str(username)[:128])
    return text or "?"


def refresh_identity(identity: Identity, *, url: str | None = None) -> Identity | None:
    """The identity as the database has it now: ``None`` once the user is disabled, the current role
    after a role change. An identity with no user row behind it (tests, tools) is returned unchanged."""
    with session(url, read_only=True) as s:
        user = s.exec(select(User).where(User.username == identity.username)).first()
    if user is None:
        return identity
    if user.disabled:
        return None
    return identity if user.role is identity.role else Identity(user.username, user.role)


def authenticate(username: str, password: str, *, url: str | None = None) -> Identity:
    """Check a password; raise :class:`AuthError` (after a delay) when refused."""
    now = utcnow()
    if not _plausible_username(username) or not isinstance(password, str) or len(password) > 4096:
        _hasher.hash("not the password")  # same cost as a real attempt
        audit(_shown(username), "login.failed", details={"reason": "malformed"}, url=url)
        time.sleep(FAILURE_DELAY_S)
        raise AuthError(REFUSED)
    with session(url) as s:
        user = s.exec(select(User).where(User.username == username)).first()
        if user is not None and user.locked_until is not None and user.locked_until > now:
            wait = (user.locked_until - now).total_seconds()
            s.add(AuditLog(username=username, action="login.locked", details={"wait_s": round(wait, 1)}))
            refused = REFUSED
        else:
            ok = False
            if user is not None and not user.disabled and user.password_hash:
                try:
                    ok = _hasher.verify(user.password_hash, password)
                except (VerificationError, InvalidHashError):
                    ok = False
            else:
                _hasher.hash(password)  # same cost whether or not the user exists
            if ok and user is not None:
                user.failed_logins = 0
                user.locked_until = None
                user.last_login_at = now
                if _hasher.check_needs_rehash(user.password_hash):
                    user.password_hash = _hasher.hash(password)
                s.add(user)
                s.add(AuditLog(username=username, action="login"))
                return Identity(user.username, user.role)
            if user is not None:
                user.failed_logins += 1
                lock = lock_seconds(user.failed_logins)
                user.locked_until = now + timedelta(seconds=lock) if lock else None
                s.add(user)
            s.add(AuditLog(username=username[:128], action="login.failed"))
            refused = REFUSED
    time.sleep(FAILURE_DELAY_S)
    raise AuthError(refused)


def audit_log(*, limit: int = 200, offset: int = 0, url: str | None = None) -> list[AuditLog]:
    with session(url, read_only=True) as s:
        return list(s.exec(select(AuditLog).order_by(col(AuditLog.id).desc()).offset(offset).limit(limit)).all())
