"""Ingest files or bytes: validate, sniff and store content-addressed by sha256.

The original is stored once under ``<data_dir>/documents/<sha[:2]>/<sha><ext>``;
ingesting the same content twice returns the same document.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import tempfile
import unicodedata
from pathlib import Path
from typing import BinaryIO

from pydantic import BaseModel, ConfigDict

from posttrain.preprocess.errors import (
    FileTooLarge,
    InputNotFound,
    MislabelledFile,
    StorageFull,
    UnsafeFilename,
    UnsupportedFileType,
)
from posttrain.preprocess.models import FileKind
from posttrain.preprocess.options import PreprocessOptions
from posttrain.preprocess.sniff import HEAD_BYTES, describe_unknown, kind_from_extension, sniff

_CHUNK = 1024 * 1024
MAX_FILENAME_CHARS = 255
# Bidirectional overrides and isolates make 'report\u202efdp.exe' display as 'reportexe.pdf'.
_BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


class StoredDocument(BaseModel):
    """An ingested original: where it lies and what it is."""

    model_config = ConfigDict(frozen=True)

    sha256: str
    kind: FileKind
    size: int
    path: Path
    filename: str
    created: bool  # False when the same content was stored before


def safe_filename(name: str) -> str:
    """Return ``name`` if it is a plain base name; raise UnsafeFilename otherwise."""
    cleaned = unicodedata.normalize("NFC", name or "")
    if not cleaned.strip():
        raise UnsafeFilename("the file name is empty; give the upload a base name such as 'report.pdf'")
    if "/" in cleaned or "\\" in cleaned or cleaned in (".", "..") or (len(cleaned) > 1 and cleaned[1] == ":"):
        raise UnsafeFilename(
            f"file name {name!r} holds path components; pass only its base name, e.g. {os.path.basename(cleaned.replace(chr(92), '/'))!r}"
        )
    if any(unicodedata.category(c) in ("Cc", "Cs") or c in _BIDI_CONTROLS for c in cleaned):
        raise UnsafeFilename(
            f"file name {name!r} holds control, bidirectional-override or unpaired surrogate characters; rename the file"
        )
    if len(cleaned) > MAX_FILENAME_CHARS:
        raise UnsafeFilename(f"file name {name[:40]!r}... is longer than {MAX_FILENAME_CHARS} characters; shorten it")
    return cleaned


def check_kind(head: bytes, filename: str, options: PreprocessOptions) -> FileKind:
    """Sniff ``head`` and raise UnsupportedFileType / MislabelledFile as the options say."""
    kind = sniff(head)
    claimed = kind_from_extension(filename)
    if kind is FileKind.UNKNOWN:
        claim = f" although its name says {claimed.value.upper()}" if claimed else ""
        raise UnsupportedFileType(
            f"{filename!r} is {describe_unknown(head)}{claim}; supported are PDF, PNG, JPEG, TIFF, WebP and BMP "
            "(convert it to PDF first)"
        )
    if options.strict_extension and claimed is not None and claimed is not kind:
        raise MislabelledFile(
            f"{filename!r} is named as {claimed.value.upper()} but its content is {kind.value.upper()}; "
            f"rename it to end in {kind.extension} or turn off strict_extension"
        )
    return kind


def _too_large(filename: str, size: int, options: PreprocessOptions) -> FileTooLarge:
    return FileTooLarge(
        f"{filename!r} has {size} bytes, over the limit of {options.max_file_bytes} bytes; "
        "split the document or raise max_file_bytes"
    )


def _store(tmp_path: Path, digest: str, kind: FileKind, data_dir: Path) -> tuple[Path, bool]:
    target = document_path(data_dir, digest, kind)
    if target.exists():
        tmp_path.unlink(missing_ok=True)
        return target, False
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp_path, target)
    return target, True


def document_path(data_dir: Path | str, sha256: str, kind: FileKind) -> Path:
    """Where the original with this digest is (or would be) stored."""
    return Path(data_dir) / "documents" / sha256[:2] / f"{sha256}{kind.extension}"


def ingest_stream(
    stream: BinaryIO, *, filename: str, data_dir: Path | str, options: PreprocessOptions | None = None
) -> StoredDocument:
    """Store what ``stream`` holds, reading it in 1 MiB pieces, never whole."""
    options = options or PreprocessOptions()
    name = safe_filename(filename)
    head = stream.read(HEAD_BYTES)
    kind = check_kind(head, name, options)
    data_dir = Path(data_dir)
    incoming = data_dir / "documents" / "incoming"
    incoming.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    fd, tmp = tempfile.mkstemp(dir=incoming, prefix=".ingest-")
    tmp_path = Path(tmp)
    try:
        with os.fdopen(fd, "wb") as out:
            piece = head
            while piece:
                size += len(piece)
                if size > options.max_file_bytes:
                    raise _too_large(name, size, options)
                digest.update(piece)
                out.write(piece)
                piece = stream.read(_CHUNK)
            out.flush()
            os.fsync(out.fileno())
        path, created = _store(tmp_path, digest.hexdigest(), kind, data_dir)
    except OSError as exc:
        tmp_path.unlink(missing_ok=True)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StorageFull(
                f"no space left to store {name!r} under {data_dir} (disk or quota full after {size} bytes); "
                f"free space in {data_dir} or point POSTTRAIN_DATA_DIR at a larger volume, then upload it again"
            ) from None
        raise
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise
    return StoredDocument(sha256=digest.hexdigest(), kind=kind, size=size, path=path, filename=name, created=created)


def ingest_bytes(
    data: bytes, *, filename: str, data_dir: Path | str, options: PreprocessOptions | None = None
) -> StoredDocument:
    """Store ``data`` under ``data_dir``; the same content twice is one document."""
    options = options or PreprocessOptions()
    if len(data) > options.max_file_bytes:
        raise _too_large(safe_filename(filename), len(data), options)

    return ingest_stream(io.BytesIO(data), filename=filename, data_dir=data_dir, options=options)


def ingest_file(
    path: Path | str, *, data_dir: Path | str, filename: str | None = None, options: PreprocessOptions | None = None
) -> StoredDocument:
    """Store the file at ``path`` (its base name is the document's name unless ``filename`` is given)."""
    options = options or PreprocessOptions()
    path = Path(path)
    name = safe_filename(filename if filename is not None else path.name)
    try:
        size = path.stat().st_size
        if size > options.max_file_bytes:
            raise _too_large(name, size, options)
        with path.open("rb") as stream:
            return ingest_stream(stream, filename=name, data_dir=data_dir, options=options)
    except FileNotFoundError:
        raise InputNotFound(f"{str(path)!r} does not exist; check the path") from None
    except IsADirectoryError:
        raise InputNotFound(f"{str(path)!r} is a directory; pass a file") from None
