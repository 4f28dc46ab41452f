"""Tables with PyMuPDF's find_tables, run only on pages that show table cues.

find_tables' default ("lines") strategy builds cells from vector strokes and
rectangles, so a page without at least one rectangle or two horizontal and two
vertical rules cannot hold a table it would find. Checking that with
``get_cdrawings`` costs a fraction of a millisecond; find_tables costs tens.

PyMuPDF 2 gates find_tables by its ONNX layout model when pymupdf_layout is
installed (over a second per page on a CPU); we call the line-based detector
directly (``use_layout=False``), which is deterministic and what our table
recall is measured against.
"""

from __future__ import annotations

import logging

import pymupdf

from posttrain.preprocess.models import Table, TableCell

log = logging.getLogger(__name__)

SNAP = 3.0  # find_tables' default snap / join / intersection tolerance
MAX_EDGES = 4000  # beyond this many edges the cue gives up and says "maybe"
MAX_PATHS = 400
CLIP_PAD = 6.0


def _path_edges(path: dict) -> tuple[list[float], list[float]]:
    """x positions of vertical edges and y positions of horizontal edges of one path."""
    xs: list[float] = []
    ys: list[float] = []

    def add_rect(x0: float, y0: float, x1: float, y1: float) -> None:
        x0, x1 = min(x0, x1), max(x0, x1)
        y0, y1 = min(y0, y1), max(y0, y1)
        if x1 - x0 <= SNAP:  # a filled rectangle simulating a vertical rule
            xs.append((x0 + x1) / 2)
        elif y1 - y0 <= SNAP:  # ... or a horizontal one
            ys.append((y0 + y1) / 2)
        else:
            xs.extend((x0, x1))
            ys.extend((y0, y1))

    for item in path.get("items", ()):
        op = item[0]
        if op == "l":
            (x0, y0), (x1, y1) = item[1], item[2]
            if abs(x0 - x1) <= SNAP:
                xs.append(x0)
            elif abs(y0 - y1) <= SNAP:
                ys.append(y0)
        elif op == "re":
            add_rect(*item[1])
        elif op == "qu":
            pts = item[1]
            qx = [p[0] for p in pts]
            qy = [p[1] for p in pts]
            add_rect(min(qx), min(qy), max(qx), max(qy))
    return xs, ys


def _distinct(values: list[float]) -> int:
    count, last = 0, None
    for v in sorted(values):
        if last is None or v - last > SNAP:
            count += 1
        last = v
    return count


def _neighbors(a: tuple, b: tuple) -> bool:
    return not (a[0] > b[2] + SNAP or b[0] > a[2] + SNAP or a[1] > b[3] + SNAP or b[1] > a[3] + SNAP)


def table_cues(page: pymupdf.Page) -> bool:
    """True when the page's vector graphics could form a table of at least two cells."""
    return bool(table_regions(page))


WHOLE_PAGE = "whole page"


def table_regions(page: pymupdf.Page) -> list[tuple[float, float, float, float]] | str:
    """Boxes of the vector-graphics clusters that could form a table of two or more cells.

    Returns WHOLE_PAGE when the page has too many graphics to judge cheaply.

    Mirrors what find_tables' line strategy can see: edges from axis-parallel
    lines, rectangles and quads, grouped with the enveloping box of each cluster
    of touching paths. Only a cluster whose edges span at least 2 x 3 distinct
    positions can hold two cells; a lone box (a code listing, a frame) cannot.
    """
    paths = page.get_cdrawings()
    if not paths:
        return []
    rects = []
    edges = []
    total = 0
    for path in paths:
        xs, ys = _path_edges(path)
        if not xs and not ys:
            continue
        total += len(xs) + len(ys)
        if total > MAX_EDGES:
            return WHOLE_PAGE
        rects.append(tuple(path["rect"]))
        edges.append((xs, ys))
    # cluster paths whose boxes touch (within the snap tolerance), growing each cluster's box as
    # find_tables does: a grown box adds its own border edges, which may reach further paths
    clusters: list[tuple[list[int], tuple[float, float, float, float]]] = [([i], rects[i]) for i in range(len(rects))]
    if len(clusters) > MAX_PATHS:
        return WHOLE_PAGE
    merged = True
    while merged:
        merged = False
        out: list[tuple[list[int], tuple[float, float, float, float]]] = []
        for members, box in clusters:
            for k, (other_members, other_box) in enumerate(out):
                if _neighbors(box, other_box):
                    out[k] = (
                        other_members + members,
                        (
                            min(box[0], other_box[0]),
                            min(box[1], other_box[1]),
                            max(box[2], other_box[2]),
                            max(box[3], other_box[3]),
                        ),
                    )
                    merged = True
                    break
            else:
                out.append((members, box))
        clusters = out
    regions: list[tuple[float, float, float, float]] = []
    for members, box in clusters:
        xs = [x for i in members for x in edges[i][0]]
        ys = [y for i in members for y in edges[i][1]]
        xs += [box[0], box[2]]
        ys += [box[1], box[3]]
        nx, ny = _distinct(xs), _distinct(ys)
        if nx >= 2 and ny >= 2 and (nx >= 3 or ny >= 3):
            regions.append(box)
    return regions


def _clean(text: str | None) -> str:
    return " ".join((text or "").split())


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    def esc(cell: str) -> str:
        return cell.replace("|", "\\|")

    cols = max([len(header)] + [len(r) for r in rows]) if (header or rows) else 0
    if cols == 0:
        return ""
    head = [esc(h) for h in header] + [""] * (cols - len(header))
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * cols]
    for row in rows:
        cells = [esc(c) for c in row] + [""] * (cols - len(row))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def to_table(found: pymupdf.table.Table) -> Table:
    """Convert one PyMuPDF table into our model, with cells and markdown."""
    data = [[_clean(c) for c in row] for row in found.extract()]
    header_external = bool(getattr(found.header, "external", False))
    names = [_clean(n) for n in (found.header.names or [])]
    body = data if header_external else data[1:]
    header = names if names else (data[0] if data else [])
    cells: list[TableCell] = []
    for r, row in enumerate(found.rows):
        for c, box in enumerate(row.cells):
            text = data[r][c] if r < len(data) and c < len(data[r]) else ""
            cells.append(TableCell(row=r, col=c, bbox=tuple(box) if box else None, text=text))
    return Table(
        bbox=tuple(found.bbox),
        rows=found.row_count,
        cols=found.col_count,
        header=header,
        cells=cells,
        markdown=_markdown(header, body),
    )


def find_page_tables(page: pymupdf.Page, mode: str = "auto") -> list[Table]:
    """Tables on ``page``. mode: auto (only with cues), always, never."""
    if mode == "never":
        return []
    clip = None
    if mode == "auto":
        regions = table_regions(page)
        if not regions:
            return []
        if not isinstance(regions, str):  # the one str is WHOLE_PAGE
            # find_tables extracts text only inside its clip: restricting it to the candidate
            # clusters saves most of its time, and a table cannot lie outside them
            clip = (
                pymupdf.Rect(
                    min(r[0] for r in regions) - CLIP_PAD,
                    min(r[1] for r in regions) - CLIP_PAD,
                    max(r[2] for r in regions) + CLIP_PAD,
                    max(r[3] for r in regions) + CLIP_PAD,
                )
                & page.rect
            )
    try:
        found = page.find_tables(clip=clip, use_layout=False)
    except Exception as exc:  # table detection must not sink the page: it is an enrichment
        log.warning("find_tables failed on page %d: %s", page.number + 1, exc)
        return []
    return [to_table(t) for t in found.tables]
