"""Serving benchmark: fast tier vs standard tier, and the gateway's added latency.

    .venv/bin/python bench/serving.py [--tune-steps 60] [--max-tokens 64]

Builds a small Qwen2 model locally (hidden 384, 4 layers), teaches it with a
quick fine-tune to answer document questions by copying the relevant sentence
(copy-heavy document QA), serves the same weights in the fast tier
(prompt-lookup speculation) and the standard tier, and puts a gateway in
front. Prints one JSON object per figure, with its peer measured in the same
run; the last line holds every figure.
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
import random
import socket
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from posttrain.platform.models import TinyModelSpec, build_tiny_model, load_model
from posttrain.platform.models.tuning import ChatExample, memorize
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

CITIES = ["Paris", "London", "Berlin", "Tokyo", "Madrid", "Rome"]
ITEMS = ["invoice", "contract", "order", "report"]


def document_qa(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """Documents of several sentences; the answer is one sentence copied verbatim."""
    rng = random.Random(seed)
    cases = []
    for i in range(n):
        sentences = []
        for _ in range(3):
            item, city = rng.choice(ITEMS), rng.choice(CITIES)
            sentences.append(f"The {item} {rng.randint(100, 999)} for the {city} customer has a total amount of "
                             f"{rng.randint(1000, 99999)} and a payment date of 2026-{rng.randint(1, 12):02d}-"
                             f"{rng.randint(1, 28):02d}.")
        target = sentences[i % len(sentences)]
        number = target.split()[2]
        doc = " ".join(sentences)
        cases.append((f"Document:\n{doc}\n\nQuestion: quote the sentence about number "
                      f"{number}.", target))
    return cases


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
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tune-steps", type=int, default=0,
                        help="fine-tune steps teaching the model to quote the document (about 150 make it converge; "
                             "minutes of CPU). 0 keeps the random-init model, whose greedy output loops: its drafts then "
                             "come from its own repeated output rather than from the document")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--overhead-requests", type=int, default=60)
    args = parser.parse_args()

    cases = document_qa(args.prompts)
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_model(Path(tmp) / "bench-qwen2", TinyModelSpec(
            hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=768))
        t0 = time.perf_counter()
        losses: list[float] = []
        if args.tune_steps:
            losses = memorize(path, [ChatExample([{"role": "user", "content": q}], a) for q, a in cases],
                              steps=args.tune_steps, lr=4e-3)
        tune_s = time.perf_counter() - t0
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
                chat(client, server.base_url, "bench", cases[0][0], 4)
            results: dict[str, dict] = {}
            for tier in ("standard", "fast"):
                texts, tokens, start = [], 0, time.perf_counter()
                for q, _ in cases:
                    out = chat(client, servers[tier].base_url, "bench", q, args.max_tokens)
                    texts.append(out["choices"][0]["message"]["content"])
                    tokens += out["usage"]["completion_tokens"]
                elapsed = time.perf_counter() - start
                results[tier] = {"texts": texts, "tokens": tokens, "seconds": elapsed,
                                 "tokens_per_s": tokens / elapsed}
            fast_m, std = engines["fast"].metrics, results["standard"]
            copied = sum(a in t for (_, a), t in zip(cases, results["standard"]["texts"]))

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
    figures = [
        {"figure": "fast_tokens_per_s", "value": round(fast_tps, 1), "peer": "standard_tokens_per_s",
         "peer_value": round(std_tps, 1), "speedup": round(fast_tps / std_tps, 2), "outputs_identical": identical},
        {"figure": "gateway_p50_ms", "value": round(p50_gateway, 2), "peer": "direct_p50_ms",
         "peer_value": round(p50_direct, 2), "overhead_p50_ms": round(overhead, 2)},
        {"figure": "fast_tier_draft_acceptance", "value": round(acceptance, 3),
         "answers_copied_from_document": f"{copied}/{len(cases)}", "tune_steps": args.tune_steps, "tune_seconds": round(tune_s, 1),
         "tune_loss_first_last": [round(losses[0], 3), round(losses[-1], 3)] if losses else None},
    ]
    for f in figures:
        print(json.dumps(f))
    print(json.dumps({
        "fast_tokens_per_s": round(fast_tps, 1), "standard_tokens_per_s": round(std_tps, 1),
        "speedup": round(fast_tps / std_tps, 2), "outputs_identical": identical,
        "gateway_overhead_p50_ms": round(overhead, 2), "gateway_p50_ms": round(p50_gateway, 2),
        "direct_p50_ms": round(p50_direct, 2), "completion_tokens": results["fast"]["tokens"],
        "prompts": len(cases), "draft_acceptance": round(acceptance, 3),
        "answers_copied_from_document": copied, "tune_steps": args.tune_steps,
    }))


if __name__ == "__main__":
    main()
