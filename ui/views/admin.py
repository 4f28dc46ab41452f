"""Users & audit (admins only): users, their roles and whether they are enabled, API keys, and the audit log."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from posttrain.platform import api_keys, auth
from posttrain.platform.db.models import Role
from posttrain.platform.models.registry import list_models
from posttrain.platform.users import disable_user, enable_user
from posttrain.ui.common import can, guard_platform, me

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
    st.caption("A disabled user's console session, actions and API keys are refused from their next request on; "
               "enabled again, they log in again and their keys work again.")
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
users_table.dataframe(
    pd.DataFrame(
        [
            {"user": u.username, "role": u.role.value, "disabled": u.disabled, "failed logins": u.failed_logins,
             "last login": u.last_login_at, "created": u.created_at}
            for u in users
        ]  # fmt: skip
    ),
    hide_index=True,
    width="stretch",
)

st.subheader("API keys")
st.caption("Keys of the OpenAI-compatible API: clients send one as `Authorization: Bearer pt-...` (the OpenAI "
           "client's `api_key`). A key is shown once, when created; only a hash of it is kept.")
left, right = st.columns(2)
with left, st.form("create_key", clear_on_submit=True):
    st.markdown("**Create a key**")
    key_name = st.text_input("Name (who or what uses it)", key="key_name")
    key_models = st.multiselect("Models it may use (none: every model)", [m.name for m in list_models()], key="key_models")
    if st.form_submit_button("Create key"):
        try:
            made = api_keys.create_key(me(), key_name, key_models)
        except (api_keys.ApiKeyError, PermissionError) as exc:
            st.error(str(exc))
        else:  # shown in this run only: the next rerun no longer has it
            st.success(f"Created {api_keys.shown(made.key.key_id)} ({made.key.name}). Copy it now; it is not shown again.")
            st.code(made.secret, language="text")
keys = api_keys.list_keys(me())
active = [k for k in keys if k.revoked_at is None]
with right, st.form("revoke_key"):
    st.markdown("**Revoke a key**")
    labels = {k.key_id: f"{api_keys.shown(k.key_id)} · {k.name}" for k in active}
    doomed = st.selectbox("Key", list(labels), format_func=labels.get, key="revoke_key_id")
    if st.form_submit_button("Revoke", disabled=not active) and doomed:
        try:
            row = api_keys.revoke_key(me(), doomed)
        except (api_keys.ApiKeyError, PermissionError) as exc:
            st.error(str(exc))
        else:
            st.success(f"Revoked {api_keys.shown(row.key_id)} ({row.name}); requests with it are refused from now on.")
            keys = api_keys.list_keys(me())
if keys:
    disabled = {u.username for u in users if u.disabled}
    st.dataframe(
        pd.DataFrame(
            [
                {"key": api_keys.shown(k.key_id), "name": k.name, "models": ", ".join(k.models) or "all",
                 "created": k.created_at, "by": k.created_by, "last used": k.last_used_at, "revoked": k.revoked_at,
                 "refused": "creator disabled" if k.created_by in disabled else ""}
                for k in keys
            ]  # fmt: skip
        ),
        hide_index=True,
        width="stretch",
    )
else:
    st.caption("No API keys yet: the gateway serves everyone on loopback, and refuses to listen beyond it, until one exists.")

st.subheader("Audit log")
page = st.number_input("Page", min_value=1, value=1, key="audit_page")
entries = auth.audit_log(limit=100, offset=100 * (int(page) - 1))
st.dataframe(
    pd.DataFrame(
        [{"time": e.ts, "user": e.username, "action": e.action, "target": e.target, "details": str(e.details or "")} for e in entries]
    ),
    hide_index=True,
    width="stretch",
)
