"""Documents in the platform: ingest into the database, and the ``preprocess`` job kind.

``add_document`` stores the original content-addressed under the data
directory (the same content twice is one document), records a ``document``
row and queues a ``preprocess`` job. The job extracts every page with
``posttrain.preprocess`` in parallel worker processes and writes pages (text,
markdown, layout, render, visual token count) and chunks to the database,
checkpointing the pages done so an interrupted job resumes where it stopped.
Bad input ends as a document with status ``failed`` and a message naming the
cause; nothing else is touched.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import delete
from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select

from posttrain.platform.auth import Identity, action
from posttrain.platform.db.engine import session
from posttrain.platform.db.models import AuditLog, Chunk, Document, DocumentStatus, Page, Role, utcnow
from posttrain.platform.failures import BadInput
from posttrain.platform.jobs import queue
from posttrain.platform.jobs.context import JobContext
from posttrain.platform.jobs.registry import JobKind, register
from posttrain.platform.models.registry import ModelNotFound, get_model
from posttrain.platform.settings import get_settings
from posttrain.preprocess.chunking import chunk_document
from posttrain.preprocess.errors import PreprocessError
from posttrain.preprocess.ingest import ingest_bytes, ingest_file, ingest_stream
from posttrain.preprocess.models import PageResult
from posttrain.preprocess.options import PreprocessOptions
from posttrain.preprocess.pipeline import inspect_document, process_document
from posttrain.preprocess.tokens import as_token_counter
from posttrain.preprocess.vision import encode_page_image

log = logging.getLogger(__name__)

_WORD = re.compile(r"\w+|[^\w\s]")
MAX_WORDS_STORED = 5000  # per page, in the layout JSON


def regex_token_count(text: str) -> int:
    """The default token count when no model tokenizer is named: words and punctuation."""
    return len(_WORD.findall(text))


@dataclass(frozen=True)
class Added:
    document: Document
    job_id: int | None
    created: bool  # False when the same content was stored before


def _record_failure(data: bytes | None, filename: str, message: str, url: str | None) -> Document:
    """Record a refused upload as a failed document, so the console shows it. A document already
    stored with the same content (uploaded before under a good name) is left exactly as it was."""
    digest = hashlib.sha256(data if data is not None else filename.encode("utf-8", "surrogatepass")).hexdigest()
    with session(url) as s:
        row = s.exec(select(Document).where(Document.sha256 == digest)).first()
        if row is not None and row.status is not DocumentStatus.failed:
            return row
        if row is None:
            shown = "".join(c if c.isprintable() else "?" for c in os.path.basename(filename.replace("\\", "/")))
            row = Document(
                sha256=digest,
                filename=shown.encode("utf-8", "replace").decode()[:512] or "unnamed",
                size_bytes=len(data or b""),
            )
        row.status = DocumentStatus.failed
        row.error = message.encode("utf-8", "replace").decode().replace("\x00", "?")
        row.updated_at = utcnow()
        s.add(row)
        s.flush()
        s.refresh(row)
        return row


@action("document.upload", Role.operator)
def add_document(
    identity: Identity,
    source: Path | str | bytes | BinaryIO,
    *,
    filename: str | None = None,
    password: str | None = None,
    render_dpi: int = 96,
    url: str | None = None,
) -> Added:
    """Store a document and queue its preprocessing.

    Raises :class:`posttrain.preprocess.errors.PreprocessError` for input that
    cannot be stored (type, size, filename); the failure is recorded as a
    failed document first, so the console shows it.
    """
    settings = get_settings()
    data: bytes | None = source if isinstance(source, bytes) else None
    # An explicit name is checked as given (an empty one is refused, not replaced).
    name = filename if filename is not None else (Path(source).name if isinstance(source, (str, Path)) else "upload")
    try:
        if isinstance(source, bytes):
            stored = ingest_bytes(source, filename=name, data_dir=settings.data_dir)
        elif isinstance(source, (str, Path)):
            stored = ingest_file(source, data_dir=settings.data_dir, filename=filename)
        else:
            stored = ingest_stream(source, filename=name, data_dir=settings.data_dir)
    except PreprocessError as exc:
        if data is None and isinstance(source, (str, Path)) and Path(source).is_file():
            data = Path(source).read_bytes()[: 64 * 1024 * 1024]
        try:
            _record_failure(data, name, str(exc), url)
        except Exception:  # noqa: BLE001 - e.g. the database on the same full disk: the input's error is the news
            log.warning("could not record the failed upload of %r", name, exc_info=True)
        raise
    try:
        with session(url) as s:
            row = s.exec(select(Document).where(Document.sha256 == stored.sha256)).first()
            if row is not None and row.status != DocumentStatus.failed:
                return Added(row, None, False)
            row = row or Document(sha256=stored.sha256, filename=stored.filename)
            row.filename = stored.filename
            row.kind = stored.kind.value
            row.size_bytes = stored.size
            row.storage_path = str(stored.path)
            row.status = DocumentStatus.uploaded
            row.error = None
            row.updated_at = utcnow()
            s.add(row)
            s.add(
                AuditLog(
                    username=identity.username,
                    action="document.upload",
                    target=stored.filename,
                    details={"sha256": stored.sha256},
                )
            )
            s.flush()
            s.refresh(row)
    except IntegrityError:
        # The same content uploaded twice at the same moment (PostgreSQL: both saw no row, both
        # inserted): the other upload stored it and queued its job, so this one is a repeat.
        with session(url, read_only=True) as s:
            row = s.exec(select(Document).where(Document.sha256 == stored.sha256)).one()
        return Added(row, None, False)
    config: dict[str, Any] = {"document_id": row.id, "render_dpi": render_dpi}
    if password:
        # The password never goes into the database: a 0600 file the job reads and deletes.
        secret = settings.secrets_dir() / f"document-{row.id}.password"
        fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(password)
        config["password_file"] = str(secret)
    job_id = queue.submit(identity, "preprocess", config, url=url)
    return Added(row, job_id, True)


def list_documents(*, limit: int = 100, offset: int = 0, url: str | None = None) -> list[Document]:
    with session(url, read_only=True) as s:
        return list(s.exec(select(Document).order_by(col(Document.id).desc()).offset(offset).limit(limit)).all())


def get_document(document_id: int, *, url: str | None = None) -> Document:
    with session(url, read_only=True) as s:
        row = s.get(Document, document_id)
    if row is None:
        raise LookupError(f"no document with id {document_id}")
    return row


def get_pages(document_id: int, *, url: str | None = None) -> list[Page]:
    with session(url, read_only=True) as s:
        return list(s.exec(select(Page).where(Page.document_id == document_id).order_by(col(Page.page_no))).all())


def get_chunks(document_id: int, *, url: str | None = None) -> list[Chunk]:
    with session(url, read_only=True) as s:
        return list(s.exec(select(Chunk).where(Chunk.document_id == document_id).order_by(col(Chunk.seq))).all())


# --- the preprocess job ------------------------------------------------------------------------


class PreprocessConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    document_id: int = Field(ge=1)
    render_dpi: int | None = Field(default=96, ge=18, le=600, description="page renders for the viewer and VLMs")
    ocr: str = Field(default="auto", pattern="^(auto|always|never)$")
    chunk_tokens: int = Field(default=512, ge=16, le=1_000_000)
    tokenizer_model: str | None = Field(default=None, description="registered model whose tokenizer counts tokens")
    password_file: str | None = None


def _layout_json(page: Any) -> dict[str, Any]:
    """What the viewer and the task builders need from one page, as JSON."""
    return {
        "width": page.width,
        "height": page.height,
        "blocks": [{"order": b.order, "bbox": list(b.bbox), "text": b.text, "ocr": b.ocr} for b in page.blocks],
        "tables": [t.model_dump(mode="json") for t in page.tables],
        "images": [i.model_dump(mode="json") for i in page.images],
        "words": [
            {"text": w.text, "bbox": list(w.bbox), "ocr": w.ocr, "confidence": w.confidence}
            for w in page.words[:MAX_WORDS_STORED]
        ],
        "ocr": page.ocr,
        "ocr_confidence": page.ocr_confidence,
        "layoutlm": page.layout.model_dump(mode="json") if page.layout is not None else None,
        "timings": page.timings,
    }


def _token_counter(config: PreprocessConfig, ctx: JobContext) -> tuple[str, Any]:
    if config.tokenizer_model is None:
        return "regex-words", regex_token_count
    from transformers import AutoTokenizer  # heavy: transformers, only when a tokenizer counts

    try:
        model = get_model(config.tokenizer_model, url=ctx.url)
    except ModelNotFound as exc:
        raise BadInput(str(exc)) from None
    return model.name, as_token_counter(AutoTokenizer.from_pretrained(model.path))


def _set_status(document_id: int, url: str, **values: Any) -> None:
    with session(url) as s:
        row = s.get(Document, document_id)
        if row is None:
            raise BadInput(f"document {document_id} was deleted")
        for key, value in values.items():
            setattr(row, key, value)
        row.updated_at = utcnow()
        s.add(row)


def run_preprocess(ctx: JobContext, config: PreprocessConfig) -> dict[str, Any]:
    doc = get_document(config.document_id, url=ctx.url)
    assert doc.id is not None  # a stored document
    password = None
    if config.password_file and Path(config.password_file).is_file():
        password = Path(config.password_file).read_text()
    options = PreprocessOptions(render_dpi=config.render_dpi, ocr=config.ocr, password=password)
    _set_status(doc.id, ctx.url, status=DocumentStatus.processing, error=None)
    tokenizer_name, count = _token_counter(config, ctx)
    pages_dir = ctx.settings.data_dir / "pages" / str(doc.id)
    pages_dir.mkdir(parents=True, exist_ok=True)
    try:
        info = inspect_document(doc.storage_path, options)
        done = set((ctx.checkpoint or {}).get("pages_done", []))
        todo = [n for n in range(1, info.page_count + 1) if n not in done]
        meta = {"metadata": info.metadata, "outline": [o.model_dump(mode="json") for o in info.outline],
                "repaired": info.repaired, "encrypted": info.encrypted,
                "active_content": info.active_content}  # fmt: skip
        _set_status(doc.id, ctx.url, page_count=info.page_count, meta=meta)
        ctx.progress(len(done) / max(1, info.page_count), f"{len(done)}/{info.page_count} pages", force=True)
        for page in process_document(doc.storage_path, options, pages=todo, info=info) if todo else []:
            image_path, visual = None, None
            if page.render is not None:
                image_path = pages_dir / f"{page.page_number:05d}.png"
                tmp = image_path.with_suffix(".tmp")
                tmp.write_bytes(page.render.png)
                os.replace(tmp, image_path)
                visual = encode_page_image(page).visual_tokens
            extraction = pages_dir / f"{page.page_number:05d}.json"
            extraction.with_suffix(".tmp").write_text(page.model_copy(update={"render": None}).model_dump_json())
            os.replace(extraction.with_suffix(".tmp"), extraction)
            text = page.text
            with session(ctx.url) as s:
                s.exec(delete(Page).where(col(Page.document_id) == doc.id, col(Page.page_no) == page.page_number - 1))
                s.add(
                    Page(
                        document_id=doc.id,
                        page_no=page.page_number - 1,
                        width=page.width,
                        height=page.height,
                        source="ocr" if page.ocr else ("image" if page.source == "image" else "text"),
                        text=text,
                        markdown=page.markdown or "",
                        layout=_layout_json(page),
                        image_path=str(image_path) if image_path else None,
                        visual_tokens=visual,
                        token_counts={
                            "tokenizer": tokenizer_name,
                            "text": count(text),
                            "markdown": count(page.markdown or ""),
                            "layout": len(page.layout.words) if page.layout else 0,
                            "visual": visual,
                        },
                    )  # fmt: skip
                )
            done.add(page.page_number)
            ctx.save_checkpoint({"pages_done": sorted(done)})
            ctx.progress(len(done) / info.page_count, f"{len(done)}/{info.page_count} pages")
            ctx.check_stop()
        chunks = _chunks(pages_dir, doc.id, config.chunk_tokens, count, ctx.url)
    except PreprocessError as exc:
        _set_status(doc.id, ctx.url, status=DocumentStatus.failed, error=str(exc))
        raise BadInput(str(exc)) from None
    finally:
        if config.password_file:
            Path(config.password_file).unlink(missing_ok=True)
    _set_status(doc.id, ctx.url, status=DocumentStatus.ready, error=None)
    return {"document_id": doc.id, "pages": info.page_count, "chunks": chunks, "tokenizer": tokenizer_name}


def _chunks(pages_dir: Path, document_id: int, budget: int, count: Any, url: str) -> int:
    """Chunk the whole document from the stored page extractions (a resumed job included)."""
    results = [PageResult.model_validate_json(p.read_text()) for p in sorted(pages_dir.glob("*.json"))]
    chunks = chunk_document(results, max_tokens=budget, tokenizer=count)
    with session(url) as s:
        s.exec(delete(Chunk).where(col(Chunk.document_id) == document_id))
        for seq, c in enumerate(chunks):
            s.add(
                Chunk(
                    document_id=document_id,
                    seq=seq,
                    text=c.text,
                    heading_path=list(c.heading_path),
                    provenance=[p.model_dump(mode="json") for p in c.provenance],
                    token_count=c.token_count,
                )  # fmt: skip
            )
    return len(chunks)


register(
    JobKind(
        name="preprocess",
        config_model=PreprocessConfig,
        run=run_preprocess,
        description="Extract a document's pages (text, layout, tables, OCR, renders) and chunks.",
        resumable=True,
    )
)
