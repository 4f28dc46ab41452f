"""The posttrain console: ``posttrain console`` serves this with Streamlit.

Multipage through ``st.navigation``; every page reads and writes through
``posttrain.platform`` only, and long work always runs as a job.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from posttrain.platform import auth
from posttrain.platform.db.engine import DatabaseUnavailable
from posttrain.platform.db.models import Role
from posttrain.platform.oidc import PROVIDER, oidc_login
from posttrain.platform.settings import get_settings
from posttrain.ui.common import IDENTITY_KEY, refreshed_identity

VIEWS = Path(__file__).resolve().parent / "views"

st.set_page_config(page_title="posttrain", page_icon=":material/model_training:", layout="wide")



def login() -> None:
    st.title("posttrain")
    try:
        anyone = bool(auth.list_users())
    except DatabaseUnavailable as exc:
        st.error(str(exc))
        st.stop()
    sso = get_settings().oidc
    if not anyone and sso is None:
        st.info("No users yet. Create the first admin on the command line: `posttrain users bootstrap-admin admin`")
    if sso is not None:
        st.button(f"Log in with {sso.provider_name}", key="login_oidc", type="primary", icon=":material/login:",
                  on_click=st.login, args=(PROVIDER,))  # fmt: skip
    with st.form("login"):
        name = st.text_input("Username", key="login_username")
        password = st.text_input("Password", type="password", key="login_password")
        if st.form_submit_button("Log in", type="primary"):
            try:
                st.session_state[IDENTITY_KEY] = auth.authenticate(name, password)
            except auth.AuthError as exc:
                st.error(str(exc))
            else:
                st.rerun()


def sso_identity() -> auth.Identity | None:
    """After the identity provider sent the browser back (``st.user`` holds the verified token's
    claims): the posttrain identity for it, or the refusal shown and the provider's cookie dropped."""
    sso = get_settings().oidc
    if sso is None or not st.user.get("is_logged_in"):
        return None
    try:
        identity = oidc_login(st.user.to_dict(), sso)
    except (auth.AuthError, DatabaseUnavailable) as exc:
        st.error(str(exc))
        if st.button("Log out of the identity provider", key="sso_logout"):
            st.logout()
        st.stop()
    st.session_state[IDENTITY_KEY] = identity
    return identity


identity = refreshed_identity() or sso_identity()
if identity is None:
    login()
    st.stop()

with st.sidebar:
    st.caption(f"Signed in as **{identity.username}** ({identity.role.value})")
    if st.button("Log out", key="logout"):
        auth.audit(identity.username, "logout")
        del st.session_state[IDENTITY_KEY]
        if st.user.get("is_logged_in"):
            st.logout()  # drops the single sign-on cookie too, and reruns
        st.rerun()

pages = [
    st.Page(VIEWS / "overview.py", title="Overview", icon=":material/dashboard:", url_path="overview", default=True),
    st.Page(VIEWS / "documents.py", title="Documents", icon=":material/description:", url_path="documents"),
    st.Page(VIEWS / "jobs.py", title="Jobs", icon=":material/work_history:", url_path="jobs"),
    st.Page(VIEWS / "tasks.py", title="Tasks", icon=":material/task_alt:", url_path="tasks"),
    st.Page(VIEWS / "training.py", title="Training", icon=":material/model_training:", url_path="training"),
    st.Page(VIEWS / "models.py", title="Models & Serving", icon=":material/smart_toy:", url_path="models"),
    st.Page(VIEWS / "sandboxes.py", title="Sandboxes", icon=":material/shield:", url_path="sandboxes"),
]
if identity.can(Role.admin):
    pages.append(st.Page(VIEWS / "admin.py", title="Users & audit", icon=":material/admin_panel_settings:", url_path="admin"))
st.navigation(pages).run()
