"""Roles are checked in the platform's action functions, not only in the pages: each one called directly
by a viewer (and each admin one by an operator) is refused, changes nothing and is audited; each
one done is audited under the acting user's name."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import ADMIN, OPERATOR
from PIL import Image
from sqlmodel import func, select

from posttrain.platform import auth
from posttrain.platform.api_keys import create_key, list_keys, revoke_key
from posttrain.platform.auth import ACTIONS, Identity, PermissionDenied, audit_log
from posttrain.platform.db.engine import session
from posttrain.platform.db.models import ApiKey, Document, Job, Model, Role, Task, User
from posttrain.platform.documents import add_document
from posttrain.platform.engines.profiles import TierCatalog
from posttrain.platform.engines.tiers import save_tiers, tiers_path
from posttrain.platform.jobs import queue
from posttrain.platform.models.downloads import export_link
from posttrain.platform.models.importer import import_model
from posttrain.platform.models.interpolate import interpolate_models
from posttrain.platform.models.jobs import ExportModelConfig, export_registered
from posttrain.platform.models.registry import register_model, set_default_tier
from posttrain.platform.sandbox.snippet import run_snippet
from posttrain.platform.serving.client import chat_as, chat_with_tools, try_task
from posttrain.platform.settings import get_settings
from posttrain.platform.tasks import store
from posttrain.platform.tasks.jobs import import_jsonl_upload
from posttrain.platform.users import disable_user, enable_user
from posttrain.platform.verifiers import TaskSpec

VIEWER = Identity("viv", Role.viewer)
PASSWORD = "correct horse battery"
CODE_TASK = TaskSpec(domain="code.demo", prompt="Write f() returning 1.", reference="def f():\n    return 1\n",
                     verifier={"kind": "code", "spec": {"entry_point": "f", "tests": "assert f() == 1"}})  # fmt: skip


def png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (16, 12), (10, 20, 30)).save(out, format="PNG")
    return out.getvalue()


def state() -> dict[str, object]:
    """What the actions could change: the rows of every table they write, and the files they write."""
    with session(read_only=True) as s:
        counts = {
            table.__name__: s.exec(select(func.count()).select_from(table)).one()
            for table in (Job, Document, Model, ApiKey, User)
        }
        jobs = sorted((j.id, j.status.value, j.cancel_requested) for j in s.exec(select(Job)))
        roles = sorted((u.username, u.role.value, u.password_hash, u.disabled) for u in s.exec(select(User)))
        keys = sorted((k.key_id, k.revoked_at) for k in s.exec(select(ApiKey)))
    data = get_settings().data_dir
    files = sorted(str(p.relative_to(data)) for p in data.rglob("*") if p.is_file()) if data.exists() else []
    return {"counts": counts, "jobs": jobs, "roles": roles, "keys": keys, "files": files}


def action_calls(tiny_dir: Path, job_id: int, task_id: int, key_id: str) -> dict[str, Callable[[Identity], object]]:
    """One call of every action, by its name, with arguments it would accept."""
    settings = get_settings()

    def no_pool() -> object:
        raise AssertionError("a refused snippet started a sandbox pool")

    return {
        "job.submit": lambda who: queue.submit(who, "selftest", {"steps": 1}),
        "job.submit_many": lambda who: queue.submit_many(who, "selftest", [{"steps": 1}], [0]),
        "job.cancel": lambda who: queue.cancel(who, job_id),
        "document.upload": lambda who: add_document(who, png(), filename="scan.png"),
        "model.register": lambda who: register_model(who, "mine", tiny_dir),
        "model.import": lambda who: import_model(who, str(tiny_dir), name="imported"),
        "model.export": lambda who: export_registered(who, ExportModelConfig(model="tiny", format="hf"), settings),
        "model.download": lambda who: export_link(who, "tiny", str(tiny_dir)),
        "model.interpolate": lambda who: interpolate_models(who, "tiny", "tiny", 0.5, name="halfway"),
        "model.default_tier": lambda who: set_default_tier(who, "tiny", "fast"),
        "tiers.save": lambda who: save_tiers(who, TierCatalog().model_dump_json(), settings),
        "task.verify": lambda who: store.try_answer(who, task_id, "def f():\n    return 1\n"),
        "tasks.import_jsonl": lambda who: import_jsonl_upload(who, b'{"prompt": "2+2?", "answer": "4"}\n', "imported"),
        "sandbox.run": lambda who: run_snippet(who, no_pool, "bash", "touch /tmp/posttrain-viewer-was-here"),
        "model.chat": lambda who: chat_as(who, "http://127.0.0.1:9", "tiny", [{"role": "user", "content": "hi"}]),
        "model.chat_tools": lambda who: chat_with_tools(
            who, no_pool, "http://127.0.0.1:9", "tiny", [{"role": "user", "content": "hi"}]
        ),
        "task.try_episode": lambda who: try_task(who, no_pool, "http://127.0.0.1:9", "tiny", task_id),
        "user.create": lambda who: auth.create_user(who, "eve", PASSWORD, Role.admin),
        "user.password": lambda who: auth.set_password(who, "otto", "a new password!"),
        "user.role": lambda who: auth.set_role(who, "viv", Role.admin),
        "user.disable": lambda who: disable_user(who, "otto"),
        "user.enable": lambda who: enable_user(who, "otto"),
        "key.create": lambda who: create_key(who, "stolen"),
        "key.list": lambda who: list_keys(who),
        "key.revoke": lambda who: revoke_key(who, key_id),
    }


@pytest.fixture
def world(platform_env: dict[str, str], tmp_path: Path) -> dict[str, Callable[[Identity], object]]:
    from posttrain.platform.models import TinyModelSpec, build_tiny_model

    tiny_dir = build_tiny_model(tmp_path / "tiny", TinyModelSpec(hidden_size=32, num_layers=1, num_heads=2,
                                                                 num_kv_heads=1, intermediate_size=64))  # fmt: skip
    register_model(OPERATOR, "tiny", tiny_dir)
    auth.create_user(ADMIN, "viv", PASSWORD, Role.viewer)
    auth.create_user(ADMIN, "otto", PASSWORD, Role.operator)
    job_id = queue.submit(OPERATOR, "selftest", {"steps": 1})
    store.save_tasks("code", [CODE_TASK])
    with session(read_only=True) as s:
        task_id = s.exec(select(Task.id)).one()
    key = create_key(ADMIN, "kept")
    return action_calls(tiny_dir, job_id, int(task_id), key.key.key_id)  # type: ignore[arg-type]


def test_every_action_refuses_a_viewer_changes_nothing_and_audits_it(
    world: dict[str, Callable[[Identity], object]],
) -> None:
    assert set(world) == set(ACTIONS), "every action the platform registers is called here"
    before = state()
    for name, call in world.items():
        with pytest.raises(PermissionDenied) as refused:
            call(VIEWER)
        needed = ACTIONS[name].value
        assert str(refused.value) == (f"viv (viewer) may not {name}: it needs the {needed} role; ask an admin for it")
        assert state() == before, f"{name} changed something for a viewer"
    denied = [e for e in audit_log(limit=1000) if e.action == "denied"]
    assert sorted(e.target for e in denied) == sorted(world)
    assert all(e.username == "viv" and e.details["role"] == "viewer" for e in denied)


def test_admin_actions_refuse_an_operator(world: dict[str, Callable[[Identity], object]]) -> None:
    admin_only = sorted(name for name, role in ACTIONS.items() if role is Role.admin)
    assert admin_only == [
        "key.create",
        "key.list",
        "key.revoke",
        "user.create",
        "user.disable",
        "user.enable",
        "user.password",
        "user.role",
    ]
    before = state()
    for name in admin_only:
        with pytest.raises(PermissionDenied, match=f"may not {name}: it needs the admin role"):
            world[name](OPERATOR)
    assert state() == before


def test_the_database_decides_the_role_at_each_action(world: dict[str, Callable[[Identity], object]]) -> None:
    """An identity is checked against its user row when it acts: a role lowered or an account disabled
    since the login counts at once, whatever role the caller still holds in its session."""
    otto = Identity("otto", Role.operator)
    world["job.submit"](otto)
    auth.set_role(ADMIN, "otto", Role.viewer)
    with pytest.raises(PermissionDenied, match=r"otto \(viewer\) may not job.submit"):
        world["job.submit"](otto)
    with session() as s:
        user = s.exec(select(User).where(User.username == "otto")).one()
        user.role, user.disabled = Role.operator, True
        s.add(user)
    with pytest.raises(PermissionDenied, match=r"otto \(disabled\) may not job.submit"):
        world["job.submit"](otto)
    with pytest.raises(TypeError, match="takes the acting Identity as its first argument"):
        queue.submit("selftest", {"steps": 1})  # type: ignore[arg-type]
    with pytest.raises(auth.AuthError, match="has no ':'"):
        auth.create_user(ADMIN, "job:1", PASSWORD, Role.viewer)  # the platform's own names


def test_every_action_done_is_audited_under_the_acting_user(world: dict[str, Callable[[Identity], object]]) -> None:
    ann = Identity("ann", Role.admin)
    done = {name: world[name](ann) for name in ("job.submit", "job.submit_many", "tiers.save", "tasks.import_jsonl",
                                               "user.create", "user.password", "user.role", "key.create", "key.revoke",
                                               "job.cancel", "model.register", "user.disable", "user.enable")}  # fmt: skip
    store.save_tasks("numbers", [TaskSpec(domain="demo", prompt="2+3=?", reference="5",
                                          verifier={"kind": "numeric", "spec": {"value": 5}})])  # fmt: skip
    numeric = store.load_tasks(task_set="numbers")[0].id
    assert store.try_answer(ann, numeric, "The answer is 5.").passed
    assert done["key.revoke"].revoked_by == "ann"  # type: ignore[attr-defined]
    assert json.loads(tiers_path(get_settings()).read_text()) == TierCatalog().model_dump()
    audited = {e.action for e in audit_log(limit=1000) if e.username == "ann"}
    assert audited >= {"job.submit", "job.submit_many", "tiers.save", "task.verify", "user.create", "user.password",
                       "user.role", "key.create", "key.revoke", "job.cancel", "model.register", "user.disable",
                       "user.enable"}, audited  # fmt: skip
    assert queue.list_jobs(limit=1)[0].submitted_by == "ann"
