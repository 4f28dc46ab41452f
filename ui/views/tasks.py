"""Tasks: build task sets, browse domains with pass rates, open a task, ask a deployed model, try its verifier."""

from __future__ import annotations

from collections import Counter
from typing import Literal

import pandas as pd
import streamlit as st

from posttrain.platform.db.models import DocumentStatus, JobStatus, Role
from posttrain.platform.documents import get_document, get_pages, list_documents
from posttrain.platform.jobs import queue
from posttrain.platform.jobs.registry import JobConfigError
from posttrain.platform.models.importer import DEFAULT_MODEL
from posttrain.platform.sandbox import SandboxStartError, SandboxUnavailableError
from posttrain.platform.serving.client import ChatError, try_task
from posttrain.platform.serving.jobs import registered_deployments
from posttrain.platform.tasks import store
from posttrain.platform.tasks.builders import KINDS as DOCUMENT_KINDS
from posttrain.platform.tasks.domains import list_domains, list_families, prompt_space
from posttrain.platform.tasks.episodes import is_project
from posttrain.platform.tasks.jobs import build_level, import_jsonl_upload
from posttrain.platform.verifiers import VerifierError
from posttrain.platform.verifiers.forgeable_tests import METADATA_KEY as FORGEABLE
from posttrain.ui.common import (
    can,
    console_pool,
    fields_table,
    follow,
    guard_platform,
    job_states,
    me,
    show_message,
    unfinished,
    yaml_block,
)
from posttrain.ui.page_images import page_image

BUILD_KINDS = ("build_tasks",)
PAGE_SIZE = 50

st.title("Tasks")
st.caption("Verifiable tasks by domain. Building and importing run as jobs; see them on the Jobs page.")
if not guard_platform():
    st.stop()


def submit_build(config: dict | None = None, *, jsonl: bytes | None = None, task_set: str = "") -> None:
    """Queue a ``build_tasks`` job from ``config``, or one importing the uploaded ``jsonl`` into ``task_set``."""
    try:
        if jsonl is not None:
            job_id = import_jsonl_upload(me(), jsonl, task_set)
        else:
            job_id = queue.submit(me(), "build_tasks", config)
    except (JobConfigError, PermissionError) as exc:
        st.error(str(exc))
    else:
        st.success(f"Queued build job {job_id}. It appears below when it finishes.")


operator = can(Role.operator)
from_docs, build, imports = st.tabs(["Build from documents", "Build from procedural domains", "Import"])
with from_docs:
    ready = [d for d in list_documents(limit=500) if d.status is DocumentStatus.ready]
    if not ready:
        st.info("No preprocessed documents yet: upload some on the Documents page.")
    with st.form("build_documents"):
        doc_set = st.text_input("Task set name", value="documents", key="docs_set_name")
        picked = st.multiselect(
            "Documents", [d.id for d in ready], default=[d.id for d in ready][:5],
            format_func=lambda i: next(f"#{d.id} {d.filename} ({d.page_count} pages)" for d in ready if d.id == i),
            key=f"docs_ids_{'-'.join(str(d.id) for d in ready[:5])}",  # new documents reset the default choice
        )  # fmt: skip
        kinds = st.multiselect("Task kinds", list(DOCUMENT_KINDS), default=list(DOCUMENT_KINDS), key="docs_kinds")
        c1, c2, c3 = st.columns(3)
        per_doc = c1.number_input("Questions per document", 1, 100_000, 50, key="docs_per_doc")
        eval_fraction = c2.slider("Eval fraction", 0.0, 1.0, 0.1, key="docs_eval_fraction")
        vision = c3.toggle("Also over page images (vision-language)", key="docs_vision")
        if st.form_submit_button("Build from documents", type="primary", disabled=not operator or not ready):
            if not picked:
                st.error("Choose at least one document.")
                st.stop()
            submit_build(
                {
                    "task_set": doc_set,
                    "source": {
                        "type": "documents",
                        "document_ids": picked,
                        "kinds": kinds,
                        "vision": vision,
                        "max_per_document": int(per_doc),
                        "eval_fraction": float(eval_fraction),
                    },
                }  # fmt: skip
            )


def procedural_count_caption(
    chosen: list[str], per_domain: int, eval_per_domain: int, difficulty: int | Literal["auto"]
) -> str:
    """How many domains and tasks the build form's current values make, the level each domain is built at (auto),
    and which domains get no eval tasks."""
    picked_domains = [d for f in chosen for d in list_domains(f)]
    levels = {d.name: build_level(d.name, difficulty, eval_per_domain) for d in picked_domains}
    small = (
        [n for n, level in levels.items() if not prompt_space(n, level).has_held_out_split] if eval_per_domain else []
    )
    n_domains = len(picked_domains)
    text = f"{n_domains} domains selected, {n_domains * (per_domain + eval_per_domain) - len(small) * eval_per_domain} tasks."
    if difficulty == "auto" and levels:
        at = Counter(levels.values())
        text += " Each at the lowest level that holds out an eval split: " + ", ".join(
            f"{at[level]} at level {level}" for level in sorted(at)
        ) + "."  # fmt: skip
    if small:
        named = f"{', '.join(small[:8])}{' ...' if len(small) > 8 else ''}"
        where = "any difficulty" if difficulty == "auto" else f"difficulty {difficulty}"
        text += (
            f" {len(small)} of them have too few distinct prompts at {where} to hold out an eval split and get no "
            f"eval tasks: {named}."
        )
    return text


with build:
    families = list_families()
    # What decides the task count sits outside the form: a form sends its values only when submitted, so
    # the count below would keep showing the values of the last run instead of the ones on screen.
    chosen = st.multiselect("Families", families, default=families[:1], key="build_families")
    c1, c2, c3 = st.columns(3)
    per_domain = c1.number_input("Train tasks per domain", 1, 10_000, 32, key="build_per_domain")
    eval_per_domain = c2.number_input("Eval tasks per domain", 0, 10_000, 8, key="build_eval_per_domain")
    difficulty = c3.select_slider(
        "Difficulty",
        ["auto", 1, 2, 3, 4, 5],
        value="auto",
        key="build_difficulty",
        help="auto: each domain at the lowest level with enough distinct prompts to hold out an eval split",
    )
    st.caption(procedural_count_caption(chosen, int(per_domain), int(eval_per_domain), difficulty))
    with st.form("build_procedural"):
        c1, c2 = st.columns(2)
        name = c1.text_input("Task set name", value="procedural", key="build_set_name")
        seed = c2.number_input("Seed", 0, 2**31 - 1, 0, key="build_seed")
        if st.form_submit_button("Build", type="primary", disabled=not operator):
            submit_build(
                {
                    "task_set": name,
                    "source": {
                        "type": "procedural",
                        "families": chosen,
                        "per_domain": int(per_domain),
                        "eval_per_domain": int(eval_per_domain),
                        "difficulty": difficulty,
                        "seed": int(seed),
                    },
                }  # fmt: skip
            )
with imports:
    upload = st.file_uploader(
        "JSONL file (prompt, answer, verifier per line)", type=["jsonl"], key="import_jsonl", disabled=not operator
    )
    jsonl_set = st.text_input("Task set name", value="imported", key="import_set_name")
    if upload is not None and st.button("Import JSONL", key="import_jsonl_go", disabled=not operator):
        submit_build(jsonl=upload.getvalue(), task_set=jsonl_set)
    if st.button("Import HumanEval (164 code problems)", key="import_humaneval", disabled=not operator):
        submit_build({"task_set": "humaneval", "source": {"type": "humaneval"}})


def overview() -> None:
    sets = store.task_sets()
    if not sets:
        st.info("No task sets yet: build one above.")
        return
    st.subheader("Task sets")
    st.dataframe(
        pd.DataFrame(
            [{"task set": ts.name, "source": ts.source, "tasks": n, "created": ts.created_at} for ts, n in sets]
        ),
        hide_index=True,
        width="stretch",
    )
    recent_builds()


def recent_builds() -> None:
    """The last builds' summaries: tasks made and, for imported code tasks, the tests that code can pass by rewriting
    an argument in place, each named with its task."""
    builds = [j for j in queue.list_jobs(kind="build_tasks", limit=10) if j.status is JobStatus.succeeded and j.result]
    if not builds:
        return
    st.markdown("**Recent builds**")
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "job": j.id,
                    "task set": j.config.get("task_set"),
                    "source": j.config.get("source", {}).get("type"),
                    "tasks": j.result.get("tasks"),
                    "tests forgeable by mutation": j.result.get("tests_forgeable_by_mutation"),
                    "finished": j.finished_at,
                }
                for j in builds
            ]
        ),  # fmt: skip
        hide_index=True,
        width="stretch",
    )
    for job in builds:
        for kind, why in (job.result.get("kinds_without_tasks") or {}).items():
            st.warning(f"Build job {job.id} ({job.config.get('task_set')}) made no {kind} tasks: {why}.")
        lines = job.result.get("forgeable_by_mutation") or []
        if lines:
            n, tasks = (
                job.result.get("tests_forgeable_by_mutation"),
                job.result.get("tasks_with_tests_forgeable_by_mutation"),
            )
            with st.expander(
                f"Build job {job.id} ({job.config.get('task_set')}): {n} test(s) in {tasks} task(s) are "
                "forgeable by mutation"
            ):
                st.caption(
                    "Each reads an argument again after passing it to the program, so code that rewrites the "
                    "argument in place can pass it. Python allows that, and the grader keeps it; fix the tests "
                    "(pass a copy, or compute the expected value first) to close it."
                )
                st.markdown("\n".join(f"- {line}" for line in lines))


# While a build runs, the page follows it: when it ends, its task set, summary and domains show with no navigation.
build_states = job_states(BUILD_KINDS)
follow("tasks_followed", lambda: job_states(BUILD_KINDS), active=unfinished(build_states), drawn=build_states)
overview()

sets = [ts.name for ts, _ in store.task_sets()]
if not sets:
    st.stop()

st.subheader("Domains")
chosen_set = st.selectbox("Task set", ["all", *sets], key="browse_set")
stats = store.domain_stats(task_set=None if chosen_set == "all" else chosen_set)
frame = pd.DataFrame(
    [
        {
            "domain": d.name,
            "family": d.family,
            "tasks": d.tasks,
            "train": d.train,
            "eval": d.eval,
            "attempts": d.attempts,
            "pass rate": d.pass_rate,
            "weight": d.weight,
            "priority": d.priority,
        }
        for d in stats
    ]  # fmt: skip
)
st.dataframe(
    frame,
    hide_index=True,
    width="stretch",
    column_config={"pass rate": st.column_config.ProgressColumn(min_value=0.0, max_value=1.0, format="percent")},
)

st.subheader("Open a task")
domain = st.selectbox("Domain", [d.name for d in stats], key="browse_domain")
page = st.number_input("Page", min_value=1, value=1, key="browse_page")
tasks = store.load_tasks(
    task_set=None if chosen_set == "all" else chosen_set,
    domains=[domain],
    limit=PAGE_SIZE,
    offset=PAGE_SIZE * (int(page) - 1),
)
if not tasks:
    st.info("No tasks on this page.")
    st.stop()
labels = {
    t.id: f"#{t.id} [{t.spec.split}]{' [forgeable by mutation]' if t.spec.metadata.get(FORGEABLE) else ''} "
    f"{t.spec.prompt_text[:80]}"
    for t in tasks
}
task_id = st.selectbox("Task", list(labels), format_func=labels.get, key="browse_task")
task = next(t for t in tasks if t.id == task_id)
spec = task.spec

left, right = st.columns(2)
with left:
    st.markdown("**Prompt**")
    for message in spec.prompt:
        with st.chat_message(message.role):
            st.text(message.text)
    st.markdown(f"**Reference answer** ({spec.verifier.kind} verifier)")
    st.code(spec.reference or "(none)", language="text")
    if flags := spec.metadata.get(FORGEABLE):
        st.warning(
            f"Forgeable by mutation: {len(flags)} of this task's tests can be passed by code that rewrites an "
            "argument in place (the grader keeps such changes, as Python does).\n\n"
            + "\n".join(f"- test {f['test'] + 1}: `{f['code']}` {f['reason']}" for f in flags)
        )
with right:
    st.markdown("**Verifier spec**")
    yaml_block(spec.verifier.spec)
    st.markdown(f"**Statistics**: {task.attempts} attempts, {task.passes} passed")
    if spec.provenance:
        st.markdown("**Provenance**")
        fields_table(spec.provenance)


def show_source_page(provenance: dict) -> None:
    """The document page a task came from, with the task's box highlighted."""
    document_id, page = provenance.get("document_id"), provenance.get("page")
    if not isinstance(document_id, int) or not isinstance(page, int):
        return
    page_no = page - int(provenance.get("pages_from", 0))  # numbered from 1 as the prompt says; older tasks from 0
    try:
        document = get_document(document_id)
    except LookupError:
        st.warning(
            f"Document {document_id} ({provenance.get('filename', '?')}) no longer exists; its page cannot be shown."
        )
        return
    page = next((p for p in get_pages(document_id) if p.page_no == page_no), None)
    image = page_image(page, highlight=provenance.get("bbox")) if page is not None else None
    if image is None:
        st.info(f"Page {page_no + 1} of document {document_id} has no stored render.")
        return
    st.image(image, caption=f"{document.filename}, page {page_no + 1}: the task's source box in red", width="stretch")


if "document_id" in spec.provenance and "page" in spec.provenance:
    with st.expander("Source page", expanded=True):
        show_source_page(spec.provenance)


def running_deployments() -> list[tuple[str, str, str]]:
    """(model, tier, url) of every healthy deployment, the built-in real model first."""
    serving = [(r.model, r.tier, r.base_url) for r in registered_deployments() if r.healthy]
    return sorted(serving, key=lambda r: (r[0] != DEFAULT_MODEL, r[0], r[1]))


def show_verdict(verdict) -> None:  # type: ignore[no-untyped-def]
    if verdict.is_infra_error:
        st.error(f"The verifier itself failed: {verdict.infra_error}")
    else:
        (st.success if verdict.passed else st.warning)(
            f"score {verdict.score:.2f}, {'passed' if verdict.passed else 'not passed'}"
        )
    if verdict.details:
        st.caption(verdict.details)


def try_as_episode(target: tuple[str, str, str], turns: int, limit: int) -> None:
    """The task as a real episode: the deployment's replies and tool calls, each call run in the console's sandbox,
    shown turn by turn as they come, then what was graded and the verdict."""
    try:
        with st.container(border=True):
            out = try_task(
                me(),
                console_pool,
                target[2],
                target[0],
                task.id,
                max_turns=turns,
                max_tokens=limit,
                on_message=show_message,
            )
    except (ChatError, OSError, VerifierError, PermissionError, SandboxUnavailableError, SandboxStartError) as exc:
        st.error(str(exc))
        return
    calls = len(out.result.tool_results)
    st.caption(
        f"{out.result.turns} replies, {calls} tool call{'s' * (calls != 1)} ({', '.join(out.tools)} offered), "
        f"ended: {out.result.stop_reason.replace('_', ' ')}"
    )
    if project and out.graded is not None:
        st.markdown("**solution.py as the episode left it** (what the hidden tests graded)")
        st.code(out.graded, language="python")
    show_verdict(out.verdict)


st.markdown("**Try a model**")
serving = running_deployments()
project = is_project(spec)
if not serving:
    st.caption("Deploy a model on the Models & Serving page (the built-in SmolLM2 first) to ask it this task here.")
else:
    from posttrain.platform.serving.client import ChatError, chat_as

    c1, c2, c3 = st.columns([3, 1, 1])
    target = c1.selectbox("Deployment", serving, format_func=lambda r: f"{r[0]} · {r[1]}", key="try_model")
    limit = c2.number_input("Max tokens", 1, 4096, 256, key="try_model_tokens", help="per reply")
    episode = st.toggle(
        "As an episode with sandbox tools",
        value=project,
        key="try_model_episode",
        help="The model may call sandbox tools (a repair task: bash, read_file, write_file, edit_file, "
        "list_dir on its project; another task: python and bash) over several replies, as the "
        "tool_use and code_repair environments run it in training; then the rubric grades it",
    )
    turns = c3.number_input("Max replies", 1, 16, 8, key="try_model_turns", disabled=not episode)
    if st.button(
        "Ask the model",
        key="try_model_go",
        disabled=not operator,
        help=None if operator else "Asking a model and verifying its answer needs the operator role",
    ):
        if episode:
            try_as_episode(target, int(turns), int(limit))
        else:
            messages = [m.model_dump(exclude_none=True) for m in spec.prompt]
            try:
                reply = "".join(
                    d.get("content") or "" for d in chat_as(me(), target[2], target[0], messages, max_tokens=int(limit))
                )
                verdict = store.try_answer(me(), task.id, reply)
            except (ChatError, OSError, VerifierError, PermissionError) as exc:
                st.error(str(exc))
            else:
                st.markdown(f"**{target[0]} answers**")
                st.code(reply or "(nothing)", language="text")
                show_verdict(verdict)

st.markdown("**Try the verifier**")
answer = st.text_area("Answer", key="try_answer", height=100)
if st.button(
    "Verify",
    key="try_verify",
    disabled=not operator,
    help=None if operator else "Verifying runs the answer (a code task's tests run it in a sandbox): operators only",
):
    try:
        verdict = store.try_answer(me(), task.id, answer)
    except (VerifierError, PermissionError) as exc:
        st.error(str(exc))
    else:
        show_verdict(verdict)
