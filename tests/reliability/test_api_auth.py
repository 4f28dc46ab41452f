"""The OpenAI-compatible API against callers without a valid key: the gateway as ``posttrain gateway``
runs it, the official ``openai`` client and raw headers, and the server's whole log read afterwards.

Each test records what it tried with ``category="api_auth"``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import httpx
import openai
import pytest
from conftest import ADMIN, OPERATOR, Reliability
from test_api_keys import CHAT, deployed, gateway_process, tiny_dir  # noqa: F401 - tiny_dir is a fixture

from posttrain.platform.api_keys import create_key, revoke_key, shown
from posttrain.platform.models.registry import register_model

CATEGORY = "api_auth"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_gateway_refuses_every_caller_without_a_valid_key_and_never_logs_one(
    platform_env: dict[str, str], db_url: str, tiny_dir: Path, tmp_path: Path, reliability: Reliability
) -> None:
    """Valid keys work through the openai client; missing, malformed, wrong, revoked and other-model keys
    get a 401 or 403 with an OpenAI-style error body and never reach a model; no secret is logged."""
    log_path = tmp_path / "gateway.log"
    register_model(OPERATOR, "other", tiny_dir)  # a model some key is limited to
    with deployed(tiny_dir), gateway_process(platform_env, log_path) as base:

        def client(key: str) -> openai.OpenAI:
            return openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=60)

        # Before any key exists a loopback gateway serves everyone (as the console does before its admin).
        assert (
            client("unused").chat.completions.create(model="tiny", messages=CHAT, max_tokens=2).usage.completion_tokens
        )
        good, scoped, gone = (create_key(ADMIN, "good"), create_key(ADMIN, "scoped", ["other"]),
                              create_key(ADMIN, "gone", ["tiny"]))  # fmt: skip
        revoke_key(ADMIN, gone.key.key_id)
        reply = client(good.secret).chat.completions.create(model="tiny", messages=CHAT, max_tokens=3)
        assert reply.usage.completion_tokens == 3
        assert [m.id for m in client(good.secret).models.list().data] == ["tiny"]
        assert client(scoped.secret).models.list().data == []  # it sees only what it may use

        good_id = good.key.key_id
        through_client = {  # api_key -> the status it must get
            "unused": 401, "sk-proj-0123456789abcdef": 401, "pt-": 401, good.secret + "A": 401, good.secret[:-1]: 401,
            f"pt-{good_id}_{'A' * 43}": 401, f"pt-{'f' * 12}_{good.secret[16:]}": 401, "' OR '1'='1": 401,
            "pt-" + "a" * 5000: 401, gone.secret: 401, scoped.secret: 403, good.secret.upper(): 401,
        }  # fmt: skip
        raw_headers = [{}, {"authorization": ""}, {"authorization": "Bearer"}, {"authorization": "bearer pt-x"},
                       {"authorization": f"Basic {good.secret}"}, {"authorization": f"Token {good.secret}"},
                       {"x-api-key": good.secret}, {"authorization": "Bearer \t" + "x" * 4000}]  # fmt: skip
        outcomes: Counter[str] = Counter()

        def clean(status: int, body: object, expected: int) -> bool:
            error = body.get("error", body) if isinstance(body, dict) else None  # the client unwraps "error"
            return (status == expected and isinstance(error, dict) and bool(error.get("message"))
                    and error.get("type") in ("AuthenticationError", "PermissionDeniedError")
                    and error.get("code") == expected and good.secret.split("_", 1)[1] not in str(error))  # fmt: skip

        for key, expected in through_client.items():
            for call in (lambda c: c.chat.completions.create(model="tiny", messages=CHAT, max_tokens=2),
                         lambda c: c.completions.create(model="tiny", prompt="hi", max_tokens=2)):  # fmt: skip
                try:
                    call(client(key))
                except openai.APIStatusError as exc:
                    outcomes["refused" if clean(exc.status_code, exc.body, expected) else "mishandled"] += 1
                else:
                    outcomes["accepted"] += 1
        for headers in raw_headers:
            for path, body in (("/v1/chat/completions", {"model": "tiny", "messages": CHAT, "max_tokens": 2}),
                               ("/v1/models", None), ("/v1/deployments", None)):  # fmt: skip
                resp = (httpx.post(base + path, json=body, headers=headers) if body is not None
                        else httpx.get(base + path, headers=headers))  # fmt: skip
                outcomes["refused" if clean(resp.status_code, resp.json(), 401) else "mishandled"] += 1
        tried = sum(outcomes.values())
        reliability.inputs("gateway API keys", tried=tried, refused_cleanly=outcomes["refused"],
                           accepted=outcomes["accepted"], category=CATEGORY)  # fmt: skip
        assert outcomes == {"refused": tried}, outcomes
        assert client(good.secret).chat.completions.create(model="tiny", messages=CHAT, max_tokens=2).choices

    log = log_path.read_text()
    secrets = [k.secret for k in (good, scoped, gone)]
    leaked = [shown(k.key.key_id) for k in (good, scoped, gone) if k.secret in log or k.secret.split("_", 1)[1] in log]
    reliability.fault("API keys kept out of the gateway's log (DEBUG level, every refusal logged)",
                      survived=not leaked, category=CATEGORY, leaked=leaked)  # fmt: skip
    assert not leaked, leaked
    assert all(s[16:40] not in log for s in secrets)
    # the log did record the refusals, by the keys' public ids: the check above read a real log
    assert f"{shown(gone.key.key_id)} (gone) was revoked" in log and f"{shown(scoped.key.key_id)}" in log
