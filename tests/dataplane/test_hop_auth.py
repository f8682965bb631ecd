"""The frontend -> router -> worker hop authenticated, as real processes with the engine stand-in.

With ``--hop-key-file`` on all three, the frontend's requests (auth on, two tenants) are served
with each tenant's ``cache_salt``, while a request sent straight to the router or to a worker
(a pod that reaches their ports) naming a tenant without the frontend's signature, or with a
forged, stale or borrowed one, is refused with a 403 before anything reads its tenant, and
counted by reason; the engine never sees it.
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest

from kvretention.common.hop_auth import HEADER_TENANT_SIG, parse_hop_keys, sign_tenant
from kvretention.common.tenancy import HEADER_TENANT, cache_salt_for
from support.processes import StartKvretention
from support.standin_chain import StandinChain, post_chat, start_standin_chain, write_key_files
from support.worker_client import calls, post, request_body, wait_for

KEYS = {"team-a": "sk-team-a-0123456789abcdef", "team-b": "sk-team-b-0123456789abcdef"}
HOP_KEY = "0123456789abcdef" * 4
HOP = parse_hop_keys(HOP_KEY)
FORGED = parse_hop_keys("f" * 64)


@pytest.fixture(scope="module")
def plane(
    kvretention_process: StartKvretention, tmp_path_factory: pytest.TempPathFactory
) -> StandinChain:
    d = tmp_path_factory.mktemp("hop-auth")
    keys = write_key_files(d / "keys", KEYS)
    hop_key = d / "hop-key"
    hop_key.write_text(HOP_KEY + "\n")
    return start_standin_chain(
        kvretention_process, d, hop_key=hop_key, frontend_args=["--auth-keys-dir", str(keys)]
    )


def chat(base_url: str, tenant: str) -> dict[str, Any]:
    body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "Hello."}]}
    return post_chat(base_url, body, api_key=KEYS[tenant])


def refusals(base_url: str, component: str) -> dict[str, float]:
    with urllib.request.urlopen(base_url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    prefix = f'kvretention_{component}_hop_refusals_total{{reason="'
    return {
        line[len(prefix) :].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix)
    }


def test_the_frontends_signed_requests_are_served_with_each_tenants_salt(
    plane: StandinChain,
) -> None:
    for tenant in KEYS:
        assert chat(plane.frontend, tenant)["choices"][0]["finish_reason"] is not None
    engine = wait_for(
        lambda: (
            [
                c
                for c in map(json.loads, plane.record.read_text().splitlines())
                if c["event"] == "generate"
            ]
            if plane.record.exists()
            else None
        )
    )
    assert [c["kwargs"].get("cache_salt") for c in engine][:2] == [cache_salt_for(t) for t in KEYS]


def _now() -> float:
    return time.time()


# (what, headers the peer sends besides the tenant's, the reason counted)
FORGERIES: list[tuple[str, Any, str]] = [
    ("no signature", lambda: {}, "missing"),
    ("garbage", lambda: {HEADER_TENANT_SIG: "v1.garbage"}, "malformed"),
    (
        "another key",
        lambda: {HEADER_TENANT_SIG: sign_tenant(FORGED, "team-a", now=_now())},
        "invalid",
    ),
    (
        "another tenant's signature",
        lambda: {HEADER_TENANT_SIG: sign_tenant(HOP, "team-b", now=_now())},
        "invalid",
    ),
    (
        "captured long ago",
        lambda: {HEADER_TENANT_SIG: sign_tenant(HOP, "team-a", now=_now() - 600)},
        "stale",
    ),
]


@pytest.mark.parametrize("hop", ["router", "worker"])
@pytest.mark.parametrize(
    ("headers", "reason"), [f[1:] for f in FORGERIES], ids=[f[0] for f in FORGERIES]
)
def test_a_tenant_not_signed_by_the_frontend_is_refused_and_counted(
    plane: StandinChain, hop: str, headers: Any, reason: str
) -> None:
    base_url = plane.router if hop == "router" else plane.worker
    before = refusals(base_url, hop).get(reason, 0.0)
    rid = f"forged-{hop}-{reason}-{time.monotonic_ns()}"
    status, lines = post(base_url, request_body(rid), {HEADER_TENANT: "team-a", **headers()})
    assert status == 403, lines
    assert lines[0]["error"]["code"] == "hop_unauthenticated"
    assert HOP_KEY not in json.dumps(lines)
    assert refusals(base_url, hop)[reason] == before + 1
    assert calls(plane.record, rid) == []


@pytest.mark.parametrize("hop", ["router", "worker"])
def test_a_request_signed_with_the_hop_key_passes_straight_to_the_hop(
    plane: StandinChain, hop: str
) -> None:
    """What the refusals above turn on is the signature alone."""
    base_url = plane.router if hop == "router" else plane.worker
    rid = f"signed-{hop}"
    signed = {HEADER_TENANT: "team-a", HEADER_TENANT_SIG: sign_tenant(HOP, "team-a", now=_now())}
    status, lines = post(base_url, request_body(rid), signed)
    assert status == 200, lines
    (call,) = wait_for(lambda: calls(plane.record, rid))
    assert call["kwargs"]["cache_salt"] == cache_salt_for("team-a")
