"""Every tier's speed beside its quality: the tier card of the built-in model, measured in one run.

    .venv/bin/python bench/tiers.py [--model smollm2-135m-instruct] [--tasks-per-domain 48] [--doc-tasks 32]
        [--rounds 2] [--max-tokens 64] [--variants standard,fast,q8,llamacpp,vllm,vllm-ngram,vllm-fp8kv]
    .venv/bin/python bench/tiers.py --model gemma3-270m --chat-template gemma   # the second built-in, a base model

Runs :func:`posttrain.training.tier_card.measure_tiers`, what the ``measure_tiers`` job runs, in a fresh
data directory with the model imported: the model served in every tier this host can run (the embedded engine's
standard, fast and q8 tiers; llama.cpp, ``make llamacpp``; vLLM plain, with n-gram speculation and with an fp8 KV
cache, ``make vllm``), each as a deployment runs it, all started side by side and measured in turn:

- speed, in ``--rounds`` interleaved rounds (the order reversed every other round; each tier's best round, and
  the median of its rounds beside it): time to the first token, and completion tokens per second of whole requests
  one and four at a time;
- quality: greedy answers to one fixed task set, the held-out eval tasks of the general check's four procedural
  domains at difficulty 2 (``--tasks-per-domain`` each; the built-in model answers about a quarter of them) and
  ``--doc-tasks`` document-QA tasks the platform builds from Debian's LaTeX news PDFs, graded by the tasks'
  verifiers: pass@1 with its standard error and the difference from the standard tier, paired task by task.

Prints one JSON object per tier, then the summary (``figure: tiers``): ``tiers`` with each tier's
``tokens_per_s_1``, ``tokens_per_s_4`` and ``speedup_1_vs_standard`` (the best round), the same of the median
round (``*_median``), ``ttft_p50_ms``, ``pass_at_1``, ``pass_at_1_se`` and ``quality_delta_vs_standard`` (with its
``quality_delta_se``, the paired difference's standard error, and ``quality_flag``), and the issue's two goals: a
tier at least 3x standard's one-stream tokens/s (best round; ``tiers_on_median`` names those that are at the median
too) whose pass@1 differs from standard's by at most twice the paired difference's standard error, and vLLM within
1.2x of llama.cpp at four streams.
"""

from __future__ import annotations

import os
import sys

# bench/ holds files named like standard modules (queue.py): keep it off the import path.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

REAL_MODEL = "smollm2-135m-instruct"
FIGURES = {REAL_MODEL: "tiers", "gemma3-270m": "tiers-gemma"}  # each built-in's card is a benchmark of its own


def document_tasks(count: int) -> list:  # type: ignore[type-arg]
    """Document-QA tasks from Debian's LaTeX news PDFs, as bench/serving.py builds them."""
    spec = importlib.util.spec_from_file_location("bench_serving", Path(__file__).with_name("serving.py"))
    assert spec is not None and spec.loader is not None
    serving = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = serving  # its dataclasses look their module up there
    spec.loader.exec_module(serving)
    return [case.task for case in serving.document_cases(count)]


def goal_3x_with_quality(tiers: list[dict]) -> dict:  # type: ignore[type-arg]
    """The tiers at least 3x standard's one-stream speed whose pass@1 is within twice the standard error of the
    paired difference from standard's (task by task, the error that applies to a difference on the same tasks);
    ``tiers`` by the best round, ``tiers_on_median`` by the median round."""
    same_quality = [t for t in tiers if abs(t["quality_delta_vs_standard"]) <= 2 * t["quality_delta_se"]]
    best = [t["name"] for t in same_quality if t["speedup_1_vs_standard"] >= 3.0]
    return {
        "met": bool(best),
        "tiers": best,
        "tiers_on_median": [t["name"] for t in same_quality if t["speedup_1_vs_standard_median"] >= 3.0],
        "quality_bound": "twice the paired difference's standard error",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=REAL_MODEL, help=f"a built-in model name (default: {REAL_MODEL})")
    parser.add_argument("--tasks-per-domain", type=int, default=48)
    parser.add_argument("--doc-tasks", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--variants", default="", help="comma-separated tier variants (default: every one this host can run)"
    )
    parser.add_argument(
        "--chat-template",
        default=None,
        help="import the model with this chat template (a family: chatml, gemma): a base model has none, "
        "and the card's requests are chats",
    )
    args = parser.parse_args()

    data = Path(tempfile.mkdtemp(prefix="posttrain-bench-tiers-"))
    os.environ["POSTTRAIN_DATA_DIR"] = str(data)
    os.environ["POSTTRAIN_DATABASE_URL"] = f"sqlite:///{data / 'posttrain.db'}"
    from posttrain.platform.auth import Identity
    from posttrain.platform.db import migrate
    from posttrain.platform.db.models import Role
    from posttrain.platform.models.importer import BUILTIN_PREFIX, import_model
    from posttrain.platform.settings import get_settings
    from posttrain.training.tier_card import MeasureTiersConfig, card_tasks, host_variants, measure_tiers

    started = time.perf_counter()
    settings = get_settings()
    migrate.upgrade(os.environ["POSTTRAIN_DATABASE_URL"])
    operator = Identity("bench", Role.operator)
    model = import_model(operator, f"{BUILTIN_PREFIX}{args.model}", chat_template=args.chat_template)
    variants = host_variants(settings)
    if args.variants:
        wanted = args.variants.split(",")
        variants = [v for v in variants if v.name in wanted]
    config = MeasureTiersConfig(model=model.name, variants=variants, tasks_per_domain=args.tasks_per_domain,
                                max_tokens=args.max_tokens, rounds=args.rounds)  # fmt: skip
    tasks = card_tasks(config) + (document_tasks(args.doc_tasks) if args.doc_tasks else [])
    card = measure_tiers(operator, config, settings, tasks, log=lambda line: print(line, file=sys.stderr, flush=True))
    for tier in card["tiers"]:
        print(json.dumps({"figure": "tier", **tier}), flush=True)
    tiers = {t["name"]: t for t in card["tiers"]}
    standard = tiers["standard"]
    vllm_vs_llamacpp = (tiers["vllm"]["tokens_per_s_4"] / tiers["llamacpp"]["tokens_per_s_4"]
                        if "vllm" in tiers and "llamacpp" in tiers else None)  # fmt: skip
    print(json.dumps({
        "figure": FIGURES.get(args.model, f"tiers-{args.model}"), "model": card["model"], "chat_template": args.chat_template, "tasks": card["tasks"], "domains": card["domains"],
        "doc_tasks": args.doc_tasks, "max_tokens": card["max_tokens"], "rounds": card["rounds"],
        "tiers": {name: {k: v for k, v in t.items() if k != "name"} for name, t in tiers.items()},
        "standard_tokens_per_s_1": standard["tokens_per_s_1"], "standard_tokens_per_s_1_median": standard["tokens_per_s_1_median"],
        "goal_3x_with_quality": goal_3x_with_quality(card["tiers"]),
        "vllm_vs_llamacpp_4_streams": round(vllm_vs_llamacpp, 3) if vllm_vs_llamacpp else None,
        "goal_vllm_within_1_2x_of_llamacpp": (1 / 1.2 <= vllm_vs_llamacpp <= 1.2) if vllm_vs_llamacpp else None,
        "minutes": round((time.perf_counter() - started) / 60, 1), "cores": os.cpu_count(),
        "peer": {"name": "the standard tier: the embedded engine on the model's own fp32 weights",
                 "quality": "the same tasks, greedy, paired task by task", "rounds": args.rounds,
                 "speed": "best round against best round, median against median"},
    }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
