"""Job-config paths and config text under hostile input: a batch of paths that try to leave the data
directory, submitted through the real queue (``queue.submit(OPERATOR, ...)``, real validation, real
database), and a batch of config texts through the real parser (duplicate keys in YAML and JSON,
unsafe tags, non-plain keys, deep nesting). A path is handled cleanly when the submit is refused with
a :class:`JobConfigError` naming the field and no job row is written, or (for a name that only looks
odd) when it is accepted resolved inside the data directory. A text is handled cleanly when it is
refused with a :class:`JobConfigError` naming its source and echoing none of its contents.

Records ``reliability.inputs(..., category="config_paths")``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from conftest import OPERATOR, Reliability
from test_jobs import job_count

from posttrain.platform.jobs import queue
from posttrain.platform.jobs.registry import JobConfigError, parse_config_text

CATEGORY = "config_paths"
SECRET = "hunter2-SECRET-token"


def _path_cases(data: Path, outside: Path) -> list[tuple[str, dict, str]]:
    """(kind, config, field) for each hostile path."""
    link = data / "innocent"
    link.symlink_to(outside, target_is_directory=True)  # inside the data dir, pointing out of it
    (data / "runs").mkdir(exist_ok=True)
    (data / "runs" / "deep").symlink_to("/etc")
    sft = {"preset": "cpu-demo", "model": "tiny"}
    paths = [
        "/etc",
        "/",
        "/root/.ssh",
        str(outside / "run"),  # absolute, outside
        "../elsewhere",
        "runs/../../elsewhere",
        "runs/a/../../../../etc",
        "../" * 64 + "etc",
        "./../x",  # .. escapes
        f"{data}/../escape",
        f"{data}/runs/../../escape",  # absolute, starting inside then leaving
        "innocent/run",
        "innocent/",
        "./innocent",
        "runs/deep/passwd",  # symlinks inside the data dir pointing out
        "~",
        "~/run",
        "~root/run",  # home directories
        "/" + "x" * 5000,
        "/" + "a/" * 3000 + "b",  # very long, outside
        "//etc/passwd",
        "/./etc/../etc",  # odd spellings of outside
    ]
    cases = [("train_sft", {**sft, "output_dir": p}, "output_dir") for p in paths]
    cases += [
        ("train_grpo", {"preset": "cpu-demo", "model": "../../../../etc"}, "model"),
        ("train_grpo", {"preset": "cpu-demo", "model": "innocent/model"}, "model"),
        ("evaluate", {"models": ["tiny", "innocent/m"], "domains": ["arith.add.int"], "difficulty": 3}, "models[1]"),
        ("deploy", {"model": "tiny", "tiers_file": "~/../../etc/shadow"}, "tiers_file"),
        ("build_tasks", {"task_set": "x", "source": {"type": "jsonl", "path": "innocent/tasks.jsonl"}}, "source.path"),
        ("import_model", {"source": "../../../usr/share/model.gguf"}, "source"),
    ]
    return cases


# Strings that are not paths to anywhere outside: refused, or kept inside the data directory.
ODD = [
    "file:///etc/passwd",
    "http://169.254.169.254/latest/meta-data/",
    "s3://bucket/../../etc",  # URL-ish
    "runs/a\x00/../../../etc/passwd",
    "\x00/etc/passwd",
    "/etc\x00",  # NUL bytes
    "runs/" + "a" * 300 + "/x",
    "runs/" + "b/" * 3000 + "c",  # very long, inside
]


def _inside(value: str, data: Path) -> bool:
    return Path(value).resolve().is_relative_to(data)


def test_hostile_job_paths_are_refused_at_submit(
    platform_env: dict[str, str], db_url: str, tmp_path: Path, reliability: Reliability
) -> None:
    data = Path(platform_env["POSTTRAIN_DATA_DIR"])
    data.mkdir(parents=True, exist_ok=True)
    data = data.resolve()
    outside = tmp_path / "outside"
    outside.mkdir()
    cases = _path_cases(data, outside)
    refused, accepted, problems = 0, 0, []
    for kind, config, field in cases:
        before = job_count(db_url)
        try:
            job = queue.submit(OPERATOR, kind, config)
            problems.append((kind, field, repr(config), f"accepted as job {job}"))
        except JobConfigError as exc:
            if (
                re.search(re.escape(field) + ": .* is outside the data directory", str(exc))
                and job_count(db_url) == before
            ):
                refused += 1
            else:
                problems.append((kind, field, str(exc)[:300], job_count(db_url) - before))
        except Exception as exc:  # noqa: BLE001 - anything but a clear JobConfigError is mishandled
            problems.append((kind, field, repr(exc)[:300]))
    for value in ODD:
        before = job_count(db_url)
        try:
            job = queue.submit(OPERATOR, "train_sft", {"preset": "cpu-demo", "model": "tiny", "output_dir": value})
        except JobConfigError as exc:
            if "output_dir" in str(exc) and job_count(db_url) == before:
                refused += 1
            else:
                problems.append(("train_sft", repr(value[:80]), str(exc)[:300]))
            continue
        except Exception as exc:  # noqa: BLE001
            problems.append(("train_sft", repr(value[:80]), repr(exc)[:300]))
            continue
        stored = queue.get_job(job).config["output_dir"]
        if _inside(stored, data):
            accepted += 1
        else:
            problems.append(("train_sft", repr(value[:80]), f"stored as {stored[:200]}"))
    valid = queue.submit(OPERATOR, "train_sft", {"preset": "cpu-demo", "model": "tiny", "output_dir": "runs/ok"})
    ok = queue.get_job(valid).config["output_dir"] == str(data / "runs" / "ok")
    reliability.inputs(
        "job config paths at queue.submit",
        tried=len(cases) + len(ODD) + 1,
        refused_cleanly=refused,
        accepted=accepted + int(ok),
        category=CATEGORY,
        database=db_url.split(":")[0],
        problems=problems,
    )
    assert not problems, problems
    assert refused >= len(cases) and ok


YAML_CASES = {
    "top-level duplicate": f"preset: cpu-demo\nmax_steps: 5\nmax_steps: {SECRET}\n",
    "nested duplicate": f"optim:\n  lr: 1\n  lr: {SECRET}\n",
    "duplicate spelled two ways": f'steps: 1\n"steps": {SECRET}\n',
    "duplicate after a merge key": f"base: &b {{lr: 1}}\nopt:\n  <<: *b\n  x: 1\n  x: {SECRET}\n",
    "duplicate in a list item": f"items:\n  - a: 1\n    a: {SECRET}\n",
    "duplicate in flow style": f"{{a: 1, b: {SECRET}, a: 2}}\n",
    "python object tag": f"x: !!python/object/apply:os.system ['echo {SECRET}']\n",
    "python name tag": f"x: !!python/name:os.system {SECRET}\n",
    "a list as a key": f"? [a, b]\n: {SECRET}\n",
    "a mapping as a key": f"? {{a: 1}}\n: {SECRET}\n",
    "deep nesting": "[" * 50_000 + SECRET + "]" * 50_000,
    "unclosed": f"password: [{SECRET}, unclosed\n",
    "tab indentation": f"key:\n\t{SECRET}: 1\n",
}
JSON_CASES = {
    "top-level duplicate": f'{{"steps": 1, "steps": "{SECRET}"}}',
    "nested duplicate": f'{{"optim": {{"lr": 1, "lr": "{SECRET}"}}}}',
    "duplicate by escape": f'{{"steps": 1, "st\\u0065ps": "{SECRET}"}}',
    "duplicate in a list item": f'{{"items": [{{"a": 1, "a": "{SECRET}"}}]}}',
    "deep nesting": "[" * 100_000 + f'"{SECRET}"' + "]" * 100_000,
    "trailing garbage": f'{{"steps": 1}} {SECRET}',
}


def test_hostile_config_texts_are_refused_without_echoing_them(reliability: Reliability) -> None:
    refused, problems = 0, []
    cases = [(name, text, False) for name, text in YAML_CASES.items()]
    cases += [(name, text, True) for name, text in JSON_CASES.items()]
    for name, text, json_only in cases:
        source = "--config" if json_only else "run.yaml"
        try:
            parsed = parse_config_text(text, source, json_only=json_only)
            problems.append((name, "parsed", repr(parsed)[:200]))
        except JobConfigError as exc:
            message = str(exc)
            if message.startswith(source) and SECRET not in message and len(message) < 500:
                refused += 1
            else:
                problems.append((name, message[:300]))
        except Exception as exc:  # noqa: BLE001 - anything but a clear JobConfigError is mishandled
            problems.append((name, repr(exc)[:300]))
    valid_yaml = parse_config_text("preset: cpu-demo\noptim: {lr: 1}\nsteps: 5\n", "run.yaml")
    valid_json = parse_config_text('{"steps": 5, "optim": {"lr": 1}}', "--config", json_only=True)
    accepted = int(valid_yaml == {"preset": "cpu-demo", "optim": {"lr": 1}, "steps": 5}) + int(
        valid_json == {"steps": 5, "optim": {"lr": 1}}
    )
    reliability.inputs(
        "job config text (YAML and JSON)",
        tried=len(cases) + 2,
        refused_cleanly=refused,
        accepted=accepted,
        category=CATEGORY,
        problems=problems,
    )
    assert not problems, problems
    assert accepted == 2


def test_a_symlinked_data_dir_entry_cannot_redirect_a_running_job(
    platform_env: dict[str, str], tmp_path: Path, reliability: Reliability
) -> None:
    """A path accepted at submit and swapped for a symlink to outside before the job starts is
    refused when the stored config is validated again (the worker does this at start)."""
    from posttrain.platform.jobs.registry import validate_config

    data = Path(platform_env["POSTTRAIN_DATA_DIR"])
    data.mkdir(parents=True, exist_ok=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    names = ["runs/swap", "models/swap", "tasks/swap"]
    stored = []
    for name in names:  # fine now: stored as the worker will read it back
        config = validate_config("train_sft", {"preset": "cpu-demo", "model": "tiny", "output_dir": name})
        stored.append(config.model_dump(mode="json"))
        target = data / name
        target.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(outside, target)  # swapped after submit
    refused, problems = 0, []
    for name, config in zip(names, stored):
        try:
            validate_config("train_sft", config)  # what the worker runs before it starts the job
            problems.append((name, "accepted after the swap"))
        except JobConfigError as exc:
            if "output_dir" in str(exc) and "outside the data directory" in str(exc):
                refused += 1
            else:
                problems.append((name, str(exc)[:300]))
    reliability.inputs(
        "job config paths swapped for symlinks after submit",
        tried=len(names),
        refused_cleanly=refused,
        category=CATEGORY,
        problems=problems,
    )
    assert not problems, problems
