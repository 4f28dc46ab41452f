"""The tier card: every speed tier a host can serve one model in, its speed beside its quality, from one run.

A tier promises the same capability at another speed. :func:`measure_tiers` checks the promise: it starts the
model in every variant (each as a deployment runs it, :func:`~posttrain.platform.serving.jobs.server_command`;
:func:`host_variants` lists what this host can run: the embedded engine's standard, fast and q8 tiers, llama.cpp
when ``llama-server`` is built, vLLM plain, with n-gram speculation and with an fp8 KV cache when vLLM is
installed), then measures them in turn, in interleaved rounds so that the machine's drift lands on all:

- speed: time to the first token of a streamed reply, and completion tokens per second of whole requests, one
  at a time and four at a time, on short chat prompts (each variant's best round, and beside it the median of its
  rounds, each against the standard tier's: best against best, median against median);
- quality: greedy answers to a fixed mixed task set (held-out procedural tasks of several domains and, when
  given, a task set's eval split such as document QA), graded by the tasks' own verifiers: pass@1 with its
  standard error, and the difference from the standard tier, paired task by task, with the difference's
  standard error (clustered by source where tasks share one: a document's questions). A tier whose pass@1 falls more than twice that below standard's is flagged.

The ``measure_tiers`` job runs it for a registered model (the Models & Serving page shows the last one as the
tier card, beside the gateway's routing rules); ``bench/tiers.py`` runs it on the built-in model.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import httpx
from pydantic import BaseModel, ConfigDict, Field

from posttrain.platform.auth import Identity
from posttrain.platform.engines.launcher import ServerProcess, free_port
from posttrain.platform.engines.llamacpp import LlamaCppMissing, find_server
from posttrain.platform.engines.profiles import Engine
from posttrain.platform.engines.vllm import VllmMissing, find_python, server_env
from posttrain.platform.failures import BadInput
from posttrain.platform.jobs.registry import JobKind, register
from posttrain.platform.models.registry import ModelNotFound, get_model
from posttrain.platform.serving.jobs import DeployConfig, server_command
from posttrain.platform.stats import fell_beyond, paired_difference
from posttrain.platform.tasks.episodes import task_messages
from posttrain.platform.tasks.heldout import task_source
from posttrain.platform.tasks.store import load_tasks
from posttrain.platform.verifiers import TaskSpec, default_service
from posttrain.training.config import EvalConfig

if TYPE_CHECKING:
    from posttrain.platform.jobs.context import JobContext

STANDARD = "standard"
SPEED_PROMPTS = (
    "Explain in two sentences why the sky is blue.",
    "Write a short poem about a lighthouse.",
    "List five uses of a paperclip.",
    "Describe how a bicycle works.",
)
# the general check's domains (training.config.GENERAL_DOMAINS) at its difficulty: the built-in model answers about
# a quarter of them as put, so a tier that loses quality shows it (on most domains a small model's pass@1 is near
# zero, and a difference there would be invisible)
DEFAULT_DOMAINS = ("compare.is_greater.int", "list.int.max", "list.int.min", "list.word.count")


class TierVariant(BaseModel):
    """One way to serve the model: a tier of the catalog, on its engine or another, with vLLM overrides."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64)
    tier: str = STANDARD
    engine: Engine | None = None
    vllm_overrides: dict[str, Any] = Field(default_factory=dict)


class MeasureTiersConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1, description="a registered model name")
    variants: list[TierVariant] = Field(default_factory=list, description="empty: every variant this host can run")
    domains: list[str] = Field(
        default_factory=lambda: list(DEFAULT_DOMAINS),
        description="procedural domains of the quality set (their held-out eval split)",
    )
    tasks_per_domain: int = Field(default=48, ge=1, le=1000)
    difficulty: int = Field(default=2, ge=1)
    task_set: str | None = Field(default=None, description="also a stored task set's eval tasks (document QA, ...)")
    task_set_tasks: int = Field(default=32, ge=1, le=10000)
    max_tokens: int = Field(default=64, ge=1, le=4096, description="at most this many tokens an answer")
    speed_max_tokens: int = Field(default=64, ge=8, le=1024)
    rounds: int = Field(
        default=2,
        ge=1,
        le=10,
        description="interleaved speed rounds (each variant's best and their median are reported)",
    )
    seed: int = 0


def host_variants(settings: Any) -> list[TierVariant]:
    """Every variant this host can serve: the embedded tiers always, llama.cpp and vLLM when installed."""
    variants = [TierVariant(name=STANDARD, tier=STANDARD, engine="embedded"),
                TierVariant(name="fast", tier="fast", engine="embedded"),
                TierVariant(name="q8", tier="q8", engine="embedded")]  # fmt: skip
    try:
        find_server(getattr(settings, "llama_server", None))
        variants.append(TierVariant(name="llamacpp", tier="llamacpp", engine="llamacpp"))
    except LlamaCppMissing:
        pass
    try:
        find_python(getattr(settings, "vllm_python", None))
        variants += [TierVariant(name="vllm", tier=STANDARD, engine="vllm"),
                     TierVariant(name="vllm-ngram", tier="fast", engine="vllm"),
                     TierVariant(name="vllm-fp8kv", tier=STANDARD, engine="vllm", vllm_overrides={"kv_cache_dtype": "fp8"})]  # fmt: skip
    except VllmMissing:
        pass
    return variants


def card_tasks(config: MeasureTiersConfig, *, url: str | None = None) -> list[TaskSpec]:
    """The fixed quality set: each domain's held-out eval tasks (seeded), then the task set's eval tasks."""
    from posttrain.training.evaluate import all_eval_tasks  # torch: the job kinds load without it (a plugin)

    tasks = all_eval_tasks(EvalConfig(domains=list(config.domains), tasks_per_domain=config.tasks_per_domain,
                                      difficulty=config.difficulty, seed=config.seed))  # fmt: skip
    if config.task_set is not None:
        stored = load_tasks(task_set=config.task_set, split="eval", limit=config.task_set_tasks, url=url)
        if not stored:
            raise BadInput(f"task set {config.task_set!r} has no eval tasks; build it with an eval fraction above 0")
        tasks += [t.spec for t in stored]
    return tasks


def _chat(
    client: httpx.Client, base: str, model: str, messages: list[dict[str, Any]], max_tokens: int
) -> dict[str, Any]:
    resp = client.post(f"{base}/v1/chat/completions", json={"model": model, "messages": messages, "max_tokens": max_tokens,
                                                             "temperature": 0.0})  # fmt: skip
    resp.raise_for_status()
    return resp.json()


def _first_token_ms(client: httpx.Client, base: str, model: str, prompt: str) -> float:
    start = time.perf_counter()
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 8, "temperature": 0.0,
            "stream": True}  # fmt: skip
    with client.stream("POST", f"{base}/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():  # the first chunk with text (a role-only or empty one comes first on some)
            if line.startswith("data: ") and line != "data: [DONE]":
                if any((c.get("delta") or {}).get("content") for c in json.loads(line[6:]).get("choices", [])):
                    return (time.perf_counter() - start) * 1000
    return (time.perf_counter() - start) * 1000


def measure_speed(client: httpx.Client, base: str, model: str, max_tokens: int) -> dict[str, Any]:
    """Time to first token of each prompt, then completion tokens per second over whole requests: the prompts one
    at a time, then four at a time."""
    ttft = [_first_token_ms(client, base, model, p) for p in SPEED_PROMPTS]
    messages = [[{"role": "user", "content": p}] for p in SPEED_PROMPTS]
    start = time.perf_counter()
    one = sum(_chat(client, base, model, m, max_tokens)["usage"]["completion_tokens"] for m in messages)
    one_s = time.perf_counter() - start
    start = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        four = sum(
            r["usage"]["completion_tokens"]
            for r in pool.map(lambda m: _chat(client, base, model, m, max_tokens), messages)
        )
    four_s = time.perf_counter() - start
    return {"tokens_per_s_1": one / one_s, "tokens_per_s_4": four / four_s, "ttft_ms": ttft}


def answer_tasks(client: httpx.Client, base: str, model: str, tasks: Sequence[TaskSpec], max_tokens: int) -> list[str]:
    """Greedy answers to every task, four requests at a time."""

    def one(task: TaskSpec) -> str:
        return _chat(client, base, model, task_messages(task), max_tokens)["choices"][0]["message"]["content"] or ""

    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(one, tasks))


def quality(passed: Sequence[bool], standard: Sequence[bool], clusters: Sequence[str] | None = None) -> dict[str, Any]:
    """pass@1 and its standard error; the paired difference from standard's and its standard error (clustered by
    ``clusters``, each task's source, where given); the flag: below standard's beyond twice that SE."""
    d = paired_difference(standard, passed, clusters)
    return {"pass_at_1": d.b, "pass_at_1_se": math.sqrt(d.b * (1 - d.b) / d.tasks), "tasks": d.tasks,
            "quality_delta_vs_standard": d.delta, "quality_delta_se": d.se,
            "quality_flag": fell_beyond(d.delta, d.se)}  # fmt: skip


def speed_figures(rounds: Sequence[dict[str, Any]], standard: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A variant's speed over its rounds (:func:`measure_speed`'s results): the best round's tokens/s and the median
    of the rounds', one and four streams, each set against the standard tier's rounds the same way (best against best,
    median against median), every round's figures, and the median time to the first token."""

    def best_and_median(of: Sequence[dict[str, Any]], key: str) -> tuple[float, float]:
        values = [r[key] for r in of]
        return max(values), statistics.median(values)

    (best_1, median_1), (best_4, median_4) = (
        best_and_median(rounds, "tokens_per_s_1"),
        best_and_median(rounds, "tokens_per_s_4"),
    )
    base_best, base_median = best_and_median(standard, "tokens_per_s_1")
    return {"tokens_per_s_1": round(best_1, 1), "tokens_per_s_4": round(best_4, 1),
            "tokens_per_s_1_median": round(median_1, 1), "tokens_per_s_4_median": round(median_4, 1),
            "ttft_p50_ms": round(statistics.median([ms for r in rounds for ms in r["ttft_ms"]]), 1),
            "speedup_1_vs_standard": round(best_1 / base_best, 2),
            "speedup_1_vs_standard_median": round(median_1 / base_median, 2),
            "rounds_tokens_per_s_1": [round(r["tokens_per_s_1"], 1) for r in rounds],
            "rounds_tokens_per_s_4": [round(r["tokens_per_s_4"], 1) for r in rounds]}  # fmt: skip


def measure_tiers(
    identity: Identity,
    config: MeasureTiersConfig,
    settings: Any,
    tasks: Sequence[TaskSpec],
    *,
    url: str | None = None,
    progress: Callable[[float | None, str], None] | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Serve ``config.model`` in every variant, measure speed in interleaved rounds, then quality on ``tasks``;
    the card as a dict (``tiers``: one entry a variant, in the order measured)."""
    try:
        model = get_model(config.model, url=url)
    except ModelNotFound as exc:
        raise BadInput(str(exc)) from None
    variants = config.variants or host_variants(settings)
    if STANDARD not in [v.name for v in variants]:
        raise BadInput(f"the variants must include {STANDARD!r}, the peer every tier's quality is measured against")
    say = progress or (lambda fraction, message: None)
    servers: dict[str, tuple[ServerProcess, str, list[str]]] = {}
    client = httpx.Client(timeout=httpx.Timeout(1800.0, connect=10.0))
    try:
        for i, v in enumerate(variants):
            say(0.05 + 0.15 * i / len(variants), f"starting {v.name}")
            port = free_port("127.0.0.1")
            deploy = DeployConfig(model=model.name, tier=v.tier, engine=v.engine, vllm_overrides=v.vllm_overrides)
            engine, command = server_command(deploy, model, port, settings, identity, url=url)
            started = time.perf_counter()
            env = server_env(cpu_threads=getattr(settings, "job_threads", None)) if engine == "vllm" else None
            server = ServerProcess(command, f"http://127.0.0.1:{port}", env=env).start(600)
            servers[v.name] = (server, engine, command)
            _chat(client, server.base_url, model.name, [{"role": "user", "content": "Hello"}], 4)  # warm-up
            log(f"{v.name}: {engine} up in {time.perf_counter() - started:.0f} s")
        speed: dict[str, list[dict[str, Any]]] = {v.name: [] for v in variants}
        for r in range(config.rounds):
            for v in variants if r % 2 == 0 else variants[::-1]:
                say(0.2 + 0.2 * r / config.rounds, f"speed round {r + 1}: {v.name}")
                speed[v.name].append(
                    measure_speed(client, servers[v.name][0].base_url, model.name, config.speed_max_tokens)
                )
                log(f"round {r + 1} {v.name}: {speed[v.name][-1]['tokens_per_s_1']:.1f} tokens/s, 4 streams "
                    f"{speed[v.name][-1]['tokens_per_s_4']:.1f}")  # fmt: skip
        service = default_service()
        passed: dict[str, list[bool]] = {}
        for i, v in enumerate(variants):
            say(0.4 + 0.6 * i / len(variants), f"quality: {v.name} on {len(tasks)} tasks")
            texts = answer_tasks(client, servers[v.name][0].base_url, model.name, tasks, config.max_tokens)
            passed[v.name] = [verdict.passed for verdict in service.verify_batch(list(tasks), texts)]
            log(f"{v.name}: pass@1 {sum(passed[v.name]) / len(tasks):.3f}")
    finally:
        client.close()
        for server, _, _ in servers.values():
            server.stop()
    sources = [task_source(t) for t in tasks]
    tiers = []
    for v in variants:
        tiers.append({
            "name": v.name, "tier": v.tier, "engine": servers[v.name][1], "vllm_overrides": v.vllm_overrides,
            **speed_figures(speed[v.name], speed[STANDARD]),
            **{k: round(x, 4) if isinstance(x, float) else x for k, x in quality(passed[v.name], passed[STANDARD], sources).items()},
        })  # fmt: skip
    domains = sorted({t.domain for t in tasks})
    return {"model": model.name, "tasks": len(tasks), "domains": domains, "max_tokens": config.max_tokens,
            "rounds": config.rounds, "speed_prompts": len(SPEED_PROMPTS), "tiers": tiers}  # fmt: skip


def measure_tiers_job(ctx: JobContext, config: Any) -> dict[str, Any]:
    return measure_tiers(ctx.identity, config, ctx.settings, card_tasks(config, url=ctx.url), url=ctx.url,
                         progress=lambda f, m: ctx.progress(f, m, force=True), log=ctx.log.info)  # fmt: skip


register(
    JobKind(
        name="measure_tiers",
        config_model=MeasureTiersConfig,
        run=measure_tiers_job,
        description="Serve a model in every tier this host can run and measure each one's speed beside its quality "
        "(the tier card on the Models page).",
    )
)
