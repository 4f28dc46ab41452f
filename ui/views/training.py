"""Training: launch runs (presets or validated YAML), the run queue, a live run view with
downsampled charts, a trajectory browser, and stop / resume / evaluate / deploy."""

from __future__ import annotations

import glob
import json
import math
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pandas as pd
import streamlit as st
import yaml
from pydantic import ValidationError
from streamlit.errors import StreamlitAPIException

from posttrain.platform import metric_names, metrics
from posttrain.platform.db.models import DocumentStatus, Job, JobStatus, Role, utcnow
from posttrain.platform.documents import add_document, list_documents
from posttrain.platform.jobs import queue
from posttrain.platform.jobs.presets import Preset, PresetDocuments, PresetRecord
from posttrain.platform.jobs.presets import presets as preset_catalogue
from posttrain.platform.jobs.registry import JobConfigError, get_kind, parse_config_text, read_result, validate_config
from posttrain.platform.jobs.worker import job_dir
from posttrain.platform.models.general_check import NOT_MEASURED, GeneralCheck
from posttrain.platform.models.importer import BUILTIN_MODELS, BUILTIN_PREFIX
from posttrain.platform.models.registry import ModelNotFound, get_model, lineage, list_models
from posttrain.platform.settings import get_settings
from posttrain.platform.tasks.store import task_sets
from posttrain.preprocess.errors import PreprocessError
from posttrain.ui.common import (
    can,
    fields_table,
    follow,
    guard_platform,
    job_states,
    job_table,
    me,
    per_domain_results,
    status_label,
    yaml_block,
)

TRAIN_KINDS = ("train_preset", "train_grpo", "train_sft")
RUN_KINDS = (*TRAIN_KINDS, "evaluate")
QUEUE_SIZE = 50
TRAJECTORY_PAGE_SIZE = 20
MAX_POINTS = 1000
DEMO_PRESET = "smollm2-quick"  # the one-click demo's default (and the preset tab's): the built-in real model
EMA_ALPHA = (
    0.3  # the smoothed reward: an exponential moving average, each step weighing 0.3 and the average before it 0.7
)
GENERAL_CHECK = "general/pass@1"  # an evaluation's general check (training.evaluate: domains the run never trained on)
HELD_OUT = "held-out pass@1"  # the Reward chart's before/after series
SMOOTHED_CHARTS = ("Reward",)  # charts of a noisy per-step figure: the raw points and their moving average
LINES_UP_TO = 8  # a run over more domains draws its per-domain figures as a domains x steps heatmap, not as lines
HEATMAP_COLUMNS = 100  # the heatmap's steps: the run's steps in at most this many buckets, averaged in the database
HEATMAP_FIGURES = {
    "pass rate": "pass_rate",
    "draw share": "prob",
    "signal rate": "signal_rate",
}  # sched/<domain>/<figure>

# (title, metric names) for the live charts; a chart shows only when its run logged one of them.
CHARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Reward", (metric_names.REWARD_MEAN, metric_names.PASS_RATE)),
    ("SFT warm-up loss", (metric_names.SFT_LOSS,)),
    ("Loss", (metric_names.LOSS,)),
    ("KL to the initial policy", (metric_names.KL,)),
    ("Clip fraction", (metric_names.CLIP_FRAC_LOW, metric_names.CLIP_FRAC_HIGH)),
    ("Learner busy fraction", (metric_names.LEARNER_BUSY_FRAC,)),
    ("Throughput (tokens/s)", (metric_names.ROLLOUT_TOKENS_PER_S, metric_names.TRAIN_TOKENS_PER_S)),
    ("Pipeline", (metric_names.QUEUE_DEPTH, metric_names.STALENESS_MEAN)),
    ("Step time (s) and verifier latency (s)", (metric_names.STEP_S, metric_names.VERIFIER_LATENCY_S)),
    ("Gradient norm", (metric_names.GRAD_NORM,)),
    ("Learning rate", (metric_names.LR,)),
    ("Train/inference log-prob gap", (metric_names.LOGPROB_PREFIX + "mean_abs_diff",)),
    (
        "Peak memory (GiB): after rollouts, after the update",
        (metric_names.PEAK_RSS_ROLLOUT_GB, metric_names.PEAK_RSS_GB),
    ),
)
TILES = (
    ("Reward", metric_names.REWARD_MEAN),
    ("Pass rate", metric_names.PASS_RATE),
    ("Loss", metric_names.LOSS),
    ("KL", metric_names.KL),
    ("Tokens/s", metric_names.ROLLOUT_TOKENS_PER_S),
    ("Eval pass@1", metric_names.EVAL_PASS_AT_1),
    ("Eval pass rate", metric_names.EVAL_PASS_RATE),
)

st.title("Training")
st.caption(
    "SFT and GRPO runs and their evaluations. Every run is a job in the worker: closing this tab never stops one."
)
if not guard_platform():
    st.stop()


# --- configs: presets and YAML -------------------------------------------------------------


def preset_config(preset: str, model: str | None) -> dict[str, Any]:
    """A job config that takes every field from ``preset`` (and the model, when one is chosen)."""
    return {"preset": preset, **({"model": model} if model else {})}


def template(kind: str, presets: dict[str, Preset]) -> str:
    """A small starting config for ``kind`` in the YAML editor."""
    if presets:
        name = next(iter(presets))
        steps = presets[name].sections.get(kind, {}).get("max_steps")
        extra = f"max_steps: {steps}\n" if steps else ""
        return f"# fields set here override the preset's\npreset: {name}\n{extra}"
    examples: dict[str, dict[str, Any]] = {
        "train_sft": {"model": "var/models/tiny", "domains": ["arith.add.int"], "max_steps": 50, "lr": 1e-4},
        "train_grpo": {"model": "var/models/tiny", "domains": ["arith.add.int"], "max_steps": 50, "group_size": 8},
        "evaluate": {"model": "var/models/tiny", "domains": ["arith.add.int"], "difficulty": 2, "tasks_per_domain": 32},
    }
    return yaml.safe_dump(examples[kind], sort_keys=False)


def parse_config(kind: str, text: str) -> tuple[dict[str, Any] | None, list[str]]:
    """YAML text to a config for ``kind`` that validates: (config, []) or (None, the problems, one per line)."""
    try:
        data = parse_config_text(text, "config")
    except JobConfigError as exc:
        return None, [str(exc)]
    if not isinstance(data, dict):
        got = "nothing" if data is None else f"a {type(data).__name__}"
        return None, [f"The config must be a YAML mapping of fields (`max_steps: 50`), got {got}."]
    try:
        get_kind(kind).config_model.model_validate(data)
    except ValidationError as exc:
        problems = []
        for e in exc.errors():
            field = ".".join(str(p) for p in e["loc"]) or "(config)"
            got = "" if e["type"] == "missing" else f" (got {e.get('input')!r})"
            problems.append(f"`{field}`: {e['msg']}{got}")
        return None, problems
    return data, []


def submit_run(kind: str, config: dict[str, Any], what: str) -> tuple[bool, str]:
    """Submit a run (the run view then shows it), and what to say of it: whether it launched, and the line saying so."""
    try:
        job_id = queue.submit(me(), kind, config)
    except (JobConfigError, PermissionError) as exc:
        return False, str(exc)
    st.session_state["run_id"] = job_id
    return True, f"Launched {what} as job {job_id}."


def launch(kind: str, config: dict[str, Any], what: str) -> None:
    launched, message = submit_run(kind, config, what)
    (st.success if launched else st.error)(message)


def show_problems(problems: list[str]) -> None:
    st.error("The config is not valid:\n\n" + "\n".join(f"- {p}" for p in problems))


def model_names() -> list[str]:
    return [m.name for m in list_models()]


# --- the estimate before launch ------------------------------------------------------------------


def find_estimate(kind: str, config: dict[str, Any], before: Any = None) -> Job | None:
    """The newest ``estimate`` job made for exactly this run (its config as the run's job stores it),
    submitted before ``before`` when given; None when there is none or the config does not validate."""
    try:
        stored = validate_config(kind, config).model_dump(mode="json")
    except JobConfigError:
        return None
    for job in queue.list_jobs(kind="estimate", limit=200):
        if (
            job.config.get("kind") == kind
            and job.config.get("config") == stored
            and (before is None or job.created_at <= before)
        ):
            return job
    return None


def estimate_panel(kind: str, config: dict[str, Any], key: str, found: Job | None) -> None:
    """The run's estimate on this host (``found``: the newest estimate job for it): the button that calibrates it,
    its progress, the figures and how they were made."""
    c1, c2 = st.columns([4, 1], vertical_alignment="center")
    label = "Estimate again" if found is not None and found.status.finished else "Estimate wall time"
    running = found is not None and not found.status.finished
    if c2.button(label, key=f"estimate_{key}", icon=":material/timer:", disabled=not can(Role.operator) or running):
        try:
            job_id = queue.submit(me(), "estimate", {"kind": kind, "config": config})
        except (JobConfigError, PermissionError) as exc:
            st.error(str(exc))
        else:
            st.toast(f"Queued estimate job {job_id}.")
            st.rerun()  # the panel follows it live
    result = (
        read_result("estimate", found.result) if found is not None and found.status is JobStatus.succeeded else None
    )
    if found is not None and not found.status.finished:
        c1.progress(
            min(1.0, found.progress or 0.0), text=f"Estimating (job {found.id}): {found.progress_message or 'queued'}"
        )
    elif result is not None:
        c1.info(
            f"**Estimate** (job {found.id}): {result.summary()}, measured by a "  # type: ignore[union-attr, attr-defined]
            f"{metrics.duration(result.calibration_s)} calibration.",
            icon=":material/timer:",
        )  # type: ignore[attr-defined]
    elif found is not None:
        c1.error(f"The estimate (job {found.id}) {found.status.value}: {found.error or 'no result'}")
    else:
        c1.caption(
            "Not estimated yet: the estimate times a few real steps and one evaluation batch of this run on this "
            "host (a minute or two), then scales them to the whole run."
        )
    if result is not None:
        with st.expander("How it was estimated"):
            st.dataframe(
                pd.DataFrame(
                    [{"stage": s.stage, "estimate": metrics.duration(s.seconds), "how": s.how} for s in result.stages]
                ),  # type: ignore[attr-defined]
                hide_index=True,
                width="stretch",
            )


# Live panels poll only while there is something to follow: on a 2-core host the console and the browser
# re-rendering every 2 s took three quarters of a core from the run they watched.
LIVE_EVERY = "5s"


@st.fragment(run_every=LIVE_EVERY)
def _estimating(kind: str, config: dict[str, Any], key: str) -> None:
    found = find_estimate(kind, config)
    if found is not None and found.status.finished:
        st.rerun()  # the page shows the result, and stops polling
    estimate_panel(kind, config, key, found)


def live_estimate(kind: str, config: dict[str, Any], key: str) -> None:
    """The estimate panel, followed live while its estimate runs."""
    found = find_estimate(kind, config)
    if found is not None and not found.status.finished:
        _estimating(kind, config, key)
    else:
        estimate_panel(kind, config, key, found)


def estimate_line(job: Job) -> None:
    """A run beside the estimate made for it before launch: estimate against actual once it has finished."""
    if job.kind not in TRAIN_KINDS:
        return
    found = find_estimate(job.kind, job.config, before=job.created_at)
    estimate = (
        read_result("estimate", found.result) if found is not None and found.status is JobStatus.succeeded else None
    )
    if estimate is None:
        return
    wall = estimate.wall_s  # type: ignore[attr-defined]
    if job.status is JobStatus.succeeded and job.started_at is not None and job.finished_at is not None:
        actual = (job.finished_at - job.started_at).total_seconds()
        off = (actual - wall) / wall  # how far the run went past (or stopped short of) its estimate
        how = (
            "as estimated"
            if round(off, 2) == 0
            else f"{abs(off):.0%} {'longer' if off > 0 else 'shorter'} than estimated"
        )
        st.info(
            f"Estimate against actual: estimated {metrics.duration(wall)} (job {found.id}), took {metrics.duration(actual)}: "  # type: ignore[union-attr]
            f"{how}.",
            icon=":material/timer:",
        )
    elif job.status is JobStatus.running and job.started_at is not None:
        st.caption(
            f"Estimated {metrics.duration(wall)} before launch (job {found.id}); running for "  # type: ignore[union-attr]
            f"{metrics.duration((utcnow() - job.started_at).total_seconds())} so far."
        )


def demo_calibrating(preset: str) -> str | None:
    """Why the demo of ``preset`` cannot start now: its estimate is queued or calibrating (a run beside it would
    slow both and spoil the estimate), or None."""
    found = find_estimate("train_preset", {"preset": preset})
    if found is None or found.status.finished:
        return None
    doing = "calibrating" if found.status is JobStatus.running else "queued"
    return (
        f"its estimate (job {found.id}) is {doing} on this host, and a run beside it would slow both and spoil the "
        f"estimate; the button comes back when the estimate ends"
    )


def _launch_demo(preset: str) -> None:
    """The demo button's callback: submit the run, and leave what happened for the page to say where the button is.
    A click from a page drawn before a demo or its estimate started launches nothing (the callback runs before the page
    is drawn again, so it asks again why the demo might wait)."""
    if (waits := demo_running(preset) or demo_calibrating(preset)) is not None:
        st.session_state["demo_launched"] = (False, f"Nothing launched: {waits}.")
        return
    st.session_state["demo_launched"] = submit_run("train_preset", {"preset": preset}, f"the whole {preset!r} recipe")


def demo_running(preset: str) -> str | None:
    """Why the demo of ``preset`` cannot start again now: a run of it is queued or running (a second beside it would
    halve both), or None."""
    for job in queue.list_jobs(kind="train_preset", limit=200):
        if not job.status.finished and job.config.get("preset") == preset:
            return (
                f"the demo is {'running' if job.status is JobStatus.running else 'queued'} (job {job.id}): follow it "
                "in the run view below; the button comes back when it ends"
            )
    return None


# --- what a preset needs before it runs, each done with a click ------------------------------------------------


def preset_files(documents: PresetDocuments | None) -> list[Path]:
    """The files a document preset's task set is built from (none for a preset without documents)."""
    return sorted({Path(f) for pattern in (documents.paths if documents else []) for f in glob.glob(pattern)})


def _import_model(model: str) -> None:
    """The import button's callback: the built-in model imported by a job the page then follows."""
    try:
        job_id = queue.submit(me(), "import_model", {"source": f"{BUILTIN_PREFIX}{model}"})
    except (JobConfigError, PermissionError) as exc:
        st.session_state["prepared"] = (False, str(exc))
    else:
        st.session_state["prepared"] = (True, f"Queued import_model job {job_id} of {model}: it shows here when done.")


def _prepare_documents(documents: PresetDocuments) -> None:
    """The documents button's callback: the preset's files uploaded (preprocessing queued for each); the page builds
    the task set once they are preprocessed (``prepare_build``)."""
    try:
        added = [add_document(me(), path) for path in preset_files(documents)]
    except (PreprocessError, PermissionError) as exc:
        st.session_state["prepared"] = (False, str(exc))
        return
    st.session_state["prepare_build"] = documents.task_set
    queued = sum(a.created for a in added)
    st.session_state["prepared"] = (
        True,
        f"Uploaded {len(added)} documents ({queued} queued for preprocessing); the task set is built when they are.",
    )


def build_preset_tasks(documents: PresetDocuments, ready: list[int]) -> None:
    """The preset's ``build_tasks`` job over its preprocessed documents ``ready``."""
    config = {
        "task_set": documents.task_set,
        "source": {"type": "documents", "document_ids": ready, **documents.source},
    }
    try:
        job_id = queue.submit(me(), "build_tasks", config)
    except (JobConfigError, PermissionError) as exc:
        st.session_state["prepared"] = (False, str(exc))
    else:
        st.session_state["prepared"] = (True, f"Queued build_tasks job {job_id}: task set {documents.task_set!r}.")


def last_runs_here() -> dict[str, Job]:
    """This installation's latest finished run of each preset's whole recipe, by preset (one query)."""
    runs: dict[str, Job] = {}
    for job in queue.list_jobs(kind="train_preset", status=JobStatus.succeeded, limit=200):
        if job.started_at and job.finished_at:
            runs.setdefault(str(job.config.get("preset")), job)
    return runs


def run_minutes(job: Job) -> float:
    assert job.started_at is not None and job.finished_at is not None  # a finished run (last_runs_here)
    return (job.finished_at - job.started_at).total_seconds() / 60


def cost_lines(record: PresetRecord | None, run: Job | None) -> list[str]:
    """What a preset cost when a benchmark ran it (``record``), and when it last ran here (``run``), before any
    estimate."""
    lines = []
    if record is not None:
        described = record.describe()
        lines.append(described[0].upper() + described[1:] + ".")
    if run is not None:
        peak = (run.result or {}).get("peak_rss_gb")
        lines.append(
            f"Last run here (job {run.id}): {run_minutes(run):.1f} min" + (f", peak {peak:.1f} GiB." if peak else ".")
        )
    return lines or ["No recording of it yet: **Estimate** times it on this host."]


def preset_costs(catalogue: list[Preset], runs: dict[str, Job]) -> list[dict[str, Any]]:
    """One row a preset: its recorded time, runs, memory and held-out figure, and its last run here."""
    rows = []
    for preset in catalogue:
        record, run = preset.record, runs.get(preset.name)
        rows.append(
            {
                "preset": preset.name,
                "recorded minutes": round(record.minutes, 1) if record else None,
                "runs": record.runs if record else None,
                "peak GiB": record.peak_rss_gb if record else None,
                "held-out pass@1": record.held_out if record else None,
                "benchmark": f"{record.benchmark} ({record.date[:10]})" if record else None,
                "last run here (min)": round(run_minutes(run), 1) if run else None,
            }
        )
    return rows


def prerequisites(preset: Preset) -> str | None:
    """Show what ``preset`` needs before it runs (its model imported, its document task set built), each with
    the button that does it, and follow the jobs doing it; returns why the preset cannot run yet (None: it can)."""
    if (done := st.session_state.pop("prepared", None)) is not None:
        (st.success if done[0] else st.error)(done[1])
    waits: list[str] = []
    start, documents = preset.model, preset.documents
    if start is not None and start not in model_names():
        importing = [j for j in queue.list_jobs(kind="import_model", limit=20) if not j.status.finished]
        waits.append(f"the preset starts from the built-in model {start!r}, which is not imported yet")
        if importing:
            st.caption(f"Importing {start} (job {importing[0].id}); the demo can start when it is done.")
        elif start in BUILTIN_MODELS:
            st.button(f"Import {start}", key="prepare_model", icon=":material/download:", on_click=_import_model,
                      args=(start,), disabled=not operator)  # fmt: skip
    if documents is not None and documents.task_set not in {ts.name for ts, n in task_sets() if n}:
        waits.append(f"its task set {documents.task_set!r} is not built yet")
        files = preset_files(documents)
        stored = {d.filename: d for d in list_documents(limit=1000)}
        ours = [stored[f.name] for f in files if f.name in stored]
        ready = [int(d.id or 0) for d in ours if d.status is DocumentStatus.ready]
        building = [j for j in queue.list_jobs(kind="build_tasks", limit=20)
                    if not j.status.finished and j.config.get("task_set") == documents.task_set]  # fmt: skip
        if building:
            st.caption(f"Building the task set {documents.task_set!r} (job {building[0].id}).")
        elif not files:
            st.warning(f"None of {', '.join(documents.paths)} exists on this host: `make run` installs them.")
        elif len(ours) < len(files) or any(d.status is DocumentStatus.failed for d in ours):
            st.button(f"Upload its {len(files)} documents and build the task set {documents.task_set!r}",
                      key="prepare_documents", icon=":material/upload_file:", on_click=_prepare_documents,
                      args=(documents,), disabled=not operator)  # fmt: skip
        elif len(ready) < len(files):
            st.caption(f"Preprocessing its documents: {len(ready)} of {len(files)} done; the task set is built next.")
        elif st.session_state.get("prepare_build") == documents.task_set:  # the click asked for the whole preparation
            st.session_state.pop("prepare_build")
            build_preset_tasks(documents, ready)
            st.rerun()
        else:
            st.button(f"Build the task set {documents.task_set!r} from its {len(ready)} documents",
                      key="prepare_tasks", icon=":material/construction:", on_click=build_preset_tasks,
                      args=(documents, ready), disabled=not operator)  # fmt: skip
    # the page follows the preparing jobs: the demo button comes back when they are done
    preparing = ("import_model", "preprocess", "build_tasks")
    follow("prepare_followed", lambda: (job_states(preparing), model_names()), active=bool(waits))
    return "; ".join(waits) or None


operator = can(Role.operator)
if not operator:
    st.info("You are signed in as a viewer: you can watch runs, but launching and stopping them needs an operator.")

st.subheader("Launch a run")
# The first visit to this page in a console process checks every preset's held-out split, which draws each domain's
# prompts at every level (seconds on a small machine; remembered for the process's life after that).
with st.spinner("Loading the presets: the first visit checks each domain's held-out split…"):
    presets = preset_catalogue()
if presets:
    with st.container(border=True):
        st.markdown(
            "**One-click demo**: the preset's whole recipe in one job: evaluate the model it starts from on "
            "prompts it will never train on, train it with GRPO, and evaluate it again on the same held-out prompts "
            "(a from-scratch preset first builds and warms up its small model, beside an SFT control). The "
            "reward per step is noisy (a few prompts a step): the run view draws it with its moving average, "
            "and the held-out pass@1 before and after is what shows whether the model learned."
        )
        c1, c2 = st.columns([3, 1], vertical_alignment="bottom")
        names = list(presets)
        demo = c1.selectbox("Demo preset", names, index=names.index(DEMO_PRESET) if DEMO_PRESET in names else 0,
                            key="demo_preset", help=f"{DEMO_PRESET} post-trains the built-in SmolLM2-135M-Instruct; "
                                                    "cpu-quick trains a tiny model built from scratch")  # fmt: skip
        why = prerequisites(presets[demo])
        missing = why is not None
        calibrating = demo_running(demo) or demo_calibrating(demo)
        # submitted in the click's callback, before the page is drawn again: the page it draws holds the run, and the
        # button waits for it (a click from a page drawn before the estimate started never runs: Streamlit drops a
        # disabled button's click on the server)
        c2.button(
            "Run the demo",
            key="demo_launch",
            type="primary",
            icon=":material/rocket:",
            on_click=_launch_demo,
            args=(demo,),
            disabled=not operator or missing or calibrating is not None,
            help=why or calibrating,
        )
        if (launched := st.session_state.pop("demo_launched", None)) is not None:
            (st.success if launched[0] else st.error)(launched[1])
        if why:
            st.warning(why[0].upper() + why[1:] + ".")
        elif calibrating is not None:
            st.caption(f"**Run the demo** waits: {calibrating}.")
        st.caption(presets[demo].description)
        runs = last_runs_here()  # read once for the line and the table
        st.caption(" ".join(cost_lines(presets[demo].record, runs.get(demo))))
        live_estimate("train_preset", {"preset": demo}, "demo")
        with st.expander("Every preset's recorded cost"):
            st.dataframe(pd.DataFrame(preset_costs(list(presets.values()), runs)), hide_index=True, width="stretch")
tab_preset, tab_yaml = st.tabs(["From a preset", "Edit YAML"])


KIND_LABELS = {
    "train_grpo": "GRPO (RL)",
    "train_sft": "SFT warm-up",
    "evaluate": "Evaluation",
    "train_preset": "Whole recipe (build, SFT, evaluate, GRPO, evaluate)",
}


def _edit_preset(preset: Preset, kind: str, model: str | None) -> None:
    st.session_state["yaml_kind"] = kind
    fields = {**preset.sections[kind], **({"model": model} if model else {})}
    st.session_state["yaml_text"] = yaml.safe_dump(fields, sort_keys=False)


def own_model(name: str, kind: str, registered: list[str]) -> str | None:
    """The Model choice preset ``name`` was made for in stage ``kind``: the model its section names, else the registered
    model a real-model preset starts from, else the newest registered model it fits (for a from-scratch preset: one
    that is not a real model); None when none is registered."""
    preset = presets[name]
    if preset.sections.get(kind, {}).get("model"):
        return f"(the preset's: {preset.sections[kind]['model']})"
    if preset.model in registered:
        return preset.model
    return next((m for m in registered if model_mismatch(name, preset, kind, m) is None), None)


def _pick_own_model() -> None:
    """On a new preset: the Model box moves to the model that preset was made for (when one is registered)."""
    preset = presets[st.session_state["preset_name"]]
    kind = st.session_state.get("preset_kind")
    kind = kind if kind in preset.sections else next(k for k in RUN_KINDS if k in preset.sections)
    own = own_model(st.session_state["preset_name"], kind, model_names())
    if own is None:
        st.session_state.pop("preset_model", None)
    else:
        st.session_state["preset_model"] = own


def model_mismatch(name: str, preset: Preset, kind: str, model: str) -> str | None:
    """Why ``preset`` was not made for the registered model ``model`` (None: it was, or nothing says it was not). A
    real-model preset names its model (the model itself or one trained from it fits); a from-scratch preset is made
    for the small model it builds, so a real model (an imported one, or one a real-model preset starts from) does not."""
    try:
        chain = lineage(model)
    except ModelNotFound:
        return None
    ancestors = [m.name for m in chain]
    section = preset.sections.get(kind, {})
    tokens = (section.get("sampling") or {}).get("max_new_tokens", section.get("max_new_tokens"))
    budget = f" (it samples at most {tokens} new tokens)" if tokens else ""
    if preset.model is not None:
        if preset.model in ancestors:
            return None
        return (
            f"Preset {name!r} was made for {preset.model!r}{budget}: its prompt format and settings were tuned on it, "
            f"and {model!r} is neither that model nor trained from it. Pick {preset.model!r}, or a preset made for "
            f"{model!r}."
        )
    real = {p.model for p in presets.values() if p.model is not None}
    if any(m.name in real or "source" in (m.meta or {}) for m in chain):  # imported weights: a real model
        demo = DEMO_PRESET if DEMO_PRESET in presets else next(n for n, p in presets.items() if p.model is not None)
        return (
            f"Preset {name!r} is made for the small model it builds from scratch{budget}, and {model!r} is a real "
            f"model: pick a real-model preset (such as {demo!r}) for it, or a model built for this preset."
        )
    return None


with tab_preset:
    if not presets:
        st.info("No presets are installed (training registers them). Write a config in the **Edit YAML** tab.")
    else:
        c1, c2, c3 = st.columns(3)
        preset_names = list(presets)  # opens on the demo's preset, a real-model one, with its own model
        name = c1.selectbox(
            "Preset",
            preset_names,
            index=preset_names.index(DEMO_PRESET) if DEMO_PRESET in presets else 0,
            key="preset_name",
            on_change=_pick_own_model,
        )
        preset_kind = c2.selectbox("Stage", [k for k in RUN_KINDS if k in presets[name].sections],
                                   format_func=KIND_LABELS.get, key="preset_kind")  # fmt: skip
        preset_model = presets[name].sections[preset_kind].get("model")
        registered = model_names()
        choices = ([f"(the preset's: {preset_model})"] if preset_model else []) + registered
        own = own_model(name, preset_kind, registered) if "preset_model" not in st.session_state else None
        if "preset_model" not in st.session_state and own is not None:
            st.session_state["preset_model"] = own  # the first time the box shows: the preset's own model
        model = None
        if choices:  # (a select box first shown with no options would keep its empty value)
            model = c3.selectbox("Model", choices, key="preset_model", help="a registered model to start from")
            model = None if model.startswith("(the preset's") else model
        else:
            st.warning("No model is registered yet: build or register one on the **Models & Serving** page first.")
        preset = presets[name]
        if model is not None and (mismatch := model_mismatch(name, preset, preset_kind, model)):
            st.warning(mismatch, icon=":material/warning:")
        st.caption(preset.description)
        st.code(yaml.safe_dump({**preset.sections[preset_kind], **({"model": model} if model else {})}, sort_keys=False),
                language="yaml")  # fmt: skip
        c1, c2 = st.columns(2)
        if c1.button("Launch", key="preset_launch", type="primary", disabled=not operator or not choices):
            config, problems = parse_config(preset_kind, yaml.safe_dump(preset_config(name, model)))
            if config is None:
                show_problems(problems)
            else:
                launch(preset_kind, config, f"preset {name!r} ({KIND_LABELS[preset_kind]})")
        c2.button(
            "Edit in the YAML editor", key="preset_edit", on_click=_edit_preset, args=(preset, preset_kind, model)
        )
        if preset_kind in TRAIN_KINDS and choices:
            live_estimate(preset_kind, preset_config(name, model), "preset")

with tab_yaml:
    if "yaml_kind" not in st.session_state:
        st.session_state["yaml_kind"] = "train_grpo"
    if "yaml_text" not in st.session_state:
        st.session_state["yaml_text"] = template(st.session_state["yaml_kind"], presets)

    def _new_template() -> None:
        st.session_state["yaml_text"] = template(st.session_state["yaml_kind"], presets)

    kind = st.selectbox("Job kind", RUN_KINDS, key="yaml_kind", on_change=_new_template)
    text = st.text_area("Config (YAML)", key="yaml_text", height=260, help="Fields left out take their defaults.")
    c1, c2 = st.columns(2)
    validate_clicked = c1.button("Validate", key="yaml_validate")
    launch_clicked = c2.button("Launch", key="yaml_launch", type="primary", disabled=not operator)
    if validate_clicked or launch_clicked:
        config, problems = parse_config(kind, text)
        if config is None:
            show_problems(problems)
        elif launch_clicked:
            launch(kind, config, f"a `{kind}` run")
        else:
            st.success(f"Valid `{kind}` config.")
            with st.expander("With every default filled in"):
                st.code(yaml.safe_dump(get_kind(kind).config_model.model_validate(config).model_dump(mode="json"),
                                       sort_keys=False), language="yaml")  # fmt: skip


# --- the queue -------------------------------------------------------------------------------


def run_jobs(limit: int = QUEUE_SIZE) -> list[Job]:
    jobs = [j for kind in RUN_KINDS for j in queue.list_jobs(kind=kind, limit=limit)]
    return sorted(jobs, key=lambda j: j.id or 0, reverse=True)[:limit]


@st.fragment(run_every=LIVE_EVERY)
def run_queue() -> None:
    jobs = run_jobs()
    if not jobs:
        st.info("No training runs yet: launch one above.")
        return
    job_table(jobs, ("id", "kind", "status", "progress", "message", "by", "created", "error"))


def run_label(job: Job) -> str:
    """A run as the Run box lists it: ``#7 · train_preset · smollm2-quick``. Not its status: the browser keeps a
    select box's shown text when only its options' labels change, so a status there would stay as first drawn
    (the run's header below and the runs table above show the live status)."""
    name = job.config.get("preset") or job.config.get("register_as") or job.config.get("name")
    return f"#{job.id} · {job.kind}" + (f" · {name}" if name else "")


# --- actions ---------------------------------------------------------------------------------


def output_dir(job: Job) -> str:
    """Where ``job`` keeps its checkpoints: its config's ``output_dir``, else ``<job workdir>/run``
    (the default ``posttrain.training.jobs`` gives it)."""
    assert job.id is not None
    return str(job.config.get("output_dir") or job_dir(get_settings(), job.id) / "run")


def resume_config(job: Job) -> dict[str, Any]:
    """The stopped run's config, pointed at its checkpoints so the new job continues from them."""
    fields = get_kind(job.kind).config_model.model_fields
    config = {**job.config, "output_dir": output_dir(job)}
    if "checkpoint" in fields:  # a trainer: resume from them whatever the stopped run said
        config.pop("resume", None)  # a config stored before the groups had it at the top
        config["checkpoint"] = {**(config.get("checkpoint") or {}), "resume": True}
    elif "resume" in fields:
        config["resume"] = True
    return config


def job_result(job: Job) -> Any:
    """The finished job's typed result (its kind's result model, validated), or None: none yet, or one that
    does not fit (the raw JSON still shows below the run)."""
    try:
        return read_result(job.kind, job.result)
    except ValidationError:
        return None


def run_model(job: Job) -> str | None:
    """The model a finished run produced: its registered name, else its final checkpoint's model directory."""
    result = job_result(job)
    if getattr(result, "model", None):
        return str(result.model)
    if getattr(result, "checkpoint", None):
        return f"{result.checkpoint}/model"
    return None


def run_domains(job: Job) -> list[str]:
    domains = getattr(job_result(job), "domains", None) or job.config.get("domains", [])
    return [d if isinstance(d, str) else str(d.get("name")) for d in domains if d]


def evaluate_config(job: Job) -> dict[str, Any]:
    """An evaluation of what ``job`` produced: a whole-recipe run compares its model before and after GRPO."""
    if job.kind == "train_preset":
        return {"preset": job.config.get("preset", DEMO_PRESET), "models": list(getattr(job_result(job), "models", []))}
    config: dict[str, Any] = {"model": run_model(job), "domains": run_domains(job)}
    levels = {d.get("difficulty", 1) if isinstance(d, dict) else 1 for d in job.config.get("domains", []) if d}
    if len(levels) == 1:  # evaluate at the level it trained on (the eval split of that level)
        config["difficulty"] = levels.pop()
    sampling = job.config.get("sampling") or {}  # a config stored before the groups had it at the top
    tokens = sampling.get("max_new_tokens", job.config.get("max_new_tokens"))
    return (
        config
        | ({"device": job.config["device"]} if "device" in job.config else {})
        | ({"max_new_tokens": tokens} if tokens is not None else {})
    )


def preset_run(job: Job) -> Any:
    """A whole-recipe job's config, typed (``training.jobs.PresetRunConfig``: its preset with the job's overrides),
    or None: another kind, or a config that no longer validates."""
    if job.kind != "train_preset":
        return None
    try:
        return validate_config(job.kind, job.config)
    except (JobConfigError, ValueError):
        return None


def grpo_config(job: Job) -> Any:
    """The GRPO config a run trains with (``training.config.GRPOConfig``), or None: it has no GRPO stage, or its
    config no longer validates."""
    try:
        if job.kind == "train_grpo":
            return validate_config(job.kind, job.config)
        run = preset_run(job)
        return run.sections()[1] if run is not None else None
    except (JobConfigError, ValueError):
        return None


def preset_models(job: Job) -> list[str]:
    """The models a whole-recipe job evaluates, as it names them (``training.jobs.run_preset_job``), in the order it
    logs their evaluations: the model before SFT when the run evaluates it, the model GRPO starts from (its SFT
    warm-up, or the model as it is when the preset has no SFT), GRPO's result, and the SFT control when there is
    one. From the result once there is one, else from the config (while it runs)."""
    result = job_result(job)
    if getattr(result, "models", None):
        return [*result.models, *([result.control_model] if getattr(result, "control_model", None) else [])]
    run = preset_run(job)
    if run is None:
        return []

    sft = run.sections()[0]
    name = run.name or f"{run.preset}-job{job.id}"
    start = run.model or presets[run.preset].model  # the catalogue this page run read
    base = Path(start).name if isinstance(start, str) else f"{name}-base"  # a registered name, or a directory's
    before = f"{name}-sft" if sft is not None else base
    return [
        *([base] if run.evaluates_base() else []),
        before,
        name,
        *([f"{name}-control"] if run.control and sft is not None else []),
    ]


def preset_roles(job: Job) -> tuple[str, ...]:
    """What each model of :func:`preset_models` is in the recipe."""
    result, run = job_result(job), preset_run(job)
    evaluated_base = (
        getattr(result, "pass_base", None) is not None if result is not None else bool(run and run.evaluates_base())
    )
    return (("before SFT",) if evaluated_base else ()) + PRESET_ROLES


def eval_labels(job: Job) -> list[str]:
    """The model behind each step of a job's ``eval/`` metrics, by name."""
    if job.kind == "train_preset":
        return preset_models(job) or ["the model before GRPO", "the model after GRPO"]
    return list(job.config.get("models") or [job.config.get("model") or "model"])


PRESET_ROLES = ("before GRPO", "after GRPO", "SFT control")  # what each step of a whole-recipe job's evaluations is


def general_check(model: str | None) -> GeneralCheck | None:
    """A registered model's general check beside the model it was trained from (None: not measured, or no such model)."""
    try:
        return GeneralCheck.of(get_model(model)) if model else None
    except ModelNotFound:
        return None


def act(action: str, job: Job) -> None:
    """Run one of the operator actions on ``job`` (the platform checks the role, not only the page)."""
    assert job.id is not None
    try:
        if action == "stop":
            status = queue.cancel(me(), job.id)
            st.success(
                f"Stopped job {job.id}." if status is JobStatus.cancelled else f"Stop requested for job {job.id}."
            )
            return
        if action == "resume":
            new = queue.submit(me(), job.kind, resume_config(job))
            what = f"Resumed job {job.id} as job {new}, continuing from {output_dir(job)}."
        elif action == "evaluate":
            new = queue.submit(me(), "evaluate", evaluate_config(job))
            what = f"Queued evaluation job {new}."
        elif action in ("deploy", "deploy_despite_drop"):
            model = getattr(job_result(job), "model", None)
            check = general_check(model)
            if (
                action == "deploy" and check is not None and check.regressed
            ):  # the gate: confirmed before it is submitted
                st.session_state[f"deploy_pending_{job.id}"] = True
                return
            st.session_state.pop(f"deploy_pending_{job.id}", None)
            new = queue.submit(me(), "deploy", {"model": model, "tier": "fast", "allow_regression": action != "deploy"})
            what = f"Queued deployment job {new} of {model!r} (fast tier)."
        else:
            raise ValueError(f"unknown action {action!r}")
    except (JobConfigError, PermissionError) as exc:
        st.error(str(exc))
    else:
        st.success(what)


def actions(job: Job) -> None:
    if not can(Role.operator):
        return
    cols = st.columns(4)
    if job.status in (JobStatus.queued, JobStatus.running) and not job.cancel_requested:
        if cols[0].button("Stop", key=f"stop_{job.id}", icon=":material/stop:"):
            act("stop", job)
    if job.kind in TRAIN_KINDS and job.status in (JobStatus.cancelled, JobStatus.failed, JobStatus.interrupted):
        if cols[1].button("Resume", key=f"resume_{job.id}", icon=":material/play_arrow:",
                          help=f"A new job with the same config, continuing from the checkpoints in {output_dir(job)}"):  # fmt: skip
            act("resume", job)
    if job.kind in TRAIN_KINDS and job.status is JobStatus.succeeded:
        model, domains = run_model(job), run_domains(job)
        why = None if model and domains else "the run left no model or names no domains"
        if cols[2].button(
            "Evaluate", key=f"evaluate_{job.id}", icon=":material/fact_check:", disabled=why is not None, help=why
        ):
            act("evaluate", job)
        registered = getattr(job_result(job), "model", None)
        why = None if registered else "the run registered no model"
        if cols[3].button(
            "Deploy", key=f"deploy_{job.id}", icon=":material/rocket_launch:", disabled=why is not None, help=why
        ):
            act("deploy", job)
        if registered and st.session_state.get(f"deploy_pending_{job.id}"):
            check = general_check(registered)
            st.warning(f"**{registered}**: {check.describe() if check else NOT_MEASURED}, beyond 2 SE. Deploy it anyway? "
                       "The override is recorded in the audit log under your name.", icon=":material/warning:")  # fmt: skip
            if st.button(f"Deploy {registered} despite the drop", key=f"deploy_despite_{job.id}", type="primary"):
                act("deploy_despite_drop", job)


# --- the live run view -------------------------------------------------------------------------


def chart_spec(smoothed: bool = False) -> dict[str, Any]:
    """A plain Vega-Lite chart of long-format (metric, step, value, shown) rows (cheaper to build than Altair): lines
    by step, on an axis of whole steps. ``smoothed``: the ``per step`` rows as points, their ``smoothed`` moving
    average as a line, and a ``held-out`` before/after as a dashed line."""
    encoding = {
        "x": {"field": "step", "type": "quantitative", "title": "step", "axis": {"format": "d", "tickMinStep": 1}},
        "y": {"field": "value", "type": "quantitative", "title": None, "scale": {"zero": False}},
        "color": {"field": "metric", "type": "nominal", "title": None, "legend": {"orient": "bottom"}},
    }
    if not smoothed:
        return {"mark": {"type": "line", "tooltip": True, "interpolate": "linear"}, "height": 220, "encoding": encoding}

    def shown(what: str) -> list[dict[str, str]]:
        return [{"filter": f"datum.shown == '{what}'"}]

    return {
        "height": 220,
        "encoding": encoding,
        "layer": [
            {  # the step's spread: ± 2 SE of its mean over its prompts, where the run logs it
                "transform": [*shown("per step"), {"filter": "isValid(datum.lo)"}],
                "mark": {"type": "rule", "opacity": 0.3},
                "encoding": {"y": {"field": "lo", "type": "quantitative"}, "y2": {"field": "hi"}},
            },
            {
                "transform": shown("per step"),
                "mark": {"type": "point", "filled": True, "opacity": 0.45, "tooltip": True},
            },
            {"transform": shown("smoothed"), "mark": {"type": "line", "tooltip": True, "interpolate": "linear"}},
            {
                "transform": shown("held-out"),
                "mark": {"type": "line", "point": True, "strokeDash": [6, 3], "tooltip": True},
            },
        ],
    }


def ema(values: list[float], alpha: float = EMA_ALPHA) -> list[float]:
    """The exponential moving average of ``values``: each value weighs ``alpha``, the average before it ``1 - alpha``
    (it starts at the first value)."""
    out: list[float] = []
    for value in values:
        out.append(value if not out else alpha * value + (1 - alpha) * out[-1])
    return out


def chart(
    title: str,
    points: dict[str, list[metrics.Point]],
    smoothed: bool = False,
    held_out: list[metrics.Point] | None = None,
    spread: dict[str, list[metrics.Point]] | None = None,
) -> None:
    """One chart of a run's series; ``smoothed``: each series' points with their moving average, and ``held_out``
    (the held-out pass@1 before and after training, at the steps it was measured between) beside them; ``spread``:
    a series' SE at each step, drawn as a ± 2 SE bar through its point."""
    ses = {name: dict(series) for name, series in (spread or {}).items()}
    rows = [(name, step, value, "per step", *bar(value, ses.get(name, {}).get(step)))
            for name, series in points.items() for step, value in series]  # fmt: skip
    if smoothed:
        rows += [(name, step, value, "smoothed", None, None) for name, series in points.items()
                 for (step, _), value in zip(series, ema([v for _, v in series]))]  # fmt: skip
        rows += [(HELD_OUT, step, value, "held-out", None, None) for step, value in held_out or []]
    frame = pd.DataFrame(rows, columns=["metric", "step", "value", "shown", "lo", "hi"])
    st.markdown(f"**{title}**")
    st.vega_lite_chart(frame, chart_spec(smoothed), width="stretch")
    if smoothed:
        st.caption(
            f"Dots: each step's mean over its rollouts (a few prompts a step, so it is noisy); line: their "
            f"exponential moving average (each step weighs {EMA_ALPHA:g}, the average before it {1 - EMA_ALPHA:g})."
            + (" Bars: ± 2 SE of a step's mean over its prompts." if ses else "")
            + (
                f" Dashed: {HELD_OUT} before and after training, on prompts no step drew: the figure that shows "
                "whether the model learned."
                if held_out
                else ""
            )
        )


def bar(value: float, se: float | None) -> tuple[float | None, float | None]:
    """The ± 2 SE bar of a point (none without an SE)."""
    return (None, None) if se is None else (value - 2 * se, value + 2 * se)


def reward_moves(
    reward: list[metrics.Point], se: list[metrics.Point], nll: list[metrics.Point], held_out: list[metrics.Point]
) -> str | None:
    """What moves the sampled training reward, from the run's own figures: how often a step's change stayed within
    the noise of its prompt draw, whether its first and second halves differ beyond it, and what the policy's
    sampled-token entropy did, beside the held-out pass@1 (greedy, on prompts no step drew). None below 4 steps."""
    if len(reward) < 4 or len(se) < len(reward):
        return None
    values, errors = [v for _, v in reward], dict(se)
    steps = [s for s, _ in reward]
    within = sum(
        abs(b - a) <= 2 * math.hypot(errors.get(sa, 0.0), errors.get(sb, 0.0))
        for (sa, a), (sb, b) in zip(reward, reward[1:])
    )
    half = len(values) // 2
    first, second = values[:half], values[half:]
    difference = sum(second) / len(second) - sum(first) / len(first)
    spread = math.sqrt(sum(errors.get(s, 0.0) ** 2 for s in steps[:half]) / half**2
                       + sum(errors.get(s, 0.0) ** 2 for s in steps[half:]) / len(second) ** 2)  # fmt: skip
    noise = abs(difference) <= 2 * spread
    draw = (
        "which prompts a step drew moves it more than training does"
        if within >= 0.7 * (len(values) - 1)
        else "its changes often go beyond what the prompt draw explains"
    )
    lines = [
        f"What moves the reward: between steps it changed within ± 2 SE of its draw (prompts and samples) {within} of "
        f"{len(values) - 1} times: {draw}. Its second half averaged {difference:+.2f} against its first "
        f"(± {2 * spread:.2f}: {'within the noise' if noise else 'beyond the noise'})."
    ]
    if len(nll) >= 4:
        entropy = [v for _, v in nll]
        cut = len(entropy) // 2
        start, end = sum(entropy[:cut]) / cut, sum(entropy[cut:]) / len(entropy[cut:])
        how = "more varied" if end > start * 1.1 else "sharper" if end < start / 1.1 else "about as varied"
        because = (
            ": sampling at the run's temperature then draws more wrong answers, which lowers the sampled reward "
            "while the greedy answer can still improve"
            if how == "more varied" and difference < 0
            else ""
        )
        lines.append(f"Its sampled tokens' mean −log p went {start:.2f} → {end:.2f} ({how}{because}).")
    if len(held_out) == 2:
        lines.append(f"Held out, greedy, on prompts no step drew: {held_out[0].value:.0%} → {held_out[1].value:.0%}.")
    return " ".join(lines)


def domain_heatmap(job_id: int, domains: list[str]) -> None:
    """A many-domain run's per-domain figures as a domains x steps heatmap (live, as the charts are): each domain's
    pass rate, draw share or learning-signal rate as the scheduler saw it, the steps bucketed in the database."""
    st.markdown(f"**By domain** ({len(domains)} domains)")
    figure = st.radio(
        "Heatmap of",
        list(HEATMAP_FIGURES),
        horizontal=True,
        key=f"heatmap_{job_id}",
        help="pass rate and signal rate (the share of groups whose rewards differ): moving averages of "
        "the run's own rollouts; draw share: the chance a prompt of the batch comes from the domain",
    )
    suffix = HEATMAP_FIGURES[figure]
    data = metrics.series(job_id, [f"sched/{d}/{suffix}" for d in domains], max_points=HEATMAP_COLUMNS)
    frame = pd.DataFrame(
        [
            (name.removeprefix("sched/").removesuffix(f"/{suffix}"), step, value)
            for name, points in data.items()
            for step, value in points
        ],
        columns=["domain", "step", "value"],
    )
    if frame.empty:
        st.caption(f"No {figure} logged yet.")
        return
    color: dict[str, Any] = {"field": "value", "type": "quantitative", "title": figure, "scale": {"scheme": "viridis"}}
    if suffix != "prob":
        color["scale"]["domain"] = [0, 1]
    spec = {
        "mark": {"type": "rect", "tooltip": True},
        "height": min(1200, max(160, 6 * len(domains))),
        "encoding": {
            "x": {"field": "step", "type": "ordinal", "title": "step", "axis": {"labelOverlap": True}},
            "y": {
                "field": "domain",
                "type": "nominal",
                "title": None,
                "sort": sorted(domains),
                "axis": {"labelOverlap": True},
            },
            "color": color,
        },
    }
    st.vega_lite_chart(frame, spec, width="stretch")


def zero_reason(title: str, job: Job) -> str:
    """Why a chart of ``job`` is 0 at every step, in words, from its config where that says."""
    grpo = grpo_config(job)
    if title == "KL to the initial policy" and grpo is not None and grpo.algorithm.kl_coef == 0:
        return "its `kl_coef` is 0, so it keeps no reference model and logs KL as 0"
    if (
        title == "Clip fraction"
        and grpo is not None
        and grpo.algorithm.updates_per_batch == 1
        and grpo.rollout.backend == "sync"
    ):
        return (
            "one update per batch of rollouts from the current policy (`updates_per_batch: 1`, lock-step): the "
            "probability ratio stays at 1, so no token is clipped"
        )
    if title == "Pipeline" and grpo is not None and grpo.rollout.backend == "sync":
        return (
            "rollouts and updates run in lock-step (`rollout: {backend: sync}`): no batch waits in a queue and "
            "none comes from an older policy"
        )
    return "every value the run logged is 0"


def tile_value(value: float) -> str:
    """A figure that fits a tile: whole numbers from 100 up (``1,234``), else 3 significant digits (``0.0123``)."""
    if not math.isfinite(value):
        return str(value)
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def evaluation_table(job: Job, names: list[str]) -> None:
    """``eval/<domain>/<figure>`` and ``eval/<figure>`` of an evaluate job: one row per domain, one
    column per model and figure (a comparison logs model i's figures at step i)."""
    models = eval_labels(job)
    if job.kind == "train_preset":  # which model each is: the one GRPO starts from, its result, the SFT control
        models = [f"{m} ({role})" for m, role in zip(models, preset_roles(job))]
    rows, steps = [], set()
    for name, points in metrics.series(int(job.id or 0), names, max_points=MAX_POINTS).items():
        parts = name.split("/")
        domain, figure = ("/".join(parts[1:-1]) or "all"), parts[-1]
        for step, value in points:
            steps.add(step)
            model = models[step] if 0 <= step < len(models) else f"step {step}"
            rows.append({"domain": domain, "column": f"{model} · {figure}", "value": value})
    table = pd.DataFrame(rows).pivot_table(index="domain", columns="column", values="value", aggfunc="last")
    evaluated = [models[s] for s in sorted(steps) if 0 <= s < len(models)]
    st.markdown("**Evaluation**" + (f" of {', '.join(evaluated)}" if evaluated else ""))
    st.dataframe(table.reset_index(), hide_index=True, width="stretch")


def gain_line(job: Job) -> None:
    """Held-out pass@1 before and after, for a run that evaluated two models (steps 0 and 1; a whole-recipe run that
    evaluated its model before SFT too: steps 1 and 2, with step 0 before them); for a whole-recipe run before its
    after-evaluation, what happens next (it is evaluated again) or what happened (it ended without)."""
    points = dict(
        metrics.series(int(job.id or 0), [metric_names.EVAL_PASS_AT_1], max_points=MAX_POINTS).get(
            metric_names.EVAL_PASS_AT_1, []
        )
    )
    labels = eval_labels(job)
    raw = ""
    if job.kind == "train_preset" and preset_roles(job)[0] == "before SFT":  # step 0: the model before SFT
        raw = f"{labels[0]} before SFT {points[0]:.1%}; " if 0 in points else ""
        points, labels = {step - 1: value for step, value in points.items() if step > 0}, labels[1:]
    if 0 in points and 1 in points and len(labels) >= 2:
        before, after = points[0], points[1]
        result = job_result(job)
        unseen = getattr(result, "eval_unseen_fraction", None)
        scope = f" on {result.eval_tasks} eval tasks, {unseen:.0%} unseen in training" if unseen is not None else ""
        control = ""
        if 2 in points and getattr(result, "control_steps", None):
            control = (
                f"; SFT control ({result.control_steps} more SFT steps from the same warm-up) {points[2]:.1%}, "
                f"GRPO {100 * (after - points[2]):+.1f} points over it"
            )
        own = ((getattr(result, "arena", None) or {}).get("domains") or {}).get("all")  # the two, paired task by task
        error = f" ± {100 * own['se']:.1f} points, ± one paired standard error" if own and "se" in own else " points"
        st.success(f"Held-out pass@1{scope}: {raw}{labels[0]} {before:.1%} → {labels[1]} {after:.1%} "
                   f"({100 * (after - before):+.1f}{error}){control}")  # fmt: skip
    elif 0 in points and job.kind == "train_preset":
        first = f"Held-out pass@1 of {labels[0]} before GRPO: {points[0]:.1%}"
        if not job.status.finished:
            st.info(f"{first}; evaluated again when GRPO finishes.")
            return
        reward = metrics.latest(int(job.id or 0), [metric_names.REWARD_MEAN]).get(metric_names.REWARD_MEAN)
        grpo = grpo_config(job)
        of = f" of {grpo.max_steps}" if grpo is not None else ""
        when = f"at GRPO step {reward.step}{of}" if reward is not None else "before its first GRPO step"
        happened = {
            JobStatus.cancelled: "was cancelled",
            JobStatus.failed: "failed",
            JobStatus.interrupted: "was interrupted",
        }
        resume = " Resume continues it from its last checkpoint." if job.status is not JobStatus.succeeded else ""
        st.warning(
            f"{first}. The run {happened.get(job.status, job.status.value)} {when}, so there is no "
            f"after-evaluation: no held-out figure after GRPO, and no gain.{resume}"
        )


def general_tasks(job: Job) -> tuple[int, int] | None:
    """(tasks, domains) of a whole-recipe run's general check, from its preset's ``eval.general``: the tasks per domain
    on its domains less those the run evaluates (as ``training.evaluate.general_config`` builds it); None: no check."""
    run = preset_run(job)
    if run is None:
        return None
    evaluation = run.sections()[2]
    check = evaluation.general
    domains = [d for d in check.domains if d not in evaluation.domains] if check is not None else []
    return (check.tasks_per_domain * len(domains), len(domains)) if check is not None and domains else None


def general_line(job: Job) -> None:
    """A whole-recipe run's general check beside its held-out result: pass@1 before and after GRPO on domains it never
    trained on (what training cost elsewhere), the difference with its standard error."""
    if job.kind != "train_preset":
        return
    result = job_result(job)
    points = dict(metrics.series(int(job.id or 0), [GENERAL_CHECK], max_points=MAX_POINTS).get(GENERAL_CHECK, []))
    before = getattr(result, "general_before", None)
    after = getattr(result, "general_after", None)
    before = points.get(0) if before is None else before
    after = points.get(1) if after is None else after
    if before is None:
        return
    labels = eval_labels(job)
    n = getattr(result, "general_tasks", None)
    size = general_tasks(job)
    n = n or (size[0] if size else None)
    scope = (
        f" on {n} tasks of {size[1]} domains it never trained on" if n and size else " on domains it never trained on"
    )
    if after is None:
        st.info(f"General check{scope}: {labels[0]} {before:.1%} before GRPO.", icon=":material/balance:")
        return
    # the same tasks before and after: the paired difference of the run's arena; a run stored without one, the
    # difference of two pass rates on n tasks each, labelled unpaired
    check = (getattr(result, "arena", None) or {}).get("general")
    if check:
        error = f" ± {100 * check['se']:.1f} points, ± one paired standard error"
    elif n:
        error = f" ± {100 * math.sqrt(before * (1 - before) / n + after * (1 - after) / n):.1f} points, ± one unpaired standard error"
    else:
        error = " points"
    st.info(
        f"General check{scope}: {labels[0]} {before:.1%} → {labels[1]} {after:.1%} "
        f"({100 * (after - before):+.1f}{error}): what training cost elsewhere.",
        icon=":material/balance:",
    )


def compare_link(job: Job) -> None:
    """For a finished run that registered its model: straight to the arena against the model it started from."""
    result = job_result(job) if job.status is JobStatus.succeeded else None
    model = getattr(result, "model", None)
    base = getattr(result, "sft_model", None) or getattr(result, "base_model", None)
    if model and base and model != base:
        # the arena on the tasks the run was evaluated on: its preset's evaluation, else its domains at its level
        tasks = (
            {"compare_preset": job.config["preset"]}
            if job.kind == "train_preset"
            else {"compare_domains": ",".join(run_domains(job))}
            | (
                {"compare_difficulty": evaluate_config(job)["difficulty"]}
                if "difficulty" in evaluate_config(job)
                else {}
            )
        )
        if getattr(result, "arena", None):  # the run compared them on its held-out tasks already: open that
            tasks |= {"compare_open": str(job.id)}
        query = {"compare_a": base, "compare_b": model, **tasks}
        label, why = (
            f"Compare {model} with its base {base}",
            (
                "The Models & Serving page's Compare tab: the run's own "
                "comparison when it made one (the held-out tasks through "
                "both, task by task), and both models and the run's tasks "
                "chosen for another"
            ),
        )
        try:  # in the console: in-app, the same session
            st.page_link("views/models.py", label=label, icon=":material/compare_arrows:", query_params=query, help=why)
        except StreamlitAPIException:  # the page run on its own, outside the console's navigation
            st.link_button(label, f"models?{urlencode(query)}", icon=":material/compare_arrows:", help=why)


def held_out_points(job: Job, last_step: int) -> list[metrics.Point]:
    """The held-out pass@1 of a whole-recipe run as the Reward chart draws it: before GRPO at step 0, after it at the
    run's last step (none when the run evaluated nothing yet)."""
    if job.kind != "train_preset":
        return []
    found = dict(
        metrics.series(int(job.id or 0), [metric_names.EVAL_PASS_AT_1], max_points=MAX_POINTS).get(
            metric_names.EVAL_PASS_AT_1, []
        )
    )
    return [metrics.Point(step, found[i]) for i, step in ((0, 0), (1, max(1, last_step))) if i in found]


def run_view(job: Job) -> None:
    job_id = int(job.id or 0)
    st.markdown(f"**Run {job.id}** · `{job.kind}` · {status_label(job.status)} · attempt {job.attempts}/{job.max_attempts}"
                f" · by {job.submitted_by}")  # fmt: skip
    if job.progress is not None and not job.status.finished:
        st.progress(min(1.0, max(0.0, job.progress)), text=job.progress_message or None)
    if job.cancel_requested and job.status is JobStatus.running:
        st.info("Stop requested; the worker stops the run within the grace period.")
    if job.error:
        st.error(f"{job.error_cause or 'error'}: {job.error}")
    actions(job)
    estimate_line(job)
    compare_link(job)

    names = metrics.metric_names(job_id)
    if not names:
        st.caption("No metrics yet.")
    else:
        evals = [n for n in names if n.startswith("eval/")]
        if evals:  # what the run is measured by, before the per-step figures
            gain_line(job)
            general_line(job)
        last = metrics.latest(job_id, [n for _, n in TILES if n in names])  # one query a name: the tiles' only
        tiles = [(label, last[name]) for label, name in TILES if name in last]
        step = (metrics.step_range(job_id) or (0, 0))[1]
        cols = st.columns(len(tiles) + 1)
        cols[0].metric("Step", f"{step:,}")
        for col, (label, point) in zip(cols[1:], tiles):
            col.metric(label, tile_value(point.value))

        domain_names = [n for n in names if n.startswith("sched/") and n.endswith("/pass_rate")]
        charts = [(title, [n for n in group if n in names]) for title, group in CHARTS]
        charts = [(t, group) for t, group in charts if group]
        if len(domain_names) > LINES_UP_TO:
            domain_heatmap(job_id, [n.removeprefix("sched/").removesuffix("/pass_rate") for n in domain_names])
        elif domain_names:
            charts.insert(1, ("Pass rate by domain", domain_names))
        wanted = [n for _, group in charts for n in group]
        data = metrics.series(job_id, wanted, max_points=MAX_POINTS)
        flat = [
            (t, group)
            for t, group in charts
            if any(data.get(n) for n in group) and all(v == 0 for n in group for _, v in data.get(n, []))
        ]
        for title, _ in flat:  # a figure the run logs as 0 at every step: a note, not a flat line
            st.caption(f"**{title}**: not drawn: 0 at every step, because {zero_reason(title, job)}.")
        charts = [c for c in charts if c not in flat]
        pairs = st.columns(2)
        for i, (title, group) in enumerate(charts):
            with pairs[i % 2]:
                series = {name.removeprefix("sched/").removesuffix("/pass_rate") if name in domain_names else name:
                          data.get(name, []) for name in group}  # fmt: skip
                if title in SMOOTHED_CHARTS:
                    reward = data.get(metric_names.REWARD_MEAN, [])
                    held = held_out_points(job, max((p.step for p in reward), default=1))
                    spread = metrics.series(job_id, [metric_names.REWARD_SE, metric_names.SAMPLED_NLL],
                                            max_points=MAX_POINTS)  # fmt: skip
                    se = spread.get(metric_names.REWARD_SE, [])
                    chart(title, series, smoothed=True, held_out=held,
                          spread={metric_names.REWARD_MEAN: se} if se else None)  # fmt: skip
                    if why := reward_moves(reward, se, spread.get(metric_names.SAMPLED_NLL, []), held):
                        st.caption(why)
                else:
                    chart(title, series)
        if evals:
            evaluation_table(job, evals)
    arena = getattr(job_result(job), "arena", None) if job.status is JobStatus.succeeded else None
    if arena and len(arena["domains"]) > 2:  # more than one domain (and their overall row)
        st.markdown(f"**Per domain: {arena['a']} → {arena['b']}** on the held-out tasks")
        per_domain_results(arena, f"run{job_id}")
    if job.result:
        with st.expander("Result"):
            fields_table(job.result)
    with st.expander("Config"):
        yaml_block(job.config)


# --- trajectories ----------------------------------------------------------------------------


def message_text(message: dict[str, Any]) -> str:
    content = message.get("content", "")
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return str(content)


def preview(text: str, width: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def followed_steps(run_id: int, first: int, last: int) -> tuple[int, int]:
    """The Steps range to draw: the run's whole range at first; after that the operator's choice, each end that was at
    the run's first or newest step following it as a live run stores more steps (a slider whose bounds change is a
    new widget, which takes this value)."""
    drawn = st.session_state.get("traj_extent")  # (run, first, last) the slider was last drawn with
    chosen = st.session_state.get("traj_steps")
    st.session_state["traj_extent"] = (run_id, first, last)
    if drawn is None or chosen is None or drawn[0] != run_id:
        return first, last
    low, high = chosen
    low, high = (first if low <= drawn[1] else low), (last if high >= drawn[2] else high)
    low, high = min(max(low, first), last), min(max(high, first), last)
    return (low, high) if low < high or first == last else (first, last)


def trajectory_browser(job: Job) -> None:
    """A run's stored trajectories, read from the database on every rerun (a live run's as each step stores them)."""
    run_id = int(job.id or 0)
    domains = metrics.trajectory_domains(run_id)
    if not domains:
        live = not job.status.finished and job.kind in ("train_preset", "train_grpo")
        st.caption(
            "No trajectories yet: GRPO stores each step's as the step ends, and they show here as they come."
            if live
            else "This run has stored no trajectories."
        )
        return
    first, last = metrics.trajectory_steps(run_id) or (0, 0)
    f1, f2, f3 = st.columns([2, 2, 2])
    chosen = f1.multiselect("Domains", domains, default=[], key="traj_domains", placeholder="all domains")
    steps = (
        f2.slider("Steps", first, last, followed_steps(run_id, first, last), key="traj_steps")
        if last > first
        else (first, last)
    )
    rewards = f3.slider(
        "Reward",
        0.0,
        1.0,
        (0.0, 1.0),
        step=0.05,
        key="traj_rewards",
        help="0 to 1: every trajectory; 1 to 1: only full marks; 0 to 0: only failures",
    )
    filters = {"domains": chosen, "steps": steps, "rewards": rewards}
    total = metrics.trajectory_count(run_id, **filters)
    pages = max(1, -(-total // TRAJECTORY_PAGE_SIZE))
    page = st.number_input(f"Page (of {pages}, {total:,} trajectories)", min_value=1, max_value=pages, value=1, step=1,
                           key="traj_page")  # fmt: skip
    rows = metrics.trajectories(
        run_id, **filters, limit=TRAJECTORY_PAGE_SIZE, offset=TRAJECTORY_PAGE_SIZE * (int(page) - 1)
    )
    if not rows:
        st.info("No trajectories match: widen the domains, steps or reward range.")
        return
    if not job.status.finished:
        st.caption(f"Steps {first} to {last} so far: each new step's trajectories appear here as it stores them.")
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "id": t.id,
                    "step": t.step,
                    "domain": t.domain,
                    "reward": t.reward,
                    "passed": t.verdict.get("passed"),
                    "prompt": preview(message_text(t.prompt[-1]) if t.prompt else ""),
                    "completion": preview(t.completion),
                }
                for t in rows
            ]
        ),
        hide_index=True,
        width="stretch",
    )
    trajectory_detail(rows)


def trajectory_detail(rows: list[Any]) -> None:
    """The picked trajectory of a page: its prompt, the episode turn by turn or its completion, and its verdict."""
    by_id = {t.id: t for t in rows}
    picked = st.selectbox(
        "Trajectory",
        list(by_id),
        format_func=lambda i: f"#{i} · step {by_id[i].step} · {by_id[i].domain} · reward {by_id[i].reward:.3g}",
        key="traj_pick",
    )
    trajectory = by_id[picked]
    left, right = st.columns(2)
    with left:
        st.markdown("**Prompt**")
        for message in trajectory.prompt:
            with st.chat_message(str(message.get("role", "user"))):
                st.text(message_text(message))
        turns = [t for t in trajectory.tool_calls if isinstance(t, dict) and "role" in t]  # an environment's episode
        if turns:
            stop = trajectory.verdict.get("stop_reason", "?")
            st.markdown(f"**Episode** · {sum(t['role'] == 'assistant' for t in turns)} policy turns · stopped: {stop}")
            for turn in turns:
                if turn["role"] == "assistant":
                    with st.chat_message("assistant"):
                        st.text(turn.get("content") or "(empty)")
                        for call in turn.get("tool_calls", []):
                            st.caption(
                                f"called {call.get('name')} · {call.get('status')} · {float(call.get('elapsed_s', 0)):.2f} s"
                            )
                else:
                    with st.expander(
                        f"{turn['role']} output · {len(str(turn.get('content', '')))} chars", expanded=False
                    ):
                        st.text(turn.get("content") or "(empty)")
            if trajectory.verdict.get("error"):
                st.error(f"The episode was not scored: {trajectory.verdict['error']}")
            st.markdown("**Answer**")
        else:
            st.markdown("**Completion**")
        st.code(trajectory.completion or "(empty)", language="text")
    with right:
        verdict = trajectory.verdict
        passed = {True: "yes", False: "no"}.get(verdict.get("passed"), "?")  # type: ignore[call-overload]
        st.markdown(f"**Reward** {trajectory.reward:.4g} · **passed** {passed} · **score** {verdict.get('score', '?')}")
        if verdict.get("infra_error"):
            st.error(f"The verifier itself failed: {verdict['infra_error']}")
        if verdict.get("details"):
            st.caption(str(verdict["details"]))
        st.markdown("**Verdict**")
        fields_table(verdict)
        if trajectory.tool_calls and not turns:
            st.markdown("**Tool calls**")
            yaml_block(json.loads(json.dumps(trajectory.tool_calls, default=str)))


# --- the run: its view and its trajectories, followed live -----------------------------------


def run_section(polling: bool) -> None:
    """The Run box (each run labelled from its current row), the chosen run's view and its trajectories. ``polling``:
    this is the live fragment's rerun; once no run is queued or running, the page shows them once more and stops."""
    jobs = run_jobs()
    if polling and all(j.status.finished for j in jobs):
        st.rerun()
    labels = {j.id: run_label(j) for j in jobs}
    if st.session_state.get("run_id") not in labels:
        st.session_state.pop("run_id", None)
    run_id = st.selectbox("Run", list(labels), format_func=labels.get, key="run_id")
    job = next(j for j in jobs if j.id == run_id)
    st.subheader("Run")
    run_view(job)
    st.subheader("Trajectories")
    trajectory_browser(job)


@st.fragment(run_every=LIVE_EVERY)
def live_run_section() -> None:
    """The run section while a run is queued or running: rerun on its own every few seconds, from the database."""
    run_section(polling=True)


st.subheader("Runs")
run_queue()
if not (listed := run_jobs()):
    st.stop()
if any(not j.status.finished for j in listed):
    live_run_section()
else:
    run_section(polling=False)
