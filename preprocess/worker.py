"""The worker process: opens the document itself and extracts the pages it is handed.

Each worker holds only its own open document (MuPDF reads pages lazily), so a
long file is never read into one process's memory at once.
"""

from __future__ import annotations

import os
import signal
from multiprocessing.queues import Queue
from pathlib import Path

from posttrain.preprocess.errors import CorruptDocument, PreprocessError
from posttrain.preprocess.images import extract_image_page
from posttrain.preprocess.models import FileKind
from posttrain.preprocess.options import PreprocessOptions

START, DONE, ERROR = "start", "done", "error"


def worker_main(path: str, kind: str, options_json: str, tasks: Queue, results: Queue, worker_id: int) -> None:
    """Loop: take a 0-based page index from ``tasks``, put (status, worker, index, payload) on ``results``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers stop
    os.environ.setdefault("OMP_THREAD_LIMIT", "1")
    options = PreprocessOptions.model_validate_json(options_json)
    file_kind = FileKind(kind)
    name = Path(path).name
    doc = None
    try:
        while True:
            index = tasks.get()
            if index is None:
                return
            results.put((START, worker_id, index, None))
            try:
                if file_kind is FileKind.PDF:
                    # PyMuPDF, onnxruntime (0.8 s): off the light import path (the fork server preloads it)
                    from posttrain.preprocess.pdf import extract_page, open_pdf

                    if doc is None:
                        doc = open_pdf(path, options)
                    try:
                        page = doc.load_page(index)
                    except Exception as exc:
                        raise CorruptDocument(
                            f"page {index + 1} of {name!r} cannot be loaded ({exc}); the file is damaged, re-export it"
                        ) from None
                    result = extract_page(page, options)
                else:
                    result = extract_image_page(path, index, options)
                results.put((DONE, worker_id, index, result))
            except PreprocessError as exc:
                results.put((ERROR, worker_id, index, exc))
            except Exception as exc:  # MuPDF or Pillow failing inside a page: damaged content
                results.put(
                    (
                        ERROR,
                        worker_id,
                        index,
                        CorruptDocument(
                            f"page {index + 1} of {name!r} could not be processed ({type(exc).__name__}: {exc}); "
                            "the page content is damaged, re-export the file"
                        ),
                    )
                )
    finally:
        if doc is not None:
            doc.close()
