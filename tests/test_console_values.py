"""The console as a newcomer meets it (issue 35): plain values in its tables (one time format, no "None", no
Python dicts), jobs that say how they ended, and a playground that says what each question carries."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from conftest import OPERATOR, REPO_ROOT, console_deployment, login_as, run_worker_until_idle
from streamlit.testing.v1 import AppTest

from posttrain.platform.db.models import JobStatus
from posttrain.platform.display import details_text, utc_text
from posttrain.platform.jobs import queue
from posttrain.ui.common import cell

UTC_TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")


def test_one_time_format_and_no_raw_values() -> None:
    aware = datetime(2026, 12, 5, 8, 42, 55, 123456, tzinfo=UTC)
    assert utc_text(aware) == utc_text(aware.replace(tzinfo=None)) == "2026-12-05 08:42:55 UTC"
    assert utc_text(None) == cell(None) == "—"
    assert (
        details_text({"name": "ci-bot", "models": ["tiny", "tiny2"], "limits": {"rpm": 5}, "why": None})
        == "name: ci-bot · models: tiny, tiny2 · limits.rpm: 5 · why: —"
    )
    assert details_text({}) == details_text(None) == "—"
    assert cell(True) is True and cell(3) == 3 and cell([]) == "—" and cell(aware) == "2026-12-05 08:42:55 UTC"


def test_jobs_page_shows_how_jobs_ended_in_plain_values(platform_env: dict[str, str]) -> None:
    ok = queue.submit(OPERATOR, "selftest", {"steps": 2, "sleep_s": 0.05})
    bad = queue.submit(OPERATOR, "selftest", {"steps": 3, "sleep_s": 0.6, "fail_at_step": 1})
    waiting = queue.submit(OPERATOR, "selftest", {"steps": 1}, priority=-1)
    queue.cancel(OPERATOR, waiting)
    run_worker_until_idle(platform_env, timeout=120)
    assert queue.get_job(ok).status is JobStatus.succeeded and queue.get_job(bad).status is JobStatus.failed

    at = login_as(AppTest.from_file(str(REPO_ROOT / "ui" / "views" / "jobs.py"), default_timeout=30)).run()
    assert not at.exception
    frame = at.dataframe[0].value.set_index("id")
    assert re.fullmatch(r"succeeded in \d+ s", frame.loc[ok, "message"])
    assert re.fullmatch(
        r"failed after \d+ s: RuntimeError: selftest failing on purpose at step 1", frame.loc[bad, "message"]
    )
    assert frame.loc[waiting, "message"] == "cancelled before it started"
    assert frame.loc[ok, "error"] == "—" and frame.loc[waiting, "finished"] != "—"
    for column in ("created", "finished"):
        assert all(UTC_TIME.fullmatch(t) for t in frame[column]), frame[column]
    assert not any(v is None or str(v) in ("None", "NaT", "nan") for v in frame.to_numpy().ravel())

    at.number_input(key="inspect_job_id").set_value(bad).run()
    (when,) = [c.value for c in at.caption if c.value.startswith("submitted ")]
    assert re.fullmatch(rf"submitted {UTC_TIME.pattern} · started {UTC_TIME.pattern} · finished {UTC_TIME.pattern} · by "
                        + OPERATOR.username, when)  # fmt: skip
    assert at.get("progress")[0].proto.text.startswith("failed after ")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from posttrain.platform.models import TinyModelSpec, build_tiny_model

    return build_tiny_model(
        tmp_path_factory.mktemp("m") / "tiny",
        TinyModelSpec(hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=128),
    )


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # starts an engine: once
def test_playground_says_the_history_is_sent_and_new_chat_starts_afresh(
    platform_env: dict[str, str], db_url: str, tiny_model
) -> None:  # type: ignore[no-untyped-def]
    with console_deployment("tiny", tiny_model, "fast"):
        at = login_as(AppTest.from_file(str(REPO_ROOT / "ui" / "views" / "models.py"), default_timeout=120)).run()
        assert not at.exception

        def note() -> str:
            (found,) = [c.value for c in at.caption if "**New chat** starts afresh" in c.value]
            return found

        new_chat = at.button(key="pg_new_chat")
        assert new_chat.label == "New chat" and new_chat.proto.type == "primary"
        assert note().startswith("Each question is sent with the conversation before it; **New chat** starts afresh")
        at.radio(key="pg_route").set_value("straight to the deployment")
        assert at.number_input(key="pg_max_tokens").value == 256  # room for a tool call
        at.number_input(key="pg_max_tokens").set_value(4)
        at.chat_input(key="pg_input").set_value("What is 2 + 2?").run()
        assert not at.exception and not at.error
        # the tiny model's greedy reply runs past 4 tokens: the page says where it was cut
        assert any(c.value.startswith("stopped at max tokens") for c in at.caption), [c.value for c in at.caption]
        assert note().startswith(
            "2 earlier messages are sent with each question: the model reads the whole conversation"
        )
        at.chat_input(key="pg_input").set_value("And 3 + 3?").run()
        assert not at.exception and not at.error and len(at.session_state["pg_history"]) == 4
        assert note().startswith("4 earlier messages are sent with each question")

        at.button(key="pg_new_chat").click().run()
        assert not at.exception and at.session_state["pg_history"] == [] and not at.chat_message
        assert note().startswith("Each question is sent with the conversation before it")
