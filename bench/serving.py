"""Serving benchmark: fast tier vs standard tier, and the gateway's added latency.

    .venv/bin/python bench/serving.py [--prompts 12] [--max-tokens 64] [--tune-steps 500 | 0]

Builds a small Qwen2 model locally (hidden 128, 2 layers) and teaches it to
quote from documents (platform/models/tuning.py ``teach_quoting``: a copy
drill that forms induction heads, then a stream of fresh random documents
with "quote the sentence that begins with ..." questions; a few minutes of
CPU). The benchmark prompts are documents generated with another seed and
checked to be absent from the training stream: the model has never seen
them, so an answer copied from its document is the model reading it. The
same weights serve in the fast tier (prompt-lookup speculation) and the
standard tier, with a gateway in front. Prints one JSON object per figure,
with its peer measured in the same run; the last line holds every figure, with
``peer`` (the standard tier's setting) and ``gateway_peer`` (direct requests).
Both tiers get the same warm-up (one 4-token request) and the same prompts,
one request at a time; gateway and direct requests alternate.

``--tune-steps 0`` skips the teaching: the random-init model's greedy output
loops, and prompt lookup then drafts from its own repetition rather than
from the document (quick, but not a document-QA workload; labelled so).
"""

from __future__ import annotations

import os
import sys

# Running ``python bench/serving.py`` puts bench/ first on sys.path, where sibling benchmarks
# (bench/queue.py) would shadow standard-library modules: take it off before importing anything.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import json
import socket
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from posttrain.platform.models import TinyModelSpec, build_tiny_model, load_model
from posttrain.platform.models.tuning import QuotingRecipe, QuotingRun, quote_cases, teach_quoting
from posttrain.platform.serving import (
    DEFAULT_TIERS,
    Deployment,
    EmbeddedEngine,
    EngineConfig,
    GatewayConfig,
    ServerProcess,
    create_engine_app,
    serve_in_thread,
)

EVAL_SEED = 1_000_003  # the benchmark's documents; the training stream draws from QuotingRecipe.seed (+1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def chat(client: httpx.Client, url: str, model: str, prompt: str, max_tokens: int,
         headers: dict[str, str] | None = None) -> dict:
    r = client.post(f"{url}/v1/chat/completions", headers=headers, json={
        "model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
        "temperature": 0})
    r.raise_for_status()
    return r.json()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=12)
    recipe = QuotingRecipe()
    parser.add_argument("--tune-steps", type=int, default=recipe.quote_steps,
                        help=f"document-question steps after a copy drill of at most {recipe.max_drill_steps} steps "
                             "(two to four minutes of CPU in all). 0 skips teaching and serves the random-init model, "
                             "whose greedy output loops: its drafts then come from its own repeated output, not from "
                             "the document")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--overhead-requests", type=int, default=60)
    args = parser.parse_args()

    cases = quote_cases(args.prompts, seed=EVAL_SEED)
    taught = args.tune_steps > 0
    recipe = QuotingRecipe(quote_steps=args.tune_steps) if taught else None
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_model(Path(tmp) / "bench-qwen2", TinyModelSpec(
            hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256))
        t0 = time.perf_counter()
        run: QuotingRun | None = None
        seen: set[str] = set()
        if recipe is not None:
            def progress(step: int, loss: float) -> None:
                if step % 100 == 0:
                    print(f"tune step {step + 1} loss {loss:.3f} {time.perf_counter() - t0:.0f}s", file=sys.stderr,
                          flush=True)
            run = teach_quoting(path, recipe, on_step=progress, seen_documents=seen)
        tune_s = time.perf_counter() - t0
        unseen = sum(c.document not in seen for c in cases)
        loaded = load_model(path)
        engines = {
            tier: EmbeddedEngine(EngineConfig(model_path=str(path), served_model_name="bench",
                                              tier=DEFAULT_TIERS[tier], max_model_len=2048), loaded=loaded).start()
            for tier in ("fast", "standard")
        }
        servers = {tier: serve_in_thread(create_engine_app(e)) for tier, e in engines.items()}
        # the gateway runs in its own process, as deployed, so it does not share the engines' GIL
        config_file = Path(tmp) / "gateway.json"
        config_file.write_text(GatewayConfig(deployments=[
            Deployment(model="bench", tier=t, base_url=s.base_url) for t, s in servers.items()]).model_dump_json())
        port = free_port()
        gateway = ServerProcess([sys.executable, "-m", "posttrain.platform.serving.gateway", "--config",
                                 str(config_file), "--port", str(port)], f"http://127.0.0.1:{port}").start(120)
        client = httpx.Client(timeout=600)
        try:
            for tier, server in servers.items():  # warm-up
                chat(client, server.base_url, "bench", cases[0].prompt, 4)
            results: dict[str, dict] = {}
            for tier in ("standard", "fast"):
                texts, tokens, start = [], 0, time.perf_counter()
                for case in cases:
                    out = chat(client, servers[tier].base_url, "bench", case.prompt, args.max_tokens)
                    texts.append(out["choices"][0]["message"]["content"])
                    tokens += out["usage"]["completion_tokens"]
                elapsed = time.perf_counter() - start
                results[tier] = {"texts": texts, "tokens": tokens, "seconds": elapsed,
                                 "tokens_per_s": tokens / elapsed}
            fast_m, std = engines["fast"].metrics, results["standard"]
            # an answer counts when it is the quoted sentence, verbatim, and nothing else
            copied = sum(t.strip() == c.answer for c, t in zip(cases, std["texts"]))
            for c, t in zip(cases, std["texts"]):
                if t.strip() != c.answer:
                    print(f"not quoted verbatim: wanted {c.answer!r}, got {t!r}", file=sys.stderr)

            direct, via_gateway = [], []
            q = "What is the total?"
            for i in range(args.overhead_requests):
                for target in (("direct", servers["standard"].base_url, None),
                               ("gateway", gateway.base_url, {"x-task-type": "batch"}))[:: 1 if i % 2 else -1]:
                    t = time.perf_counter()
                    chat(client, target[1], "bench", q, 1, target[2])
                    (direct if target[0] == "direct" else via_gateway).append((time.perf_counter() - t) * 1000)
        finally:
            client.close()
            gateway.stop()
            for s in servers.values():
                s.stop()
            for e in engines.values():
                e.stop()

    fast_tps, std_tps = results["fast"]["tokens_per_s"], std["tokens_per_s"]
    identical = results["fast"]["texts"] == std["texts"]
    p50_direct, p50_gateway = statistics.median(direct), statistics.median(via_gateway)
    overhead = p50_gateway - p50_direct
    acceptance = fast_m.accepted_tokens / fast_m.draft_tokens if fast_m.draft_tokens else 0.0
    workload = ("document QA on unseen documents, model taught to quote" if taught
                else "random-init model: drafts come from its own repetitive output, not the document")
    tune: dict[str, object] = {"tune_steps": len(run.losses) if run else 0, "tune_seconds": round(tune_s, 1)}
    if run is not None:
        tune.update({
            "tune_drill_steps": len(run.drill_losses), "tune_drill_mastered": run.drill_mastered,
            "tune_quote_steps": len(run.quote_losses),
            "tune_quote_loss_first_last": [round(run.quote_losses[0], 3), round(statistics.fmean(run.quote_losses[-20:]), 3)]})
    figures = [
        {"figure": "fast_tokens_per_s", "value": round(fast_tps, 1), "peer": "standard_tokens_per_s",
         "peer_value": round(std_tps, 1), "speedup": round(fast_tps / std_tps, 2), "outputs_identical": identical,
         "workload": workload},
        {"figure": "gateway_p50_ms", "value": round(p50_gateway, 2), "peer": "direct_p50_ms",
         "peer_value": round(p50_direct, 2), "overhead_p50_ms": round(overhead, 2)},
        {"figure": "fast_tier_draft_acceptance", "value": round(acceptance, 3),
         "answers_copied_from_document": f"{copied}/{len(cases)}", "prompts_unseen_in_training": f"{unseen}/{len(cases)}",
         **tune},
    ]
    for f in figures:
        print(json.dumps(f))
    peer = {"name": "standard tier (same weights and engine, no speculative decoding)", "warmup_requests": 1,
            "prompts": len(cases), "max_tokens": args.max_tokens, "concurrency": 1, "rounds": 1}
    gateway_peer = {"name": "direct to the deployment (no gateway)", "requests": args.overhead_requests,
                    "order": "alternating with the gateway's", "max_tokens": 1}
    print(json.dumps({
        "figure": "serving",
        "fast_tokens_per_s": round(fast_tps, 1), "standard_tokens_per_s": round(std_tps, 1),
        "speedup": round(fast_tps / std_tps, 2), "outputs_identical": identical,
        "gateway_overhead_p50_ms": round(overhead, 2), "gateway_p50_ms": round(p50_gateway, 2),
        "direct_p50_ms": round(p50_direct, 2), "completion_tokens": results["fast"]["tokens"],
        "prompts": len(cases), "draft_acceptance": round(acceptance, 3),
        "answers_copied_from_document": copied, "prompts_unseen_in_training": unseen, "workload": workload, **tune,
        "peer": peer, "gateway_peer": gateway_peer,
    }))


if __name__ == "__main__":
    main()
