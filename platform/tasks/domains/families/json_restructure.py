"""JSON restructuring: pick, drop, rename, flatten, nest, invert, index, group, count, sum, sort."""

from __future__ import annotations

import json
import random
from collections import Counter
from functools import partial
from typing import Any

from posttrain.platform.tasks.domains.base import Domain, Problem, json_answer

_NAMES = ["ann", "bob", "cai", "dev", "eve", "fay", "gus", "hal", "ida", "jon"]
_KEYS = ["a", "b", "c", "d", "e", "f", "g", "h"]
_COLORS = ["red", "blue", "green"]


def _record(rng: random.Random, index: int, difficulty: int) -> dict[str, Any]:
    return {
        "id": index + 1,
        "name": rng.choice(_NAMES),
        "color": rng.choice(_COLORS),
        "n": rng.randint(0, 9 * difficulty),
    }


def _flat(rng: random.Random, difficulty: int) -> dict[str, int]:
    keys = rng.sample(_KEYS, min(len(_KEYS), 2 + difficulty))
    return {k: rng.randint(0, 10 * difficulty) for k in keys}


def flatten(value: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in value.items():
        path = f"{prefix}{key}"
        if isinstance(item, dict):
            out.update(flatten(item, path + "."))
        else:
            out[path] = item
    return out


def _make(task: str, rng: random.Random, difficulty: int) -> Problem:
    compact = partial(json.dumps, separators=(",", ":"))
    obj = _flat(rng, difficulty)
    records = [_record(rng, i, difficulty) for i in range(1 + difficulty)]
    keys = list(obj)
    if task == "pick":
        chosen = sorted(rng.sample(keys, max(1, len(keys) // 2)))
        return json_answer(
            f"Keep only keys {', '.join(chosen)} of {compact(obj)}. Reply with JSON.", {k: obj[k] for k in chosen}
        )
    if task == "drop":
        gone = rng.choice(keys)
        return json_answer(
            f"Remove key {gone} from {compact(obj)}. Reply with JSON.", {k: v for k, v in obj.items() if k != gone}
        )
    if task == "rename":
        old = rng.choice(keys)
        new = old + old
        return json_answer(
            f"Rename key {old} to {new} in {compact(obj)}. Reply with JSON.",
            {(new if k == old else k): v for k, v in obj.items()},
        )
    if task == "flatten":
        nested: dict[str, Any] = {keys[0]: {keys[1]: obj[keys[1]]}}
        for k in keys[2:]:
            nested[k] = {"x": obj[k]} if rng.random() < 0.5 else obj[k]
        return json_answer(f"Flatten with dotted keys: {compact(nested)}. Reply with JSON.", flatten(nested))
    if task == "nest":
        dotted = {f"{k}.{rng.choice('xyz')}": v for k, v in obj.items()}
        result: dict[str, Any] = {}
        for path, value in dotted.items():
            outer, inner = path.split(".")
            result.setdefault(outer, {})[inner] = value
        return json_answer(f"Unflatten the dotted keys: {compact(dotted)}. Reply with JSON.", result)
    if task == "invert":
        mapping = {k: _NAMES[i] for i, k in enumerate(keys)}
        return json_answer(
            f"Swap keys and values: {compact(mapping)}. Reply with JSON.", {v: k for k, v in mapping.items()}
        )
    if task == "index_by_id":
        rows = [{"id": r["id"], "name": r["name"]} for r in records]
        return json_answer(
            f"Map each id to its name: {compact(rows)}. Reply with JSON.", {str(r["id"]): r["name"] for r in rows}
        )
    if task == "pluck":
        rows = [{"id": r["id"], "n": r["n"]} for r in records]
        return json_answer(
            f'List the n values as {{"values": [...]}}: {compact(rows)}', {"values": [r["n"] for r in rows]}
        )
    if task == "group_by":
        rows = [{"name": r["name"], "color": r["color"]} for r in records]
        groups: dict[str, list[str]] = {}
        for r in rows:
            groups.setdefault(r["color"], []).append(r["name"])
        return json_answer(f"Group names by color, in order: {compact(rows)}. Reply with JSON.", groups)
    if task == "count_by":
        rows = [{"id": r["id"], "color": r["color"]} for r in records]
        counts = Counter(r["color"] for r in rows)
        return json_answer(
            f"Count rows per color: {compact(rows)}. Reply with JSON.",
            {c: counts[c] for c in dict.fromkeys(r["color"] for r in rows)},
        )
    if task == "sum_field":
        rows = [{"id": r["id"], "n": r["n"]} for r in records]
        return json_answer(
            f'Sum the n values as {{"total": ...}}: {compact(rows)}', {"total": sum(r["n"] for r in rows)}
        )
    if task == "sort_records":
        rows = [{"id": r["id"], "n": r["n"]} for r in records]
        ordered = sorted(rows, key=lambda r: (r["n"], r["id"]))
        return json_answer(
            f'Sort by n then id as {{"ids": [...]}}: {compact(rows)}', {"ids": [r["id"] for r in ordered]}
        )
    if task == "filter_records":
        rows = [{"id": r["id"], "color": r["color"]} for r in records]
        color = rng.choice(rows)["color"]
        return json_answer(
            f'Ids with color {color} as {{"ids": [...]}}: {compact(rows)}',
            {"ids": [r["id"] for r in rows if r["color"] == color]},
        )
    if task == "merge":
        other = _flat(rng, difficulty)
        return json_answer(
            f"Merge {compact(obj)} with {compact(other)} (second wins). Reply with JSON.", {**obj, **other}
        )
    if task == "wrap":
        key = rng.choice(["data", "item", "value"])
        return json_answer(f"Wrap {compact(obj)} under the key {key}. Reply with JSON.", {key: obj})
    raise ValueError(task)  # pragma: no cover


_TASKS = (
    "pick",
    "drop",
    "rename",
    "flatten",
    "nest",
    "invert",
    "index_by_id",
    "pluck",
    "group_by",
    "count_by",
    "sum_field",
    "sort_records",
    "filter_records",
    "merge",
    "wrap",
)


def domains() -> list[Domain]:
    return [
        Domain(f"json.{task}", "json", f"JSON restructuring: {task}", partial(_make, task), {"task": task})
        for task in _TASKS
    ]
