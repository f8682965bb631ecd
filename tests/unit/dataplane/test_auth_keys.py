"""The pure parts of auth: key files, presented credentials, limits, the CLI's checks, tenancy."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from kvretention.dataplane.frontend.auth import (
    KeysError,
    KeyStore,
    load_keys,
    parse_key_lines,
    presented_keys,
)
from kvretention.dataplane.frontend.cli import build_gate
from kvretention.dataplane.frontend.errors import Provider
from kvretention.dataplane.frontend.limits import (
    LimitPolicy,
    Limits,
    Refusal,
    TenantLimiter,
    parse_limits,
    parse_tenant_limits,
)
from kvretention.dataplane.tenancy import (
    TenantIsolationUnavailable,
    cache_salt_for,
    engine_kwargs,
    scoped_chain,
    scoped_session,
    tenant_of_headers,
    tenant_of_salt,
    valid_tenant,
)

KEY = "sk-0123456789abcdef"


def _dir(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize(
    ("files", "problem"),
    [
        pytest.param({"Team-A": KEY}, "not a tenant name", id="upper-case-name"),
        pytest.param({"a": "short"}, "at least 16", id="short-key"),
        pytest.param({"a": "sk-has a space-000000"}, "at least 16", id="space-in-key"),
        pytest.param({"a": KEY, "b": f"# b\n{KEY}\n"}, "also a key of tenant a", id="shared-key"),
    ],
)
def test_a_key_set_that_cannot_be_used_is_refused_naming_files_not_keys(
    tmp_path: Path, files: dict[str, str], problem: str
) -> None:
    with pytest.raises(KeysError, match=problem) as caught:
        load_keys([_dir(tmp_path / "k", files)])
    assert KEY not in str(caught.value)


def test_key_files_comments_blank_lines_hidden_entries_and_several_dirs(tmp_path: Path) -> None:
    one = _dir(tmp_path / "one", {"a": f"# rotating\n\n{KEY}\n  {KEY}-next  \n", ".hidden": KEY})
    (one / "..data").mkdir()
    two = _dir(tmp_path / "two", {"b": "sk-ffffffffffffffff", "a": "sk-aaaaaaaaaaaaaaaa"})
    table = load_keys([one, two])
    assert table.tenants == {"a", "b"}
    assert len(table) == 4
    assert table.tenant_for(KEY) == "a"
    assert table.tenant_for(f"{KEY}-next") == "a"
    assert table.tenant_for("sk-aaaaaaaaaaaaaaaa") == "a"
    assert table.tenant_for(KEY[:-1]) is None
    assert parse_key_lines("#only a comment\n", source="x") == []


def test_a_store_keeps_its_keys_when_the_new_set_is_broken(tmp_path: Path) -> None:
    root = _dir(tmp_path / "k", {"a": KEY})
    store = KeyStore([root])
    assert not store.refresh()  # nothing changed
    (root / "b").write_text(KEY)  # now shared by a and b
    assert not store.refresh()
    assert store.table.tenant_for(KEY) == "a"
    (root / "b").write_text("sk-bbbbbbbbbbbbbbbb")
    assert store.refresh()
    assert store.table.tenant_for("sk-bbbbbbbbbbbbbbbb") == "b"


@pytest.mark.parametrize(
    ("headers", "provider", "keys"),
    [
        ({}, Provider.OPENAI, []),
        ({"authorization": "Bearer k1"}, Provider.OPENAI, ["k1"]),
        ({"authorization": "bearer   k1 "}, Provider.OPENAI, ["k1"]),
        ({"authorization": "Basic k1"}, Provider.OPENAI, []),
        ({"x-api-key": "k2", "authorization": "Bearer k1"}, Provider.OPENAI, ["k1", "k2"]),
        ({"x-api-key": "k2", "authorization": "Bearer k1"}, Provider.ANTHROPIC, ["k2", "k1"]),
        ({"x-api-key": " "}, Provider.ANTHROPIC, []),
    ],
)
def test_presented_keys_the_providers_own_header_first(
    headers: dict[str, str], provider: Provider, keys: list[str]
) -> None:
    assert presented_keys(headers, provider) == keys


# (seconds since start, outcome): 2 requests/s, a burst of 2
BUCKET = [(0.0, True), (0.0, True), (0.0, False), (0.5, True), (0.5, False), (2.0, True)]


def test_a_token_bucket_refills_at_its_rate() -> None:
    limiter = TenantLimiter(LimitPolicy(default=Limits(requests_per_second=2, burst=2)))
    got = []
    for t, _ in BUCKET:
        lease = limiter.acquire("a", now=100 + t)
        got.append(not isinstance(lease, Refusal))
        if not isinstance(lease, Refusal):
            lease.release()
    assert got == [ok for _, ok in BUCKET]
    refusal = TenantLimiter(LimitPolicy(default=Limits(requests_per_second=0.1))).acquire
    assert refusal("a", now=0).__class__.__name__ == "Lease"
    second = refusal("a", now=0)
    assert isinstance(second, Refusal) and second.retry_after_s == 10


@pytest.mark.parametrize(
    ("text", "limits"),
    [
        ("", Limits()),
        ("rps=2.5", Limits(requests_per_second=2.5)),
        ("rps=5, burst=10 ,concurrency=3", Limits(5, 10, 3)),
    ],
)
def test_parse_limits(text: str, limits: Limits) -> None:
    assert parse_limits(text) == limits


@pytest.mark.parametrize("text", ["rate=1", "rps", "rps=x", "rps=0", "burst=0", "concurrency=-1"])
def test_parse_limits_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_limits(text)


def test_parse_tenant_limits() -> None:
    assert parse_tenant_limits(("a:rps=1", "b:")) == {"a": Limits(1), "b": Limits()}
    with pytest.raises(ValueError):
        parse_tenant_limits(("rps=1",))


def test_the_cli_needs_keys_for_limits_and_refuses_a_bad_key_set(tmp_path: Path) -> None:
    assert build_gate((), reload_s=1) is None
    with pytest.raises(click.UsageError, match="need --auth-keys-dir"):
        build_gate((), reload_s=1, default_limits="rps=1")
    with pytest.raises(click.BadParameter, match="not a tenant name"):
        build_gate((_dir(tmp_path / "bad", {"A B": KEY}),), reload_s=1)
    gate = build_gate((_dir(tmp_path / "ok", {"a": KEY}),), reload_s=1, overrides=("a:rps=3",))
    assert gate is not None and gate.limits.for_tenant("a") == Limits(3)


def test_tenancy_names_salts_and_scopes() -> None:
    assert valid_tenant("team-a.prod") and not valid_tenant("Team") and not valid_tenant("a/b")
    assert tenant_of_salt(cache_salt_for("team-a")) == "team-a"
    assert tenant_of_salt("something-else") is None and tenant_of_salt(None) is None
    assert tenant_of_headers({}) is None
    with pytest.raises(ValueError):
        tenant_of_headers({"x-kvr-tenant": "Team A"})
    assert scoped_session(None, "s") == "s" and scoped_session("a", "s") != scoped_session("b", "s")
    assert scoped_chain(None, ["h"]) == ["h"]
    assert scoped_chain("a", ["h1", "h2"]) != scoped_chain("b", ["h1", "h2"])
    assert scoped_chain("a", ["h1", "h2"]) == scoped_chain("a", ["h1", "h2"])


async def _with_salt(prompt: str, *, cache_salt: str | None = None) -> None: ...


async def _without_salt(prompt: str) -> None: ...


def test_engine_kwargs_need_an_engine_with_cache_salt() -> None:
    assert engine_kwargs(None, _without_salt) == {}
    assert engine_kwargs("a", _with_salt) == {"cache_salt": cache_salt_for("a")}
    with pytest.raises(TenantIsolationUnavailable):
        engine_kwargs("a", _without_salt)
