"""Keys for the OpenAI-compatible API: created, listed and revoked by admins, checked on every request.

A key reads ``pt-<key id>_<secret>``: twelve hex digits of public id, which lists, logs and error
messages show, and 43 characters (256 random bits) of secret. Only the SHA-256 of the secret is
stored (a secret this random needs no slow hash) and it is compared in constant time; the whole key
is shown once, when it is created. A key may be limited to some models; a revoked key is refused at
once, and so is a key whose creator's account is disabled, until it is enabled again; its last use is
recorded, at most once a minute. Clients send it the way OpenAI's do, as
``Authorization: Bearer pt-...`` (the official client's ``api_key``)::

    made = create_key(admin, "ci-bot", models=["smollm2-135m-instruct"])
    print(made.secret)                       # pt-4f9c2a1b07de_Xyz...: the only time it is shown
    grant = check_key(made.secret)           # KeyGrant(key_id="4f9c2a1b07de", name="ci-bot", ...)
    revoke_key(admin, made.key.key_id)       # check_key(made.secret) now raises KeyRefused (401)

How servers use it is :mod:`posttrain.platform.serving.auth`.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from sqlmodel import col, select

from posttrain.platform.auth import Identity, action
from posttrain.platform.db.engine import session
from posttrain.platform.db.models import ApiKey, AuditLog, Model, Role, User, utcnow

KEY_PREFIX = "pt-"
_KEY = re.compile(r"pt-([0-9a-f]{12})_([A-Za-z0-9_-]{43})")
LAST_USED_EVERY = timedelta(minutes=1)  # a key's last_used_at is written at most this often
MAX_NAME = 128

log = logging.getLogger(__name__)


class ApiKeyError(ValueError):
    """A key could not be created or revoked as asked; the message names the input and the fix."""


class KeyRefused(Exception):
    """A request's key was refused: ``status`` 401 (missing, malformed, unknown, wrong or revoked)
    or 403 (a valid key not allowed this model). The message never holds the secret."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class KeyGrant:
    """What a checked key may do."""

    key_id: str
    name: str
    models: tuple[str, ...]  # empty: every model

    @property
    def label(self) -> str:
        return shown(self.key_id)

    def allows(self, model: str) -> bool:
        return not self.models or model in self.models

    def check_model(self, model: str) -> None:
        if not self.allows(model):
            raise KeyRefused(403, f"the API key {self.label} ({self.name}) may not use the model `{model}`; it may use: "
                                  f"{', '.join(self.models)}. Ask an admin for a key that covers it")  # fmt: skip


@dataclass(frozen=True)
class CreatedKey:
    key: ApiKey
    secret: str  # the whole key, pt-<key id>_<secret>: shown once, never stored


def shown(key_id: str) -> str:
    """How lists, logs and messages name a key: its public part only."""
    return f"{KEY_PREFIX}{key_id}"


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _clean_name(name: str) -> str:
    name = name.strip() if isinstance(name, str) else ""
    if not name or len(name) > MAX_NAME or not name.isprintable():
        raise ApiKeyError(
            f"a key's name is 1-{MAX_NAME} printable characters (who or what uses it, e.g. ci-bot); got {name!r}"
        )
    return name


def _check_models(s, models: Iterable[str]) -> list[str]:
    wanted = sorted({m.strip() for m in models if isinstance(m, str) and m.strip()})
    known = set(s.exec(select(Model.name).where(col(Model.name).in_(wanted))).all()) if wanted else set()
    unknown = [m for m in wanted if m not in known]
    if unknown:
        raise ApiKeyError(
            f"no registered model named {', '.join(map(repr, unknown))}; `posttrain models list` shows "
            "the registered ones (leave --model out for a key that may use every model)"
        )
    return wanted


@action("key.create", Role.admin)
def create_key(identity: Identity, name: str, models: Iterable[str] = (), *, url: str | None = None) -> CreatedKey:
    """A new key named ``name``, limited to ``models`` (registered names; none: every model)."""
    return _insert_key(identity.username, name, models, url)


def _insert_key(by: str, name: str, models: Iterable[str], url: str | None) -> CreatedKey:
    name = _clean_name(name)
    key_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    with session(url) as s:
        scoped = _check_models(s, models)
        row = ApiKey(key_id=key_id, name=name, secret_sha256=_digest(secret), models=scoped, created_by=by)
        s.add(row)
        s.add(
            AuditLog(username=by, action="key.create", target=shown(key_id), details={"name": name, "models": scoped})
        )
        s.flush()
        s.refresh(row)
    row.secret_sha256 = ""
    return CreatedKey(row, f"{KEY_PREFIX}{key_id}_{secret}")


@action("key.list", Role.admin)
def list_keys(identity: Identity, *, include_revoked: bool = True, url: str | None = None) -> list[ApiKey]:
    """Every key, newest first (their hashes stay in the database: the rows come back without them)."""
    with session(url, read_only=True) as s:
        stmt = select(ApiKey).order_by(col(ApiKey.id).desc())
        if not include_revoked:
            stmt = stmt.where(col(ApiKey.revoked_at).is_(None))
        rows = list(s.exec(stmt).all())
    for row in rows:
        row.secret_sha256 = ""
    return rows


@action("key.revoke", Role.admin)
def revoke_key(identity: Identity, key: str, *, url: str | None = None) -> ApiKey:
    """Revoke a key named by its id (``4f9c2a1b07de``, ``pt-4f9c2a1b07de`` or the whole key): refused from now on."""
    key_id = _key_id_of(key)
    with session(url) as s:
        row = s.exec(select(ApiKey).where(ApiKey.key_id == key_id)).first()
        if row is None:
            raise ApiKeyError(f"no API key {shown(key_id)}; `posttrain keys list` shows the keys there are")
        if row.revoked_at is not None:
            raise ApiKeyError(
                f"the API key {shown(key_id)} ({row.name}) was revoked already, on {row.revoked_at:%Y-%m-%d %H:%M} UTC"
            )
        row.revoked_at = utcnow()
        row.revoked_by = identity.username
        s.add(row)
        s.add(
            AuditLog(username=identity.username, action="key.revoke", target=shown(key_id), details={"name": row.name})
        )
        s.flush()
        s.refresh(row)
    row.secret_sha256 = ""
    return row


def _key_id_of(key: str) -> str:
    text = key.strip() if isinstance(key, str) else ""
    text = text.removeprefix(KEY_PREFIX).split("_", 1)[0]
    if not re.fullmatch(r"[0-9a-f]{12}", text):
        raise ApiKeyError(
            f"{key!r} is not an API key id: give the twelve hex digits after pt- that `posttrain keys list` shows"
        )
    return text


def any_active_key(*, url: str | None = None) -> bool:
    """Whether some key is not revoked (a loopback gateway serves everyone until one exists)."""
    with session(url, read_only=True) as s:
        return s.exec(select(ApiKey.id).where(col(ApiKey.revoked_at).is_(None)).limit(1)).first() is not None


def check_key(token: str | None, *, url: str | None = None) -> KeyGrant:
    """What the key ``token`` may do; :class:`KeyRefused` (401) when it is missing, malformed,
    unknown, wrong or revoked. Records its use (at most once a minute)."""
    if not token:
        raise KeyRefused(401, "this API needs a key: send `Authorization: Bearer pt-...` (the OpenAI client's api_key); "
                              "an admin creates keys with `posttrain keys create NAME` or in the console")  # fmt: skip
    parsed = _KEY.fullmatch(token.strip())
    if parsed is None:
        raise KeyRefused(401, "the API key is not a posttrain key (those read pt-<12 hex digits>_<43 characters>); "
                              "check the client's api_key")  # fmt: skip
    key_id, secret = parsed.groups()
    with session(url, read_only=True) as s:
        stmt = select(ApiKey, User.disabled).outerjoin(User, col(User.username) == col(ApiKey.created_by))
        found = s.exec(stmt.where(ApiKey.key_id == key_id)).first()
    row, creator_disabled = found if found is not None else (None, None)
    if row is None or not hmac.compare_digest(row.secret_sha256, _digest(secret)):
        raise KeyRefused(401, f"the API key {shown(key_id)} is not valid: check the client's api_key")
    if row.revoked_at is not None:
        raise KeyRefused(401, f"the API key {shown(key_id)} ({row.name}) was revoked on {row.revoked_at:%Y-%m-%d %H:%M} "
                              "UTC; ask an admin for a new one")  # fmt: skip
    if creator_disabled:
        raise KeyRefused(401, f"the API key {shown(key_id)} ({row.name}) was created by a user whose account is "
                              "disabled; ask an admin to enable it, or for a new key")  # fmt: skip
    now = utcnow()
    if row.last_used_at is None or now - row.last_used_at >= LAST_USED_EVERY:
        _record_use(key_id, url)
    return KeyGrant(key_id=key_id, name=row.name, models=tuple(row.models or ()))


def _record_use(key_id: str, url: str | None) -> None:
    try:
        with session(url) as s:
            row = s.exec(select(ApiKey).where(ApiKey.key_id == key_id)).first()
            if row is not None:
                row.last_used_at = utcnow()
                s.add(row)
    except Exception:  # noqa: BLE001 - a busy database must not refuse a valid request over a statistic
        log.warning("could not record the use of the API key %s", shown(key_id), exc_info=True)


def service_key(name: str, model: str, secrets_dir: Path, *, url: str | None = None) -> str | None:
    """The key a platform process sends to the API on its own behalf (the console's playground) to reach
    ``model``: ``None`` while no key exists (a loopback gateway serves everyone then); else a key that may
    use ``model`` alone, named ``<name>: <model>`` in the key list, kept in ``<secrets_dir>/<name>-<model's
    digest>.api-key`` (mode 0600), and created anew by ``system`` when that file is missing or its key
    revoked. The file holds a secret like any client's credentials; the database only its hash. A key of
    an earlier version that the process kept for every model (``<name>.api-key``) is revoked and removed.
    :class:`ApiKeyError` when ``model`` is not registered."""
    if not any_active_key(url=url):
        return None
    _retire_unscoped(name, secrets_dir, url)
    path = secrets_dir / f"{name}-{hashlib.sha256(model.encode()).hexdigest()[:16]}.api-key"
    if path.is_file():
        kept = path.read_text().strip()
        try:
            if check_key(kept, url=url).models == (model,):
                return kept
        except KeyRefused:
            pass  # revoked (or from another database): made anew below
    with session(url, read_only=True) as s:
        if s.exec(select(Model.id).where(Model.name == model)).first() is None:
            raise ApiKeyError(f"no registered model named {model!r}: a service key is made for a registered model "
                              "only (`posttrain models list` shows them)")  # fmt: skip
    made = _insert_key("system", f"{name}: {model}"[:MAX_NAME], [model], url)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(made.secret)
    tmp.replace(path)
    return made.secret


def _retire_unscoped(name: str, secrets_dir: Path, url: str | None) -> None:
    """Revoke and remove the key kept as ``<name>.api-key``, which an earlier version made for every model."""
    path = secrets_dir / f"{name}.api-key"
    if not path.is_file():
        return
    parsed = _KEY.fullmatch(path.read_text().strip())
    if parsed is not None:
        with session(url) as s:
            row = s.exec(select(ApiKey).where(ApiKey.key_id == parsed.group(1))).first()
            if row is not None and row.revoked_at is None and row.created_by == "system" and not row.models:
                row.revoked_at, row.revoked_by = utcnow(), "system"
                s.add(row)
                why = "a service key for every model; now one per model"
                s.add(AuditLog(username="system", action="key.revoke", target=shown(row.key_id),
                               details={"name": row.name, "why": why}))  # fmt: skip
    path.unlink(missing_ok=True)
