"""Tables with PyMuPDF's find_tables, run only on pages that show table cues, and rule-only tables beside them.

find_tables' default ("lines") strategy builds cells from vector strokes and
rectangles, so a page without at least one rectangle or two horizontal and two
vertical rules cannot hold a table it would find. Checking that with
``get_cdrawings`` costs a fraction of a millisecond; find_tables costs tens.

PyMuPDF 2 gates find_tables by its ONNX layout model when pymupdf_layout is
installed (over a second per page on a CPU); we call the line-based detector
directly (``use_layout=False``), which is deterministic and what our table
recall is measured against.

A table typeset with horizontal rules only (LaTeX's booktabs, or one rule under its header, as GLPK's manual sets
its Type / Bounds / Comment tables) has no vertical edge, so the line strategy cannot see it. :func:`rule_tables`
reads those from the rules and the words: a horizontal rule at least ``MIN_RULE_PT`` wide, the text lines around it
that lie within its width (the header above, the rows below, up to a line that runs outside it or a gap), columns
where every line leaves the same horizontal gap, and rows from the lines (a line with nothing in the first column
continues the row above). It needs two columns and two rows besides the header, so a rule under a heading or above
footnotes is no table.

A table with no rule at all (a two-column list of terms and what they mean, as GMPL's manual sets its functions and
operators: ``abs(x)`` | "absolute value of x") is only whitespace: :func:`aligned_tables` reads consecutive lines
that each split at a wide gap (``ALIGN_GAP_PT``, wider than a justified line's spaces) into a term starting at one
left edge and text starting at one column edge, a line starting at that column continuing the row above (a
hanging indent). It keeps two-column runs of at least ``MIN_ALIGNED_ROWS`` rows: with more columns nothing tells a
header row from a body row, and a row of keywords set in columns is a list, not a table. None of these is one: a
table of contents (dot leaders), a bulleted or numbered list (a bullet or a list number is its first column), or
code (both columns set in a monospaced font: a statement and its comment, a solver's log), or two blocks of text
set side by side (an example beside its source: the text extraction keeps each in a block of its own, where a
table's row keeps its two cells in one block).
"""

from __future__ import annotations

import logging
import re

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


MIN_RULE_PT = 60.0  # a rule narrower than this underlines a word, not a table
RULE_THICKNESS_PT = 1.5  # a filled rectangle at most this tall is a rule
COLUMN_GAP_PT = 7.0  # a horizontal gap every line of the table leaves, at least this wide, separates two columns
LINE_JOIN_PT = 2.5  # words whose bottoms lie within this of each other are one line (math shifts a baseline)
MAX_LINE_GAP = 2.2  # a gap between lines this many times the table's usual line pitch ends it
RULE_SLACK_PT = 6.0  # a table's words may overhang its rules by this much
GUTTER_PT = 14.0  # text beside a table stands at least this far from its rules' width
RUNNING_HEAD_SHARE = 0.08  # a rule this high on the page under its first line separates the running head


def _horizontal_rules(page: pymupdf.Page) -> list[tuple[float, float, float]]:
    """(x0, x1, y) of the page's horizontal rules at least ``MIN_RULE_PT`` wide, merged where one rule is drawn in
    pieces, top to bottom."""
    rules: list[tuple[float, float, float]] = []
    for path in page.get_cdrawings():
        for item in path.get("items", ()):
            if item[0] == "l":
                (x0, y0), (x1, y1) = item[1], item[2]
                if abs(y0 - y1) <= 0.5 and abs(x1 - x0) >= MIN_RULE_PT:
                    rules.append((min(x0, x1), max(x0, x1), (y0 + y1) / 2))
            elif item[0] == "re":
                x0, y0, x1, y1 = item[1]
                if abs(y1 - y0) <= RULE_THICKNESS_PT and abs(x1 - x0) >= MIN_RULE_PT:
                    rules.append((min(x0, x1), max(x0, x1), (y0 + y1) / 2))
    rules.sort(key=lambda r: (round(r[2]), r[0]))
    merged: list[tuple[float, float, float]] = []
    for x0, x1, y in rules:
        if merged and abs(merged[-1][2] - y) <= 0.5 and x0 <= merged[-1][1] + SNAP:
            merged[-1] = (merged[-1][0], max(merged[-1][1], x1), merged[-1][2])
        else:
            merged.append((x0, x1, y))
    return sorted(merged, key=lambda r: r[2])


def _lines(words: list[tuple]) -> list[list[tuple]]:
    """Words grouped into text lines (by their bottoms, within ``LINE_JOIN_PT``), top to bottom, each left to
    right."""
    lines: list[list[tuple]] = []
    for w in sorted(words, key=lambda w: w[3]):
        if lines and w[3] - lines[-1][-1][3] <= LINE_JOIN_PT:
            lines[-1].append(w)
        else:
            lines.append([w])
    return [sorted(line, key=lambda w: w[0]) for line in lines]


def _columns(lines: list[list[tuple]], x0: float, x1: float) -> list[tuple[float, float]]:
    """The columns the lines share: x ranges separated by gaps at least ``COLUMN_GAP_PT`` wide that no line's words
    cross."""
    covered: list[tuple[float, float]] = sorted((w[0], w[2]) for line in lines for w in line)
    spans: list[list[float]] = []
    for a, b in covered:
        if spans and a - spans[-1][1] < COLUMN_GAP_PT:
            spans[-1][1] = max(spans[-1][1], b)
        else:
            spans.append([a, b])
    return [(a, b) for a, b in spans if b > x0 - RULE_SLACK_PT and a < x1 + RULE_SLACK_PT]


def _rule_table(
    lines: list[list[tuple]], group: list[tuple[float, float, float]], page_height: float
) -> tuple[tuple[float, float, float, float], list[list[tuple[str, tuple[float, float, float, float] | None]]]] | None:
    """The table a group of rules of one width holds (its box, and its rows of cells: text and box), or None. Its
    first row is its header."""
    x0, x1 = min(r[0] for r in group) - RULE_SLACK_PT, max(r[1] for r in group) + RULE_SLACK_PT
    top, bottom = group[0][2], group[-1][2]

    def within(line: list[tuple]) -> list[tuple] | None:
        """The line's words inside the rules' width, when any word outside stands clear of it by a gutter (a table
        beside this one); None when a word crosses its edge or runs up to it (text across the page)."""
        kept = [w for w in line if w[0] >= x0 and w[2] <= x1]
        outside = [w for w in line if not (w[0] >= x0 and w[2] <= x1)]
        if any(w[2] > x0 - GUTTER_PT and w[0] < x1 + GUTTER_PT for w in outside):
            return None
        return kept

    above = [i for i, line in enumerate(lines) if line[0][3] <= top + 1]
    below = [i for i, line in enumerate(lines) if line[0][1] >= top - 1]
    if not below:
        return None
    # the header: the line just above the first rule (booktabs: the lines between its first two rules)
    if len(group) >= 2:
        header_ids = [i for i in below if lines[i][0][3] <= group[1][2] + 1]
        body_start = group[1][2]
    else:
        running_head = above and above[-1] == 0 and top < RUNNING_HEAD_SHARE * page_height
        header_ids = (
            [above[-1]]
            if above and not running_head and within(lines[above[-1]]) and top - lines[above[-1]][-1][3] < 12
            else []
        )  # the page's first line over a rule in the top margin is its running head, not a header
        body_start = top
    body: list[list[tuple]] = []
    pitch: float | None = None
    last_bottom = body_start
    for i in below:
        if i in header_ids or lines[i][0][1] < body_start - 1:
            continue
        if len(group) >= 2 and lines[i][0][3] > bottom + 1:
            break  # a booktabs table ends at its last rule
        line = within(lines[i])
        if line is None:
            break
        if not line:
            continue  # a line of the table beside this one
        gap = line[0][3] - last_bottom
        if pitch is not None and gap > MAX_LINE_GAP * pitch:
            break
        if body:
            pitch = gap if pitch is None else min(pitch, gap)
        body.append(line)
        last_bottom = max(w[3] for w in line)
    head = [kept for i in header_ids if (kept := within(lines[i]))]
    if not head or len(head) < len(header_ids) or len(body) < 2:
        return None
    header_ids = list(range(len(head)))  # counted in table_lines from here on
    table_lines = head + body
    columns = _columns(table_lines, x0, x1)
    if len(columns) < 2:
        return None

    Box = tuple[float, float, float, float]

    def cells(line: list[tuple]) -> list[tuple[str, Box | None]]:
        placed: list[list[tuple]] = [[] for _ in columns]
        for w in line:
            centre = (w[0] + w[2]) / 2
            k = min(range(len(columns)), key=lambda c: 0 if columns[c][0] <= centre <= columns[c][1] else
                    min(abs(centre - columns[c][0]), abs(centre - columns[c][1])))  # fmt: skip
            placed[k].append(w)
        return [(" ".join(w[4] for w in ws), _box(ws)) for ws in placed]

    rows: list[list[tuple[str, Box | None]]] = []
    for k, line in enumerate(table_lines):
        row = cells(line)
        if rows and k >= len(header_ids) + 1 and not row[0][0]:  # nothing in the first column: the row goes on
            rows[-1] = [(" ".join(filter(None, (a[0], b[0]))), _union(a[1], b[1])) for a, b in zip(rows[-1], row)]
        else:
            rows.append(row)
    filled = [sum(bool(text) for text, _ in row) for row in rows]
    if filled[0] < 2 or sum(f >= 2 for f in filled[len(header_ids) :]) < 2:
        return None  # a table has a header over two columns and two rows that fill them
    words = [w for line in table_lines for w in line]
    box = (
        min(min(w[0] for w in words), group[0][0]),
        min(min(w[1] for w in words), top),
        max(max(w[2] for w in words), max(r[1] for r in group)),
        max(max(w[3] for w in words), bottom),
    )
    return box, rows


def _box(words: list[tuple]) -> tuple[float, float, float, float] | None:
    if not words:
        return None
    return min(w[0] for w in words), min(w[1] for w in words), max(w[2] for w in words), max(w[3] for w in words)


def _union(a: tuple[float, ...] | None, b: tuple[float, ...] | None) -> tuple[float, float, float, float] | None:
    if a is None or b is None:
        return a or b  # type: ignore[return-value]
    return min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3])


def rule_tables(page: pymupdf.Page, taken: list[tuple[float, float, float, float]] = ()) -> list[Table]:  # type: ignore[assignment]
    """The page's tables typeset with horizontal rules only (no vertical edge for find_tables' line strategy), none
    overlapping a box in ``taken`` (the tables found already)."""
    rules = [r for r in _horizontal_rules(page) if not any(_overlaps((r[0], r[2], r[1], r[2]), t) for t in taken)]
    if not rules:
        return []
    groups: list[list[tuple[float, float, float]]] = []
    for rule in rules:  # rules of one table: the same width, stacked
        for group in groups:
            if abs(group[0][0] - rule[0]) <= SNAP * 2 and abs(group[0][1] - rule[1]) <= SNAP * 2:
                group.append(rule)
                break
        else:
            groups.append([rule])
    lines = _lines(page.get_text("words"))
    found: list[Table] = []
    for group in groups:
        made = _rule_table(lines, group, page.rect.height)
        if made is None or any(_overlaps(made[0], t.bbox) for t in found):
            continue
        box, rows = made
        texts = [[_clean(text) for text, _ in row] for row in rows]
        cells = [TableCell(row=r, col=c, bbox=cell_box, text=texts[r][c]) for r, row in enumerate(rows)
                 for c, (_, cell_box) in enumerate(row)]  # fmt: skip
        found.append(Table(bbox=box, rows=len(rows), cols=len(texts[0]), header=texts[0], cells=cells,
                           markdown=_markdown(texts[0], texts[1:])))  # fmt: skip
    return found


ALIGN_GAP_PT = 12.0  # a gap this wide splits a line into cells (a justified line's widest spaces stay under it)
ALIGN_TOLERANCE_PT = 3.0  # cells of one column start within this of each other
MIN_ALIGNED_ROWS = 3  # an aligned two-column run of fewer rows is a sentence's layout, not a table
DOT_LEADERS = 5  # a line with this many lone dots in a row is a table of contents' entry (an ellipsis has three)
LIST_MARK = re.compile(r"^([•◦▪‣·∗*–—-]|\(?[0-9a-zA-Z]{1,3}[.)])$")  # a bullet or a list number: a list's item
MONOSPACED = re.compile(r"mono|courier|cmtt|typewriter|consol", re.IGNORECASE)
MONOSPACED_FLAG = 8  # PyMuPDF's span flag for a fixed-pitch font
CODE_SHARE = 0.8  # a column with this share of its characters in a monospaced font is code


def _cells(line: list[tuple]) -> list[list[tuple]]:
    """A line's words split where the gap between two words is at least ``ALIGN_GAP_PT``."""
    cells = [[line[0]]]
    for w in line[1:]:
        if w[0] - cells[-1][-1][2] >= ALIGN_GAP_PT:
            cells.append([w])
        else:
            cells[-1].append(w)
    return cells


def _aligned_runs(lines: list[list[tuple]]) -> list[list[list[list[tuple]]]]:
    """Runs of consecutive lines set as two aligned columns: each line either splits into two cells, the first
    starting at the run's left edge or ending at its right edge (a column of formulas set flush right) and the
    second starting at its column edge, or (a hanging indent) is one cell starting at the column
    edge; the lines stand no further apart than ``MAX_LINE_GAP`` times the run's pitch. Each run comes as its rows,
    a row as its two cells' words (a hanging line's words joined to the text of the row above)."""
    runs: list[list[list[list[tuple]]]] = []
    run: list[list[list[tuple]]] = []
    left = right = column = pitch = bottom = 0.0

    def near(a: float, b: float) -> bool:
        return abs(a - b) <= ALIGN_TOLERANCE_PT

    for line in lines:
        cells = _cells(line)
        dots = [0]
        for w in line:
            dots.append(dots[-1] + 1 if w[4] == "." else 0)
        leaders = max(dots) >= DOT_LEADERS
        if run:
            gap = line[0][3] - bottom
            close = gap <= MAX_LINE_GAP * pitch if pitch else gap <= 3 * (line[0][3] - line[0][1])
            row = (
                len(cells) == 2
                and (near(cells[0][0][0], left) or near(cells[0][-1][2], right))  # a term set flush left or right
                and near(cells[1][0][0], column)
            )
            hanging = len(cells) == 1 and near(cells[0][0][0], column)
            if close and not leaders and (row or hanging):
                pitch, bottom = gap if not pitch else min(pitch, gap), line[0][3]
                if row:
                    run.append(cells)
                else:
                    run[-1][1] = run[-1][1] + cells[0]
                continue
            runs.append(run)
            run = []
        if len(cells) == 2 and not leaders:
            run, left, right, column, pitch = [cells], cells[0][0][0], cells[0][-1][2], cells[1][0][0], 0.0
            bottom = line[0][3]
    if run:
        runs.append(run)
    return [rows for rows in runs if len(rows) >= MIN_ALIGNED_ROWS]


def _monospaced_share(page: pymupdf.Page, words: list[tuple]) -> float:
    """The share of the words' characters set in a monospaced font (by the spans they lie in)."""
    box = _box(words)
    if box is None:
        return 0.0
    spans = [span for block in page.get_text("dict", clip=pymupdf.Rect(box))["blocks"] for line in block.get("lines", ())
             for span in line["spans"] if span["text"].strip()]  # fmt: skip
    mono = total = 0
    for w in words:
        centre = ((w[0] + w[2]) / 2, (w[1] + w[3]) / 2)
        span = next((s for s in spans if pymupdf.Rect(s["bbox"]).contains(centre)), None)
        total += len(w[4])
        if span is not None and (span["flags"] & MONOSPACED_FLAG or MONOSPACED.search(span["font"])):
            mono += len(w[4])
    return mono / total if total else 0.0


def aligned_tables(page: pymupdf.Page, taken: list[tuple[float, float, float, float]] = ()) -> list[Table]:  # type: ignore[assignment]
    """The page's two-column tables set with no rule (:func:`_aligned_runs`), none overlapping a box in ``taken``,
    none a list or code; a row is a term and its text (a hanging line joins the row above). They have no header
    row."""
    found: list[Table] = []
    for rows in _aligned_runs(_lines(page.get_text("words"))):
        box = _box([w for row in rows for cell in row for w in cell])
        if box is None or any(_overlaps(box, t) for t in taken):
            continue
        if any(LIST_MARK.match(" ".join(w[4] for w in row[0])) for row in rows):
            continue  # a list: its first column is bullets or item numbers
        if 2 * sum(bool({w[5] for w in row[0]} & {w[5] for w in row[1]}) for row in rows) < len(rows):
            continue  # two blocks side by side: most rows' cells lie in blocks of their own
        if all(_monospaced_share(page, [w for row in rows for w in row[c]]) >= CODE_SHARE for c in (0, 1)):
            continue  # code: a statement and its comment, a log's lines
        texts = [[_clean(" ".join(w[4] for w in ws)) for ws in row] for row in rows]
        table_cells = [TableCell(row=r, col=c, bbox=_box(ws), text=texts[r][c])
                       for r, row in enumerate(rows) for c, ws in enumerate(row)]  # fmt: skip
        found.append(Table(bbox=box, rows=len(rows), cols=2, header=[], cells=table_cells,
                           markdown=_markdown([], texts)))  # fmt: skip
    return found


def iou(a: tuple[float, ...] | list[float], b: tuple[float, ...] | list[float]) -> float:
    """Two boxes' intersection over their union (a found table against a labelled one)."""
    x0, y0, x1, y1 = max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])
    inter = max(0.0, x1 - x0) * max(0.0, y1 - y0)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _overlaps(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return not (a[2] < b[0] or b[2] < a[0] or a[3] < b[1] - 1 or b[3] < a[1] - 1)


def find_page_tables(page: pymupdf.Page, mode: str = "auto") -> list[Table]:
    """Tables on ``page``: find_tables' ruled grids, then the tables set with horizontal rules only beside them,
    then two-column tables set with no rule beside both. mode: auto (find_tables only with cues), always, never."""
    if mode == "never":
        return []
    found = _grid_tables(page, mode)
    for more in (rule_tables, aligned_tables):
        try:
            found = found + more(page, [t.bbox for t in found])
        except Exception as exc:  # an enrichment: never sinks the page
            log.warning("%s failed on page %d: %s", more.__name__, page.number + 1, exc)
    return found


def _grid_tables(page: pymupdf.Page, mode: str) -> list[Table]:
    """find_tables' line strategy: tables whose cells are drawn (only on pages whose graphics could form cells)."""
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
    return [table for table in map(to_table, found.tables) if _has_text(table)]


MIN_FILLED_SHARE = (
    0.25  # a ruled grid with text in fewer of its cells is a drawing (axes, a chart's frame), not a table
)


def _has_text(table: Table) -> bool:
    """Whether a ruled grid reads as a table: text in two cells at least, and in a quarter of them."""
    filled = sum(bool(c.text) for c in table.cells)
    return filled >= 2 and filled >= MIN_FILLED_SHARE * max(1, len(table.cells))
