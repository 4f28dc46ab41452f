"""API keys: created, listed and revoked by admins (library, CLI), stored as a hash, checked by the
gateway and by an engine listening beyond loopback; no server listens beyond loopback unauthenticated."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import openai
import pytest
from conftest import ADMIN, OPERATOR, wait_for
from sqlmodel import select
from test_cli import cli, one_error_line

from posttrain.platform import api_keys
from posttrain.platform.api_keys import ApiKeyError, KeyRefused, check_key, create_key, list_keys, revoke_key, shown
from posttrain.platform.auth import Identity, PermissionDenied, audit_log
from posttrain.platform.db.engine import session
from posttrain.platform.db.models import ApiKey, AuditLog, Deployment, Role
from posttrain.platform.engines import DEFAULT_TIERS, EngineConfig
from posttrain.platform.engines.launcher import ServerProcess, free_port
from posttrain.platform.failures import BadInput
from posttrain.platform.models import TinyModelSpec, build_tiny_model
from posttrain.platform.models.registry import register_model
from posttrain.platform.serving import EmbeddedEngine, GatewayConfig, create_engine_app
from posttrain.platform.serving.auth import OpenServerRefused
from posttrain.platform.serving.gateway import create_gateway_app
from posttrain.platform.serving.server import ThreadedServer, serve_in_thread
from posttrain.platform.settings import get_settings

KEY = re.compile(r"pt-([0-9a-f]{12})_([A-Za-z0-9_-]{43})")
CHAT = [{"role": "user", "content": "hello"}]
sqlite_only = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # tests that start servers: once


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(
        tmp_path_factory.mktemp("keys") / "tiny",
        TinyModelSpec(hidden_size=64, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=128),
    )


@contextlib.contextmanager
def deployed(tiny_dir: Path, name: str = "tiny") -> Iterator[str]:
    """``name`` registered and served by an in-process engine on loopback, recorded as a running
    deployment (what the gateway routes to); yields the engine's URL."""
    model = register_model(OPERATOR, name, tiny_dir)
    engine = EmbeddedEngine(EngineConfig(model_path=str(tiny_dir), served_model_name=name,
                                         tier=DEFAULT_TIERS["standard"], max_model_len=256)).start()  # fmt: skip
    server = serve_in_thread(create_engine_app(engine))
    with session() as s:
        s.add(Deployment(model_id=model.id, tier="standard", url=server.base_url, status="running", healthy=True))
    try:
        yield server.base_url
    finally:
        server.stop()
        engine.stop()


@contextlib.contextmanager
def gateway_process(env: dict[str, str], log_path: Path) -> Iterator[str]:
    """``posttrain gateway`` on loopback in a process of its own, logging at DEBUG into ``log_path``."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with log_path.open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "posttrain.platform.cli", "gateway", "--port", str(port)],
                                env={**os.environ, **env, "POSTTRAIN_LOG_LEVEL": "DEBUG"}, stdout=log,
                                stderr=subprocess.STDOUT)  # fmt: skip

    def up() -> bool:
        try:
            return proc.poll() is not None or httpx.get(base + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, timeout=120, message="the gateway answers /health")
        assert proc.poll() is None, log_path.read_text()
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_keys_are_shown_once_stored_hashed_scoped_and_revocable(
    platform_env: dict[str, str], db_url: str, tiny_dir: Path
) -> None:
    register_model(OPERATOR, "tiny", tiny_dir)
    made = create_key(ADMIN, "ci-bot", ["tiny"])
    key_id, secret = KEY.fullmatch(made.secret).groups()  # type: ignore[union-attr]
    assert made.key.key_id == key_id and made.key.models == ["tiny"] and made.key.created_by == ADMIN.username
    with session(db_url, read_only=True) as s:
        row = s.exec(select(ApiKey)).one()
        stored = " ".join(str(v) for v in row.model_dump().values())
        audited = " ".join(str(e.model_dump()) for e in s.exec(select(AuditLog)))
    assert row.secret_sha256 == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in stored and secret not in audited  # only the hash is kept, the audit names the key's id
    (listed,) = list_keys(ADMIN)
    assert listed.key_id == key_id and listed.secret_sha256 == "" and listed.last_used_at is None

    grant = check_key(made.secret)
    assert grant.name == "ci-bot" and grant.allows("tiny") and not grant.allows("other")
    assert list_keys(ADMIN)[0].last_used_at is not None
    with pytest.raises(KeyRefused, match="may not use the model `other`") as scoped:
        grant.check_model("other")
    assert scoped.value.status == 403

    wrong_secret = f"pt-{key_id}_{'A' * 43}"
    unknown = f"pt-{'0' * 12}_{secret}"
    for token, message in [(None, "this API needs a key"), ("", "this API needs a key"), ("sk-abc", "not a posttrain key"),
                           (made.secret + "x", "not a posttrain key"), (wrong_secret, f"{shown(key_id)} is not valid"),
                           (unknown, "is not valid")]:  # fmt: skip
        with pytest.raises(KeyRefused, match=re.escape(message)) as refused:
            check_key(token)
        assert refused.value.status == 401 and secret not in refused.value.message

    with pytest.raises(ApiKeyError, match="no registered model named 'nope'"):
        create_key(ADMIN, "x", ["nope"])
    with pytest.raises(ApiKeyError, match="a key's name is 1-128 printable characters"):
        create_key(ADMIN, "  ")
    revoked = revoke_key(ADMIN, shown(key_id))
    assert revoked.revoked_at is not None and revoked.revoked_by == ADMIN.username
    with pytest.raises(KeyRefused, match="was revoked on"):
        check_key(made.secret)
    with pytest.raises(ApiKeyError, match="revoked already"):
        revoke_key(ADMIN, made.secret)  # the whole key names it too
    with pytest.raises(ApiKeyError, match="not an API key id"):
        revoke_key(ADMIN, "ci-bot")
    assert not api_keys.any_active_key() and list_keys(ADMIN, include_revoked=False) == []
    actions = [(e.action, e.target) for e in audit_log()]
    assert ("key.create", shown(key_id)) in actions and ("key.revoke", shown(key_id)) in actions

    for who in (OPERATOR, Identity("viv", Role.viewer)):  # keys are an admin's
        with pytest.raises(PermissionDenied, match="may not key.create: it needs the admin role"):
            create_key(who, "sneaky")
    assert sum(1 for e in audit_log() if e.action == "denied" and e.target == "key.create") == 2
    assert len(list_keys(ADMIN)) == 1


def test_cli_keys_for_admins_only(platform_env: dict[str, str], db_url: str) -> None:
    made = cli(platform_env, "keys", "create", "ci-bot")
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    key_id = KEY.fullmatch(secret).group(1)  # type: ignore[union-attr]
    assert f"pt-{key_id} (ci-bot) for every model" in made.stderr and secret not in made.stderr
    check_key(secret)
    listed = cli(platform_env, "keys", "list")
    assert listed.returncode == 0 and f"pt-{key_id}" in listed.stdout and "ci-bot" in listed.stdout
    assert secret.split("_", 1)[1] not in listed.stdout
    with session(db_url, read_only=True) as s:
        assert s.exec(select(AuditLog).where(AuditLog.action == "key.create")).one().username.startswith("cli:")

    from posttrain.platform.auth import create_user

    create_user(ADMIN, "viv", "correct horse battery", Role.viewer)
    as_viewer = {**platform_env, "POSTTRAIN_CLI_USER": "viv"}
    assert "viv (viewer) may not key.list: it needs the admin role" in one_error_line(cli(as_viewer, "keys", "list"))
    assert "may not key.revoke" in one_error_line(cli(as_viewer, "keys", "revoke", key_id))
    assert "may not job.submit: it needs the operator role" in one_error_line(
        cli(as_viewer, "jobs", "submit", "selftest")
    )
    line = one_error_line(cli({**platform_env, "POSTTRAIN_CLI_USER": "nobody"}, "keys", "list"))
    assert "POSTTRAIN_CLI_USER='nobody' does not exist" in line
    assert "no registered model named 'nope'" in one_error_line(
        cli(platform_env, "keys", "create", "x", "--model", "nope")
    )

    assert cli(platform_env, "keys", "revoke", f"pt-{key_id}").returncode == 0
    assert "revoked already" in one_error_line(cli(platform_env, "keys", "revoke", key_id))
    assert f"pt-{key_id}" not in cli(platform_env, "keys", "list").stdout  # revoked keys: with --all
    assert f"pt-{key_id}" in cli(platform_env, "keys", "list", "--all").stdout


@sqlite_only
def test_nothing_listens_beyond_loopback_without_keys(
    platform_env: dict[str, str], db_url: str, tiny_dir: Path
) -> None:
    port = str(free_port())
    line = one_error_line(cli(platform_env, "gateway", "--host", "0.0.0.0", "--port", port))
    assert "refusing to serve the gateway on 0.0.0.0 while no API key exists" in line
    engine = subprocess.run([sys.executable, "-m", "posttrain.platform.serving", "--model", str(tiny_dir), "--host",
                             "0.0.0.0", "--port", port], env={**os.environ, **platform_env}, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert engine.returncode != 0 and "refusing to serve the engine on 0.0.0.0 while no API key exists" in engine.stderr
    with pytest.raises(OpenServerRefused, match="without API keys"):  # an app built to check no keys at all
        ThreadedServer(create_gateway_app(GatewayConfig(deployments=[])), host="0.0.0.0")

    from posttrain.platform.serving.jobs import DeployConfig, server_command

    tiny = SimpleNamespace(name="tiny", path=str(tiny_dir))
    for engine in ("vllm", "llamacpp"):
        with pytest.raises(BadInput, match=f"{engine} cannot check posttrain API keys"):
            server_command(
                DeployConfig(model="tiny", engine=engine, host="0.0.0.0"), tiny, 8000, get_settings(), OPERATOR
            )
    assert (
        "--host" in server_command(DeployConfig(model="tiny", host="0.0.0.0"), tiny, 8000, get_settings(), OPERATOR)[1]
    )


@sqlite_only
def test_an_engine_beyond_loopback_checks_keys_itself(
    platform_env: dict[str, str], db_url: str, tiny_dir: Path
) -> None:
    register_model(OPERATOR, "tiny", tiny_dir)
    made = create_key(ADMIN, "direct")
    port = free_port()
    command = [sys.executable, "-m", "posttrain.platform.serving", "--model", str(tiny_dir), "--served-model-name",
               "tiny", "--host", "0.0.0.0", "--port", str(port), "--max-model-len", "256"]  # fmt: skip
    lines: list[str] = []
    with ServerProcess(command, f"http://127.0.0.1:{port}", on_log=lines.append).start(timeout_s=180) as server:
        base = server.base_url
        assert httpx.get(base + "/health").status_code == 200  # says nothing about prompts: open
        for headers in ({}, {"authorization": "Bearer pt-000000000000_" + "A" * 43}):
            refused = httpx.post(base + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2},
                                 headers=headers)  # fmt: skip
            assert refused.status_code == 401 and refused.json()["error"]["type"] == "AuthenticationError"
        assert httpx.get(base + "/v1/models").status_code == 401
        client = openai.OpenAI(base_url=base + "/v1", api_key=made.secret, max_retries=0)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        assert client.completions.create(model="tiny", prompt="hi", max_tokens=2).usage.completion_tokens == 2
    assert not any(made.secret.split("_", 1)[1] in line for line in lines)


@sqlite_only
def test_console_chat_sends_its_own_key_for_that_model_once_keys_exist(
    platform_env: dict[str, str], db_url: str, tiny_dir: Path, tmp_path: Path
) -> None:
    from posttrain.platform.serving.client import CONSOLE_KEY, ChatError, chat_as

    def ask(model: str = "tiny") -> str:
        return "".join(d.get("content") or "" for d in chat_as(OPERATOR, base, model, CHAT, max_tokens=4))

    def console_keys(**kwargs: bool) -> dict[str, ApiKey]:
        return {k.name: k for k in list_keys(ADMIN, **kwargs) if k.name.startswith(CONSOLE_KEY)}

    secrets = get_settings().secrets_dir()
    with (
        deployed(tiny_dir),
        deployed(tiny_dir, "tiny2"),
        gateway_process(platform_env, tmp_path / "gateway.log") as base,
    ):
        ask()  # no key yet: the loopback gateway serves everyone, and the console made no key
        assert list_keys(ADMIN) == []
        create_key(ADMIN, "someone")
        unscoped = api_keys._insert_key(
            "system", CONSOLE_KEY, (), None
        )  # what an earlier version kept, for every model
        (secrets / f"{CONSOLE_KEY}.api-key").write_text(unscoped.secret)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0).models.list()
        ask()  # the console's own key for tiny, made for it
        with pytest.raises(KeyRefused, match="was revoked"):
            check_key(unscoped.secret)
        assert not (secrets / f"{CONSOLE_KEY}.api-key").exists()
        console = console_keys(include_revoked=False)[f"{CONSOLE_KEY}: tiny"]
        assert console.created_by == "system" and console.models == ["tiny"]
        (kept,) = secrets.glob(f"{CONSOLE_KEY}-*.api-key")
        assert stat.S_IMODE(kept.stat().st_mode) == 0o600 and check_key(kept.read_text()).key_id == console.key_id
        client = openai.OpenAI(base_url=base + "/v1", api_key=kept.read_text(), max_retries=0)
        assert client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=2).usage.completion_tokens == 2
        with pytest.raises(openai.PermissionDeniedError, match="may not use the model `tiny2`"):
            client.chat.completions.create(model="tiny2", messages=CHAT, max_tokens=2)
        ask("tiny2")  # a key of its own, for tiny2 alone
        assert console_keys(include_revoked=False)[f"{CONSOLE_KEY}: tiny2"].models == ["tiny2"]
        revoke_key(ADMIN, console.key_id)
        ask()  # a revoked console key is replaced
        scoped = {name: k.models for name, k in console_keys(include_revoked=False).items()}
        assert scoped == {f"{CONSOLE_KEY}: tiny": ["tiny"], f"{CONSOLE_KEY}: tiny2": ["tiny2"]}
        with pytest.raises(ChatError, match="no registered model named 'elsewhere'"):
            ask("elsewhere")
        with pytest.raises(PermissionDenied, match="may not model.chat"):
            chat_as(Identity("viv", Role.viewer), base, "tiny", CHAT)
    assert [e.username for e in audit_log() if e.action == "model.chat"] == [OPERATOR.username] * 5


def test_console_admins_create_a_key_seen_once_and_revoke_it(platform_env: dict[str, str], db_url: str) -> None:
    from conftest import REPO_ROOT, login_as
    from streamlit.testing.v1 import AppTest

    page = str(REPO_ROOT / "ui" / "views" / "admin.py")
    at = login_as(AppTest.from_file(page, default_timeout=60), "admin", "root").run()
    assert not at.exception and any("No API keys yet" in c.value for c in at.caption)
    at.text_input(key="key_name").set_value("notebook")
    at.button(key="FormSubmitter:create_key-Create key").click().run()
    assert not at.exception and not at.error
    (shown_key,) = [c.value for c in at.code if KEY.fullmatch(c.value)]
    (block,) = [c for c in at.code if c.value == shown_key]
    assert block.proto.wrap_lines  # the whole key inside its half-width card, not cut at the card's edge
    key_id = KEY.fullmatch(shown_key).group(1)  # type: ignore[union-attr]
    assert check_key(shown_key).name == "notebook" and any(f"pt-{key_id}" in s.value for s in at.success)
    at.run()  # shown once: the next run of the page no longer holds it
    assert not [c.value for c in at.code if KEY.fullmatch(c.value)]
    assert list(at.dataframe[1].value["key"]) == [f"pt-{key_id}"]
    assert at.selectbox(key="revoke_key_id").value is None and at.button(key="revoke_key_go").disabled
    at.selectbox(key="revoke_key_id").set_value(key_id).run()
    assert "(notebook) was last used at" in at.warning[0].value  # check_key above used it: confirmed first
    at.checkbox(key="revoke_confirm").check().run()
    at.button(key="revoke_key_go").click().run()
    assert any(f"Revoked pt-{key_id}" in s.value for s in at.success)
    assert at.selectbox(key="revoke_key_id").value is None  # nothing chosen again
    with pytest.raises(KeyRefused, match="was revoked"):
        check_key(shown_key)
    assert {"key.create", "key.revoke"} <= {e.action for e in audit_log() if e.username == "root"}


def test_console_revoke_chooses_nothing_and_asks_before_revoking_a_key_in_use(
    platform_env: dict[str, str], db_url: str, tiny_dir: Path
) -> None:
    """Issue 35, items 14 and 19: "Revoke a key" preselects no key (it used to preselect the newest, often the
    console's own), and a key in use (the console's own, or one used lately) is revoked only once the admin
    confirms, having read what stops working; the keys table and the audit log show plain values."""
    from conftest import REPO_ROOT, login_as
    from streamlit.testing.v1 import AppTest

    from posttrain.platform.serving.client import CONSOLE_KEY

    register_model(OPERATOR, "tiny", tiny_dir)
    idle = create_key(ADMIN, "old-notebook")
    busy = create_key(ADMIN, "ci-bot", ["tiny"])
    check_key(busy.secret)  # used just now
    console = api_keys.service_key(
        CONSOLE_KEY, "tiny", get_settings().secrets_dir()
    )  # newest: it used to be preselected
    console_id = KEY.fullmatch(console).group(1)  # type: ignore[arg-type, union-attr]

    at = login_as(
        AppTest.from_file(str(REPO_ROOT / "ui" / "views" / "admin.py"), default_timeout=60), "admin", "root"
    ).run()
    assert not at.exception
    assert at.selectbox(key="revoke_key_id").value is None and at.button(key="revoke_key_go").disabled

    at.selectbox(key="revoke_key_id").set_value(console_id).run()
    (warning,) = [w.value for w in at.warning]
    assert f"pt-{console_id} ({CONSOLE_KEY}: tiny) is the console's own key for the model tiny" in warning
    assert "playground" in warning and "refused" in warning
    assert at.button(key="revoke_key_go").disabled
    at.checkbox(key="revoke_confirm").check().run()
    assert not at.button(key="revoke_key_go").disabled
    at.button(key="revoke_key_go").click().run()
    assert not at.exception and any(f"Revoked pt-{console_id}" in s.value for s in at.success)
    with pytest.raises(KeyRefused, match="was revoked"):
        check_key(console)
    assert at.selectbox(key="revoke_key_id").value is None and not at.warning

    at.selectbox(key="revoke_key_id").set_value(busy.key.key_id).run()
    assert "(ci-bot) was last used at 20" in at.warning[0].value and " UTC: whoever sends it" in at.warning[0].value
    assert not at.checkbox(key="revoke_confirm").value and at.button(key="revoke_key_go").disabled  # asked again
    at.selectbox(key="revoke_key_id").set_value(idle.key.key_id).run()
    assert not at.warning and not at.button(key="revoke_key_go").disabled  # never used: revoked in one click

    keys = at.dataframe[1].value
    row = keys.loc[keys["name"] == "old-notebook"].iloc[0]
    assert (
        row["revoked"] == "—"
        and row["last used"] == "—"
        and re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", row["created"])
    )
    assert keys.loc[keys["name"] == f"{CONSOLE_KEY}: tiny", "revoked"].iloc[0].endswith(" UTC")
    assert not any("None" in str(v) for v in keys.to_numpy().ravel())
    audit = at.dataframe[2].value
    created = audit.loc[(audit["action"] == "key.create") & (audit["target"] == f"pt-{busy.key.key_id}"), "details"]
    assert list(created) == ["name: ci-bot · models: tiny"]
    assert not any("{" in str(v) or "None" in str(v) for v in audit.to_numpy().ravel())
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", t) for t in audit["time"])
