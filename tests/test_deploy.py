"""Models and deployments as jobs: build a model, serve it in a tier, reach it through the gateway."""

from __future__ import annotations

import re
import sys

import psutil
import pytest
from conftest import OPERATOR, start_worker, stop_deployment, stop_worker, wait_deployed, wait_for

from posttrain.platform.db.engine import session
from posttrain.platform.db.models import Deployment, JobStatus
from posttrain.platform.engines.inspect import ModelDirError
from posttrain.platform.jobs import queue
from posttrain.platform.jobs.registry import JobConfigError
from posttrain.platform.models.registry import get_model, lineage, list_models, register_model

pytestmark = pytest.mark.slow


def test_worker_imports_no_torch() -> None:
    import subprocess

    code = "import sys, posttrain.platform.jobs.registry as r; r.kinds(); print('torch' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )


def test_register_refuses_what_is_not_a_model(platform_env: dict[str, str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ModelDirError, match="config.json"):
        register_model(OPERATOR, "x", tmp_path)
    with pytest.raises(JobConfigError, match="name"):
        queue.submit(OPERATOR, "build_model", {"name": "has spaces"})


def test_build_deploy_chat_through_gateway_and_stop(platform_env: dict[str, str]) -> None:
    from openai import OpenAI

    from posttrain.platform.serving.gateway import GatewayConfig, create_gateway_app
    from posttrain.platform.serving.jobs import registered_deployments
    from posttrain.platform.serving.server import serve_in_thread

    built = queue.submit(OPERATOR, "build_model", {"name": "tiny", "hidden_size": 64, "num_layers": 2})
    worker = start_worker(platform_env)
    try:
        wait_for(lambda: queue.get_job(built).status.finished, timeout=300, message="model built")
        assert queue.get_job(built).status is JobStatus.succeeded, queue.get_job(built).error
        model = get_model("tiny")
        assert model.produced_by_job_id == built and [m.name for m in lineage("tiny")] == ["tiny"]

        deployed = queue.submit(OPERATOR, "deploy", {"model": "tiny", "tier": "fast"})
        route = wait_deployed(deployed)
        assert route.model == "tiny" and route.tier == "fast"

        gateway = serve_in_thread(
            create_gateway_app(GatewayConfig(deployments=[], health_interval_s=0.5), refresh=registered_deployments)
        )
        with gateway:
            client = OpenAI(base_url=gateway.base_url + "/v1", api_key="unused")
            wait_for(lambda: client.models.list().data, timeout=30, message="gateway sees the deployment")
            reply = client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=8, temperature=0,
                extra_headers={"x-task-type": "chat"},
            )  # fmt: skip
            assert reply.choices[0].finish_reason in ("stop", "length") and reply.usage.completion_tokens > 0

        # the engine is a child of this deployment's job process, whose pid the job row records (not any engine
        # process on the machine: another `posttrain up` may be serving beside the test)
        job = queue.get_job(deployed)
        assert job.pid is not None and psutil.Process(job.pid).create_time() == pytest.approx(job.proc_started, abs=1)
        servers = [p for p in psutil.Process(job.pid).children(recursive=True) if "--served-model-name" in p.cmdline()]
        assert len(servers) == 1 and "posttrain.platform.serving" in " ".join(servers[0].cmdline()), servers
        stop_deployment(deployed, servers[0])
        with session(read_only=True) as s:
            row = s.get(Deployment, 1)
            assert row is not None and row.status == "stopped" and not row.healthy
        assert [m.name for m in list_models()] == ["tiny"]
        # the job's log holds the server's own lines and the chat, not the health and metrics polls of its whole life
        from posttrain.platform.jobs.worker import job_dir
        from posttrain.platform.settings import get_settings

        log = (job_dir(get_settings(), deployed) / "job.log").read_text()
        assert '"POST /v1/chat/completions HTTP/1.1" 200' in log and "GET /health" not in log, log[-3000:]
        polls = re.search(r"answered (\d+) health and metrics polls \(not logged\)", log)
        assert polls and int(polls.group(1)) >= 1, log[-2000:]
    finally:
        stop_worker(worker)


def test_a_models_default_tier_marks_its_deployment_for_the_gateway(platform_env: dict[str, str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    from posttrain.platform.auth import Identity
    from posttrain.platform.db.models import Model, Role
    from posttrain.platform.models.registry import set_default_tier
    from posttrain.platform.serving.jobs import registered_deployments

    with session() as s:
        model = Model(name="m", path=str(tmp_path))
        s.add(model)
        s.flush()
        s.add_all(
            [
                Deployment(model_id=model.id, tier=tier, url=f"http://127.0.0.1:{port}", status="running")  # type: ignore[arg-type]
                for tier, port in (("fast", 1), ("standard", 2))
            ]
        )
    assert [d.default for d in registered_deployments()] == [False, False]
    set_default_tier(OPERATOR, "m", "fast")
    assert {d.tier: d.default for d in registered_deployments()} == {"fast": True, "standard": False}
    with pytest.raises(ValueError, match="unknown tier 'turbo'; the tiers are fast, llamacpp, q8, standard"):
        set_default_tier(OPERATOR, "m", "turbo")
    with pytest.raises(PermissionError):
        set_default_tier(Identity("v", Role.viewer), "m", None)
    set_default_tier(OPERATOR, "m", None)
    assert not any(d.default for d in registered_deployments()) and get_model("m").meta == {}


def test_a_deployment_s_log_keeps_its_lines_but_the_polls_it_answered() -> None:
    """Every engine's health and metrics polls, as each logs them, are counted instead of written; a failed poll and
    every other request stay."""
    from posttrain.platform.engines.launcher import LogLines

    kept: list[str] = []
    lines = LogLines(kept.append)
    polls = [
        'INFO:     127.0.0.1:40022 - "GET /health HTTP/1.1" 200 OK',  # uvicorn: the embedded engine
        '(APIServer pid=4242) INFO:     127.0.0.1:5678 - "GET /metrics HTTP/1.1" 200 OK',  # vLLM
        "srv  log_server_r: request: GET /health 127.0.0.1 200",
    ]  # llama-server
    others = [
        'INFO:     127.0.0.1:40022 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
        'INFO:     127.0.0.1:40022 - "GET /health HTTP/1.1" 503 Service Unavailable',
        "srv  log_server_r: request: GET /health 127.0.0.1 503",
        "INFO:     Application startup complete.",
    ]
    for line in polls + others:
        lines(line)
    assert kept == others and lines.polls == 3
