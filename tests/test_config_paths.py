"""Job configs cannot reach outside the data directory, checkpoints load tensors only, and a config
file is parsed strictly (duplicate keys refused) without its contents echoed in errors."""

from __future__ import annotations

import json
import os
import pickle
import re
from pathlib import Path

import pytest
import torch

from conftest import OPERATOR
from test_cli import cli, one_error_line
from test_jobs import job_count
from posttrain.platform.jobs import queue
from posttrain.platform.jobs.registry import JobConfigError, parse_config_text, validate_config
from posttrain.platform.settings import get_settings
from posttrain.training.checkpoint import CheckpointError, load_latest_checkpoint, read_trainer_state


@pytest.mark.parametrize(
    ("kind", "config", "field"),
    [
        ("train_sft", {"preset": "cpu-demo", "model": "tiny", "output_dir": "/"}, "output_dir"),
        ("train_grpo", {"preset": "cpu-demo", "model": "/etc"}, "model"),
        ("train_sft", {"preset": "cpu-demo", "model": "tiny", "output_dir": "../../elsewhere"}, "output_dir"),
        ("evaluate", {"models": ["tiny", "/root/models/x"], "domains": ["arith.add.int"], "difficulty": 3}, "models[1]"),
        ("train_preset", {"output_dir": "/tmp/run"}, "output_dir"),
        ("deploy", {"model": "tiny", "tiers_file": "/etc/passwd"}, "tiers_file"),
        ("build_tasks", {"task_set": "x", "source": {"type": "jsonl", "path": "/etc/hosts"}}, "source.path"),
        ("import_model", {"source": "/usr/share/model.gguf"}, "source"),
    ],
)
def test_a_path_outside_the_data_dir_is_refused_at_submit(platform_env: dict[str, str], db_url: str, kind: str,
                                                          config: dict, field: str) -> None:
    before = job_count(db_url)
    with pytest.raises(JobConfigError, match=re.escape(field) + ": .* is outside the data directory"):
        queue.submit(OPERATOR, kind, config)
    assert job_count(db_url) == before


def test_paths_inside_resolve_against_the_data_dir_and_extra_roots_are_allowed(platform_env: dict[str, str],
                                                                               tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    data = Path(platform_env["POSTTRAIN_DATA_DIR"]).resolve()
    config = validate_config("train_sft", {"preset": "cpu-demo", "model": "models/tiny", "output_dir": str(data / "runs" / "a")})
    assert config.model == str(data / "models" / "tiny") and config.output_dir == str(data / "runs" / "a")  # type: ignore[attr-defined]
    assert validate_config("train_sft", {"preset": "cpu-demo", "model": "tiny"}).model == "tiny"  # type: ignore[attr-defined]
    store = tmp_path / "team-models"
    with pytest.raises(JobConfigError):
        validate_config("train_sft", {"preset": "cpu-demo", "model": str(store / "m")})
    monkeypatch.setenv("POSTTRAIN_PATH_ROOTS", json.dumps([str(store)]))
    get_settings.cache_clear()
    assert validate_config("train_sft", {"preset": "cpu-demo", "model": str(store / "m")}).model == str(store / "m")  # type: ignore[attr-defined]


class _Payload:
    """What a planted trainer.pt could hold: unpickling it would create ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.marker}",))


def test_a_planted_checkpoint_cannot_run_code(tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))  # fmt: skip
    step = tmp_path / "checkpoints" / "step_00000001"
    model.save_pretrained(step / "model")
    (step / "state.json").write_text('{"step": 1}')
    marker = tmp_path / "pwned"
    with open(step / "trainer.pt", "wb") as fh:
        pickle.dump({"optimizer": _Payload(marker)}, fh)
    with pytest.raises(CheckpointError):
        read_trainer_state(step)
    with pytest.raises(CheckpointError, match="no checkpoint under"):
        load_latest_checkpoint(tmp_path / "checkpoints", model)
    assert not marker.exists()


def test_a_real_checkpoint_round_trips_weights_only(tmp_path: Path) -> None:
    import random

    import numpy as np

    from posttrain.training.checkpoint import rng_state, set_rng_state

    state = rng_state()
    torch.save({"optimizer": {}, "lr_scheduler": None, "rng": state}, tmp_path / "trainer.pt")
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    set_rng_state(read_trainer_state(tmp_path)["rng"])
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected


def test_duplicate_keys_are_refused() -> None:
    with pytest.raises(JobConfigError, match=r"key 'max_steps' appears twice \(line 3\)"):
        parse_config_text("preset: cpu-demo\nmax_steps: 5\nmax_steps: 500\n", "run.yaml")
    with pytest.raises(JobConfigError, match="key 'lr' appears twice"):
        parse_config_text("optim:\n  lr: 1\n  lr: 2\n", "run.yaml")
    with pytest.raises(JobConfigError, match="--config: key 'steps' appears twice"):
        parse_config_text('{"steps": 1, "steps": 2}', "--config", json_only=True)
    assert parse_config_text("a: &x {b: 1}\nc: *x\n", "run.yaml") == {"a": {"b": 1}, "c": {"b": 1}}


def test_config_file_errors_never_echo_its_contents(platform_env: dict[str, str], tmp_path: Path) -> None:
    secret = "hunter2-SECRET-token"
    cases = {
        "unknown.yaml": f"api_token: {secret}\n",  # a key the kind does not have: its value is not shown
        "broken.yaml": f"password: [{secret}, unclosed\n",
        "tabs.yaml": f"key:\n\t{secret}: 1\n",
        "duplicate.yaml": f"steps: 1\nsteps: {secret}\n",
    }
    for name, text in cases.items():
        path = tmp_path / name
        path.write_text(text)
        line = one_error_line(cli(platform_env, "jobs", "submit", "selftest", "--config-file", str(path)))
        assert secret not in line, line
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00secret")
    assert "is not UTF-8 text" in one_error_line(cli(platform_env, "jobs", "submit", "selftest", "--config-file", str(binary)))


@pytest.mark.parametrize("priority", ["99999999999", "-99999999999"])
def test_an_out_of_range_priority_is_one_line(platform_env: dict[str, str], db_url: str, priority: str) -> None:
    before = job_count(db_url)
    line = one_error_line(cli(platform_env, "jobs", "submit", "selftest", "--priority", priority))
    assert f"priority {priority} is out of range" in line
    assert job_count(db_url) == before
