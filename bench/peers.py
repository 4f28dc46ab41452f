"""posttrain's GRPO step against TRL's GRPOTrainer on the same work, in the same run.

    .venv/bin/python bench/peers.py --trainer trl [--preset smollm2-arith] [--steps 3] [--rounds 2] [--threads 2]
        [--eval-tasks 50] [--sides posttrain,trl-default,trl-fast]
    .venv/bin/python bench/peers.py --trainer trl --work sft [--preset smollm2-repair] [--steps 8] [--rounds 2]

Each side trains the preset's model from the same weights for ``--steps`` GRPO steps, in a process of its own (so
its peak RSS is its own), the sides in turn within each of ``--rounds`` rounds, so that a loaded moment of the
machine falls on all of them:

- ``posttrain``: the preset's ``train_grpo`` with every saving on (a group's prompt run once, zero-signal groups left
  out of the update, micro-batches), one batch of prompts a step (no refill, so both sides generate the same number
  of trajectories);
- ``trl-default``: TRL's ``GRPOTrainer`` at its defaults where the work does not fix them (gradient checkpointing on,
  the ``dapo`` loss, the prompt run with every completion);
- ``trl-fast``: the same with gradient checkpointing off, the setting TRL's docs name for speed when memory allows
  (no vLLM: the peer generates with transformers, as posttrain's embedded engine does).

What the sides share: the model and its chat template (posttrain's ``load_policy`` gives both the same tokenizer
and template), the prompts (each round's posttrain run records the tasks it drew, step by step, and the TRL sides
train on exactly those, in order, each prompt ``group_size`` times), the reward (the platform's verifier: the same
score for the same answer), group size, prompts per step, max new tokens, temperature, learning rate (constant),
clipping (0.2 low, 0.28 high), no KL term, gradient clipping at 1.0, micro-batches of the preset's size, steps and
torch threads. Each side's settings are printed with its figures.

Figures, each side: seconds a step (the median over rounds of each round's mean), trajectories/s (a step's
trajectories over its seconds), generation and update seconds a step, peak RSS, the reward curve, and, after the
first round's steps, greedy pass@1 on the preset's held-out tasks against the model as it ships (paired, the same
tasks; the sides against posttrain too). The summary (last line) gives posttrain's ratios against the faster TRL
side.

``--work sft``: ``train_sft`` against TRL's ``SFTTrainer`` on the preset's SFT data (smollm2-repair: the scripted
agent's repair demonstrations, made once in the run), tokenised once by posttrain, so both sides see the same
tokens with the loss on the policy's tokens only (TRL gets ``input_ids`` and ``labels``), the same rows in the same
order (posttrain's draw for each step; TRL's sampler sequential), rows a step (TRL one a pass, so no padding;
posttrain the preset's micro-batch, whose rows' shared prefix it runs once), learning rate (constant), gradient
clipping, activation checkpointing, steps and threads. Figures: trained tokens/s (every token
of a step's rows over the step's seconds), the loss curve and its last value, peak RSS; the summary gives
posttrain's tokens/s over TRL's and its last loss against TRL's.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

SIDES = ("posttrain", "trl-default", "trl-fast")
SFT_SIDES = ("posttrain", "trl")
# how both TRL trainers run here: on the CPU in fp32, every step logged, nothing saved or reported elsewhere
TRL_RUN: dict[str, Any] = dict(use_cpu=True, bf16=False, logging_steps=1, save_strategy="no", report_to=[],
                               dataloader_num_workers=0, disable_tqdm=True)  # fmt: skip
CLIP_LOW, CLIP_HIGH = 0.2, 0.28


def emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def step_seconds(trainer: Any, at_begin: Any = None) -> list[float]:
    """A TRL trainer's optimizer steps' seconds, filled in as it trains (``at_begin()`` called as each begins)."""
    from transformers import TrainerCallback

    seconds: list[float] = []

    class Steps(TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            seconds.append(time.perf_counter())
            if at_begin is not None:
                at_begin()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            seconds[-1] = time.perf_counter() - seconds[-1]

    trainer.add_callback(Steps())
    return seconds


def prompts_digest(steps: list[list[Any]]) -> str:
    """What a side trained on: each step's prompts, in order (the TRL sides must show posttrain's)."""
    import hashlib

    return hashlib.sha256(json.dumps(steps).encode()).hexdigest()[:16]


def peak_rss_gb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)


def grpo_config(preset: str, model: str, steps: int, out: Path) -> Any:
    """The preset's GRPO run as both sides take it: one batch of prompts a step, the clipping named here."""
    from posttrain.training.presets import get_preset

    return get_preset(preset).grpo.updated(
        model=model,
        output_dir=str(out),
        max_steps=steps,
        max_rollout_batches_per_step=1,
        checkpoint_every=0,
        logprob_check={"every": 0},
        clip_low=CLIP_LOW,
        clip_high=CLIP_HIGH,
        kl_coef=0.0,
    )


def run_posttrain(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """posttrain's side: ``train_grpo``, recording the tasks each step drew (the TRL sides' prompts)."""
    from posttrain.training.loop import train_grpo

    config = grpo_config(args.preset, args.model_dir, args.steps, out / "run")
    drawn: list[list[dict[str, Any]]] = []
    started = time.perf_counter()
    result = train_grpo(
        config, on_groups=lambda step, groups: drawn.append([g.task.model_dump(mode="json") for g in groups])
    )
    seconds = time.perf_counter() - started
    (out / "tasks.json").write_text(json.dumps(drawn))
    steps = result.metrics
    algo = config.algorithm
    figures = {
        "step_s": [round(m["time/step_s"], 2) for m in steps],
        "update_s": [round(m["time/update_s"], 2) for m in steps],
        "generation_s": [round(m["time/step_s"] - m["time/update_s"], 2) for m in steps],
        "trajectories": [len(g) * algo.group_size for g in drawn],
        "reward_curve": [round(m["rollout/reward_mean"], 4) for m in steps],
        "prompts": prompts_digest([[t["prompt"][-1]["content"] for t in step] for step in drawn]),
        "seconds": round(seconds, 2),
        "setting": {
            "trainer": "posttrain train_grpo",
            "activation_checkpointing": config.activation_checkpointing,
            "loss": f"clipped surrogate, {algo.aggregation}-level aggregation (DAPO's), clip {CLIP_LOW}/{CLIP_HIGH}",
            "prompt_shared": algo.shared_prompt,
            "zero_signal_groups_in_update": not algo.skip_zero_signal,
            "micro_batch_size": algo.micro_batch_size,
            "generation": "the embedded engine (continuous batching, the group's prompt prefilled once)",
        },
    }
    if result.model is not None and args.evaluate:
        figures["records"] = evaluate(args, result.model, out)
    return figures


def run_trl(args: argparse.Namespace, out: Path, fast: bool) -> dict[str, Any]:
    """A TRL side: ``GRPOTrainer`` on the prompts posttrain drew this round, step by step, in order."""
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from posttrain.platform.verifiers import TaskSpec, default_service
    from posttrain.training.modeling import load_policy

    config = grpo_config(args.preset, args.model_dir, args.steps, out / "run")
    drawn = json.loads(Path(args.tasks).read_text())
    tasks = [TaskSpec.model_validate(t) for step in drawn for t in step]
    prompts_per_step = {len(step) for step in drawn}
    if len(prompts_per_step) != 1:
        raise SystemExit(f"posttrain's steps drew {sorted(prompts_per_step)} prompts: one batch size is needed")
    (batch,) = prompts_per_step
    group, micro = (
        config.algorithm.group_size,
        min(config.algorithm.micro_batch_size, batch * config.algorithm.group_size),
    )
    model, tokenizer = load_policy(args.model_dir)
    service = default_service()

    rewarded: list[list[Any]] = []  # each generation batch's prompts, in order

    def reward(completions: list[Any], task_index: list[int], **_: Any) -> list[float | None]:
        rewarded.append([tasks[i].prompt[-1].content for i in dict.fromkeys(task_index)])
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [v.score for v in service.verify_batch([tasks[i] for i in task_index], texts)]

    dataset = Dataset.from_list(
        [{"prompt": [m.model_dump() for m in t.prompt], "task_index": i} for i, t in enumerate(tasks)]
    )
    trl_args = GRPOConfig(
        output_dir=str(out / "trl"),
        max_steps=len(drawn),
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=batch * group // micro,  # one optimizer step a generation batch
        num_generations=group,
        max_completion_length=config.sampling.max_new_tokens,
        temperature=config.sampling.temperature,
        learning_rate=config.optim.lr,
        lr_scheduler_type="constant",
        max_grad_norm=config.optim.max_grad_norm,
        beta=0.0,
        epsilon=CLIP_LOW,
        epsilon_high=CLIP_HIGH,
        gradient_checkpointing=not fast,
        shuffle_dataset=False,
        seed=config.seed,
        **TRL_RUN,
    )
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=trl_args, train_dataset=dataset, processing_class=tokenizer
    )
    generation: list[float] = []
    generate = trainer._generate

    def timed(*a: Any, **k: Any) -> Any:  # every generation of a step, whatever calls it
        started = time.perf_counter()
        try:
            return generate(*a, **k)
        finally:
            generation.append(time.perf_counter() - started)

    trainer._generate = timed  # type: ignore[method-assign]
    gen_at: list[int] = []
    steps = step_seconds(trainer, lambda: gen_at.append(len(generation)))
    torch.manual_seed(config.seed)
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    # generation happens in a step's first micro-step (its generation batch), inside the step's time
    gen_s = [sum(generation[gen_at[i] : gen_at[i + 1] if i + 1 < len(gen_at) else None]) for i in range(len(steps))]
    rewards = [round(h["reward"], 4) for h in trainer.state.log_history if "reward" in h]
    figures = {
        "step_s": [round(s, 2) for s in steps],
        "update_s": [round(s - g, 2) for s, g in zip(steps, gen_s)],
        "generation_s": [round(g, 2) for g in gen_s],
        "trajectories": [batch * group] * len(steps),
        "reward_curve": rewards,
        "prompts": prompts_digest(rewarded),
        "seconds": round(seconds, 2),
        "setting": {
            "trainer": "trl GRPOTrainer",
            "trl": __import__("trl").__version__,
            "gradient_checkpointing": trl_args.gradient_checkpointing,
            "loss": f"{trl_args.loss_type}, clip {trl_args.epsilon}/{trl_args.epsilon_high}",
            "prompt_shared": False,
            "zero_signal_groups_in_update": True,
            "micro_batch_size": trl_args.per_device_train_batch_size,
            "gradient_accumulation_steps": trl_args.gradient_accumulation_steps,
            "generation": "transformers generate (use_vllm off), the prompt repeated for each completion",
        },
    }
    if args.evaluate:
        figures["records"] = evaluate(args, trainer.model, out)
    return figures


# --- SFT: train_sft against SFTTrainer on the same rows -------------------------------------------------------
def sft_config(preset: str, model: str, steps: int, out: Path) -> Any:
    from posttrain.training.presets import get_preset

    sft = get_preset(preset).sft
    if sft is None:
        raise SystemExit(f"preset {preset} has no SFT stage: --work sft needs one (smollm2-repair has)")
    return sft.updated(model=model, output_dir=str(out), max_steps=steps, checkpoint_every=0)


def sft_rows(args: argparse.Namespace, work: Path) -> str:
    """The preset's SFT examples (its demonstrations made here), tokenised by posttrain, and each step's rows in the
    order ``train_sft`` draws them: a JSON file both sides read."""
    from posttrain.training.modeling import load_policy
    from posttrain.training.sft import build_examples, step_rows, training_rows

    config = sft_config(args.preset, args.model_dir, args.steps, work / "demonstrations")
    _, tokenizer = load_policy(args.model_dir, chat_template=config.chat_template)
    rows = training_rows(config, build_examples(config, tokenizer))
    steps = [
        [[{"input_ids": e.input_ids, "labels": e.labels} for e in row] for row in step_rows(rows, step, config)]
        for step in range(args.steps)
    ]
    path = work / "sft-rows.json"
    path.write_text(json.dumps(steps))
    return str(path)


def run_sft(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """One SFT side on the rows of ``--tasks`` (the file :func:`sft_rows` wrote)."""
    import torch

    from posttrain.training.data import SFTExample
    from posttrain.training.modeling import load_policy

    config = sft_config(args.preset, args.model_dir, args.steps, out / "run")
    steps = json.loads(Path(args.tasks).read_text())
    tokens = [sum(len(e["input_ids"]) for row in step for e in row) for step in steps]
    if args.side == "posttrain":
        from posttrain.training.sft import train_sft

        batches = [[[SFTExample(e["input_ids"], e["labels"]) for e in row] for row in step] for step in steps]
        marks: list[float] = []  # the start, then each step's end
        started = time.perf_counter()
        result = train_sft(
            config,
            args.model_dir,
            batches=batches,
            on_start=lambda _: marks.append(time.perf_counter()),
            on_metrics=lambda *_: marks.append(time.perf_counter()),
        )
        seconds = time.perf_counter() - started
        step_s = [b - a for a, b in zip(marks, marks[1:])]
        losses = [m["train/loss"] for m in result.metrics]
        from posttrain.training.learner import MIN_SHARED_PREFIX, shared_prefix

        passes = [
            step[k : k + config.micro_batch_size]
            for step in batches
            for k in range(0, len(step), config.micro_batch_size)
        ]
        saved = sum(
            (len(rows) - 1) * common
            for rows in passes
            if len(rows) > 1
            and all(len(r) == 1 for r in rows)
            and (common := shared_prefix([r[0] for r in rows])) >= MIN_SHARED_PREFIX
        )
        setting = {
            "trainer": "posttrain train_sft",
            "prefix_run_once_tokens": saved,  # tokens a pass's rows share, run once instead of once a row
            "activation_checkpointing": config.activation_checkpointing,
            "micro_batch_size": config.micro_batch_size,
            "grad_accum_steps": config.grad_accum_steps,
            "packing": config.packing,
        }
    else:
        from datasets import Dataset
        from trl import SFTConfig, SFTTrainer

        if config.packing:
            raise SystemExit("--work sft compares one example a row; the preset packs its rows")
        model, tokenizer = load_policy(args.model_dir, chat_template=config.chat_template)
        dataset = Dataset.from_list([e for step in steps for row in step for e in row])
        trl_args = SFTConfig(
            output_dir=str(out / "trl"),
            max_steps=len(steps),
            per_device_train_batch_size=1,  # one row a pass: no padding (TRL runs every row whole either way)
            gradient_accumulation_steps=config.micro_batch_size * config.grad_accum_steps,
            learning_rate=config.optim.lr,
            lr_scheduler_type="constant",
            max_grad_norm=config.optim.max_grad_norm,
            weight_decay=config.optim.weight_decay,
            gradient_checkpointing=config.activation_checkpointing,
            max_length=config.max_seq_len,
            packing=False,
            train_sampling_strategy="sequential",
            seed=config.seed,
            **TRL_RUN,
        )
        trainer = SFTTrainer(model=model, args=trl_args, train_dataset=dataset, processing_class=tokenizer)
        times = step_seconds(trainer)
        torch.manual_seed(config.seed)
        started = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - started
        step_s = times
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        setting = {
            "trainer": "trl SFTTrainer",
            "trl": __import__("trl").__version__,
            "gradient_checkpointing": trl_args.gradient_checkpointing,
            "micro_batch_size": trl_args.per_device_train_batch_size,
            "gradient_accumulation_steps": trl_args.gradient_accumulation_steps,
            "loss": f"{trl_args.loss_type} on the labels given (the policy's tokens)",
            "padding_free": trl_args.padding_free,
        }
    return {
        "step_s": [round(x, 2) for x in step_s],
        "tokens": tokens,
        "loss_curve": [round(x, 4) for x in losses],
        "seconds": round(seconds, 2),
        "setting": setting,
    }


def sft_summary(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    def side(rounds: list[dict[str, Any]]) -> dict[str, Any]:
        rate = statistics.median(sum(r["tokens"]) / sum(r["step_s"]) for r in rounds)
        return {
            "tokens_per_s": round(rate, 1),
            "step_s": round(statistics.median(statistics.mean(r["step_s"]) for r in rounds), 2),
            "final_loss": rounds[0]["loss_curve"][-1],
            "loss_curve": rounds[0]["loss_curve"],
            "peak_rss_gb": max(r["peak_rss_gb"] for r in rounds),
            "setting": rounds[0]["setting"],
        }

    sides = {name: side(rounds) for name, rounds in runs.items()}
    mine, peer = sides["posttrain"], sides.get("trl")
    out: dict[str, Any] = {"figure": "peers-trl-sft", "preset": args.preset, "steps": args.steps,
                           "rounds": args.rounds, "threads": args.threads, "sides": sides}  # fmt: skip
    if peer is not None:
        out |= {
            "peer": {
                "name": f"TRL {peer['setting']['trl']} SFTTrainer, the same rows in the same order",
                "side": "trl",
                "setting": peer["setting"],
            },
            "speedup": round(mine["tokens_per_s"] / peer["tokens_per_s"], 3),
            "final_loss_ratio": round(mine["final_loss"] / peer["final_loss"], 4),
            "peak_rss_ratio": round(mine["peak_rss_gb"] / peer["peak_rss_gb"], 3),
        }
    return out


def evaluate(args: argparse.Namespace, model: Any, out: Path) -> str:
    """Greedy pass@1 on the preset's held-out tasks (no general check), per task, to a records file."""
    from posttrain.training.evaluate import evaluate_policy
    from posttrain.training.modeling import load_policy
    from posttrain.training.presets import get_preset

    config = get_preset(args.preset).eval.model_copy(update={"tasks_per_domain": args.eval_tasks, "general": None})
    _, tokenizer = load_policy(args.model_dir)
    records: list[dict[str, Any]] = []
    evaluate_policy(config, (model.eval(), tokenizer), records=records)
    path = out / "records.json"
    path.write_text(json.dumps(records))
    return str(path)


def side_main(args: argparse.Namespace) -> None:
    """One side, one round (``--side``): its figures as the last line."""
    import torch

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    started = time.perf_counter()
    if args.work == "sft":
        figures = run_sft(args, out)
    elif args.side == "posttrain":
        figures = run_posttrain(args, out)
    elif args.side == "base":
        from posttrain.training.modeling import load_policy

        figures = {"records": evaluate(args, load_policy(args.model_dir)[0], out)}
    else:
        figures = run_trl(args, out, fast=args.side == "trl-fast")
    emit(
        {"side": args.side, **figures, "wall_s": round(time.perf_counter() - started, 2), "peak_rss_gb": peak_rss_gb()}
    )


def paired(after: str, before: str) -> dict[str, Any]:
    """``after`` - ``before`` in points over the same tasks: the paired difference and its SE."""
    from posttrain.training.evaluate import paired_records

    a, b = json.loads(Path(before).read_text()), json.loads(Path(after).read_text())
    assert [r["task_id"] for r in a] == [r["task_id"] for r in b], "the evaluations answered different tasks"
    d = paired_records(a, b)
    return {
        "points": round(100 * d["delta"], 2),
        "se_points": round(100 * d["se"], 2),
        "tasks": d["tasks"],
        "pass_after": round(d["b"], 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainer", choices=("trl",), default="trl")
    parser.add_argument("--work", choices=("grpo", "sft"), default="grpo")
    parser.add_argument("--preset", help="default: smollm2-arith (grpo), smollm2-repair (sft)")
    parser.add_argument("--steps", type=int, help="default: 3 (grpo), 8 (sft)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--eval-tasks", type=int, default=50, help="held-out tasks a domain (0: no evaluation)")
    parser.add_argument("--sides", help=f"default: {','.join(SIDES)} (grpo), {','.join(SFT_SIDES)} (sft)")
    parser.add_argument("--model-dir", help="a model directory (default: the preset's model, imported)")
    parser.add_argument("--side", choices=(*SIDES, *SFT_SIDES, "base"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--tasks", help=argparse.SUPPRESS)
    parser.add_argument("--evaluate", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sft = args.work == "sft"
    args.preset = args.preset or ("smollm2-repair" if sft else "smollm2-arith")
    args.steps = args.steps or (8 if sft else 3)
    if args.side:
        return side_main(args)
    known = SFT_SIDES if sft else SIDES
    sides = args.sides.split(",") if args.sides else list(known)
    if unknown := sorted(set(sides) - set(known)) or "posttrain" not in sides:
        raise SystemExit(
            f"--sides: {unknown or 'posttrain is missing'}; choose from {', '.join(known)}, posttrain among them"
        )
    from posttrain.platform.verifiers.sandboxes import close_shared_pool

    with tempfile.TemporaryDirectory(prefix="posttrain-bench-peers-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)  # the sandboxes' unprivileged uid enters their directory below it
        os.environ.setdefault("POSTTRAIN_SANDBOX__ROOT_DIR", str(work / "sandboxes"))
        try:
            compare(args, sides, work)
        finally:  # the demonstrations' graders' sandboxes (tmpfs mounts below work) go before work does
            close_shared_pool()


def compare(args: argparse.Namespace, sides: list[str], work: Path) -> None:
    """Every side, round by round, in ``work``; then the summary."""
    sft = args.work == "sft"
    model_dir = args.model_dir = args.model_dir or import_model(args.preset, work)
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}

    def run(side: str, r: int, *extra: str) -> dict[str, Any]:
        out = work / f"{side}-{r}"
        out.mkdir()
        command = [sys.executable, __file__, "--side", side, "--work", args.work, "--preset", args.preset, "--model-dir", model_dir,
                   "--steps", str(args.steps), "--threads", str(args.threads), "--out", str(out),
                   "--eval-tasks", str(args.eval_tasks), *extra]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"side {side} (round {r}) failed:\n{done.stderr[-4000:]}")
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        emit({"figure": "peers_side", "round": r, **{k: v for k, v in figures.items() if k != "setting"}})
        return figures

    if sft:
        rows = sft_rows(args, work)
        for r in range(args.rounds):
            for side in sides:
                runs[side].append(run(side, r, "--tasks", rows))
        return emit(sft_summary(args, runs))
    evaluate_first = ["--evaluate"] if args.eval_tasks else []
    base = run("base", 0) if args.eval_tasks else None
    for r in range(args.rounds):
        mine = run("posttrain", r, *(evaluate_first if r == 0 else []))
        runs["posttrain"].append(mine)
        tasks = str(work / f"posttrain-{r}" / "tasks.json")
        for side in [s for s in sides if s != "posttrain"]:
            runs[side].append(run(side, r, "--tasks", tasks, *(evaluate_first if r == 0 else [])))
    emit(summary(args, runs, base))


def import_model(preset: str, work: Path) -> str:
    from posttrain.platform.auth import Identity
    from posttrain.platform.db import migrate
    from posttrain.platform.db.models import Role
    from posttrain.platform.models.importer import import_model as imported
    from posttrain.training.presets import get_preset

    url = f"sqlite:///{work / 'models.db'}"
    migrate.upgrade(url)
    row = imported(
        Identity("bench", Role.admin), f"builtin:{get_preset(preset).model}", url=url, dest_root=work / "models"
    )
    return row.path


def summary(
    args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]], base: dict[str, Any] | None
) -> dict[str, Any]:
    def side(rounds: list[dict[str, Any]]) -> dict[str, Any]:
        step = statistics.median(statistics.mean(r["step_s"]) for r in rounds)
        per_step = statistics.median(statistics.mean(r["trajectories"]) for r in rounds)
        out = {
            "step_s": round(step, 2),
            "trajectories_per_s": round(per_step / step, 3),
            "generation_s": round(statistics.median(statistics.mean(r["generation_s"]) for r in rounds), 2),
            "update_s": round(statistics.median(statistics.mean(r["update_s"]) for r in rounds), 2),
            "peak_rss_gb": max(r["peak_rss_gb"] for r in rounds),
            "reward_curve": rounds[0]["reward_curve"],
            "prompts": [r["prompts"] for r in rounds],
            "setting": rounds[0]["setting"],
        }
        if base is not None and "records" in rounds[0]:
            out["held_out_change"] = paired(rounds[0]["records"], base["records"])
        return out

    sides = {name: side(rounds) for name, rounds in runs.items()}
    if differ := [name for name, figures in sides.items() if figures["prompts"] != sides["posttrain"]["prompts"]]:
        raise SystemExit(f"sides {differ} trained on other prompts than posttrain drew: no comparison")
    mine = sides["posttrain"]
    peers = [s for s in sides if s != "posttrain"]
    out: dict[str, Any] = {
        "figure": "peers-trl",
        "preset": args.preset,
        "steps": args.steps,
        "rounds": args.rounds,
        "threads": args.threads,
        "sides": sides,
    }
    if peers:
        fastest = max(peers, key=lambda s: sides[s]["trajectories_per_s"])
        peer = sides[fastest]
        out |= {
            "peer": {
                "name": f"TRL {peer['setting']['trl']} GRPOTrainer ({fastest}: the faster of its sides), the same "
                "prompts, rewards and settings, in turn",
                "side": fastest,
                "setting": peer["setting"],
            },
            "speedup": round(mine["trajectories_per_s"] / peer["trajectories_per_s"], 3),
            "peak_rss_ratio": round(mine["peak_rss_gb"] / peer["peak_rss_gb"], 3),
        }
        if "held_out_change" in mine and "held_out_change" in peer:
            out["held_out_against_peer"] = paired(runs["posttrain"][0]["records"], runs[fastest][0]["records"])
    return out


if __name__ == "__main__":
    main()
