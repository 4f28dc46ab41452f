"""Users & audit (admins only): users, their roles and whether they are enabled, API keys, and the audit log."""

from __future__ import annotations

from datetime import timedelta

import streamlit as st

from posttrain.platform import api_keys, auth
from posttrain.platform.db.models import ApiKey, Role, utcnow
from posttrain.platform.display import details_text, utc_text
from posttrain.platform.models.registry import list_models
from posttrain.platform.serving.client import CONSOLE_KEY
from posttrain.platform.users import disable_user, enable_user
from posttrain.ui.common import can, guard_platform, me, plain_table

RECENT_USE = timedelta(days=1)  # a key used this recently is "in use": revoking it asks for a confirmation first


def console_model(key: ApiKey) -> str | None:
    """The model a key is the console's own key for (``console: <model>``, made by the platform), else None."""
    prefix = f"{CONSOLE_KEY}: "
    return key.name.removeprefix(prefix) if key.created_by == "system" and key.name.startswith(prefix) else None


def what_breaks(key: ApiKey) -> str | None:
    """What stops working when ``key`` is revoked, when it is in use (the console's own key, or a key used within
    :data:`RECENT_USE`); None for a key nothing seems to use."""
    label = f"{api_keys.shown(key.key_id)} ({key.name})"
    model = console_model(key)
    if model is not None:
        return (f"{label} is the console's own key for the model {model}: the Models & Serving playground and the "
                f"Tasks page's \"ask the model\" send it to the gateway. Revoked, every request sent with it is refused "
                f"from then on; the console makes itself a new key for {model} at its next question (it then appears "
                "here), so revoke it only to replace it.")  # fmt: skip
    if key.last_used_at is not None and utcnow() - key.last_used_at < RECENT_USE:
        return (f"{label} was last used at {utc_text(key.last_used_at)}: whoever sends it ({key.name}) is refused (401) "
                "from their next request on, until they are given a new key.")  # fmt: skip
    return None


def revoke_chosen() -> None:
    """The Revoke button's callback: revoke the chosen key, say how it went, and choose nothing again."""
    chosen = st.session_state.get("revoke_key_id")
    if not chosen:
        return
    try:
        row = api_keys.revoke_key(me(), chosen)
    except (api_keys.ApiKeyError, PermissionError) as exc:
        st.session_state["revoke_outcome"] = ("error", str(exc))
    else:
        st.session_state["revoke_outcome"] = (
            "success",
            f"Revoked {api_keys.shown(row.key_id)} ({row.name}); requests with it are refused from now on.",
        )
    st.session_state["revoke_key_id"] = None
    st.session_state["revoke_confirm"] = False


st.title("Users & audit")
if not guard_platform():
    st.stop()
if not can(Role.admin):
    st.error("Only admins can manage users and API keys and read the audit log.")
    st.stop()

users = auth.list_users()
users_table = st.empty()  # filled below the forms, so it shows what they changed in this run

left, right = st.columns(2)
with left, st.form("add_user", clear_on_submit=True):
    st.markdown("**Add a user**")
    new_name = st.text_input("Username", key="new_user_name")
    new_password = st.text_input("Initial password", type="password", key="new_user_password")
    new_role = st.selectbox("Role", [r.value for r in Role], key="new_user_role")
    if st.form_submit_button("Add user"):
        try:
            auth.create_user(me(), new_name, new_password, Role(new_role))
            st.success(f"Added {new_name}.")
        except (auth.AuthError, PermissionError) as exc:
            st.error(str(exc))
with right, st.form("change_role"):
    st.markdown("**Change a role**")
    who = st.selectbox("User", [u.username for u in users], key="role_user")
    role = st.selectbox("New role", [r.value for r in Role], key="role_value")
    if st.form_submit_button("Change role"):
        try:
            auth.set_role(me(), who, Role(role))
            st.success(f"{who} is now {role}.")
        except (auth.AuthError, PermissionError) as exc:
            st.error(str(exc))

with st.form("account"):
    st.markdown("**Disable or enable a user**")
    st.caption(
        "A disabled user's console session, actions and API keys are refused from their next request on; "
        "enabled again, they log in again and their keys work again."
    )
    state = {u.username: "disabled" if u.disabled else "enabled" for u in users}
    account = st.selectbox("User", list(state), format_func=lambda n: f"{n} ({state[n]})", key="account_user")
    for column, (label, change) in zip(st.columns(2), (("Disable", disable_user), ("Enable", enable_user))):
        if column.form_submit_button(label) and account:
            try:
                done = change(me(), account)
            except (auth.AuthError, PermissionError) as exc:
                st.error(str(exc))
            else:
                keys = f" (with the {done.keys} API key(s) they created)" if done.keys else ""
                st.success(f"{account} is {'disabled' if done.disabled else 'enabled'}{keys}.")
users = auth.list_users()
with users_table.container():
    plain_table([{"user": u.username, "role": u.role.value, "disabled": u.disabled, "failed logins": u.failed_logins,
                  "last login": u.last_login_at, "created": u.created_at} for u in users])  # fmt: skip

st.subheader("API keys")
st.caption(
    "Keys of the OpenAI-compatible API: clients send one as `Authorization: Bearer pt-...` (the OpenAI "
    "client's `api_key`). A key is shown once, when created; only a hash of it is kept."
)
left, right = st.columns(2)
with left, st.form("create_key", clear_on_submit=True):
    st.markdown("**Create a key**")
    key_name = st.text_input("Name (who or what uses it)", key="key_name")
    key_models = st.multiselect(
        "Models it may use (none: every model)", [m.name for m in list_models()], key="key_models"
    )
    if st.form_submit_button("Create key"):
        try:
            made = api_keys.create_key(me(), key_name, key_models)
        except (api_keys.ApiKeyError, PermissionError) as exc:
            st.error(str(exc))
        else:  # shown in this run only: the next rerun no longer has it
            st.success(
                f"Created {api_keys.shown(made.key.key_id)} ({made.key.name}). Copy it now; it is not shown again."
            )
            st.code(
                made.secret, language="text", wrap_lines=True
            )  # whole inside the half-width card, never cut at its edge
keys = api_keys.list_keys(me())
active = {k.key_id: k for k in keys if k.revoked_at is None}
with right, st.container(border=True):
    st.markdown("**Revoke a key**")
    # nothing is chosen until the admin chooses: a preselected key (often the console's own) is one click from revoked
    doomed = st.selectbox("Key", list(active), index=None, key="revoke_key_id", placeholder="Choose the key to revoke",
                          format_func=lambda key_id: f"{api_keys.shown(key_id)} · {active[key_id].name}"
                          if key_id in active else api_keys.shown(key_id))  # fmt: skip
    breaks = what_breaks(active[doomed]) if doomed in active else None
    confirmed = True
    if breaks:
        st.warning(breaks)
        confirmed = st.checkbox("Revoke it anyway", key="revoke_confirm")
    st.button("Revoke", key="revoke_key_go", on_click=revoke_chosen, disabled=doomed not in active or not confirmed,
              help="Choose a key first" if doomed not in active else None if confirmed else "Confirm above first")  # fmt: skip
    outcome = st.session_state.pop("revoke_outcome", None)
    if outcome:
        (st.success if outcome[0] == "success" else st.error)(outcome[1])
if keys:
    disabled = {u.username for u in users if u.disabled}
    plain_table([{"key": api_keys.shown(k.key_id), "name": k.name, "models": ", ".join(k.models) or "all",
                  "created": k.created_at, "by": k.created_by, "last used": k.last_used_at, "revoked": k.revoked_at,
                  "refused": "creator disabled" if k.created_by in disabled else None} for k in keys],
                long={"name": "medium", "models": "medium"})  # fmt: skip
else:
    st.caption(
        "No API keys yet: the gateway serves everyone on loopback, and refuses to listen beyond it, until one exists."
    )

st.subheader("Audit log")
page = st.number_input("Page", min_value=1, value=1, key="audit_page")
entries = auth.audit_log(limit=100, offset=100 * (int(page) - 1))
plain_table([{"time": e.ts, "user": e.username, "action": e.action, "target": e.target or None,
              "details": details_text(e.details)} for e in entries],
            columns=["time", "user", "action", "target", "details"], long={"details": "large"})  # fmt: skip
