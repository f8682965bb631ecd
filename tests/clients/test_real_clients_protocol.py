"""The frontend against the gateway contract of the pinned Claude Code: ``claude gateway``'s
``GET /protocol`` (``support.claude_gateway``), read from the CLI at test time.

Every ``## `` section of the contract is classified here: :data:`APPLIES` (a Claude Code pointed at
the fleet with ``ANTHROPIC_BASE_URL`` and a key does what the section describes, so the frontend is
checked against it) or :data:`NOT_APPLICABLE` (with why). A release that adds a section fails
:func:`test_every_section_of_the_contract_is_classified` until someone reads and classifies it;
each check first finds the sentence it enforces in the contract, so a reworded requirement fails
its check instead of passing unread. The fleet is ``examples/agents.yaml`` with auth on (a
tenant with tight limits for the 429) on loopback, as the operator renders it
(``support.rendered_plane``, the stand-in engine).

Where the frontend answers as Anthropic's own API does and the gateway contract asks otherwise,
:data:`DEVIATIONS` says so and the check pins today's answer: see docs/frontend.md.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from email.message import Message
from typing import Any, Final

import pytest
import yaml

from support.claude_gateway import Section, read_protocol, sections
from support.processes import StartKvretention
from support.real_clients import AGENTS_EXAMPLE, Client
from support.rendered_plane import RenderedPlane, start_rendered_plane

pytestmark = pytest.mark.clients

SECRET = "agent-keys"
KEY = "sk-claude-team-5c1e0b7d2a4c68f9"
THROTTLED_KEY = "sk-throttled-0b7d2a4c68f95c1e"
MODEL = "claude-sonnet-4-5"
"""What Claude Code asks for by default; the example's ``claude-*`` alias serves it."""

APPLIES: Final = {
    "Flow": "Claude Code's requests to a base URL: nothing it does not recognise may be refused",
    "Messages": "POST /v1/messages and /v1/messages/count_tokens: the fleet's whole purpose",
    "Models": "GET /v1/models, with CLAUDE_CODE_ENABLE_GATEWAY_MODEL_DISCOVERY (docs/frontend.md)",
    "Errors": "the Anthropic envelope and error types on every authenticated endpoint",
    "Usage-limit headers": "optional; the fleet has no spend caps, so it must send none of them",
    "Client guarantees": "404 from /managed/settings is the clean 'not implemented'",
    "Proxying to Bedrock, Vertex, or Foundry": (
        "the frontend translates to an engine that is not Anthropic's: count_tokens' answer"
    ),
}
"""Sections a Claude Code pointed at the fleet meets, and what of them is checked."""

NOT_APPLICABLE: Final = {
    "Discovery": "the OAuth device sign-in of `/login`: a fleet is reached with "
    "ANTHROPIC_BASE_URL and an API key (x-api-key or a bearer), never signed in to",
    "Device authorization": "part of the `/login` sign-in (above)",
    "Verification page": "part of the `/login` sign-in (above)",
    "Token": "part of the `/login` sign-in (above)",
    "Managed settings": "read only by clients signed in with `/login` (the contract: one that "
    "reaches you through ANTHROPIC_BASE_URL never reads it); the frontend's 404 is checked under "
    "Client guarantees",
    "Telemetry": "sent only to a `/login` gateway; a base-URL client exports where its OTEL_* "
    "variables say",
    "Billing group": "tags go in only with a gateway-issued JWT claim; a `tags` field is "
    "accepted like any unknown field (Flow)",
    "Bearer token": "OAuth access tokens of `/login`; the fleet's keys are static API keys "
    "from Secrets (docs/auth.md)",
    "TLS": "the frontend serves HTTP inside the cluster; TLS is the Service's, Ingress's or "
    "Gateway's in front of it",
    "References": "no requirement",
    "Customer-routed inference": "Anthropic-minted CRI JWTs for Claude Enterprise "
    "organisations; a fleet admits its own tenants' keys",
}
"""Sections a fleet never meets, and why."""

DEVIATIONS: Final = {
    "model ids": "the contract asks Anthropic-style ids from /v1/models; the frontend lists the "
    "served names and exact aliases as the spec names them (alias patterns such as claude-* are "
    "no ids), so only an exact alias like claude-sonnet-4-5 gives Claude Code's picker an entry",
    "denied model": "the contract asks 400 invalid_request_error; the frontend answers as "
    "Anthropic's API does for a model it does not serve, 404 not_found_error (with "
    "x-should-retry: false), which Claude Code shows as is",
}
"""Where the frontend knowingly answers otherwise than the contract, and why."""


# ------------------------------------------------------------------ the fleet and the contract


@pytest.fixture(scope="module")
def protocol(clients: dict[str, Client]) -> dict[str, Section]:
    text = read_protocol(clients["claude"].binary)
    assert text.startswith("# Claude Code gateway protocol"), text[:200]
    return {s.name: s for s in sections(text)}


@pytest.fixture(scope="module")
def plane(
    start: StartKvretention, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RenderedPlane]:
    tmp = tmp_path_factory.mktemp("protocol-plane")
    doc = yaml.safe_load(AGENTS_EXAMPLE.read_text())
    doc["spec"].setdefault("frontend", {})["auth"] = {
        "secretRefs": [{"name": SECRET}],
        "tenants": [{"name": "throttled", "requestsPerSecond": 0.001, "burst": 1}],
    }
    example = tmp / "agents-protocol.yaml"
    example.write_text(yaml.safe_dump(doc))
    mount = tmp / "secret"
    mount.mkdir()
    (mount / "claude-team").write_text(KEY + "\n")
    (mount / "throttled").write_text(THROTTLED_KEY + "\n")
    yield start_rendered_plane(example, start=start, tmp=tmp, secrets={SECRET: mount})


@dataclass
class Answer:
    status: int
    headers: Message
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def error(self, status: int, kind: str) -> str:
        """``error.message`` of the Anthropic error envelope this answer must be: ``status``, with
        an error of type ``kind``."""
        assert self.status == status, self.body[:500]
        body = self.json()
        assert body["type"] == "error", body
        assert body["error"]["type"] == kind
        message: str = body["error"]["message"]
        return message


def call(
    plane: RenderedPlane,
    method: str,
    path: str,
    body: Any = None,
    *,
    key: str | None = KEY,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
) -> Answer:
    """One request as Claude Code sends it (``x-api-key``, ``anthropic-version``, Content-Length)."""
    sent = {"anthropic-version": "2023-06-01", "content-type": "application/json"}
    if key is not None:
        sent["x-api-key"] = key
    sent.update(headers or {})
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(
        plane.frontend.base_url + path, data=data, method=method, headers=sent
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return Answer(resp.status, resp.headers, resp.read())
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, exc.headers, exc.read())


def says(protocol: dict[str, Section], section: str, *fragments: str) -> None:
    """The contract still says this (each fragment, whitespace-normalised) in ``section``."""
    text = " ".join(protocol[section].text.split())
    for fragment in fragments:
        assert fragment in text, f"{section!r} no longer says {fragment!r}: re-read it"


def message(**extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Say hello."}],
        **extra,
    }


# ------------------------------------------------------------------ the classification


def test_every_section_of_the_contract_is_classified(protocol: dict[str, Section]) -> None:
    assert set(APPLIES).isdisjoint(NOT_APPLICABLE)
    unread = set(protocol) - set(APPLIES) - set(NOT_APPLICABLE)
    assert not unread, f"new sections of /protocol to classify: {sorted(unread)}"
    gone = (set(APPLIES) | set(NOT_APPLICABLE)) - set(protocol)
    assert not gone, f"sections no longer in /protocol: {sorted(gone)}"


# ------------------------------------------------------------------ Flow: unknown input


def test_unknown_fields_betas_and_headers_are_not_refused(
    protocol: dict[str, Section], plane: RenderedPlane
) -> None:
    says(
        protocol,
        "Flow",
        "Don't reject what you don't recognize.",
        "On `/v1/messages` pass body fields and `anthropic-beta` values",
        "never fail the request over them",
    )
    # Said of CRI callers, true of every Claude Code request (?beta=true on each one).
    says(protocol, "Customer-routed inference", "match on the path, tolerate the query")
    answer = call(
        plane,
        "POST",
        "/v1/messages?beta=true",
        message(
            kvr_field_from_a_future_release={"nested": [1, 2]},
            tags={"billing": "team-a"},
            context_management={"edits": []},
        ),
        headers={
            "anthropic-beta": "claude-code-20250219,a-beta-from-2099-01-01",
            "x-app": "cli",
            "x-stainless-lang": "js",
            "x-stainless-retry-count": "0",
            "x-kvr-unknown-header": "1",
        },
    )
    assert answer.status == 200, answer.body[:500]
    assert answer.json()["type"] == "message"


# ------------------------------------------------------------------ Messages


def test_messages_stream_as_server_sent_events(
    protocol: dict[str, Section], plane: RenderedPlane
) -> None:
    says(protocol, "Messages", "Proxy to your upstream and stream the response back.")
    answer = call(plane, "POST", "/v1/messages", message(stream=True))
    assert answer.status == 200, answer.body[:500]
    assert answer.headers["content-type"].startswith("text/event-stream")
    events = [
        line.split(":", 1)[1].strip()
        for line in answer.body.decode().splitlines()
        if line.startswith("event:")
    ]
    assert events[0] == "message_start"
    assert events[-1] == "message_stop"
    assert "content_block_delta" in events


def test_count_tokens_answers_input_tokens(
    protocol: dict[str, Section], plane: RenderedPlane
) -> None:
    says(protocol, "Messages", "`POST /v1/messages` and `POST /v1/messages/count_tokens`")
    says(protocol, "Proxying to Bedrock, Vertex, or Foundry", 'as `{"input_tokens": N}`')
    body = message()
    del body["max_tokens"]
    answer = call(plane, "POST", "/v1/messages/count_tokens?beta=true", body)
    assert answer.status == 200, answer.body[:500]
    counted = answer.json()
    assert isinstance(counted["input_tokens"], int) and counted["input_tokens"] > 0


def test_safeguards_are_refused_with_a_400_that_names_them(
    protocol: dict[str, Section], plane: RenderedPlane
) -> None:
    """No safety classifier runs in a fleet, so auto mode's ``safeguards`` get the contract's
    400 naming them (Claude Code then runs the check itself), never a silent no-op that would
    skip the check; a malformed value is the same 400."""
    says(
        protocol,
        "Messages",
        "Pass all three through unchanged.",
        "answer `400 invalid_request_error` with a message that names `safeguards`",
    )
    safeguards = [{"type": "dangerous_tool_use", "classifier_context": "rm -rf build/"}]
    for value in (safeguards, {"auto_mode": {}}):
        answer = call(plane, "POST", "/v1/messages", message(safeguards=value))
        text = answer.error(400, "invalid_request_error")
        assert "safeguards" in text
    assert call(plane, "POST", "/v1/messages", message()).status == 200


def test_a_model_the_fleet_does_not_serve(
    protocol: dict[str, Section], plane: RenderedPlane
) -> None:
    """A deviation (:data:`DEVIATIONS`): Anthropic's own answer, not the gateway's 400."""
    says(protocol, "Messages", "returning `400 invalid_request_error` for a denied model")
    answer = call(plane, "POST", "/v1/messages", message(model="mistral-large-2"))
    answer.error(404, "not_found_error")
    assert answer.headers["x-should-retry"] == "false"


def test_a_body_over_the_cap_is_a_413_request_too_large(
    protocol: dict[str, Section], plane: RenderedPlane
) -> None:
    says(protocol, "Messages", "cap body size (`413`)")
    says(protocol, "Errors", "| 413 | `request_too_large` |")
    big = message(messages=[{"role": "user", "content": "x" * (9 * 1024 * 1024)}])
    answer = call(plane, "POST", "/v1/messages", big)
    answer.error(413, "request_too_large")


# ------------------------------------------------------------------ Errors


def test_a_wrong_key_is_a_401_that_is_not_retried(
    protocol: dict[str, Section], plane: RenderedPlane
) -> None:
    says(protocol, "Errors", "| 401 | `authentication_error` |", "Send `x-should-retry: false`")
    for key in (None, "sk-not-a-fleet-key-00000000"):
        answer = call(plane, "POST", "/v1/messages", message(), key=key)
        answer.error(401, "authentication_error")
        assert answer.headers["x-should-retry"] == "false"


def test_a_malformed_body_is_a_400_invalid_request_error(
    protocol: dict[str, Section], plane: RenderedPlane
) -> None:
    says(protocol, "Errors", "| 400 | `invalid_request_error` | Denied model, malformed body")
    for raw in (b"{not json", json.dumps({"model": MODEL, "max_tokens": 8}).encode()):
        answer = call(plane, "POST", "/v1/messages", raw=raw)
        answer.error(400, "invalid_request_error")


def test_throttling_is_a_429_rate_limit_error_with_retry_after(
    protocol: dict[str, Section], plane: RenderedPlane
) -> None:
    says(protocol, "Errors", "| 429 | `rate_limit_error` | Throttling; include `Retry-After` |")
    first = call(plane, "POST", "/v1/messages", message(), key=THROTTLED_KEY)
    assert first.status == 200, first.body[:500]
    second = call(plane, "POST", "/v1/messages", message(), key=THROTTLED_KEY)
    second.error(429, "rate_limit_error")
    assert int(second.headers["retry-after"]) >= 1


# ------------------------------------------------------------------ Models, usage headers, 404s


def test_models_list_in_anthropics_shape_with_claude_style_ids(
    protocol: dict[str, Section], plane: RenderedPlane
) -> None:
    says(
        protocol,
        "Models",
        'Anthropic models-list shape: `{"data":[{"id","display_name"},...]}`',
        "Use Anthropic-style IDs",
    )
    answer = call(plane, "GET", "/v1/models?limit=1000")
    assert answer.status == 200, answer.body[:500]
    data = answer.json()["data"]
    for model in data:
        assert isinstance(model["id"], str) and isinstance(model["display_name"], str)
    # A deviation (DEVIATIONS): the example serves Claude's names through the claude-* pattern,
    # which is no id, so only its served name is listed and Claude Code's picker adds nothing.
    assert [m["id"] for m in data] == ["qwen3-32b"]


def test_no_usage_limit_headers_without_a_spend_cap(
    protocol: dict[str, Section], plane: RenderedPlane
) -> None:
    says(protocol, "Usage-limit headers", "Send none of these for a user with no cap.")
    answer = call(plane, "POST", "/v1/messages", message())
    assert answer.status == 200, answer.body[:500]
    sent = {name.lower() for name in answer.headers}
    assert not {h for h in sent if h.startswith("anthropic-ratelimit-")}


def test_managed_settings_are_a_clean_404(
    protocol: dict[str, Section], plane: RenderedPlane
) -> None:
    says(
        protocol,
        "Client guarantees",
        '`404` from `/v1/models` or `/managed/settings` is a clean "not implemented"',
    )
    answer = call(plane, "GET", "/managed/settings")
    # The status is what the client reads; the body is OpenAI's shape (a path of neither API).
    assert answer.status == 404, answer.body[:500]
    assert answer.headers["x-should-retry"] == "false"
