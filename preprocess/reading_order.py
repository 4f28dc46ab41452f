"""Reading order of blocks on a page, column-aware (a guarded recursive XY-cut).

At each region we first try a vertical cut (a gutter: an x-range no block
crosses, with a substantial column on each side), reading left before right;
failing that, horizontal bands top to bottom, where consecutive bands that
together still admit a gutter are merged again, so that paragraph gaps which
happen to line up across two columns do not interleave the columns; only a
block that crosses the gutter (a title, a full-width figure) separates them.
"""

from __future__ import annotations

from collections.abc import Sequence

from posttrain.preprocess.models import BBox

MIN_GUTTER = 6.0  # points
MIN_COLUMN_SHARE = 0.2  # each side of a gutter spans at least this share of the region's width
_TOL = 1.0


def reading_order(boxes: Sequence[BBox]) -> list[int]:
    """Return the indices of ``boxes`` in reading order."""
    items = [i for i, b in enumerate(boxes) if b[2] > b[0] and b[3] > b[1]]
    degenerate = [i for i, b in enumerate(boxes) if not (b[2] > b[0] and b[3] > b[1])]
    ordered = _order(items, boxes, depth=0)
    # zero-area boxes (empty text) go where their top-left point falls
    for i in degenerate:
        ordered.append(i)
    return ordered


def _order(items: list[int], boxes: Sequence[BBox], depth: int) -> list[int]:
    if len(items) <= 1 or depth > 60:
        return sorted(items, key=lambda i: (boxes[i][1], boxes[i][0]))
    cut = _vertical_cut(items, boxes)
    if cut is not None:
        left = [i for i in items if boxes[i][2] <= cut]
        right = [i for i in items if boxes[i][2] > cut]
        return _order(left, boxes, depth + 1) + _order(right, boxes, depth + 1)
    bands = _horizontal_bands(items, boxes)
    if len(bands) == 1:
        return sorted(items, key=lambda i: (boxes[i][1], boxes[i][0]))
    merged: list[list[int]] = [bands[0]]
    for band in bands[1:]:
        last = merged[-1]
        if _vertical_cut(last + band, boxes) is not None:
            merged[-1] = last + band
        else:
            merged.append(band)
    out: list[int] = []
    for group in merged:
        out.extend(_order(group, boxes, depth + 1))
    return out


def _vertical_cut(items: list[int], boxes: Sequence[BBox]) -> float | None:
    """The x of the widest acceptable gutter, or None."""
    spans = sorted((boxes[i][0], boxes[i][2]) for i in items)
    x_min = spans[0][0]
    x_max = max(s[1] for s in spans)
    width = x_max - x_min
    if width <= 0:
        return None
    best: tuple[float, float] | None = None
    reach = spans[0][1]
    for x0, x1 in spans[1:]:
        gap = x0 - reach
        if gap >= MIN_GUTTER:
            left_share = (reach - x_min) / width
            right_share = (x_max - x0) / width
            if left_share >= MIN_COLUMN_SHARE and right_share >= MIN_COLUMN_SHARE:
                if best is None or gap > best[0]:
                    best = (gap, reach + gap / 2)
        reach = max(reach, x1)
    return None if best is None else best[1]


def _horizontal_bands(items: list[int], boxes: Sequence[BBox]) -> list[list[int]]:
    ordered = sorted(items, key=lambda i: boxes[i][1])
    bands: list[list[int]] = [[ordered[0]]]
    bottom = boxes[ordered[0]][3]
    for i in ordered[1:]:
        if boxes[i][1] >= bottom - _TOL:
            bands.append([i])
        else:
            bands[-1].append(i)
        bottom = max(bottom, boxes[i][3]) if boxes[i][1] < bottom - _TOL else boxes[i][3]
    return bands
