"""Process a stored document page by page in parallel worker processes.

    info = inspect_document(path, options)
    for page in process_document(path, options, progress=print):
        ...

Pages come back in page order as :class:`PageResult`; every failure ends in one
:class:`PreprocessError`. A page slower than ``page_timeout_s`` stops the
workers and raises :class:`PageTimeout`; a worker that dies raises
:class:`CorruptDocument`. Workers are always stopped when the iterator ends,
fails or is closed.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from posttrain.platform.supervise import start_worker, worker_context
from posttrain.preprocess.errors import (
    CorruptDocument,
    FileTooLarge,
    InputNotFound,
    PageTimeout,
    PreprocessError,
    UnsupportedFileType,
)
from posttrain.preprocess.images import image_info
from posttrain.preprocess.models import DocumentInfo, FileKind, PageResult, Progress
from posttrain.preprocess.options import PreprocessOptions
from posttrain.preprocess.sniff import HEAD_BYTES, describe_unknown, sniff
from posttrain.preprocess.worker import ERROR, START, worker_main

ProgressCallback = Callable[[Progress], None]
_POLL_S = 0.05


def _single_threaded() -> bool:
    """Whether the calling thread is this process's only Python thread (no queue feeder, timer or
    server thread). The idle native pools that numpy and onnxruntime start on import work only when
    a Python thread calls into them, so none is mid-work while this one forks."""
    return threading.active_count() == 1 and threading.current_thread() is threading.main_thread()


def _forked_worker(*args: object) -> None:
    """A worker forked from the caller: drop the caller's signal handlers (a job process's SIGTERM
    handler would keep a terminated worker alive), then run as any worker does."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    worker_main(*args)  # type: ignore[arg-type]


def _mp_context() -> mp.context.BaseContext:
    """Fork when this process runs a single Python thread (a worker's job process): the workers then
    share the PyMuPDF already imported here instead of starting an interpreter that imports it
    again (one to two seconds a document). Otherwise the platform's worker context: a fork server,
    safe beside threads, that preloaded PyMuPDF."""
    if _single_threaded() and "fork" in mp.get_all_start_methods():
        return mp.get_context("fork")
    return worker_context("posttrain.preprocess.worker", "posttrain.preprocess.pdf")


def detect_kind(path: Path | str, options: PreprocessOptions | None = None) -> FileKind:
    """Check that ``path`` exists, is within the size limit and is a supported kind."""
    options = options or PreprocessOptions()
    path = Path(path)
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise InputNotFound(f"{str(path)!r} is not a regular file; pass the path of a document")
        with path.open("rb") as fh:
            head = fh.read(HEAD_BYTES)
    except FileNotFoundError:
        raise InputNotFound(f"{str(path)!r} does not exist; check the path") from None
    except PermissionError:
        raise InputNotFound(f"{str(path)!r} cannot be read (permission denied); fix its permissions") from None
    if size > options.max_file_bytes:
        raise FileTooLarge(
            f"{path.name!r} has {size} bytes, over the limit of {options.max_file_bytes}; "
            "split the document or raise max_file_bytes"
        )
    kind = sniff(head)
    if kind is FileKind.UNKNOWN:
        raise UnsupportedFileType(
            f"{path.name!r} is {describe_unknown(head)}; supported are PDF, PNG, JPEG, TIFF, WebP and BMP "
            "(convert it to PDF first)"
        )
    return kind


def inspect_document(path: Path | str, options: PreprocessOptions | None = None) -> DocumentInfo:
    """Validate a document and return its kind, page count, metadata and outline."""
    options = options or PreprocessOptions()
    kind = detect_kind(path, options)
    if kind is FileKind.PDF:
        # PyMuPDF, onnxruntime (0.8 s): off the platform's light import path
        from posttrain.preprocess.pdf import open_pdf, pdf_info

        doc = open_pdf(path, options)
        try:
            return pdf_info(doc)
        finally:
            doc.close()

    return image_info(path, kind, options)


def process_document(
    path: Path | str,
    options: PreprocessOptions | None = None,
    progress: ProgressCallback | None = None,
    pages: Sequence[int] | None = None,
    info: DocumentInfo | None = None,
) -> Iterator[PageResult]:
    """Yield every page (or the 1-based ``pages``) of the document at ``path``, in order.

    Validation happens before the first page: bad input raises before any
    worker starts. ``info`` skips re-inspecting a document already inspected.
    """
    options = options or PreprocessOptions()
    info = info or inspect_document(path, options)
    if pages is None:
        indices = list(range(info.page_count))
    else:
        bad = [p for p in pages if not 1 <= p <= info.page_count]
        if bad:
            raise PreprocessError(
                f"pages {bad[:5]} are outside 1..{info.page_count} of {Path(path).name!r}; pass existing page numbers"
            )
        indices = sorted({p - 1 for p in pages})
    return _run(Path(path), info.kind, indices, options, progress)


def _run(
    path: Path, kind: FileKind, indices: list[int], options: PreprocessOptions, progress: ProgressCallback | None
) -> Iterator[PageResult]:
    if not indices:
        return
    ctx = _mp_context()
    tasks = ctx.Queue()
    results = ctx.Queue()
    n_workers = max(1, min(options.workers, len(indices)))
    window = 4 * n_workers  # pages issued ahead of the next one to yield: bounds buffered results
    procs: list = []
    started = time.monotonic()
    busy: dict[int, tuple[int, float]] = {}  # worker -> (page index, start time)
    buffered: dict[int, PageResult] = {}
    issued = 0
    yielded = 0
    finished = False
    try:
        for wid in range(n_workers):
            target = _forked_worker if ctx.get_start_method() == "fork" else worker_main
            args = (str(path), kind.value, options.model_dump_json(), tasks, results, wid)
            procs.append(start_worker(ctx, target, args, name=f"posttrain-preprocess-{wid}"))
        while yielded < len(indices):
            while issued < len(indices) and issued - yielded < window:
                tasks.put(indices[issued])
                issued += 1
            try:
                status, wid, index, payload = results.get(timeout=_POLL_S)
            except queue.Empty:
                _check_workers(path, procs, busy, options)
                continue
            now = time.monotonic()
            if status == START:
                busy[wid] = (index, now)
                continue
            _, began = busy.pop(wid, (index, now))
            if status == ERROR:
                raise payload
            if now - began > options.page_timeout_s:
                raise _timeout(path, index, options)
            buffered[index] = payload
            while yielded < len(indices) and indices[yielded] in buffered:
                page = buffered.pop(indices[yielded])
                yielded += 1
                if progress is not None:
                    progress(
                        Progress(
                            done=yielded,
                            total=len(indices),
                            page_number=page.page_number,
                            elapsed_s=round(time.monotonic() - started, 3),
                        )
                    )
                yield page
            _check_workers(path, procs, busy, options)
        for _ in procs:
            tasks.put(None)
        finished = True
    finally:
        _stop(procs, tasks, results, graceful=finished)


def _timeout(path: Path, index: int, options: PreprocessOptions) -> PageTimeout:
    return PageTimeout(
        f"page {index + 1} of {path.name!r} took longer than {options.page_timeout_s:g}s; "
        "raise page_timeout_s, or turn off the slow step (tables='never', ocr='never')"
    )


def _check_workers(path: Path, procs: list, busy: dict[int, tuple[int, float]], options: PreprocessOptions) -> None:
    now = time.monotonic()
    for index, began in busy.values():
        if now - began > options.page_timeout_s:
            raise _timeout(path, index, options)
    for wid, proc in enumerate(procs):
        if proc.exitcode is not None and proc.exitcode != 0:
            where = f"page {busy[wid][0] + 1}" if wid in busy else "a page"
            raise CorruptDocument(
                f"the worker reading {where} of {path.name!r} died (exit code {proc.exitcode}); "
                "the page is damaged or too large for memory, re-export the file"
            )


def _stop(procs: list, tasks, results, graceful: bool) -> None:
    """Let finished workers exit; terminate (then kill) any still running."""
    deadline = time.monotonic() + (2.0 if graceful else 0.0)
    for proc in procs:
        if proc.pid is None:
            continue
        if graceful:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.terminate()
    for proc in procs:
        if proc.pid is None:
            continue
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
    for q in (tasks, results):
        q.cancel_join_thread()
        q.close()


def process_to_list(
    path: Path | str, options: PreprocessOptions | None = None, progress: ProgressCallback | None = None
) -> tuple[DocumentInfo, list[PageResult]]:
    """Convenience for small documents and tests: inspect and process everything."""
    options = options or PreprocessOptions()
    info = inspect_document(path, options)
    return info, list(process_document(path, options, progress, info=info))
