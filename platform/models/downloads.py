"""Exports taken away: a signed, short-lived link the gateway streams, never the whole export in memory.

    link = export_link(identity, "my-sft", "/data/exports/my-sft-hf")   # an operator's action
    # -> "/v1/exports/eyJtIjoi...<signature>": GET it from the gateway (the console shows it as a button)
    download = open_export(token)          # the gateway: signature, expiry, still an export of the model
    download.filename, download.size       # "my-sft-hf.tar", its exact length in bytes
    for chunk in download.chunks(): ...    # a file as it is; a directory as an uncompressed tar, file by file

A model's export is the size of its weights (538 MB for SmolLM2-135M in float32, gigabytes for a larger model): it
is streamed in 1 MiB pieces from disk, with a ``Content-Length`` known before the first byte, so neither the
gateway nor the browser waits for an archive to be built, and nothing holds it whole. The link carries the model,
the path, who asked and an expiry, signed with HMAC-SHA256 under a key made once in ``<data_dir>/secrets``
(the platform's processes share the data directory): it is the credential, as a presigned URL is, so it names one
export for a short time. The gateway re-checks on use that the path is still a recorded export of that model and
audits the download under the name of whoever asked for the link.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from posttrain.platform.auth import Identity, action
from posttrain.platform.db.engine import session
from posttrain.platform.db.models import AuditLog, Role
from posttrain.platform.engines.inspect import ModelDirError
from posttrain.platform.models.registry import ModelNotFound, get_model
from posttrain.platform.settings import Settings, get_settings

LINK_TTL_S = 3600.0  # a link shown on a page stays good this long (the page makes a fresh one on every run)
CHUNK = 2**20
ROUTE = "/v1/exports/"
_BLOCK = tarfile.BLOCKSIZE


class DownloadRefused(PermissionError):
    """A link that is forged, expired, or names what is no longer an export: the gateway answers 403 or 404."""

    def __init__(self, message: str, status: int = 403) -> None:
        super().__init__(message)
        self.status = status


def _key(settings: Settings) -> bytes:
    """The signing key, made once (0600) under the data directory's secrets; every process of the platform reads it."""
    path = settings.secrets_dir() / "download-links.key"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        key = path.read_bytes()
        if len(key) >= 32:
            return key
        raise DownloadRefused(
            f"{path} holds no download key (it is {len(key)} bytes, not 32): delete it and the "
            "platform makes a new one (links already given out stop working)"
        ) from None
    with os.fdopen(fd, "wb") as out:
        out.write(key := secrets.token_bytes(32))
    return key


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _exports_of(name: str, url: str | None) -> set[str]:
    return {str(e.get("path")) for e in (get_model(name, url=url).meta or {}).get("exports", [])}


@action("model.download", Role.operator)
def export_link(
    identity: Identity,
    name: str,
    path: str,
    *,
    ttl_s: float = LINK_TTL_S,
    url: str | None = None,
    settings: Settings | None = None,
) -> str:
    """The gateway path (``/v1/exports/<token>``) that streams model ``name``'s export at ``path`` for ``ttl_s``
    seconds; only a path the registry lists as one of the model's exports."""
    exports = _exports_of(name, url)
    if path not in exports:
        raise ModelDirError(
            f"{path} is not an export of model {name!r}; its exports: {', '.join(sorted(exports)) or 'none'}"
        )
    if not Path(path).exists():
        raise ModelDirError(f"the export {path} of model {name!r} is gone from disk: export the model again")
    claims = _b64(
        json.dumps(
            {"m": name, "p": path, "u": identity.username, "e": time.time() + ttl_s}, separators=(",", ":")
        ).encode()
    )
    signature = _b64(hmac.new(_key(settings or get_settings()), claims.encode(), hashlib.sha256).digest())
    return f"{ROUTE}{claims}.{signature}"


@dataclass(frozen=True)
class Member:
    """A file of a directory export and its tar header (PAX: any path length), fixed when the download opens."""

    path: Path
    header: bytes
    size: int

    @property
    def length(self) -> int:
        return len(self.header) + self.size + -self.size % _BLOCK


@dataclass(frozen=True)
class Download:
    """One export being taken away: what the response says of it, and its bytes in pieces."""

    model: str
    path: Path
    filename: str
    media_type: str
    members: tuple[Member, ...] | None = None  # a directory's files (None: the export is one file)

    @property
    def size(self) -> int:
        if self.members is None:
            return self.path.stat().st_size
        return sum(m.length for m in self.members) + 2 * _BLOCK

    def chunks(self) -> Iterator[bytes]:
        if self.members is None:
            yield from _read(self.path, self.path.stat().st_size)
            return
        for member in self.members:
            yield member.header
            yield from _read(member.path, member.size)
            if pad := -member.size % _BLOCK:
                yield bytes(pad)
        yield bytes(2 * _BLOCK)  # the end of the archive


def _read(path: Path, size: int) -> Iterator[bytes]:
    """Exactly ``size`` bytes of ``path`` (the length the response announced), in pieces."""
    left = size
    with path.open("rb") as source:
        while left > 0:
            piece = source.read(min(CHUNK, left))
            if not piece:
                raise OSError(f"{path} shrank while it was downloaded ({size - left} of {size} bytes read)")
            left -= len(piece)
            yield piece


def _members(root: Path) -> tuple[Member, ...]:
    """The directory's regular files (no links: nothing outside it), each with its tar header, in a stable order."""
    out = []
    for item in sorted(root.rglob("*")):
        if item.is_file() and not item.is_symlink():
            info = tarfile.TarInfo(str(Path(root.name) / item.relative_to(root)))
            stat = item.stat()
            info.size, info.mtime, info.mode = stat.st_size, int(stat.st_mtime), 0o644
            out.append(Member(item, info.tobuf(tarfile.PAX_FORMAT), stat.st_size))
    return tuple(out)


def open_export(token: str, *, url: str | None = None, settings: Settings | None = None) -> Download:
    """The export a link names, after checking its signature and expiry and that the path is still one of the
    model's recorded exports on disk; the download is audited under the name of whoever asked for the link."""
    claims, _, signature = token.partition(".")
    expected = _b64(hmac.new(_key(settings or get_settings()), claims.encode(), hashlib.sha256).digest())
    if not signature or not hmac.compare_digest(signature, expected):
        raise DownloadRefused("this download link is not one the platform signed: ask the console for a new one")
    try:
        fields = json.loads(_unb64(claims))
        name, path, who, expires = str(fields["m"]), str(fields["p"]), str(fields["u"]), float(fields["e"])
    except (ValueError, KeyError, TypeError):
        raise DownloadRefused("this download link is damaged: ask the console for a new one") from None
    if time.time() > expires:
        raise DownloadRefused(
            f"this download link of model {name!r} expired: open the model's Export tab for a new one"
        )

    try:
        current = _exports_of(name, url)
    except ModelNotFound:
        raise DownloadRefused(f"model {name!r} is no longer registered", status=404) from None
    where = Path(path)
    if path not in current or not where.exists():
        raise DownloadRefused(
            f"{path} is no longer an export of model {name!r} on disk: export the model again", status=404
        )
    with session(url) as s:
        s.add(AuditLog(username=who, action="model.download", target=name, details={"path": path}))
    if where.is_file():
        return Download(name, where, where.name, "application/octet-stream")
    return Download(name, where, f"{where.name}.tar", "application/x-tar", _members(where))
