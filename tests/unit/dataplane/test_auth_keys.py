"""The pure parts of auth: key files, presented credentials, limits, the CLI's checks, tenancy."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import click
import pytest
from prometheus_client import CollectorRegistry

from kvretention.common.tenancy import (
    TenantIsolationUnavailable,
    cache_salt_for,
    engine_kwargs,
    scoped_chain,
    scoped_session,
    tenant_of_headers,
    tenant_of_salt,
    valid_tenant,
)
from kvretention.dataplane.frontend.auth import (
    AuthMetrics,
    KeysError,
    KeyStore,
    load_keys,
    parse_key_lines,
    presented_keys,
    usable_keys,
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

KEY = "sk-0123456789abcdef"


def _dir(root: Path, files: Mapping[str, str | bytes]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for old in root.iterdir():
        old.unlink()
    for name, text in files.items():
        (root / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    return root


OTHER = "sk-ffffffffffffffff"


@pytest.mark.parametrize(
    ("files", "problem", "tenants"),
    [
        pytest.param({"Team-A": KEY, "b": OTHER}, "Team-A: the file name is not", {OTHER: "b"}),
        pytest.param(
            {"a": f"{KEY}\nshort\n", "b": OTHER},
            "a line 2: a key is at least 16",
            {KEY: "a", OTHER: "b"},
            id="short-key",
        ),
        pytest.param(
            {"a": f"# a\nsk-has a space-000000\n{KEY}"}, "a line 2", {KEY: "a"}, id="space-in-key"
        ),
        pytest.param(
            {"a": b"\xff" + b"sk-aaaaaaaaaaaaaaaa\n" + KEY.encode()},
            "a line 1",
            {KEY: "a", "sk-aaaaaaaaaaaaaaaa": None},
            id="not-utf8-line",
        ),
        pytest.param(
            {"a": KEY, "b": f"# b\n{KEY}\n{OTHER}"},
            "also a key of tenant a",
            {KEY: None, OTHER: "b"},
            id="shared-key-refused-for-both",
        ),
    ],
)
def test_a_broken_line_is_skipped_and_reported_by_file_and_line_never_by_key(
    tmp_path: Path, files: dict[str, str | bytes], problem: str, tenants: dict[str, str | None]
) -> None:
    loaded = load_keys([_dir(tmp_path / "k", files)])
    [reported] = loaded.problems
    assert problem in reported
    for key, tenant in tenants.items():
        assert loaded.table.tenant_for(key) == tenant
        assert key not in reported


def test_a_set_that_cannot_be_read_is_refused_whole(tmp_path: Path) -> None:
    with pytest.raises(KeysError, match="cannot list"):
        usable_keys([tmp_path / "missing"])
    with pytest.raises(KeysError, match=r"no usable key: .*a line 1") as caught:
        usable_keys([_dir(tmp_path / "garbled", {"a": "x" * 8 + " " + KEY})])
    assert KEY not in str(caught.value)
    assert not usable_keys([_dir(tmp_path / "empty", {"a": "# revoked\n"})]).table


def test_key_files_comments_blank_lines_hidden_entries_and_several_dirs(tmp_path: Path) -> None:
    one = _dir(tmp_path / "one", {"a": f"# rotating\n\n{KEY}\n  {KEY}-next  \n", ".hidden": KEY})
    (one / "..data").mkdir()
    two = _dir(tmp_path / "two", {"b": "sk-ffffffffffffffff", "a": "sk-aaaaaaaaaaaaaaaa"})
    loaded = load_keys([one, two])
    assert loaded.problems == ()
    table = loaded.table
    assert table.tenants == {"a", "b"}
    assert len(table) == 4
    assert table.tenant_for(KEY) == "a"
    assert table.tenant_for(f"{KEY}-next") == "a"
    assert table.tenant_for("sk-aaaaaaaaaaaaaaaa") == "a"
    assert table.tenant_for(KEY[:-1]) is None
    assert parse_key_lines("#only a comment\n", source="x") == ([], [])


def _reload_metrics(store: KeyStore) -> CollectorRegistry:
    registry = CollectorRegistry()
    store.metrics = AuthMetrics(registry)
    return registry


def test_a_reload_removes_a_key_though_another_line_is_malformed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Finding 9 of issue 31: one malformed line anywhere refused the whole update, so a key the
    update removed kept working. Now the removal applies and the line is reported."""
    root = _dir(tmp_path / "k", {"a": f"{KEY}\n{KEY}-old\n", "b": OTHER})
    store = KeyStore([root])
    registry = _reload_metrics(store)
    _dir(root, {"a": KEY, "b": f"{OTHER}\n# next\nnot a key\n"})
    assert store.refresh()
    assert store.table.tenant_for(f"{KEY}-old") is None
    assert store.table.tenant_for(KEY) == "a" and store.table.tenant_for(OTHER) == "b"
    assert registry.get_sample_value("kvretention_frontend_auth_key_problems") == 1
    assert registry.get_sample_value("kvretention_frontend_auth_reloads_total", {"outcome": "ok"})
    assert f"{root / 'b'} line 3" in caplog.text
    assert "not a key" not in caplog.text and KEY not in caplog.text
    _dir(root, {"b": OTHER})
    assert store.refresh()
    assert registry.get_sample_value("kvretention_frontend_auth_key_problems") == 0


def test_a_store_keeps_its_keys_when_the_new_set_cannot_be_read(tmp_path: Path) -> None:
    root = _dir(tmp_path / "k", {"a": KEY})
    store = KeyStore([root])
    registry = _reload_metrics(store)
    assert not store.refresh()  # nothing changed
    (root / "a").write_text("garbled whole\n")
    assert not store.refresh()
    assert store.table.tenant_for(KEY) == "a"
    (root / "a").chmod(0)
    if not os.access(root / "a", os.R_OK):  # root reads it anyway
        assert not store.refresh()
        assert store.table.tenant_for(KEY) == "a"
    (root / "a").chmod(0o600)
    assert registry.get_sample_value(
        "kvretention_frontend_auth_reloads_total", {"outcome": "error"}
    )
    (root / "b").write_text(KEY)  # now shared by a and b: refused for both
    (root / "a").write_text(f"{KEY}\n{KEY}-a2")
    assert store.refresh()
    assert store.table.tenant_for(KEY) is None
    assert store.table.tenant_for(f"{KEY}-a2") == "a"
    (root / "b").write_text(OTHER)
    assert store.refresh()
    assert store.table.tenant_for(KEY) == "a" and store.table.tenant_for(OTHER) == "b"


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


def test_each_pod_exports_the_limits_it_enforces(tmp_path: Path) -> None:
    """The operator renders each frontend pod its share of the fleet's limits; the pod says which
    (``kvretention_frontend_tenant_limit``) so N pods' shares can be summed against the spec."""
    from aiohttp import web
    from prometheus_client import CollectorRegistry

    gate = build_gate(
        (_dir(tmp_path / "ok", {"a": KEY, "b": KEY + "-b"}),),
        reload_s=1,
        default_limits="rps=2.5,concurrency=3",
        overrides=("a:rps=10,burst=4",),
    )
    assert gate is not None
    registry = CollectorRegistry()
    gate.install(
        web.Application(),
        registry=registry,
        respond=lambda *_: web.Response(),  # type: ignore[arg-type,return-value]
        provider_for=lambda _: "openai",  # type: ignore[arg-type,return-value]
    )

    def limit(tenant: str, name: str) -> float | None:
        labels = {"tenant": tenant, "limit": name}
        return registry.get_sample_value("kvretention_frontend_tenant_limit", labels)

    assert limit("*", "requests_per_second") == 2.5
    assert limit("*", "burst") == 3  # the rate rounded up: the default bucket
    assert limit("*", "concurrency") == 3
    assert limit("a", "requests_per_second") == 10 and limit("a", "burst") == 4
    assert limit("a", "concurrency") is None  # an override's unset field: unlimited
