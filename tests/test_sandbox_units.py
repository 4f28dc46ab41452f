"""Sandbox pieces that need no process: config, tool-call parsing, tool schemas, results, the seccomp
program and the cgroup tables."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import struct
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
    seccomp,
    tool_schemas,
)
from posttrain.platform.sandbox.cgroups import cgroup_mounts, directory_of, own_cgroups
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


def test_config_keeps_the_tmpfs_inside_the_memory_budget() -> None:
    with pytest.raises(ValidationError, match=r"work_size_mb \+ 2 \* tmp_size_mb \(328 MB\) must stay below memory_mb"):
        SandboxConfig(memory_mb=256, work_size_mb=200, tmp_size_mb=64)
    assert SandboxConfig(memory_mb=256, work_size_mb=64, tmp_size_mb=32).work_size_mb == 64


def test_config_reads_nested_env_style_values() -> None:
    # The lead nests the model into pydantic-settings; values arrive as strings.
    config = SandboxConfig.model_validate({"pool_size": "8", "backend": "process", "ro_binds": ["/opt/venv"]})
    assert config.pool_size == 8 and config.backend == "process" and config.ro_binds == ("/opt/venv",)


def test_tool_schemas_are_valid_openai_function_schemas() -> None:
    schemas = tool_schemas()
    assert [s["function"]["name"] for s in schemas] == [
        "python",
        "bash",
        "read_file",
        "write_file",
        "edit_file",
        "list_dir",
    ]
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
    samples = [
        {},
        {"code": "1"},
        {"command": "ls"},
        {"path": "a"},
        {"path": "a", "content": "b"},
        {"path": "a", "content": "b", "append": True},
        {"path": 1},
        {"path": "a", "content": "b", "x": 1},
    ]
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
        'Let me compute.\n<tool_call>\n{"name": "python", "arguments": {"code": "print(2)"}}\n</tool_call>\n'
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
    # The edit tool's three string arguments, newlines and quotes inside them, come through as written.
    edit = parse_tool_calls(
        '<tool_call>\n{"name": "edit_file", "arguments": {"path": "solution.py", "old": "    return a - b\\n", '
        '"new": "    return a + b  # \\"sum\\"\\n"}}\n</tool_call>'
    ).calls[0]
    assert edit.error is None and edit.arguments == {
        "path": "solution.py",
        "old": "    return a - b\n",
        "new": '    return a + b  # "sum"\n',
    }
    assert validate_arguments("edit_file", edit.arguments) is None


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


# ------------------------------------------------------------------------------- seccomp program
AUDIT_ARCH_I386 = 0x40000003
PTHREAD_CREATE_FLAGS = 0x003D0F00  # CLONE_VM|FS|FILES|SIGHAND|THREAD|SYSVSEM|SETTLS|PARENT_SETTID|CHILD_CLEARTID


def run_filter(program: bytes, arch: int, nr: int, arg0: int = 0) -> int:
    """What the kernel would make of one system call under ``program`` (the opcodes seccomp.py emits)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    code = [seccomp.INSTRUCTION.unpack_from(program, i) for i in range(0, len(program), seccomp.INSTRUCTION.size)]
    pc = acc = 0
    while True:
        op, jump_true, jump_false, k = code[pc]
        if op == seccomp.RET_K:
            return k
        if op == seccomp.LD_W_ABS:
            acc, pc = struct.unpack_from("<I", data, k)[0], pc + 1
            continue
        taken = {seccomp.JEQ_K: acc == k, seccomp.JGE_K: acc >= k, seccomp.JSET_K: bool(acc & k)}[op]
        pc += 1 + (jump_true if taken else jump_false)


@pytest.mark.parametrize("name", sorted(seccomp.ARCHES))
def test_seccomp_program_refuses_what_it_lists_and_allows_the_rest(name: str) -> None:
    arch, program = seccomp.ARCHES[name], seccomp.filter_program(name)
    eperm, enosys = seccomp.RET_ERRNO | errno.EPERM, seccomp.RET_ERRNO | errno.ENOSYS
    blocked = {arch.numbers[n] for n in seccomp.REFUSED}
    for refused in seccomp.REFUSED:
        assert run_filter(program, arch.audit_arch, arch.numbers[refused]) == eperm, refused
    clone = arch.numbers["clone"]
    for flag in (0x10000000, 0x40000000, 0x00020000, 0x20000000):  # NEWUSER, NEWNET, NEWNS, NEWPID
        assert run_filter(program, arch.audit_arch, clone, flag | 17) == eperm, hex(flag)
    assert run_filter(program, arch.audit_arch, clone, 17) == seccomp.RET_ALLOW  # fork
    assert run_filter(program, arch.audit_arch, clone, PTHREAD_CREATE_FLAGS) == seccomp.RET_ALLOW  # a thread
    assert run_filter(program, arch.audit_arch, arch.numbers["clone3"]) == enosys  # the C library falls back to clone
    for nr in range(0, 460):
        if nr not in blocked | {clone, arch.numbers["clone3"]}:
            assert run_filter(program, arch.audit_arch, nr) == seccomp.RET_ALLOW, nr
    for foreign in (AUDIT_ARCH_I386, *(a.audit_arch for a in seccomp.ARCHES.values() if a is not arch)):
        assert run_filter(program, foreign, 0) == eperm  # another numbering: refused whatever the call
    if arch.has_x32:
        assert run_filter(program, arch.audit_arch, seccomp.X32_SYSCALL_BIT | arch.numbers["mount"]) == eperm
        assert run_filter(program, arch.audit_arch, seccomp.X32_SYSCALL_BIT) == eperm


def test_seccomp_numbers_match_libseccomp() -> None:
    found = ctypes.util.find_library("seccomp")
    assert found, "libseccomp is needed to check the filter's numbers: apt-get install libseccomp2"
    resolve = ctypes.CDLL(found).seccomp_syscall_resolve_name_arch
    resolve.argtypes, resolve.restype = [ctypes.c_uint32, ctypes.c_char_p], ctypes.c_int
    for arch in seccomp.ARCHES.values():
        assert set(arch.numbers) == {*seccomp.REFUSED, "clone", "clone3"}
        for name, nr in arch.numbers.items():
            assert resolve(arch.audit_arch, name.encode()) == nr, (arch.name, name)


# ---------------------------------------------------------------------------------- cgroup tables
def test_cgroup_tables_of_a_hybrid_host() -> None:
    cgroups = own_cgroups("4:memory:/jobs/42\n8:pids:/\n9:name=systemd:/\n0::/\n")
    assert cgroups == {"memory": "/jobs/42", "pids": "/", "systemd": "/", "": "/"}
    mounts = cgroup_mounts(
        "35 25 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "36 25 0:32 /jobs /sys/fs/cgroup/my\\040jobs rw shared:9 - cgroup cgroup rw,pids,name=x\n"
        "40 25 0:35 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
        "41 25 0:36 / /tmp rw - tmpfs tmpfs rw\n"
    )
    assert [(m.fstype, str(m.point)) for m in mounts] == [
        ("cgroup", "/sys/fs/cgroup/memory"),
        ("cgroup", "/sys/fs/cgroup/my jobs"),
        ("cgroup2", "/sys/fs/cgroup/unified"),
    ]
    assert "memory" in mounts[0].options and "pids" in mounts[1].options
    assert directory_of(mounts[0], "/jobs/42") == Path("/sys/fs/cgroup/memory/jobs/42")
    assert directory_of(mounts[1], "/jobs/7") == Path("/sys/fs/cgroup/my jobs/7")
    assert directory_of(mounts[1], "/other") is None  # that cgroup is not visible under this mount
