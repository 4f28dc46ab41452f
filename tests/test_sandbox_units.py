"""Sandbox pieces that need no process: config, tool-call parsing, tool schemas, results."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from pydantic import ValidationError

from posttrain.platform.sandbox import (
    TOOL_SCHEMAS,
    CallError,
    CallStatus,
    SandboxConfig,
    ToolCall,
    ToolResult,
    parse_tool_calls,
    tool_schemas,
)
from posttrain.platform.sandbox.tools import validate_arguments


def test_config_defaults_and_validation(tmp_path: Path) -> None:
    config = SandboxConfig()
    assert config.backend == "bwrap"
    assert config.pool_size >= 1
    assert config.resolved_root(tmp_path) == tmp_path / "sandboxes"
    assert config.resolved_root(None) is None
    assert SandboxConfig(root_dir=tmp_path / "x").resolved_root(tmp_path) == tmp_path / "x"
    with pytest.raises(ValidationError):
        SandboxConfig(backend="docker")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        SandboxConfig(pool_size=0)
    with pytest.raises(ValidationError):
        SandboxConfig(pool_sise=3)  # type: ignore[call-arg]  # a typo is an error, not ignored


def test_config_reads_nested_env_style_values() -> None:
    # The lead nests the model into pydantic-settings; values arrive as strings.
    config = SandboxConfig.model_validate({"pool_size": "8", "backend": "process", "ro_binds": ["/opt/venv"]})
    assert config.pool_size == 8 and config.backend == "process" and config.ro_binds == ("/opt/venv",)


def test_tool_schemas_are_valid_openai_function_schemas() -> None:
    schemas = tool_schemas()
    assert [s["function"]["name"] for s in schemas] == ["python", "bash", "read_file", "write_file", "list_dir"]
    for schema in schemas:
        assert schema["type"] == "function"
        assert schema["function"]["description"]
        jsonschema.Draft202012Validator.check_schema(schema["function"]["parameters"])
    json.dumps(schemas)  # serialisable as is
    with pytest.raises(ValueError, match="unknown tools"):
        tool_schemas(["python", "browser"])


def test_validate_arguments() -> None:
    assert validate_arguments("python", {"code": "1"}) is None
    assert "needs" in (validate_arguments("python", {}) or "")
    assert "must be a string" in (validate_arguments("bash", {"command": 3}) or "")
    assert "no argument" in (validate_arguments("read_file", {"path": "a", "mode": "r"}) or "")
    # The quick in-process check agrees with a full JSON-schema validation.
    samples = [{}, {"code": "1"}, {"command": "ls"}, {"path": "a"}, {"path": "a", "content": "b"},
               {"path": "a", "content": "b", "append": True}, {"path": 1}, {"path": "a", "content": "b", "x": 1}]
    for name, schema in TOOL_SCHEMAS.items():
        validator = jsonschema.Draft202012Validator(schema["function"]["parameters"])
        for args in samples:
            assert validator.is_valid(args) == (validate_arguments(name, args) is None), (name, args)


def test_parse_openai_tool_calls() -> None:
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "python", "arguments": '{"code": "1+1"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "bash", "arguments": "{not json"}},
        ],
    }
    parsed = parse_tool_calls(message)
    assert parsed.content == ""
    assert parsed.calls[0] == ToolCall(name="python", arguments={"code": "1+1"}, id="call_1")
    assert parsed.calls[1].name == "bash" and parsed.calls[1].error is not None
    assert "not valid JSON" in parsed.calls[1].error


def test_parse_hermes_tool_calls() -> None:
    text = (
        "Let me compute.\n<tool_call>\n{\"name\": \"python\", \"arguments\": {\"code\": \"print(2)\"}}\n</tool_call>\n"
        '<tool_call>{"name": "list_dir", "arguments": "{}"}</tool_call>'
    )
    parsed = parse_tool_calls(text)
    assert parsed.content == "Let me compute."
    assert [(c.name, c.arguments) for c in parsed.calls] == [("python", {"code": "print(2)"}), ("list_dir", {})]
    assert parsed.calls[0].id != parsed.calls[1].id
    # An unclosed block at the end of generation still counts; garbage is reported, not dropped.
    parsed = parse_tool_calls('<tool_call>{"name": "bash", "arguments": {"command": "ls"}}')
    assert parsed.calls[0].arguments == {"command": "ls"}
    bad = parse_tool_calls("<tool_call>{'name': 'bash'}</tool_call>").calls[0]
    assert bad.error is not None and "valid JSON" in bad.error
    assert parse_tool_calls("The answer is 4.").calls == []
    assert parse_tool_calls({"role": "assistant", "content": "4"}).content == "4"


def test_result_message_content() -> None:
    ok = ToolResult(tool="python", status=CallStatus.OK, stdout="hi\n", value="42")
    assert ok.ok and ok.to_message_content() == "hi\n\n42"
    failed = ToolResult(
        tool="bash", status=CallStatus.ERROR, stderr="boom", exit_code=2, error=CallError("ExitStatus", "exit status 2")
    )
    text = failed.to_message_content()
    assert "[status: error]" in text and "boom" in text and "exit code 2" in text
    assert not failed.is_infrastructure_failure
    assert ToolResult(tool="x", status=CallStatus.INFRA).is_infrastructure_failure
