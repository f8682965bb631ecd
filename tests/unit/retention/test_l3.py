"""The L3 half of the retention plugin, its pure parts: which pages get a pin, for how long, and
the per-client budget. The hooks themselves run on SGLang's MooncakeStore in ``tests/l3``."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvretention.retention import l3
from kvretention.retention.directives import Hold
from kvretention.retention.l3 import (
    DEFAULT_MAX_PIN_TTL_MS,
    L3Settings,
    PagePut,
    PinLedger,
    RetainedPages,
    client_budget_bytes,
    page_holds,
    page_of,
    plan_puts,
    read_settings,
    record_request,
)
from support.l3_fakes import (
    MASTER_CONFIG,
    fake_hash,
    fake_store,
    serve_master_metrics,
    use_mooncake_config,
)

NOW = 1_000_000.0
PAGE = 4


def retain(*directives: dict[str, object], scope: str | None = "s") -> dict[str, object]:
    payload = {"scope": scope, "directives": list(directives)}
    action = {"action_id": "a", "action_type": "kv.retain", "action_version": "1.0"}
    return {
        "protocol_version": "0.1",
        "message_id": "m",
        "actions": [{**action, "payload": payload}],
    }


@pytest.mark.parametrize(
    ("holds", "expected"),
    [
        pytest.param([], [None, None, None], id="no-hold"),
        pytest.param([Hold(0, 8, 50, NOW + 60)], [(50, NOW + 60)] * 2 + [None], id="two-pages"),
        pytest.param(
            [Hold(0, 12, 30, NOW + 60), Hold(4, 8, 70, NOW + 10)],
            [(30, NOW + 60), (70, NOW + 60), (30, NOW + 60)],
            id="overlap-highest-priority-latest-expiry",
        ),
        pytest.param(
            [Hold(0, 4, 50, None), Hold(0, 4, 20, NOW + 5)], [(50, None), None, None], id="forever"
        ),
        pytest.param([Hold(4, 8, 0, None)], [None, (0, None), None], id="release"),
    ],
)
def test_page_holds(holds: list[Hold], expected: list[tuple[int, float | None] | None]) -> None:
    got = page_holds(holds, pages=3, page_size=PAGE)
    assert [None if h is None else (h.priority, h.until) for h in got] == expected


def _record(index: RetainedPages, hints: object, *, tokens: int = 16, **kw: object) -> int:
    return record_request(
        index,
        kv_hints=hints,
        tokens=list(range(tokens)),
        prompt_len=tokens,
        page_size=PAGE,
        seed=kw.pop("seed", None),  # type: ignore[arg-type]
        rid=kw.pop("rid", "r"),  # type: ignore[arg-type]
        now=NOW,
        hash_pages=fake_hash,
    )


KEYS = fake_hash(list(range(16)), None, PAGE)


@pytest.mark.parametrize(
    ("hints", "held"),
    [
        pytest.param(None, [], id="unhinted"),
        pytest.param(retain({"priority": 50, "duration": 60}), [0, 1, 2, 3], id="whole-prompt"),
        pytest.param(
            retain({"start": 2, "end": 11, "priority": 50, "duration": 60}),
            [1],
            id="rounded-inwards-never-widened",
        ),
        pytest.param(retain({"priority": 0, "duration": 60}), [], id="release-only"),
        pytest.param({"actions": [{"action_type": "other"}]}, [], id="other-action"),
    ],
)
def test_record_request_holds_exactly_the_retained_pages(hints: object, held: list[int]) -> None:
    index = RetainedPages()
    _record(index, hints)
    assert [i for i, k in enumerate(KEYS) if index.hold(k, NOW) is not None] == held


def test_the_namespace_seed_changes_every_key() -> None:
    index = RetainedPages()
    _record(index, retain({"priority": 50, "duration": 60}), seed="salted")
    assert all(index.hold(k, NOW) is None for k in KEYS)
    assert len(index) == 4


def test_holds_per_scope_release_and_expiry() -> None:
    index = RetainedPages()
    _record(index, retain({"priority": 50, "duration": 60}, scope="a"), rid="ra")
    _record(index, retain({"priority": 50, "duration": 600}, scope="b"), rid="rb")
    hold = index.hold(KEYS[0], NOW)
    assert hold is not None and (hold.until, hold.rid) == (NOW + 600, "rb")
    _record(index, retain({"priority": 0, "duration": 1}, scope="b"))
    hold = index.hold(KEYS[0], NOW)
    assert hold is not None and (hold.until, hold.rid) == (NOW + 60, "ra")
    assert index.hold(KEYS[0], NOW + 61) is None  # expired, and forgotten
    assert len(index) == 3


def test_retained_pages_are_bounded() -> None:
    index = RetainedPages(capacity=3)
    _record(index, retain({"priority": 50, "duration": 60}))
    assert len(index) == 3
    assert index.hold(KEYS[0], NOW) is None and index.hold(KEYS[3], NOW) is not None


@pytest.mark.parametrize(
    ("key", "prefix", "page"),
    [
        ("abc123_0_k", None, "abc123"),
        ("kvr-l3-model_abc123_0_v", "kvr-l3-model", "abc123"),
        ("m_x_abc123_1_2_k", "m_x", "abc123"),
        ("abc123", None, "abc123"),
    ],
)
def test_page_of(key: str, prefix: str | None, page: str) -> None:
    assert page_of(key, prefix) == page


def test_ledger_admits_up_to_its_share_and_frees_at_expiry() -> None:
    ledger = PinLedger(capacity_bytes=300)
    assert ledger.admit("a", 100, ends=NOW + 10, now=NOW)
    assert ledger.admit("b", 200, ends=NOW + 20, now=NOW)
    assert not ledger.admit("c", 1, ends=NOW + 20, now=NOW)
    assert ledger.pinned_bytes == 300
    assert ledger.admit("a", 100, ends=NOW + 30, now=NOW + 1)  # the same page again: replaced
    assert ledger.pinned_bytes == 300
    assert ledger.admit("c", 100, ends=NOW + 40, now=NOW + 20)  # b has ended
    assert ledger.pinned_bytes == 200
    assert PinLedger(capacity_bytes=None).admit("x", 10**15, ends=NOW + 1, now=NOW)


def _plan(
    keys: list[str], index: RetainedPages, ledger: PinLedger, settings: L3Settings, **kw: float
) -> list[PagePut]:
    sizes = [10] * len(keys)
    return plan_puts(
        keys,
        sizes,
        prefix="m",
        index=index,
        ledger=ledger,
        settings=settings,
        now=kw.get("now", NOW),
    )


def test_plan_puts_pins_both_objects_of_a_page_for_the_remaining_time_capped() -> None:
    index = RetainedPages()
    index.record(
        ["p1", "p2", "p3"],
        [Hold(0, 4, 50, NOW + 90.5), Hold(4, 8, 50, None), Hold(8, 12, 50, NOW + 0.5)],
        scope=None,
        rid="r",
    )
    objects = [f"m_{p}_0_{kv}" for p in ("p1", "p2", "p3", "p4") for kv in "kv"]
    puts = _plan(objects, index, PinLedger(None), L3Settings(max_pin_ttl_ms=60_000))
    assert [(p.page, p.outcome, p.ttl_ms) for p in puts[::2]] == [
        ("p1", "pinned", 60_000),  # 90.5 s left, capped by the master's 60 s
        ("p2", "pinned", 60_000),  # no expiry: the longest pin the master takes
        ("p3", "expired", None),  # under a second left
        ("p4", "unretained", None),
    ]
    assert puts[::2] == puts[1::2]
    short = _plan(objects[:2], index, PinLedger(None), L3Settings(), now=NOW + 80.2)
    assert short[0].ttl_ms == 10_000  # whole seconds, rounded down: never past the hold


def test_plan_puts_past_the_budget_writes_unpinned() -> None:
    index = RetainedPages()
    pages = [f"p{i}" for i in range(5)]
    index.record(pages, [Hold(0, 4, 50, NOW + 60)] * 5, scope=None, rid="r")
    ledger = PinLedger(capacity_bytes=60)  # three pages of two 10-byte objects
    objects = [f"m_{p}_0_{kv}" for p in pages for kv in "kv"]
    puts = _plan(objects, index, ledger, L3Settings(budget_ratio=0.5))
    assert [p.outcome for p in puts[::2]] == ["pinned"] * 3 + ["over_budget"] * 2
    assert all(p.rid == "r" for p in puts)
    assert ledger.pinned_bytes == 60


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        pytest.param(None, L3Settings(), id="absent"),
        pytest.param(
            {"pin_budget_ratio": 0.25, "max_pin_ttl_ms": 60_000}, L3Settings(0.25, 60_000), id="set"
        ),
        pytest.param(
            {"pin_budget_ratio": "x", "max_pin_ttl_ms": -1},
            L3Settings(None, DEFAULT_MAX_PIN_TTL_MS),
            id="malformed-keeps-defaults",
        ),
    ],
)
def test_settings_from_the_rendered_file(
    tmp_path: Path, section: dict[str, object] | None, expected: L3Settings
) -> None:
    path = tmp_path / "mooncake.json"
    config: dict[str, object] = {"master_server_address": "h:1"}
    if section is not None:
        config["kvretention"] = section
    path.write_text(json.dumps(config))
    assert read_settings({"SGLANG_HICACHE_MOONCAKE_CONFIG_PATH": str(path)}) == expected
    assert (
        L3Settings.from_config(json.loads(json.dumps({"kvretention": expected.to_config()})))
        == expected
    )


def test_settings_without_a_file() -> None:
    assert read_settings({}) == L3Settings()
    assert read_settings({"SGLANG_HICACHE_MOONCAKE_CONFIG_PATH": "/nonexistent"}) == L3Settings()


def test_client_budget_is_the_ratio_of_its_own_segment() -> None:
    assert client_budget_bytes(L3Settings(budget_ratio=0.25), 16 * 2**20) == 4 * 2**20
    assert client_budget_bytes(L3Settings(), 16 * 2**20) is None


def test_a_request_is_hashed_once_across_its_checkpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunked prefill checkpoints a request several times: its page keys are extended, never
    recomputed, and equal the chain over all its tokens at once."""
    hashed: list[int] = []

    def counting(tokens: Sequence[int], seed: str | None, page_size: int) -> list[str]:
        hashed.append(len(tokens))
        return fake_hash(tokens, seed, page_size)

    monkeypatch.setattr(l3, "_hash_pages", counting)
    monkeypatch.setattr(l3, "namespace_seed", lambda extra_key, cache_salt: cache_salt)
    monkeypatch.setattr(l3, "INDEX", RetainedPages())
    tokens = list(range(40))
    req = SimpleNamespace(
        rid="r",
        kv_hints=retain({"priority": 50, "duration": 60}),
        full_untruncated_fill_ids=tokens,
        origin_input_ids=tokens,
        extra_key=None,
        cache_salt="salt",
    )
    for up_to in (9, 18, 40):
        l3.remember_request(req, up_to=up_to, page_size=PAGE, now=NOW)
    assert hashed == [8, 8, 24]
    assert getattr(req, l3.KEYS_ATTR) == fake_hash(tokens, "salt", PAGE)
    assert all(l3.INDEX.hold(k, NOW) is not None for k in fake_hash(tokens, "salt", PAGE))


@pytest.mark.parametrize(
    ("cache", "writes"),
    [
        (SimpleNamespace(enable_storage=False), False),
        (SimpleNamespace(enable_storage=True), True),
        (
            SimpleNamespace(
                enable_storage=True,
                cache_controller=SimpleNamespace(storage_backend_type="mooncake"),
            ),
            True,
        ),
        (
            SimpleNamespace(
                enable_storage=True,
                cache_controller=SimpleNamespace(storage_backend_type="dynamic"),
            ),
            True,
        ),
        (
            SimpleNamespace(
                enable_storage=True, cache_controller=SimpleNamespace(storage_backend_type="file")
            ),
            False,
        ),
    ],
    ids=["no-storage", "unknown-backend", "mooncake", "dynamic", "file"],
)
def test_only_trees_writing_to_mooncake_record_holds(cache: object, writes: bool) -> None:
    assert l3._writes_to_mooncake(cache) is writes


def test_a_new_budget_reaches_a_running_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = use_mooncake_config(monkeypatch, tmp_path, {"kvretention": {"pin_budget_ratio": 0.5}})
    store = fake_store(segment_bytes=4000, tp_size=2)
    try:
        assert l3.client_state(store, now=0.0).ledger.capacity_bytes == 1000  # half of 4000 / 2
        path.write_text(json.dumps({"kvretention": {"pin_budget_ratio": 0.25}}))
        assert l3.client_state(store, now=1.0).ledger.capacity_bytes == 1000  # not re-read yet
        refreshed = l3.client_state(store, now=l3.SETTINGS_REFRESH_S)
        assert refreshed.ledger.capacity_bytes == 500
        assert refreshed.settings.budget_ratio == 0.25
    finally:
        l3._CLIENTS.pop(id(store), None)


@pytest.mark.parametrize(
    ("scope", "second", "until"),
    [
        (None, 30, NOW + 600),  # unscoped: another request's shorter hold never shortens it
        (None, 900, NOW + 900),  # ...but a longer one extends it
        ("s", 30, NOW + 30),  # a named scope's latest directive is its intent
    ],
    ids=["unscoped-never-shortened", "unscoped-extended", "named-replaced"],
)
def test_a_second_hold_on_the_same_pages(scope: str | None, second: int, until: float) -> None:
    index = RetainedPages()
    _record(index, retain({"priority": 50, "duration": 600}, scope=scope), rid="first")
    _record(index, retain({"priority": 50, "duration": second}, scope=scope), rid="second")
    hold = index.hold(KEYS[0], NOW)
    assert hold is not None and hold.until == until


def test_a_failing_hook_hands_the_batch_to_sglangs_own_put() -> None:
    """Fail open: whatever breaks in the hook, SGLang's unpinned put runs and it is counted."""
    calls: list[tuple[object, ...]] = []

    def original(store: object, *args: object) -> list[int]:
        calls.append((store, *args))
        return [0, 0]

    broken = SimpleNamespace()  # no ``config``: the hook cannot size its budget
    before = l3.STATS.hook_failures
    got = l3._put_with_pins(original, broken, ["a_0_k", "a_0_v"], [1, 2], [10, 10], None)
    assert got == [0, 0]
    assert calls == [(broken, ["a_0_k", "a_0_v"], [1, 2], [10, 10], None)]
    assert l3.STATS.hook_failures == before + 1


@pytest.mark.parametrize(
    ("config", "url"),
    [
        pytest.param(
            {"master_server_address": "m.ns.svc:50051", "master_metrics_port": 9003},
            "http://m.ns.svc:9003/metrics",
            id="managed",
        ),
        pytest.param({"master_server_address": "m:50051"}, None, id="external-no-port"),
        pytest.param({"master_metrics_port": 9003}, None, id="no-address"),
        pytest.param(
            {"master_server_address": "m:1", "master_metrics_port": "9003"}, None, id="port-text"
        ),
        pytest.param({"master_server_address": "m:1", "master_metrics_port": 0}, None, id="port-0"),
    ],
)
def test_the_masters_metrics_url_from_the_rendered_file(
    config: dict[str, object], url: str | None
) -> None:
    assert l3.master_metrics_url(config) == url
    assert L3Settings.from_config(config).metrics_url == url


# A new ledger (capacity 100, objects of 10 bytes) reserves its share; readings of the pool's
# pinned objects only ever shrink it; it ends at the longest pin (NOW + 60).
# (pinned objects read, time, bytes reserved, admits a 30-byte pin)
RESERVATIONS = [
    pytest.param([], NOW, 100, False, id="no-reading-whole-share"),
    pytest.param([0], NOW, 0, True, id="empty-pool-nothing-reserved"),
    pytest.param([8], NOW, 80, False, id="pool-pins-reserved"),
    pytest.param([6], NOW, 60, True, id="room-beside-the-reservation"),
    pytest.param([50], NOW, 100, False, id="never-more-than-the-share"),
    pytest.param([4, 9], NOW, 40, True, id="a-later-higher-reading-never-grows-it"),
    pytest.param([9, 2], NOW, 20, True, id="pins-that-ended-free-it"),
    pytest.param([], NOW + 60, 0, True, id="the-longest-pin-has-passed"),
    pytest.param([8], NOW + 60, 0, True, id="the-longest-pin-has-passed-after-a-reading"),
]


@pytest.mark.parametrize(("readings", "at", "reserved", "admits"), RESERVATIONS)
def test_a_new_ledger_reserves_its_share_for_an_earlier_processs_pins(
    readings: list[int], at: float, reserved: int, admits: bool
) -> None:
    ledger = PinLedger(capacity_bytes=100)
    ledger.reserve_share(until=NOW + 60)
    ledger.note_objects([10, 4])
    for pinned in readings:
        ledger.observe_pool(pinned)
    assert ledger.reserved(at) == reserved
    assert ledger.admit("p", 30, ends=at + 10, now=at) is admits
    assert ledger.pinned_bytes == (30 if admits else 0)
    assert ledger.reservation_settled(at) is (reserved == 0)


def test_no_reservation_without_a_budget_or_on_a_plain_ledger() -> None:
    unbudgeted = PinLedger(capacity_bytes=None)
    unbudgeted.reserve_share(until=NOW + 60)
    assert unbudgeted.reserved(NOW) == 0
    assert unbudgeted.admit("p", 10**9, ends=NOW + 10, now=NOW)
    assert PinLedger(capacity_bytes=100).reserved(NOW) == 0


FIXTURE = Path(__file__).parents[2] / "fixtures" / "mooncake_master_metrics.prom"


def test_the_pools_pinned_objects_from_the_masters_metrics() -> None:
    assert l3.pool_pinned_keys(FIXTURE.read_text()) == 8
    with pytest.raises(ValueError, match="missing"):
        l3.pool_pinned_keys("up 1\n")


@pytest.mark.parametrize("readable", [True, False], ids=["master-read", "master-unreadable"])
def test_a_new_client_reads_the_pool_off_the_write_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, readable: bool
) -> None:
    """The first put finds the whole share reserved and returns at once; a thread reads the
    master and shrinks the reservation. An unreadable master keeps it (pins wait, puts go on)."""
    server, port = serve_master_metrics([FIXTURE.read_bytes()])
    if not readable:
        server.shutdown()
        server.server_close()
    use_mooncake_config(monkeypatch, tmp_path, {**MASTER_CONFIG, "master_metrics_port": port})
    monkeypatch.setattr(l3, "POOL_READ_S", 0.05)
    store = fake_store()
    try:
        state = l3.client_state(store)
        assert state.settings.metrics_url == f"http://127.0.0.1:{port}/metrics"
        # Unreadable: no reading ever arrives (a second of failed tries shows it).
        assert state.pool_read.wait(30 if readable else 1) is readable
        state.ledger.note_objects([262_144])  # what the first put does before it plans
        expected = 8 * 262_144 if readable else 8 * 1024 * 1024  # 8 pinned; or half of 16 MiB
        assert state.ledger.reserved(time.time()) == expected
    finally:
        l3._CLIENTS.pop(id(store), None)
        state.closed.set()  # ends the reading thread
        if readable:
            server.shutdown()
