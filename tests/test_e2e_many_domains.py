"""A run over every procedural domain in the browser: the Training page's domains x steps heatmap and per-domain
before/after table, drawn in Chromium and timed against the same run over four domains. A console of its own (the
flow in ``test_e2e_console`` leaves deployments and live runs on its pages), its admin created in the browser."""

from __future__ import annotations

import re
import time

import pytest
from test_e2e_console import PASSWORD, browser_page, console, pick_run, shot  # noqa: F401 - fixtures and helpers

pytestmark = pytest.mark.slow


def test_the_console_opens_for_its_first_admin(browser_page, console) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    page = browser_page
    page.goto(console["base"])
    page.get_by_label("Admin username").fill("admin")
    page.get_by_role("textbox", name="Password", exact=True).fill(PASSWORD)
    page.get_by_role("textbox", name="Password again", exact=True).fill(PASSWORD)
    page.get_by_role("button", name="Create admin and log in").click()
    page.get_by_role("heading", name="Overview").wait_for()


def open_run_s(page, job_id: int, ready: list[str]) -> float:  # type: ignore[no-untyped-def]
    """Seconds from picking run ``job_id`` in the Run box until its header and each text of ``ready`` are on the page."""
    start = time.perf_counter()
    pick_run(page, job_id)
    page.get_by_text(re.compile(rf"^Run {job_id} · train_preset · succeeded")).first.wait_for(timeout=120_000)
    for text in ready:
        page.get_by_text(text).first.wait_for(timeout=120_000)
    return time.perf_counter() - start


def test_a_run_over_every_domain_shows_its_heatmap_and_per_domain_table(browser_page, console) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """A finished run over every procedural domain, 1,000 steps of their figures (written to the console's database):
    the Training page draws the domains x steps heatmap and the per-domain before/after table in the browser, in
    a bounded multiple of the time the same run over 4 domains takes (its peer, opened the same way here)."""
    from test_metrics import many_domain_run

    url = console["env"]["POSTTRAIN_DATABASE_URL"]
    big, domains = many_domain_run(url)
    small, few = many_domain_run(url, count=4)
    page = browser_page
    page.get_by_role("link", name="Training").first.click()
    page.set_default_timeout(300_000)  # the first open of a run imports the page's modules: not timed
    open_run_s(page, small, ["Pass rate by domain"])
    page.set_default_timeout(60_000)
    lost, gained = sum(i % 10 == 3 for i in range(len(domains))), sum(i % 10 == 5 for i in range(len(domains)))
    timings: dict[str, list[float]] = {"small": [], "big": []}
    for _ in range(3):  # the best of three each, alternating (each open a switch from the other run): a shared 2-core
        # box stalls a single render now and then
        timings["big"].append(
            open_run_s(
                page,
                big,
                [
                    f"By domain ({len(domains)} domains)",
                    f"{len(domains)} domains: {gained} gained and {lost} lost beyond noise",
                ],
            )
        )
        page.get_by_test_id("stVegaLiteChart").locator("canvas, svg").first.wait_for()
        timings["small"].append(
            open_run_s(page, small, ["Pass rate by domain", "4 domains: 0 gained and 1 lost beyond noise"])
        )
    open_run_s(page, big, [f"By domain ({len(domains)} domains)"])
    page.get_by_test_id("stVegaLiteChart").locator("canvas, svg").first.wait_for()
    charts = page.get_by_test_id("stVegaLiteChart")
    heights = [(charts.nth(i).bounding_box() or {"height": 0.0})["height"] for i in range(charts.count())]
    assert max(heights) >= 1000, heights  # the heatmap: about a row of pixels for each domain, not a thumbnail
    charts.nth(heights.index(max(heights))).scroll_into_view_if_needed()
    shot(page, "09-many-domain-run")
    small_s, big_s = min(timings["small"]), min(timings["big"])
    print(
        f"\nrun view in the browser: {len(domains)} domains x 1,000 steps {big_s:.2f}s, 4 domains {small_s:.2f}s "
        f"({big_s / small_s:.2f}x); all: {timings}"
    )
    assert big_s < 5 * small_s, (
        timings
    )  # measured here: 2.6-2.8x (2.7 s against 1.0 s; 4.0 s against 1.5 s with a benchmark beside)
