"""Disabling and enabling users (admins only), from the command line and the console: a disabled user's console
session, actions, logins and API keys are refused at their next request, and work again once they are enabled;
the last enabled admin stays; every change and refusal is audited."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from conftest import REPO_ROOT, login_as
from streamlit.testing.v1 import AppTest
from test_api_keys import gateway_process, sqlite_only
from test_cli import cli, one_error_line

from posttrain.platform import auth
from posttrain.platform.api_keys import KeyRefused, check_key, create_key
from posttrain.platform.auth import AuthError, Identity, PermissionDenied, audit_log
from posttrain.platform.db.models import Role
from posttrain.platform.jobs import queue
from posttrain.platform.users import disable_user, enable_user

PASSWORD = "correct horse battery"
ADMIN_PAGE = str(REPO_ROOT / "ui" / "views" / "admin.py")
ROOT = Identity("root", Role.admin)


@pytest.fixture
def people(platform_env: dict[str, str]) -> dict[str, str]:
    """root and alice (admins), otto (an operator); alice made an API key."""
    auth.bootstrap_admin("root", PASSWORD)
    auth.create_user(ROOT, "alice", PASSWORD, Role.admin)
    auth.create_user(ROOT, "otto", PASSWORD, Role.operator)
    return {"alice_key": create_key(Identity("alice", Role.admin), "alice-bot").secret}


def models_status(base: str, key: str) -> int:
    return httpx.get(base + "/v1/models", headers={"authorization": f"Bearer {key}"}).status_code


@sqlite_only
def test_cli_disable_refuses_the_users_session_and_key_at_once_and_enable_brings_them_back(
        platform_env: dict[str, str], people: dict[str, str], tmp_path: Path) -> None:  # fmt: skip
    key = people["alice_key"]
    alice = login_as(AppTest.from_file(ADMIN_PAGE, default_timeout=60), "admin", "alice").run()
    assert not alice.exception and "alice" in list(alice.dataframe[0].value["user"])
    with gateway_process(platform_env, tmp_path / "gateway.log") as base:
        assert models_status(base, key) == 200
        done = cli(platform_env, "users", "disable", "alice")
        assert done.returncode == 0, done.stderr
        assert "user alice disabled; the 1 API key(s) they created are refused until they are enabled" in done.stdout
        assert models_status(base, key) == 401  # the next request
        alice.run()  # the next run of her page: logged out, nothing shown
        assert [w.value for w in alice.warning] == ["Log in to use the console."] and not alice.dataframe
        assert "identity" not in alice.session_state
        with pytest.raises(KeyRefused, match="created by a user whose account is disabled"):
            check_key(key)
        with pytest.raises(AuthError, match="wrong username or password"):
            auth.authenticate("alice", PASSWORD)
        with pytest.raises(PermissionDenied, match=r"alice \(disabled\) may not job.submit"):
            queue.submit(Identity("alice", Role.admin), "selftest", {"steps": 1})
        line = one_error_line(cli({**platform_env, "POSTTRAIN_CLI_USER": "alice"}, "keys", "list"))
        assert "POSTTRAIN_CLI_USER='alice' is disabled" in line

        done = cli(platform_env, "users", "enable", "alice")
        assert done.returncode == 0 and "user alice enabled; the 1 API key(s) they created work again" in done.stdout
        assert models_status(base, key) == 200
    assert check_key(key).name == "alice-bot"
    assert auth.authenticate("alice", PASSWORD) == Identity("alice", Role.admin)
    again = login_as(AppTest.from_file(ADMIN_PAGE, default_timeout=60), "admin", "alice").run()
    assert not again.warning and "alice" in list(again.dataframe[0].value["user"])
    changes = [(e.action, e.target, e.details) for e in audit_log() if e.action in ("user.disable", "user.enable")]
    assert changes == [
        ("user.enable", "alice", {"keys": 1}),
        ("user.disable", "alice", {"keys": 1, "sessions_ended": 0}),
    ]
    assert all(e.username.startswith("cli:") for e in audit_log() if e.action in ("user.disable", "user.enable"))


@sqlite_only
def test_only_an_admin_may_disable_or_enable_and_never_the_last_enabled_admin(
    platform_env: dict[str, str], people: dict[str, str]
) -> None:
    otto = Identity("otto", Role.operator)
    for change, name in ((disable_user, "user.disable"), (enable_user, "user.enable")):
        with pytest.raises(PermissionDenied, match=rf"otto \(operator\) may not {name}: it needs the admin role"):
            change(otto, "alice")
    as_otto = {**platform_env, "POSTTRAIN_CLI_USER": "otto"}
    assert "otto (operator) may not user.disable" in one_error_line(cli(as_otto, "users", "disable", "alice"))
    assert check_key(people["alice_key"]).name == "alice-bot"  # nothing changed
    denied = [(e.username, e.target) for e in audit_log() if e.action == "denied"]
    assert sorted(denied) == [("otto", "user.disable"), ("otto", "user.disable"), ("otto", "user.enable")]

    disable_user(ROOT, "alice")
    with pytest.raises(AuthError, match="alice is disabled already"):
        disable_user(ROOT, "alice")
    with pytest.raises(PermissionDenied, match=r"alice \(disabled\) may not user.enable"):
        enable_user(Identity("alice", Role.admin), "alice")  # a disabled admin cannot bring herself back
    line = one_error_line(cli(platform_env, "users", "disable", "root"))
    assert "root is the last enabled admin: make another user an admin first" in line
    with pytest.raises(AuthError, match="no user named 'nobody'"):
        disable_user(ROOT, "nobody")
    assert auth.has_admin() and auth.authenticate("root", PASSWORD) == ROOT
    enable_user(ROOT, "alice")
    assert disable_user(ROOT, "root").disabled  # alice is an enabled admin again: root may go


def test_console_admins_disable_and_enable_a_user(platform_env: dict[str, str], people: dict[str, str]) -> None:
    at = login_as(AppTest.from_file(ADMIN_PAGE, default_timeout=60), "admin", "root").run()
    assert not at.exception
    at.selectbox(key="account_user").set_value("otto")
    at.button(key="FormSubmitter:account-Disable").click().run()
    assert [s.value for s in at.success] == ["otto is disabled."]
    users = at.dataframe[0].value
    assert list(users.loc[users["user"] == "otto", "disabled"]) == [True]  # the table shows it in the same run
    with pytest.raises(AuthError):
        auth.authenticate("otto", PASSWORD)

    at.selectbox(key="account_user").set_value("alice")
    at.button(key="FormSubmitter:account-Disable").click().run()
    assert [s.value for s in at.success] == ["alice is disabled (with the 1 API key(s) they created)."]
    keys = at.dataframe[1].value
    assert list(keys.loc[keys["name"] == "alice-bot", "refused"]) == ["creator disabled"]
    at.selectbox(key="account_user").set_value("root")
    at.button(key="FormSubmitter:account-Disable").click().run()
    assert "root is the last enabled admin" in at.error[0].value

    at.selectbox(key="account_user").set_value("otto")
    at.button(key="FormSubmitter:account-Enable").click().run()
    assert [s.value for s in at.success] == ["otto is enabled."]
    assert auth.authenticate("otto", PASSWORD) == Identity("otto", Role.operator)
    audited = [
        (e.username, e.action, e.target) for e in audit_log() if e.action.startswith("user.") and "able" in e.action
    ]
    assert audited == [
        ("root", "user.enable", "otto"),
        ("root", "user.disable", "alice"),
        ("root", "user.disable", "otto"),
    ]
