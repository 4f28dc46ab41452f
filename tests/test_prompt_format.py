"""Prompt formats (how a run puts its tasks), the strict boxed answer, the general check beside an
evaluation, and the real-model presets' shape: checked on real generators, verifiers and configs."""

from __future__ import annotations

import re

import pytest

from posttrain.platform.sandbox import parse_tool_calls
from posttrain.platform.tasks.domains import generate, prompt_hash
from posttrain.platform.tasks.heldout import check_held_out
from posttrain.platform.tasks.jobs import BuildTasksConfig
from posttrain.platform.tasks.prompt_format import PromptFormat, ToolStep, WorkedExample, apply_format
from posttrain.platform.verifiers import default_service
from posttrain.platform.verifiers.models import ChatMessage
from posttrain.training.config import EvalConfig, GeneralCheck
from posttrain.training.evaluate import all_eval_tasks, eval_tasks, general_config
from posttrain.training.preset_recipes import BOXED
from posttrain.training.presets import get_preset, preset_names
from posttrain.training.scheduler import DomainSpec, Scheduler, SchedulerConfig


def test_a_format_frames_the_prompt_and_keeps_the_tasks_own_system_message_first() -> None:
    task = generate("arith.add.int", 1, seed=3, difficulty=2)[0]
    task = task.model_copy(update={"prompt": [ChatMessage(role="system", content="Be brief."), *task.prompt]})
    question = task.prompt[-1].text
    fmt = PromptFormat(instruction="Answer in digits.", examples=[WorkedExample(user="Compute 1 + 1.", assistant="2")])
    framed = fmt.apply(task)
    assert [(m.role, m.text) for m in framed.prompt] == [
        ("system", "Be brief."),
        ("user", "Compute 1 + 1."),
        ("assistant", "2"),
        ("user", f"{question}\nAnswer in digits."),
    ]
    replaced = PromptFormat(system="You are a calculator.").apply(task)
    assert [m.role for m in replaced.prompt] == ["system", "user"] and replaced.prompt[
        0
    ].text == "You are a calculator."
    assert framed.verifier == task.verifier  # answer: as_task leaves the verifier alone


def test_boxed_answers_are_strict_and_the_reference_still_scores_one() -> None:
    service = default_service()
    for domain in ("arith.add.int", "arith.sub.int"):
        for task in apply_format(generate(domain, 5, seed=1, difficulty=2), BOXED):
            value = task.verifier.spec["value"]
            right = f"{value:g}"
            assert service.verify(task, task.reference or "").score == 1.0
            assert service.verify(task, f"The sum is 3.\n\\boxed{{{right}}}").score == 1.0  # the last box is read
            unboxed = service.verify(task, f"The answer is {right}.")
            assert unboxed.score == 0.0 and "boxed" in unboxed.details  # right number, no box: no answer
            assert service.verify(task, f"\\boxed{{{value + 1:g}}} ... {right}").score == 0.0


def test_boxed_is_refused_for_a_verifier_that_cannot_read_a_box() -> None:
    task = generate("json.pick", 1, seed=0, difficulty=2)[0]  # a JSON-schema verifier
    with pytest.raises(ValueError, match="json.pick.*as_task"):
        BOXED.apply(task)


def test_domains_of_another_kind_get_a_format_of_their_own_in_training_and_evaluation_alike() -> None:
    json_format = PromptFormat(instruction="Reply with the JSON only.")
    mixed = BOXED.model_copy(
        update={"domains": {"json.": json_format, "json.pick": PromptFormat(instruction="Only it.")}}
    )
    assert mixed.for_domain("json.drop") is json_format and mixed.for_domain("json.pick").instruction == "Only it."
    assert mixed.for_domain("arith.add.int") is mixed and mixed.for_domain("jsonish") is mixed
    scheduler = Scheduler(SchedulerConfig(batch_size=16, seed=0))
    domains = [DomainSpec(name="arith.add.int", difficulty=2), DomainSpec(name="json.drop", difficulty=2)]
    scheduler.set_domains(domains, mixed)
    drawn = {t.domain: t for _ in range(4) for t in scheduler.next_batch()}
    assert drawn["arith.add.int"].verifier.spec["extract"] == "boxed_only"
    assert drawn["json.drop"].prompt[-1].text.endswith("\nReply with the JSON only.")
    assert drawn["json.drop"].verifier.kind == "json_schema" and len(drawn["json.drop"].prompt) == 1
    evaluation = EvalConfig(
        domains=["arith.add.int", "json.drop"], difficulty=2, prompt_format=mixed, tasks_per_domain=4
    )
    held = {t.domain: t for t in all_eval_tasks(evaluation)}
    assert held["json.drop"].prompt[-1].text.endswith("\nReply with the JSON only.")
    assert EvalConfig.model_validate_json(evaluation.model_dump_json()) == evaluation  # stored with the job and back
    with pytest.raises(ValueError, match="one level only"):
        PromptFormat(domains={"json.": mixed})


def test_the_scheduler_and_the_evaluation_put_tasks_the_same_way_and_stay_disjoint() -> None:
    scheduler = Scheduler(SchedulerConfig(batch_size=16, seed=0))
    scheduler.set_domains([DomainSpec(name="arith.add.int", difficulty=2)], BOXED)
    drawn = [t for _ in range(4) for t in scheduler.next_batch()]
    assert all(t.verifier.spec["extract"] == "boxed_only" and len(t.prompt) == 3 for t in drawn)
    evaluation = EvalConfig(domains=["arith.add.int"], difficulty=2, prompt_format=BOXED, tasks_per_domain=64)
    held = eval_tasks(evaluation, "arith.add.int")
    assert all(t.prompt[:2] == drawn[0].prompt[:2] for t in held)  # the same worked example
    assert check_held_out(drawn, all_eval_tasks(evaluation)).ok
    assert not {prompt_hash(t.prompt_text) for t in drawn} & {prompt_hash(t.prompt_text) for t in held}


def test_the_general_check_leaves_out_the_evaluated_domains_and_is_validated_at_the_edge() -> None:
    evaluation = EvalConfig(domains=["list.int.max"], difficulty=2, general=GeneralCheck())
    general = general_config(evaluation)
    assert general is not None and "list.int.max" not in general.domains and general.prompt_format is None
    assert (
        general_config(
            EvalConfig(domains=["list.int.max"], difficulty=2, general=GeneralCheck(domains=["list.int.max"]))
        )
        is None
    )
    with pytest.raises(ValueError, match="held-out"):
        EvalConfig(
            domains=["list.int.max"], difficulty=2, general=GeneralCheck(domains=["compare.larger.int"], difficulty=1)
        )


def test_real_model_presets_start_from_the_built_in_model_with_the_general_check() -> None:
    real = [n for n in preset_names() if n.startswith("smollm2-")]
    assert {"smollm2-arith", "smollm2-quick", "smollm2-repair"} <= set(real)
    for name in real:
        run = get_preset(name)
        # SFT only on demonstrations the run makes itself, never on the evaluated tasks' references
        assert run.model == "smollm2-135m-instruct" and (
            run.sft is None or (run.sft.demonstrations and not run.sft.domains)
        )
        assert run.eval.general is not None and not set(run.eval.general.domains) & set(run.eval.domains)
        assert run.grpo.prompt_format == run.eval.prompt_format  # trained and measured the same way
        trained = {d.name if isinstance(d, DomainSpec) else d for d in run.grpo.domains}
        # the same domains (or one set), and at most an out-of-distribution domain no training task comes from
        assert trained <= set(run.eval.domains) and run.grpo.task_set == run.eval.task_set
        assert set(run.eval.domains) - trained <= {"repair.humaneval"}
        if run.sft is not None:  # demonstrations in the environment GRPO and the evaluation run
            assert run.sft.demonstrations.environment == run.grpo.environment
            assert {d.name for d in run.sft.demonstrations.domains} == trained
        assert run.eval.environment == (run.grpo.environment if run.grpo.environment.multi_turn else None)
        if run.grpo.task_set is not None:  # a document preset says which documents its set is built from, and how
            assert run.documents is not None and run.documents.task_set == run.grpo.task_set
            BuildTasksConfig.model_validate(
                {
                    "task_set": run.documents.task_set,
                    "source": {"type": "documents", "document_ids": [1], **run.documents.source},
                }
            )


def test_a_worked_example_calls_tools_the_way_the_tool_environment_reads_calls() -> None:
    example = WorkedExample(
        user="Compute 2 * 3.",
        assistant="\\boxed{6}",
        tools=[ToolStep(name="python", arguments={"code": "print(2 * 3)"}, result="6\n")],
    )
    task = PromptFormat(examples=[example], answer="boxed").apply(
        generate("arith.sum_list.int", 1, seed=0, difficulty=2)[0]
    )
    assert [m.role for m in task.prompt] == ["user", "assistant", "tool", "assistant", "user"]
    parsed = parse_tool_calls(task.prompt[1].text)
    assert [(c.name, c.arguments) for c in parsed.calls] == [
        ("python", {"code": "print(2 * 3)"})
    ] and not parsed.content.strip()
    assert task.prompt[2].text == "6\n" and task.prompt[3].text == "\\boxed{6}"
    # the tools preset's examples: each call's printed product is the result shown and the boxed answer
    for shown in get_preset("smollm2-tools").eval.prompt_format.examples:  # type: ignore[union-attr]
        (step,) = shown.tools
        a, b = map(int, re.fullmatch(r"print\((\d+) \* (\d+)\)", step.arguments["code"]).groups())  # type: ignore[union-attr]
        product = a * b
        assert step.result == f"{product}\n" and shown.assistant == f"\\boxed{{{product}}}"


def test_the_base_model_preset_starts_from_the_second_built_in_and_gives_it_gemma_s_template() -> None:
    """gemma3-base-to-instruct: the base model evaluated as it ships (in the completion format), SFT on the same
    domains GRPO trains and the evaluation holds out prompts of, in Gemma's template, the general check beside."""
    from posttrain.platform.models.importer import BUILTIN_MODELS

    run = get_preset("gemma3-base-to-instruct")
    assert run.model in BUILTIN_MODELS and run.model != "smollm2-135m-instruct" and run.evaluate_base
    assert run.sft is not None and run.sft.chat_template == "gemma" and run.sft.demonstrations is None
    trained = {d.name if isinstance(d, DomainSpec) else d for d in run.grpo.domains}
    assert set(run.sft.domains) == trained == set(run.eval.domains)
    assert run.sft.prompt_format == run.grpo.prompt_format == run.eval.prompt_format
    assert all(run.sft.difficulty_of(d) == run.eval.difficulty_of(d) for d in trained)
    assert run.eval.general is not None and not set(run.eval.general.domains) & trained
