"""The Models & Serving page against a real database, with a real deployment for the playground."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import OPERATOR, REPO_ROOT, console_deployment, login_as
from streamlit.testing.v1 import AppTest

from posttrain.platform.engines.tiers import tiers_path
from posttrain.platform.jobs import queue
from posttrain.platform.models.registry import register_model, tool_training
from posttrain.platform.settings import get_settings

PAGE = str(REPO_ROOT / "ui" / "views" / "models.py")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from posttrain.platform.models import TinyModelSpec, build_tiny_model

    return build_tiny_model(
        tmp_path_factory.mktemp("m") / "tiny",
        TinyModelSpec(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128),
    )


def test_registry_forms_and_tiers(platform_env: dict[str, str], tiny_model) -> None:  # type: ignore[no-untyped-def]
    at = login_as(AppTest.from_file(PAGE, default_timeout=60)).run()
    assert not at.exception and "No models yet" in at.info[0].value
    at.text_input(key="register_name").set_value("mine")
    at.text_input(key="register_path").set_value(str(tiny_model))
    at.button[2].click().run()  # Register (after Import and Build)
    assert any("Registered mine" in s.value for s in at.success), [e.value for e in at.error]
    assert list(at.dataframe[0].value["model"]) == ["mine"]

    at.text_input(key="register_name").set_value("bad")
    at.text_input(key="register_path").set_value("/nonexistent/dir")
    at.button[2].click().run()
    assert any("/nonexistent/dir" in e.value for e in at.error)

    at.selectbox(key="deploy_model").set_value("mine")
    at.button[3].click().run()  # Deploy
    assert not at.error, [e.value for e in at.error]
    job = queue.list_jobs(limit=1)[0]
    assert job.kind == "deploy" and job.config["model"] == "mine"

    catalog = json.loads(at.text_area(key="tiers_json").value)
    catalog["tiers"]["fast"]["embedded"]["prompt_lookup_num_tokens"] = 4
    at.text_area(key="tiers_json").set_value(json.dumps(catalog))
    at.button(key="tiers_save").click().run()
    saved = json.loads(tiers_path(get_settings()).read_text())
    assert saved["tiers"]["fast"]["embedded"]["prompt_lookup_num_tokens"] == 4
    at.text_area(key="tiers_json").set_value('{"tiers": {"x": {"max_num_seqs": 0}}}')
    at.button(key="tiers_save").click().run()
    assert any("Not saved" in e.value for e in at.error)


def test_playground_streams_from_a_live_deployment(platform_env: dict[str, str], tiny_model) -> None:  # type: ignore[no-untyped-def]
    with console_deployment("tiny", tiny_model, "fast"):
        at = login_as(AppTest.from_file(PAGE, default_timeout=120)).run()
        assert not at.exception
        deployments = at.dataframe[1].value
        assert list(deployments["status"]) == ["running"] and deployments["tokens out"].iloc[0] == 0
        at.radio(key="pg_route").set_value("straight to the deployment")
        at.chat_input(key="pg_input").set_value("hello there").run()
        assert not at.exception and not at.error
        assert at.session_state["pg_history"][0]["text"] == "hello there"
        assert at.session_state["pg_history"][1]["role"] == "assistant"
        assert len(at.session_state["pg_history"][1]["text"]) > 0

        # tools offered to a model no run trained for them: the page says so, and names none trained here yet
        at.toggle(key="pg_tools").set_value(True).run()
        (notice,) = [i.value for i in at.info if "not trained to call tools" in i.value]
        assert notice.startswith("tiny was not trained to call tools") and "smollm2-repair" in notice
        # a model a repair run trained, and one fine-tuned from it: both inherit it (the lineage), and are named
        register_model(OPERATOR, "repaired", tiny_model, meta={"tool_training": "code_repair"})
        register_model(OPERATOR, "repaired-more", tiny_model, base="repaired")
        assert tool_training("repaired-more") == "code_repair (model 'repaired')" and tool_training("tiny") is None
        at.run()
        (notice,) = [i.value for i in at.info if "not trained to call tools" in i.value]
        assert "Trained for tools here: repaired, repaired-more." in notice


def test_an_export_is_taken_away_with_its_serving_commands(platform_env: dict[str, str], tiny_model) -> None:  # type: ignore[no-untyped-def]
    """From the Export tab: the commands that serve an export elsewhere and its download, a link to the gateway that
    streams it (a directory as a .tar); signing the link is an operator's action, for the model's recorded exports only."""
    from posttrain.platform.engines.inspect import ModelDirError
    from posttrain.platform.models.downloads import export_link
    from posttrain.platform.models.jobs import ExportModelConfig, export_registered

    register_model(OPERATOR, "mine", tiny_model)
    entry = export_registered(OPERATOR, ExportModelConfig(model="mine", format="hf"), get_settings())
    with pytest.raises(ModelDirError, match="is not an export of model 'mine'"):
        export_link(OPERATOR, "mine", str(tiny_model))  # the registered directory is not an export
    gateway = f"http://{get_settings().gateway_host}:{get_settings().gateway_port}/v1/exports/"
    for role, enabled in (("operator", True), ("viewer", False)):
        at = login_as(AppTest.from_file(PAGE, default_timeout=60), role).run()
        assert not at.exception
        commands = [c.value for c in at.code]
        assert any(c.startswith("vllm serve ") and entry["path"] in c for c in commands), commands
        (download,) = at.get("link_button")
        assert download.proto.disabled is not enabled and ".tar archive" in download.proto.label
        assert download.proto.url.startswith(gateway) is enabled, download.proto.url  # a viewer gets no signed link


@pytest.fixture(scope="module")
def tool_caller(tiny_model, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """The tiny model trained here, on the engine's own renderings of one exchange with the playground's tools,
    until greedy decoding says it: it asks for ``print(6 * 7)`` with the python tool, then answers with what the
    tool printed. (No model of this size calls tools unprompted; this one is real weights, taught one thing.) Made
    once a session (``shared_once``): the console tests use it too."""
    from conftest import shared_once

    def make(directory: Path) -> dict[str, str]:
        return {"path": str(teach_tool_call(tiny_model, directory / "caller"))}

    return Path(shared_once(tmp_path_factory, "tool-caller", make)["path"])


def teach_tool_call(tiny_model: Path, path: Path) -> Path:
    """A copy of ``tiny_model`` at ``path`` taught the exchange :func:`tool_caller` describes."""
    import shutil

    from drills import TokenExample, memorize

    from posttrain.platform.engines import EngineConfig
    from posttrain.platform.engines.profiles import DEFAULT_TIERS
    from posttrain.platform.sandbox import tool_schemas
    from posttrain.platform.serving import EmbeddedEngine
    from posttrain.platform.serving.client import PLAYGROUND_TOOLS
    from posttrain.platform.serving.protocol import ChatCompletionRequest

    engine = EmbeddedEngine(
        EngineConfig(model_path=str(tiny_model), served_model_name="tiny", tier=DEFAULT_TIERS["standard"])
    )
    tools = tool_schemas(list(PLAYGROUND_TOOLS))
    user = {"role": "user", "content": "six times seven?"}
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "python", "arguments": json.dumps({"code": "print(6 * 7)"})},
    }
    exchange = [
        ([user], '<tool_call>\n{"name": "python", "arguments": {"code": "print(6 * 7)"}}\n</tool_call>'),
        (
            [
                user,
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "name": "python", "content": "42\n"},
            ],
            "It is 42.",
        ),
    ]
    tokenizer = engine.tokenizer
    rows = []
    for messages, reply in exchange:
        prompt = engine.prepare_chat(ChatCompletionRequest(model="tiny", messages=messages, tools=tools)).prompt_ids
        rows.append(
            TokenExample.completion(
                prompt, tokenizer(reply, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            )
        )
    shutil.copytree(tiny_model, path)
    losses = memorize(path, rows, steps=300)  # type: ignore[arg-type]
    assert losses[-1] < 0.05, losses[-5:]
    return path


def test_the_playground_runs_the_model_s_tool_calls_in_a_sandbox(
    platform_env: dict[str, str],
    tool_caller,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from conftest import reachable_dir

    from posttrain.platform.auth import audit_log

    monkeypatch.setenv(
        "POSTTRAIN_DATA_DIR", str(reachable_dir())
    )  # the console's sandbox: a directory its uid can enter
    get_settings.cache_clear()

    with console_deployment("caller", tool_caller, "standard"):
        at = login_as(AppTest.from_file(PAGE, default_timeout=180)).run()
        at.radio(key="pg_route").set_value("straight to the deployment")
        at.toggle(key="pg_tools").set_value(True)
        at.number_input(key="pg_max_tokens").set_value(128)
        at.chat_input(key="pg_input").set_value("six times seven?").run()
        assert not at.exception and not at.error, (at.exception, at.error)
        shown = [c.value for c in at.code]
        # The model's call, then what the sandbox really printed, shown turn by turn; then its answer.
        assert shown == ['{"code": "print(6 * 7)"}', "42"], shown
        assert any("2 replies, 1 tool call, ended: answer" in c.value for c in at.caption), [
            c.value for c in at.caption
        ]
        assert at.session_state["pg_history"][-1] == {"role": "assistant", "text": "It is 42."}
        ran = [e for e in audit_log(limit=50) if e.action == "sandbox.run"]
        assert ran and ran[0].target == "python" and "print(6 * 7)" in ran[0].details["arguments"]
