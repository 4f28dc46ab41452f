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
no SFT on the evaluated tasks), put every task the same way for training and evaluation
(``prompt_format``) and run the fixed general check beside each evaluation (``eval.general``):

- ``smollm2-arith``: two-digit additions and subtractions, one worked example in the chat history, the
  answer read from ``\\boxed{}`` only (strict); GRPO with dynamic sampling.
- ``smollm2-quick``: the one-click demo on the real model: two-digit additions only, fewer steps.

- ``smollm2-tools``: the ``tool_use`` environment with a python tool in a sandbox: sums of four numbers, which the
  model does not think to hand to the tool after two worked products; episodes scored on the boxed answer.
- ``smollm2-repair``: terminal programming: SFT on expert demonstrations the run makes in real sandboxes (a
  scripted agent repairs train-split modules through the ``code_repair`` environment, ``sft.demonstrations``), then
  GRPO on ``code_repair`` episodes; evaluated as greedy episodes on three held-out groups (repairs of functions no
  training task shows, unseen modules of seen functions, HumanEval problems held out whole).
  ``bench/learning.py --preset smollm2-repair --arms`` compares it with GRPO alone and SFT alone.
- ``smollm2-docqa``: tasks built from uploaded documents (its ``documents`` section: which files, how the task set
  is built); the run trains on the task set's train split and is evaluated on its eval split.
- ``gemma3-base-to-instruct``: the second built-in, Gemma 3 270M, a pretrained base model with no chat template, on
  the broad preset's 36 procedural domains: evaluated as it ships in the plain completion format, SFT on their
  references in Gemma's chat template (``sft.chat_template``), GRPO on the same domains; the run evaluates all three
  (``evaluate_base``).

The recipes themselves are in :mod:`posttrain.training.preset_recipes`, below the configs that name them.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict

from posttrain.platform.jobs.presets import Preset, PresetDocuments, register_presets
from posttrain.platform.models.specs import TinyModelSpec
from posttrain.training.config import EvalConfig, GRPOConfig, SFTConfig
from posttrain.training.preset_recipes import preset_names, recipe, recipe_section

__all__ = ["SECTION_OF_KIND", "RunPreset", "get_preset", "preset_names", "preset_section"]


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
    evaluate_base: bool = False  # a whole-recipe run also evaluates the model before SFT (a base model: as text)


SECTION_OF_KIND = {"train_sft": "sft", "train_grpo": "grpo", "evaluate": "eval"}
_SECTION_CONFIG: dict[str, type[BaseModel]] = {"sft": SFTConfig, "grpo": GRPOConfig, "eval": EvalConfig}


def get_preset(name: str) -> RunPreset:
    return RunPreset.model_validate(recipe(name))


def preset_section(name: str, section: str) -> dict[str, Any]:
    """One section (``sft``, ``grpo``, ``eval``) of a preset, validated, as the fields a job config would set."""
    config = _SECTION_CONFIG[section].model_validate(recipe_section(name, section))
    return config.model_dump(exclude_unset=True, exclude_defaults=False)


# --- the catalogue the console reads through the platform ---------------------------------------------------------
def catalogue() -> list[Preset]:
    """Every preset as :mod:`posttrain.platform.jobs.presets` offers it: each job kind's section (the fields a job
    config naming the preset takes), the registered model it starts from, its documents."""
    found = []
    for name in preset_names():
        run = get_preset(name)
        sections = {
            kind: json.loads(json.dumps(preset_section(name, section), default=str))
            for kind, section in SECTION_OF_KIND.items()
            if getattr(run, section) is not None  # a real-model preset has no SFT section
        }
        model = run.model if isinstance(run.model, str) else None
        found.append(Preset(name=name, description=run.description, sections=sections, model=model,
                            documents=run.documents))  # fmt: skip
    return found


register_presets(catalogue)
