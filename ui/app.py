"""The posttrain console: ``posttrain console`` serves this with Streamlit.

Multipage through ``st.navigation``; every page reads and writes through
``posttrain.platform`` only, and long work always runs as a job.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

VIEWS = Path(__file__).resolve().parent / "views"

st.set_page_config(page_title="posttrain", page_icon=":material/model_training:", layout="wide")

pages = [
    st.Page(VIEWS / "jobs.py", title="Jobs", icon=":material/work_history:", url_path="jobs", default=True),
    st.Page(VIEWS / "tasks.py", title="Tasks", icon=":material/task_alt:", url_path="tasks"),
    st.Page(VIEWS / "sandboxes.py", title="Sandboxes", icon=":material/shield:", url_path="sandboxes"),
]
st.navigation(pages).run()
