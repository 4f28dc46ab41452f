"""The ``deploy`` job kind (the model jobs, ``build_model``, ``import_model`` and ``export_model``, are
:mod:`posttrain.platform.models.jobs`'; the tier card's ``measure_tiers`` is :mod:`posttrain.training.tier_card`'s: it
grades with training's evaluation).

``deploy`` is a long-running job: it starts a server for a registered model
(the embedded engine, ``llama-server`` on its GGUF export, or vLLM's OpenAI server from its own environment), waits for ``/health``,
records the deployment's URL and health in the database every few seconds,
restarts the server on the same address when it exits on its own (a crash, the
OOM killer; the deployment is ``unhealthy`` meanwhile, and fails after
``MAX_RESTARTS`` exits within ``RESTART_WINDOW_S``), and stops the server
cleanly when the job is cancelled. Its log is the server's log.

The gate before deploy: a model whose general check fell beyond 2 paired SEs below the model it was trained from
(:mod:`posttrain.platform.models.general_check`) is refused when its deploy job is submitted (:func:`admit_deploy`,
whoever submits it: the console, the CLI, a config) and again when the job starts, unless the config says
``allow_regression``; the override is audited as ``deploy.allow_regression`` under the submitter's name.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from sqlmodel import col, select

from posttrain.platform.auth import Identity, is_loopback
from posttrain.platform.db.engine import retry_transient, session
from posttrain.platform.db.models import Deployment, Model, utcnow
from posttrain.platform.engines.inspect import inspect_model_dir
from posttrain.platform.engines.launcher import free_port
from posttrain.platform.engines.llamacpp import LlamaCppMissing, LlamaCppProfile, find_server
from posttrain.platform.engines.tiers import tier_catalog, tiers_path
from posttrain.platform.engines.vllm import VllmMissing, VllmProfile, find_python, server_env
from posttrain.platform.failures import BadInput
from posttrain.platform.jobs.context import JobContext, JobStopped
from posttrain.platform.jobs.registry import JOB_PATH, Admitted, JobConfigError, JobKind, register
from posttrain.platform.models.general_check import GeneralCheck, deploy_refusal
from posttrain.platform.models.jobs import ExportModelConfig, export_path, export_registered
from posttrain.platform.models.registry import ModelNotFound, get_model

HEALTH_INTERVAL_S = 2.0
MAX_RESTARTS = 3  # a server that exits more often than this within RESTART_WINDOW_S fails its deployment
RESTART_WINDOW_S = 600.0


class DeployConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1, description="a registered model name")
    tier: str = Field(default="standard", description="tier profile: fast or standard (or one from tiers_file)")
    engine: Literal["embedded", "llamacpp", "vllm"] | None = Field(
        default=None, description="default: the tier's engine (embedded unless the tier names llamacpp or vllm)"
    )
    host: str = Field(
        default="127.0.0.1",
        description="127.0.0.1: reached through the gateway only; another address "
        "serves the network, checking API keys (embedded engine only)",
    )
    port: int = Field(default=0, ge=0, le=65535, description="0 picks a free port")
    max_model_len: int | None = Field(default=None, ge=16)
    tiers_file: str | None = Field(default=None, json_schema_extra=JOB_PATH)
    start_timeout_s: float = Field(default=600.0, gt=0)
    vllm_overrides: dict[str, Any] = Field(default_factory=dict, description="VllmProfile fields (engine=vllm)")
    llamacpp_overrides: dict[str, Any] = Field(
        default_factory=dict, description="LlamaCppProfile fields (engine=llamacpp)"
    )
    allow_regression: bool = Field(
        default=False,
        description="deploy a model whose general check fell beyond 2 paired "
        "SEs below the model it was trained from (refused otherwise); the audit log records "
        "who overrode it",
    )

    @field_validator("vllm_overrides", "llamacpp_overrides")
    @classmethod
    def _overrides(cls, overrides: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """Each engine's overrides are its profile's fields, checked when the job is submitted, not when it starts."""
        profile, path = (
            (VllmProfile, "model_path") if info.field_name == "vllm_overrides" else (LlamaCppProfile, "gguf_path")
        )
        if unknown := sorted(set(overrides) - set(profile.model_fields) | {path} & set(overrides)):
            raise ValueError(
                f"{info.field_name}: {', '.join(unknown)} are not {profile.__name__} fields that a deploy may set "
                f"(the model's path is the deployment's own); the fields: {', '.join(sorted(set(profile.model_fields) - {path}))}"
            )
        try:
            profile.model_validate({path: "-", **overrides})
        except ValidationError as exc:
            raise ValueError(f"{info.field_name}: {exc.errors()[0]['loc'][0]}: {exc.errors()[0]['msg']}") from None
        return overrides


class RegressionRefused(JobConfigError):
    """A deploy of a model whose general check regressed, without ``allow_regression``."""


def check_regression(config: DeployConfig, model: Any) -> GeneralCheck | None:
    """The registered ``model``'s general check when it regressed and ``config`` overrides that (None: nothing to
    override); :class:`RegressionRefused` naming the model, the drop and the flag when it regressed and the deploy
    did not say ``allow_regression``."""
    check = GeneralCheck.of(model)
    if (refusal := deploy_refusal(config.model, check, config.allow_regression)) is not None:
        raise RegressionRefused(refusal)
    return check if check is not None and check.regressed else None


def admit_deploy(identity: Identity, config: DeployConfig, url: str | None) -> list[Admitted]:
    """The gate before deploy, when the job is submitted (the console, the CLI and a config all submit through it):
    a regressed model is refused unless the deploy says ``allow_regression``, and then the override is audited as
    ``deploy.allow_regression`` under the submitter's name. An unknown model is left to the job, which names it."""
    try:
        model = get_model(config.model, url=url)
    except ModelNotFound:
        return []
    overridden = check_regression(config, model)
    if overridden is None:
        return []
    return [
        Admitted(
            "deploy.allow_regression",
            config.model,
            {"tier": config.tier, "drop": overridden.drop(), "general_check": overridden.as_meta()},
        )
    ]


def deploy_tier(config: DeployConfig, settings: Any) -> tuple[Any, str]:
    """The tier profile a deployment runs with and the engine that serves it (the deployment's, else the tier's)."""
    catalog = tier_catalog(settings, config.tiers_file)
    if config.tier not in catalog.tiers:
        raise BadInput(f"unknown tier {config.tier!r}; known tiers: {', '.join(sorted(catalog.tiers))}")
    tier = catalog.tiers[config.tier]
    return tier, config.engine or tier.engine


def llamacpp_gguf(
    identity: Identity, model: Any, weights: str, settings: Any, *, url: str | None = None, progress: Any = None
) -> Path:
    """The model's GGUF export that llama-server runs (Q8_0, or F16 for a tier with the model's own weights),
    exported now when there is none or the weights changed since."""
    config = ExportModelConfig(model=model.name, format="gguf", outtype="q8_0" if weights == "q8_0" else "f16")
    path = export_path(settings, config)
    weight_files = [*Path(model.path).glob("*.safetensors"), Path(model.path) / "adapter_config.json"]
    newest = max((p.stat().st_mtime for p in weight_files if p.exists()), default=0.0)
    if not path.is_file() or path.stat().st_mtime < newest:
        export_registered(identity, config, settings, url=url, progress=progress)
    return path


def server_command(
    config: DeployConfig,
    model: Any,
    port: int,
    settings: Any,
    identity: Identity,
    *,
    url: str | None = None,
    progress: Any = None,
) -> tuple[str, list[str]]:
    """The engine serving ``config`` and the argv that starts its server for the registered ``model`` (a llamacpp
    deployment exports the model's GGUF first when it has none, as ``identity``)."""
    tiers_file = config.tiers_file or (str(tiers_path(settings)) if tiers_path(settings).is_file() else None)
    tier, engine = deploy_tier(config, settings)
    path = model.path
    if engine in ("vllm", "llamacpp") and not is_loopback(config.host):
        raise BadInput(f"{engine} cannot check posttrain API keys, so it listens on loopback only: deploy it on "
                       f"127.0.0.1 (the gateway serves it to the network), not {config.host}")  # fmt: skip
    if engine == "vllm":
        import torch  # heavy: only to see whether CUDA is there

        try:  # before anything else: a host without vLLM fails at once, naming what installs it
            python = find_python(getattr(settings, "vllm_python", None))
        except VllmMissing as exc:
            raise BadInput(str(exc)) from None
        overrides = {**config.vllm_overrides, "host": config.host, "port": port, "served_model_name": config.model}
        if config.max_model_len:
            overrides["max_model_len"] = config.max_model_len
        profile = VllmProfile.for_tier(
            path,
            tier,
            device="cuda" if torch.cuda.is_available() else "cpu",
            model_max_len=inspect_model_dir(path).max_position_embeddings,
            **overrides,
        )
        return engine, profile.to_args(python)
    if engine == "llamacpp":
        try:  # before any export: a host without the binary fails at once
            binary = find_server(getattr(settings, "llama_server", None))
        except LlamaCppMissing as exc:
            raise BadInput(str(exc)) from None
        model_max = inspect_model_dir(path).max_position_embeddings or 4096
        gguf = llamacpp_gguf(identity, model, tier.weights_for(engine), settings, url=url, progress=progress)
        # llama.cpp's own default (every core) unless the operator set POSTTRAIN_JOB_THREADS: on a quiet 2-core host
        # it made 88.6 tokens/s with two threads against 59.4 with one (bench/serving.py --engines); beside a
        # computing process two threads collapse, so a host that trains while it serves sets the setting
        llama_profile = LlamaCppProfile.for_tier(
            gguf,
            tier,
            served_model_name=config.model,
            host=config.host,
            port=port,
            ctx_per_slot=min(config.max_model_len or model_max, model_max),
            threads=getattr(settings, "job_threads", None),
            **config.llamacpp_overrides,
        )
        return engine, llama_profile.to_args(binary)
    cmd = [
        sys.executable, "-m", "posttrain.platform.serving", "--model", path, "--served-model-name", config.model,
        "--host", config.host, "--port", str(port), "--tier", config.tier,
    ]  # fmt: skip
    if config.max_model_len:
        cmd += ["--max-model-len", str(config.max_model_len)]
    if tiers_file:
        cmd += ["--tiers-file", tiers_file]
    return engine, cmd


def _update(deployment_id: int, url: str, **values: Any) -> None:
    def write() -> None:
        with session(url) as s:
            row = s.get(Deployment, deployment_id)
            assert row is not None
            for key, value in values.items():
                setattr(row, key, value)
            s.add(row)

    retry_transient(write, what=f"updating deployment {deployment_id}")  # the server keeps serving meanwhile


def deploy(ctx: JobContext, config: DeployConfig) -> dict[str, Any]:
    # httpx: off the CLI's start-up
    from posttrain.platform.engines.launcher import LaunchError, LogLines, ServerProcess

    try:
        model = get_model(config.model, url=ctx.url)
    except ModelNotFound as exc:
        raise BadInput(str(exc)) from None
    check_regression(config, model)  # also where a run measured the model after the deploy was queued
    port = config.port or free_port(config.host)
    base_url = f"http://{config.host}:{port}"
    engine, command = server_command(config, model, port, ctx.settings, ctx.identity, url=ctx.url,
                                     progress=lambda f, m: ctx.progress(f, m, force=True))  # fmt: skip
    assert model.id is not None  # a stored model
    with session(ctx.url) as s:
        row = Deployment(
            model_id=model.id, tier=config.tier, engine=engine, job_id=ctx.job_id, url=base_url,
            status="starting", profile={"command": command, **config.model_dump()},
        )  # fmt: skip
        s.add(row)
        s.flush()
        assert row.id is not None  # given by the flush
        deployment_id = int(row.id)
    ctx.log.info("starting %s", " ".join(command))
    ctx.progress(None, f"starting {engine} server for {config.model} ({config.tier})", force=True)
    env = server_env(cpu_threads=ctx.settings.job_threads) if engine == "vllm" else None
    lines = LogLines(lambda line: print(line, flush=True))  # the job's log without the health and metrics polls
    server = ServerProcess(command, base_url, env=env, on_log=lines)
    try:
        server.start(timeout_s=config.start_timeout_s)
    except LaunchError as exc:
        _update(deployment_id, ctx.url, status="failed", healthy=False)
        raise RuntimeError(str(exc)) from None
    _update(deployment_id, ctx.url, status="running", healthy=True, last_health_at=utcnow())
    ctx.progress(None, f"serving {config.model} ({config.tier}) at {base_url}/v1", force=True)
    restarts: list[float] = []
    try:
        while not ctx.should_stop:
            ctx.sleep(HEALTH_INTERVAL_S)
            if not server.running:
                # Crashed or killed (the OOM killer, an operator): unhealthy until a new one is up
                # on the same address, so the gateway keeps its route and answers 503 meanwhile.
                code = server.stop()
                now = time.monotonic()
                restarts = [t for t in restarts if now - t < RESTART_WINDOW_S] + [now]
                _update(deployment_id, ctx.url, healthy=False, last_health_at=utcnow(), status="unhealthy")
                if len(restarts) > MAX_RESTARTS:
                    raise RuntimeError(f"the server exited with code {code}, its {len(restarts)}th exit within "
                                       f"{RESTART_WINDOW_S:.0f}s; not restarting it again. Its log is this job's log")  # fmt: skip
                ctx.log.warning("the server exited with code %s; restarting it (restart %d)", code, len(restarts))
                server = ServerProcess(command, base_url, env=env, on_log=lines)
                try:
                    server.start(timeout_s=config.start_timeout_s)
                except LaunchError as exc:
                    raise RuntimeError(f"the server exited with code {code} and did not start again: {exc}") from None
                ctx.log.info("the server is back at %s", base_url)
            healthy = server.healthy()
            _update(
                deployment_id,
                ctx.url,
                healthy=healthy,
                last_health_at=utcnow(),
                status="running" if healthy else "unhealthy",
            )
    except JobStopped:
        ctx.log.info("stop requested")
    finally:
        code = server.stop(timeout_s=max(1.0, ctx.settings.cancel_grace_s - 2.0))
        _update(deployment_id, ctx.url, status="stopped", healthy=False)
        ctx.log.info(
            "server stopped with code %s; it answered %d health and metrics polls (not logged)", code, lines.polls
        )
    return {"deployment_id": deployment_id, "url": base_url}


register(
    JobKind(
        name="deploy",
        config_model=DeployConfig,
        run=deploy,
        description="Serve a registered model in a speed tier (embedded engine, llama.cpp or vLLM) until cancelled.",
        resumable=True,
        max_attempts=5,
        admit=admit_deploy,
        cpu_slots=0,  # a server waits on requests: a serving slot of its own, none of the CPU slots training needs
        serving=True,
    )
)


def registered_deployments(url: str | None = None) -> list[Any]:
    """Deployments the database says are serving, as the gateway routes them."""

    from posttrain.platform.serving.gateway import Deployment as Route  # fastapi, aiohttp: off the CLI's start-up

    with session(url, read_only=True) as s:
        rows = s.exec(
            select(Deployment, Model.name, Model.meta)
            .join(Model, col(Model.id) == col(Deployment.model_id))
            .where(col(Deployment.status).in_(("running", "unhealthy")))
        ).all()
    return [
        Route(
            model=name,
            tier=d.tier,
            base_url=d.url,
            healthy=d.healthy,
            default=(meta or {}).get("default_tier") == d.tier,
            chat=(meta or {}).get("chat_template", True),
        )
        for d, name, meta in rows
    ]
