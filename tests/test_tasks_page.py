"""The Tasks page's "Try a model" on a code-repair task: a real episode against a live deployment, each tool call
run in a real sandbox, shown turn by turn, the project graded by its hidden tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import REPO_ROOT, console_deployment, login_as, reachable_dir
from streamlit.testing.v1 import AppTest
from test_models_page import tiny_model  # noqa: F401 - its module-scoped tiny model

from posttrain.platform.settings import get_settings
from posttrain.platform.tasks import store
from posttrain.platform.tasks.domains.registry import generate
from posttrain.platform.verifiers import TaskSpec

pytestmark = [pytest.mark.requires("bubblewrap")]

PAGE = str(REPO_ROOT / "ui" / "views" / "tasks.py")


def repair_task() -> TaskSpec:
    """A one-function module with a wrong operator: one short edit repairs it."""
    return next(
        t
        for t in generate("repair.wrong_operator", 64, seed=0, difficulty=1)
        if "a - b" in t.metadata["files"]["solution.py"]
    )


def fix_call(task: TaskSpec) -> str:
    from posttrain.training.demonstrations import fix_edits

    (edit,) = fix_edits(task.metadata["files"]["solution.py"], task.reference or "")
    return (
        '<tool_call>{"name": "edit_file", "arguments": '
        + json.dumps({"path": "solution.py", "old": edit.old, "new": edit.new})
        + "}</tool_call>"
    )


@pytest.fixture(scope="module")
def repairer(tiny_model, tmp_path_factory: pytest.TempPathFactory) -> Path:  # type: ignore[no-untyped-def]  # noqa: F811
    """The tiny model taught one repair on the engine's own renderings of the episode as "Try a model" runs it: the
    tools described in the system message, an edit_file call that fixes the module, then DONE after the tool's real
    output (captured by running the same exchange, scripted, through the agent loop in a real sandbox)."""
    from drills import TokenExample, memorize

    from posttrain.platform.engines import EngineConfig
    from posttrain.platform.engines.profiles import DEFAULT_TIERS
    from posttrain.platform.sandbox import SandboxConfig, SandboxPool, tool_schemas
    from posttrain.platform.sandbox.agent import run_agent
    from posttrain.platform.serving import EmbeddedEngine
    from posttrain.platform.serving.protocol import ChatCompletionRequest
    from posttrain.platform.tasks.episodes import PROJECT_TOOLS, episode_messages, lay_out, task_messages

    task = repair_task()
    replies = [fix_call(task), "DONE."]
    script = iter(replies)
    with SandboxPool(SandboxConfig(pool_size=1), data_dir=reachable_dir()) as pool, pool.acquire() as sandbox:
        lay_out(task, sandbox)
        start = episode_messages(task_messages(task), tool_schemas(PROJECT_TOOLS))
        episode = run_agent(
            lambda history, schemas: {"role": "assistant", "content": next(script)}, sandbox, start, tools=PROJECT_TOOLS
        )
    assert episode.stop_reason == "answer" and episode.tool_results[0].ok, episode
    engine = EmbeddedEngine(
        EngineConfig(model_path=str(tiny_model), served_model_name="tiny", tier=DEFAULT_TIERS["standard"])
    )
    tokenizer = engine.tokenizer
    turns = [i for i, m in enumerate(episode.messages) if m["role"] == "assistant"]
    rows = []
    for index, reply in zip(turns, replies):
        prompt = engine.prepare_chat(ChatCompletionRequest(model="tiny", messages=episode.messages[:index])).prompt_ids
        rows.append(
            TokenExample.completion(
                prompt, tokenizer(reply, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            )
        )
    path = tmp_path_factory.mktemp("repairer") / "repairer"
    shutil.copytree(tiny_model, path)
    losses = memorize(path, rows, steps=300)  # type: ignore[arg-type]
    assert losses[-1] < 0.05, losses[-5:]
    return path


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_try_a_model_runs_a_repair_task_as_an_episode_in_a_sandbox(
    platform_env: dict[str, str], repairer: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from posttrain.platform.auth import audit_log

    monkeypatch.setenv(
        "POSTTRAIN_DATA_DIR", str(reachable_dir())
    )  # the console's sandbox: a directory its uid can enter
    get_settings.cache_clear()
    task = repair_task()
    store.save_tasks("repairs", [task])
    try:
        with console_deployment("repairer", repairer, "standard"):
            at = login_as(AppTest.from_file(PAGE, default_timeout=180)).run()
            assert not at.exception, at.exception
            assert at.toggle(key="try_model_episode").value  # a repair task runs as an episode by default
            at.number_input(key="try_model_tokens").set_value(256)
            at.button(key="try_model_go").click().run()
            assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
            shown = [c.value for c in at.code]
            call = json.loads(fix_call(task).removeprefix("<tool_call>").removesuffix("</tool_call>"))
            # The model's edit, what the sandbox really answered, then the module as the episode left it: fixed.
            assert json.dumps(call["arguments"]) in shown, shown
            assert any(
                "solution.py" in c and "edit" in c.lower() for c in shown if c != json.dumps(call["arguments"])
            ), shown
            assert task.reference is not None and any(c.strip() == task.reference.strip() for c in shown), shown
            captions = [c.value for c in at.caption]
            assert any("2 replies, 1 tool call" in c and "ended: answer" in c for c in captions), captions
            assert any("score 1.00, passed" in s.value for s in at.success), [s.value for s in at.success]
            ran = [e for e in audit_log(limit=50) if e.action == "sandbox.run"]
            assert ran and ran[0].target == "edit_file"
            assert any(e.action == "task.try_episode" for e in audit_log(limit=50))

            at.toggle(key="try_model_episode").set_value(False).run()  # one completion, as before: nothing runs
            at.button(key="try_model_go").click().run()
            assert not at.exception and any("repairer answers" in m.value for m in at.markdown)
    finally:
        get_settings.cache_clear()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_tasks_page_shows_tests_forgeable_by_mutation(platform_env: dict[str, str]) -> None:
    """A build of imported code tasks: its summary counts the tests code can pass by rewriting an argument in place and
    names each with its task; the flagged task says so when opened, the other does not."""
    from conftest import OPERATOR, start_worker
    from test_importers import WEAK_TESTS, code_line

    from posttrain.platform.db.models import JobStatus
    from posttrain.platform.jobs import queue

    path = Path(platform_env["POSTTRAIN_DATA_DIR"]) / "uploads" / "sorting.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(
        "\n".join([code_line(WEAK_TESTS, "weak"), code_line("assert f([3, 1]) == [1, 3]\n", "fine")]) + "\n"
    )
    job_id = queue.submit(
        OPERATOR, "build_tasks", {"task_set": "sorting", "source": {"type": "jsonl", "path": str(path)}}
    )
    assert start_worker(platform_env, "--exit-when-idle").wait(timeout=120) == 0
    assert queue.get_job(job_id).status is JobStatus.succeeded

    at = login_as(AppTest.from_file(PAGE, default_timeout=60)).run()
    assert not at.exception, at.exception
    builds = next(d.value for d in at.dataframe if "tests forgeable by mutation" in d.value.columns)
    assert builds.set_index("job").loc[job_id, "tests forgeable by mutation"] == 1
    (expander,) = [e for e in at.expander if "forgeable by mutation" in e.label]
    assert expander.label == f"Build job {job_id} (sorting): 1 test(s) in 1 task(s) are forgeable by mutation"
    reason = "passes `xs` to `f` and reads it again: code that rewrites `xs` in place can pass"
    assert any(f"weak, test 2: `assert f(xs) == sorted(xs)` {reason}" in m.value for m in expander.markdown)

    tasks = {t.spec.task_id: t.id for t in store.load_tasks(task_set="sorting")}
    box = at.selectbox(key="browse_task")
    assert "[forgeable by mutation]" in box.format_func(tasks["weak"]) and "forgeable" not in box.format_func(
        tasks["fine"]
    )
    box.set_value(tasks["weak"]).run()
    warned = [w.value for w in at.warning if "Forgeable by mutation" in w.value]
    assert len(warned) == 1 and f"test 2: `assert f(xs) == sorted(xs)` {reason}" in warned[0], warned
    at.selectbox(key="browse_task").set_value(tasks["fine"]).run()
    assert not at.exception and not [w for w in at.warning if "Forgeable by mutation" in w.value]
