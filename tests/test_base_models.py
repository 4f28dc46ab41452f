"""Base models (no chat template) are first-class: the registry knows them, serving answers their prompts on
/v1/completions and refuses chat with a message naming the fix, and a chat template assigned at import is
stored with the model and survives export (GGUF and HF) and re-import."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
from conftest import OPERATOR
from drills import ChatExample, memorize

from posttrain.platform.db import migrate
from posttrain.platform.engines import DEFAULT_TIERS, EngineConfig, ModelDirError, inspect_model_dir, load_model
from posttrain.platform.engines.chat_template import CHAT_TEMPLATE, GEMMA_TEMPLATE
from posttrain.platform.models import TinyModelSpec, build_tiny_model
from posttrain.platform.models.exporter import export_model
from posttrain.platform.models.importer import CHECK_PROMPT, assign_template, import_model
from posttrain.platform.serving import (
    Deployment,
    EmbeddedEngine,
    GatewayConfig,
    create_engine_app,
    create_gateway_app,
    serve_in_thread,
)

SMALL = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)


def base_model_dir(root: Path, *, answers_in: tuple[str, ...] = ()) -> Path:
    """A tiny model directory without a chat template: what a pretrained base model's looks like. With
    ``answers_in`` (templates), its weights first learn to answer the importer's check question in each of them
    (a random tiny model says nothing but special tokens, which the importer's check refuses)."""
    path = build_tiny_model(root / "base", TinyModelSpec(**SMALL))
    for template in answers_in:
        assign_template(path, template)
        # every step of the 40: the check asks in the plain completion format too, which only the drill's steps
        # beyond saying it in the template teach
        memorize(path, [ChatExample([{"role": "user", "content": CHECK_PROMPT}], "Paris")], steps=40, until_said=False)
    (path / "chat_template.jinja").unlink(missing_ok=True)
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config.pop("chat_template", None)
    config_file.write_text(json.dumps(config))
    assert not inspect_model_dir(path).has_chat_template
    return path


def test_an_assigned_template_is_stored_with_the_model_and_survives_export_and_reimport(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'models.db'}"
    migrate.upgrade(url)
    base, models = base_model_dir(tmp_path, answers_in=(GEMMA_TEMPLATE, CHAT_TEMPLATE)), tmp_path / "models"
    row = import_model(OPERATOR, base, name="base", url=url, dest_root=models)
    assert row.meta["chat_template"] is False and "chat_template_assigned" not in row.meta  # the registry: a base model
    with pytest.raises(
        ModelDirError,
        match=r"chat template 'llama9' is neither a family \(chatml, gemma\), completion "
        r"\(the plain completion format\) nor a Jinja",
    ):
        import_model(OPERATOR, base, name="other", chat_template="llama9", url=url, dest_root=models)
    assert not (models / "other").exists()
    chat = import_model(OPERATOR, base, name="base-gemma", chat_template="gemma", url=url, dest_root=models)
    assert chat.meta["chat_template"] is True and chat.meta["chat_template_assigned"] == "gemma"
    assert load_model(chat.path).tokenizer.chat_template == GEMMA_TEMPLATE and chat.meta["check_answer"] == "Paris"
    assert (
        import_model(OPERATOR, base, name="base-gemma", chat_template="gemma", url=url, dest_root=models).id == chat.id
    )
    with pytest.raises(ModelDirError, match="imported already from this source with gemma chat template"):
        import_model(OPERATOR, base, name="base-gemma", chat_template="chatml", url=url, dest_root=models)
    own = import_model(OPERATOR, base, name="base-own", chat_template=CHAT_TEMPLATE, url=url, dest_root=models)
    assert (
        own.meta["chat_template_assigned"] == "custom" and load_model(own.path).tokenizer.chat_template == CHAT_TEMPLATE
    )
    for fmt, out in (
        ("gguf", tmp_path / "exports" / "base-gemma.gguf"),
        ("hf", tmp_path / "exports" / "base-gemma-hf"),
    ):
        export_model(chat.path, out, fmt, outtype="f16")  # type: ignore[arg-type]
        back = import_model(OPERATOR, out, name=f"back-{fmt}", url=url, dest_root=models)
        assert back.meta["chat_template"] is True, fmt
        assert load_model(back.path).tokenizer.chat_template == GEMMA_TEMPLATE, fmt


def test_a_base_model_answers_completions_and_refuses_chat_naming_the_fix(tmp_path: Path) -> None:
    """Straight to the engine and through the gateway (which refuses before any deployment is asked)."""
    engine = EmbeddedEngine(
        EngineConfig(
            model_path=str(base_model_dir(tmp_path)),
            served_model_name="raw",
            tier=DEFAULT_TIERS["fast"],
            max_model_len=256,
        )
    ).start()
    server = serve_in_thread(create_engine_app(engine))
    gateway = serve_in_thread(
        create_gateway_app(
            GatewayConfig(deployments=[Deployment(model="raw", tier="fast", base_url=server.base_url, chat=False)])
        )
    )
    try:
        for where in (server, gateway):
            client = openai.OpenAI(base_url=where.base_url + "/v1", api_key="unused", max_retries=0)
            with pytest.raises(openai.BadRequestError) as refused:
                client.chat.completions.create(model="raw", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
            message = refused.value.body["message"]  # type: ignore[index]
            assert message.startswith("`raw` is a base model: it has no chat template"), message
            assert "/v1/completions" in message and "--chat-template gemma|chatml" in message
            out = client.completions.create(model="raw", prompt="Once upon a time", max_tokens=5, temperature=0)
            assert out.usage is not None and out.usage.completion_tokens >= 1 and isinstance(out.choices[0].text, str)
    finally:
        gateway.stop()
        server.stop()
        engine.stop()


def test_a_base_model_is_evaluated_in_the_plain_completion_format(tmp_path: Path) -> None:
    """Evaluation renders a base model's tasks as text (worked examples as earlier questions and answers, then
    "Answer:") and cuts its continuation where it goes on to a question of its own; training loads it the same way
    (``tests/test_base_model_training.py`` trains it), unless given a chat template."""
    import jinja2
    import torch

    from posttrain.platform.engines.chat_template import COMPLETION_TEMPLATE, completion_answer
    from posttrain.training.config import EvalConfig
    from posttrain.training.evaluate import evaluate_policy
    from posttrain.training.modeling import load_policy

    base = base_model_dir(tmp_path)
    _, tokenizer = load_policy(base)
    assert tokenizer.chat_template == COMPLETION_TEMPLATE
    text = tokenizer.apply_chat_template(
        [
            {"role": "system", "content": "Add."},
            {"role": "user", "content": "1 + 1?"},
            {"role": "assistant", "content": "\\boxed{2}"},
            {"role": "user", "content": "2 + 2?"},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert (
        text
        == (tokenizer.bos_token or "") + "Add.\n\nQuestion: 1 + 1?\nAnswer: \\boxed{2}\n\nQuestion: 2 + 2?\nAnswer:"
    )
    with pytest.raises(jinja2.TemplateError, match="no tool calls or tool results"):
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}], tokenize=False
        )
    assert completion_answer(" \\boxed{4}\n\nQuestion: 3 + 3?\nAnswer: 6") == "\\boxed{4}"
    assert load_policy(base, chat_template="chatml")[1].chat_template != COMPLETION_TEMPLATE
    torch.manual_seed(0)
    report = evaluate_policy(
        EvalConfig(
            model=str(base), domains=["arith.add.int"], difficulty=2, tasks_per_domain=4, max_new_tokens=8, device="cpu"
        )
    )
    assert report["eval/arith.add.int/pass@1"] == 0.0 and "eval/pass@1" in report  # a random model, but evaluated


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_base_models_sft_run_registers_a_model_in_the_template_it_trained_in(
    platform_env: dict[str, str], tmp_path: Path
) -> None:
    """An SFT run given a chat template trains a base model in it; the model it registers renders in it too (and so
    is evaluated and served in it, not in the completion format) and ends its replies where the template ends a
    turn."""
    from conftest import run_worker_until_idle

    from posttrain.platform.db.models import JobStatus
    from posttrain.platform.jobs import queue
    from posttrain.platform.models.registry import get_model, register_model

    register_model(OPERATOR, "raw", base_model_dir(tmp_path))
    job_id = queue.submit(
        OPERATOR,
        "train_sft",
        {
            "preset": "cpu-demo",
            "model": "raw",
            "chat_template": "chatml",
            "max_steps": 2,
            "checkpoint_every": 2,
            "register_as": "raw-sft",
        },
    )
    run_worker_until_idle(platform_env)
    job = queue.get_job(job_id)
    assert job.status is JobStatus.succeeded, job.error
    trained = load_model(get_model("raw-sft").path)
    assert trained.tokenizer.chat_template == CHAT_TEMPLATE
    assert trained.tokenizer.convert_tokens_to_ids("<|im_end|>") in trained.eos_token_ids
