"""Job configs cannot reach outside the data directory, checkpoints load tensors only, and a config
file is parsed strictly (duplicate keys refused), capped in size, and explained by its lines without
its contents echoed in errors."""

from __future__ import annotations

import json
import math
import os
import pickle
import re
import subprocess
import time
from pathlib import Path

import pytest
import torch
from conftest import OPERATOR
from test_cli import cli, one_error_line
from test_jobs import job_count

from posttrain.platform.engines.tiers import tier_catalog
from posttrain.platform.failures import BadInput
from posttrain.platform.jobs import queue
from posttrain.platform.jobs.config_file import MAX_CONFIG_FILE_BYTES, read_config_file
from posttrain.platform.jobs.registry import JobConfigError, parse_config_text, validate_config
from posttrain.platform.settings import get_settings
from posttrain.training.checkpoint import CheckpointError, load_latest_checkpoint, read_trainer_state


@pytest.mark.parametrize(
    ("kind", "config", "field"),
    [
        ("train_sft", {"preset": "cpu-demo", "model": "tiny", "output_dir": "/"}, "output_dir"),
        ("train_grpo", {"preset": "cpu-demo", "model": "/etc"}, "model"),
        ("train_sft", {"preset": "cpu-demo", "model": "tiny", "output_dir": "../../elsewhere"}, "output_dir"),
        (
            "evaluate",
            {"models": ["tiny", "/root/models/x"], "domains": ["arith.add.int"], "difficulty": 3},
            "models[1]",
        ),
        ("train_preset", {"output_dir": "/tmp/run"}, "output_dir"),
        ("deploy", {"model": "tiny", "tiers_file": "/etc/passwd"}, "tiers_file"),
        ("build_tasks", {"task_set": "x", "source": {"type": "jsonl", "path": "/etc/hosts"}}, "source.path"),
        ("import_model", {"source": "/usr/share/model.gguf"}, "source"),
    ],
)
def test_a_path_outside_the_data_dir_is_refused_at_submit(
    platform_env: dict[str, str], db_url: str, kind: str, config: dict, field: str
) -> None:
    before = job_count(db_url)
    with pytest.raises(JobConfigError, match=re.escape(field) + ": .* is outside the data directory"):
        queue.submit(OPERATOR, kind, config)
    assert job_count(db_url) == before


def test_paths_inside_resolve_against_the_data_dir_and_extra_roots_are_allowed(
    platform_env: dict[str, str], tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    data = Path(platform_env["POSTTRAIN_DATA_DIR"]).resolve()
    config = validate_config(
        "train_sft", {"preset": "cpu-demo", "model": "models/tiny", "output_dir": str(data / "runs" / "a")}
    )
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
    with pytest.raises(JobConfigError, match=r"run.yaml: a key appears twice \(line 3\); keep one"):
        parse_config_text("preset: cpu-demo\nmax_steps: 5\nmax_steps: 500\n", "run.yaml")
    with pytest.raises(JobConfigError, match=r"a key appears twice \(line 3\)"):
        parse_config_text("optim:\n  lr: 1\n  lr: 2\n", "run.yaml")
    with pytest.raises(JobConfigError, match="--config: key 'steps' appears twice"):
        parse_config_text('{"steps": 1, "steps": 2}', "--config", json_only=True)
    assert parse_config_text("a: &x {b: 1}\nc: *x\n", "run.yaml") == {"a": {"b": 1}, "c": {"b": 1}}


SECRET = "s3cr3t-Zq9"  # in every planted file: no piece of the output may hold it
sqlite_only = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the CLI reads the file before the database
PLANTED = [  # a file name, what it holds, and the line its error names
    ("shadow", f"root:$6${SECRET}-hash:20228:0:99999:7:::\ndaemon:*:20228:0:99999:7:::\n", 1),
    (".env", f"API_TOKEN={SECRET}-a\nDB_PASSWORD={SECRET}-b\n", 1),
    ("colon.env", f"# settings\nAPI_TOKEN: {SECRET}-a\n", 2),
    ("unknown.yaml", f"preset: cpu-demo\nmodel: tiny\n{SECRET}-key: 1\n", 3),
    ("nested.yaml", f"preset: cpu-demo\nmodel: tiny\noptim:\n  lr: 0.1\n  {SECRET}-key: 1\n", 5),
    ("unknown.json", f'{{"preset": "cpu-demo",\n "model": "tiny",\n "{SECRET}-key": 1}}\n', 3),
    ("unknown.toml", f'preset = "cpu-demo"\n{SECRET}-key = "x"\n', 1),
    ("table.toml", f"[{SECRET}-table]\nkey = 1\n", 2),
    ("wrong_type.yaml", f"preset: cpu-demo\nmodel: tiny\nmax_steps: [{SECRET}-value]\n", 3),
    ("wrong_type.json", f'{{"preset": "cpu-demo", "model": "tiny",\n"max_steps": "{SECRET}-value"}}\n', 2),
    ("nested_type.yaml", f"preset: cpu-demo\nmodel: tiny\noptim: {{lr: {SECRET}}}\n", 3),
    ("validator.yaml", f"model: tiny\npreset: {SECRET}-preset\n", 1),  # the kind's own message quotes the value
    ("outside.yaml", f"preset: cpu-demo\nmodel: /etc/{SECRET}-dir/m\n", 2),
    ("duplicate.yaml", f"preset: cpu-demo\n{SECRET}-key: 1\n{SECRET}-key: 2\n", 3),
    ("alias.yaml", f"preset: cpu-demo\nmodel: *{SECRET}-anchor\n", 2),
    ("tag.yaml", f"preset: cpu-demo\nmodel: !{SECRET}-tag x\n", 2),
    ("tabs.yaml", f"key:\n\t{SECRET}: 1\n", 2),
]


def assert_shows_no_line_of(result: subprocess.CompletedProcess[str], text: str, path: Path, line: int) -> None:
    shown = result.stdout + result.stderr
    assert SECRET not in shown, shown
    assert not [kept for kept in map(str.strip, text.splitlines()) if len(kept) >= 6 and kept in shown], shown
    error = one_error_line(result)
    assert f"config file {path}" in error and re.search(rf"\bline {line}\b", error), error


@sqlite_only
@pytest.mark.parametrize(("name", "text", "line"), PLANTED, ids=[p[0] for p in PLANTED])
def test_a_config_files_errors_name_its_lines_never_what_they_hold(
    platform_env: dict[str, str], db_url: str, tmp_path: Path, name: str, text: str, line: int
) -> None:
    path = tmp_path / name
    path.write_text(text)
    before = job_count(db_url)
    assert_shows_no_line_of(
        cli(platform_env, "jobs", "submit", "train_sft", "--config-file", str(path)), text, path, line
    )
    assert job_count(db_url) == before


@sqlite_only
def test_the_errors_name_the_schemas_fields_and_keys_it_knows(platform_env: dict[str, str], tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(f"preset: cpu-demo\nmodel: tiny\n{SECRET}: 1\nlr: 1\noptim:\n  max_steps: 2\n  lr: x-{SECRET}\n")
    error = one_error_line(cli(platform_env, "jobs", "submit", "train_sft", "--config-file", str(path)))
    assert SECRET not in error
    assert "line 3: an unknown key at the top level (its fields: " in error and "max_steps, " in error
    assert "line 6: `max_steps` is not a field under `optim` (its fields: betas, lr," in error
    assert "line 7: `optim.lr`: Input should be a valid number" in error
    estimate = cli(platform_env, "jobs", "estimate", "train_sft", "--config-file", str(path), "--no-wait")
    assert_shows_no_line_of(estimate, path.read_text(), path, 7)


@sqlite_only
def test_etc_shadow_prints_no_line_of_it(platform_env: dict[str, str]) -> None:
    """The issue's own case: as root the file is read and refused by its lines; else it cannot be read."""
    shadow = Path("/etc/shadow")
    result = cli(platform_env, "jobs", "submit", "train_sft", "--config-file", str(shadow))
    error = one_error_line(result)
    if os.access(shadow, os.R_OK):
        lines = [line for line in shadow.read_text().splitlines() if line.strip()]
        assert lines and not [line for line in lines if line in result.stdout + result.stderr]
        assert f"config file {shadow}" in error and "line 1" in error
    else:
        assert f"config file {shadow} cannot be read (Permission denied)" in error


def test_config_file_errors_never_echo_its_contents(platform_env: dict[str, str], tmp_path: Path) -> None:
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00secret")
    assert "is not UTF-8 text" in one_error_line(
        cli(platform_env, "jobs", "submit", "selftest", "--config-file", str(binary))
    )


def test_a_config_file_over_the_cap_is_refused_by_its_size_before_it_is_read(tmp_path: Path) -> None:
    huge = tmp_path / "huge.yaml"
    with huge.open("wb") as fh:
        fh.truncate(200 << 20)  # 200 MB of NUL bytes, sparse: no disk
    with pytest.raises(JobConfigError, match=rf"config file {re.escape(str(huge))} is over 1024 KiB, the most"):
        read_config_file(huge)
    # the same bytes under the cap are read, and refused for what they hold: the size alone refused the big one
    small = tmp_path / "small.yaml"
    small.write_bytes(b"\0" * 1000)
    with pytest.raises(JobConfigError, match="control character YAML does not allow"):
        read_config_file(small)
    at_cap = tmp_path / "at_cap.yaml"
    body = b"steps: 1\n"
    at_cap.write_bytes(b"#" * (MAX_CONFIG_FILE_BYTES - len(body) - 1) + b"\n" + body)
    assert read_config_file(at_cap).data == {"steps": 1}
    at_cap.write_bytes(at_cap.read_bytes() + b"\n")
    with pytest.raises(JobConfigError, match="is over 1024 KiB"):
        read_config_file(at_cap)


@sqlite_only
def test_a_huge_config_file_is_refused_as_fast_as_a_small_one(platform_env: dict[str, str], tmp_path: Path) -> None:
    """Against a same-run peer: the command refusing a 200 MB file takes about what it takes to refuse a
    one-line file (reading and parsing the big one took over 120 s and 680 MB before the cap)."""
    huge, small = tmp_path / "huge.yaml", tmp_path / "small.yaml"
    with huge.open("wb") as fh:
        fh.truncate(200 << 20)
    small.write_text("steps: [1]\n")
    took = {}
    for path in (small, huge, small, huge):
        started = time.perf_counter()
        one_error_line(cli(platform_env, "jobs", "submit", "selftest", "--config-file", str(path)))
        took[path] = min(took.get(path, math.inf), time.perf_counter() - started)
    assert took[huge] < 3 * took[small], took


def test_a_tiers_file_a_job_names_is_refused_without_its_contents(platform_env: dict[str, str]) -> None:
    """A deploy job may name any file in the data directory as its tiers file (the console's API key, say)."""
    data = Path(platform_env["POSTTRAIN_DATA_DIR"])
    data.mkdir(parents=True, exist_ok=True)
    bad_tier = f'{{"name": "{SECRET}-n", "prompt_lookup_min_ngram": 8, "prompt_lookup_max_ngram": 2}}'
    planted = {"key.api-key": (f"pt-4f9c2a1b07de_{SECRET}", "(file): json_invalid"),
               "tiers.json": (f'{{"tiers": {{"{SECRET}": {bad_tier}}}}}', "tiers.<tier>: value_error")}  # fmt: skip
    for name, (text, problem) in planted.items():
        (data / name).write_text(text)
        with pytest.raises(
            BadInput, match=f"tiers file {re.escape(str(data / name))} is not a tier catalog"
        ) as refused:
            tier_catalog(get_settings(), data / name)
        assert SECRET not in str(refused.value) and f"({problem})" in str(refused.value)


@pytest.mark.parametrize("priority", ["99999999999", "-99999999999"])
def test_an_out_of_range_priority_is_one_line(platform_env: dict[str, str], db_url: str, priority: str) -> None:
    before = job_count(db_url)
    line = one_error_line(cli(platform_env, "jobs", "submit", "selftest", "--priority", priority))
    assert f"priority {priority} is out of range" in line
    assert job_count(db_url) == before
