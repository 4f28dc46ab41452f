"""Console single sign-on (OpenID Connect through ``st.login``): claim mapping and refusals against a
real database, the secrets file Streamlit reads, and the whole redirect flow in Debian's Chromium
against ``posttrain console`` and a small but real OpenID provider served by this module
(discovery document, authorization code, RS256-signed identity token, JWKS)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import time
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest
from conftest import ADMIN
from fastapi import FastAPI, Form, Request
from fastapi.responses import JSONResponse, RedirectResponse
from required_parts import require
from sqlmodel import select
from test_e2e_console import ARTIFACTS, launch_chromium, serving_console

from posttrain.platform import auth
from posttrain.platform.db.engine import session
from posttrain.platform.db.models import AuditLog, Role
from posttrain.platform.engines.launcher import free_port
from posttrain.platform.oidc import PROVIDER, oidc_login, write_streamlit_secrets
from posttrain.platform.settings import OIDCConfig, Settings, SettingsError, load_settings

CLIENT_SECRET = "s3cret-client-value-for-the-test"


def config(**overrides: object) -> OIDCConfig:
    values: dict[str, object] = {"client_id": "posttrain", "client_secret": CLIENT_SECRET,
                                 "server_metadata_url": "http://127.0.0.1:1/.well-known/openid-configuration"}  # fmt: skip
    return OIDCConfig.model_validate({**values, **overrides})


def audit_rows(action: str) -> list[AuditLog]:
    with session(read_only=True) as s:
        return list(s.exec(select(AuditLog).where(AuditLog.action == action)).all())


def test_claims_map_to_users_and_refusals_are_clear(platform_env: dict[str, str]) -> None:
    sso = config(allowed_domains=["example.com"])
    first = oidc_login({"sub": "1", "email": "Alice@Example.com", "email_verified": True}, sso)
    assert first == auth.Identity("alice@example.com", Role.viewer)  # first login: the default role
    auth.set_role(ADMIN, "alice@example.com", Role.operator)
    assert (
        oidc_login({"sub": "1", "email": "alice@example.com"}, sso).role is Role.operator
    )  # a role set by an admin stays
    logins = audit_rows("login")
    assert [r.details["via"] for r in logins] == ["oidc", "oidc"] and logins[0].details["sub"] == "1"
    # an SSO user has no password: the password form never lets it in
    with pytest.raises(auth.AuthError, match="wrong username or password"):
        auth.authenticate("alice@example.com", "")

    with pytest.raises(auth.AuthError, match=r"mallory@evil\.org is not in an allowed domain \(example\.com\)"):
        oidc_login({"email": "mallory@evil.org"}, sso)
    with pytest.raises(auth.AuthError, match="POSTTRAIN_OIDC__USERNAME_CLAIM"):
        oidc_login({"sub": "2"}, sso)
    with pytest.raises(auth.AuthError, match="not verified"):
        oidc_login({"email": "bob@example.com", "email_verified": False}, sso)
    with pytest.raises(auth.AuthError, match="POSTTRAIN_OIDC__USERNAME_CLAIM"):
        oidc_login({"email": "x\x00y@example.com"}, sso)
    assert [u.username for u in auth.list_users()] == ["alice@example.com"]  # nothing created by a refusal

    with session() as s:
        user = s.exec(select(auth.User).where(auth.User.username == "alice@example.com")).one()
        user.disabled = True
        s.add(user)
    with pytest.raises(auth.AuthError, match="disabled"):
        oidc_login({"email": "alice@example.com"}, sso)
    assert audit_rows("login.failed")[-1].details == {"via": "oidc", "reason": "disabled"}

    other = oidc_login(
        {"preferred_username": "carol"}, config(username_claim="preferred_username", default_role="operator")
    )
    assert other == auth.Identity("carol", Role.operator)


def test_settings_and_the_secrets_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSTTRAIN_OIDC__CLIENT_ID", "posttrain")
    monkeypatch.setenv("POSTTRAIN_OIDC__CLIENT_SECRET", CLIENT_SECRET)
    monkeypatch.setenv("POSTTRAIN_OIDC__SERVER_METADATA_URL", "ftp://idp/.well-known/openid-configuration")
    with pytest.raises(SettingsError, match="POSTTRAIN_OIDC__SERVER_METADATA_URL") as refused:
        load_settings()
    assert CLIENT_SECRET not in str(refused.value)
    monkeypatch.setenv(
        "POSTTRAIN_OIDC__SERVER_METADATA_URL", "https://idp.example.com/.well-known/openid-configuration"
    )
    settings = load_settings()
    assert isinstance(settings, Settings) and settings.oidc is not None
    assert CLIENT_SECRET not in repr(settings) and CLIENT_SECRET not in str(settings.model_dump())

    path = write_streamlit_secrets(settings.oidc, tmp_path / "data", 8601)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    written = tomllib.loads(path.read_text())
    assert written["auth"]["redirect_uri"] == "http://localhost:8601/oauth2callback"
    assert written["auth"][PROVIDER] == {"client_id": "posttrain", "client_secret": CLIENT_SECRET,
                                         "server_metadata_url": "https://idp.example.com/.well-known/openid-configuration"}  # fmt: skip
    cookie = written["auth"]["cookie_secret"]
    assert len(cookie) >= 32
    again = tomllib.loads(write_streamlit_secrets(settings.oidc, tmp_path / "data", 8601).read_text())
    assert again["auth"]["cookie_secret"] == cookie  # kept: sessions survive a console restart


# --------------------------------------------------------------------- a real provider
class Provider:
    """An OpenID provider that signs in ``user`` without asking (authorization code flow)."""

    def __init__(self, port: int, user: dict[str, object]) -> None:
        from joserfc.jwk import RSAKey  # Authlib's own JOSE library

        self.issuer = f"http://127.0.0.1:{port}"
        self.key = RSAKey.generate_key(2048, parameters={"kid": "k1"}, private=True)
        self.codes: dict[str, dict[str, str]] = {}
        self.token_requests = 0
        app = FastAPI()

        @app.get("/.well-known/openid-configuration")
        def discovery() -> dict[str, object]:
            return {
                "issuer": self.issuer, "authorization_endpoint": f"{self.issuer}/authorize",
                "token_endpoint": f"{self.issuer}/token", "jwks_uri": f"{self.issuer}/jwks",
                "response_types_supported": ["code"], "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": ["RS256"], "scopes_supported": ["openid", "email", "profile"],
                "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
            }  # fmt: skip

        @app.get("/authorize")
        def authorize(request: Request) -> RedirectResponse:
            q = request.query_params
            code = uuid.uuid4().hex
            self.codes[code] = {"nonce": q.get("nonce", ""), "client_id": q["client_id"]}
            return RedirectResponse(
                f"{q['redirect_uri']}?{urlencode({'code': code, 'state': q['state']})}", status_code=302
            )

        @app.post("/token")
        def token(request: Request, code: str = Form(...)) -> JSONResponse:
            from joserfc import jwt

            self.token_requests += 1
            grant = self.codes.pop(code, None)
            if grant is None:
                return JSONResponse({"error": "invalid_grant"}, status_code=400)
            now = int(time.time())
            claims = {
                "iss": self.issuer,
                "aud": grant["client_id"],
                "iat": now,
                "exp": now + 300,
                "nonce": grant["nonce"],
                **user,
            }
            id_token = jwt.encode({"alg": "RS256", "kid": "k1"}, claims, self.key)
            return JSONResponse(
                {"access_token": uuid.uuid4().hex, "token_type": "Bearer", "expires_in": 300, "id_token": id_token}
            )

        @app.get("/jwks")
        def jwks() -> dict[str, object]:
            return {"keys": [self.key.as_dict(private=False)]}

        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Provider:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline:
                raise AssertionError("the test OpenID provider did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def sso_console(tmp_path: Path) -> Iterator[dict[str, object]]:
    require("chromium")
    idp_port, port = free_port(), free_port()
    data = tmp_path
    env = {
        **os.environ,
        "POSTTRAIN_DATA_DIR": str(data),
        "POSTTRAIN_DATABASE_URL": f"sqlite:///{data / 'posttrain.db'}",
        "POSTTRAIN_OIDC__CLIENT_ID": "posttrain",
        "POSTTRAIN_OIDC__CLIENT_SECRET": CLIENT_SECRET,
        "POSTTRAIN_OIDC__SERVER_METADATA_URL": f"http://127.0.0.1:{idp_port}/.well-known/openid-configuration",
        "POSTTRAIN_OIDC__PROVIDER_NAME": "Test IdP",
        "POSTTRAIN_OIDC__ALLOWED_DOMAINS": '["example.com"]',
    }
    cli = [sys.executable, "-m", "posttrain.platform.cli"]
    subprocess.run([*cli, "db", "upgrade"], env=env, check=True, capture_output=True)
    user = {"sub": "u-42", "email": "dana@example.com", "email_verified": True, "name": "Dana"}
    with Provider(idp_port, user) as provider:
        with serving_console(env, data, port, host="localhost") as base:
            yield {"base": base, "data": data, "env": env, "provider": provider}


@pytest.mark.slow
def test_single_sign_on_in_a_real_browser(sso_console: dict[str, object]) -> None:
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    base = str(sso_console["base"])
    with sync_playwright() as p:
        browser = launch_chromium(p)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.set_default_timeout(60_000)
        page.goto(base)
        button = page.get_by_role("button", name="Log in with Test IdP")
        button.wait_for()
        assert page.get_by_role("link", name="Jobs").count() == 0  # nothing before login
        button.click()
        page.get_by_role("heading", name="Overview").wait_for()  # via the provider and back
        page.get_by_text("Signed in as dana@example.com (viewer)").wait_for()
        page.screenshot(path=str(ARTIFACTS / "sso-overview.png"))
        assert sso_console["provider"].token_requests == 1  # type: ignore[attr-defined]
        page.get_by_role("button", name="Log out").click()
        page.get_by_role("button", name="Log in with Test IdP").wait_for()
        browser.close()

    env = sso_console["env"]
    assert isinstance(env, dict)
    out = subprocess.run([sys.executable, "-m", "posttrain.platform.cli", "users", "list"], env=env, capture_output=True,
                         text=True, check=True)  # fmt: skip
    assert "dana@example.com" in out.stdout and "viewer" in out.stdout
    # the client secret is in the 0600 secrets file Streamlit reads, nowhere else
    data = Path(str(sso_console["data"]))
    assert CLIENT_SECRET not in (data / "console.log").read_text()
    assert CLIENT_SECRET.encode() not in (data / "posttrain.db").read_bytes()
