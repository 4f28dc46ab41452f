"""Single sign-on for the console: OpenID Connect through Streamlit's ``st.login``.

Configured by ``POSTTRAIN_OIDC__*`` (or an ``[oidc]`` table in posttrain.toml)::

    POSTTRAIN_OIDC__CLIENT_ID=posttrain
    POSTTRAIN_OIDC__CLIENT_SECRET=...            # never shown, logged or stored in the database
    POSTTRAIN_OIDC__SERVER_METADATA_URL=https://idp.example.com/.well-known/openid-configuration
    POSTTRAIN_OIDC__PROVIDER_NAME="Example SSO"  # the login button says "Log in with Example SSO"
    POSTTRAIN_OIDC__DEFAULT_ROLE=viewer          # the role of a first-time user
    POSTTRAIN_OIDC__ALLOWED_DOMAINS='["example.com"]'

``posttrain console`` writes the ``[auth]`` secrets Streamlit needs into
``<data_dir>/console/secrets.toml`` (mode 0600) and points Streamlit at it; the cookie
secret is generated once and kept beside it unless configured. On the way back from the
provider, :func:`oidc_login` maps the identity token's claims to a posttrain user: the
``username_claim`` (email by default) names the user; a first-time user is created with
``default_role`` and no password (so it can only log in through the provider); a disabled
user is refused; every login is in the audit log with ``via: oidc``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sqlmodel import select

from posttrain.platform.auth import AuthError, Identity, _plausible_username, _shown, audit, kept_secret
from posttrain.platform.db.engine import session
from posttrain.platform.db.models import AuditLog, Role, User, utcnow
from posttrain.platform.settings import OIDCConfig

PROVIDER = "posttrain"  # the [auth.<provider>] section st.login(PROVIDER) reads


def _toml_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_streamlit_secrets(config: OIDCConfig, data_dir: Path, console_port: int) -> Path:
    """The ``[auth]`` secrets file Streamlit reads (mode 0600 in a 0700 folder); returns its path."""
    folder = Path(data_dir) / "console"
    cookie = (
        config.cookie_secret.get_secret_value()
        if config.cookie_secret is not None
        else kept_secret(folder, "cookie_secret")
    )
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    redirect = config.redirect_uri or f"http://localhost:{console_port}/oauth2callback"
    lines = [
        "[auth]",
        f"redirect_uri = {_toml_string(redirect)}",
        f"cookie_secret = {_toml_string(cookie)}",
        "",
        f"[auth.{PROVIDER}]",
        f"client_id = {_toml_string(config.client_id)}",
        f"client_secret = {_toml_string(config.client_secret.get_secret_value())}",
        f"server_metadata_url = {_toml_string(config.server_metadata_url)}",
        "",
    ]
    path = folder / "secrets.toml"
    tmp = folder / "secrets.toml.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write("\n".join(lines))
    tmp.replace(path)
    return path


def oidc_login(claims: dict[str, Any], config: OIDCConfig, *, url: str | None = None) -> Identity:
    """The :class:`~posttrain.platform.auth.Identity` for a provider's verified identity-token claims,
    creating the user on first login; raises :class:`~posttrain.platform.auth.AuthError` when refused."""
    raw = claims.get(config.username_claim)
    username = str(raw).strip().lower() if raw is not None else ""
    if not _plausible_username(username):
        raise AuthError(f"the identity provider sent no usable {config.username_claim!r} claim; "
                        f"set POSTTRAIN_OIDC__USERNAME_CLAIM to a claim it sends (e.g. email or preferred_username)")  # fmt: skip
    if config.username_claim == "email" and claims.get("email_verified") is False:
        raise AuthError(f"the identity provider has not verified the email address {username}")
    domain = username.rsplit("@", 1)[-1] if "@" in username else ""
    if config.allowed_domains and domain not in {d.lower() for d in config.allowed_domains}:
        audit(_shown(username), "login.failed", details={"via": "oidc", "reason": "domain not allowed"}, url=url)
        raise AuthError(f"{username} is not in an allowed domain ({', '.join(config.allowed_domains)}); ask an admin")
    identity: Identity | None
    with session(url) as s:
        user = s.exec(select(User).where(User.username == username)).first()
        if user is not None and user.disabled:
            s.add(AuditLog(username=username, action="login.failed", details={"via": "oidc", "reason": "disabled"}))
            identity = None
        else:
            if user is None:
                user = User(username=username, password_hash="", role=Role(config.default_role))
                s.add(AuditLog(username="oidc", action="user.create", target=username,
                               details={"role": config.default_role, "via": "oidc"}))  # fmt: skip
            user.last_login_at = utcnow()
            s.add(user)
            s.add(
                AuditLog(
                    username=username, action="login", details={"via": "oidc", "sub": str(claims.get("sub", ""))[:128]}
                )
            )
            identity = Identity(user.username, user.role)
    if identity is None:
        raise AuthError(f"user {username} is disabled; ask an admin")
    return identity
