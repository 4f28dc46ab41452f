"""Job queue throughput: claims per second on SQLite and PostgreSQL with 1 and 4 workers.

    .venv/bin/python bench/queue.py [--jobs 400] [--pg postgresql://postgres@127.0.0.1:5432/test]

Each configuration drains the same number of no-op ``selftest`` jobs with real
``posttrain worker`` processes (each job is a real forked process). Prints one
JSON object per figure, the 1-worker figure beside the 4-worker one, and a
summary object last, with ``peer`` (the peer's setting: the same backend, jobs
and slots with 1 worker).
"""

from __future__ import annotations

import os
import sys

# This file is named like the standard library's ``queue``: keep bench/ off the import path.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402

import psycopg  # noqa: E402

from posttrain.platform.db import migrate  # noqa: E402
from posttrain.platform.db.engine import reset_engines  # noqa: E402
from posttrain.platform.jobs.loadtest import drain  # noqa: E402


def pg_database(admin_url: str) -> tuple[str, str]:
    name = f"posttrain_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return name, admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://") + "/" + name


def drop(admin_url: str, name: str) -> None:
    reset_engines()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=400, help="jobs per configuration")
    parser.add_argument("--slots", type=int, default=4, help="job slots per worker")
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test", help="PostgreSQL admin URL")
    args = parser.parse_args()

    summary: dict[str, object] = {"figure": "queue", "jobs": args.jobs, "workers": 4, "slots": args.slots}
    with tempfile.TemporaryDirectory() as tmp:
        for backend in ("sqlite", "postgres"):
            figures = {}
            for workers in (1, 4):
                data = Path(tmp) / f"{backend}-{workers}"
                if backend == "sqlite":
                    name, url = "", f"sqlite:///{data / 'bench.db'}"
                    data.mkdir(parents=True)
                else:
                    name, url = pg_database(args.pg)
                try:
                    migrate.upgrade(url)
                    report = drain(url, data, jobs=args.jobs, workers=workers, slots=args.slots)
                finally:
                    if name:
                        drop(args.pg, name)
                assert report.succeeded == args.jobs and report.ran_more_than_once == 0, report
                figures[workers] = report.claims_per_s
            print(json.dumps({
                "figure": f"{backend}_claims_per_s", "workers": 4, "value": round(figures[4], 1),
                "peer": "same backend, 1 worker", "peer_value": round(figures[1], 1),
                "ratio": round(figures[4] / figures[1], 2),
            }), flush=True)  # fmt: skip
            summary[f"{backend}_claims_per_s"] = round(figures[4], 1)
            summary[f"{backend}_claims_per_s_1_worker"] = round(figures[1], 1)
    summary["peer"] = {"name": "the same backend with 1 worker", "workers": 1, "slots": args.slots, "jobs": args.jobs}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
