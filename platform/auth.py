"""Users, roles, password login, the audit log, and the role check of every action.

Passwords are hashed with argon2id (salted, deliberately slow). Repeated
failures lock an account for a growing delay, and every login, failure and
change is written to the audit log. Roles are ordered: a viewer reads, an
operator also uploads, launches, stops, verifies and runs snippets, an admin
also manages users, API keys and settings.

Roles are enforced here, in the platform, not in the pages: every function a
page or the command line calls to change something is an :func:`action`. It
takes the acting :class:`Identity` as its first argument, checks the role
(against the database, so a role changed or a user disabled since the login
counts at once), audits a refusal, and audits what it did::

    @action("job.cancel", Role.operator)
    def cancel(identity: Identity, job_id: int, *, url: str | None = None) -> JobStatus: ...

    cancel(Identity("ann", Role.viewer), 7)   # PermissionDenied, audited as "denied"
"""

from __future__ import annotations

import functools
import getpass
import ipaddress
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import text
from sqlmodel import col, func, select

from posttrain.platform.db.engine import session
from posttrain.platform.db.models import AuditLog, ConsoleSession, Role, User, utcnow
from posttrain.platform.settings import get_settings

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


class PermissionDenied(PermissionError):
    """An action was refused for the acting user's role; the message names the action and the role it needs."""


@dataclass(frozen=True)
class Identity:
    """Who is logged in, as pages and commands see it."""

    username: str
    role: Role

    def can(self, needed: Role) -> bool:
        return ROLE_RANK[self.role] >= ROLE_RANK[needed]


P = ParamSpec("P")
R = TypeVar("R")

AUDITED_CHARS = 2000  # how much of a snippet or answer an action's audit entry keeps
ACTIONS: dict[str, Role] = {}  # every action's name and the role it needs (filled by @action as modules load)


def require(identity: Identity, needed: Role, *, action: str, url: str | None = None) -> Identity:
    """The acting identity as the database has it now, when it holds ``needed``; else the refusal is
    audited (action ``denied``, the refused action as its target) and :class:`PermissionDenied` raised.

    A user disabled since the login is refused; an identity with no user row behind it (the command
    line's, a job's) keeps the role it was given."""
    if not isinstance(identity, Identity):
        raise TypeError(f"the action {action!r} takes the acting Identity as its first argument, got {identity!r}")
    current = refresh_identity(identity, url=url)
    if current is not None and current.can(needed):
        return current
    role = "disabled" if current is None else current.role.value
    audit(_shown(identity.username), "denied", target=action, details={"needed": needed.value, "role": role}, url=url)
    raise PermissionDenied(
        f"{identity.username} ({role}) may not {action}: it needs the {needed.value} role; ask an admin for it"
    )


def action(
    name: str, needed: Role
) -> Callable[[Callable[Concatenate[Identity, P], R]], Callable[Concatenate[Identity, P], R]]:
    """Mark a platform function as an action ``name`` that needs ``needed``: its first argument is the
    acting identity, checked by :func:`require` before the function runs (with the ``url`` keyword the
    function was given, if any). The function audits what it did (in the transaction that did it, where
    it writes one), so a refusal and a success are both in the audit log."""

    def wrap(fn: Callable[Concatenate[Identity, P], R]) -> Callable[Concatenate[Identity, P], R]:
        @functools.wraps(fn)
        def checked(identity: Identity, /, *args: P.args, **kwargs: P.kwargs) -> R:
            url = kwargs.get("url")
            require(identity, needed, action=name, url=url if isinstance(url, str) else None)
            return fn(identity, *args, **kwargs)

        ACTIONS[name] = needed
        return checked

    return wrap


def job_identity(job_id: int) -> Identity:
    """Who a running job acts as: submitting it needed an operator, so the job acts with that role."""
    return Identity(f"job:{job_id}", Role.operator)


def command_line_identity(*, url: str | None = None) -> Identity:
    """Who the ``posttrain`` command acts as. With ``POSTTRAIN_CLI_USER`` set: that console user, with
    the role the database gives it (an unknown or disabled name is refused). Unset: the local
    administrator ``cli:<login name>``, since whoever runs the command holds the database's
    credentials (the SQLite file or the PostgreSQL URL) and could change any row directly."""
    name = get_settings().cli_user
    if name is None:
        return Identity(f"cli:{_login_name()}", Role.admin)
    with session(url, read_only=True) as s:
        user = s.exec(select(User).where(User.username == name)).first()
    if user is None or user.disabled:
        state = "does not exist" if user is None else "is disabled"
        raise AuthError(
            f"POSTTRAIN_CLI_USER={name!r} {state}: name an enabled console user, or unset it to act as "
            "the local administrator"
        )
    return Identity(user.username, user.role)


def _login_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container's arbitrary uid)
        return f"uid{os.getuid()}"


LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a listening address) is reachable from this machine only."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def audit(
    username: str, action: str, target: str = "", details: dict[str, Any] | None = None, *, url: str | None = None
) -> None:
    with session(url) as s:
        s.add(AuditLog(username=username, action=action, target=target, details=details or {}))


def hash_password(password: str) -> str:
    if len(password) < MIN_PASSWORD_LENGTH:
        raise AuthError(f"a password needs at least {MIN_PASSWORD_LENGTH} characters")
    return _hasher.hash(password)


@action("user.create", Role.admin)
def create_user(
    identity: Identity, username: str, password: str, role: Role = Role.viewer, *, url: str | None = None
) -> Identity:
    """Add a console user (admins)."""
    return _create_user(identity.username, username, password, role, url=url)


ADMIN_EXISTS = "an admin exists already: log in, or an admin adds users with `posttrain users add` or in the console"


def bootstrap_admin(username: str, password: str, *, url: str | None = None, by: str = "bootstrap") -> Identity:
    """Create the first admin: the one user creation nobody needs a role for, refused once an admin exists.
    Checked and written in one serialised transaction: of two at once, exactly one succeeds."""
    if has_admin(url=url):
        raise AuthError(ADMIN_EXISTS)
    return _create_user(by, username, password, Role.admin, url=url, first_admin=True)


def setup_first_admin(
    username: str, password: str, *, client_ip: str | None, bind_host: str, url: str | None = None
) -> Identity:
    """The console's one-time setup form: the first admin, created from a browser on this machine only (the
    console bound to loopback and the browser's connection from loopback; ``client_ip`` None means loopback,
    as Streamlit reports it). Audited as ``setup-form``; refused once an admin exists."""
    if not is_loopback(bind_host) or (client_ip is not None and not is_loopback(client_ip)):
        raise AuthError(
            f"the first admin is created from a browser on the console's own machine (console on "
            f"{bind_host}, browser at {client_ip or 'loopback'}): run `posttrain users bootstrap-admin NAME` there"
        )
    return bootstrap_admin(username, password, url=url, by="setup-form")


def _create_user(
    by: str, username: str, password: str, role: Role, *, url: str | None, first_admin: bool = False
) -> Identity:
    username = username.strip()
    if not username or len(username) > 128 or any(c.isspace() for c in username):
        raise AuthError("a username is 1-128 characters without spaces")
    if ":" in username:  # cli:<login>, job:<id>: the platform's own identities, never a user's
        raise AuthError(
            f"a username has no ':' (names such as cli:... and job:... are the platform's own); got {username!r}"
        )
    digest = hash_password(password)
    with session(url) as s:
        if first_admin:  # serialise the check and the write (SQLite's write transactions already are)
            if s.get_bind().dialect.name == "postgresql":
                lock = text("SELECT pg_advisory_xact_lock(hashtext('posttrain.first_admin'))")
                s.exec(lock)  # type: ignore[call-overload]  # sqlmodel types exec() for selects; text runs as well
            if _admin_count(s) > 0:
                raise AuthError(ADMIN_EXISTS)
        if s.exec(select(User).where(User.username == username)).first() is not None:
            raise AuthError(f"user {username!r} already exists")
        s.add(User(username=username, password_hash=digest, role=role))
        s.add(AuditLog(username=by, action="user.create", target=username, details={"role": role.value}))
    return Identity(username, role)


@action("user.password", Role.admin)
def set_password(identity: Identity, username: str, password: str, *, url: str | None = None) -> None:
    """Set a user's password and unlock the account (admins)."""
    digest = hash_password(password)
    with session(url) as s:
        user = _user(s, username)
        user.password_hash = digest
        user.failed_logins = 0
        user.locked_until = None
        s.add(user)
        ended = revoke_sessions(s, username)  # a changed password logs the account out everywhere
        s.add(AuditLog(username=identity.username, action="user.password", target=username,
                       details={"sessions_ended": ended}))  # fmt: skip


@action("user.role", Role.admin)
def set_role(identity: Identity, username: str, role: Role, *, url: str | None = None) -> None:
    """Change a user's role (admins); the last admin keeps theirs."""
    with session(url) as s:
        user = _user(s, username)
        if user.role is Role.admin and role is not Role.admin and _admin_count(s) <= 1:
            raise AuthError("the last admin cannot lose the admin role")
        user.role = role
        s.add(user)
        s.add(AuditLog(username=identity.username, action="user.role", target=username, details={"role": role.value}))


def revoke_sessions(s: Any, username: str) -> int:
    """End every live console session of ``username`` in the open transaction ``s`` (a password change, a disabled
    account); returns how many there were. Their cookies are refused from then on."""
    live = s.exec(
        select(ConsoleSession).where(ConsoleSession.username == username, col(ConsoleSession.revoked_at).is_(None))
    ).all()
    for row in live:
        row.revoked_at = utcnow()
        row.handoff_sha256 = None
        s.add(row)
    return len(live)


def kept_secret(folder: str | os.PathLike[str], name: str) -> str:
    """A random secret generated once into ``folder/name`` (mode 0600, the folder 0700) and read back after: the
    console's session-signing key, single sign-on's cookie secret. Two processes starting at once keep one."""
    home = Path(folder)
    home.mkdir(parents=True, exist_ok=True)
    home.chmod(0o700)
    kept = home / name
    if not kept.is_file():
        try:
            fd = os.open(kept, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process made it first
        else:
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_urlsafe(32))
    for _ in range(50):  # the other process's write lands within moments
        if value := kept.read_text().strip():
            return value
        time.sleep(0.02)
    raise AuthError(f"{kept} is empty: delete it and start again (a new secret is made)")


def list_users(*, url: str | None = None) -> list[User]:
    with session(url, read_only=True) as s:
        return list(s.exec(select(User).order_by(User.username)).all())


def has_admin(*, url: str | None = None) -> bool:
    with session(url, read_only=True) as s:
        return _admin_count(s) > 0


def _admin_count(s) -> int:
    stmt = select(func.count()).select_from(User).where(User.role == Role.admin, col(User.disabled).is_(False))
    return int(s.exec(stmt).one())


def _user(s, username: str) -> User:
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
