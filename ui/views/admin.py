"""Users & audit (admins only): users and roles, and the audit log."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from posttrain.platform import auth
from posttrain.platform.db.models import Role
from posttrain.ui.common import can, guard_platform, username

st.title("Users & audit")
if not guard_platform():
    st.stop()
if not can(Role.admin):
    st.error("Only admins can manage users and read the audit log.")
    st.stop()

users = auth.list_users()
st.dataframe(
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

left, right = st.columns(2)
with left, st.form("add_user", clear_on_submit=True):
    st.markdown("**Add a user**")
    new_name = st.text_input("Username", key="new_user_name")
    new_password = st.text_input("Initial password", type="password", key="new_user_password")
    new_role = st.selectbox("Role", [r.value for r in Role], key="new_user_role")
    if st.form_submit_button("Add user"):
        if not can(Role.admin):
            st.error("Only admins can add users.")
        else:
            try:
                auth.create_user(new_name, new_password, Role(new_role), by=username())
                st.success(f"Added {new_name}.")
            except auth.AuthError as exc:
                st.error(str(exc))
with right, st.form("change_role"):
    st.markdown("**Change a role**")
    who = st.selectbox("User", [u.username for u in users], key="role_user")
    role = st.selectbox("New role", [r.value for r in Role], key="role_value")
    if st.form_submit_button("Change role"):
        if not can(Role.admin):
            st.error("Only admins can change roles.")
        else:
            try:
                auth.set_role(who, Role(role), by=username())
                st.success(f"{who} is now {role}.")
            except auth.AuthError as exc:
                st.error(str(exc))

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
