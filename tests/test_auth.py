"""Login, roles, lockout and the audit log; in the library, the CLI and the console."""

from __future__ import annotations

import time

import pytest
from conftest import ADMIN, OPERATOR, REPO_ROOT, login_as
from sqlmodel import select
from streamlit.testing.v1 import AppTest
from test_cli import cli, one_error_line

from posttrain.platform import auth
from posttrain.platform.db.engine import session
from posttrain.platform.db.models import Role, User
from posttrain.platform.jobs import queue

PASSWORD = "correct horse battery"


def test_passwords_are_salted_slow_hashes(platform_env: dict[str, str], db_url: str) -> None:
    auth.create_user(ADMIN, "ann", PASSWORD, Role.operator)
    auth.create_user(ADMIN, "bob", PASSWORD, Role.viewer)
    with session(db_url, read_only=True) as s:
        hashes = [u.password_hash for u in s.exec(select(User))]
    assert all(h.startswith("$argon2id$") for h in hashes)
    assert hashes[0] != hashes[1]  # same password, different salts
    assert PASSWORD not in "".join(hashes)
    with pytest.raises(auth.AuthError, match="at least 10 characters"):
        auth.create_user(ADMIN, "cy", "short")


def test_login_and_lockout_grows(platform_env: dict[str, str]) -> None:
    auth.create_user(ADMIN, "ann", PASSWORD, Role.operator)
    assert auth.authenticate("ann", PASSWORD) == auth.Identity("ann", Role.operator)
    started = time.monotonic()
    for _ in range(auth.FREE_FAILURES):
        with pytest.raises(auth.AuthError, match="wrong username or password"):
            auth.authenticate("ann", "not the password")
    assert time.monotonic() - started >= auth.FREE_FAILURES * auth.FAILURE_DELAY_S  # every failure is slowed
    with pytest.raises(auth.AuthError) as locked:
        auth.authenticate("ann", PASSWORD)  # locked even with the right password
    assert auth.lock_seconds(auth.FREE_FAILURES + 3) > auth.lock_seconds(auth.FREE_FAILURES)
    with pytest.raises(auth.AuthError) as unknown:
        auth.authenticate("nobody", PASSWORD)
    # the locked account and the name that does not exist read the same: no username is revealed
    assert str(locked.value) == str(unknown.value) == auth.REFUSED
    actions = [e.action for e in auth.audit_log()]
    assert actions.count("login.failed") == auth.FREE_FAILURES + 1 and "login" in actions and "login.locked" in actions


def test_last_admin_keeps_the_role(platform_env: dict[str, str]) -> None:
    auth.create_user(ADMIN, "root", PASSWORD, Role.admin)
    with pytest.raises(auth.AuthError, match="last admin"):
        auth.set_role(ADMIN, "root", Role.viewer)


def test_console_shows_nothing_before_login(platform_env: dict[str, str]) -> None:
    auth.create_user(ADMIN, "ann", PASSWORD, Role.viewer)
    queue.submit(OPERATOR, "selftest", {"steps": 1})
    at = AppTest.from_file(str(REPO_ROOT / "ui" / "app.py"), default_timeout=30).run()
    assert [t.value for t in at.title] == ["posttrain"] and not at.dataframe and not at.metric
    at.text_input(key="login_username").set_value("ann")
    at.text_input(key="login_password").set_value("wrong password!")
    at.button[0].click().run()
    assert "wrong username or password" in at.error[0].value and not at.dataframe
    at.text_input(key="login_password").set_value(PASSWORD)
    at.button[0].click().run()
    assert at.title[0].value == "Overview" and at.metric  # logged in: the default page


def test_viewer_cannot_launch_or_cancel(platform_env: dict[str, str]) -> None:
    job_id = queue.submit(OPERATOR, "selftest", {"steps": 1})
    at = login_as(AppTest.from_file(str(REPO_ROOT / "ui" / "views" / "jobs.py"), default_timeout=30), "viewer").run()
    assert at.button[0].disabled
    # A click that reaches the server anyway (a crafted message, or a role revoked while the page
    # was open) is refused by the action's own check:
    at = login_as(AppTest.from_file(str(REPO_ROOT / "ui" / "views" / "jobs.py"), default_timeout=30), "operator").run()
    login_as(at, "viewer")
    at.button[0].click().run()
    assert not at.success and [j.id for j in queue.list_jobs()] == [job_id]
    at.number_input(key="inspect_job_id").set_value(job_id).run()
    assert not [b for b in at.button if b.key == f"cancel_{job_id}"]
    assert [j.id for j in queue.list_jobs()] == [job_id]


def test_admin_page_is_for_admins(platform_env: dict[str, str]) -> None:
    auth.create_user(ADMIN, "root", PASSWORD, Role.admin)
    page = str(REPO_ROOT / "ui" / "views" / "admin.py")
    at = login_as(AppTest.from_file(page, default_timeout=30), "operator").run()
    assert "Only admins" in at.error[0].value
    at = login_as(AppTest.from_file(page, default_timeout=30), "admin", "root").run()
    assert list(at.dataframe[0].value["user"]) == ["root"]
    assert "user.create" in list(at.dataframe[1].value["action"])


def test_cli_bootstrap_and_open_console_refusal(platform_env: dict[str, str]) -> None:
    line = one_error_line(cli(platform_env, "console", "--host", "0.0.0.0", "--port", "18999"))
    assert "refusing to serve the console on 0.0.0.0 while no admin password is set" in line
    made = cli({**platform_env, "POSTTRAIN_ADMIN_PASSWORD": PASSWORD}, "users", "bootstrap-admin", "boss")
    assert made.returncode == 0, made.stderr
    again = cli({**platform_env, "POSTTRAIN_ADMIN_PASSWORD": PASSWORD}, "users", "bootstrap-admin", "boss2")
    assert "an admin exists already" in one_error_line(again)
    assert auth.authenticate("boss", PASSWORD).role is Role.admin


def test_racing_setup_forms_create_exactly_one_admin_and_only_from_this_machine(platform_env: dict[str, str]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with pytest.raises(auth.AuthError, match="from a browser on the console's own machine"):
        auth.setup_first_admin("far", PASSWORD, client_ip="10.1.2.3", bind_host="127.0.0.1")
    with pytest.raises(auth.AuthError, match="console on 0.0.0.0"):
        auth.setup_first_admin("open", PASSWORD, client_ip=None, bind_host="0.0.0.0")

    def attempt(i: int) -> str:
        try:
            return auth.setup_first_admin(f"admin{i}", PASSWORD, client_ip=None, bind_host="127.0.0.1").username
        except auth.AuthError as exc:
            return str(exc)

    with ThreadPoolExecutor(max_workers=6) as pool:
        outcomes = list(pool.map(attempt, range(6)))
    made = [o for o in outcomes if o.startswith("admin")]
    assert len(made) == 1 and all(o == auth.ADMIN_EXISTS for o in outcomes if o not in made), outcomes
    with session(read_only=True) as s:
        assert [u.username for u in s.exec(select(User))] == made
    assert [(e.username, e.target) for e in auth.audit_log() if e.action == "user.create"] == [("setup-form", made[0])]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_console_setup_form_creates_the_first_admin_once(
    platform_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The setup form, only to a browser on the machine of a console bound to loopback (Streamlit reports such a
    browser's address as None; AppTest gives a stand-in, so the address is set here as a real server reports it)."""
    from streamlit import config
    from streamlit.runtime.context import ContextProxy

    app = str(REPO_ROOT / "ui" / "app.py")
    before = config.get_option("server.address")
    try:
        for bind, client in (("0.0.0.0", None), ("127.0.0.1", "10.0.0.9")):  # an open console, a remote browser
            config.set_option("server.address", bind)
            monkeypatch.setattr(ContextProxy, "ip_address", property(lambda self, c=client: c))
            at = AppTest.from_file(app, default_timeout=30).run()
            assert not at.exception and "posttrain users bootstrap-admin" in at.info[0].value, (bind, client)
            assert [t.label for t in at.text_input] == ["Username", "Password"]  # the login only, no setup form
        config.set_option("server.address", "127.0.0.1")
        monkeypatch.setattr(ContextProxy, "ip_address", property(lambda self: None))
        _setup_form_flow(app)
    finally:
        config.set_option("server.address", before)


def _setup_form_flow(app: str) -> None:
    at = AppTest.from_file(app, default_timeout=30).run()
    assert [t.label for t in at.text_input] == ["Admin username", "Password", "Password again"]
    at.text_input(key="setup_password").input(PASSWORD)
    at.text_input(key="setup_password_again").input(PASSWORD + "!")
    at.button[0].click().run()
    assert "The two passwords differ" in at.error[0].value and not auth.list_users()
    at.text_input(key="setup_password_again").input(PASSWORD)
    at.button[0].click().run()
    assert not at.exception and any("Signed in as **admin** (admin)" in c.value for c in at.sidebar.caption)
    assert auth.authenticate("admin", PASSWORD).role is Role.admin
    later = AppTest.from_file(app, default_timeout=30).run()  # another browser afterwards: the login, no form
    assert [t.label for t in later.text_input] == ["Username", "Password"]
