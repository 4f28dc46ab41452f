"""Custom verifiers through a real entry point, and the pool's handling of hangs and crashes."""

from __future__ import annotations

import os
import sys

import pytest

from posttrain.platform.verifiers import PoolConfig, TaskSpec, VerifierService, VerifierSpecError, validate_spec

PLUGIN = """
import os, time
from posttrain.platform.verifiers import Verdict

def length_ratio(task, completion, params):
    return min(1.0, len(completion) / params["target"])

def strict(task, completion, params):
    return Verdict.of_score(1.0 if completion == "ok" else 0.0, "strict check")

def hang(task, completion, params):
    time.sleep(60)
    return 1.0

def slow(task, completion, params):
    time.sleep(params["seconds"])
    return 1.0

def crash(task, completion, params):
    os._exit(3)

def boom(task, completion, params):
    raise RuntimeError("rubric broke")

def out_of_range(task, completion, params):
    return 7
"""


@pytest.fixture(scope="module")
def plugin_service(tmp_path_factory):
    root = tmp_path_factory.mktemp("plugin")
    (root / "pt_test_rubrics.py").write_text(PLUGIN)
    dist = root / "pt_test_rubrics-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: pt-test-rubrics\nVersion: 0.1\n")
    names = ["length_ratio", "strict", "hang", "slow", "crash", "boom", "out_of_range"]
    (dist / "entry_points.txt").write_text(
        "[posttrain.verifiers]\n" + "".join(f"{n} = pt_test_rubrics:{n}\n" for n in names)
    )
    sys.path.insert(0, str(root))  # before the workers start: they inherit sys.path
    try:
        with VerifierService(PoolConfig(workers=2)) as service:
            yield service
    finally:
        sys.path.remove(str(root))


def custom(name: str, **params) -> TaskSpec:
    return TaskSpec(
        domain="test", prompt="q", verifier={"kind": "custom", "spec": {"entry_point": name, "params": params}}
    )


def test_custom_entry_point_scores(plugin_service):
    verdict = plugin_service.verify(custom("length_ratio", target=10), "12345")
    assert verdict.score == pytest.approx(0.5) and not verdict.passed
    assert plugin_service.verify(custom("strict"), "ok").passed
    assert not plugin_service.verify(custom("strict"), "no").passed


def test_unknown_entry_point_is_a_spec_error(plugin_service):
    with pytest.raises(VerifierSpecError, match="no entry point 'nope'.*length_ratio"):
        validate_spec("custom", {"entry_point": "nope"})


def test_hanging_verifier_times_out_as_infra_error_and_pool_recovers(plugin_service):
    assert plugin_service.verify(custom("strict"), "ok").passed  # the workers are up
    before = set(plugin_service.worker_pids)
    assert before
    # the peer: a check that takes 1 s of its 1.5 s and passes
    peer = plugin_service.verify(custom("slow", seconds=1.0), "x", timeout_s=1.5)
    assert peer.passed and not peer.is_infra_error, peer
    verdict = plugin_service.verify(custom("hang"), "x", timeout_s=1.5)
    assert verdict.is_infra_error and "did not finish within 1.5 s" in verdict.infra_error
    # given up at the limit (1.5x the peer), not after the 60 s the check would take
    assert 1.5 <= verdict.elapsed_s < 3 * peer.elapsed_s, (verdict.elapsed_s, peer.elapsed_s)
    assert plugin_service.verify(custom("strict"), "ok").passed
    assert set(plugin_service.worker_pids) != before  # the hung worker was replaced


def test_crashing_and_raising_verifiers_are_infra_errors(plugin_service):
    crashed = plugin_service.verify(custom("crash"), "x")
    assert crashed.is_infra_error and "died" in crashed.infra_error and crashed.score == 0
    raised = plugin_service.verify(custom("boom"), "x")
    assert raised.is_infra_error and "rubric broke" in raised.infra_error
    bad = plugin_service.verify(custom("out_of_range"), "x")
    assert bad.is_infra_error and "outside [0, 1]" in bad.infra_error
    for pid in plugin_service.worker_pids:
        os.kill(pid, 0)  # the survivors are alive
    assert plugin_service.verify(custom("strict"), "ok").passed


def test_a_hang_does_not_stall_other_checks(plugin_service):
    tasks = [custom("hang")] + [custom("strict")] * 6
    verdicts = plugin_service.verify_batch(tasks, ["x"] + ["ok"] * 6, timeout_s=3)
    assert verdicts[0].is_infra_error
    assert all(v.passed for v in verdicts[1:])
