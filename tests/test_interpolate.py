"""Weight interpolation (WiSE-FT), a forgetting control of issue 47: the ends are each model bit for bit, the middle
is the arithmetic, a mismatch or an alpha outside [0, 1] is refused naming the input, the command line and the
``interpolate_model`` job write and register it, and the job picks alpha on train-split tasks only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import OPERATOR, run_worker_until_idle
from safetensors.torch import load_file
from test_cli import cli, one_error_line

from posttrain.platform.auth import Identity, PermissionDenied, audit_log
from posttrain.platform.db.models import JobStatus, Role
from posttrain.platform.engines import load_model
from posttrain.platform.jobs import queue
from posttrain.platform.jobs.registry import JobConfigError, validate_config
from posttrain.platform.models import TinyModelSpec, build_tiny_model
from posttrain.platform.models.interpolate import InterpolationError, interpolate_dirs, interpolate_models
from posttrain.platform.models.registry import ModelNotFound, get_model, register_model
from posttrain.platform.tasks.domains import generate, prompt_split
from posttrain.training.config import GENERAL_DOMAINS
from posttrain.training.evaluate import general_config
from posttrain.training.interpolation import Candidate, InterpolateConfig, pick, validation_tasks
from posttrain.training.preset_recipes import REPAIR_ENV

SMALL = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
VALIDATION_DOMAINS = ["arith.add.signed", "compare.smaller.int"]  # both hold out prompts at difficulty 1


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A (seed 0), B (seed 1) of the same shape, and C of another width."""
    root = tmp_path_factory.mktemp("pair")
    return {"a": build_tiny_model(root / "a", TinyModelSpec(**SMALL, seed=0)),
            "b": build_tiny_model(root / "b", TinyModelSpec(**SMALL, seed=1)),
            "c": build_tiny_model(root / "c", TinyModelSpec(**{**SMALL, "hidden_size": 64}, seed=2))}  # fmt: skip


def weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a directory's safetensors files."""
    found: dict[str, torch.Tensor] = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        found |= load_file(str(file))
    return found


def loaded_state(model_dir: Path) -> dict[str, torch.Tensor]:
    """The state dict as the platform's one loader gives it."""
    return {k: v.detach().clone() for k, v in load_model(model_dir).model.state_dict().items()}


def assert_bit_equal(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor]) -> None:
    assert sorted(left) == sorted(right)
    for name in left:
        assert left[name].dtype == right[name].dtype and torch.equal(left[name], right[name]), name


def test_the_ends_are_each_model_bit_for_bit_and_the_middle_is_the_midpoint(
    pair: dict[str, Path], tmp_path: Path
) -> None:
    a, b = weights(pair["a"]), weights(pair["b"])
    assert any(not torch.equal(a[k], b[k]) for k in a), "A and B must differ for the test to mean anything"
    start = interpolate_dirs(pair["a"], pair["b"], tmp_path / "start", 0.0)
    end = interpolate_dirs(pair["a"], pair["b"], tmp_path / "end", 1.0)
    middle = interpolate_dirs(pair["a"], pair["b"], tmp_path / "middle", 0.5)
    # the files' tensors
    assert_bit_equal(weights(start), a)
    assert_bit_equal(weights(end), b)
    assert (start / "model.safetensors").read_bytes() == (pair["a"] / "model.safetensors").read_bytes()
    # and the loaded models' (config and tokenizer are B's: the same shapes, A's weights)
    assert_bit_equal(loaded_state(start), loaded_state(pair["a"]))
    assert_bit_equal(loaded_state(end), loaded_state(pair["b"]))
    mid = weights(middle)
    assert sorted(mid) == sorted(a)
    for name, value in mid.items():
        assert value.dtype == a[name].dtype
        torch.testing.assert_close(value, (a[name] + b[name]) / 2, rtol=0, atol=1e-6)
    assert any(not torch.equal(mid[k], a[k]) and not torch.equal(mid[k], b[k]) for k in mid)
    for made in (start, end, middle):  # tokenizer, config and chat template: B's
        for file in ("tokenizer.json", "config.json", "chat_template.jinja", "generation_config.json"):
            assert (made / file).read_bytes() == (pair["b"] / file).read_bytes(), (made.name, file)
    quarter = weights(interpolate_dirs(pair["a"], pair["b"], tmp_path / "quarter", 0.25))
    name = "model.layers.0.mlp.up_proj.weight"
    torch.testing.assert_close(quarter[name], 0.75 * a[name] + 0.25 * b[name], rtol=0, atol=1e-6)


def test_a_bfloat16_pair_is_blended_in_float32_and_stored_in_bfloat16(pair: dict[str, Path], tmp_path: Path) -> None:
    halves = {}
    for end in ("a", "b"):
        loaded = load_model(pair[end], dtype=torch.bfloat16)
        loaded.model.save_pretrained(tmp_path / f"{end}16")
        loaded.tokenizer.save_pretrained(tmp_path / f"{end}16")
        halves[end] = weights(tmp_path / f"{end}16")
    assert all(v.dtype == torch.bfloat16 for v in halves["a"].values())
    blended = weights(interpolate_dirs(tmp_path / "a16", tmp_path / "b16", tmp_path / "out", 0.3))
    for name, value in blended.items():
        a, b = halves["a"][name].float(), halves["b"][name].float()
        assert value.dtype == torch.bfloat16
        assert torch.equal(value, (a * 0.7 + b * 0.3).to(torch.bfloat16)), name  # one rounding, from float32
    with pytest.raises(InterpolationError, match="F32 in 'a', .* BF16 in 'b16'"):
        interpolate_dirs(pair["a"], tmp_path / "b16", tmp_path / "mixed", 0.5, a_label="'a'", b_label="'b16'")


def test_a_shape_mismatch_and_an_alpha_outside_0_1_are_refused_naming_the_input(
    pair: dict[str, Path], tmp_path: Path
) -> None:
    with pytest.raises(InterpolationError) as refused:
        interpolate_dirs(pair["a"], pair["c"], tmp_path / "out", 0.5, a_label="'small'", b_label="'wide'")
    message = str(refused.value)
    assert "'small'" in message and "'wide'" in message and "'model.embed_tokens.weight'" in message
    assert "[1024, 32] F32 in 'small', [1024, 64] F32 in 'wide'" in message and "trained from" in message
    for alpha in (1.5, -0.1, float("nan")):
        with pytest.raises(InterpolationError, match=rf"alpha {alpha!r} is outside \[0, 1\]: give --alpha between 0"):
            interpolate_dirs(pair["a"], pair["b"], tmp_path / "out", alpha)
    assert list(tmp_path.iterdir()) == [], "a refused interpolation leaves nothing behind, not even a temporary"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_action_registers_it_with_its_lineage_audits_it_and_refuses_a_viewer(
    platform_env: dict[str, str], pair: dict[str, Path]
) -> None:
    register_model(OPERATOR, "start", pair["a"])
    register_model(OPERATOR, "trained", pair["b"], base="start")
    viewer = Identity("viv", Role.viewer)
    with pytest.raises(
        PermissionDenied, match="viv \\(viewer\\) may not model.interpolate: it needs the operator role"
    ):
        interpolate_models(viewer, "start", "trained", 0.5, name="refused")
    models = Path(platform_env["POSTTRAIN_DATA_DIR"]) / "models"
    assert not models.exists() or not any(models.iterdir())
    with pytest.raises(ModelNotFound, match="model B of the interpolation: no model named 'ghost'"):
        interpolate_models(OPERATOR, "start", "ghost", 0.5)
    with pytest.raises(InterpolationError, match="alpha 1.5 is outside"):
        interpolate_models(OPERATOR, "start", "trained", 1.5)
    row = interpolate_models(OPERATOR, "start", "trained", 0.25)
    assert row.name == "trained-alpha0.25" and Path(row.path) == models / "trained-alpha0.25"
    assert row.base_model_id == get_model("start").id
    assert row.meta["interpolated"] == {"a": "start", "b": "trained", "alpha": 0.25}
    with pytest.raises(InterpolationError, match="'trained-alpha0.25' is registered already"):
        interpolate_models(OPERATOR, "start", "trained", 0.25)
    entries = [(e.username, e.action, e.target) for e in audit_log(limit=20)]
    assert ("test-operator", "model.interpolate", "trained-alpha0.25") in entries
    assert ("viv", "denied", "model.interpolate") in entries


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_command_line_interpolates_and_refuses_in_one_line(
    platform_env: dict[str, str], pair: dict[str, Path]
) -> None:
    register_model(OPERATOR, "start", pair["a"])
    register_model(OPERATOR, "trained", pair["b"], base="start")
    register_model(OPERATOR, "wide", pair["c"])
    done = cli(platform_env, "models", "interpolate", "start", "trained", "--alpha", "0.5", "--name", "halfway")
    assert done.returncode == 0, done.stderr
    assert "registered halfway: 0.5 x start + 0.5 x trained" in done.stdout
    listed = {m["name"]: m for m in json.loads(cli(platform_env, "models", "list", "--json").stdout)}
    assert listed["halfway"]["base"] == "start"
    mid = weights(Path(listed["halfway"]["path"]))
    a, b = weights(pair["a"]), weights(pair["b"])
    for name in mid:
        torch.testing.assert_close(mid[name], (a[name] + b[name]) / 2, rtol=0, atol=1e-6)
    line = one_error_line(cli(platform_env, "models", "interpolate", "start", "trained", "--alpha", "1.5"))
    assert "alpha 1.5 is outside [0, 1]: give --alpha between 0" in line
    line = one_error_line(cli(platform_env, "models", "interpolate", "start", "wide", "--alpha", "0.5"))
    assert "models 'start' and 'wide' differ at tensor 'model.embed_tokens.weight'" in line
    line = one_error_line(cli(platform_env, "models", "interpolate", "start", "nowhere", "--alpha", "0.5"))
    assert "model B of the interpolation: no model named 'nowhere'" in line
    assert sorted(p.name for p in (Path(platform_env["POSTTRAIN_DATA_DIR"]) / "models").iterdir()) == ["halfway"]


def test_the_job_config_needs_alpha_or_alphas_with_domains() -> None:
    ok = {"a": "start", "b": "trained"}
    validate_config("interpolate_model", {**ok, "alpha": 0.3})
    validate_config("interpolate_model", {**ok, "alphas": [0, 0.5, 1], "domains": VALIDATION_DOMAINS})
    for bad, expected in [({}, "give either alpha"), ({"alpha": 0.3, "alphas": [0.5]}, "give either alpha"),
                          ({"alphas": [0, 1]}, "alphas needs domains"), ({"alpha": 1.2}, "alpha"),
                          ({"alphas": [0, 2], "domains": VALIDATION_DOMAINS}, "outside [0, 1]"),
                          ({"alphas": [0.5], "domains": ["no.such.domain"]}, "no.such.domain"),
                          ({"alphas": [0.5], "general_domains": VALIDATION_DOMAINS}, "alphas needs domains"),
                          ({"alphas": [0.5], "domains": VALIDATION_DOMAINS, "general_domains": VALIDATION_DOMAINS[:1]},
                           "list each domain once"),
                          ({"alpha": 0.5, "general_domains": VALIDATION_DOMAINS}, "with one alpha leave them out")]:  # fmt: skip
        with pytest.raises(JobConfigError, match=expected.replace("[", "\\[").replace("]", "\\]")):
            validate_config("interpolate_model", {**ok, **bad})


def test_a_tie_goes_to_the_smaller_alpha() -> None:
    found = [Candidate(alpha=x, pass_at_1=p) for x, p in [(1.0, 0.5), (0.25, 0.5), (0.5, 0.25)]]
    assert pick(found).alpha == 0.25
    assert pick([*found, Candidate(alpha=0.75, pass_at_1=0.75)]).alpha == 0.75


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_job_picks_alpha_on_train_split_tasks_only_and_registers_it(
    platform_env: dict[str, str], pair: dict[str, Path]
) -> None:
    register_model(OPERATOR, "start", pair["a"])
    register_model(OPERATOR, "trained", pair["b"], base="start")
    picking = queue.submit(OPERATOR, "interpolate_model", {
        "a": "start", "b": "trained", "alphas": [1.0, 0.0, 0.5], "domains": VALIDATION_DOMAINS[:1],
        "general_domains": VALIDATION_DOMAINS[1:], "tasks_per_domain": 5, "max_new_tokens": 4, "device": "cpu",
        "name": "picked"})  # fmt: skip
    given = queue.submit(OPERATOR, "interpolate_model", {"a": "start", "b": "trained", "alpha": 0.0})
    run_worker_until_idle(platform_env, timeout=400)
    job = queue.get_job(picking)
    assert job.status == JobStatus.succeeded, job.error
    result = job.result or {}
    assert [c["alpha"] for c in result["candidates"]] == [0.0, 0.5, 1.0]
    for c in result["candidates"]:  # the pick is over every validation task, the general check's among them
        own, general = c["domains"][VALIDATION_DOMAINS[0]], c["domains"][f"general/{VALIDATION_DOMAINS[1]}"]
        assert c["pass@1"] == pytest.approx((own + general) / 2)
    best = max(c["pass@1"] for c in result["candidates"])
    assert result["alpha"] == min(c["alpha"] for c in result["candidates"] if c["pass@1"] == best)
    assert result["split"] == "train" and result["validation_tasks"] == 10
    # the tasks it evaluated: all from the train split, none a prompt of those domains' held-out eval split
    tasks = json.loads(Path(result["validation_file"]).read_text())
    assert len(tasks) == 10 and {t["domain"] for t in tasks} == set(VALIDATION_DOMAINS)
    assert all(t["split"] == "train" and prompt_split(t["prompt"]) == "train" for t in tasks)
    for domain in VALIDATION_DOMAINS:
        held_out = {t.prompt_text for t in generate(domain, 200, seed=0, split="eval")}
        assert held_out and not held_out & {t["prompt"] for t in tasks if t["domain"] == domain}
    row = get_model("picked")
    assert row.base_model_id == get_model("start").id and row.produced_by_job_id == picking
    assert row.meta["interpolated"] == {"a": "start", "b": "trained", "alpha": result["alpha"]}
    assert row.meta["picked_on"]["split"] == "train"
    expected = interpolate_dirs(
        pair["a"], pair["b"], Path(platform_env["POSTTRAIN_DATA_DIR"]) / "check", result["alpha"]
    )
    assert_bit_equal(weights(Path(row.path)), weights(expected))
    assert not list(Path(result["validation_file"]).parent.glob("candidate-*")), "candidates are removed once evaluated"
    plain = queue.get_job(given)
    assert plain.status == JobStatus.succeeded, plain.error
    assert (plain.result or {})["candidates"] == [] and (plain.result or {})["model"] == "trained-alpha0"
    assert_bit_equal(weights(Path(get_model("trained-alpha0").path)), weights(pair["a"]))


def test_a_multi_turn_runs_validation_is_its_episodes_with_the_general_check_beside_both_in_the_train_split() -> None:
    """A repair run's alpha is picked on repair episodes of train-split modules (in the run's environment) and on the
    general check's domains as completions: the pick sees the gain it trades away and what training cost elsewhere,
    and none of it is a task the arms are measured on."""
    config = InterpolateConfig(a="start", b="trained", alphas=[0.5, 1.0], domains=["repair.off_by_one"],
                               environment=REPAIR_ENV, general_domains=GENERAL_DOMAINS[:2], difficulty=2,
                               tasks_per_domain=3)  # fmt: skip
    validation = config.validation("trained")
    assert validation.split == "train" and validation.environment is not None
    assert validation.environment.name == "code_repair" and validation.environment.multi_turn
    general = general_config(validation)
    assert general is not None and general.environment is None and general.split == "train"
    assert general.domains == GENERAL_DOMAINS[:2] and general.seed == validation.seed
    tasks = validation_tasks(config, "trained")
    assert [t.domain for t in tasks] == ["repair.off_by_one"] * 3 + [d for d in GENERAL_DOMAINS[:2] for _ in range(3)]
    assert all(t.split == "train" for t in tasks)
    repairs = {t.prompt_text for t in generate("repair.off_by_one", 200, seed=0, difficulty=2, split="eval")}
    assert repairs and not repairs & {t.prompt_text for t in tasks}
