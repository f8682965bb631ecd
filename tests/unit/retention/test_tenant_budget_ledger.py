"""The L3 pin budget per tenant: each tenant's pins count against its own part of the share."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvretention.common.tenancy import cache_salt_for
from kvretention.retention import l3
from kvretention.retention.directives import Hold
from kvretention.retention.l3 import L3Settings, PinLedger, RetainedPages, plan_puts
from support.l3_fakes import fake_hash
from support.sglang_radix import retain_hints

NOW = 1_000_000.0
PAGE = 4


# (key, bytes, tenant, outcome): capacity 300, each tenant at most half of it (150)
LEDGER_STEPS: list[tuple[str, int, str | None, str]] = [
    ("a1", 100, "team-a", "pinned"),
    ("a2", 100, "team-a", "over_tenant_budget"),  # team-a would hold 200 > 150
    ("a1", 150, "team-a", "pinned"),  # its own page again: replaced, not added
    ("b1", 100, "team-b", "pinned"),
    ("c1", 100, "team-c", "over_budget"),  # 350 > 300: the client's share refuses first
    ("n1", 50, None, "pinned"),  # no tenant (auth off): only the client's share
    ("b2", 50, "team-b", "over_budget"),
]


def test_the_ledger_keeps_each_tenant_within_its_part() -> None:
    ledger = PinLedger(capacity_bytes=300, tenant_share=0.5)
    got = [
        ledger.place(key, size, ends=NOW + 60, now=NOW, tenant=tenant)
        for key, size, tenant, _ in LEDGER_STEPS
    ]
    assert got == [outcome for *_, outcome in LEDGER_STEPS]
    assert ledger.tenant_bytes() == {"team-a": 150, "team-b": 100}
    assert ledger.pinned_bytes == 300
    # team-a's pin ends: its part is free again, and counted as 0
    assert ledger.place("a3", 100, ends=NOW + 120, now=NOW + 61, tenant="team-a") == "pinned"
    assert ledger.tenant_bytes()["team-a"] == 100
    ledger.forget("a3")
    assert ledger.tenant_bytes()["team-a"] == 0


def _index(pages_of: dict[str, int]) -> tuple[RetainedPages, list[str]]:
    """Retained pages of each tenant, recorded in order (team-a's burst first)."""
    index = RetainedPages()
    objects: list[str] = []
    for tenant, count in pages_of.items():
        pages = [f"{tenant}-p{i}" for i in range(count)]
        index.record(
            pages, [Hold(0, 4, 50, NOW + 3600)] * count, scope=None, rid=tenant, tenant=tenant
        )
        objects += [f"m_{p}_0_{kv}" for p in pages for kv in "kv"]
    return index, objects


@pytest.mark.parametrize(
    ("share", "expected"),
    [
        pytest.param(
            None,
            {"team-a": ["pinned"] * 5, "team-b": ["over_budget"] * 2},
            id="one-shared-budget-team-a-takes-it-all",
        ),
        pytest.param(
            0.6,
            {"team-a": ["pinned"] * 3 + ["over_tenant_budget"] * 2, "team-b": ["pinned"] * 2},
            id="per-tenant-team-b-keeps-its-part",
        ),
    ],
)
def test_one_tenants_hour_long_pins_do_not_take_the_others_budget(
    share: float | None, expected: dict[str, list[str]]
) -> None:
    index, objects = _index({"team-a": 5, "team-b": 2})
    ledger = PinLedger(capacity_bytes=100, tenant_share=share)  # five pages of 2 x 10 bytes
    puts = plan_puts(
        objects,
        [10] * len(objects),
        prefix="m",
        index=index,
        ledger=ledger,
        settings=L3Settings(budget_ratio=0.5, tenant_share=share),
        now=NOW,
    )
    by_tenant: dict[str, list[str]] = {}
    for put in puts[::2]:
        assert put.tenant is not None
        by_tenant.setdefault(put.tenant, []).append(put.outcome)
    assert by_tenant == expected


def test_a_retained_page_names_its_tenant_from_the_requests_cache_salt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(l3, "_hash_pages", fake_hash)
    monkeypatch.setattr(l3, "namespace_seed", lambda extra_key, cache_salt: cache_salt)
    monkeypatch.setattr(l3, "INDEX", RetainedPages())
    tokens = list(range(16))
    hints = retain_hints([{"priority": 50, "duration": 60}], rid="m")
    keys = {}
    for tenant in ("team-a", "team-b", None):
        req = SimpleNamespace(
            rid=f"r-{tenant}",
            kv_hints=hints,
            full_untruncated_fill_ids=tokens,
            origin_input_ids=tokens,
            extra_key=None,
            cache_salt=None if tenant is None else cache_salt_for(tenant),
        )
        l3.remember_request(req, up_to=16, page_size=PAGE, now=NOW)
        keys[tenant] = getattr(req, l3.KEYS_ATTR)
        holds = [l3.INDEX.hold(k, NOW) for k in keys[tenant]]
        assert [h.tenant if h else "-" for h in holds] == [tenant] * 4
    assert len({k for ks in keys.values() for k in ks}) == 12  # three namespaces, no key shared


@pytest.mark.parametrize(
    ("section", "share"),
    [
        pytest.param({"tenant_pin_share": 0.25}, 0.25, id="set"),
        pytest.param({}, None, id="absent"),
        pytest.param({"tenant_pin_share": 0}, None, id="zero-is-no-cap"),
        pytest.param({"tenant_pin_share": 1.5}, None, id="malformed"),
    ],
)
def test_tenant_share_from_the_rendered_file(
    tmp_path: Path, section: dict[str, object], share: float | None
) -> None:
    path = tmp_path / "mooncake.json"
    path.write_text(json.dumps({"kvretention": {"pin_budget_ratio": 0.5, **section}}))
    settings = l3.read_settings({l3.CONFIG_PATH_ENV: str(path)})
    assert settings.tenant_share == share
    assert L3Settings.from_config({"kvretention": settings.to_config()}) == settings
