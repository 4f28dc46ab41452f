"""Date arithmetic and date formats, computed with the datetime module."""

from __future__ import annotations

import calendar
import datetime as dt
import random
from functools import partial

from posttrain.platform.tasks.domains.base import Domain, Problem, exact, numeric

_MONTHS = list(calendar.month_name)[1:]
_WEEKDAYS = list(calendar.day_name)


def _date(rng: random.Random, difficulty: int) -> dt.date:
    span = (1, 1) if difficulty == 1 else (1990, 2040) if difficulty < 4 else (1700, 2300)
    start = dt.date(2024 if difficulty == 1 else span[0], 1, 1)
    days = 365 if difficulty == 1 else (dt.date(span[1], 12, 31) - start).days
    return start + dt.timedelta(days=rng.randint(0, days))


def _offset(rng: random.Random, difficulty: int) -> int:
    return rng.randint(1, (9, 60, 400, 3000, 20000)[difficulty - 1])


def add_months(day: dt.date, months: int) -> dt.date:
    index = day.month - 1 + months
    year, month = day.year + index // 12, index % 12 + 1
    return dt.date(year, month, min(day.day, calendar.monthrange(year, month)[1]))


def long_form(day: dt.date) -> str:
    return f"{_MONTHS[day.month - 1]} {day.day}, {day.year}"


def _make(task: str, rng: random.Random, difficulty: int) -> Problem:
    day = _date(rng, difficulty)
    iso = day.isoformat()
    if task == "add_days":
        n = _offset(rng, difficulty)
        return exact(f"What date is {n} days after {iso}? Use YYYY-MM-DD.", (day + dt.timedelta(days=n)).isoformat())
    if task == "sub_days":
        n = _offset(rng, difficulty)
        return exact(f"What date is {n} days before {iso}? Use YYYY-MM-DD.", (day - dt.timedelta(days=n)).isoformat())
    if task == "add_weeks":
        n = rng.randint(1, 2 + 10 * difficulty)
        return exact(f"What date is {n} weeks after {iso}? Use YYYY-MM-DD.", (day + dt.timedelta(weeks=n)).isoformat())
    if task == "add_months":
        n = rng.randint(1, 3 + 12 * (difficulty - 1))
        return exact(
            f"What date is {n} months after {iso}? Use YYYY-MM-DD (clamp to month end).", add_months(day, n).isoformat()
        )
    if task == "days_between":
        other = day + dt.timedelta(days=_offset(rng, difficulty))
        return numeric(f"How many days from {iso} to {other.isoformat()}?", (other - day).days)
    if task == "weekday":
        return exact(f"What day of the week is {iso}?", _WEEKDAYS[day.weekday()], normalize=True)
    if task == "day_of_year":
        return numeric(f"What day of the year is {iso}?", day.timetuple().tm_yday)
    if task == "leap_year":
        year = day.year
        return exact(
            f"Is {year} a leap year? Answer yes or no.", "yes" if calendar.isleap(year) else "no", normalize=True
        )
    if task == "days_in_month":
        return numeric(
            f"How many days are in {_MONTHS[day.month - 1]} {day.year}?", calendar.monthrange(day.year, day.month)[1]
        )
    if task == "iso_to_us":
        return exact(f"Write {iso} as MM/DD/YYYY.", day.strftime("%m/%d/") + f"{day.year:04d}")
    if task == "us_to_iso":
        return exact(f"Write {day.strftime('%m/%d/')}{day.year:04d} as YYYY-MM-DD.", iso)
    if task == "iso_to_long":
        return exact(f"Write {iso} like 'March 5, 2024'.", long_form(day), normalize=True)
    if task == "long_to_iso":
        return exact(f"Write {long_form(day)} as YYYY-MM-DD.", iso)
    if task == "next_weekday":
        target = rng.randrange(7)
        ahead = (target - day.weekday() - 1) % 7 + 1
        return exact(
            f"What is the date of the first {_WEEKDAYS[target]} after {iso}? Use YYYY-MM-DD.",
            (day + dt.timedelta(days=ahead)).isoformat(),
        )
    if task == "quarter":
        return numeric(f"Which quarter (1-4) of the year is {iso} in?", (day.month - 1) // 3 + 1)
    if task == "month_name":
        return exact(f"What is the month name of {iso}?", _MONTHS[day.month - 1], normalize=True)
    raise ValueError(task)  # pragma: no cover


_TASKS = (
    "add_days",
    "sub_days",
    "add_weeks",
    "add_months",
    "days_between",
    "weekday",
    "day_of_year",
    "leap_year",
    "days_in_month",
    "iso_to_us",
    "us_to_iso",
    "iso_to_long",
    "long_to_iso",
    "next_weekday",
    "quarter",
    "month_name",
)


def domains() -> list[Domain]:
    return [
        Domain(f"dates.{task}", "dates", f"date arithmetic: {task}", partial(_make, task), {"task": task})
        for task in _TASKS
    ]
