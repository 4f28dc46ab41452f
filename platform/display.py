"""Values as people read them, one way in every table of the console and the command line: one time format
(``2026-12-05 08:42:55 UTC``), no "None" (a dash, or an empty cell where a script reads the text), no Python
dict's repr (a mapping is ``name: ci-bot · limits.rpm: 5``)."""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any

MISSING = "—"  # what a page shows for a value that is not there


def utc_text(when: datetime | None, missing: str = MISSING) -> str:
    """A time in UTC (a naive time is taken as UTC, as the database stores them); ``missing`` when there is none."""
    if when is None:
        return missing
    if when.tzinfo is not None:
        when = when.astimezone(UTC)
    return when.strftime("%Y-%m-%d %H:%M:%S UTC")


def shown(value: Any, missing: str = MISSING) -> str:
    """One value as text: nothing (None, an empty list or mapping) as ``missing``, a flag yes or no, a float to four
    significant digits, a time :func:`utc_text`, an enum its value, a list of plain values joined (of records, how
    many), a mapping :func:`details_text`."""
    if value is None or value == [] or value == {}:
        return missing
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, datetime):
        return utc_text(value, missing)
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, dict):
        return details_text(value, missing)
    if isinstance(value, (list, tuple)) and all(not isinstance(v, (dict, list)) for v in value):
        return ", ".join(shown(v, missing) for v in value)
    if isinstance(value, (list, tuple)):
        return f"{len(value)} items"
    return str(value)


def field_rows(data: dict[str, Any], prefix: str = "", missing: str = MISSING) -> list[tuple[str, str]]:
    """A nested mapping as (dotted field, shown value) rows."""
    rows: list[tuple[str, str]] = []
    for key, value in data.items():
        if isinstance(value, dict) and value:
            rows += field_rows(value, f"{prefix}{key}.", missing)
        else:
            rows.append((f"{prefix}{key}", shown(value, missing)))
    return rows


def details_text(details: Any, missing: str = MISSING) -> str:
    """A mapping (an audit entry's details, a verdict's) as one line, nested fields dotted; ``missing`` when empty."""
    if not isinstance(details, dict) or not details:
        return shown(details, missing) if details not in (None, {}) else missing
    return " · ".join(f"{field}: {value}" for field, value in field_rows(details, missing=missing))
