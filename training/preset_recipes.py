"""The presets' recipes in job-config form: each preset's fields (name, description, model, documents) with its
``sft``, ``grpo`` and ``eval`` sections as the fields a config file naming the preset would set.

A recipe sits below the trainer configs: :mod:`posttrain.training.config` fills a config that names a preset
from the recipe's section, and :mod:`posttrain.training.presets` validates whole recipes into typed
:class:`~posttrain.training.presets.RunPreset` objects (what each preset is for: that module's docstring).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from posttrain.platform.engines.vllm import VllmMissing, find_python
from posttrain.platform.models.specs import TinyModelSpec
from posttrain.platform.tasks.builders import span_recovery_example
from posttrain.platform.tasks.domains import generate
from posttrain.platform.tasks.domains.families.repair_library import KINDS
from posttrain.platform.tasks.prompt_format import PromptFormat, ToolStep, WorkedExample
from posttrain.training.scheduler import DomainSpec, SchedulerConfig

Recipe = dict[str, Any]  # RunPreset's fields; each section the fields a job config naming the preset would set


# Held out by construction: at difficulty 3 each domain has about 900-2,800 distinct prompts, a fifth
# of them in the eval split that training never draws (difficulty 1 had ten prompts and no eval split).
CPU_DEMO_DOMAINS = ["format.from_words", "format.zero_pad"]
CPU_DEMO_DIFFICULTY = 3


def _cpu_demo() -> Recipe:
    domains, level = CPU_DEMO_DOMAINS, CPU_DEMO_DIFFICULTY
    return dict(
        name="cpu-demo",
        description="tiny model, SFT warm-up then GRPO on reading three-digit number words and zero-padding numbers; "
        "evaluated on prompts it never trained on; minutes on a 2-core CPU",
        model=TinyModelSpec(
            vocab_size=300,
            hidden_size=64,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            intermediate_size=256,
            max_position_embeddings=256,
            seed=0,
        ),
        # a partial warm-up: stopped mid-way through learning the mapping, so GRPO has reward variance
        sft=dict(
            domains=domains,
            difficulty=level,
            tasks_per_domain=8192,
            max_steps=420,
            lr=3e-3,
            packing=False,
            micro_batch_size=32,
            max_seq_len=256,
            device="cpu",
            checkpoint_every=140,
            seed=0,
        ),
        grpo=dict(
            domains=[DomainSpec(name=d, difficulty=level) for d in domains],
            scheduler=SchedulerConfig(batch_size=16, seed=0),
            group_size=8,
            max_new_tokens=6,
            temperature=1.0,
            lr=3e-4,
            max_steps=200,
            micro_batch_size=64,
            max_rollout_batches_per_step=1,
            checkpoint_every=50,
            device="cpu",
            seed=0,
            verifier_workers=1,
        ),
        eval=dict(
            domains=domains, difficulty=level, tasks_per_domain=200, max_new_tokens=6, batch_size=100, device="cpu"
        ),
    )


def _cpu_small() -> Recipe:
    demo = _cpu_demo()
    return demo | {
        "name": "cpu-small",
        "description": "cpu-demo with a larger model (hidden 128, 4 layers) and more GRPO steps",
        "model": demo["model"].model_copy(update={"hidden_size": 128, "num_layers": 4, "intermediate_size": 512}),
        "grpo": demo["grpo"] | {"max_steps": 300},
    }


def _cpu_quick() -> Recipe:
    demo = _cpu_demo()
    domains = ["format.zero_pad"]  # "Pad 191 with zeros to 5 digits.": about 2,800 prompts at difficulty 3
    return demo | {
        "name": "cpu-quick",
        "description": "cpu-demo on one domain (zero-padding three-digit numbers), a 300-step SFT warm-up and 100 GRPO "
        "steps, evaluated on prompts it never trained on: two to three minutes on a 2-core CPU",
        "sft": demo["sft"] | {"domains": domains, "max_steps": 300, "checkpoint_every": 100},
        "grpo": demo["grpo"]
        | {
            "domains": [DomainSpec(name=d, difficulty=CPU_DEMO_DIFFICULTY) for d in domains],
            "max_steps": 100,
            "lr": 1e-3,
            "checkpoint_every": 20,
        },  # 60 gained 0.5 to 11.5 points by seed here
        "eval": demo["eval"] | {"domains": domains, "tasks_per_domain": 200},
    }


# --- the real model ---------------------------------------------------------------------
REAL_MODEL = "smollm2-135m-instruct"  # the built-in model (posttrain.platform.models.importer.DEFAULT_MODEL)
BOXED = PromptFormat(
    instruction="Put your final answer within \\boxed{}.",
    examples=[
        WorkedExample(
            user="Compute 12 + 7.\nPut your final answer within \\boxed{}.", assistant="12 + 7 = 19.\n\n\\boxed{19}"
        )
    ],
    answer="boxed",
)
# held out by construction: every domain here has thousands of prompts at its difficulty, a fifth in eval
ARITH_DOMAINS = [DomainSpec(name="arith.add.int", difficulty=2), DomainSpec(name="arith.sub.int", difficulty=2)]


def _smollm2_arith() -> Recipe:
    domains = ARITH_DOMAINS
    return dict(
        name="smollm2-arith",
        description="SmolLM2-135M-Instruct as it ships, GRPO on two-digit additions and subtractions with the answer "
        "in \\boxed{} (strict), one worked example in the chat; evaluated on prompts it never trained on, "
        "with the general check beside it",
        model=REAL_MODEL,
        sft=None,
        grpo=dict(
            domains=domains,
            prompt_format=BOXED,
            scheduler=SchedulerConfig(batch_size=8, seed=0),
            group_size=8,
            max_new_tokens=40,
            temperature=1.0,
            lr=5e-6,
            max_steps=10,
            micro_batch_size=16,
            max_rollout_batches_per_step=2,
            checkpoint_every=10,
            device="cpu",
            seed=0,
            verifier_workers=1,
            logprob_check={"every": 10, "trajectories": 8},
        ),
        eval=dict(
            domains=[d.name for d in domains],
            difficulty=2,
            prompt_format=BOXED,
            tasks_per_domain=50,
            max_new_tokens=40,
            batch_size=50,
            device="cpu",
            general={"tasks_per_domain": 100},
        ),
    )


def _smollm2_quick() -> Recipe:
    arith = _smollm2_arith()
    domains = ARITH_DOMAINS[:1]
    return arith | {
        "name": "smollm2-quick",
        "description": "the one-click demo on the real model: GRPO on two-digit additions (answer in \\boxed{}), "
        "4 prompts x 8 samples a step for 8 steps, evaluated greedily on 64 prompts it never trained on "
        "with a 64-task general check beside it: several minutes on a 2-core CPU",
        "grpo": arith["grpo"]
        | {
            "domains": domains,
            "scheduler": SchedulerConfig(batch_size=4, seed=0),
            "lr": 1e-5,
            "max_steps": 8,
            "max_rollout_batches_per_step": 1,
            "checkpoint_every": 4,
            "logprob_check": {"every": 4, "trajectories": 8},
        },
        "eval": arith["eval"]
        | {
            "domains": [d.name for d in domains],
            "tasks_per_domain": 64,
            "batch_size": 32,
            "general": {"tasks_per_domain": 16},
        },
    }


# --- the real model with tools: the python tool is there to be used -----------------------------------
def _multiply_with_python(a: int, b: int) -> WorkedExample:
    return WorkedExample(
        user=f"Compute {a} * {b}.\nPut your final answer within \\boxed{{}}.",
        tools=[ToolStep(name="python", arguments={"code": f"print({a} * {b})"}, result=f"{a * b}\n")],
        assistant=f"\\boxed{{{a * b}}}",
    )


# two worked multiplications: with them the model calls python for every two-digit product (greedy, 48 of 48
# here) but not for a sum of four numbers (0 of 16 greedy; 4 of 64 sampled at 0.7 call it right): the gain to find
TOOL_CALLS = PromptFormat(
    instruction="Put your final answer within \\boxed{}.",
    examples=[_multiply_with_python(23, 41), _multiply_with_python(56, 17)],
    answer="boxed",
)
TOOLS_DOMAINS = [DomainSpec(name="arith.sum_list.int", difficulty=2)]
PYTHON_TOOL = dict(
    name="tool_use",
    tools=["python"],
    max_turns=3,
    max_episode_tokens=1024,
    episode_timeout_s=60.0,
    tool_timeout_s=5.0,
    concurrency=16,
)


def _smollm2_tools() -> Recipe:
    domains = TOOLS_DOMAINS
    return dict(
        name="smollm2-tools",
        description="SmolLM2-135M-Instruct as it ships, GRPO in the tool_use environment (a python tool in a sandbox, up "
        "to three turns) on sums of four two-digit numbers, answer in \\boxed{} (strict); two worked "
        "examples show the tool on products only; evaluated greedily as episodes on prompts it never trained on",
        model=REAL_MODEL,
        sft=None,
        grpo=dict(
            domains=domains,
            prompt_format=TOOL_CALLS,
            environment=PYTHON_TOOL,
            scheduler=SchedulerConfig(batch_size=8, seed=0),
            group_size=8,
            max_new_tokens=60,
            temperature=0.7,
            lr=1e-5,
            max_steps=10,
            micro_batch_size=8,
            max_rollout_batches_per_step=2,
            checkpoint_every=5,
            device="cpu",
            seed=0,
            verifier_workers=1,
            logprob_check={"every": 5, "trajectories": 8},
        ),
        eval=dict(
            domains=[d.name for d in domains],
            difficulty=2,
            prompt_format=TOOL_CALLS,
            environment=PYTHON_TOOL,
            tasks_per_domain=64,
            max_new_tokens=60,
            batch_size=64,
            device="cpu",
            general={"tasks_per_domain": 100},
        ),
    )


# --- the real model on the operator's documents ----------------------------------------------------------
DOCQA_TASK_SET = "smollm2-docqa"
# two worked examples not from the documents, worded as the builder words its tasks, each answer a term of the
# kind the builder masks (a capitalised word, a number): with one example whose answer was "twice" the model
# answered "twice" to most tasks; with these it copies the page's sentence as its evidence (half the score)
# far more often (mean score 0.12 against 0.07 greedily on 30 held-out tasks), and the answer is the word
# that sentence has in the gap: the step GRPO has to find
DOC_QUOTE = PromptFormat(
    examples=[
        WorkedExample(user=user, assistant=reply)
        for user, reply in (
            span_recovery_example(
                "guide.pdf",
                2,
                "The Project Team releases a new version twice a year. Each release is tested on "
                "Linux and Windows before it ships. Bug reports go to the Tracker.",
                "Each release is tested on Linux and Windows before it ships.",
                "Windows",
            ),
            span_recovery_example(
                "notes.pdf",
                5,
                "Version 3 of the Manual was printed in 1998. The Editors thank every reader who "
                "sent corrections. A new Index lists all commands.",
                "A new Index lists all commands.",
                "Index",
            ),
        )
    ]
)


# the LaTeX News issues Debian ships, made into span-recovery tasks (domain doc.span), a quarter held out
DOCQA_DOCUMENTS = dict(
    task_set=DOCQA_TASK_SET,
    paths=["/usr/share/doc/texlive-doc/latex/base/ltnews[0-9]*.pdf"],
    source={"kinds": ["span_recovery"], "passage_chars": 400, "max_per_document": 24, "eval_fraction": 0.25, "seed": 0},
)
DOC_DOMAIN = "doc.span"


def _smollm2_docqa() -> Recipe:
    return dict(
        name="smollm2-docqa",
        description="SmolLM2-135M-Instruct as it ships, GRPO on tasks built from uploaded documents (the LaTeX News "
        "issues Debian ships): recover a masked term of a sentence from the passage around it, quoting the "
        "evidence (doc_qa verifier: exact answer, evidence found on the page); evaluated on the task set's "
        f"eval split. Its task set {DOCQA_TASK_SET!r} is built first from Debian's LaTeX News issues (the Training page's button does it)",
        model=REAL_MODEL,
        sft=None,
        documents=DOCQA_DOCUMENTS,
        grpo=dict(
            task_set=DOCQA_TASK_SET,
            prompt_format=DOC_QUOTE,
            scheduler=SchedulerConfig(batch_size=8, seed=0),
            group_size=8,
            max_new_tokens=80,
            temperature=0.7,
            lr=2e-5,
            max_steps=12,
            micro_batch_size=16,
            max_rollout_batches_per_step=2,
            checkpoint_every=6,
            device="cpu",
            seed=0,
            verifier_workers=1,
            logprob_check={"every": 6, "trajectories": 8},
        ),
        eval=dict(
            task_set=DOCQA_TASK_SET,
            prompt_format=DOC_QUOTE,
            tasks_per_domain=100,
            max_new_tokens=80,
            batch_size=25,
            device="cpu",
            general={},
        ),
    )


# --- the real model repairing code in a sandbox, turn by turn ----------------------------------------------
# the demonstrations' rung of the ladder (two functions, one with a planted defect), one domain a defect kind
REPAIR_DOMAINS = [DomainSpec(name=f"repair.{kind}", difficulty=2) for kind in KINDS]
# GRPO and the evaluation one rung up (three functions, one defective): GRPO's domains step along the ladder by their
# pass rate from there, drawn by their share of groups whose rewards differ
REPAIR_RL_DIFFICULTY = 3
# the policy's tools; the tool schemas and the task are about 720 tokens of the prompt, a demonstration about 1,300 in all
REPAIR_ENV = dict(
    name="code_repair",
    tools=["bash", "read_file", "edit_file", "list_dir"],
    max_turns=8,
    max_episode_tokens=2048,
    episode_timeout_s=180.0,
    tool_timeout_s=10.0,
    concurrency=16,
)


def vllm_here() -> bool:
    """Whether multi-turn episodes run through vLLM here: its server engine (its engine loop batches the episodes'
    turns, its prefix cache keeps their shared prompts) where vLLM's environment is, else the embedded engine,
    whose batcher reuses each episode's last turn. On 2 cores vLLM ran 8 repair episodes of 5 turns at 1.9x the
    embedded engine, with the same greedy tokens (``bench/turns.py --engine vllm``, the same episodes in turn)."""
    try:
        find_python()
    except VllmMissing:
        return False
    return True


def episode_rollout() -> dict[str, Any]:
    """GRPO's rollout backend for multi-turn episodes: the fastest here (:func:`vllm_here`)."""
    return {"backend": "vllm"} if vllm_here() else {"backend": "sync"}


# GRPO at the frontier: a domain's difficulty steps up at a pass rate of 0.75 and down at 0.25 (16 results at a rung
# first: four groups), and domains are drawn by the share of their groups whose rewards differ
REPAIR_FRONTIER = SchedulerConfig(
    batch_size=3, seed=0, weigh_by="signal", ema_alpha=0.3, adapt_difficulty=True, step_up_at=0.75, step_down_at=0.25
)
OOD_DIFFICULTY = 3  # repair.humaneval's shortest three fifths: 28 problems held out whole (difficulty 2 holds out 13)


def _smollm2_repair() -> Recipe:
    domains = REPAIR_DOMAINS
    return dict(
        name="smollm2-repair",
        description="SmolLM2-135M-Instruct taught terminal programming: SFT on expert demonstrations (a scripted agent "
        "repairs train-split modules in real sandboxes: list, run the tests, read, edit_file, run the tests "
        "again, reply), then GRPO on code_repair episodes (up to 8 turns; reward: the share of hidden tests "
        "the final module passes), sampled through vLLM where its environment is (1.9x the embedded engine on "
        "episodes here), else the embedded engine. Evaluated greedily as episodes on repairs of functions no training task "
        "shows, on unseen modules of seen functions, and on HumanEval problems held out whole",
        model=REAL_MODEL,
        sft=dict(
            demonstrations={"domains": domains, "tasks_per_domain": 24, "seed": 0, "environment": REPAIR_ENV},
            max_seq_len=2048,
            packing=False,
            micro_batch_size=4,  # a step's four demonstrations in one pass, their shared system prompt and tools run once
            grad_accum_steps=1,
            lr=5e-5,
            max_steps=32,
            checkpoint_every=16,
            device="cpu",
            seed=0,
            activation_checkpointing=True,
        ),
        grpo=dict(
            domains=[d.model_copy(update={"difficulty": REPAIR_RL_DIFFICULTY}) for d in domains],
            environment=REPAIR_ENV,
            rollout=episode_rollout(),
            scheduler=REPAIR_FRONTIER,
            group_size=4,
            max_new_tokens=256,
            temperature=0.8,
            lr=1e-5,
            max_steps=24,
            micro_batch_size=4,  # a group's four episodes in one pass, its prompt run once
            activation_checkpointing=True,
            max_rollout_batches_per_step=2,
            checkpoint_every=8,
            device="cpu",
            seed=0,
            verifier_workers=1,
            logprob_check={"every": 8, "trajectories": 4},
        ),
        eval=dict(
            domains=[d.name for d in domains] + ["repair.humaneval"],
            difficulty=REPAIR_RL_DIFFICULTY,
            difficulties={"repair.humaneval": OOD_DIFFICULTY},
            environment=REPAIR_ENV,
            vllm={} if vllm_here() else None,
            tasks_per_domain=36,
            max_new_tokens=256,
            batch_size=16,
            device="cpu",
            general={"tasks_per_domain": 32},
        ),
    )


# --- the real model across many domains at once ------------------------------------------------------------
# nine families, 36 domains, none of them the general check's; each at the lowest difficulty (2 or more) whose
# prompts hold out an eval split. Each is put with a worked example of its own: with BOXED's one sum before every
# question SmolLM2 as it ships answered 2% of them greedily (8 tasks a domain; 2 of 36 domains above 25%), with its
# own 21.5% (22 of 36 domains neither always nor never right), so the groups have something to disagree on.
# Beside them the document task set's domain (DOC_DOMAIN), put as the docqa preset puts it
BROAD_LEVELS = {
    "arith.add.int": 2, "arith.sub.int": 2, "arith.mul.int": 2, "arith.div.int": 2, "arith.mod.int": 2,
    "compare.larger.int": 2, "compare.smaller.int": 2, "compare.max3.int": 2, "compare.min3.int": 2,
    "dates.days_in_month": 2, "dates.quarter": 2, "dates.iso_to_us": 2, "dates.add_days": 2,
    "units.km_to_m": 2, "units.kg_to_g": 3, "units.h_to_min": 3, "units.min_to_s": 3, "units.week_to_day": 3,
    "list.int.sum": 2, "list.int.length": 2, "list.int.count_value": 2, "list.int.range": 2, "list.int.count_greater": 2,
    "str.length.letters": 2, "str.upper.letters": 2, "str.first_char.letters": 2, "str.count_char.words": 3,
    "regex.zip.count": 2, "regex.integer.count": 2, "regex.capitalized.count": 2,
    "format.zero_pad": 2, "format.thousands": 2, "format.round": 2,
    "json.pick": 2, "json.sum_field": 2, "json.drop": 2,
}  # fmt: skip


def _worked(domain: str, level: int) -> PromptFormat:
    """``domain``'s own format: one of its train-split tasks solved before the question (the one arithmetic example of
    BOXED shows no date, list or JSON answer), answered boxed, or as JSON for a JSON domain."""
    (example,) = generate(domain, 1, seed=7, difficulty=level, split="train")
    assert example.reference is not None
    if domain.startswith("json."):  # a JSON reply is read as JSON: no box
        return PromptFormat(examples=[WorkedExample(user=example.prompt_text, assistant=example.reference)])
    return BOXED.model_copy(
        update={
            "examples": [
                WorkedExample(
                    user=f"{example.prompt_text}\n{BOXED.instruction}", assistant=f"\\boxed{{{example.reference}}}"
                )
            ]
        }
    )


# the curriculum: draws weighed by each domain's learning signal (the share of its groups whose rewards differ;
# estimates quick to follow a 30-step run), floored so no domain starves, each domain's difficulty stepped by its pass
# rate (each difficulty keeping its own estimates), and a domain left at the floor drawn again once its weight has
# aged (revisit_after; each further check that finds no signal doubles that time, so the domains out of the model's
# reach cost ever less of a batch): measured here, signal weights alone (BROAD_SIGNAL: slow estimates, no steps, no
# revisits) forgot domains they stopped drawing (units.kg_to_g 62% -> 0%) and found little more signal than uniform
# draws (BROAD_UNIFORM), the peers in bench/learning.py
BROAD_CURRICULUM = SchedulerConfig(
    batch_size=8, seed=0, weigh_by="signal", ema_alpha=0.3, adapt_difficulty=True, min_results=16, revisit_after=15
)
BROAD_SIGNAL = SchedulerConfig(batch_size=8, seed=0, weigh_by="signal")
BROAD_UNIFORM = SchedulerConfig(batch_size=8, seed=0, curriculum=False)


def broad_format() -> PromptFormat:
    """Each broad domain put in its own format (:func:`_worked`), the document domain as the docqa preset puts it;
    the run's format holding them all."""
    return BOXED.model_copy(
        update={"domains": {d: _worked(d, level) for d, level in BROAD_LEVELS.items()} | {DOC_DOMAIN: DOC_QUOTE}}
    )


def _smollm2_broad() -> Recipe:
    arith, fmt = _smollm2_arith(), broad_format()  # the format once: training and evaluation put tasks alike
    return dict(
        name="smollm2-broad",
        description="SmolLM2-135M-Instruct as it ships, GRPO across 37 domains at once: 36 of nine families (arithmetic, "
        "comparison, dates, units, lists, strings, regex extraction, formatting, JSON restructuring), answers "
        "boxed (JSON replies as JSON), and the span-recovery tasks of the LaTeX News documents (doc_qa "
        f"verifier); the scheduler draws toward the domains whose groups disagree, with a floor and revisits, and "
        f"steps each domain's difficulty by its pass rate; against forgetting, a fifth of each batch replays "
        f"the general domains' train split (the control that kept the most gain within the bounds of "
        f"bench/learning.py --forgetting: +20.6 points of the uncontrolled +23.0, the general check +5.5 "
        f"instead of -7.0); evaluated per domain on prompts it never trained on, with the general check beside "
        f"it. Its task set {DOCQA_TASK_SET!r} is built first from Debian's LaTeX News issues (the Training page's button does it)",
        model=REAL_MODEL,
        sft=None,
        documents=DOCQA_DOCUMENTS,
        # never stepped below the difficulty it is evaluated at (below it, list.int.length's answer is always 3, not 4).
        # Measured with steps down to the lowest difficulty whose answers vary: no more signal (x1.13; at single digits the
        # model still copies the worked example's sum), and str.first_char.letters, trained on three-letter words, fell
        # from 37.5% to 6.2% where it is evaluated (as under signal weights alone, which never step)
        grpo=arith["grpo"]
        | {
            "domains": [DomainSpec(name=d, difficulty=level, min_difficulty=level) for d, level in BROAD_LEVELS.items()]
            + [DomainSpec(name=DOC_DOMAIN, task_set=DOCQA_TASK_SET)],
            "prompt_format": fmt,
            "scheduler": BROAD_CURRICULUM,
            "max_new_tokens": 80,
            "lr": 1e-5,
            "max_steps": 30,
            "checkpoint_every": 10,
            "logprob_check": {"every": 10, "trajectories": 8},
            # the forgetting arms from the same start (bench/results/forgetting-smollm2-broad.json): replay
            # met both bounds; KL 0.05 kept the gain and not the general check (-9.4), LoRA lost a quarter
            # of the gain and more of the check, interpolation at 0.75 kept 94% of the gain at -3.9
            "replay": {"share": 0.2},
        },
        eval=arith["eval"]
        | {
            "domains": [*BROAD_LEVELS, DOC_DOMAIN],
            "difficulty": 2,
            "difficulties": {d: level for d, level in BROAD_LEVELS.items() if level != 2},
            "task_sets": {DOC_DOMAIN: DOCQA_TASK_SET},
            "prompt_format": fmt,
            "tasks_per_domain": 16,
            "max_new_tokens": 80,
            "general": {"tasks_per_domain": 32},
        },
    )


# --- a base model, post-trained from raw -----------------------------------------------------------------
GEMMA_BASE = "gemma3-270m"  # the second built-in: a pretrained base model with no chat template


def _gemma3_base_to_instruct() -> Recipe:
    # the broad preset's 36 procedural domains (not its document domain), each in its own format at its own level:
    # as it ships Gemma answers 23.6% of them greedily in the completion format (8 tasks a domain; 18 of 36 between
    # never and always right), but two-digit sums 0% (72 + 63 = 101), so the two arithmetic domains alone gave GRPO
    # nothing to sharpen (SFT 12.0%, GRPO after it 8.0%). SFT is the short warm-up that teaches the template and each
    # domain's answer form; GRPO, as the broad preset's, draws toward the domains whose groups disagree, at half its
    # rate: at 1e-5 it learned the unit conversions but forgot JSON picking and thousands separators (+1.4 points
    # over SFT); at 5e-6, +8.3
    broad = _smollm2_broad()
    domains = [d for d in broad["grpo"]["domains"] if d.name != DOC_DOMAIN]
    return dict(
        name="gemma3-base-to-instruct",
        description="Gemma 3 270M, a pretrained base model (no chat template), post-trained from raw on 36 of the "
        "platform's own domains (arithmetic, comparison, dates, units, lists, strings, regex extraction, "
        "formatting, JSON restructuring): evaluated as it ships in the plain completion format (questions "
        "and answers as text, one worked example a domain), then SFT on their reference answers in Gemma's "
        "chat template, then GRPO on the same domains; each model evaluated on prompts no step trained on, "
        "with the general check beside it",
        model=GEMMA_BASE,
        evaluate_base=True,
        sft=dict(
            domains=list(BROAD_LEVELS),
            difficulty=2,
            difficulties=broad["eval"]["difficulties"],
            prompt_format=broad["grpo"]["prompt_format"],
            tasks_per_domain=64,
            chat_template="gemma",
            max_seq_len=512,
            packing=True,
            micro_batch_size=4,
            grad_accum_steps=2,
            lr=3e-5,
            max_steps=24,
            checkpoint_every=12,
            device="cpu",
            seed=0,
            activation_checkpointing=True,
        ),  # 7.5 GB at peak here, about 35 s a step (the arithmetic recipe: 9.9 GB without)
        # without the broad preset's replay until its own forgetting arms are measured (recorded without it)
        grpo=broad["grpo"]
        | {"domains": domains, "lr": 5e-6, "micro_batch_size": 8, "checkpoint_every": 10, "replay": None},
        eval=broad["eval"] | {"domains": list(BROAD_LEVELS), "task_sets": {}},
    )


_RECIPES: dict[str, Callable[[], Recipe]] = {
    "cpu-demo": _cpu_demo,
    "cpu-small": _cpu_small,
    "cpu-quick": _cpu_quick,
    "smollm2-arith": _smollm2_arith,
    "smollm2-quick": _smollm2_quick,
    "smollm2-tools": _smollm2_tools,
    "smollm2-docqa": _smollm2_docqa,
    "smollm2-repair": _smollm2_repair,
    "smollm2-broad": _smollm2_broad,
    "gemma3-base-to-instruct": _gemma3_base_to_instruct,
}


def preset_names() -> list[str]:
    return sorted(_RECIPES)


def recipe(name: str) -> Recipe:
    """The recipe of preset ``name``; a ValueError naming the known presets when there is none."""
    if name not in _RECIPES:
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(preset_names())}")
    return _RECIPES[name]()


def recipe_section(name: str, section: str) -> dict[str, Any]:
    """One section (``sft``, ``grpo``, ``eval``) of preset ``name`` as the fields a job config would set."""
    fields: dict[str, Any] | None = recipe(name)[section]
    if fields is None:
        raise ValueError(f"preset {name!r} has no {section} section")
    return dict(fields)
