"""The console end to end in a real browser: Debian's Chromium, headless, driven by Playwright,
against the processes ``make run`` starts (``posttrain up``: worker, gateway, console).

The flow, from an empty data directory holding only the built-in model (``make run`` imports it): create
the first admin in the browser, run a job live, deploy a model whose general check regressed only after confirming
the drop, upload a real PDF and see its page with boxes, build tasks
from it, estimate the one-click demo on the real model, run it watching its charts live, see the held-out
gain and the estimate against the actual wall time, open an episode, compare the result with its base,
export it and download the archive, deploy it and chat with it in the playground; then a model that calls
tools, whose call runs in a sandbox and comes back to it, shown turn by turn in the playground.

Each step saves a screenshot under ``test-artifacts/e2e/`` and fails when the step's content is
missing, not only when a page errors.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from conftest import REPO_ROOT, ImportedRealModel
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from playwright.sync_api import expect
from required_parts import require
from test_models_page import tiny_model, tool_caller  # noqa: F401 - the tiny model taught to call the python tool

from posttrain.platform.db.models import JobStatus
from posttrain.platform.engines.launcher import free_port

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = REPO_ROOT / "test-artifacts" / "e2e"
PASSWORD = "e2e-admin-password"
LTNEWS = sorted(Path("/usr/share/doc/texlive-doc/latex/base").glob("ltnews[0-9]*.pdf"))  # single issues, 1-4 pages


def wait_for_console(base: str, proc: subprocess.Popen, log: Path, timeout_s: float = 120) -> None:  # type: ignore[type-arg]
    """Until the Streamlit server at ``base`` answers its health check; fails with the log's tail
    when ``proc`` exits or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{base}/_stcore/health", timeout=2).text == "ok":
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"the console at {base} did not come up: {log.read_text()[-3000:]}")
        time.sleep(0.5)


@contextlib.contextmanager
def serving_console(env: dict[str, str], data: Path, port: int, host: str = "127.0.0.1") -> Iterator[str]:
    """``posttrain console`` on ``port`` with ``env``, its log in ``data/console.log``; yields its base URL once it
    answers, and stops it at the end."""
    cli = [sys.executable, "-m", "posttrain.platform.cli"]
    with open(data / "console.log", "w") as log:
        proc = subprocess.Popen([*cli, "console", "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT)
        base = f"http://{host}:{port}"
        try:
            wait_for_console(base, proc, data / "console.log")
            yield base
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def launch_chromium(p):  # type: ignore[no-untyped-def]
    """Debian's Chromium, headless, as this machine allows it (Playwright's own download does not work here)."""
    return p.chromium.launch(
        executable_path=CHROMIUM,
        args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
              "--disable-component-update"],
    )  # fmt: skip


@pytest.fixture(scope="module")
def console(real_model_dir: ImportedRealModel, request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """``posttrain up`` on a fresh data directory with the built-in model imported (the session's converted copy,
    under the name ``make run`` gives it), no users yet: the first test creates the admin in the browser. The data
    directory (the demo's checkpoints, exports: gigabytes) goes at the end unless a test failed."""
    require("chromium")
    data = Path(tempfile.mkdtemp(prefix="posttrain-e2e-"))
    data.chmod(0o755)
    port, gateway = free_port(), free_port()
    env = {
        **os.environ,
        "POSTTRAIN_DATA_DIR": str(data),
        "POSTTRAIN_DATABASE_URL": f"sqlite:///{data / 'posttrain.db'}",
        "POSTTRAIN_CONSOLE_PORT": str(port),
        "POSTTRAIN_GATEWAY_PORT": str(gateway),
        "POSTTRAIN_WORKER_POLL_INTERVAL_S": "0.2",
    }
    cli = [sys.executable, "-m", "posttrain.platform.cli"]
    subprocess.run([*cli, "db", "upgrade"], env=env, check=True, capture_output=True)
    subprocess.run(
        [*cli, "models", "import", str(real_model_dir.path), "--name", real_model_dir.name],
        env=env,
        check=True,
        capture_output=True,
    )
    log = open(data / "up.log", "w")
    proc = subprocess.Popen([*cli, "up"], env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    wait_for_console(base, proc, data / "up.log")
    try:
        yield {"base": base, "data": str(data), "gateway": f"http://127.0.0.1:{gateway}", "env": env}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        if request.session.testsfailed:
            print(f"\nthe console's data directory, kept for a failed test: {data}")
        else:
            shutil.rmtree(data, ignore_errors=True)


OUTSIDE: list[str] = []  # every request the console's pages made to a host other than this machine (the last test)
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}


def record_outside(request) -> None:  # type: ignore[no-untyped-def]
    """``page.on("request")``: keep the URL of a request whose host is not this machine (data: and blob: URLs
    have none and stay in the page)."""
    url = urlsplit(request.url)
    if url.scheme in ("http", "https", "ws", "wss") and url.hostname not in LOCAL_HOSTS:
        OUTSIDE.append(request.url)


@pytest.fixture(scope="module")
def browser_page(console: dict[str, str]):  # type: ignore[no-untyped-def]
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = launch_chromium(p)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(60_000)
        page.on("request", record_outside)
        yield page
        browser.close()


def shot(page, name: str) -> None:  # type: ignore[no-untyped-def]
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def goto(page, console: dict[str, str], title: str) -> None:  # type: ignore[no-untyped-def]
    page.get_by_role("link", name=title).first.click()
    page.get_by_role("heading", name=title).first.wait_for()


def test_first_run_creates_the_admin_in_the_browser_then_login_refuses_a_wrong_password(browser_page, console) -> None:  # type: ignore[no-untyped-def]
    page = browser_page
    page.goto(console["base"])
    page.get_by_text("Welcome: create the first admin").wait_for()  # no users yet, a browser on this machine
    assert page.get_by_role("link", name="Jobs").count() == 0  # nothing before an admin exists
    shot(page, "00-first-run-setup")
    page.get_by_label("Admin username").fill("admin")
    page.get_by_role("textbox", name="Password", exact=True).fill(PASSWORD)
    page.get_by_role("textbox", name="Password again", exact=True).fill(PASSWORD)
    page.get_by_role("button", name="Create admin and log in").click()
    page.get_by_role("heading", name="Overview").wait_for()
    page.get_by_text("Signed in as").first.wait_for()
    page.get_by_role("button", name="Log out").click()
    page.get_by_label("Username", exact=True).wait_for()
    page.get_by_text("Welcome: create the first admin").wait_for(state="detached")  # once: the form is gone for good
    page.get_by_label("Username", exact=True).fill("admin")
    page.get_by_role("textbox", name="Password", exact=True).fill("not the password")
    page.get_by_role("button", name="Log in").click()
    page.get_by_text("wrong username or password").wait_for()
    shot(page, "01-login-refused")
    page.get_by_role("textbox", name="Password", exact=True).fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.get_by_role("heading", name="Overview").wait_for()
    page.get_by_text("Jobs running").first.wait_for()
    shot(page, "02-overview")


def test_jobs_page_runs_a_job_live(browser_page, console) -> None:  # type: ignore[no-untyped-def]
    page = browser_page
    goto(page, console, "Jobs")
    page.get_by_role("button", name="Submit").click()
    page.get_by_text("Queued job 1.").wait_for()
    # The live panel shows it succeed without a reload (10 steps of 0.5 s).
    succeeded = page.locator('[data-testid="stMetric"]', has_text="succeeded")
    succeeded.get_by_text("1", exact=True).wait_for(timeout=90_000)
    shot(page, "03-jobs")


def test_deploying_a_regressed_model_asks_to_confirm_the_drop(browser_page, console, tiny_model) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """The gate before deploy: a trained model whose general check fell beyond 2 paired SEs (registered here with the
    figure its run would have stored) is deployed from the Deploy tab only after a confirmation that names the drop;
    the platform records the override under the console user's name."""
    from posttrain.platform.auth import Identity
    from posttrain.platform.db.models import Role
    from posttrain.platform.models.general_check import GeneralCheck
    from posttrain.platform.models.registry import record_general_check, register_model

    url = console["env"]["POSTTRAIN_DATABASE_URL"]
    registrar = Identity("e2e-registrar", Role.operator)
    register_model(registrar, "regressed-start", tiny_model, url=url)
    register_model(registrar, "regressed", tiny_model, base="regressed-start", url=url)
    fell = {"a": 0.5, "b": 0.336, "delta": -0.164, "se": 0.031, "tasks": 128, "clusters": None}
    record_general_check("regressed", GeneralCheck.from_difference("regressed-start", fell, job_id=1), url=url)
    drop = "16.4 ± 3.1 points below regressed-start (paired SE, 128 tasks)"

    def deploys() -> list[tuple[int, str]]:
        with sqlite3.connect(Path(console["data"]) / "posttrain.db", timeout=30) as db:
            return db.execute("select id, config from job where kind = 'deploy'").fetchall()

    page = browser_page
    goto(page, console, "Models & Serving")
    page.get_by_text(f"general check fell {drop}").first.wait_for()  # stated with the figure above the tabs
    page.get_by_role("tab", name="Deploy").click()
    form = page.get_by_role("tabpanel", name="Deploy")
    form.get_by_test_id("stSelectbox").nth(0).click()  # Model
    page.get_by_role("option", name="regressed", exact=True).click()
    form.get_by_role("button", name="Deploy", exact=True).click()
    asking = page.get_by_test_id("stAlert").filter(has_text="Deploy it anyway?")
    asking.wait_for()
    assert drop in asking.inner_text(), asking.inner_text()
    assert deploys() == []  # asked first: nothing submitted
    shot(page, "03b-deploy-asks-to-confirm-the-drop")
    page.get_by_role("button", name="Deploy regressed despite the drop").click()
    queued = page.get_by_text(re.compile(r"Queued deploy job \d+ of regressed"))
    queued.wait_for()
    ((job_id, config),) = deploys()
    assert json.loads(config)["allow_regression"] is True
    with sqlite3.connect(Path(console["data"]) / "posttrain.db", timeout=30) as db:
        audited = db.execute(
            "select username, target, details from audit_log where action = 'deploy.allow_regression'"
        ).fetchall()
    assert [(who, target, json.loads(details)["job"]) for who, target, details in audited] == [
        ("admin", "regressed", job_id)
    ]
    cli = [sys.executable, "-m", "posttrain.platform.cli"]  # the flow goes on without it serving
    subprocess.run([*cli, "jobs", "cancel", str(job_id)], env=console["env"], check=True, capture_output=True)
    wait_for_job(console, job_id, timeout_s=120)


DEMO: dict[str, int] = {}  # the demo run's job id, for the steps after it


def pick_run(page, job_id: int) -> None:  # type: ignore[no-untyped-def]
    """Open run ``job_id`` on the Training page (its "Run" selectbox, below the runs table)."""
    runs = page.get_by_test_id("stSelectbox").filter(has=page.get_by_text("Run", exact=True))
    runs.first.wait_for()
    option = page.get_by_role("option", name=re.compile(rf"^#{job_id} · train_preset\b")).first
    for attempt in range(6):  # the page's live panels rerun every few seconds; one may close the list just opened
        runs.first.click()
        try:
            option.wait_for(timeout=10_000)
            option.click(timeout=10_000)
            break
        except PlaywrightTimeoutError:
            if attempt == 5:
                raise
            page.keyboard.press("Escape")
    page.get_by_role("heading", name="Trajectories").first.wait_for()  # the run's view, to its end


def job_status(console: dict[str, str], job_id: int) -> JobStatus:
    """Job ``job_id``'s status as the console's database has it now."""
    with sqlite3.connect(Path(console["data"]) / "posttrain.db", timeout=30) as db:
        (status,) = db.execute("select status from job where id = ?", (job_id,)).fetchone()
    return JobStatus(status)


def wait_for_job(console: dict[str, str], job_id: int, timeout_s: float) -> None:
    """Until job ``job_id`` has ended, read from the console's database (the browser stays idle meanwhile)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if job_status(console, job_id).finished:
            return
        time.sleep(5)
    raise AssertionError(f"job {job_id} did not end within {timeout_s:.0f} s")


def run_box(page):  # type: ignore[no-untyped-def]
    """The Training page's "Run" select box (below the runs table)."""
    return page.get_by_test_id("stSelectbox").filter(has=page.get_by_text("Run", exact=True)).first


def wait_for_run_box_status(page, console: dict[str, str], job_id: int, timeout_s: float = 60) -> JobStatus:  # type: ignore[no-untyped-def]
    """Until the Run box, left open, has run ``job_id`` chosen and the run's header shows the status the database has
    for it at that moment (its live panel reruns every few seconds: a status computed once would keep the first draw's)."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = job_status(console, job_id)
        chosen = run_box(page).get_by_role("combobox").input_value()  # the chosen option is the combobox input's value
        header = page.get_by_text(re.compile(rf"^Run {job_id} · train_preset · "))
        shown = header.first.inner_text() if header.count() else ""
        if chosen.startswith(f"#{job_id} · train_preset") and shown.startswith(
            f"Run {job_id} · train_preset · {status.value} ·"
        ):
            return status
        if time.monotonic() > deadline:
            shot(page, "timeout-run-box-status")
            raise AssertionError(
                f"the Run box shows {chosen!r} and the run's header {shown!r} while the database says "
                f"job {job_id} is {status.value}"
            )
        time.sleep(1)


def reopen_until(page, console: dict[str, str], title: str, ready, timeout_s: float = 300.0) -> None:  # type: ignore[no-untyped-def]
    """Re-open a page until ``ready(page)`` holds (work finishes in the worker meanwhile)."""
    deadline = time.monotonic() + timeout_s
    while not ready(page):
        if time.monotonic() > deadline:
            shot(page, f"timeout-{title.lower().replace(' ', '-')}")
            raise AssertionError(f"{title}: the expected content did not appear within {timeout_s:.0f} s")
        time.sleep(3)
        goto(page, console, title)


def test_upload_a_pdf_and_see_its_page_with_boxes(browser_page, console) -> None:  # type: ignore[no-untyped-def]
    page = browser_page
    goto(page, console, "Documents")
    page.locator('input[type="file"]').set_input_files(str(LTNEWS[0]))
    page.get_by_role("button", name="Upload and preprocess").click()
    page.get_by_text("preprocess job").first.wait_for()
    shot(page, "04-uploaded")
    # no reload: the page viewer follows the preprocess job and draws the page once the document is ready
    page.get_by_test_id("stImage").first.wait_for(timeout=240_000)
    page.get_by_text("Markdown").first.wait_for()
    image = page.get_by_test_id("stImage").first
    assert image.locator("img").first.get_attribute("src")
    image.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "05-page-with-boxes.png"))


def test_sandboxes_page_runs_a_snippet_and_draws_latency_bins_in_numeric_order(browser_page, console) -> None:  # type: ignore[no-untyped-def]
    page = browser_page
    goto(page, console, "Sandboxes")
    page.get_by_role("button", name="Run in a sandbox").click()
    page.get_by_text("ok in").first.wait_for(timeout=120_000)
    page.get_by_text("Call latency (recent calls, all pools)").wait_for(timeout=60_000)
    page.locator('[data-testid="stVegaLiteChart"] g.role-axis-label text').first.wait_for()
    labels = page.locator('[data-testid="stVegaLiteChart"] g.role-axis-label text').all_text_contents()
    bins = [float(x) for x in labels[:20]]  # the x axis' bin starts, left to right (the y axis' labels follow)
    assert len(bins) == 20 and bins == sorted(bins), labels
    shot(page, "05b-sandboxes")


def test_build_tasks_from_the_document(browser_page, console) -> None:  # type: ignore[no-untyped-def]
    page = browser_page
    goto(page, console, "Tasks")
    button = page.get_by_role("button", name="Build from documents")
    reopen_until(page, console, "Tasks", lambda p: button.is_enabled())  # once preprocessing has finished
    button.click()
    shot(page, "06-build-clicked")
    page.get_by_text("Queued build job").wait_for()
    reopen_until(page, console, "Tasks", lambda p: p.get_by_role("heading", name="Open a task").count() > 0)
    page.get_by_text("Reference answer").first.wait_for()
    shot(page, "06-tasks")


def percent_off(text: str) -> tuple[float, float, int]:
    """(estimated s, actual s, % off) from "Estimate against actual: estimated 6.2 min (job 7), took 6.9 min: 11% longer
    than estimated." ("as estimated": 0)"""
    found = re.search(
        r"estimated ([\d.]+) (s|min|h) \(job \d+\), took ([\d.]+) (s|min|h): (?:(\d+)% (?:longer|shorter) "
        r"than estimated|as estimated)",
        text,
    )
    assert found, f"no estimate against actual in: {text}"
    scale = {"s": 1, "min": 60, "h": 3600}
    return (
        float(found.group(1)) * scale[found.group(2)],
        float(found.group(3)) * scale[found.group(4)],
        int(found.group(5) or 0),
    )


@pytest.mark.timeout(
    3000
)  # an estimate, then the real model's demo: on a loaded 2-core machine, several times its quiet 9 min
def test_one_click_demo_on_the_real_model_with_its_estimate_before_and_against_actual(browser_page, console) -> None:  # type: ignore[no-untyped-def]
    page = browser_page
    goto(page, console, "Training")
    # the demo's preset post-trains the built-in model (imported as make run imports it); estimate it first
    page.get_by_role("button", name="Estimate wall time").first.click()
    page.get_by_text(re.compile(r"Estimating \(job \d+\)")).first.wait_for()  # the calibration's progress, live
    # the demo cannot start beside its estimate: both would run at once, and the estimate would time a shared machine
    demo = page.get_by_role("button", name="Run the demo")
    expect(demo).to_be_disabled(timeout=30_000)
    page.get_by_text(
        re.compile(r"Run the demo waits: its estimate \(job \d+\) is (queued|calibrating)")
    ).first.wait_for()
    estimate = page.get_by_text(re.compile(r"about [\d.]+ (s|min|h) on this host: 8 training steps, 256 trajectories"))
    estimate.first.wait_for(timeout=1_200_000)
    expect(demo).to_be_enabled(timeout=60_000)  # the estimate ended: the demo can start
    page.get_by_text("How it was estimated").first.click()
    how = page.get_by_test_id("stExpander").filter(has_text="How it was estimated")
    how.get_by_test_id("stDataFrame").first.wait_for()  # the stages and how each was measured
    shot(page, "07-estimate-before-launch")
    demo.click()
    launched = page.get_by_text(re.compile(r"Launched the whole 'smollm2-quick' recipe as job \d+"))
    launched.wait_for()
    expect(demo).to_be_disabled()  # the page the click drew holds the run: no second demo beside it
    job_id = DEMO["job"] = int(re.findall(r"\d+", launched.inner_text())[-1])
    # the run view follows it live (no reload). The Run box shows the job's status as the database has it: the page
    # drew "queued" at launch, the worker has claimed it since
    deadline = time.monotonic() + 300
    while job_status(console, job_id) is JobStatus.queued and time.monotonic() < deadline:
        time.sleep(1)
    assert wait_for_run_box_status(page, console, job_id) is JobStatus.running
    # the held-out figure before GRPO, under a header that names the model evaluated (the built-in one: this preset
    # has no SFT stage), and the general check beside it
    page.get_by_text(re.compile(r"^Evaluation of smollm2-135m-instruct \(before GRPO\)$")).first.wait_for(
        timeout=1_200_000
    )
    page.get_by_text("Held-out pass@1 of smollm2-135m-instruct before GRPO:").first.wait_for()
    page.get_by_text(
        re.compile(
            r"^General check on \d+ tasks of \d+ domains it never trained on: smollm2-135m-instruct "
            r"[\d.]+% before GRPO\.$"
        )
    ).first.wait_for()
    # then the reward chart, and each step's trajectories as the step stores them, before the run ends
    page.get_by_text("Reward", exact=True).first.wait_for(timeout=1_200_000)
    page.get_by_test_id("stVegaLiteChart").first.wait_for()
    page.get_by_text(re.compile(r"^Page \(of \d+, \d+ trajectories\)$")).first.wait_for(timeout=300_000)
    page.get_by_text(re.compile(r"Steps \d+ to \d+ so far")).first.wait_for()  # drawn only while the run is live
    assert job_status(console, job_id) is JobStatus.running, "the trajectories should show while the run runs"
    assert wait_for_run_box_status(page, console, job_id) is JobStatus.running
    page.get_by_text("Reward", exact=True).first.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "08-demo-training.png"))
    # the rest of the run unwatched (a page of no live parts): the live view and Chromium drawing it took a third of
    # a core from the run on the suite's two; then back to the finished run
    goto(page, console, "Tasks")
    wait_for_job(console, job_id, timeout_s=2400)
    goto(page, console, "Training")
    pick_run(page, job_id)
    gain = page.get_by_text("Held-out pass@1 on")
    gain.first.wait_for(timeout=1_500_000)
    text = gain.first.inner_text()
    assert "64 eval tasks, 100% unseen in training: smollm2-135m-instruct" in text, text
    found = re.search(
        r"→ smollm2-quick-job\d+ [\d.]+% \(([+-][\d.]+) ± ([\d.]+) points, ± one paired standard error\)", text
    )
    assert found, f"no gain with its paired standard error in the result line: {text}"
    # the suite's proof that GRPO makes the real model better (seed fixed, the update switched off fails it):
    # measured here 29.7% -> 53.1% (+23.4 ± 6.2 points, paired) on the 64 held-out additions
    assert float(found.group(1)) >= 5, f"the demo did not raise held-out pass@1 by 5 points: {text}"
    assert float(found.group(1)) > 2 * float(found.group(2)), f"the demo's gain is within twice its paired SE: {text}"
    against = page.get_by_text("Estimate against actual:")
    against.first.wait_for(timeout=60_000)
    estimated, actual, off = percent_off(against.first.inner_text())
    print(f"demo on the real model: estimated {estimated:.0f} s, took {actual:.0f} s ({off}% off); {text}")
    # alone on the machine the estimate fell 19% short of the run (twice); beside the other xdist worker the load differs between the
    # calibration and the run, so the suite holds it to the bound that survives that, and prints the figure
    assert 0.5 <= estimated / actual <= 2.0, f"the estimate is {off}% off the actual wall time"
    # the finished run: the Run box says so, the evaluation names both models, and the general check (domains the run
    # never trained on) stands beside the gain, with its standard error
    assert wait_for_run_box_status(page, console, job_id) is JobStatus.succeeded
    page.get_by_text(
        re.compile(
            r"^Evaluation of smollm2-135m-instruct \(before GRPO\), smollm2-quick-job\d+ "
            r"\(after GRPO\)$"
        )
    ).first.wait_for()
    general = page.get_by_text(
        re.compile(
            r"^General check on \d+ tasks of \d+ domains it never trained on: "
            r"smollm2-135m-instruct [\d.]+% → smollm2-quick-job\d+ [\d.]+% "
            r"\([+-][\d.]+ ± [\d.]+ points"
        )
    )
    general.first.wait_for()
    print(f"demo's general check: {general.first.inner_text()}")
    gain.first.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "09-demo-gain-and-estimate.png"))


def test_open_an_episode_of_the_demo(browser_page, console) -> None:  # type: ignore[no-untyped-def]
    page = browser_page
    page.get_by_role("heading", name="Trajectories").scroll_into_view_if_needed()
    page.get_by_text(re.compile(r"Page \(of \d+, 256 trajectories\)")).first.wait_for()  # 8 steps x 4 prompts x 8
    page.get_by_text(re.compile(r"Reward [\d.]+ · passed (yes|no) · score")).first.wait_for()  # the picked one
    page.get_by_text("Completion", exact=True).first.wait_for()
    page.get_by_text(re.compile(r"^Verdict$")).first.wait_for()
    page.get_by_text("Prompt", exact=True).first.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "10-episode.png"))


def test_compare_the_result_with_its_base(browser_page, console) -> None:  # type: ignore[no-untyped-def]
    page = browser_page
    link = page.get_by_role(
        "link", name=re.compile(r"Compare smollm2-quick-job\d+ with its base smollm2-135m-instruct")
    )
    link.scroll_into_view_if_needed()
    link.click()
    page.get_by_role("heading", name="Models & Serving").first.wait_for()
    page.get_by_text(
        "held-out evaluation of the run's preset 'smollm2-quick'"
    ).wait_for()  # the form, prefilled for another
    # the run compared them on its held-out tasks already, task by task: the Compare tab opens that comparison
    with sqlite3.connect(Path(console["data"]) / "posttrain.db", timeout=30) as db:
        (differ,) = db.execute(
            "select json_extract(result, '$.arena.disagreements_total') from job where id = ?", (DEMO["job"],)
        ).fetchone()
    assert differ > 0  # a gain of many points: tasks the result gets right and its base not
    disagree = page.get_by_text(f"{differ} tasks where they disagree")
    disagree.wait_for()
    assert page.get_by_test_id("stSelectbox").filter(has_text="Comparisons").count() > 0  # listed with the others
    disagree.scroll_into_view_if_needed()
    shot(page, "11-compare-with-base")


@pytest.mark.timeout(900)
def test_export_the_model_and_take_it_away(browser_page, console) -> None:  # type: ignore[no-untyped-def]
    page = browser_page
    goto(page, console, "Models & Serving")
    page.get_by_role("tab", name="Export").click()
    form = page.get_by_role("tabpanel", name="Export")
    form.get_by_test_id("stSelectbox").nth(0).click()  # Model
    page.get_by_role("option", name=re.compile(r"^smollm2-quick-job\d+$")).first.click()
    form.get_by_test_id("stSelectbox").nth(1).click()  # Format
    page.get_by_role("option", name="hf", exact=True).click()
    page.get_by_role("button", name="Export", exact=True).click()
    page.get_by_text(re.compile(r"Queued export_model job \d+")).wait_for()

    def exported(p) -> bool:  # type: ignore[no-untyped-def]
        p.get_by_role("tab", name="Export").first.click()  # a rerun the finished job started may still be drawing
        return p.get_by_text("Take it away").count() > 0

    reopen_until(page, console, "Models & Serving", exported, timeout_s=600)
    page.get_by_text("Serve it with vLLM").first.wait_for()
    download = page.get_by_role("link", name=re.compile(r"Download .* as a \.tar archive"))
    download.wait_for()
    href = download.get_attribute("href")
    assert href and href.startswith(console["gateway"] + "/v1/exports/"), href  # the gateway streams it, signed
    shot(page, "12-export")
    names, total = [], 0
    with httpx.stream("GET", href, timeout=120) as response:  # what the browser downloads from the link
        assert response.status_code == 200, response.read()
        announced = int(response.headers["content-length"])
        with tarfile.open(fileobj=io.BufferedReader(_Reader(response.iter_bytes()), 2**20), mode="r|") as tar:
            for member in tar:
                names.append(member.name)
                total += member.size
    assert any(n.endswith(".safetensors") for n in names) and any(n.endswith("/config.json") for n in names), names
    assert total > 100 * 2**20 and announced > total, "the archive should hold the model's weights"


class _Reader(io.RawIOBase):
    """A byte stream's pieces as the file object tarfile's stream mode reads (each byte copied once)."""

    def __init__(self, pieces) -> None:  # type: ignore[no-untyped-def]
        self.pieces, self.left = iter(pieces), memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        while not self.left:
            piece = next(self.pieces, None)
            if piece is None:
                return 0
            self.left = memoryview(piece)
        n = min(len(buffer), len(self.left))
        buffer[:n], self.left = self.left[:n], self.left[n:]
        return n


def test_deploy_the_result_and_chat_with_it(browser_page, console) -> None:  # type: ignore[no-untyped-def]
    page = browser_page
    goto(page, console, "Training")
    pick_run(page, DEMO["job"])
    page.get_by_role("button", name="Deploy").first.click()
    queued = page.get_by_text("Queued deployment job")
    # a demo whose general check fell beyond 2 paired SEs is deployed from the confirmation that names the drop
    despite = page.get_by_role("button", name=re.compile(r"^Deploy smollm2-quick-job\d+ despite the drop$"))
    queued.or_(despite).first.wait_for()
    if despite.count():
        assert "general check fell" in page.get_by_test_id("stAlert").filter(has_text="Deploy it anyway?").inner_text()
        despite.click()
        queued.wait_for()
    goto(page, console, "Models & Serving")
    reopen_until(
        page, console, "Models & Serving", lambda p: p.get_by_test_id("stChatInput").count() > 0, timeout_s=240
    )
    shot(page, "13-deployed")
    page.get_by_test_id("stChatInputTextArea").fill("Compute 23 + 45.\nPut your final answer within \\boxed{}.")
    page.get_by_test_id("stChatInputTextArea").press("Enter")
    answer = page.get_by_test_id("stChatMessage").nth(1)
    answer.wait_for(timeout=120_000)
    # written at the end of the script's run, counting the reply: the reply is in
    page.get_by_text("2 earlier messages are sent with each question").wait_for(timeout=120_000)
    caption = answer.get_by_test_id("stCaptionContainer").inner_text()
    reply = answer.inner_text().replace(caption, "").strip()
    assert caption.startswith("smollm2-quick-job"), f"not the demo's model: {answer.inner_text()!r}"
    # the demo trained a boxed answer: the real model replies in words and digits, not in riddles
    assert re.search(r"\d", reply), f"no number in the reply: {reply!r}"
    shot(page, "14-playground")


def pick_deployment(label: str):  # type: ignore[no-untyped-def]
    """For :func:`reopen_until`: choose the deployment whose label starts with ``label`` in the playground's
    Deployments box (the session keeps an earlier choice; the box takes one), once the page lists it."""

    def ready(p) -> bool:  # type: ignore[no-untyped-def]
        box = p.get_by_test_id("stMultiSelect").filter(has=p.get_by_text("Deployments", exact=True))
        if box.get_by_text(label).count():
            return True
        # each step re-renders the box (a rerun of the page, a deployment listed meanwhile): a click on a box being
        # replaced can be lost or find nothing to click, and then the page is opened again and the choice made anew
        try:
            clear = box.get_by_role("button", name="Clear all")
            if clear.count():
                clear.click(timeout=15_000)
            box.get_by_role("button", name="Open").click(timeout=15_000)
            option = p.get_by_role("option", name=re.compile("^" + re.escape(label)))
            if option.count() == 0:
                p.keyboard.press("Escape")
                return False
            option.first.click(timeout=15_000)
            p.keyboard.press("Escape")
            box.get_by_text(label).first.wait_for(timeout=15_000)
        except PlaywrightTimeoutError:
            return False
        return True

    return ready


def test_the_playground_runs_a_model_s_tool_call_in_a_sandbox(browser_page, console, tool_caller) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """A model that asks for ``print(6 * 7)`` with the python tool (the tiny model taught that one exchange): with
    "Offer sandbox tools" on, its call runs in the console's sandbox and the output goes back to it before it
    answers; the page shows the call, what the sandbox printed and the answer, turn by turn."""
    cli = [sys.executable, "-m", "posttrain.platform.cli"]
    subprocess.run(
        [*cli, "models", "register", "caller", str(tool_caller)], env=console["env"], check=True, capture_output=True
    )
    # a deployment is a job that serves until cancelled: the page shows it once its server answers
    subprocess.run(
        [*cli, "jobs", "submit", "deploy", "--config", '{"model": "caller", "tier": "standard"}'],
        env=console["env"],
        check=True,
        capture_output=True,
        text=True,
    )
    page = browser_page
    goto(page, console, "Models & Serving")
    reopen_until(page, console, "Models & Serving", pick_deployment("caller · standard"), timeout_s=240)
    page.get_by_role("button", name="New chat").click()  # the demo's chat stays in the session: start afresh
    page.get_by_text("Each question is sent with the conversation before it").wait_for()
    page.get_by_text("Offer sandbox tools").click()
    max_tokens = page.get_by_label("Max tokens", exact=True)  # not its help button, "Help for Max tokens"
    max_tokens.fill("128")
    max_tokens.press("Enter")
    page.get_by_test_id("stChatInputTextArea").fill("six times seven?")
    page.get_by_test_id("stChatInputTextArea").press("Enter")
    page.get_by_text("2 replies, 1 tool call, ended: answer").wait_for(timeout=120_000)
    page.get_by_text("python output").first.wait_for()
    shown = [c.inner_text().strip() for c in page.get_by_test_id("stCode").all()]
    assert any("print(6 * 7)" in c for c in shown) and "42" in shown, shown  # the call, then what the sandbox printed
    page.get_by_text("It is 42.").first.wait_for()
    shot(page, "15-playground-tool-call")


def test_no_request_left_the_machine(browser_page) -> None:  # type: ignore[no-untyped-def]
    """Every page the flow above opened loaded everything from this machine: the console, its scripts, fonts and
    charts, the gateway (``browser_page`` records each request to another host as it is made)."""
    assert OUTSIDE == [], (
        f"{len(OUTSIDE)} requests left the machine, to: {sorted({urlsplit(u).hostname for u in OUTSIDE})}"
    )
