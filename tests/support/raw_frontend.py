"""A frontend app with API keys on a real listening socket, for the tests that write HTTP/1.1 by
hand (framing, ``Expect: 100-continue``), and what they check in a provider's refusal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aiohttp import web

from kvretention.dataplane.frontend.app import create_app
from kvretention.dataplane.frontend.auth import Gate, KeyStore
from kvretention.dataplane.frontend.config import FrontendConfig
from kvretention.dataplane.frontend.errors import Provider
from kvretention.dataplane.frontend.limits import LimitPolicy
from kvretention.dataplane.http import start_site
from support.router_standin import RouterStandIn
from support.secret_mount import write_secret

PATHS = {Provider.OPENAI: "/v1/chat/completions", Provider.ANTHROPIC: "/v1/messages"}


def body_for(provider: Provider, word: str) -> bytes:
    """A minimal request for ``provider`` whose message carries ``word``."""
    message = [{"role": "user", "content": f"hello {word}"}]
    extra = {"max_tokens": 8} if provider is Provider.ANTHROPIC else {}
    return json.dumps({"model": "m", "messages": message, **extra}).encode()


async def start_frontend(
    router_standin: RouterStandIn, keys: Path | None, **config: Any
) -> tuple[web.AppRunner, web.Application]:
    """The frontend in front of the stand-in, listening; ``keys`` (a mounted Secret): auth on."""
    gate = Gate(keys=KeyStore([keys]), limits=LimitPolicy()) if keys is not None else None
    app = create_app(FrontendConfig(router_url=router_standin.base_url, **config), gate=gate)
    return await start_site(app, host="127.0.0.1", port=0, shutdown_timeout=0.5), app


def key_mount(tmp_path: Path, key: str) -> Path:
    """A mounted Secret holding tenant ``team-a``'s ``key``."""
    keys = tmp_path / "keys"
    write_secret(keys, {"team-a": key})
    return keys


def assert_provider_error(
    provider: Provider,
    headers: dict[str, str],
    body: bytes,
    *,
    code: str,
    anthropic_type: str = "invalid_request_error",
    secret: str,
) -> None:
    """The provider's own error body (Anthropic's ``anthropic_type``, OpenAI's ``code``), not to
    be retried, and not echoing ``secret``."""
    assert headers["x-should-retry"] == "false"
    error = json.loads(body)
    if provider is Provider.ANTHROPIC:
        assert error["type"] == "error"
        assert error["error"]["type"] == anthropic_type
    else:
        assert error["error"]["type"] == "invalid_request_error"
        assert error["error"]["code"] == code
    assert secret.encode() not in body
