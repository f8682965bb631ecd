"""Cache-aware placement, the prefix index, and the frontend's affinity inputs (pure)."""

from __future__ import annotations

import hashlib

import pytest

from kvretention.dataplane.frontend.affinity import (
    CHAIN_STRIDE,
    FULL_CHAIN_BLOCKS,
    drop_billing_header,
    prefix_chain,
    session_key,
)
from kvretention.dataplane.protocol import (
    DEFAULT_SESSION_KEYS,
    MAX_PREFIX_HASHES,
    ChatMessage,
    TextPart,
    ToolDefinition,
)
from kvretention.dataplane.router.placement import (
    Balance,
    PrefixIndex,
    WorkerView,
    parse_prefix_header,
    plan_pair,
    plan_worker,
)
from support.worker_views import A, B, C, w


@pytest.mark.parametrize(
    ("workers", "pinned", "matched", "url", "depth"),
    [
        # the longest match wins over the least loaded worker
        ([w(A, 0), w(B, 2)], None, {B: 3}, B, 3),
        ([w(A, 1), w(B, 1), w(C, 0)], None, {A: 2, B: 5}, B, 5),
        # equal matches: the less loaded one
        ([w(A, 3), w(B, 1)], None, {A: 2, B: 2}, B, 2),
        ([w(A, 3, served=1), w(B, 3, served=0)], None, {A: 2, B: 2}, B, 2),
        # no match at all: least outstanding, as before
        ([w(A, 2), w(B, 0)], None, {}, B, 0),
        # a match of the shared first block (tools + system) alone does not decide
        ([w(A, 1), w(B, 0)], None, {A: 1}, B, 0),
        ([w(A, 2), w(B, 0)], None, {C: 9}, B, 0),
        # an unhealthy match is never chosen
        ([w(A, 0, healthy=False), w(B, 1)], None, {A: 9}, B, 0),
        ([w(A, 0, healthy=False), w(B, 1), w(C, 0)], None, {A: 9, B: 3}, B, 3),
        # a session pin beats any match
        ([w(A, 0), w(B, 0)], A, {B: 9}, A, 0),
        # the load guard: 6 above the least loaded and more than 1.5x its load -> least loaded
        ([w(A, 0), w(B, 6)], None, {B: 4}, A, 0),
        # within the guard's absolute slack the match holds
        ([w(A, 0), w(B, 4)], None, {B: 4}, B, 4),
        # above the absolute slack but within 1.5x: the match holds
        ([w(A, 10), w(B, 15)], None, {B: 4}, B, 4),
    ],
)
def test_plan_worker_prefers_the_longest_prefix_within_the_load_guard(
    workers: list[WorkerView], pinned: str | None, matched: dict[str, int], url: str, depth: int
) -> None:
    choice = plan_worker(workers, pinned=pinned, matched=matched, balance=Balance())
    assert choice is not None
    assert (choice.url, choice.matched) == (url, depth)
    assert choice.sticky == (pinned is not None)


def test_plan_pair_matches_the_prefill_side_only() -> None:
    pair = plan_pair(
        [w(A, 0), w(B, 1)],
        [w(C, 0)],
        pinned_prefill=None,
        pinned_decode=None,
        matched_prefill={B: 2},
    )
    assert pair is not None
    assert (pair.prefill.url, pair.prefill.matched, pair.decode.url) == (B, 2, C)


def test_prefix_index_finds_each_workers_longest_match() -> None:
    index = PrefixIndex()
    index.record(["h1", "h2", "h3"], A)
    index.record(["h1", "h2", "x3", "x4"], B)
    assert index.match(["h1", "h2", "h3", "h4"]) == {A: 3, B: 2}
    assert index.match(["h1", "x2"]) == {A: 1, B: 1}
    assert index.match(["z1"]) == {}
    index.forget(A)
    assert index.match(["h1", "h2", "h3"]) == {B: 2}


def test_prefix_index_is_bounded_least_recently_used_first() -> None:
    index = PrefixIndex(max_prefixes=3)
    index.record(["a", "b"], A)
    index.record(["c"], B)
    index.record(["a"], B)  # touches "a": "b" is now the oldest
    index.record(["d"], C)
    assert len(index) == 3
    assert index.match(["b"]) == {}
    assert index.match(["a"]) == {A: 1, B: 1}


@pytest.mark.parametrize(
    ("value", "chain"),
    [(None, []), ("", []), ("a,b , c", ["a", "b", "c"]), ("a,,b", ["a", "b"])],
)
def test_parse_prefix_header(value: str | None, chain: list[str]) -> None:
    assert parse_prefix_header(value) == chain


def test_parse_prefix_header_is_bounded() -> None:
    assert len(parse_prefix_header(",".join(str(i) for i in range(2000)), limit=10)) == 10


# -- the frontend's side ------------------------------------------------------------------------

KEYS = ("x-session-id", "session_id", "x-claude-code-session-id", "metadata.user_id")


@pytest.mark.parametrize(
    ("headers", "body", "expected"),
    [
        ({}, {}, None),
        ({"x-session-id": "s1", "session_id": "codex"}, {}, "s1"),
        ({"session_id": "codex-conv"}, {"prompt_cache_key": "codex-conv"}, "codex-conv"),
        ({"x-claude-code-session-id": "cc"}, {"metadata": {"user_id": "u"}}, "cc"),
        ({}, {"metadata": {"user_id": "user_x_session_1"}}, "user_x_session_1"),
        # prompt_cache_key alone is not affinity
        ({}, {"prompt_cache_key": "k"}, None),
        # wrong types and empty values are skipped, not errors
        ({"x-session-id": ""}, {"metadata": {"user_id": 7}}, None),
        ({}, {"metadata": "not-an-object"}, None),
        ({}, {"metadata": {"user_id": "a\r\nx-evil: 1"}}, "a\r\nx-evil: 1"),
    ],
)
def test_session_key_takes_the_first_source_present(
    headers: dict[str, str], body: dict[str, object], expected: str | None
) -> None:
    assert session_key(KEYS, headers=headers, body=body) == expected


CODEX_ID = "01a2357a-1dde-7173-be1f-c2f6c05635b2"
CC_USER_ID = '{"device_id":"f649","account_uuid":"","session_id":"8548781f"}'


@pytest.mark.parametrize(
    ("headers", "body", "expected"),
    [
        # each default source on its own, as the client sends it
        pytest.param({"X-Session-ID": "s"}, {}, "s", id="x-session-id"),
        pytest.param({"X-Dynamo-Session-ID": "dyn"}, {}, "dyn", id="dynamo-gateway"),
        pytest.param({"thread-id": "thr"}, {}, "thr", id="codex-thread-id"),
        pytest.param({"session-id": CODEX_ID}, {}, CODEX_ID, id="codex-session-id"),
        pytest.param({"session_id": "old"}, {}, "old", id="older-codex-session_id"),
        pytest.param({"X-Claude-Code-Session-Id": "cc"}, {}, "cc", id="claude-code-header"),
        pytest.param(
            {}, {"client_metadata": {"session_id": CODEX_ID}}, CODEX_ID, id="codex-client-metadata"
        ),
        pytest.param({}, {"metadata": {"user_id": CC_USER_ID}}, CC_USER_ID, id="claude-code-user"),
        # Codex 0.169 sends all three; a sub-agent's thread differs from the root session
        pytest.param(
            {"session-id": "root", "thread-id": "sub"},
            {"client_metadata": {"session_id": "root"}},
            "sub",
            id="codex-thread-wins",
        ),
        # an explicit key, or a gateway's, wins over what the client says
        pytest.param(
            {"x-dynamo-session-id": "dyn", "x-claude-code-session-id": "cc"},
            {"metadata": {"user_id": CC_USER_ID}},
            "dyn",
            id="gateway-first",
        ),
        pytest.param({"x-session-id": "s", "x-dynamo-session-id": "d"}, {}, "s", id="explicit"),
        pytest.param({}, {"client_metadata": "no"}, None, id="client-metadata-not-an-object"),
    ],
)
def test_default_session_keys_take_what_the_clients_send(
    headers: dict[str, str], body: dict[str, object], expected: str | None
) -> None:
    from multidict import CIMultiDict

    found = session_key(DEFAULT_SESSION_KEYS, headers=CIMultiDict(headers), body=body)
    assert found == expected


def test_session_key_order_is_configurable() -> None:
    headers = {"x-session-id": "h"}
    body = {"metadata": {"user_id": "m"}}
    assert session_key(("metadata.user_id", "x-session-id"), headers=headers, body=body) == "m"


def _conversation(turns: int) -> list[ChatMessage]:
    messages = [ChatMessage(role="system", content="You are a coding agent.")]
    for i in range(turns):
        messages.append(ChatMessage(role="user", content=f"turn {i}"))
        messages.append(ChatMessage(role="assistant", content=f"answer {i}"))
    return messages


TOOLS = [ToolDefinition(name="bash", parameters={"type": "object"})]


def test_prefix_chain_shares_exactly_the_shared_blocks() -> None:
    turn1 = prefix_chain(_conversation(1), TOOLS)
    turn2 = prefix_chain(_conversation(2), TOOLS)
    assert len(turn1) == 3 and len(turn2) == 5
    assert turn2[:3] == turn1
    other_tools = prefix_chain(_conversation(2), [ToolDefinition(name="edit")])
    assert not set(other_tools) & set(turn2)  # the head block differs, so every hash does
    edited = _conversation(2)
    edited[1] = ChatMessage(role="user", content="turn 0, edited")
    chain = prefix_chain(edited, TOOLS)
    assert chain[0] == turn2[0] and not set(chain[1:]) & set(turn2[1:])


def test_prefix_chain_of_a_long_conversation_keeps_stable_positions() -> None:
    long = prefix_chain(_conversation(100), TOOLS)
    longer = prefix_chain(_conversation(101), TOOLS)
    # 201 blocks: the first 32, then 32, 40, ..., 200 (which is also the last)
    assert len(long) == FULL_CHAIN_BLOCKS + len(range(FULL_CHAIN_BLOCKS, 201, CHAIN_STRIDE)) == 54
    assert long[:-1] == longer[: len(long) - 1]  # every sampled position but the last is shared


@pytest.mark.parametrize("turns", [1_800, 2_000, 5_000])
def test_prefix_chain_of_a_very_long_conversation_fits_the_routers_header_limit(
    turns: int,
) -> None:
    """From ~3,600 blocks the whole chain would pass the 8,190 bytes a header may have (the
    router refused it: a 502 the SDKs retried); the capped chain still places the next turn."""
    chain = prefix_chain(_conversation(turns), TOOLS)
    following = prefix_chain(_conversation(turns + 1), TOOLS)
    assert len(chain) <= MAX_PREFIX_HASHES
    assert len(",".join(chain)) <= 8190
    assert parse_prefix_header(",".join(chain)) == chain
    assert chain[:-1] == following[: len(chain) - 1]  # the next turn matches the served worker
    assert chain[-1] != following[-1]  # and the last hash is still the whole conversation's


def test_prefix_chain_of_the_same_message_objects_follows_their_prefix() -> None:
    """The chain remembers each message object's step (an agent's next request repeats them):
    the same objects behind another head, in another order or after an edit hash as new ones."""
    messages = _conversation(40)
    fresh = [m.model_copy() for m in messages]
    assert prefix_chain(messages, TOOLS) == prefix_chain(fresh, TOOLS)
    assert prefix_chain(messages, TOOLS) == prefix_chain(fresh, TOOLS)  # remembered steps
    other = [ToolDefinition(name="edit")]
    assert prefix_chain(messages, other) == prefix_chain(fresh, other)
    swapped = [messages[0], messages[2], messages[1], *messages[3:]]
    swapped_fresh = [fresh[0], fresh[2], fresh[1], *fresh[3:]]
    assert prefix_chain(swapped, TOOLS) == prefix_chain(swapped_fresh, TOOLS)
    assert prefix_chain(swapped, TOOLS)[3:] != prefix_chain(messages, TOOLS)[3:]


def test_drop_billing_header_keeps_the_rest_of_the_system_prompt() -> None:
    billing = TextPart(text="x-anthropic-billing-header: cc_version=2.0.14; cch=ab12;")
    system = ChatMessage(role="system", content=[billing, TextPart(text="You are Claude Code.")])
    user = ChatMessage(role="user", content="x-anthropic-billing-header: is user text")
    out, dropped = drop_billing_header([system, user])
    assert dropped
    assert out == [
        ChatMessage(role="system", content=[TextPart(text="You are Claude Code.")]),
        user,
    ]
    only = ChatMessage(role="system", content="x-anthropic-billing-header: cc_version=1; cch=2;")
    assert drop_billing_header([only, user]) == ([user], True)
    assert drop_billing_header([user]) == ([user], False)
    # blocks joined into one string: only the header line goes
    joined = ChatMessage(
        role="system", content="x-anthropic-billing-header: cc_version=1; cch=2;\nYou are Claude."
    )
    assert drop_billing_header([joined]) == (
        [ChatMessage(role="system", content="You are Claude.")],
        True,
    )
    plain = ChatMessage(role="system", content="Mentions x-anthropic-billing-header: mid-line.")
    assert drop_billing_header([plain]) == ([plain], False)


@pytest.mark.parametrize(
    ("value", "keys"),
    [
        (
            "x-session-id,session_id,metadata.user_id",
            ("x-session-id", "session_id", "metadata.user_id"),
        ),
        (" a , b ", ("a", "b")),
        ("client_metadata.session_id,thread-id", ("client_metadata.session_id", "thread-id")),
        ("", ()),
    ],
)
def test_frontend_session_keys_flag(value: str, keys: tuple[str, ...]) -> None:
    from kvretention.dataplane.session_keys import parse_session_keys

    assert parse_session_keys(value) == keys


@pytest.mark.parametrize(
    "value", ["a b", "metadata.", "metadata.user id", "-x", "other_metadata.x", "client_metadata."]
)
def test_frontend_session_keys_flag_refuses_malformed_keys(value: str) -> None:
    import click

    from kvretention.dataplane.session_keys import parse_session_keys

    with pytest.raises(click.BadParameter):
        parse_session_keys(value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("conv-1", "conv-1"),
        ("a\r\nx-evil: 1", "sha256:" + hashlib.sha256(b"a\r\nx-evil: 1").hexdigest()),
        ("sess-\u00e9", "sha256:" + hashlib.sha256("sess-\u00e9".encode()).hexdigest()),
    ],
)
def test_session_header_to_the_router_is_header_safe(value: str, expected: str) -> None:
    from kvretention.dataplane.frontend.affinity import header_safe

    assert header_safe(value) == expected
