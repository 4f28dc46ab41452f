"""Serving benchmark: fast tier vs standard tier, time to first token, the gateway's added latency,
and for a real model throughput at 16 streams and memory; or, with ``--engines``, the CPU engines.

    .venv/bin/python bench/serving.py [--prompts 12] [--max-tokens 64] [--tune-steps 500 | 0]
    .venv/bin/python bench/serving.py --model smollm2-135m-instruct [--prompts 12] [--max-tokens 64]
    .venv/bin/python bench/serving.py --model smollm2-135m-instruct --engines embedded,llamacpp

``--engines``: each engine's server runs as a deployment runs it, beside its peer (the embedded engine's
q8 tier beside the fp32 standard tier; the llamacpp tier's llama-server command on the model's Q8_0 GGUF
beside ``llama-server -m FILE`` with llama.cpp's defaults); the two are measured in turn, in interleaved
rounds (``--engine-rounds``, each one's best round counts), on the same short chat prompts, greedy, one
request at a time and four at a time. The summary ``serving-engines``
has each engine's tokens/s and how often two engines' greedy replies are the same text.

Default workload: builds a small Qwen2 model locally (hidden 128, 2 layers) and teaches it to
quote from documents (tests/drills.py ``teach_quoting``: a copy drill that forms
induction heads, then a stream of fresh random documents with "quote the sentence that begins
with ..." questions; a few minutes of CPU). The benchmark prompts are documents generated with
another seed and checked to be absent from the training stream: the model has never seen them,
so an answer copied from its document is the model reading it. ``--tune-steps 0`` skips the
teaching: the random-init model's greedy output loops, and prompt lookup then drafts from its
own repetition rather than from the document (quick, but not a document-QA workload; labelled so).

``--model REF`` (a registered model, a model directory, or a built-in name, imported for the run
when it is not registered): the real model answers the document-QA tasks the platform builds from
Debian's LaTeX news PDFs (``ltnews*.pdf``, preprocessed and turned into tasks in process by the
task builder: the page's text in the prompt, a question about it), so prompt lookup drafts from
a real document. The summary is then ``serving-real``.

Both tiers serve the same weights in the same process, get the same warm-up and the same prompts,
one streamed request at a time; gateway and direct requests alternate. Prints one JSON object per
figure, with its peer measured in the same run; the last line holds every figure, with ``peer``
(the standard tier's setting) and ``gateway_peer`` (direct requests).
"""

from __future__ import annotations

import os
import sys

# Running ``python bench/serving.py`` puts bench/ first on sys.path, where sibling benchmarks
# (bench/queue.py) would shadow standard-library modules: take it off before importing anything.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import hashlib
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from posttrain.platform.engines import DEFAULT_TIERS, EngineConfig, ServerProcess, free_port, load_model
from posttrain.platform.models import TinyModelSpec, build_tiny_model
from posttrain.platform.serving import Deployment, EmbeddedEngine, GatewayConfig, create_engine_app, serve_in_thread

# The quoting drill is the tests' (tests/drills.py), shared with this benchmark.
sys.path.append(str(Path(__file__).resolve().parent.parent / "tests"))
from drills import QuotingRecipe, QuotingRun, quote_cases, teach_quoting

EVAL_SEED = 1_000_003  # the benchmark's documents; the training stream draws from QuotingRecipe.seed (+1)
DOCUMENTS = sorted(Path("/usr/share/doc/texlive-doc/latex/base").glob("ltnews*.pdf"))


def chat(
    client: httpx.Client,
    url: str,
    model: str,
    messages: list[dict],
    max_tokens: int,
    headers: dict[str, str] | None = None,
) -> dict:
    r = client.post(
        f"{url}/v1/chat/completions",
        headers=headers,
        json={"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0},
    )
    r.raise_for_status()
    return r.json()


@dataclass
class Streamed:
    text: str
    tokens: int
    ttft_s: float
    seconds: float


def stream_chat(client: httpx.Client, url: str, model: str, messages: list[dict], max_tokens: int) -> Streamed:
    """One streamed greedy chat request: its text, completion tokens, time to first content and total time."""
    start, first, parts, usage = time.perf_counter(), None, [], {}
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                if choice["delta"].get("content"):
                    first = first or time.perf_counter()
                    parts.append(choice["delta"]["content"])
    end = time.perf_counter()
    return Streamed("".join(parts), int(usage.get("completion_tokens", 0)), (first or end) - start, end - start)


@dataclass
class Case:
    messages: list[dict]
    answer: str | None  # the reference answer
    task: object | None = None  # the TaskSpec whose verifier judges the answer (document QA)


@dataclass
class Workload:
    path: str
    name: str
    cases: list[Case]
    description: str
    figures: dict = field(default_factory=dict)  # what building the workload measured (teaching, import)


def tiny_workload(args: argparse.Namespace, tmp: Path) -> Workload:
    """The taught quoting model on unseen generated documents (or the random-init one)."""
    cases = quote_cases(args.prompts, seed=EVAL_SEED)
    recipe = QuotingRecipe(quote_steps=args.tune_steps) if args.tune_steps > 0 else None
    path = build_tiny_model(
        tmp / "bench-qwen2",
        TinyModelSpec(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256),
    )
    t0 = time.perf_counter()
    run: QuotingRun | None = None
    seen: set[str] = set()
    if recipe is not None:

        def progress(step: int, loss: float) -> None:
            if step % 100 == 0:
                print(
                    f"tune step {step + 1} loss {loss:.3f} {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True
                )

        run = teach_quoting(path, recipe, on_step=progress, seen_documents=seen)
    tune: dict[str, object] = {
        "tune_steps": len(run.losses) if run else 0,
        "tune_seconds": round(time.perf_counter() - t0, 1),
        "prompts_unseen_in_training": sum(c.document not in seen for c in cases),
    }
    if run is not None:
        tune.update(
            {
                "tune_drill_steps": len(run.drill_losses),
                "tune_drill_mastered": run.drill_mastered,
                "tune_quote_steps": len(run.quote_losses),
                "tune_quote_loss_first_last": [
                    round(run.quote_losses[0], 3),
                    round(statistics.fmean(run.quote_losses[-20:]), 3),
                ],
            }
        )
    description = (
        "document QA on unseen documents, model taught to quote"
        if recipe is not None
        else "random-init model: drafts come from its own repetitive output, not the document"
    )
    return Workload(
        str(path), "bench", [Case([{"role": "user", "content": c.prompt}], c.answer) for c in cases], description, tune
    )


def document_cases(count: int, seed: int = 0) -> list[Case]:
    """Document-QA tasks built from Debian's LaTeX news PDFs by the platform's task builder, in
    process (preprocess, pages, questions): text questions, at most two per page, taking turns
    across documents."""
    from posttrain.platform.db.models import Document, Page
    from posttrain.platform.documents import _layout_json
    from posttrain.platform.tasks.builders import build_from_pages
    from posttrain.preprocess.options import PreprocessOptions
    from posttrain.preprocess.pipeline import process_document

    if not DOCUMENTS:
        raise SystemExit(
            "no /usr/share/doc/texlive-doc/latex/base/ltnews*.pdf: install texlive-latex-base-doc (make system-deps)"
        )
    per_document: list[list[Case]] = []
    for number, pdf in enumerate(DOCUMENTS[: max(2, count // 3)], start=1):
        pages = [
            Page(
                document_id=number,
                page_no=p.page_number - 1,
                width=p.width,
                height=p.height,
                text=p.text,
                markdown=p.markdown or "",
                layout=_layout_json(p),
            )
            for p in process_document(pdf, PreprocessOptions())
        ]
        document = Document(id=number, sha256=hashlib.sha256(pdf.read_bytes()).hexdigest(), filename=pdf.name,
                            storage_path=str(pdf))  # fmt: skip
        cases, pages_used = [], []
        for spec in build_from_pages(document, pages, max_per_document=24, seed=seed):
            page = spec.provenance.get("page")
            if spec.verifier.kind == "doc_qa" and pages_used.count(page) < 2:
                pages_used.append(page)
                cases.append(Case([m.model_dump(exclude_none=True) for m in spec.prompt], spec.reference, spec))
        per_document.append(cases)
    out: list[Case] = []
    while len(out) < count and any(per_document):
        for cases in per_document:
            if cases and len(out) < count:
                out.append(cases.pop(0))
    return out


def real_workload(args: argparse.Namespace, tmp: Path) -> Workload:
    """The named model (imported for this run into ``tmp`` when it is not registered) on document QA."""
    from posttrain.platform.auth import Identity
    from posttrain.platform.db import migrate
    from posttrain.platform.db.models import Role
    from posttrain.platform.models.importer import BUILTIN_PREFIX, import_model
    from posttrain.platform.models.registry import get_model

    t0, ref = time.perf_counter(), args.model
    if Path(ref).is_dir():
        path, name = str(Path(ref).resolve()), Path(ref).name
    else:
        name = ref.removeprefix(BUILTIN_PREFIX)
        try:
            path = get_model(name).path
        except Exception:  # not registered, or no platform database here: import it for this run only
            url = f"sqlite:///{tmp / 'bench.db'}"
            migrate.upgrade(url)
            path = import_model(
                Identity("bench", Role.operator), f"{BUILTIN_PREFIX}{name}", url=url, dest_root=tmp / "models"
            ).path
    return Workload(
        path,
        name,
        document_cases(args.prompts),
        "document QA: questions about Debian's LaTeX news PDFs (tasks built by the platform)",
        {"model_ready_seconds": round(time.perf_counter() - t0, 1)},
    )


def answers_correct(cases: list[Case], texts: list[str]) -> tuple[int, str]:
    """How many answers are right: by the task's verifier (document QA), else the quoted sentence
    verbatim and nothing else."""
    if all(c.task is not None for c in cases):
        from posttrain.platform.verifiers import default_service

        return sum(
            v.passed for v in default_service().verify_batch([c.task for c in cases], texts)
        ), "the doc_qa verifier"
    for c, t in zip(cases, texts):
        if t.strip() != c.answer:
            print(f"not quoted verbatim: wanted {c.answer!r}, got {t!r}", file=sys.stderr)
    return sum(t.strip() == c.answer for c, t in zip(cases, texts)), "quoted verbatim"


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


# short chat requests for the concurrency figure: long document prompts would measure prompt processing
CHAT_PROMPTS = [
    "What is the capital of France?",
    "Name three primary colours.",
    "Write a haiku about the sea.",
    "Explain what a CPU does in one sentence.",
    "Give me a synonym for happy.",
    "What is 7 times 8?",
    "List the days of the week.",
    "What does HTML stand for?",
    "Suggest a name for a black cat.",
    "Why is the sky blue?",
    "Translate 'good morning' into Spanish.",
    "What is the boiling point of water?",
    "Describe a rainbow in two sentences.",
    "Who wrote Romeo and Juliet?",
    "What is photosynthesis?",
    "Give one tip for sleeping well.",
]


def concurrent_streams(client: httpx.Client, url: str, model: str, streams: int, max_tokens: int) -> dict:
    """The chat prompts one at a time, then ``streams`` at once: completion tokens per second over
    the wall time of each."""
    picked = [[{"role": "user", "content": CHAT_PROMPTS[i % len(CHAT_PROMPTS)]}] for i in range(streams)]
    start = time.perf_counter()
    one = sum(stream_chat(client, url, model, m, max_tokens).tokens for m in picked)
    one_s = time.perf_counter() - start
    start = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        many = sum(d.tokens for d in pool.map(lambda m: stream_chat(client, url, model, m, max_tokens), picked))
    many_s = time.perf_counter() - start
    return {"one_stream_tokens_per_s": one / one_s, "tokens_per_s": many / many_s, "tokens": many}


@dataclass
class EngineRun:
    tokens_per_s_1: float
    tokens_per_s_4: float
    texts: list[str]
    command: list[str]
    rounds_1: list[float]
    rounds_4: list[float]


def measure_round(
    client: httpx.Client, base_url: str, model: str, prompts: list[str], max_tokens: int
) -> tuple[float, float, list[str]]:
    """The prompts one at a time (greedy; their texts kept), then the same prompts four at a time: completion
    tokens over wall time, whole requests (prompt processing included)."""
    start, texts, tokens = time.perf_counter(), [], 0
    for p in prompts:
        reply = chat(client, base_url, model, [{"role": "user", "content": p}], max_tokens)
        texts.append(reply["choices"][0]["message"]["content"] or "")
        tokens += reply["usage"]["completion_tokens"]
    one = tokens / (time.perf_counter() - start)
    start = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda p: chat(client, base_url, model, [{"role": "user", "content": p}], max_tokens),
                                prompts))  # fmt: skip
    four = sum(r["usage"]["completion_tokens"] for r in replies) / (time.perf_counter() - start)
    return one, four, texts


def measure_pair(
    commands: dict[str, tuple[list[str], int]],
    model: str,
    prompts: list[str],
    max_tokens: int,
    rounds: int,
    env: dict[str, str] | None = None,
) -> dict[str, EngineRun]:
    """An engine and its peer started side by side (an idle server waits without computing), warmed up, then
    measured in turn, ``rounds`` times, the order swapped each round, so that the machine's drift lands on both:
    each one's best round."""
    servers = {}
    client = httpx.Client(timeout=1800)
    try:
        for name, (command, port) in commands.items():
            servers[name] = ServerProcess(command, f"http://127.0.0.1:{port}", env=env).start(600)
            chat(client, f"http://127.0.0.1:{port}", model, [{"role": "user", "content": prompts[0]}], 8)
        measured: dict[str, list[tuple[float, float, list[str]]]] = {name: [] for name in commands}
        for r in range(rounds):
            for name in list(commands) if r % 2 == 0 else list(commands)[::-1]:
                measured[name].append(
                    measure_round(client, f"http://127.0.0.1:{commands[name][1]}", model, prompts, max_tokens)
                )
                one, four, _ = measured[name][-1]
                print(json.dumps({"engine": name, "round": r + 1, "tokens_per_s_1": round(one, 1),
                                  "tokens_per_s_4": round(four, 1)}), flush=True)  # fmt: skip
    finally:
        client.close()
        for server in servers.values():
            server.stop()
    return {name: EngineRun(max(m[0] for m in runs), max(m[1] for m in runs), runs[0][2], commands[name][0],
                            [round(m[0], 1) for m in runs], [round(m[1], 1) for m in runs])
            for name, runs in measured.items()}  # fmt: skip


def engines_comparison(args: argparse.Namespace, work: Workload, tmp: Path) -> None:
    """The embedded engine (Q8_0 weights, the q8 tier) beside its fp32 standard tier (today's figure), then llama.cpp
    (the llamacpp tier's deployment command) beside llama-server as a person would start it on the same file; each
    pair side by side, measured in interleaved rounds, on the same short chat prompts."""
    from posttrain.platform.engines.llamacpp import LlamaCppProfile, find_server
    from posttrain.platform.models.exporter import export_model

    wanted = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = set(wanted) - {"embedded", "llamacpp"}
    if unknown:
        raise SystemExit(f"--engines: unknown {', '.join(sorted(unknown))}; choose from embedded, llamacpp")
    prompts = [CHAT_PROMPTS[i % len(CHAT_PROMPTS)] for i in range(args.engine_prompts)]
    threads = str(max(1, (os.cpu_count() or 1) // 2))  # an embedded deployment's torch threads: cores over two slots
    runs: dict[str, EngineRun] = {}
    if "embedded" in wanted:
        commands = {}
        for name, tier in (("embedded", "q8"), ("embedded_fp32", "standard")):
            port = free_port()
            commands[name] = ([sys.executable, "-m", "posttrain.platform.serving", "--model", work.path,
                               "--served-model-name", work.name, "--port", str(port), "--tier", tier], port)  # fmt: skip
        runs.update(measure_pair(commands, work.name, prompts, args.engine_max_tokens, args.engine_rounds,
                                 {"OMP_NUM_THREADS": threads}))  # fmt: skip
    if "llamacpp" in wanted:
        binary = find_server()
        gguf = tmp / f"{work.name}.Q8_0.gguf"
        export_model(work.path, gguf, "gguf", outtype="q8_0")
        deployed = LlamaCppProfile.for_tier(gguf, DEFAULT_TIERS["llamacpp"], served_model_name=work.name,
                                            ctx_per_slot=4096)  # as the deploy job starts it, threads unset  # fmt: skip
        ports = free_port(), free_port()
        commands = {
            "llamacpp": (deployed.model_copy(update={"port": ports[0]}).to_args(binary), ports[0]),
            "llamacpp_by_hand": ([str(binary), "-m", str(gguf), "--port", str(ports[1])], ports[1]),
        }
        runs.update(measure_pair(commands, work.name, prompts, args.engine_max_tokens, args.engine_rounds))
    for name, run in runs.items():
        print(json.dumps({"engine": name, "tokens_per_s_1": round(run.tokens_per_s_1, 1), "rounds_1": run.rounds_1,
                          "tokens_per_s_4": round(run.tokens_per_s_4, 1), "rounds_4": run.rounds_4,
                          "command": " ".join(run.command)}), flush=True)  # fmt: skip

    def agreement(a: str, b: str) -> float | None:
        if a not in runs or b not in runs:
            return None
        return round(sum(x == y for x, y in zip(runs[a].texts, runs[b].texts)) / len(prompts), 3)

    summary: dict[str, object] = {"figure": "serving-engines", "model": work.name, "engines": wanted}
    for name, run in runs.items():
        summary[f"{name}_tokens_per_s_1"] = round(run.tokens_per_s_1, 1)
        summary[f"{name}_tokens_per_s_4"] = round(run.tokens_per_s_4, 1)
    if "embedded" in runs and "embedded_fp32" in runs:
        summary["embedded_speedup_vs_fp32_1"] = round(
            runs["embedded"].tokens_per_s_1 / runs["embedded_fp32"].tokens_per_s_1, 2
        )
    if "embedded" in runs and "llamacpp" in runs:
        summary["embedded_vs_llamacpp_1"] = round(runs["embedded"].tokens_per_s_1 / runs["llamacpp"].tokens_per_s_1, 2)
    if "llamacpp" in runs:
        summary["llamacpp_vs_by_hand_1"] = round(
            runs["llamacpp"].tokens_per_s_1 / runs["llamacpp_by_hand"].tokens_per_s_1, 2
        )
        summary["llamacpp_vs_by_hand_4"] = round(
            runs["llamacpp"].tokens_per_s_4 / runs["llamacpp_by_hand"].tokens_per_s_4, 2
        )
    summary["engine_agreement"] = agreement("embedded", "llamacpp")
    summary["agreement_embedded_fp32_vs_q8"] = agreement("embedded_fp32", "embedded")
    summary["agreement_embedded_fp32_vs_llamacpp"] = agreement("embedded_fp32", "llamacpp")
    summary.update({"prompts": len(prompts), "max_tokens": args.engine_max_tokens, "embedded_threads": int(threads),
                    "workload": f"{len(prompts)} short chat prompts, greedy, whole requests one at a time "
                                "(tokens_per_s_1) and four at a time (tokens_per_s_4)",
                    "agreement": "share of the prompts whose greedy replies are equal text",
                    "peer": {"name": "each engine beside its own peer, started side by side and measured in turn, "
                                     f"the best of {args.engine_rounds} interleaved rounds each, same prompts",
                             "embedded": "embedded_fp32 (the standard tier: the model's own weights, same threads)",
                             "llamacpp": "llamacpp_by_hand (llama-server -m FILE, its defaults)",
                             "warmup_requests": 1, "rounds": args.engine_rounds}})  # fmt: skip
    print(json.dumps(summary))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--model",
        default=None,
        help="a registered model, a model directory or a built-in name "
        "(smollm2-135m-instruct); default: the taught tiny quoting model",
    )
    parser.add_argument("--prompts", type=int, default=12)
    recipe = QuotingRecipe()
    parser.add_argument(
        "--tune-steps",
        type=int,
        default=recipe.quote_steps,
        help=f"(tiny model) document-question steps after a copy drill of at most {recipe.max_drill_steps} "
        "steps (two to four minutes of CPU in all). 0 skips teaching and serves the random-init model, "
        "whose greedy output loops: its drafts then come from its own repeated output, not from "
        "the document",
    )
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--overhead-requests", type=int, default=60)
    parser.add_argument(
        "--streams",
        type=int,
        default=16,
        help="(--model) concurrent short chat streams for the "
        "throughput figure, against the same prompts one at a time",
    )
    parser.add_argument(
        "--engines",
        default=None,
        help="(--model) compare engines instead of tiers: embedded "
        "(the q8 tier, beside the fp32 standard tier) and/or llamacpp (the llamacpp tier's deployment, "
        "beside llama-server started by hand on the same GGUF), e.g. embedded,llamacpp",
    )
    parser.add_argument("--engine-prompts", type=int, default=12)
    parser.add_argument("--engine-max-tokens", type=int, default=128)
    parser.add_argument(
        "--engine-rounds", type=int, default=3, help="(--engines) interleaved rounds per engine and peer"
    )
    args = parser.parse_args()
    if args.engines and not args.model:
        parser.error("--engines needs --model (a real model: the tiny one is not a GGUF-exportable chat model)")

    with tempfile.TemporaryDirectory() as tmp:
        if args.engines:
            engines_comparison(args, real_workload(args, Path(tmp)), Path(tmp))
            return
        work = real_workload(args, Path(tmp)) if args.model else tiny_workload(args, Path(tmp))
        cases, model = work.cases, work.name
        rss_before = rss_mb()
        loaded = load_model(work.path)
        params = sum(p.numel() for p in loaded.model.parameters())
        engines = {
            tier: EmbeddedEngine(
                EngineConfig(
                    model_path=work.path,
                    served_model_name=model,
                    tier=DEFAULT_TIERS[tier],
                    max_model_len=None if args.model else 2048,
                ),
                loaded=loaded,
            ).start()
            for tier in ("fast", "standard")
        }
        servers = {tier: serve_in_thread(create_engine_app(e)) for tier, e in engines.items()}
        # the gateway runs in its own process, as deployed, so it does not share the engines' GIL
        config_file = Path(tmp) / "gateway.json"
        config_file.write_text(
            GatewayConfig(
                deployments=[Deployment(model=model, tier=t, base_url=s.base_url) for t, s in servers.items()]
            ).model_dump_json()
        )
        port = free_port()
        gateway = ServerProcess(
            [
                sys.executable,
                "-m",
                "posttrain.platform.serving.gateway",
                "--config",
                str(config_file),
                "--port",
                str(port),
                "--no-api-keys",
            ],  # no database here
            f"http://127.0.0.1:{port}",
        ).start(120)
        client = httpx.Client(timeout=1800)
        many: dict | None = None
        try:
            for server in servers.values():  # warm-up
                chat(client, server.base_url, model, cases[0].messages, 4)
            results: dict[str, dict] = {}
            for tier in ("standard", "fast"):
                runs = [stream_chat(client, servers[tier].base_url, model, c.messages, args.max_tokens) for c in cases]
                tokens, elapsed = sum(r.tokens for r in runs), sum(r.seconds for r in runs)
                decoding = sum(r.seconds - r.ttft_s for r in runs)  # after the first token: what speculation speeds up
                results[tier] = {
                    "texts": [r.text for r in runs],
                    "tokens": tokens,
                    "seconds": elapsed,
                    "tokens_per_s": tokens / elapsed,
                    "ttft_ms": [r.ttft_s * 1000 for r in runs],
                    "decode_tokens_per_s": sum(max(0, r.tokens - 1) for r in runs) / decoding,
                }
            if args.model:
                many = concurrent_streams(client, servers["standard"].base_url, model, args.streams, args.max_tokens)
            peak_rss = rss_mb()
            fast_m, std = engines["fast"].metrics, results["standard"]
            correct, judged_by = answers_correct(cases, std["texts"])

            direct, via_gateway = [], []
            q = [{"role": "user", "content": "What is the total?"}]
            for i in range(args.overhead_requests):
                for target in (
                    ("direct", servers["standard"].base_url, None),
                    ("gateway", gateway.base_url, {"x-task-type": "batch"}),
                )[:: 1 if i % 2 else -1]:
                    t = time.perf_counter()
                    chat(client, target[1], model, q, 1, target[2])
                    (direct if target[0] == "direct" else via_gateway).append((time.perf_counter() - t) * 1000)
        finally:
            client.close()
            gateway.stop()
            for s in servers.values():
                s.stop()
            for e in engines.values():
                e.stop()

    fast_tps, std_tps = results["fast"]["tokens_per_s"], std["tokens_per_s"]
    fast_dec, std_dec = results["fast"]["decode_tokens_per_s"], std["decode_tokens_per_s"]
    identical = results["fast"]["texts"] == std["texts"]
    same = sum(a == b for a, b in zip(results["fast"]["texts"], std["texts"]))
    p50_direct, p50_gateway = statistics.median(direct), statistics.median(via_gateway)
    overhead = p50_gateway - p50_direct
    acceptance = fast_m.accepted_tokens / fast_m.draft_tokens if fast_m.draft_tokens else 0.0
    ttft = std["ttft_ms"]
    ttft_p50, ttft_p95 = round(statistics.median(ttft), 1), round(percentile(ttft, 0.95), 1)
    figures = [
        {
            "figure": "fast_tokens_per_s",
            "value": round(fast_tps, 1),
            "peer": "standard_tokens_per_s",
            "peer_value": round(std_tps, 1),
            "speedup": round(fast_tps / std_tps, 2),
            "outputs_identical": identical,
            "outputs_identical_count": f"{same}/{len(cases)}",
            "workload": work.description,
            "note": "whole requests, prompt processing included (the same in both tiers)",
        },
        {
            "figure": "fast_decode_tokens_per_s",
            "value": round(fast_dec, 1),
            "peer": "standard_decode_tokens_per_s",
            "peer_value": round(std_dec, 1),
            "speedup": round(fast_dec / std_dec, 2),
            "note": "after the first token, where speculative decoding acts",
        },
        {
            "figure": "gateway_p50_ms",
            "value": round(p50_gateway, 2),
            "peer": "direct_p50_ms",
            "peer_value": round(p50_direct, 2),
            "overhead_p50_ms": round(overhead, 2),
        },
        {
            "figure": "fast_tier_draft_acceptance",
            "value": round(acceptance, 3),
            "answers_correct": f"{correct}/{len(cases)}",
            "answers_judged_by": judged_by,
            **work.figures,
        },
        {"figure": "ttft_ms", "p50": ttft_p50, "p95": ttft_p95, "tier": "standard", "concurrency": 1},
    ]
    if many is not None:
        figures.append(
            {
                "figure": f"tokens_per_s_{args.streams}_streams",
                "value": round(many["tokens_per_s"], 1),
                "peer": "tokens_per_s_1_stream (the same short chat prompts one at a time)",
                "peer_value": round(many["one_stream_tokens_per_s"], 1),
                "ratio": round(many["tokens_per_s"] / many["one_stream_tokens_per_s"], 2),
                "tier": "standard",
                "workload": f"{len(CHAT_PROMPTS)} short chat prompts, {args.max_tokens} tokens at most",
            }
        )
    for f in figures:
        print(json.dumps(f))
    peer = {
        "name": "standard tier (same weights and engine, no speculative decoding)",
        "warmup_requests": 1,
        "prompts": len(cases),
        "max_tokens": args.max_tokens,
        "concurrency": 1,
        "rounds": 1,
    }
    gateway_peer = {
        "name": "direct to the deployment (no gateway)",
        "requests": args.overhead_requests,
        "order": "alternating with the gateway's",
        "max_tokens": 1,
    }
    summary = {
        "figure": "serving-real" if args.model else "serving",
        "model": model,
        "model_params": params,
        "fast_tokens_per_s": round(fast_tps, 1),
        "standard_tokens_per_s": round(std_tps, 1),
        "speedup": round(fast_tps / std_tps, 2),
        "outputs_identical": identical,
        "outputs_identical_count": same,
        "fast_decode_tokens_per_s": round(fast_dec, 1),
        "standard_decode_tokens_per_s": round(std_dec, 1),
        "decode_speedup": round(fast_dec / std_dec, 2),
        "ttft_p50_ms": ttft_p50,
        "ttft_p95_ms": ttft_p95,
        "gateway_overhead_p50_ms": round(overhead, 2),
        "gateway_p50_ms": round(p50_gateway, 2),
        "direct_p50_ms": round(p50_direct, 2),
        "completion_tokens": results["fast"]["tokens"],
        "prompts": len(cases),
        "draft_acceptance": round(acceptance, 3),
        "answers_correct": correct,
        "answers_judged_by": judged_by,
        "rss_mb": round(peak_rss),
        "rss_before_model_mb": round(rss_before),
        "workload": work.description,
        **work.figures,
        "peer": peer,
        "gateway_peer": gateway_peer,
    }
    if many is not None:
        summary[f"tokens_per_s_{args.streams}_streams"] = round(many["tokens_per_s"], 1)
        summary["tokens_per_s_1_stream"] = round(many["one_stream_tokens_per_s"], 1)
        summary["streams"] = args.streams
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
