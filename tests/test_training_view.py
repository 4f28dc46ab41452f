"""The Training page as a newcomer meets it (issue 35): the run view names what it measured and how, follows a live run
(the Run box's status, each step's trajectories) on the browser's timer, and the launch side refuses what would spoil
a measurement. AppTest against a real database (SQLite and PostgreSQL), as tests/test_training_page.py.

A live panel is a fragment the browser reruns on its own every few seconds (``st.fragment(run_every=...)``), not the
whole page: ``tick`` does what the browser does then, through Streamlit's own script runner, so a test sees what the
page shows between two whole reruns, where a status or a list computed once would stay stale."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from conftest import OPERATOR
from sqlalchemy import insert
from sqlmodel import select
from streamlit.testing.v1 import AppTest
from streamlit.testing.v1.element_tree import AlertBase
from test_metrics import chart_frame, insert_metrics
from test_training_page import GRPO, all_jobs, page, register_builtin

from posttrain.platform.db.engine import session
from posttrain.platform.db.models import JobStatus, Model, Trajectory
from posttrain.platform.jobs import queue
from posttrain.platform.models.importer import DEFAULT_MODEL as REAL_MODEL
from posttrain.training.presets import get_preset

Tick = Callable[[AppTest], AppTest]


@pytest.fixture
def tick(browser_timers) -> Tick:  # type: ignore[no-untyped-def]
    """``tick(at)``: what the browser does when a live panel's timer fires (conftest.BrowserTimers)."""
    return browser_timers.tick


def preset_run(preset: str = "smollm2-quick", status: JobStatus = JobStatus.running) -> int:
    """A ``train_preset`` job of ``preset``, queued or claimed (running) as a worker claims it."""
    job = queue.submit(OPERATOR, "train_preset", {"preset": preset})
    if status is JobStatus.running:
        claimed = queue.claim("w", 1, 0)
        assert claimed is not None and claimed.id == job
    return job


def finish_preset(job: int, **result: object) -> None:
    """The end of a smollm2-quick run as ``training.jobs.run_preset_job`` records it (the fields given override)."""
    name = f"smollm2-quick-job{job}"
    fields = {"preset": "smollm2-quick", "model": name, "sft_model": REAL_MODEL, "base_model": REAL_MODEL,
              "models": [REAL_MODEL, name], "domains": ["arith.add.int"], "gain_points": 20.0, "eval_tasks": 64,
              "eval_unseen_fraction": 1.0, **result}  # fmt: skip
    assert queue.finish(job, queue.Outcome(exit_code=0, result=fields)) is JobStatus.succeeded


def store_trajectories(job: int, step: int, count: int = 4) -> None:
    now = datetime.now(UTC)
    with session() as s:
        s.execute(insert(Trajectory), [
            {"job_id": job, "step": step, "domain": "arith.add.int", "prompt": [{"role": "user", "content": f"{step} + {i}?"}],
             "completion": f"\\boxed{{{step + i}}}", "tool_calls": [], "reward": float(i % 2),
             "verdict": {"score": float(i % 2), "passed": bool(i % 2)}, "created_at": now}
            for i in range(count)
        ])  # fmt: skip


def trajectory_rows(at: AppTest):  # type: ignore[no-untyped-def]
    """The trajectory browser's page of rows."""
    tables = [t.value for t in at.dataframe if "completion" in t.value.columns]
    assert tables, f"no trajectories shown: {[c.value for c in at.caption]}"
    return tables[0]


def in_order(at: AppTest) -> list[str]:
    """The alerts (success, info, warning, error) of the page, top to bottom."""

    def walk(node):  # type: ignore[no-untyped-def]
        yield node
        for key in sorted(getattr(node, "children", {})):
            yield from walk(node.children[key])

    return [str(node.value) for node in walk(at._tree) if isinstance(node, AlertBase)]


def texts(tree: AppTest) -> list[str]:
    """Every line of text the tree shows: markdown, captions, alerts."""
    return [
        e.value for kind in ("markdown", "caption", "info", "success", "warning", "error") for e in getattr(tree, kind)
    ]


# --- 1. the evaluation names the model it evaluated -------------------------------------------------------------


def test_the_evaluation_names_the_model_it_evaluated(platform_env: dict[str, str]) -> None:
    """smollm2-quick has no SFT stage: what it evaluates before GRPO is the built-in model itself, named as such."""
    job = preset_run()
    insert_metrics(job, [(0, "eval/pass@1", 0.4), (0, "eval/arith.add.int/pass@1", 0.4)])
    at = page()
    assert f"**Evaluation** of {REAL_MODEL} (before GRPO)" in texts(at)
    table = at.dataframe[-1].value.set_index("domain")
    assert table.loc["arith.add.int", f"{REAL_MODEL} (before GRPO) · pass@1"] == 0.4
    assert any(
        f"Held-out pass@1 of {REAL_MODEL} before GRPO: 40.0%; evaluated again when GRPO finishes." == i.value
        for i in at.info
    ), [i.value for i in at.info]
    assert not any("SFT model" in t for t in texts(at))

    # a from-scratch preset warms its small model up with SFT first: that is the model evaluated before GRPO
    tiny = preset_run("cpu-quick")
    insert_metrics(tiny, [(0, "eval/pass@1", 0.1)])
    at.run().selectbox(key="run_id").set_value(tiny).run()
    assert f"**Evaluation** of cpu-quick-job{tiny}-sft (before GRPO)" in texts(at)

    finish_preset(job)  # once it ends: the names its result records
    insert_metrics(job, [(1, "eval/pass@1", 0.6), (1, "eval/arith.add.int/pass@1", 0.6)])
    at.run().selectbox(key="run_id").set_value(job).run()
    assert f"**Evaluation** of {REAL_MODEL} (before GRPO), smollm2-quick-job{job} (after GRPO)" in texts(at)


# --- 3. the Run box shows each run's status as it is now ------------------------------------------------------


def test_the_run_box_shows_the_status_of_the_run_as_it_changes(platform_env: dict[str, str], tick: Tick) -> None:
    job = preset_run(status=JobStatus.queued)
    at = page()
    # the box names the run, not its status: a browser keeps a select box's shown text when only its labels change
    assert at.selectbox(key="run_id").options == [f"#{job} · train_preset · smollm2-quick"]
    assert any(m.value.startswith(f"**Run {job}** · `train_preset` · queued") for m in at.markdown)
    assert queue.claim("w", 1, 0).id == job  # type: ignore[union-attr]
    live = tick(at)  # the page is not reloaded: its live panel reruns on the browser's timer
    assert any(m.value.startswith(f"**Run {job}** · `train_preset` · running") for m in live.markdown)
    queue.cancel(OPERATOR, job)
    queue.finish(job, queue.Outcome(exit_code=-15))
    assert queue.get_job(job).status is JobStatus.cancelled
    at.run()  # (its end reruns the whole page, which then stops polling)
    assert any(m.value.startswith(f"**Run {job}** · `train_preset` · cancelled") for m in at.markdown)


# --- 4. the demo waits while its estimate calibrates ---------------------------------------------------------


def test_run_the_demo_waits_while_its_estimate_calibrates(platform_env: dict[str, str]) -> None:
    register_builtin()
    at = page()
    stale = at.button(key="demo_launch")  # a page drawn before the estimate started
    assert not stale.disabled
    estimate = queue.submit(OPERATOR, "estimate", {"kind": "train_preset", "config": {"preset": "smollm2-quick"}})
    stale.click().run()  # its click launches nothing: the page drawn for it disables the button
    assert [j.kind for j in all_jobs()] == ["estimate"]
    button = at.button(key="demo_launch")
    assert button.disabled and f"its estimate (job {estimate}) is queued" in button.help
    assert any(
        f"**Run the demo** waits: its estimate (job {estimate}) is queued on this host" in c.value for c in at.caption
    )
    assert queue.claim("w", 1, 0).id == estimate  # type: ignore[union-attr]
    at.run()
    assert at.button(key="demo_launch").disabled and "is calibrating" in at.button(key="demo_launch").help

    queue.finish(estimate, queue.Outcome(exit_code=1, error="no model", cause="bad_input"))
    assert queue.get_job(estimate).status.finished
    at.run()
    assert not at.button(key="demo_launch").disabled  # it ended: the demo can start
    at.button(key="demo_launch").click().run()
    assert queue.list_jobs(kind="train_preset")[0].config["preset"] == "smollm2-quick"


# --- 5. the general check beside the held-out gain --------------------------------------------------------


def test_the_general_check_is_shown_beside_the_held_out_gain(platform_env: dict[str, str]) -> None:
    """23.4% -> 25.0% on 64 tasks (16 per domain x 4 domains, none of them the evaluated arith.add.int): the result
    carries no task count, so it comes from the preset's eval.general; the difference's standard error is
    sqrt(p(1-p)/64 + q(1-q)/64) = 7.6 points."""
    check = get_preset("smollm2-quick").eval.general
    assert check is not None and check.tasks_per_domain * len(check.domains) == 64
    job = preset_run()
    insert_metrics(job, [(0, "eval/pass@1", 0.25), (0, "general/pass@1", 15 / 64)])
    at = page()
    assert any(
        i.value == f"General check on 64 tasks of 4 domains it never trained on: {REAL_MODEL} 23.4% before GRPO."
        for i in at.info
    ), [i.value for i in at.info]

    insert_metrics(job, [(1, "eval/pass@1", 0.5), (1, "general/pass@1", 0.25)])
    finish_preset(job, general_before=15 / 64, general_after=16 / 64, pass_before=0.25, pass_after=0.5)
    at.run()
    error = 100 * math.sqrt((15 / 64) * (49 / 64) / 64 + 0.25 * 0.75 / 64)
    assert f"{error:.1f}" == "7.6"
    lines = [t for t in in_order(at) if t.startswith(("Held-out", "General"))]
    assert lines[0].startswith(f"Held-out pass@1 on 64 eval tasks, 100% unseen in training: {REAL_MODEL} 25.0% → ")
    assert lines[1] == (
        f"General check on 64 tasks of 4 domains it never trained on: {REAL_MODEL} 23.4% → "
        f"smollm2-quick-job{job} 25.0% (+1.6 ± 7.6 points, ± one unpaired standard error): what training "
        "cost elsewhere."
    )  # beside it, right below: a result stored with no arena has only the two rates


def test_the_general_check_takes_the_paired_se_of_the_run_s_arena(platform_env: dict[str, str]) -> None:
    """The same 64 tasks before and after: the arena's paired figure (here 3 of 64 flipped up, 2 down) is the one shown."""
    from posttrain.platform.stats import paired_difference

    before = [True] * 15 + [False] * 49
    after = [True] * 13 + [False, False] + [True] * 3 + [False] * 46
    check = paired_difference(before, after).as_dict()
    job = preset_run()
    insert_metrics(
        job,
        [
            (0, "eval/pass@1", 0.25),
            (0, "general/pass@1", 15 / 64),
            (1, "eval/pass@1", 0.5),
            (1, "general/pass@1", 16 / 64),
        ],
    )
    finish_preset(
        job,
        general_before=15 / 64,
        general_after=16 / 64,
        pass_before=0.25,
        pass_after=0.5,
        arena={
            "a": REAL_MODEL,
            "b": f"smollm2-quick-job{job}",
            "general": check,
            "disagreements": [],
            "disagreements_total": 5,
            "domains": {"all": paired_difference([False] * 16 + [True] * 16, [True] * 32).as_dict()},
        },
    )
    shown = in_order(page())
    lines = [t for t in shown if t.startswith("General")]
    assert f"{100 * check['se']:.1f}" == "3.5"  # under half the unpaired 7.6: the two agree on 59 of 64 tasks
    assert lines == [
        f"General check on 64 tasks of 4 domains it never trained on: {REAL_MODEL} 23.4% → "
        f"smollm2-quick-job{job} 25.0% (+1.6 ± 3.5 points, ± one paired standard error): what training "
        "cost elsewhere."
    ]
    # the held-out gain beside it takes the arena's paired SE of the evaluation's own tasks (16 of 32 flipped up: 8.98)
    held = next(t for t in shown if t.startswith("Held-out"))
    assert held.endswith(f"smollm2-quick-job{job} 50.0% (+25.0 ± 9.0 points, ± one paired standard error)"), held


# --- 6. the reward smoothed, and the held-out figure as what climbs ------------------------------------------------


NOISY = [0.47, 0.16, 0.47, 0.31, 0.09, 0.25, 0.38, 0.31]  # a smollm2-quick run's per-step reward (8 steps of 4 prompts)


def test_the_reward_chart_smooths_the_noisy_steps_beside_the_held_out_climb(platform_env: dict[str, str]) -> None:
    job = preset_run()
    insert_metrics(job, [(0, "eval/pass@1", 0.3)] + [(i + 1, "rollout/reward_mean", r) for i, r in enumerate(NOISY)])
    finish_preset(job)
    insert_metrics(job, [(1, "eval/pass@1", 0.53)])
    at = page()
    assert not any("reward climb" in t for t in texts(at))  # no promise the per-step figure cannot keep
    assert any("held-out pass@1 before and after is what shows whether the model learned" in t for t in texts(at))
    (reward,) = [c for c in at.get("vega_lite_chart") if "rollout/reward_mean" in set(chart_frame(c)["metric"])]
    frame = chart_frame(reward)
    raw = frame[(frame["metric"] == "rollout/reward_mean") & (frame["shown"] == "per step")]
    smoothed = frame[(frame["metric"] == "rollout/reward_mean") & (frame["shown"] == "smoothed")]
    assert list(raw["value"]) == pytest.approx(NOISY) and list(smoothed["step"]) == list(range(1, 9))
    expected = [NOISY[0]]
    for r in NOISY[1:]:
        expected.append(0.3 * r + 0.7 * expected[-1])
    assert list(smoothed["value"]) == pytest.approx(expected)
    held_out = frame[frame["shown"] == "held-out"]
    assert list(held_out["step"]) == [0, 8] and list(held_out["value"]) == pytest.approx([0.3, 0.53])  # before, after
    spec = json.loads(reward.proto.spec)
    assert [layer["mark"]["type"] for layer in spec["layer"]] == [
        "rule",
        "point",
        "line",
        "line",
    ]  # the spread where logged, the raw points, the average, the held-out line
    assert frame["lo"].isna().all()  # a run that logged no SE draws no bars, and says nothing of them
    assert not any("Bars:" in c.value or "What moves the reward" in c.value for c in at.caption)
    assert any(
        "exponential moving average (each step weighs 0.3, the average before it 0.7)" in c.value for c in at.caption
    )


def test_the_reward_chart_shows_each_steps_spread_and_says_what_moves_it(platform_env: dict[str, str]) -> None:
    """The demo's puzzle: the sampled reward falls over the run while the held-out pass@1 rises. The chart draws each
    step's ± 2 SE (its few prompts' spread) and says, from the run's own figures, that the steps moved within that
    noise and that the policy samples more varied tokens (at temperature 1 that costs sampled reward)."""
    falling = [0.45, 0.41, 0.5, 0.35, 0.33, 0.3, 0.36, 0.27]
    se = [0.12, 0.1, 0.14, 0.11, 0.12, 0.1, 0.13, 0.11]
    nll = [0.3, 0.32, 0.31, 0.36, 0.42, 0.45, 0.44, 0.5]
    job = preset_run()
    insert_metrics(job, [(0, "eval/pass@1", 0.3)]
                   + [(i + 1, name, v) for name, values in (("rollout/reward_mean", falling), ("rollout/reward_se", se),
                                                            ("rollout/sampled_nll", nll)) for i, v in enumerate(values)])  # fmt: skip
    finish_preset(job)
    insert_metrics(job, [(1, "eval/pass@1", 0.53)])
    at = page()
    (reward,) = [c for c in at.get("vega_lite_chart") if "rollout/reward_mean" in set(chart_frame(c)["metric"])]
    frame = chart_frame(reward)
    raw = frame[(frame["metric"] == "rollout/reward_mean") & (frame["shown"] == "per step")]
    assert list(raw["lo"]) == pytest.approx([r - 2 * e for r, e in zip(falling, se)])
    assert list(raw["hi"]) == pytest.approx([r + 2 * e for r, e in zip(falling, se)])
    (why,) = [c.value for c in at.caption if c.value.startswith("What moves the reward")]
    assert "within ± 2 SE of its draw (prompts and samples) 7 of 7 times" in why, why
    assert "moves it more than training does" in why and "within the noise" in why, why
    assert "0.32 → 0.45 (more varied: sampling at the run's temperature" in why, why
    assert "Held out, greedy, on prompts no step drew: 30% → 53%." in why, why
    assert any("Bars: ± 2 SE of a step's mean over its prompts." in c.value for c in at.caption)


# --- 7. trajectories as each step stores them ---------------------------------------------------------------


def test_trajectories_appear_step_by_step_while_the_run_runs(platform_env: dict[str, str], tick: Tick) -> None:
    job = preset_run()
    at = page()
    before = [c.value for c in at.caption]
    store_trajectories(job, 1)
    live = tick(at)  # step 1 stored them: the browser's next tick shows them, without a reload
    assert list(trajectory_rows(live)["step"]) == [1, 1, 1, 1]
    assert any("No trajectories yet: GRPO stores each step's as the step ends" in c for c in before), before
    store_trajectories(job, 2)
    live = tick(at)
    rows = trajectory_rows(live)
    assert list(rows["step"])[:4] == [2, 2, 2, 2] and len(rows) == 8
    assert live.slider(key="traj_steps").value == (1, 2)
    assert "Page (of 1, 8 trajectories)" == live.number_input(key="traj_page").label
    store_trajectories(job, 3)  # the step range follows the run's newest step
    live = tick(at)
    assert live.slider(key="traj_steps").value == (1, 3) and trajectory_rows(live)["step"].iloc[0] == 3

    at.slider(key="traj_steps").set_value((1, 2)).run()  # an operator's narrower range stays as chosen
    store_trajectories(job, 4)
    live = tick(at)
    assert live.slider(key="traj_steps").value == (1, 2) and set(trajectory_rows(live)["step"]) == {1, 2}


# --- 8. a cancelled run says what happened to it ---------------------------------------------------------


def test_a_cancelled_run_says_it_ended_without_an_after_evaluation(platform_env: dict[str, str]) -> None:
    job = preset_run()
    insert_metrics(job, [(0, "eval/pass@1", 0.4)] + [(step, "rollout/reward_mean", 0.3) for step in (1, 2, 3)])
    queue.cancel(OPERATOR, job)
    assert queue.finish(job, queue.Outcome(exit_code=-15)) is JobStatus.cancelled
    at = page()
    shown = texts(at)
    assert not any("evaluated again" in t for t in shown)
    assert (
        f"Held-out pass@1 of {REAL_MODEL} before GRPO: 40.0%. The run was cancelled at GRPO step 3 of 8, so there is "
        "no after-evaluation: no held-out figure after GRPO, and no gain. Resume continues it from its last "
        "checkpoint."
    ) in shown, shown


# --- 9. the preset tab opens on a coherent pair, and says when a pair is not ------------------------------------


def test_the_preset_tab_opens_on_a_real_model_preset_with_its_own_model(platform_env: dict[str, str]) -> None:
    register_builtin()
    with session() as s:  # a small model built for the from-scratch presets, and one trained from the real model
        s.add(
            Model(
                name="tiny-built",
                path="/models/tiny",
                architecture="Qwen2ForCausalLM",
                meta={"built": {"hidden_size": 64}},
            )
        )
        real = s.exec(select(Model).where(Model.name == REAL_MODEL)).one()
        s.add(Model(name="quick-tuned", path="/models/q", architecture="LlamaForCausalLM", base_model_id=real.id))
    at = page()
    assert at.selectbox(key="preset_name").value == "smollm2-quick"
    assert at.selectbox(key="preset_model").value == REAL_MODEL
    yaml_text = next(c.value for c in at.code if "max_steps" in c.value)
    assert f"model: {REAL_MODEL}" in yaml_text and "max_new_tokens: 40" in yaml_text
    assert not at.warning

    at.selectbox(key="preset_name").set_value("cpu-demo").run()  # a from-scratch preset: not the real model
    assert at.selectbox(key="preset_model").value == "tiny-built" and not at.warning  # the newest model it fits
    at.selectbox(key="preset_model").set_value(REAL_MODEL).run()
    assert [w.value for w in at.warning] == [
        f"Preset 'cpu-demo' is made for the small model it builds from scratch (it samples at most 6 new tokens), and "
        f"'{REAL_MODEL}' is a real model: pick a real-model preset (such as 'smollm2-quick') for it, or a model built "
        "for this preset."
    ]

    at.selectbox(key="preset_name").set_value("smollm2-quick").run()  # back: its own model again
    assert at.selectbox(key="preset_model").value == REAL_MODEL and not at.warning
    at.selectbox(key="preset_model").set_value("quick-tuned").run()  # trained from it: made for it too
    assert not at.warning
    at.selectbox(key="preset_model").set_value("tiny-built").run()
    assert [w.value for w in at.warning] == [
        f"Preset 'smollm2-quick' was made for '{REAL_MODEL}' (it samples at most 40 new tokens): its prompt format and "
        f"settings were tuned on it, and 'tiny-built' is neither that model nor trained from it. Pick '{REAL_MODEL}', or a "
        "preset made for 'tiny-built'."
    ]


# --- 18. tiles that fit, whole steps, no flat lines ----------------------------------------------------------


def test_tiles_fit_steps_are_whole_and_always_zero_figures_are_a_note(platform_env: dict[str, str]) -> None:
    job = queue.submit(OPERATOR, "train_grpo", GRPO)  # kl_coef 0, one update per batch, lock-step (sync) rollouts
    insert_metrics(job, [
        (step, name, value) for step in (1, 2, 3) for name, value in (
            ("train/loss", 0.0123456789), ("train/kl", 0.0), ("train/clip_frac_low", 0.0), ("train/clip_frac_high", 0.0),
            ("pipeline/queue_depth", 0.0), ("pipeline/staleness_mean", 0.0), ("rollout/reward_mean", 0.25 * step),
            ("rollout/tokens_per_s", 98765.4))
    ])  # fmt: skip
    at = page()
    tiles = {m.label: m.value for m in at.metric}
    assert (
        tiles["Loss"] == "0.0123" and tiles["KL"] == "0" and tiles["Tokens/s"] == "98,765" and tiles["Reward"] == "0.75"
    )
    for chart in at.get("vega_lite_chart"):
        assert json.loads(chart.proto.spec)["encoding"]["x"]["axis"] == {"format": "d", "tickMinStep": 1}  # whole steps
    titles = [m.value for m in at.markdown]
    assert "**Loss**" in titles and "**Reward**" in titles
    for flat in ("**KL to the initial policy**", "**Clip fraction**", "**Pipeline**"):
        assert flat not in titles, flat
    notes = [c.value for c in at.caption if "not drawn: 0 at every step" in c.value]
    assert notes == [
        "**KL to the initial policy**: not drawn: 0 at every step, because its `kl_coef` is 0, so it keeps no reference "
        "model and logs KL as 0.",
        "**Clip fraction**: not drawn: 0 at every step, because one update per batch of rollouts from the current policy "
        "(`updates_per_batch: 1`, lock-step): the probability ratio stays at 1, so no token is clipped.",
        "**Pipeline**: not drawn: 0 at every step, because rollouts and updates run in lock-step (`rollout: {backend: "
        "sync}`): no batch waits in a queue and none comes from an older policy.",
    ]
    plotted = {m for c in at.get("vega_lite_chart") for m in set(chart_frame(c)["metric"])}
    assert not plotted & {"train/kl", "train/clip_frac_low", "pipeline/queue_depth"}
