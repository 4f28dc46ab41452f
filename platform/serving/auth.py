"""Who may call an OpenAI-compatible server (the gateway, an engine): API keys from the database.

The rule, the console's applied to the API:

- A server that listens beyond loopback checks every request's key, and does not start while no
  key exists (:func:`refuse_open_server`): nothing is ever served to the network unauthenticated.
- The gateway on loopback serves everyone while no key exists (a laptop, the tests), and checks
  every request's key from the moment an admin creates the first one.
- A deployment listens on loopback unless configured otherwise: it is reached through the gateway,
  which checks the key, and from this machine only. An embedded engine told to listen beyond loopback
  checks keys itself, the same way, in the same database; vLLM cannot, so it is only served on
  loopback (:func:`posttrain.platform.serving.jobs.server_command` refuses otherwise).

``/health`` (and an engine's ``/metrics``) stay open: they say nothing about prompts or answers.
A refusal is logged with the key's public id only (``pt-<key id>``), never its secret.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from posttrain.platform.api_keys import KeyGrant, KeyRefused, any_active_key, check_key
from posttrain.platform.auth import is_loopback
from posttrain.platform.serving.errors import APIError

if TYPE_CHECKING:
    from fastapi import Request

log = logging.getLogger("posttrain.api_auth")
KEYS_SEEN_FOR_S = 5.0  # a key seen this recently still exists, as far as opening a loopback server goes


class OpenServerRefused(RuntimeError):
    """A server was asked to listen beyond loopback with nothing to check keys against."""


def refuse_open_server(what: str, host: str, auth: ApiAuth | None, *, url: str | None = None) -> None:
    """Raise :class:`OpenServerRefused` unless ``host`` is loopback, or keys are checked and one exists."""
    if is_loopback(host):
        return
    if auth is None:
        raise OpenServerRefused(f"refusing to serve the {what} on {host} without API keys: listen on 127.0.0.1, or "
                                "check keys (the posttrain commands do)")  # fmt: skip
    if not any_active_key(url=url):
        raise OpenServerRefused(
            f"refusing to serve the {what} on {host} while no API key exists: create one with "
            "`posttrain keys create NAME` (or in the console, as an admin), or listen on 127.0.0.1"
        )


@dataclass
class ApiAuth:
    """The key check of a server listening on ``host``, against the database at ``url`` (default:
    the configured one). ``None`` from :meth:`grant` means the server is open (loopback, no key yet).

    A valid key costs one indexed lookup, so a revoked key is refused at once. Once a key is seen to
    exist, refused requests skip asking whether one exists for ``KEYS_SEEN_FOR_S``: a flood of
    callers without a valid key costs the database at most that one lookup each."""

    host: str
    url: str | None = None
    _keys_seen: float = field(default=-math.inf, init=False, repr=False)  # monotonic time a key last existed

    async def grant(self, request: Request) -> KeyGrant | None:
        token = _bearer(request.headers.get("authorization"))
        try:
            return await asyncio.to_thread(self._grant, token)
        except KeyRefused as exc:
            log.warning("refused a request to %s from %s: %s", request.url.path,
                        request.client.host if request.client else "?", exc.message)  # fmt: skip
            raise APIError(exc.status, exc.message, param="api_key") from None

    def _grant(self, token: str | None) -> KeyGrant | None:
        try:
            granted = check_key(token, url=self.url)
        except KeyRefused:
            if self._open():
                return None  # open until the first key: whatever a client sends as its key is ignored
            raise
        self._keys_seen = time.monotonic()
        return granted

    def _open(self) -> bool:
        if not is_loopback(self.host) or time.monotonic() - self._keys_seen < KEYS_SEEN_FOR_S:
            return False
        if any_active_key(url=self.url):
            self._keys_seen = time.monotonic()
            return False
        return True


def allow_model(grant: KeyGrant | None, model: str) -> None:
    """403 unless the request's key may use ``model`` (an open server allows every model)."""
    if grant is None:
        return
    try:
        grant.check_model(model)
    except KeyRefused as exc:
        log.warning("refused the API key %s the model %r", grant.label, model)
        raise APIError(exc.status, exc.message, param="model") from None


def visible(grant: KeyGrant | None, models: list[str]) -> list[str]:
    """The models a key may see in ``/v1/models``."""
    return models if grant is None else [m for m in models if grant.allows(m)]


def _bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None
