"""The ``posttrain`` command line.

    posttrain db upgrade            apply migrations to the configured database
    posttrain worker                claim and run jobs
    posttrain console               serve the Streamlit console
    posttrain up                    worker + console together (what ``make run`` starts)
    posttrain jobs submit|list|show|cancel|logs|kinds
    posttrain models list|register|import|export|interpolate|deploy|compare|default-tier
    posttrain docs add|list
    posttrain users bootstrap-admin|add|passwd|disable|enable|list   console users (admins)
    posttrain keys create|list|revoke   API keys of the OpenAI-compatible API (admins)

Every ``list`` command (and ``jobs kinds``) takes ``--json``: a JSON array of objects, one a row, with every
column as a JSON value (numbers, booleans, null, lists; times in ISO 8601, UTC). A table written to a pipe or
a file is never folded or cut: each row is one whole line, whatever its width.

Errors a user can cause (bad settings, an unreachable database, an unknown job
kind, a malformed config, a role that may not do that) print one line naming the
input and the fix, and exit with status 2.

Every command that changes something calls a platform action with the identity
the command acts as (:func:`posttrain.platform.auth.command_line_identity`): the
local administrator ``cli:<login name>``, or the console user named by
``POSTTRAIN_CLI_USER`` with that user's role.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar, cast

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column, Table
from rich.text import Text

import posttrain
from posttrain.platform import auth
from posttrain.platform.api_keys import ApiKeyError, create_key, list_keys, revoke_key
from posttrain.platform.api_keys import shown as key_shown
from posttrain.platform.auth import AuthError, Identity, PermissionDenied, command_line_identity, is_loopback
from posttrain.platform.db.engine import DatabaseUnavailable, redact
from posttrain.platform.db.models import JobStatus, Role
from posttrain.platform.display import shown
from posttrain.platform.documents import add_document, list_documents
from posttrain.platform.engines.inspect import ModelDirError
from posttrain.platform.failures import BadInput
from posttrain.platform.jobs import queue
from posttrain.platform.jobs.config_file import ConfigFile, read_config_file
from posttrain.platform.jobs.queue import JobNotFound
from posttrain.platform.jobs.registry import JobConfigError, kinds, parse_config_text, read_result, validate_config
from posttrain.platform.jobs.worker import Worker
from posttrain.platform.models.downloads import open_export
from posttrain.platform.models.exporter import serve_elsewhere
from posttrain.platform.models.general_check import GeneralCheck, describe
from posttrain.platform.models.importer import Dtype, import_model
from posttrain.platform.models.interpolate import interpolate_models
from posttrain.platform.models.jobs import ExportModelConfig, export_registered
from posttrain.platform.models.registry import (
    ModelNotFound,
    is_registered,
    list_models,
    register_model,
    set_default_tier,
)
from posttrain.platform.oidc import write_streamlit_secrets
from posttrain.platform.serving.auth import ApiAuth, OpenServerRefused, refuse_open_server
from posttrain.platform.serving.jobs import registered_deployments
from posttrain.platform.settings import SettingsError, get_settings
from posttrain.platform.supervise import Supervised
from posttrain.platform.users import disable_user, enable_user
from posttrain.preprocess.errors import PreprocessError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="posttrain: post-training platform.")
db_app = typer.Typer(no_args_is_help=True, help="Database schema.")
jobs_app = typer.Typer(no_args_is_help=True, help="Submit, follow and cancel jobs.")
users_app = typer.Typer(no_args_is_help=True, help="Console users and roles.")
keys_app = typer.Typer(no_args_is_help=True, help="API keys of the OpenAI-compatible API (admins).")
models_app = typer.Typer(no_args_is_help=True, help="The model registry.")
docs_app = typer.Typer(no_args_is_help=True, help="Documents: add and list.")
app.add_typer(db_app, name="db")
app.add_typer(jobs_app, name="jobs")
app.add_typer(users_app, name="users")
app.add_typer(keys_app, name="keys")
app.add_typer(models_app, name="models")
app.add_typer(docs_app, name="docs")

PIPED_WIDTH = 1_000_000  # the width of a console that is not a terminal: a row is never folded or cut


def _console(*, stderr: bool = False) -> Console:
    """A terminal gets tables fitted to its width; a pipe or a file (``posttrain models list | grep``) gets every
    row whole on one line, never cut with an ellipsis at 80 columns."""
    console = Console(stderr=stderr)
    return console if console.is_terminal else Console(stderr=stderr, width=PIPED_WIDTH)


out = _console()
err = _console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])

USER_ERRORS = (
    SettingsError,
    DatabaseUnavailable,
    BadInput,
    JobNotFound,
    FileNotFoundError,
    AuthError,
    ModelDirError,
    ModelNotFound,
    PermissionDenied,
    ApiKeyError,
    OpenServerRefused,
)


class SchemaOutOfDate(RuntimeError):
    pass


def user_errors(fn: F) -> F:
    """Turn the errors a user can cause into one clear line and exit status 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (*USER_ERRORS, SchemaOutOfDate) as exc:
            err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


def _setup_logging() -> None:
    logging.basicConfig(
        level=get_settings().log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("alembic").setLevel(logging.WARNING)


def require_schema() -> None:
    from posttrain.platform.db import migrate  # alembic (0.14 s) only where a command migrates

    current, head = migrate.current_revision(), migrate.head_revision()
    if current != head:
        url = redact(get_settings().resolved_database_url)
        state = "has no posttrain schema" if current is None else f"is at schema revision {current}, not {head}"
        raise SchemaOutOfDate(f"the database at {url} {state}: run `posttrain db upgrade`")


# --- lists: a table, or JSON with --json -----------------------------------------------------

JsonOption = Annotated[
    bool, typer.Option("--json", help="Print a JSON array of objects (every column; times in ISO 8601)")
]


def json_value(value: Any) -> Any:
    """A value as JSON holds it: times in ISO 8601, enums by their value, paths as text, the rest as they are."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    return value


def cell_text(value: Any) -> str:
    """A value as a table cell (:func:`posttrain.platform.display.shown`), a missing one an empty cell: what a
    script reading the table finds there is the value or nothing."""
    return shown(value, missing="")


@dataclass(frozen=True)
class ListField:
    """One column of a list: the key of its value in the rows (and in the JSON), its table header and how a
    cell shows it (default :func:`cell_text`); ``table=False`` keeps it to the JSON."""

    key: str
    header: str | None = None
    show: Callable[[Any], str | Text] | None = None
    table: bool = True
    no_wrap: bool = False


def print_rows(rows: Sequence[dict[str, Any]], fields: Sequence[ListField], as_json: bool) -> None:
    """The rows of a list command: with ``--json`` a JSON array of objects holding every field, else a table (in
    a terminal, fitted to it; in a pipe or file, each row whole on one line)."""
    if as_json:
        sys.stdout.write(
            json.dumps([{f.key: json_value(row.get(f.key)) for f in fields} for row in rows], indent=2) + "\n"
        )
        return
    columns = [f for f in fields if f.table]
    table = Table(*(Column(f.header or f.key.replace("_", " "), no_wrap=f.no_wrap) for f in columns))
    for row in rows:
        cells = [(f.show or cell_text)(row.get(f.key)) for f in columns]
        table.add_row(*(c if isinstance(c, Text) else Text(c) for c in cells))  # text, never read as markup
    out.print(table)


def _cut(text: str | None, limit: int) -> str:
    """A long text cut to ``limit`` characters in a terminal only: a pipe gets it whole."""
    text = text or ""
    return text[: limit - 1] + "…" if out.is_terminal and len(text) > limit else text


# --- db -------------------------------------------------------------------------------


@db_app.command("upgrade")
@user_errors
def db_upgrade() -> None:
    """Create or migrate the schema to the latest revision."""
    from posttrain.platform.db import migrate  # alembic: see above

    settings = get_settings()
    settings.ensure_dirs()
    migrate.upgrade()
    out.print(f"database {redact(settings.resolved_database_url)} is at revision {migrate.current_revision()}")


@db_app.command("current")
@user_errors
def db_current() -> None:
    """Show the schema revision of the configured database."""
    from posttrain.platform.db import migrate  # alembic: see above

    out.print(f"current: {migrate.current_revision()}  head: {migrate.head_revision()}")


# --- worker, console, up ----------------------------------------------------------------------


@app.command()
@user_errors
def worker(
    cpu_slots: Annotated[int | None, typer.Option(help="CPU jobs at once (default: settings)")] = None,
    gpu_slots: Annotated[int | None, typer.Option(help="GPU jobs at once (default: settings)")] = None,
    exit_when_idle: Annotated[bool, typer.Option(help="Stop once the queue is empty")] = False,
) -> None:
    """Claim queued jobs and run each in its own process group."""
    _setup_logging()
    require_schema()
    Worker(cpu_slots=cpu_slots, gpu_slots=gpu_slots, exit_when_idle=exit_when_idle).run()


def me() -> Identity:
    """Who this command acts as (checked against the database when it names a console user)."""
    return command_line_identity()


def refuse_open_console(host: str) -> None:
    """The console may listen beyond loopback only once an admin (with a password) exists."""
    if not is_loopback(host) and not auth.has_admin():
        raise AuthError(
            f"refusing to serve the console on {host} while no admin password is set: "
            "run `posttrain users bootstrap-admin NAME` first, or listen on 127.0.0.1"
        )


def console_command(host: str, port: int) -> list[str]:
    """``streamlit run`` of the console; with single sign-on configured, first writes the ``[auth]``
    secrets Streamlit reads (posttrain.platform.oidc) and points Streamlit at that file alone."""
    app_path = Path(posttrain.__file__).resolve().parent / "ui" / "server.py"  # the pages and the session routes
    settings = get_settings()
    secrets: list[str] = []
    if settings.oidc is not None:
        secrets = ["--secrets.files", str(write_streamlit_secrets(settings.oidc, settings.data_dir, port))]
    return [
        sys.executable, "-m", "streamlit", "run", str(app_path),
        "--server.address", host,
        "--server.port", str(port),
        "--server.headless", "true",
        "--browser.gatherUsageStats", "false",
        "--server.fileWatcherType", "none",
        "--client.toolbarMode", "minimal",
        *secrets,
    ]  # fmt: skip


@app.command()
@user_errors
def console(
    host: Annotated[str | None, typer.Option(help="Address to listen on (default: settings)")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: settings)")] = None,
) -> None:
    """Serve the operator console (Streamlit)."""
    settings = get_settings()
    require_schema()
    refuse_open_console(host or settings.console_host)
    cmd = console_command(host or settings.console_host, port or settings.console_port)
    os.execv(sys.executable, cmd)


@app.command()
@user_errors
def gateway(
    host: Annotated[str | None, typer.Option(help="Address (default: settings)")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: settings)")] = None,
) -> None:
    """Serve the OpenAI-compatible gateway in front of every running deployment, checking API keys
    (on loopback: everyone is served until the first key exists; elsewhere a key must exist first)."""
    import uvicorn  # with the gateway below: the web stack (0.3 s) only for this command

    from posttrain.platform.serving.gateway import GatewayConfig, create_gateway_app  # fastapi, aiohttp

    _setup_logging()
    settings = get_settings()
    require_schema()
    host = host or settings.gateway_host
    auth = ApiAuth(host)
    refuse_open_server("gateway", host, auth)
    app_ = create_gateway_app(
        GatewayConfig(deployments=registered_deployments()),
        refresh=registered_deployments,
        auth=auth,
        exports=open_export,
        registered=is_registered,
    )
    uvicorn.run(app_, host=host, port=port or settings.gateway_port, log_level="warning")


UP_MAX_RESTARTS = 5  # `posttrain up` restarts a part that exits, unless it exits more often than this ...
UP_RESTART_WINDOW_S = 60.0  # ... within this many seconds


@app.command()
@user_errors
def up(
    host: Annotated[str | None, typer.Option(help="Console address (default: settings)")] = None,
    port: Annotated[int | None, typer.Option(help="Console port (default: settings)")] = None,
) -> None:
    """Run a worker, the gateway and the console together until Ctrl-C, then stop them cleanly; a part
    that exits on its own is started again."""
    settings = get_settings()
    require_schema()
    host, port = host or settings.console_host, port or settings.console_port
    refuse_open_console(host)
    refuse_open_server("gateway", settings.gateway_host, ApiAuth(settings.gateway_host))
    commands = {
        "worker": [sys.executable, "-m", "posttrain.platform.cli", "worker"],
        "gateway": [sys.executable, "-m", "posttrain.platform.cli", "gateway"],
        "console": console_command(host, port),
    }

    def start(name: str) -> Supervised:  # its lines go to our terminal, named; it dies with us
        return Supervised(commands[name], on_line=lambda line: print(f"[{name}] {line}", flush=True))

    procs = {name: start(name) for name in commands}
    exits: dict[str, list[float]] = {name: [] for name in commands}
    shown = "localhost" if host in ("127.0.0.1", "0.0.0.0") else host
    out.print(
        f"posttrain is up: console on http://{shown}:{port}, OpenAI-compatible API on "
        f"http://{settings.gateway_host}:{settings.gateway_port}/v1  (Ctrl-C stops)"
    )
    stopping = False

    def stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    code = 0
    while not stopping:
        # One part that exits (killed, crashed) is started again on its own: the console going
        # away must not stop the worker and its jobs. A part that keeps exiting stops everything.
        for name, proc in list(procs.items()):
            if stopping or proc.poll() is None:
                continue
            proc.join_output()
            now = time.monotonic()
            exits[name] = [t for t in exits[name] if now - t < UP_RESTART_WINDOW_S] + [now]
            if len(exits[name]) > UP_MAX_RESTARTS:
                err.print(f"[bold red]{name} exited with code {proc.poll()}, {len(exits[name])} times within "
                          f"{UP_RESTART_WINDOW_S:.0f}s; stopping the rest[/]")  # fmt: skip
                code = proc.poll() or 1
                stopping = True
                break
            err.print(f"[bold yellow]{name} exited with code {proc.poll()}; starting it again[/]")
            procs[name] = start(name)
        time.sleep(0.2)
    for proc in procs.values():
        if proc.poll() is None:
            proc.proc.send_signal(signal.SIGTERM)  # all at once; then each gets what is left of the grace
    deadline = time.monotonic() + settings.cancel_grace_s + 5
    for proc in procs.values():
        proc.stop(grace_s=max(0.1, deadline - time.monotonic()))
    out.print("posttrain stopped")
    raise typer.Exit(code)


# --- jobs -------------------------------------------------------------------------------


def _load_config(config: str | None, config_file: Path | None) -> tuple[dict[str, Any], ConfigFile | None]:
    """The config a command was given, and the file it came from (None: ``--config`` or nothing)."""
    if config and config_file:
        raise JobConfigError("give either --config or --config-file, not both")
    if config_file is not None:
        read = read_config_file(config_file)
        return read.data, read
    data = parse_config_text(config, "--config", json_only=True) if config else {}
    if not isinstance(data, dict):
        raise JobConfigError(f"a job config must be a mapping of fields, got {type(data).__name__}")
    return data, None


def _explained(source: ConfigFile | None, kind: str) -> contextlib.AbstractContextManager[None]:
    """Where a config file's errors are worded by its lines, never by what they hold."""
    return contextlib.nullcontext() if source is None else source.errors_explained(kind)


@jobs_app.command("kinds")
@user_errors
def jobs_kinds(as_json: JsonOption = False) -> None:
    """List the job kinds this installation knows."""
    rows = [{"kind": k.name, "resumable": k.resumable, "retryable": k.retryable, "max_attempts": k.max_attempts,
             "cpu_slots": k.cpu_slots, "gpu_slots": k.gpu_slots, "description": k.description}
            for k in kinds().values()]  # fmt: skip
    print_rows(rows, [ListField("kind"), ListField("resumable"), ListField("retryable"), ListField("max_attempts", "attempts"),
                      ListField("cpu_slots", "cpu"), ListField("gpu_slots", "gpu"), ListField("description")], as_json)  # fmt: skip


@jobs_app.command("submit")
@user_errors
def jobs_submit(
    kind: Annotated[str, typer.Argument(help="Job kind, e.g. selftest (see `posttrain jobs kinds`)")],
    config: Annotated[str | None, typer.Option(help="Config as a JSON object")] = None,
    config_file: Annotated[Path | None, typer.Option(help="Config as a YAML or JSON file")] = None,
    priority: Annotated[int, typer.Option(help="Higher runs first")] = 0,
    timeout: Annotated[float | None, typer.Option(help="Wall-clock limit of one attempt, seconds")] = None,
    follow: Annotated[bool, typer.Option(help="Follow the job with a progress bar until it ends")] = False,
) -> None:
    """Validate a job config and queue the job."""
    data, source = _load_config(config, config_file)
    require_schema()
    with _explained(source, kind):
        job_id = queue.submit(me(), kind, data, priority=priority, timeout_s=timeout)
    out.print(f"queued job {job_id} ({kind}, priority {priority})")
    if follow:
        _follow(job_id)


@jobs_app.command("estimate")
@user_errors
def jobs_estimate(
    kind: Annotated[str, typer.Argument(help="The run's kind: train_preset, train_grpo or train_sft")],
    config: Annotated[str | None, typer.Option(help="The run's config as a JSON object")] = None,
    config_file: Annotated[Path | None, typer.Option(help="The run's config as a YAML or JSON file")] = None,
    calibration_steps: Annotated[int, typer.Option(help="SFT/GRPO steps timed after a warm-up step")] = 1,
    wait: Annotated[bool, typer.Option(help="Wait for the estimate and print it (a worker must be running)")] = True,
) -> None:
    """Estimate a training run's wall time on this host before launching it: an ``estimate`` job times each of its
    stages in miniature (a few real steps, one evaluation batch per domain) and scales them to the run."""
    data, source = _load_config(config, config_file)
    require_schema()
    with _explained(source, kind):
        if source is not None:  # by the file's lines first: the estimate job's own check nests the run's problems
            validate_config(kind, data)
        job_id = queue.submit(me(), "estimate", {"kind": kind, "config": data, "calibration_steps": calibration_steps})
    out.print(f"queued estimate job {job_id}; submit the same config to find it beside the run")
    if not wait:
        return
    _follow(job_id, stream_log=False)
    estimate: Any = read_result("estimate", queue.get_job(job_id).result)
    table = Table("stage", "estimate", "how")
    for stage in estimate.stages:
        table.add_row(stage.stage, f"{stage.seconds:.0f} s", stage.how)
    out.print(table)
    out.print(f"{kind}: {estimate.summary()} (calibrated in {estimate.calibration_s:.0f} s)")


def _status_style(status: JobStatus) -> str:
    return {
        JobStatus.succeeded: "green",
        JobStatus.failed: "red",
        JobStatus.running: "cyan",
        JobStatus.cancelled: "yellow",
        JobStatus.interrupted: "magenta",
    }.get(status, "white")


JOB_FIELDS = (
    ListField("id"), ListField("kind"),
    ListField("status", show=lambda s: Text(s.value, style=_status_style(s))),
    ListField("priority", "prio"),
    ListField("attempts", "try", table=False), ListField("max_attempts", table=False),
    ListField("attempt", "try"),
    ListField("progress", show=lambda p: "" if p is None else f"{p:.0%}"),
    ListField("progress_message", "message", show=lambda m: _cut(m, 60)),
    ListField("created_at", "created", no_wrap=True),
    ListField("started_at", table=False), ListField("finished_at", table=False), ListField("submitted_by", table=False),
    ListField("error", show=lambda e: _cut(e, 60)), ListField("error_cause", table=False),
)  # fmt: skip


@jobs_app.command("list")
@user_errors
def jobs_list(
    status: Annotated[JobStatus | None, typer.Option(help="Only jobs with this status")] = None,
    kind: Annotated[str | None, typer.Option(help="Only jobs of this kind")] = None,
    limit: Annotated[int, typer.Option(help="How many, newest first")] = 30,
    as_json: JsonOption = False,
) -> None:
    """List jobs, newest first."""
    require_schema()
    rows = [{**job.model_dump(), "attempt": f"{job.attempts}/{job.max_attempts}"}
            for job in queue.list_jobs(status=status, kind=kind, limit=limit)]  # fmt: skip
    print_rows(rows, JOB_FIELDS, as_json)


@jobs_app.command("show")
@user_errors
def jobs_show(
    job_id: Annotated[int, typer.Argument(help="Job id")],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object, every field")] = False,
) -> None:
    """Show everything recorded about one job: id, kind and status first, then the rest (its config and result as
    indented JSON, one field a line, so a pipe gets short lines too)."""
    require_schema()
    job = queue.get_job(job_id)
    fields = job.model_dump() | {"waiting": queue.why_waiting(job)}  # why a queued job has not started
    ordered = {k: json_value(fields[k]) for k in (*SHOWN_FIRST, *[k for k in fields if k not in SHOWN_FIRST])}
    if as_json:
        out.print_json(json.dumps(ordered))
        return
    table = Table(show_header=False, box=None, pad_edge=False)
    for name, value in ordered.items():
        text = json.dumps(value, indent=2) if isinstance(value, (dict, list)) and value else cell_text(value)
        table.add_row(Text(name, style="bold"), Text(text))
    out.print(table)


SHOWN_FIRST = ("id", "kind", "status", "waiting")  # what `jobs show` leads with


@jobs_app.command("cancel")
@user_errors
def jobs_cancel(job_id: Annotated[int, typer.Argument(help="Job id")]) -> None:
    """Cancel a queued job, or stop a running one (SIGTERM, then SIGKILL after the grace period)."""
    require_schema()
    status = queue.cancel(me(), job_id)
    if status == JobStatus.running:
        out.print(f"job {job_id}: stop requested; its worker stops it within the grace period")
    else:
        out.print(f"job {job_id}: {status.value}")


@jobs_app.command("logs")
@user_errors
def jobs_logs(
    job_id: Annotated[int, typer.Argument(help="Job id")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the job ends")] = False,
    tail: Annotated[int | None, typer.Option(help="Only the last N lines")] = None,
) -> None:
    """Print a job's log."""
    require_schema()
    job = queue.get_job(job_id)
    if not follow:
        sys.stdout.write(queue.read_log(job, tail) + "\n")
        return
    _follow(job_id, stream_log=True)


def _follow(job_id: int, stream_log: bool = True) -> None:
    """Print the log as it grows, with a progress line, until the job finishes."""
    offset = 0
    with Progress(
        TextColumn("job {task.fields[job]} {task.fields[status]}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}% {task.fields[message]}"),
        TimeElapsedColumn(),
        console=out,
    ) as bar:
        task = bar.add_task("job", total=1.0, job=job_id, status="queued", message="")
        while True:
            job = queue.get_job(job_id)
            if stream_log and job.log_path and os.path.exists(job.log_path):
                with open(job.log_path, "rb") as fh:
                    fh.seek(offset)
                    chunk = fh.read()
                    offset += len(chunk)
                for line in chunk.decode("utf-8", errors="replace").splitlines():
                    bar.console.print(line, markup=False, highlight=False)
            bar.update(task, completed=job.progress or 0.0, status=job.status.value, message=job.progress_message)
            if job.status.finished:
                break
            time.sleep(0.5)
    style = _status_style(job.status)
    out.print(f"job {job_id} [{style}]{job.status.value}[/]" + (f": {job.error}" if job.error else ""))
    if job.status != JobStatus.succeeded:
        raise typer.Exit(1)


# --- documents ----------------------------------------------------------------------------


@docs_app.command("add")
@user_errors
def docs_add(
    files: Annotated[list[Path], typer.Argument(help="PDFs and images (PNG, JPEG, TIFF, WebP, BMP)")],
    password: Annotated[str | None, typer.Option(help="Password of encrypted PDFs (never stored)")] = None,
    follow: Annotated[bool, typer.Option(help="Follow each preprocess job to its end")] = False,
) -> None:
    """Store documents (content-addressed; the same content twice is one document) and preprocess them."""
    require_schema()
    identity = me()
    failed = 0
    jobs: list[int] = []
    for path in files:
        try:
            added = add_document(identity, path, password=password)
        except PreprocessError as exc:
            err.print(f"[bold red]error:[/] {path}: {exc}", highlight=False, soft_wrap=True)
            failed += 1
            continue
        if added.created:
            assert added.job_id is not None  # a new document's preprocess job was queued
            out.print(f"document {added.document.id} {added.document.filename}: queued preprocess job {added.job_id}")
            jobs.append(added.job_id)
        else:
            out.print(
                f"document {added.document.id} {added.document.filename}: stored before ({added.document.status.value})"
            )
    if follow:
        for job_id in jobs:
            _follow(int(job_id), stream_log=False)
    if failed:
        raise typer.Exit(2)


@docs_app.command("list")
@user_errors
def docs_list(
    limit: Annotated[int, typer.Option(help="How many, newest first")] = 50, as_json: JsonOption = False
) -> None:
    """List documents with their status."""
    require_schema()
    rows = [d.model_dump(exclude={"meta"}) for d in list_documents(limit=limit)]
    print_rows(rows, [ListField("id"), ListField("filename", "file"), ListField("kind"), ListField("page_count", "pages"),
                      ListField("status"), ListField("size_bytes", table=False), ListField("sha256", table=False),
                      ListField("storage_path", table=False), ListField("created_at", "added", no_wrap=True),
                      ListField("updated_at", table=False), ListField("error", show=lambda e: _cut(e, 80))], as_json)  # fmt: skip


# --- models -----------------------------------------------------------------------------


@models_app.command("list")
@user_errors
def models_list(as_json: JsonOption = False) -> None:
    """List registered models with their lineage and general check: the change on the held-out tasks of domains its
    run never trained on, beside the model it was trained from, with its paired SE (``general_regressed``: it fell
    beyond 2 SEs, and deploying it needs --allow-regression; null: never measured)."""
    require_schema()
    found = list_models()
    names = {m.id: m.name for m in found}
    rows = []
    for m in found:
        check = GeneralCheck.of(m)
        rows.append({"id": m.id, "name": m.name, "architecture": m.architecture, "base": names.get(m.base_model_id),
                     "from_job": m.produced_by_job_id, "default_tier": (m.meta or {}).get("default_tier"),
                     "general": check.short() if check else "not measured", "general_check": describe(m),
                     "general_against": check and check.against, "general_before": check and check.before,
                     "general_after": check and check.after, "general_delta": check and check.delta,
                     "general_se": check and check.se, "general_tasks": check and check.tasks,
                     "general_regressed": check and check.regressed, "path": m.path, "registered_at": m.created_at})  # fmt: skip
    print_rows(rows, [ListField("id", table=False), ListField("name"), ListField("architecture"), ListField("base"),
                      ListField("from_job", "from job"), ListField("default_tier", table=False),
                      ListField("general", "general check"), ListField("general_check", table=False),
                      *(ListField(f"general_{k}", table=False) for k in ("against", "before", "after", "delta", "se",
                                                                         "tasks", "regressed")),
                      ListField("path"), ListField("registered_at", "registered", no_wrap=True)], as_json)  # fmt: skip


@models_app.command("deploy")
@user_errors
def models_deploy(
    name: Annotated[str, typer.Argument(help="Registered model to serve")],
    tier: Annotated[str, typer.Option(help="Speed tier: fast or standard (or one of the Tiers tab's)")] = "standard",
    engine: Annotated[str | None, typer.Option(help="embedded, llamacpp or vllm (default: the tier's)")] = None,
    allow_regression: Annotated[
        bool,
        typer.Option(
            "--allow-regression",
            help="deploy it although its general check fell beyond 2 paired SEs below the model it "
            "was trained from (refused without; the audit log records who overrode it)",
        ),
    ] = False,
) -> None:
    """Queue a deploy job: the model served in a tier until the job is cancelled (a worker runs it); the gateway
    routes to it. A model whose general check regressed is refused unless --allow-regression."""
    require_schema()
    config: dict[str, Any] = {"model": name, "tier": tier, "allow_regression": allow_regression}
    if engine is not None:
        config["engine"] = engine
    job_id = queue.submit(me(), "deploy", config)
    out.print(
        f"queued deploy job {job_id}: {name} in the {tier} tier"
        + (" (general check regression allowed; audited)" if allow_regression else ""),
        soft_wrap=True,
    )


@models_app.command("default-tier")
@user_errors
def models_default_tier(
    name: Annotated[str, typer.Argument(help="A registered model")],
    tier: Annotated[
        str | None, typer.Argument(help="The tier its requests go to when they name none; leave out to clear")
    ] = None,
) -> None:
    """Set the tier the gateway routes a model's requests to when they name no tier (no header, no name@tier suffix)."""
    require_schema()
    set_default_tier(me(), name, tier)
    out.print(
        f"{name}: requests that name no tier go to {tier!r}" if tier else f"{name}: the routing policy picks the tier"
    )


@models_app.command("register")
@user_errors
def models_register(
    name: Annotated[str, typer.Argument(help="Name to serve and train it under")],
    path: Annotated[Path, typer.Argument(help="Hugging Face model directory")],
    base: Annotated[str | None, typer.Option(help="Registered model it derives from")] = None,
) -> None:
    """Register a model directory (checked: config, tokenizer and weights must be there)."""
    require_schema()
    row = register_model(me(), name, path, base=base)
    out.print(f"registered {row.name} ({row.architecture}) at {row.path}")


@contextlib.contextmanager
def _progress_line(label: str) -> Iterator[Callable[[float, str], None]]:
    """A transient progress bar on stderr for work done in this process; yields ``progress(fraction, message)``."""
    with Progress(TextColumn(label), BarColumn(), TextColumn("{task.fields[message]}"), TimeElapsedColumn(),
                  console=err, transient=True) as bar:  # fmt: skip
        task = bar.add_task(label, total=1.0, message="")
        yield lambda fraction, message: bar.update(task, completed=fraction, message=message)


@models_app.command("import")
@user_errors
def models_import(
    source: Annotated[
        str,
        typer.Argument(
            help="A GGUF file, a Hugging Face directory, or a built-in model: "
            "builtin:smollm2-135m-instruct, builtin:gemma3-270m"
        ),
    ],
    name: Annotated[str | None, typer.Option(help="Name to register it under (default: from the source)")] = None,
    dtype: Annotated[str, typer.Option(help="float32 or bfloat16 weights")] = "float32",
    chat_template: Annotated[
        str | None,
        typer.Option(
            "--chat-template",
            help="give the model a chat template in place of its own (a base model has none): a family "
            "(chatml, gemma) or a Jinja template file",
        ),
    ] = None,
) -> None:
    """Import real weights into the data directory and register them (a built-in model twice is a no-op);
    a built-in's provenance and licence are printed after it. A model without a chat template is a base model:
    it answers prompts on /v1/completions and refuses chat; SFT, GRPO and evaluation put its tasks to it in the
    plain completion format ("Question: ..." then "Answer:", worked examples first; SFT trains the answer and EOS,
    an answer is cut where the model goes on to a question of its own) unless the run sets chat_template."""
    require_schema()
    if dtype not in ("float32", "bfloat16"):
        raise JobConfigError(f"--dtype {dtype!r} is not float32 or bfloat16")
    with _progress_line("import") as progress:
        template = Path(chat_template).read_text() if chat_template and Path(chat_template).is_file() else chat_template
        row = import_model(me(), source, name=name, dtype=cast(Dtype, dtype), progress=progress, chat_template=template)
    meta = row.meta or {}
    out.print(f"{row.name}: {meta.get('parameters', 0) / 1e6:.1f}M parameters at {row.path}; "
              f"asked {meta.get('check_prompt')!r} it answers {meta.get('check_answer')!r}", soft_wrap=True)  # fmt: skip
    if not meta.get("chat_template", True):
        out.print(f"{row.name} is a base model (no chat template): it answers prompts on /v1/completions and trains and is "
                  "evaluated in the plain completion format; to chat, give it a template with --chat-template gemma|chatml, "
                  "or with chat_template in its SFT run", soft_wrap=True, markup=False, highlight=False)  # fmt: skip
    if meta.get("provenance"):
        out.print(f"from {meta['provenance']}", soft_wrap=True, markup=False, highlight=False)
    if meta.get("licence"):
        where = f"; its text: {meta['licence_file']}" if meta.get("licence_file") else ""
        out.print(f"licence: {meta['licence']}{where}", soft_wrap=True, markup=False, highlight=False)


@models_app.command("export")
@user_errors
def models_export(
    name: Annotated[str, typer.Argument(help="Registered model to export")],
    format: Annotated[
        str, typer.Option("--format", help="hf (a Hugging Face directory) or gguf (llama.cpp, Ollama)")
    ] = "gguf",
    outtype: Annotated[str, typer.Option(help="GGUF weights: q8_0 or f16")] = "q8_0",
) -> None:
    """Export a model's full weights (a LoRA run merged) into <data_dir>/exports/<name>/."""

    require_schema()
    try:
        config = ExportModelConfig(model=name, format=format, outtype=outtype)
    except ValidationError as exc:
        raise JobConfigError("; ".join(f"--{e['loc'][0]}: {e['msg']}" for e in exc.errors())) from None
    with _progress_line("export") as progress:
        entry = export_registered(me(), config, get_settings(), progress=progress)
    out.print(f"exported {name} ({entry['bytes'] / 1e6:.0f} MB) to {entry['path']}", soft_wrap=True)

    for runtime, command in serve_elsewhere(name, entry["format"], entry["path"]).items():
        out.print(f"serve it with {runtime}:\n  {command}", soft_wrap=True, markup=False, highlight=False)


@models_app.command("interpolate")
@user_errors
def models_interpolate(
    a: Annotated[str, typer.Argument(help="The model training started from (registered name): alpha 0")],
    b: Annotated[str, typer.Argument(help="The model trained from A (registered name): alpha 1")],
    alpha: Annotated[float, typer.Option(help="Weight of B, between 0 and 1: (1 - alpha) * A + alpha * B")],
    name: Annotated[str | None, typer.Option(help="Name to register it under (default: <B>-alpha<alpha>)")] = None,
) -> None:
    """Interpolate the weights of a trained model B and the model A it started from (WiSE-FT, a forgetting control):
    every floating tensor (1 - alpha) * A + alpha * B, A's weights at alpha 0 and B's at alpha 1 exactly; config,
    tokenizer and chat template from B. Registered with A as its base. To pick alpha on validation tasks from the
    train split, run the interpolate_model job with alphas: [...]."""
    require_schema()
    with _progress_line("interpolate") as progress:
        row = interpolate_models(me(), a, b, alpha, name=name, progress=progress)
    out.print(f"registered {row.name}: {1 - alpha:g} x {a} + {alpha:g} x {b} at {row.path}", soft_wrap=True,
              markup=False, highlight=False)  # fmt: skip


def _print_arena(result: dict[str, Any], show: int) -> None:
    """A stored comparison: pass@1 side by side per domain, the paired difference with its paired SE (clustered by
    source where tasks share one) and 95% CI, B's wins/ties/losses, the general check's row (domains neither was
    trained on) apart, then the first ``show`` tasks where their verdicts differ."""
    arena = result.get("arena")
    if not arena:
        raise JobConfigError("that job holds no head-to-head comparison (it evaluated one model, or sampled)")
    a, b = arena["a"], arena["b"]
    table = Table("domain", "tasks", a, b, f"{b} - {a} ± paired SE (95% CI)", "wins/ties/losses")
    rows = [*arena["domains"].items(), *([("general check (all)", arena["general"])] if arena.get("general") else [])]
    for domain, row in rows:
        se = (
            f" ± {row['se']:.1%}"
            + (f", {row['clusters']} sources" if row.get("clusters") not in (None, row["tasks"]) else "")
            if "se" in row
            else ""
        )  # a comparison stored before the SE was kept shows its interval only
        table.add_row(domain, str(row["tasks"]), f"{row['a']:.1%}", f"{row['b']:.1%}",
                      f"{row['delta']:+.1%}{se} ({row['ci_low']:+.1%} .. {row['ci_high']:+.1%})",
                      f"{row['wins']}/{row['ties']}/{row['losses']}")  # fmt: skip
    out.print(table)
    shown = arena["disagreements"][:show]
    if shown:
        detail = Table("domain", "prompt", "reference", a, b, show_lines=True)
        mark = {True: "[green]pass[/]", False: "[red]fail[/]"}
        for d in shown:
            detail.add_row(d["domain"], d["prompt"][-200:], str(d["reference"] or "")[:80],
                           f"{mark[d['a_passed']]} {d['a'][:120]}", f"{mark[d['b_passed']]} {d['b'][:120]}")  # fmt: skip
        out.print(detail)
    out.print(f"{arena['disagreements_total']} tasks where they disagree; {len(shown)} shown")


@models_app.command("compare")
@user_errors
def models_compare(
    a: Annotated[str | None, typer.Argument(help="Baseline model (registered name)")] = None,
    b: Annotated[str | None, typer.Argument(help="Model compared with it")] = None,
    tasks: Annotated[str | None, typer.Option(help="Stored task set whose eval split both answer")] = None,
    domain: Annotated[
        list[str] | None, typer.Option(help="Procedural domain (repeat); default: all of --tasks")
    ] = None,
    difficulty: Annotated[int, typer.Option(help="Procedural difficulty")] = 1,
    limit: Annotated[int, typer.Option(help="Tasks per domain")] = 50,
    max_new_tokens: Annotated[int, typer.Option(help="Answer length limit")] = 64,
    show: Annotated[int, typer.Option(help="Disagreements to print")] = 10,
    job: Annotated[int | None, typer.Option(help="Reopen the comparison stored by this evaluate job")] = None,
) -> None:
    """The same held-out tasks through two models: pass@1 per domain with the difference and its
    confidence interval, and the tasks where they disagree (an evaluate job; a worker runs it)."""
    require_schema()
    if job is None:
        if not (a and b):
            raise JobConfigError("name two models, A and B (or reopen a stored comparison with --job ID)")
        config = {"models": [a, b], "task_set": tasks, "domains": domain or [], "difficulty": difficulty,
                  "tasks_per_domain": limit, "max_new_tokens": max_new_tokens}  # fmt: skip
        job = queue.submit(me(), "evaluate", config)
        out.print(f"queued evaluate job {job}: {a} vs {b}; a worker runs it (posttrain up, or posttrain worker)")
        _follow(job, stream_log=False)
    found = queue.get_job(job)
    if found.kind != "evaluate" or found.status != JobStatus.succeeded:
        raise JobConfigError(f"job {job} is a {found.status.value} {found.kind} job, not a finished evaluate job")
    _print_arena(found.result or {}, show)


# --- users ------------------------------------------------------------------------------


def _read_password(password_stdin: bool) -> str:
    if password_stdin:
        return sys.stdin.readline().rstrip("\n")
    if os.environ.get("POSTTRAIN_ADMIN_PASSWORD"):
        return os.environ["POSTTRAIN_ADMIN_PASSWORD"]
    first = typer.prompt("Password", hide_input=True)
    if typer.prompt("Repeat password", hide_input=True) != first:
        raise AuthError("the two passwords differ")
    return first


@users_app.command("bootstrap-admin")
@user_errors
def users_bootstrap_admin(
    username: Annotated[str, typer.Argument(help="The first admin's username")],
    password_stdin: Annotated[bool, typer.Option(help="Read the password from standard input")] = False,
) -> None:
    """Create the first admin (refused once an admin exists). Password: prompt, stdin, or POSTTRAIN_ADMIN_PASSWORD."""
    require_schema()
    if auth.has_admin():  # before the password prompt; bootstrap_admin checks again
        raise AuthError(auth.ADMIN_EXISTS)
    auth.bootstrap_admin(username, _read_password(password_stdin))
    out.print(f"admin {username} created; log in at the console")


@users_app.command("add")
@user_errors
def users_add(
    username: Annotated[str, typer.Argument(help="Username")],
    role: Annotated[Role, typer.Option(help="viewer, operator or admin")] = Role.viewer,
    password_stdin: Annotated[bool, typer.Option(help="Read the password from standard input")] = False,
) -> None:
    """Add a console user."""
    require_schema()
    identity = me()
    auth.create_user(identity, username, _read_password(password_stdin), role)
    out.print(f"user {username} ({role.value}) created")


@users_app.command("passwd")
@user_errors
def users_passwd(
    username: Annotated[str, typer.Argument(help="Username")],
    password_stdin: Annotated[bool, typer.Option(help="Read the password from standard input")] = False,
) -> None:
    """Set a user's password (and unlock the account)."""
    require_schema()
    identity = me()
    auth.set_password(identity, username, _read_password(password_stdin))
    out.print(f"password of {username} changed")


@users_app.command("disable")
@user_errors
def users_disable(username: Annotated[str, typer.Argument(help="Username")]) -> None:
    """Disable a user: their console session, their actions and the API keys they created are refused
    from their next request on (refused for the last enabled admin)."""
    _change_account(disable_user, username, "are refused until they are enabled")


@users_app.command("enable")
@user_errors
def users_enable(username: Annotated[str, typer.Argument(help="Username")]) -> None:
    """Enable a disabled user again: they log in again, and the API keys they created work again."""
    _change_account(enable_user, username, "work again")


def _change_account(change: Callable[[Identity, str], Any], username: str, keys_now: str) -> None:
    require_schema()
    done = change(me(), username)
    keys = f"; the {done.keys} API key(s) they created {keys_now}" if done.keys else ""
    out.print(f"user {username} {'disabled' if done.disabled else 'enabled'}{keys}", soft_wrap=True)


@users_app.command("list")
@user_errors
def users_list(as_json: JsonOption = False) -> None:
    """List console users."""
    require_schema()
    rows = [u.model_dump(exclude={"password_hash", "id"}) for u in auth.list_users()]
    print_rows(rows, [ListField("username", "user"), ListField("role"), ListField("disabled"), ListField("failed_logins", "failed logins"),
                      ListField("locked_until", table=False), ListField("last_login_at", "last login", no_wrap=True),
                      ListField("created_at", "created", no_wrap=True)], as_json)  # fmt: skip


# --- API keys ---------------------------------------------------------------------------


@keys_app.command("create")
@user_errors
def keys_create(
    name: Annotated[str, typer.Argument(help="Who or what uses the key, e.g. ci-bot")],
    model: Annotated[
        list[str] | None, typer.Option("--model", help="A registered model it may use (repeat); none: every model")
    ] = None,
) -> None:
    """Create an API key and print it: the only time it is shown (only a hash of it is kept)."""
    require_schema()
    made = create_key(me(), name, model or [])
    err.print(f"API key {key_shown(made.key.key_id)} ({made.key.name}) for "
              f"{', '.join(made.key.models) or 'every model'}; copy it now, it is not shown again:")  # fmt: skip
    sys.stdout.write(made.secret + "\n")


@keys_app.command("list")
@user_errors
def keys_list(
    all_: Annotated[bool, typer.Option("--all", help="Also revoked keys")] = False, as_json: JsonOption = False
) -> None:
    """List API keys (their public ids; never the secrets). A key's models: empty (JSON) or "all" (table) is every model."""
    require_schema()
    rows = [{"key": key_shown(k.key_id), "name": k.name, "models": list(k.models or []), "created_at": k.created_at,
             "created_by": k.created_by, "last_used_at": k.last_used_at, "revoked_at": k.revoked_at,
             "revoked_by": k.revoked_by} for k in list_keys(me(), include_revoked=all_)]  # fmt: skip
    print_rows(rows, [ListField("key", no_wrap=True), ListField("name"), ListField("models", show=lambda m: ", ".join(m) or "all"),
                      ListField("created_at", "created", no_wrap=True), ListField("created_by", "by"),
                      ListField("last_used_at", "last used", no_wrap=True), ListField("revoked_at", "revoked", no_wrap=True),
                      ListField("revoked_by", table=False)], as_json)  # fmt: skip


@keys_app.command("revoke")
@user_errors
def keys_revoke(
    key: Annotated[str, typer.Argument(help="The key's id (pt-<12 hex digits>, as `posttrain keys list` shows)")],
) -> None:
    """Revoke an API key: every request with it is refused from now on."""
    require_schema()
    row = revoke_key(me(), key)
    out.print(f"revoked {key_shown(row.key_id)} ({row.name})")


def main() -> None:
    try:
        get_settings()
    except SettingsError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        raise SystemExit(2) from None
    app()


if __name__ == "__main__":
    main()
