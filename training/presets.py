"""Named run presets: tested defaults for the SFT, GRPO and evaluation configs of a run.

    from posttrain.training.presets import get_preset, preset_names
    run = get_preset("cpu-demo")            # RunPreset(model=TinyModelSpec, sft=SFTConfig, grpo=GRPOConfig, eval=EvalConfig)
    run.grpo.updated(model="my-sft-model")

A job config may name a preset and override any of its fields (YAML for
``posttrain jobs submit train_grpo --config-file run.yaml``)::

    preset: cpu-demo
    model: demo-sft          # a registered model name or a model directory
    max_steps: 40

The preset supplies every field the file leaves out (``train_sft`` takes the preset's
``sft`` section, ``train_grpo`` its ``grpo`` section, ``evaluate`` its ``eval`` section).

Presets:

- ``cpu-demo``: a tiny locally built Qwen2 (byte-level BPE, 300 tokens, hidden 64, 2 layers),
  an SFT warm-up stopped part-way on two procedural domains at difficulty 3 (three-digit number
  words to digits, zero-padding), then GRPO on the same domains; evaluated on the eval split, whose
  prompts training never draws. ``bench/learning.py`` measures it against a control that continues
  SFT for as many extra steps from the same warm-up.
- ``cpu-small``: the same recipe with a slightly larger model and more steps.
- ``cpu-quick``: cpu-demo cut down to one domain (zero-padding), 300 SFT and 100 GRPO steps: two to
  three minutes on a 2-core CPU, for a first look at the console's flow (and its browser test).

Real-model presets start from the built-in SmolLM2-135M-Instruct (``model`` names a registered model;
no SFT on the evaluated domains), put every task the same way for training and evaluation
(``prompt_format``) and run the fixed general check beside each evaluation (``eval.general``):

- ``smollm2-arith``: two-digit additions and subtractions, one worked example in the chat history, the
  answer read from ``\\boxed{}`` only (strict); GRPO with dynamic sampling.
- ``smollm2-quick``: the one-click demo on the real model: two-digit additions only, fewer steps.

- ``smollm2-tools``: the ``tool_use`` environment with a python tool in a sandbox: sums of four numbers, which the
  model does not think to hand to the tool after two worked products; episodes scored on the boxed answer.
- ``smollm2-docqa``: tasks built from uploaded documents (its ``documents`` section: which files, how the task set
  is built); the run trains on the task set's train split and is evaluated on its eval split.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from posttrain.platform.models.specs import TinyModelSpec
from posttrain.platform.tasks.builders import span_recovery_example
from posttrain.platform.tasks.prompt_format import PromptFormat, ToolStep, WorkedExample
from posttrain.training.config import EnvironmentConfig, EvalConfig, GeneralCheck, GRPOConfig, SFTConfig
from posttrain.training.scheduler import DomainSpec, SchedulerConfig


class PresetDocuments(BaseModel):
    """The documents a preset's task set is built from, and how: uploaded, preprocessed, then one ``build_tasks``
    job over them (``source``: the documents source's fields, less the document ids)."""

    model_config = ConfigDict(extra="forbid")
    task_set: str
    paths: list[str] = Field(min_length=1, description="files or glob patterns")
    source: dict[str, Any] = Field(default_factory=dict)


class RunPreset(BaseModel):
    """A whole run: the model (a tiny one to build, or a registered model's name), the SFT warm-up (None: GRPO
    starts from the model as it is), GRPO, evaluation."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str
    model: TinyModelSpec | str
    sft: SFTConfig | None
    grpo: GRPOConfig
    eval: EvalConfig
    documents: PresetDocuments | None = None  # the documents its task set is built from (a document preset)


# Held out by construction: at difficulty 3 each domain has about 900-2,800 distinct prompts, a fifth
# of them in the eval split that training never draws (difficulty 1 had ten prompts and no eval split).
CPU_DEMO_DOMAINS = ["format.from_words", "format.zero_pad"]
CPU_DEMO_DIFFICULTY = 3


def _cpu_demo() -> RunPreset:
    domains, level = CPU_DEMO_DOMAINS, CPU_DEMO_DIFFICULTY
    return RunPreset(
        name="cpu-demo",
        description="tiny model, SFT warm-up then GRPO on reading three-digit number words and zero-padding numbers; "
                    "evaluated on prompts it never trained on; minutes on a 2-core CPU",
        model=TinyModelSpec(vocab_size=300, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                            intermediate_size=256, max_position_embeddings=256, seed=0),
        # a partial warm-up: stopped mid-way through learning the mapping, so GRPO has reward variance
        sft=SFTConfig(domains=domains, difficulty=level, tasks_per_domain=8192, max_steps=420, lr=3e-3, packing=False,
                      micro_batch_size=32, max_seq_len=256, device="cpu", checkpoint_every=140, seed=0),
        grpo=GRPOConfig(domains=[DomainSpec(name=d, difficulty=level) for d in domains],
                        scheduler=SchedulerConfig(batch_size=16, seed=0), group_size=8,
                        max_new_tokens=6, temperature=1.0, lr=3e-4, max_steps=200, micro_batch_size=64,
                        max_rollout_batches_per_step=1, checkpoint_every=50, device="cpu", seed=0,
                        verifier_workers=1),
        eval=EvalConfig(domains=domains, difficulty=level, tasks_per_domain=200, max_new_tokens=6, batch_size=100, device="cpu"),
    )


def _cpu_small() -> RunPreset:
    demo = _cpu_demo()
    return demo.model_copy(update={
        "name": "cpu-small",
        "description": "cpu-demo with a larger model (hidden 128, 4 layers) and more GRPO steps",
        "model": demo.model.model_copy(update={"hidden_size": 128, "num_layers": 4, "intermediate_size": 512}),
        "grpo": demo.grpo.updated(max_steps=300),
    })


def _cpu_quick() -> RunPreset:
    demo = _cpu_demo()
    domains = ["format.zero_pad"]  # "Pad 191 with zeros to 5 digits.": about 2,800 prompts at difficulty 3
    return demo.model_copy(update={
        "name": "cpu-quick",
        "description": "cpu-demo on one domain (zero-padding three-digit numbers), a 300-step SFT warm-up and 100 GRPO "
                       "steps, evaluated on prompts it never trained on: two to three minutes on a 2-core CPU",
        "sft": demo.sft.updated(domains=domains, max_steps=300, checkpoint_every=100),
        "grpo": demo.grpo.updated(domains=[DomainSpec(name=d, difficulty=CPU_DEMO_DIFFICULTY) for d in domains],
                                  max_steps=100, lr=1e-3, checkpoint_every=20),  # 60 gained 0.5 to 11.5 points by seed here
        "eval": demo.eval.model_copy(update={"domains": domains, "tasks_per_domain": 200}),
    })


# --- the real model ---------------------------------------------------------------------
REAL_MODEL = "smollm2-135m-instruct"  # the built-in model (posttrain.platform.models.importer.DEFAULT_MODEL)
BOXED = PromptFormat(
    instruction="Put your final answer within \\boxed{}.",
    examples=[WorkedExample(user="Compute 12 + 7.\nPut your final answer within \\boxed{}.",
                            assistant="12 + 7 = 19.\n\n\\boxed{19}")],
    answer="boxed",
)
# held out by construction: every domain here has thousands of prompts at its difficulty, a fifth in eval
ARITH_DOMAINS = [DomainSpec(name="arith.add.int", difficulty=2), DomainSpec(name="arith.sub.int", difficulty=2)]


def _smollm2_arith() -> RunPreset:
    domains = ARITH_DOMAINS
    return RunPreset(
        name="smollm2-arith",
        description="SmolLM2-135M-Instruct as it ships, GRPO on two-digit additions and subtractions with the answer "
                    "in \\boxed{} (strict), one worked example in the chat; evaluated on prompts it never trained on, "
                    "with the general check beside it",
        model=REAL_MODEL, sft=None,
        grpo=GRPOConfig(domains=domains, prompt_format=BOXED, scheduler=SchedulerConfig(batch_size=8, seed=0),
                        group_size=8, max_new_tokens=40, temperature=1.0, lr=5e-6, max_steps=10, micro_batch_size=16,
                        max_rollout_batches_per_step=2, checkpoint_every=10, device="cpu", seed=0, verifier_workers=1,
                        logprob_check={"every": 10, "trajectories": 8}),
        eval=EvalConfig(domains=[d.name for d in domains], difficulty=2, prompt_format=BOXED, tasks_per_domain=50,
                        max_new_tokens=40, batch_size=50, device="cpu", general=GeneralCheck(tasks_per_domain=100)),
    )


def _smollm2_quick() -> RunPreset:
    arith = _smollm2_arith()
    domains = ARITH_DOMAINS[:1]
    return arith.model_copy(update={
        "name": "smollm2-quick",
        "description": "the one-click demo on the real model: GRPO on two-digit additions (answer in \\boxed{}), "
                       "4 prompts x 8 samples a step for 8 steps, evaluated greedily on 64 prompts it never trained on "
                       "with a 64-task general check beside it: several minutes on a 2-core CPU",
        "grpo": arith.grpo.updated(domains=domains, scheduler=SchedulerConfig(batch_size=4, seed=0), lr=1e-5, max_steps=8,
                                   max_rollout_batches_per_step=1, checkpoint_every=4,
                                   logprob_check={"every": 4, "trajectories": 8}),
        "eval": arith.eval.model_copy(update={"domains": [d.name for d in domains], "tasks_per_domain": 64, "batch_size": 32,
                                              "general": GeneralCheck(tasks_per_domain=16)}),
    })


# --- the real model with tools: the python tool is there to be used -----------------------------------
def _multiply_with_python(a: int, b: int) -> WorkedExample:
    return WorkedExample(user=f"Compute {a} * {b}.\nPut your final answer within \\boxed{{}}.",
                         tools=[ToolStep(name="python", arguments={"code": f"print({a} * {b})"}, result=f"{a * b}\n")],
                         assistant=f"\\boxed{{{a * b}}}")


# two worked multiplications: with them the model calls python for every two-digit product (greedy, 48 of 48
# here) but not for a sum of four numbers (0 of 16 greedy; 4 of 64 sampled at 0.7 call it right): the gain to find
TOOL_CALLS = PromptFormat(instruction="Put your final answer within \\boxed{}.",
                          examples=[_multiply_with_python(23, 41), _multiply_with_python(56, 17)], answer="boxed")
TOOLS_DOMAINS = [DomainSpec(name="arith.sum_list.int", difficulty=2)]
PYTHON_TOOL = EnvironmentConfig(name="tool_use", tools=["python"], max_turns=3, max_episode_tokens=1024,
                                episode_timeout_s=60.0, tool_timeout_s=5.0, concurrency=16)


def _smollm2_tools() -> RunPreset:
    domains = TOOLS_DOMAINS
    return RunPreset(
        name="smollm2-tools",
        description="SmolLM2-135M-Instruct as it ships, GRPO in the tool_use environment (a python tool in a sandbox, up "
                    "to three turns) on sums of four two-digit numbers, answer in \\boxed{} (strict); two worked "
                    "examples show the tool on products only; evaluated greedily as episodes on prompts it never trained on",
        model=REAL_MODEL, sft=None,
        grpo=GRPOConfig(domains=domains, prompt_format=TOOL_CALLS, environment=PYTHON_TOOL,
                        scheduler=SchedulerConfig(batch_size=8, seed=0), group_size=8, max_new_tokens=60, temperature=0.7,
                        lr=1e-5, max_steps=10, micro_batch_size=8, max_rollout_batches_per_step=2, checkpoint_every=5,
                        device="cpu", seed=0, verifier_workers=1, logprob_check={"every": 5, "trajectories": 8}),
        eval=EvalConfig(domains=[d.name for d in domains], difficulty=2, prompt_format=TOOL_CALLS, environment=PYTHON_TOOL,
                        tasks_per_domain=64, max_new_tokens=60, batch_size=64, device="cpu", general=GeneralCheck(tasks_per_domain=100)),
    )


# --- the real model on the operator's documents ----------------------------------------------------------
DOCQA_TASK_SET = "smollm2-docqa"
# two worked examples not from the documents, worded as the builder words its tasks, each answer a term of the
# kind the builder masks (a capitalised word, a number): with one example whose answer was "twice" the model
# answered "twice" to most tasks; with these it copies the page's sentence as its evidence (half the score)
# far more often (mean score 0.12 against 0.07 greedily on 30 held-out tasks), and the answer is the word
# that sentence has in the gap: the step GRPO has to find
DOC_QUOTE = PromptFormat(examples=[WorkedExample(user=user, assistant=reply) for user, reply in (
    span_recovery_example("guide.pdf", 2, "The Project Team releases a new version twice a year. Each release is tested on "
                          "Linux and Windows before it ships. Bug reports go to the Tracker.",
                          "Each release is tested on Linux and Windows before it ships.", "Windows"),
    span_recovery_example("notes.pdf", 5, "Version 3 of the Manual was printed in 1998. The Editors thank every reader who "
                          "sent corrections. A new Index lists all commands.", "A new Index lists all commands.", "Index"))])


def _smollm2_docqa() -> RunPreset:
    return RunPreset(
        name="smollm2-docqa",
        description="SmolLM2-135M-Instruct as it ships, GRPO on tasks built from uploaded documents (the LaTeX News "
                    "issues Debian ships): recover a masked term of a sentence from the passage around it, quoting the "
                    "evidence (doc_qa verifier: exact answer, evidence found on the page); evaluated on the task set's "
                    f"eval split. Build the task set {DOCQA_TASK_SET!r} first (bench/learning.py --preset smollm2-docqa does)",
        model=REAL_MODEL, sft=None,
        documents=PresetDocuments(task_set=DOCQA_TASK_SET, paths=["/usr/share/doc/texlive-doc/latex/base/ltnews[0-9]*.pdf"],
                                  source={"kinds": ["span_recovery"], "passage_chars": 400, "max_per_document": 24,
                                          "eval_fraction": 0.25, "seed": 0}),
        grpo=GRPOConfig(task_set=DOCQA_TASK_SET, prompt_format=DOC_QUOTE, scheduler=SchedulerConfig(batch_size=8, seed=0),
                        group_size=8, max_new_tokens=80, temperature=0.7, lr=2e-5, max_steps=12, micro_batch_size=16,
                        max_rollout_batches_per_step=2, checkpoint_every=6, device="cpu", seed=0, verifier_workers=1,
                        logprob_check={"every": 6, "trajectories": 8}),
        eval=EvalConfig(task_set=DOCQA_TASK_SET, prompt_format=DOC_QUOTE, tasks_per_domain=100, max_new_tokens=80,
                        batch_size=25, device="cpu", general=GeneralCheck()),
    )


_PRESETS = {"cpu-demo": _cpu_demo, "cpu-small": _cpu_small, "cpu-quick": _cpu_quick,
            "smollm2-arith": _smollm2_arith, "smollm2-quick": _smollm2_quick, "smollm2-tools": _smollm2_tools,
            "smollm2-docqa": _smollm2_docqa}
SECTION_OF_KIND = {"train_sft": "sft", "train_grpo": "grpo", "evaluate": "eval"}


def preset_names() -> list[str]:
    return sorted(_PRESETS)


def get_preset(name: str) -> RunPreset:
    try:
        return _PRESETS[name]()
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(preset_names())}") from None


def preset_section(name: str, section: str) -> dict[str, Any]:
    """One section (``sft``, ``grpo``, ``eval``) of a preset as the fields a job config would set."""
    config: BaseModel | None = getattr(get_preset(name), section)
    if config is None:
        raise ValueError(f"preset {name!r} has no {section} section")
    return config.model_dump(exclude_unset=True, exclude_defaults=False)


def apply_preset(values: Any, section: str, groups: tuple[str, ...] = ()) -> Any:
    """``values`` with a ``preset`` key: that preset's ``section`` fields, overridden by ``values``; a field
    in ``groups`` (a config's nested groups: ``optim``, ...) merges field by field, anything else replaces."""
    if not isinstance(values, dict) or "preset" not in values:
        return values
    values = dict(values)
    name = values.pop("preset")
    if name is None:
        return values
    if not isinstance(name, str):
        raise ValueError(f"preset must be a name ({', '.join(preset_names())}), got {name!r}")
    base = preset_section(name, section)
    merged = {**base, **values}
    for group in groups:
        given = values.get(group)
        if isinstance(base.get(group), dict) and given is not None:
            merged[group] = base[group] | (given.model_dump(exclude_unset=True) if isinstance(given, BaseModel) else dict(given))
    return merged
