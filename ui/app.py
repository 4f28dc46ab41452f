"""The posttrain console: ``posttrain console`` serves this with Streamlit.

Multipage through ``st.navigation``; every page reads and writes through
``posttrain.platform`` only, and long work always runs as a job.
"""

from __future__ import annotations

import json
from pathlib import Path

import streamlit as st
from PIL import Image, ImageDraw
from sqlalchemy.exc import SQLAlchemyError

from posttrain.platform import auth, sessions
from posttrain.platform.db.engine import DatabaseUnavailable
from posttrain.platform.db.models import Role
from posttrain.platform.oidc import PROVIDER, oidc_login
from posttrain.platform.settings import SettingsError, get_settings
from posttrain.ui.common import IDENTITY_KEY, SESSION_KEY, refreshed_identity

VIEWS = Path(__file__).resolve().parent / "views"
HANDOFF_KEY = "session_handoff"  # a login's one-time code, handed to the session route on the next page run
CLEAR_COOKIE_KEY = "session_cleared"  # logged out: the login page asks the route to drop the cookie


def logged_in(identity: auth.Identity) -> None:
    """A password login (or the first admin's): the identity kept for this tab, and a console session started
    whose cookie the next page run fetches (:func:`hand_off`): a reload and other tabs stay logged in."""
    sid, code = sessions.start(identity)
    st.session_state[IDENTITY_KEY], st.session_state[SESSION_KEY] = identity, sid
    st.session_state[HANDOFF_KEY] = code
    st.rerun()


def hand_off() -> None:
    """After a login: the page hands the session's one-time code to the console's session route
    (``POST /_posttrain/session``, posttrain.ui.server), whose answer sets the HttpOnly cookie. The code is spent on
    use and lapses in a minute; page scripts never see the cookie itself."""
    if (code := st.session_state.pop(HANDOFF_KEY, None)) is not None:
        st.html(f"<script>fetch({json.dumps(sessions.HANDOFF_ROUTE)}, {{method: 'POST', body: {json.dumps(code)}, "
                "credentials: 'same-origin', headers: {'Content-Type': 'text/plain'}});</script>",
                unsafe_allow_javascript=True)  # fmt: skip


def drop_cookie() -> None:
    """After a logout (its session already revoked): the route drops the cookie from the browser as well."""
    if st.session_state.pop(CLEAR_COOKIE_KEY, False):
        st.html(f"<script>fetch({json.dumps(sessions.LOGOUT_ROUTE)}, {{method: 'POST', "
                "credentials: 'same-origin'});</script>", unsafe_allow_javascript=True)  # fmt: skip


def cookie_identity() -> auth.Identity | None:
    """A reload or another tab: the identity of the session the browser's cookie names, when it is live."""
    cookie = st.context.cookies.get(sessions.COOKIE)
    if not cookie:
        return None
    try:
        resumed = sessions.resume(cookie)
    except (DatabaseUnavailable, SettingsError, SQLAlchemyError):
        return None  # the page says what is wrong with the database
    if resumed is None:
        return None
    st.session_state[IDENTITY_KEY], st.session_state[SESSION_KEY] = resumed
    return resumed[0]


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
                    admin = auth.setup_first_admin(name, password, client_ip=client, bind_host=bind_host())
                except auth.AuthError as exc:
                    if auth.ADMIN_EXISTS not in str(exc):
                        st.error(str(exc))
                        return True
                    st.warning("An admin was created meanwhile (another browser, or the command line): log in below.")
                    return False
                logged_in(admin)
    return True


def login() -> None:
    st.title("posttrain")
    drop_cookie()
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
                identity = auth.authenticate(name, password)
            except auth.AuthError as exc:
                st.error(str(exc))
            else:
                logged_in(identity)


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


identity = refreshed_identity() or cookie_identity() or sso_identity()
if identity is None:
    login()
    st.stop()
hand_off()

with st.sidebar:
    st.caption(f"Signed in as **{identity.username}** ({identity.role.value})")
    if st.button("Log out", key="logout"):
        if (sid := st.session_state.pop(SESSION_KEY, None)) is not None:
            sessions.end(sid, identity.username)  # every tab of this session, and the cookie, logged out
            st.session_state[CLEAR_COOKIE_KEY] = True
        else:
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
