"""Every console page walked as a viewer, with something on it to act on (jobs queued, failed and
finished, a model, a running deployment, a code task, a document, an API key): no action is
reachable. Then every action button of every page, rendered for an admin, is clicked after the
admin's role was lowered to viewer in the database: the page, checking the role again, no longer
offers it (Streamlit drops a click on a widget now disabled or gone), or the platform's action
refuses it and audits the refusal; nothing stored changes. (The platform's own check, without any
page in front of it, is tests/test_roles.py.)

Each test records what it tried with ``category="role_enforcement"``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import ADMIN, OPERATOR, REPO_ROOT, Reliability, login_as
from sqlmodel import select
from streamlit.testing.v1 import AppTest
from test_roles import CODE_TASK, PASSWORD, png, state

from posttrain.platform import auth
from posttrain.platform.api_keys import create_key
from posttrain.platform.db.engine import session
from posttrain.platform.db.models import Deployment, Role, User
from posttrain.platform.documents import add_document
from posttrain.platform.jobs import queue
from posttrain.platform.models.registry import register_model
from posttrain.platform.tasks import store

CATEGORY = "role_enforcement"
PAGES = sorted((REPO_ROOT / "ui" / "views").glob("*.py"))
# Buttons that change nothing stored: check a config, copy a preset into the editor, clear a chat.
NOT_ACTIONS = {"yaml_validate", "preset_edit", "pg_new_chat"}
SFT = {"model": "tiny", "domains": ["arith.add.int"], "max_steps": 1}
Setup = Callable[[AppTest], None]


def populate(tiny_dir: Path) -> dict[str, list[tuple[str, Setup]]]:
    """Something on every page to act on; returns each page's views (a name, widget settings to make)."""
    auth.create_user(ADMIN, "viv", PASSWORD, Role.viewer)
    auth.create_user(ADMIN, "root", PASSWORD, Role.admin)
    model = register_model(OPERATOR, "tiny", tiny_dir)
    queued = queue.submit(OPERATOR, "train_sft", SFT)
    failed = queue.submit(OPERATOR, "train_sft", SFT)
    finished = queue.submit(OPERATOR, "train_sft", SFT)
    for job_id, outcome in ((failed, queue.Outcome(exit_code=1, error="boom")),
                            (finished, queue.Outcome(exit_code=0, result={"steps": 1, "model": "tiny"}))):  # fmt: skip
        claimed = queue.claim("w", 1, 0)
        assert claimed is not None
        queue.finish(claimed.id, outcome) if claimed.id == job_id else None
    deploy_job = queue.submit(OPERATOR, "deploy", {"model": "tiny"})
    with session() as s:
        s.add(Deployment(model_id=model.id, tier="standard", url="http://127.0.0.1:9", status="running", healthy=True,
                         job_id=deploy_job))  # fmt: skip
    store.save_tasks("code", [CODE_TASK])
    add_document(OPERATOR, png(), filename="scan.png")
    create_key(ADMIN, "kept")

    def select_run(job_id: int) -> Setup:
        return lambda at: at.selectbox(key="run_id").set_value(job_id).run()

    views: dict[str, list[tuple[str, Setup]]] = {page.name: [("as opened", lambda at: None)] for page in PAGES}
    views["jobs.py"] = [(f"job {queued}", lambda at: at.number_input(key="inspect_job_id").set_value(queued).run())]
    views["training.py"] = [(f"run {j}", select_run(j)) for j in (queued, failed, finished)]
    return views


def render(page: Path, role: str, name: str, setup: Setup) -> AppTest:
    at = login_as(AppTest.from_file(str(page), default_timeout=120), role, name).run()
    setup(at)
    assert not at.exception, (page.name, at.exception)
    return at


def set_role_in_database(username: str, role: Role) -> None:
    with session() as s:
        user = s.exec(select(User).where(User.username == username)).one()
        user.role = role
        s.add(user)


def reachable(at: AppTest) -> list[tuple[str, str]]:
    """The enabled widgets of a rendered page that would change something, as (kind, key)."""
    found = [("button", str(b.key)) for b in at.button if not b.disabled and b.key not in NOT_ACTIONS]
    found += [("chat input", str(c.key)) for c in at.chat_input if not c.disabled]
    found += [("file uploader", str(u.key)) for u in at.get("file_uploader") if not u.proto.disabled]
    return found


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_no_action_is_reachable_for_a_viewer(
    platform_env: dict[str, str], db_url: str, tmp_path: Path, reliability: Reliability
) -> None:
    from posttrain.platform.models import TinyModelSpec, build_tiny_model

    tiny_dir = build_tiny_model(tmp_path / "tiny", TinyModelSpec(hidden_size=32, num_layers=1, num_heads=2,
                                                                 num_kv_heads=1, intermediate_size=64))  # fmt: skip
    views = populate(tiny_dir)
    before = state()

    # 1. Every page, every view of it, as the viewer: nothing that acts is enabled.
    offered: dict[str, list[tuple[str, str]]] = {}
    for page in PAGES:
        for view, setup in views[page.name]:
            offered[f"{page.name} ({view})"] = reachable(render(page, "viewer", "viv", setup))
    walked = {where: found for where, found in offered.items() if found}
    reliability.inputs("console pages walked as a viewer", tried=len(offered), refused_cleanly=len(offered) - len(walked),
                       category=CATEGORY, reachable=walked)  # fmt: skip
    assert not walked, walked

    # 2. Each action an admin's page offers, clicked after the admin became a viewer: nothing happens.
    outcomes: Counter[str] = Counter()
    mishandled: list[str] = []
    for page in PAGES:
        for view, setup in views[page.name]:
            for kind, key in reachable(render(page, "admin", "root", setup)):
                if kind == "file uploader":  # AppTest cannot send files; the button that uses them is clicked
                    continue
                at = render(page, "admin", "root", setup)
                set_role_in_database("root", Role.viewer)  # lowered while the admin's page is open
                last = auth.audit_log(limit=1)[0].id or 0
                if kind == "chat input":
                    at.chat_input(key=key).set_value("hello").run()
                else:
                    at.button(key=key).click().run()
                after = [e for e in auth.audit_log(limit=100) if (e.id or 0) > last]  # what the click did
                refused = any("may not" in e.value for e in at.error) and [e.action for e in after] == ["denied"]
                dropped = not after and not at.success  # the page never called the action (hidden or disabled)
                set_role_in_database("root", Role.admin)
                clean = not at.exception and state() == before and (refused or dropped)
                outcome = "refused by the platform" if refused else "dropped by the page" if dropped else "mishandled"
                outcomes[outcome if clean else "mishandled"] += 1
                if not clean:
                    mishandled.append(f"{page.name} ({view}): {kind} {key}")
    tried = sum(outcomes.values())
    reliability.inputs("admin-rendered actions clicked by a viewer", tried=tried, refused_cleanly=tried - len(mishandled),
                       category=CATEGORY, outcomes=dict(outcomes), mishandled_actions=mishandled)  # fmt: skip
    assert tried >= 20 and not mishandled, (outcomes, mishandled)
