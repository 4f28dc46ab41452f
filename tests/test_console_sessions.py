"""Console sessions that survive a reload (posttrain.platform.sessions, the routes of posttrain.ui.server).

The platform's half on a real database: a login's one-time code gives a signed cookie once; the cookie stands for
the user until it expires, its session is revoked (logout, a password change, a disabled account), or it is forged.
The browser's half in Debian's Chromium against ``posttrain console``: F5 keeps the user on the page they were on,
a second tab is logged in, page scripts cannot read the cookie, and after logout the old cookie opens nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from conftest import OPERATOR
from required_parts import require
from test_e2e_console import ARTIFACTS, launch_chromium, serving_console

from posttrain.platform import auth, sessions, users
from posttrain.platform.db.engine import session
from posttrain.platform.db.models import ConsoleSession, Role, utcnow
from posttrain.platform.engines.launcher import free_port

PASSWORD = "sessions-password-1"
ADMIN = auth.Identity("root", Role.admin)


@pytest.fixture
def dana(platform_env: dict[str, str], db_url: str) -> auth.Identity:
    auth.bootstrap_admin("root", PASSWORD, url=db_url)
    return auth.create_user(ADMIN, "dana", PASSWORD, Role.operator, url=db_url)


def cookie_of(identity: auth.Identity, url: str) -> tuple[int, str]:
    sid, code = sessions.start(identity, url=url)
    cookie, max_age = sessions.redeem(code, url=url)
    assert 0 < max_age <= 12 * 3600
    return sid, cookie


def test_a_login_code_gives_its_cookie_once_and_the_cookie_stands_for_the_user(
    dana: auth.Identity, db_url: str
) -> None:
    sid, code = sessions.start(dana, url=db_url)
    cookie, _ = sessions.redeem(code, url=db_url)
    assert sessions.resume(cookie, url=db_url) == (dana, sid)
    with pytest.raises(sessions.SessionRefused, match="unknown or spent"):  # single use
        sessions.redeem(code, url=db_url)
    with pytest.raises(sessions.SessionRefused, match="unknown or spent") as refused:
        sessions.redeem("a-guess", url=db_url)
    assert "a-guess" not in str(refused.value)
    with session(db_url, read_only=True) as s:  # only a hash of the code was ever stored, and none after use
        row = s.get(ConsoleSession, sid)
        assert row is not None and row.handoff_sha256 is None and code not in repr(row)
    # a changed role applies to the session at once
    auth.set_role(ADMIN, "dana", Role.viewer, url=db_url)
    assert sessions.resume(cookie, url=db_url) == (auth.Identity("dana", Role.viewer), sid)


def test_a_late_code_and_an_expired_cookie_are_refused(dana: auth.Identity, db_url: str) -> None:
    sid, code = sessions.start(dana, url=db_url)
    with session(db_url) as s:
        row = s.get(ConsoleSession, sid)
        assert row is not None
        row.handoff_expires_at = utcnow() - timedelta(seconds=1)
        s.add(row)
    with pytest.raises(sessions.SessionRefused, match="expired"):
        sessions.redeem(code, url=db_url)
    sid, cookie = cookie_of(dana, db_url)
    with session(db_url) as s:
        row = s.get(ConsoleSession, sid)
        assert row is not None
        row.expires_at = utcnow() - timedelta(seconds=1)
        s.add(row)
    assert sessions.resume(cookie, url=db_url) is None and not sessions.live(sid, url=db_url)
    # the expiry signed into the cookie holds even where the row would allow more
    sid, cookie = cookie_of(dana, db_url)
    number, expires, signature = cookie.split(".")
    assert sessions.resume(f"{number}.{int(expires) + 3600}.{signature}", url=db_url) is None


def test_a_forged_or_altered_cookie_opens_nothing(dana: auth.Identity, db_url: str) -> None:
    sid, cookie = cookie_of(dana, db_url)
    number, expires, signature = cookie.split(".")
    flipped = signature[:-1] + ("A" if signature[-1] != "A" else "B")
    other_sid, _ = cookie_of(auth.Identity("root", Role.admin), db_url)
    for forged in (f"{number}.{expires}.{flipped}", f"{other_sid}.{expires}.{signature}", f"{number}.{expires}.",
                   "", "x" * 5000, "1.2", f"{number}.{expires}.{signature}.extra"):  # fmt: skip
        assert sessions.resume(forged, url=db_url) is None, forged
    assert sessions.resume(cookie, url=db_url) == (dana, sid)  # the real one still works


def test_logout_a_password_change_and_a_disabled_account_end_sessions(dana: auth.Identity, db_url: str) -> None:
    first, cookie = cookie_of(dana, db_url)
    sessions.end(first, "dana", url=db_url)
    assert sessions.resume(cookie, url=db_url) is None and not sessions.live(first, url=db_url)
    a, cookie_a = cookie_of(dana, db_url)
    b, cookie_b = cookie_of(dana, db_url)
    root, cookie_root = cookie_of(ADMIN, db_url)
    auth.set_password(ADMIN, "dana", "a-new-password-2", url=db_url)
    assert sessions.resume(cookie_a, url=db_url) is None and sessions.resume(cookie_b, url=db_url) is None
    assert sessions.resume(cookie_root, url=db_url) == (ADMIN, root)  # another user's session is not touched
    c, cookie_c = cookie_of(dana, db_url)
    users.disable_user(ADMIN, "dana", url=db_url)
    assert sessions.resume(cookie_c, url=db_url) is None
    users.enable_user(ADMIN, "dana", url=db_url)
    assert sessions.resume(cookie_c, url=db_url) is None  # enabled again: a new login, not the old session
    assert OPERATOR.username != "dana"


@pytest.fixture
def console_with_user(tmp_path: Path) -> Iterator[dict[str, str]]:
    """``posttrain console`` on a fresh SQLite database with one operator."""
    require("chromium")
    data = tmp_path
    port = free_port()
    env = {
        **os.environ,
        "POSTTRAIN_DATA_DIR": str(data),
        "POSTTRAIN_DATABASE_URL": f"sqlite:///{data / 'posttrain.db'}",
    }
    cli = [sys.executable, "-m", "posttrain.platform.cli"]
    subprocess.run([*cli, "db", "upgrade"], env=env, check=True, capture_output=True)
    subprocess.run([*cli, "users", "bootstrap-admin", "root", "--password-stdin"], env=env, input=f"{PASSWORD}\n",
                   text=True, check=True, capture_output=True)  # fmt: skip
    with serving_console(env, data, port) as base:
        yield {"base": base, "data": str(data)}


@pytest.mark.slow
def test_a_reload_keeps_the_user_on_their_page_and_a_second_tab_is_logged_in(console_with_user: dict[str, str]) -> None:
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    base = console_with_user["base"]
    with sync_playwright() as p:
        browser = launch_chromium(p)
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        page = context.new_page()
        page.set_default_timeout(60_000)
        page.goto(base)
        page.get_by_label("Username").fill("root")
        page.get_by_label("Password", exact=True).fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        page.get_by_text("Signed in as root (admin)").wait_for()
        page.get_by_role("link", name="Jobs").click()
        page.wait_for_url(f"{base}/jobs")
        page.get_by_text("Signed in as root (admin)").wait_for()
        (cookie,) = [c for c in context.cookies() if c["name"] == sessions.COOKIE]
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["expires"] > 0
        assert sessions.COOKIE not in page.evaluate("document.cookie")  # page scripts cannot read it

        page.reload()  # F5: the same page, still logged in
        page.get_by_text("Signed in as root (admin)").wait_for()
        assert page.url == f"{base}/jobs" and page.get_by_role("button", name="Log in").count() == 0
        page.screenshot(path=str(ARTIFACTS / "sessions-reloaded.png"))

        second = context.new_page()  # another tab of the same browser
        second.set_default_timeout(60_000)
        second.goto(f"{base}/training")
        second.get_by_text("Signed in as root (admin)").wait_for()

        page.get_by_role("button", name="Log out").click()
        page.get_by_role("button", name="Log in").wait_for()
        page.reload()  # the cookie is gone, and its session ended
        page.get_by_role("button", name="Log in").wait_for()
        assert not [c for c in context.cookies() if c["name"] == sessions.COOKIE]
        second.reload()  # the other tab's session was the same one: logged out there too
        second.get_by_role("button", name="Log in").wait_for()

        replay = browser.new_context()  # the old cookie, replayed by a browser that kept a copy
        replay.add_cookies([{k: cookie[k] for k in ("name", "value", "domain", "path")}])  # type: ignore[misc]
        stale = replay.new_page()
        stale.set_default_timeout(60_000)
        stale.goto(f"{base}/jobs")
        stale.get_by_role("button", name="Log in").wait_for()
        browser.close()
