"""Table detection against hand labels, beside PyMuPDF's strongest detector, on real Debian manuals.

    .venv/bin/python bench/tables.py

The arbiter is ``bench/tables/labels.json``: every table on every examined page of GLPK's manual (pages 1-60), its
graphs guide and the ReportLab user guide, found by eye on rendered pages (no detector), each with its box, rows,
columns, cells and how it is ruled (grid, booktabs: horizontal rules only, none). Lists of return codes with no
header (``borderline``) and one-row pieces of a table split across pages (``fragment``) are counted apart.

- recall: of the labelled tables, the share the pipeline's detector (``preprocess.tables.find_page_tables``, as a
  document's preprocess job runs it: find_tables' line strategy on cued pages, rule-only and unruled two-column
  tables beside them) finds,
  a found box matching a label at IoU >= 0.5; by ruling too.
- peer: ``page.find_tables()`` with its defaults (PyMuPDF's layout strategy, its ONNX layout model, the strongest
  reference available here) on the same pages, in the same run, and its recall.
- cells: of the labelled cells of the tables both found, the share whose text the detector's table holds.
- false positives: tables found on the examined pages that match no label (a borderline list included).
- held out: GLPK's modelling-language manual (gmpl.pdf, every page), labelled after the detectors were written
  (``bench/tables/held_out.json``, the same convention): each detector's recall of its clear tables, the borderline
  ones it finds (two-column lists of terms, as the unruled detector reads), and its detections matching no label.

Prints one JSON object per figure, the summary last.
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import collections  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import pymupdf  # noqa: E402

from posttrain.preprocess.tables import find_page_tables, iou  # noqa: E402

LABELS = Path(__file__).resolve().parent / "tables" / "labels.json"
HELD_OUT = Path(__file__).resolve().parent / "tables" / "held_out.json"  # gmpl.pdf, labelled after the detectors
MATCH_IOU = 0.5


def plain(text: str | None) -> str:
    return " ".join((text or "").split()).lower()


def ours(page: pymupdf.Page) -> list[tuple[tuple[float, ...], set[str]]]:
    return [(t.bbox, {plain(c.text) for c in t.cells if c.text}) for t in find_page_tables(page)]


def peer(page: pymupdf.Page) -> list[tuple[tuple[float, ...], set[str]]]:
    found = page.find_tables()
    return [(tuple(t.bbox), {plain(c) for row in t.extract() for c in row if c}) for t in found.tables]


def kind_of(label: dict) -> str:
    if label.get("note", "").startswith("borderline"):
        return "borderline"
    return "fragment" if label["rows"] < 2 else "clear"


def emit(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


def main() -> int:
    labels = json.loads(LABELS.read_text())
    pages = [(f, n) for f, numbers in labels["examined_pages"].items() for n in numbers]
    detected: dict[str, dict[tuple[str, int], list]] = {"ours": {}, "peer": {}}
    seconds = collections.Counter()
    docs = {f: pymupdf.open(f) for f in labels["examined_pages"]}
    for name, detect in (("ours", ours), ("peer", peer)):
        start = time.perf_counter()
        for f, n in pages:
            detected[name][(f, n)] = detect(docs[f][n - 1])
        seconds[name] = time.perf_counter() - start
    by_page = collections.defaultdict(list)
    for label in labels["tables"]:
        by_page[(label["file"], label["page"])].append(label)

    figures: dict[str, dict] = {}
    for name in ("ours", "peer"):
        found, total = collections.Counter(), collections.Counter()
        ruled_found, ruled_total = collections.Counter(), collections.Counter()
        cells_held = cells_all = 0
        missed = []
        for label in labels["tables"]:
            kind = kind_of(label)
            match = max(detected[name][(label["file"], label["page"])], key=lambda d: iou(d[0], label["bbox"]),
                        default=None)  # fmt: skip
            hit = match is not None and iou(match[0], label["bbox"]) >= MATCH_IOU
            total[kind] += 1
            found[kind] += hit
            if kind == "clear":
                ruled_total[label["rules"]] += 1
                ruled_found[label["rules"]] += hit
                if not hit:
                    missed.append(f"{Path(label['file']).name} p{label['page']} ({label['rules']})")
            if hit and kind == "clear":
                wanted = [plain(c) for row in label["cells"] for c in row if plain(c)]
                cells_all += len(wanted)
                cells_held += sum(c in match[1] for c in wanted)
        extra = sum(
            1
            for key, found_tables in detected[name].items()
            for box, _ in found_tables
            if not any(iou(box, label["bbox"]) >= MATCH_IOU for label in by_page.get(key, []))
        )
        figures[name] = {
            "recall": round(found["clear"] / total["clear"], 4),
            "found": found["clear"],
            "labelled": total["clear"],
            "by_ruling": {k: f"{ruled_found[k]}/{ruled_total[k]}" for k in sorted(ruled_total)},
            "borderline_found": f"{found['borderline']}/{total['borderline']}",
            "fragments_found": f"{found['fragment']}/{total['fragment']}",
            "cells_held": round(cells_held / cells_all, 4) if cells_all else None,
            "false_positives": extra,
            "pages_per_s": round(len(pages) / seconds[name], 2),
            "missed": missed,
        }
        emit({"figure": f"tables_{name}", **figures[name]})

    held_labels = json.loads(HELD_OUT.read_text())
    held: dict[str, list] = {"ours": [], "peer": []}
    with pymupdf.open(held_labels["document"]) as doc:
        held_pages = doc.page_count
        for i, page in enumerate(doc):
            held["ours"] += [(i + 1, box) for box, _ in ours(page)]
            held["peer"] += [(i + 1, box) for box, _ in peer(page)]

    def held_figures(name: str) -> dict:
        """Found against the held-out labels: clear tables, borderline ones, and detections matching no label."""

        def hit(label: dict) -> bool:
            return any(p == label["page"] and iou(box, label["bbox"]) >= MATCH_IOU for p, box in held[name])

        counts = {kind: [hit(label) for label in held_labels["tables"] if label["kind"] == kind]
                  for kind in ("clear", "borderline")}  # fmt: skip
        unmatched = sum(not any(p == label["page"] and iou(box, label["bbox"]) >= MATCH_IOU
                                for label in held_labels["tables"]) for p, box in held[name])  # fmt: skip
        return {
            "recall": round(sum(counts["clear"]) / len(counts["clear"]), 4),
            "found": f"{sum(counts['clear'])}/{len(counts['clear'])}",
            "borderline_found": f"{sum(counts['borderline'])}/{len(counts['borderline'])}",
            "detections": len(held[name]),
            "matching_no_label": unmatched,
        }

    held_out = {
        "document": held_labels["document"],
        "pages": held_pages,
        "ours": held_figures("ours"),
        "peer": held_figures("peer"),
    }
    emit({"figure": "tables_held_out", **held_out})
    emit(
        {
            "figure": "tables",
            "labelled_tables": figures["ours"]["labelled"],
            "examined_pages": len(pages),
            "recall": figures["ours"]["recall"],
            "peer_recall": figures["peer"]["recall"],
            "by_ruling": figures["ours"]["by_ruling"],
            "peer_by_ruling": figures["peer"]["by_ruling"],
            "cells_held": figures["ours"]["cells_held"],
            "false_positives": figures["ours"]["false_positives"],
            "peer_false_positives": figures["peer"]["false_positives"],
            "pages_per_s": figures["ours"]["pages_per_s"],
            "peer_pages_per_s": figures["peer"]["pages_per_s"],
            "missed": figures["ours"]["missed"],
            "held_out": held_out,
            "peer": {
                "name": "page.find_tables() with its defaults",
                "version": pymupdf.VersionBind,
                "setting": "PyMuPDF's layout strategy (its ONNX layout model), the same pages, the same run",
            },
        }
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
