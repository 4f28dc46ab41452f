"""The Models & Serving page against a real database, with a real deployment for the playground."""

from __future__ import annotations

import json

import pytest
from streamlit.testing.v1 import AppTest

from conftest import OPERATOR, REPO_ROOT, login_as
from posttrain.platform.db.engine import session
from posttrain.platform.db.models import Deployment
from posttrain.platform.jobs import queue
from posttrain.platform.models.registry import register_model
from posttrain.platform.serving.tiers import tiers_path
from posttrain.platform.settings import get_settings

PAGE = str(REPO_ROOT / "ui" / "views" / "models.py")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from posttrain.platform.models import TinyModelSpec, build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", TinyModelSpec(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128))


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
    catalog["tiers"]["fast"]["prompt_lookup_num_tokens"] = 4
    at.text_area(key="tiers_json").set_value(json.dumps(catalog))
    at.button(key="tiers_save").click().run()
    saved = json.loads(tiers_path(get_settings()).read_text())
    assert saved["tiers"]["fast"]["prompt_lookup_num_tokens"] == 4
    at.text_area(key="tiers_json").set_value('{"tiers": {"x": {"max_num_seqs": 0}}}')
    at.button(key="tiers_save").click().run()
    assert any("Not saved" in e.value for e in at.error)


def test_playground_streams_from_a_live_deployment(platform_env: dict[str, str], tiny_model) -> None:  # type: ignore[no-untyped-def]
    from posttrain.platform.serving import EmbeddedEngine, EngineConfig, create_engine_app, serve_in_thread
    from posttrain.platform.serving.profiles import DEFAULT_TIERS

    model = register_model(OPERATOR, "tiny", tiny_model)
    engine = EmbeddedEngine(EngineConfig(model_path=str(tiny_model), served_model_name="tiny", tier=DEFAULT_TIERS["fast"])).start()
    try:
        with serve_in_thread(create_engine_app(engine)) as server:
            with session() as s:
                s.add(Deployment(model_id=model.id, tier="fast", url=server.base_url, status="running", healthy=True))
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
    finally:
        engine.stop()


def test_an_export_is_taken_away_with_its_serving_commands(platform_env: dict[str, str], tiny_model) -> None:  # type: ignore[no-untyped-def]
    """From the Export tab: the commands that serve an export elsewhere and its download (a directory as a .tar);
    the download is an operator's action in the platform, for the model's recorded exports only."""
    import io
    import tarfile

    from posttrain.platform.models.inspect import ModelDirError
    from posttrain.platform.models.registry import export_download
    from posttrain.platform.serving.jobs import ExportModelConfig, export_registered

    register_model(OPERATOR, "mine", tiny_model)
    entry = export_registered(OPERATOR, ExportModelConfig(model="mine", format="hf"), get_settings())
    with tarfile.open(fileobj=io.BytesIO(export_download(OPERATOR, "mine", entry["path"]))) as tar:
        names = tar.getnames()
    assert any(n.endswith("/config.json") for n in names) and any(n.endswith(".safetensors") for n in names), names
    with pytest.raises(ModelDirError, match="is not an export of model 'mine'"):
        export_download(OPERATOR, "mine", str(tiny_model))  # the registered directory is not an export
    for role, enabled in (("operator", True), ("viewer", False)):
        at = login_as(AppTest.from_file(PAGE, default_timeout=60), role).run()
        assert not at.exception
        commands = [c.value for c in at.code]
        assert any(c.startswith("vllm serve ") and entry["path"] in c for c in commands), commands
        (download,) = at.get("download_button")
        assert download.proto.disabled is not enabled and ".tar archive" in download.proto.label
