"""The gateway's description of its API (``/docs``, ``/openapi.json``) is behind the same API-key check as
the API itself once a key exists (issue 33, part 4); ``/health`` alone stays open."""

from __future__ import annotations

import httpx
from conftest import ADMIN

from posttrain.platform.api_keys import create_key
from posttrain.platform.serving import GatewayConfig, create_gateway_app, serve_in_thread
from posttrain.platform.serving.auth import ApiAuth

DESCRIPTION = ("/docs", "/openapi.json")


def test_docs_and_openapi_need_a_key_once_one_exists(sqlite_url: str) -> None:
    app = create_gateway_app(GatewayConfig(deployments=[]), auth=ApiAuth("127.0.0.1", url=sqlite_url))
    with serve_in_thread(app) as gateway, httpx.Client(base_url=gateway.base_url, timeout=30) as client:
        # before the first key a loopback gateway serves everyone, its description included
        assert all(client.get(path).status_code == 200 for path in DESCRIPTION)
        assert "/v1/chat/completions" in client.get("/openapi.json").json()["paths"]
        assert client.get("/redoc").status_code == 404  # the second, unkeyed copy of the docs is off

        key = create_key(ADMIN, "docs reader", url=sqlite_url)
        for headers in ({}, {"authorization": "Bearer pt-000000000000_" + "A" * 43}, {"x-api-key": key.secret}):
            for path in DESCRIPTION:
                refused = client.get(path, headers=headers)
                assert refused.status_code == 401, (path, headers, refused.text)
                assert refused.json()["error"]["type"] == "AuthenticationError"
                assert "/v1/" not in refused.text  # nothing of the API's description leaks in the refusal
        keyed = {"authorization": f"Bearer {key.secret}"}
        assert "swagger-ui" in client.get("/docs", headers=keyed).text
        assert "/v1/completions" in client.get("/openapi.json", headers=keyed).json()["paths"]
        assert client.get("/health").status_code == 200
