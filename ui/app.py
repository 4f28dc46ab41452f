"""The posttrain console: ``posttrain console`` serves this with Streamlit.

Multipage through ``st.navigation``; every page reads and writes through
``posttrain.platform`` only, and long work always runs as a job.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st
from PIL import Image, ImageDraw

from posttrain.platform import auth
from posttrain.platform.db.engine import DatabaseUnavailable
from posttrain.platform.db.models import Role
from posttrain.platform.oidc import PROVIDER, oidc_login
from posttrain.platform.settings import get_settings
from posttrain.ui.common import IDENTITY_KEY, refreshed_identity

VIEWS = Path(__file__).resolve().parent / "views"


def favicon() -> Image.Image:
    """The tab's icon, drawn here and served by the console itself: a ``:material/...:`` page icon makes
    the browser fetch the icon's SVG from fonts.gstatic.com, a name no machine without internet resolves
    (each page then logged net::ERR_NAME_NOT_RESOLVED), and an emoji needs a colour-emoji font."""
    image = Image.new("RGBA", (64, 64), (0, 0, 0, 0))
    draw = ImageDraw.Draw(image)
    draw.rounded_rectangle((2, 2, 61, 61), radius=12, fill=(37, 99, 235, 255))
    draw.line([(12, 48), (24, 38), (34, 42), (52, 16)], fill=(255, 255, 255, 255), width=6, joint="curve")
    return image


st.set_page_config(page_title="posttrain", page_icon=favicon(), layout="wide")


def bind_host() -> str:
    """The address this console listens on (``posttrain console`` passes it; unset: Streamlit's default, all addresses)."""
    return str(st.get_option("server.address") or "0.0.0.0")


def first_admin_form() -> bool:
    """With no users yet, a browser on this machine creates the first admin here (once); True while the form is
    shown. Anywhere else, the way to do it on the command line."""
    client = st.context.ip_address  # None: a browser on this machine (Streamlit reports loopback so)
    if client is not None or not auth.is_loopback(bind_host()):
        st.info(
            "No users yet. Create the first admin on the console's machine: open this page there, or run "
            "`posttrain users bootstrap-admin NAME`."
        )
        return False
    st.subheader("Welcome: create the first admin")
    st.caption(
        f"This one-time form is served only to a browser on this machine. The admin can then add users "
        f"(Users & audit). Passwords need at least {auth.MIN_PASSWORD_LENGTH} characters."
    )
    with st.form("first_admin"):
        name = st.text_input("Admin username", value="admin", key="setup_username")
        password = st.text_input("Password", type="password", key="setup_password")
        again = st.text_input("Password again", type="password", key="setup_password_again")
        if st.form_submit_button("Create admin and log in", type="primary"):
            if password != again:
                st.error("The two passwords differ: type the same password twice.")
            else:
                try:
                    st.session_state[IDENTITY_KEY] = auth.setup_first_admin(
                        name, password, client_ip=client, bind_host=bind_host()
                    )
                except auth.AuthError as exc:
                    if auth.ADMIN_EXISTS not in str(exc):
                        st.error(str(exc))
                        return True
                    st.warning("An admin was created meanwhile (another browser, or the command line): log in below.")
                    return False
                st.rerun()
    return True


def login() -> None:
    st.title("posttrain")
    try:
        anyone = bool(auth.list_users())
    except DatabaseUnavailable as exc:
        st.error(str(exc))
        st.stop()
    sso = get_settings().oidc
    if not anyone and sso is None:
        if first_admin_form():
            return
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
    pages.append(
        st.Page(VIEWS / "admin.py", title="Users & audit", icon=":material/admin_panel_settings:", url_path="admin")
    )
st.navigation(pages).run()
