"""Models & Serving: the registry, deployments in speed tiers with health and metrics, and a playground."""

from __future__ import annotations

import base64
import json

import pandas as pd
import streamlit as st
from pydantic import ValidationError
from sqlmodel import col, select

from posttrain.platform.db.engine import session
from posttrain.platform.db.models import Deployment, Model, Role
from posttrain.platform.jobs import queue
from posttrain.platform.jobs.registry import JobConfigError
from posttrain.platform.models.inspect import ModelDirError
from posttrain.platform.models.registry import ModelNotFound, list_models, register_model
from posttrain.platform.serving.client import ChatError, prometheus_values, stream_chat
from posttrain.platform.serving.jobs import tier_catalog, tiers_path
from posttrain.platform.serving.profiles import TierCatalog
from posttrain.platform.settings import get_settings
from posttrain.ui.common import can, flash, guard_platform, show_flash, username

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
        if not can(Role.operator):
            raise PermissionError("only operators can build, register or deploy models")
        job_id = queue.submit(kind, config, submitted_by=username())
    except (JobConfigError, PermissionError) as exc:
        st.error(str(exc))
    else:
        st.success(f"Queued {kind} job {job_id}; follow it on the Jobs page.")


# --- registry -------------------------------------------------------------------------------
st.subheader("Models")
models = list_models()
names = {m.id: m.name for m in models}
if models:
    st.dataframe(
        pd.DataFrame(
            [
                {"model": m.name, "architecture": m.architecture, "base": names.get(m.base_model_id, ""),
                 "from job": m.produced_by_job_id, "vision": m.meta.get("is_vision", False), "path": m.path,
                 "registered": m.created_at}
                for m in models
            ]  # fmt: skip
        ),
        hide_index=True,
        width="stretch",
    )
else:
    st.info("No models yet: build a small one locally, or register a Hugging Face model directory.")

build_tab, register_tab, deploy_tab, tiers_tab = st.tabs(["Build a small model", "Register a directory", "Deploy", "Tiers"])
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
            if not can(Role.operator):
                raise PermissionError("only operators can register models")
            row = register_model(reg_name, reg_path, base=None if reg_base == "(none)" else reg_base, by=username())
        except (ModelDirError, ModelNotFound, PermissionError) as exc:
            st.error(str(exc))
        else:
            flash(f"Registered {row.name} ({row.architecture}).")
with deploy_tab, st.form("deploy"):
    c1, c2, c3 = st.columns(3)
    dep_model = c1.selectbox("Model", [m.name for m in models], key="deploy_model")
    catalog = tier_catalog(get_settings())
    dep_tier = c2.selectbox("Tier", sorted(catalog.tiers), key="deploy_tier")
    dep_engine = c3.selectbox("Engine", ["embedded", "vllm"], key="deploy_engine", help="vllm needs a GPU host")
    max_len = st.number_input("max_model_len (0: the model's own)", 0, 1_048_576, 0, key="deploy_max_len")
    if st.form_submit_button("Deploy", disabled=not operator or not models) and dep_model:
        config = {"model": dep_model, "tier": dep_tier, "engine": dep_engine}
        if max_len:
            config["max_model_len"] = int(max_len)
        submit("deploy", config)
with tiers_tab:
    st.caption("Named speed tiers; every deployment started after a change uses the edited profile.")
    text = st.text_area("Tier profiles (JSON)", value=json.dumps(catalog.model_dump(), indent=2), height=300, key="tiers_json")
    if st.button("Save tiers", disabled=not operator, key="tiers_save"):
        try:
            if not can(Role.operator):
                raise PermissionError("only operators can edit tiers")
            edited = TierCatalog.model_validate_json(text)
        except (ValidationError, PermissionError) as exc:
            st.error(f"Not saved: {exc}")
        else:
            edited.save(tiers_path(get_settings()))
            st.success(f"Saved {len(edited.tiers)} tiers.")


# --- deployments ----------------------------------------------------------------------------
@st.fragment(run_every="3s")
def deployments_panel() -> None:
    with session(read_only=True) as s:
        rows = s.exec(
            select(Deployment, Model.name).join(Model, col(Model.id) == col(Deployment.model_id)).order_by(col(Deployment.id).desc()).limit(50)
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
                "draft acceptance": values.get("vllm:spec_decode_num_accepted_tokens_total", 0.0) / drafts if drafts else None,
            }
        table.append(entry)
    st.dataframe(pd.DataFrame(table), hide_index=True, width="stretch")
    live = [(d, m) for d, m in rows if d.status in ("running", "starting", "unhealthy") and d.job_id]
    if live and can(Role.operator):
        stop_id = st.selectbox("Stop a deployment", [d.id for d, _ in live], format_func=lambda i: f"#{i}", key="stop_dep")
        if st.button("Stop", key="stop_dep_go") and can(Role.operator):
            job_id = next(d.job_id for d, _ in live if d.id == stop_id)
            queue.cancel(int(job_id), username=username())  # type: ignore[arg-type]
            st.rerun(scope="fragment")


st.subheader("Deployments")
deployments_panel()


# --- playground -----------------------------------------------------------------------------
st.subheader("Playground")
settings = get_settings()
with session(read_only=True) as s:
    serving = s.exec(
        select(Deployment, Model.name).join(Model, col(Model.id) == col(Deployment.model_id)).where(Deployment.status == "running")
    ).all()
if not serving:
    st.caption("Deploy a model to chat with it here.")
    st.stop()

gateway_url = f"http://{settings.gateway_host}:{settings.gateway_port}"
route = st.radio(
    "Send requests", ["through the gateway", "straight to the deployment"], horizontal=True, key="pg_route",
    help=f"The gateway ({gateway_url}) is what API clients use; it routes by model and tier.",
)  # fmt: skip
choices = {f"{name} · {d.tier} (#{d.id})": (name, d) for d, name in serving}
side_by_side = st.toggle("Two models side by side", key="pg_two")
picked = st.multiselect(
    "Deployments", list(choices), default=list(choices)[: 2 if side_by_side else 1], max_selections=2 if side_by_side else 1,
    key="pg_targets",
)  # fmt: skip
c1, c2, c3 = st.columns(3)
max_tokens = c1.number_input("Max tokens", 1, 4096, 64, key="pg_max_tokens")
temperature = c2.number_input("Temperature", 0.0, 2.0, 0.0, 0.1, key="pg_temperature")
use_tools = c3.toggle("Offer sandbox tools", key="pg_tools", help="python, bash and file tools, as the agent loop offers them")
image = st.file_uploader("Image (for vision-language models)", type=["png", "jpg", "jpeg", "webp"], key="pg_image")

history: list[dict] = st.session_state.setdefault("pg_history", [])
for message in history:
    with st.chat_message(message["role"]):
        st.markdown(message["text"])

prompt = st.chat_input("Message", key="pg_input")
if prompt and picked:
    content: str | list[dict] = prompt
    if image is not None:
        data_url = f"data:{image.type};base64,{base64.b64encode(image.getvalue()).decode()}"
        content = [{"type": "text", "text": prompt}, {"type": "image_url", "image_url": {"url": data_url}}]
    history.append({"role": "user", "text": prompt})
    with st.chat_message("user"):
        st.markdown(prompt)
    tools = None
    if use_tools:
        from posttrain.platform.sandbox import TOOL_SCHEMAS

        tools = list(TOOL_SCHEMAS)
    columns = st.columns(len(picked))
    for column, label in zip(columns, picked):
        model_name, deployment = choices[label]
        base = gateway_url if route == "through the gateway" else deployment.url
        messages = [{"role": m["role"], "content": m["text"]} for m in history[:-1] if m["role"] in ("user", "assistant")]
        messages.append({"role": "user", "content": content})
        with column, st.chat_message("assistant"):
            st.caption(label)
            calls: list[dict] = []

            def pieces():  # type: ignore[no-untyped-def]
                for delta in stream_chat(base, model_name, messages, tier=deployment.tier, tools=tools,
                                         max_tokens=int(max_tokens), temperature=float(temperature)):  # fmt: skip
                    if delta.get("content"):
                        yield delta["content"]
                    calls.extend(delta.get("tool_calls") or [])

            try:
                text = st.write_stream(pieces())
            except (ChatError, OSError) as exc:
                st.error(str(exc))
                text = ""
            for call in calls:
                st.code(json.dumps(call.get("function", call), indent=2), language="json")
        history.append({"role": "assistant", "text": f"**{label}**: {text}" if len(picked) > 1 else str(text)})
if st.button("Clear chat", key="pg_clear"):
    st.session_state["pg_history"] = []
    st.rerun()
