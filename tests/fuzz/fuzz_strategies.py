"""Shared Hypothesis strategies: arbitrary JSON, and request bodies built around the real fields.

The field-shaped bodies matter more than pure noise: random dicts almost never name
``prompt_cache_options`` or put a ``cache_control`` on a nested block, so each provider's real
field names appear here with right and wrong types at every level.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import currently_in_test_context, event, settings
from hypothesis import strategies as st

SCALE = int(os.environ.get("KVR_FUZZ_SCALE", "1"))


def budget(examples: int) -> settings:
    """A test's example budget, multiplied by ``KVR_FUZZ_SCALE`` when hunting by hand."""
    return settings(max_examples=examples * SCALE)


def outcome(name: str) -> None:
    """Count an outcome for ``--hypothesis-show-statistics`` (a no-op outside a property test)."""
    if currently_in_test_context():
        event(name)


# -- arbitrary JSON ------------------------------------------------------------------------------

FIELD_NAMES = (
    "prompt_cache_options",
    "prompt_cache_breakpoint",
    "prompt_cache_key",
    "prompt_cache_retention",
    "cache_control",
    "messages",
    "content",
    "system",
    "tools",
    "input",
    "output",
    "source",
    "role",
    "type",
    "text",
    "mode",
    "ttl",
    "model",
    "max_tokens",
    "stream",
    "prewarm",
)

keys = st.sampled_from(FIELD_NAMES) | st.text(max_size=6)
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=8)
    | st.sampled_from(["30m", "12h", "5m", "1h", "implicit", "explicit", "ephemeral", "text", ""])
)
json_values: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=16,
)
json_objects = st.dictionaries(keys, json_values, max_size=6)


def right_or_wrong(right: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly the right shape, sometimes any JSON value (the wrong type at this level)."""
    return st.one_of(right, right, right, json_values)


def optional_fields(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A dict holding any subset of ``fields``, each drawn from its strategy."""
    return st.fixed_dictionaries({}, optional=fields)


# -- provider-shaped pieces ----------------------------------------------------------------------

openai_options = right_or_wrong(
    optional_fields(
        mode=right_or_wrong(st.sampled_from(["implicit", "explicit", "other"])),
        ttl=right_or_wrong(st.sampled_from(["30m", "12h", "24h", "5m"])),
        prewarm=right_or_wrong(st.booleans()),
        comparison_response_id=right_or_wrong(st.text(max_size=4)),
        extra=json_values,
    )
)
anthropic_control = right_or_wrong(
    optional_fields(
        type=right_or_wrong(st.sampled_from(["ephemeral", "persistent"])),
        ttl=right_or_wrong(st.sampled_from(["5m", "1h", "30m"])),
        extra=json_values,
    )
)
breakpoint_marker = right_or_wrong(st.just({"mode": "explicit"}))

part_types = st.sampled_from(
    [
        "text",
        "input_text",
        "output_text",
        "refusal",
        "image_url",
        "image",
        "document",
        "tool_result",
        "tool_use",
        "thinking",
        "redacted_thinking",
        "tool_reference",
        "tool_addition",
        "tool_removal",
    ]
)
roles = st.sampled_from(["system", "developer", "user", "assistant", "tool", "bot"])


def _parts(marker_key: str, marker: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    part = optional_fields(
        type=right_or_wrong(part_types),
        text=right_or_wrong(st.text(max_size=8)),
        refusal=right_or_wrong(st.text(max_size=8)),
        input_text=right_or_wrong(st.text(max_size=8)),
        tool_name=right_or_wrong(st.sampled_from(["Read", "Bash", "x"])),
        tool=right_or_wrong(
            optional_fields(
                type=right_or_wrong(st.sampled_from(["tool_definition", "tool_reference"])),
                name=right_or_wrong(st.sampled_from(["Read", "x"])),
                definition=right_or_wrong(
                    optional_fields(
                        name=right_or_wrong(st.sampled_from(["Read", "New"])),
                        input_schema=right_or_wrong(st.just({"type": "object"})),
                    )
                ),
            )
        ),
        **{marker_key: marker},
    )
    nested = optional_fields(
        type=right_or_wrong(part_types),
        content=right_or_wrong(st.lists(part, max_size=2)),
        source=right_or_wrong(optional_fields(content=right_or_wrong(st.lists(part, max_size=2)))),
        **{marker_key: marker},
    )
    return right_or_wrong(st.text(max_size=8) | st.lists(part | nested, max_size=3))


def _messages(marker_key: str, marker: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    message = optional_fields(
        role=right_or_wrong(roles),
        content=_parts(marker_key, marker),
        type=right_or_wrong(st.sampled_from(["message", "function_call_output"])),
        output=_parts(marker_key, marker),
        tool_calls=json_values,
        output_config=json_values,
        **{marker_key: marker},
    )
    return right_or_wrong(st.lists(message, max_size=3))


# Codex 0.169's tool shapes: namespaces, tool search, deferred tools (issue 20)
_tool_kinds = st.sampled_from(["function", "custom", "namespace", "tool_search", "web_search", "x"])
_inner_tool = optional_fields(
    type=right_or_wrong(_tool_kinds),
    name=right_or_wrong(st.sampled_from(["a", "b", "exec", "", "a.b"])),
    parameters=right_or_wrong(st.just({"type": "object"})),
    defer_loading=right_or_wrong(st.booleans()),
    extra=json_values,
)
responses_tools = right_or_wrong(
    st.lists(
        optional_fields(
            type=right_or_wrong(_tool_kinds),
            name=right_or_wrong(st.sampled_from(["a", "functions", "collaboration", "_"])),
            description=right_or_wrong(st.text(max_size=4)),
            tools=right_or_wrong(st.lists(_inner_tool, max_size=3)),
            execution=right_or_wrong(st.sampled_from(["client", "server", "x"])),
            parameters=json_values,
            defer_loading=right_or_wrong(st.booleans()),
        ),
        max_size=3,
    )
)
_responses_items = right_or_wrong(
    st.lists(
        optional_fields(
            type=right_or_wrong(
                st.sampled_from(["additional_tools", "message", "function_call", "x"])
            ),
            role=right_or_wrong(st.sampled_from(["developer", "user"])),
            tools=responses_tools,
            content=right_or_wrong(st.text(max_size=4)),
            call_id=right_or_wrong(st.sampled_from(["c1", "c2"])),
            name=right_or_wrong(st.sampled_from(["a", "exec"])),
            namespace=right_or_wrong(st.sampled_from(["functions", "collaboration", "x"])),
            arguments=right_or_wrong(st.just("{}")),
        ),
        max_size=3,
    )
)


_common_openai = {
    "model": right_or_wrong(st.just("m")),
    "prompt_cache_options": openai_options,
    "prompt_cache_key": right_or_wrong(st.text(max_size=4)),
    "prompt_cache_retention": right_or_wrong(st.sampled_from(["in_memory", "24h", "1d"])),
    "stream": right_or_wrong(st.booleans()),
    "temperature": right_or_wrong(st.floats(min_value=-1, max_value=3)),
    "top_p": right_or_wrong(st.floats(min_value=-1, max_value=2)),
    "n": json_values,
    "tools": json_values,
    "response_format": json_values,
    "metadata": json_values,
}

chat_bodies = optional_fields(
    **_common_openai,
    messages=_messages("prompt_cache_breakpoint", breakpoint_marker),
    max_tokens=right_or_wrong(st.integers(min_value=-5, max_value=2**70)),
    max_completion_tokens=right_or_wrong(st.integers(min_value=-5, max_value=10)),
    stop=right_or_wrong(st.lists(st.text(max_size=3), max_size=6)),
    stream_options=right_or_wrong(optional_fields(include_usage=json_values)),
    seed=right_or_wrong(st.integers()),
    logprobs=json_values,
)
responses_bodies = optional_fields(
    **{**_common_openai, "tools": responses_tools},
    input=right_or_wrong(
        st.text(max_size=8)
        | _messages("prompt_cache_breakpoint", breakpoint_marker)
        | _responses_items
    ),
    instructions=right_or_wrong(st.text(max_size=8)),
    reasoning=right_or_wrong(
        optional_fields(
            effort=right_or_wrong(st.sampled_from(["low", "xhigh"])),
            context=right_or_wrong(st.sampled_from(["auto", "all_turns", "x"])),
        )
    ),
    max_output_tokens=right_or_wrong(st.integers(min_value=-5, max_value=10)),
    previous_response_id=json_values,
    background=json_values,
)
messages_bodies = optional_fields(
    model=right_or_wrong(st.just("m")),
    max_tokens=right_or_wrong(st.integers(min_value=-5, max_value=2**70)),
    messages=_messages("cache_control", anthropic_control),
    system=_parts("cache_control", anthropic_control),
    tools=right_or_wrong(
        st.lists(
            optional_fields(
                name=st.text(max_size=4),
                cache_control=anthropic_control,
                type=right_or_wrong(st.sampled_from(["custom", "bash_20250124"])),
                input_schema=right_or_wrong(st.just({"type": "object"})),
                defer_loading=right_or_wrong(st.booleans()),
                input_examples=json_values,
            ),
            max_size=2,
        )
    ),
    tool_choice=right_or_wrong(
        optional_fields(
            type=right_or_wrong(st.sampled_from(["auto", "any", "tool", "none"])),
            name=right_or_wrong(st.text(max_size=4)),
            disable_parallel_tool_use=right_or_wrong(st.booleans()),
        )
    ),
    output_config=right_or_wrong(
        optional_fields(
            effort=right_or_wrong(st.sampled_from(["low", "max", "huge"])),
            format=right_or_wrong(
                optional_fields(
                    type=right_or_wrong(st.just("json_schema")), schema=right_or_wrong(json_objects)
                )
            ),
        )
    ),
    metadata=right_or_wrong(optional_fields(user_id=right_or_wrong(st.text(max_size=4)))),
    cache_control=anthropic_control,
    stream=right_or_wrong(st.booleans()),
    temperature=right_or_wrong(st.floats(min_value=-1, max_value=2)),
    top_p=right_or_wrong(st.floats(min_value=-1, max_value=2)),
    top_k=right_or_wrong(st.integers(min_value=-2, max_value=10)),
    stop_sequences=right_or_wrong(st.lists(st.text(max_size=3), max_size=10)),
    thinking=right_or_wrong(
        optional_fields(
            type=right_or_wrong(st.sampled_from(["enabled", "adaptive", "disabled"])),
            budget_tokens=right_or_wrong(st.integers(min_value=0, max_value=5000)),
            display=right_or_wrong(st.sampled_from(["omitted", "updates", "x"])),
        )
    ),
    safeguards=json_values,
)


@st.composite
def _near_valid(
    draw: st.DrawFn,
    noisy: st.SearchStrategy[dict[str, Any]],
    core: st.SearchStrategy[dict[str, Any]],
) -> dict[str, Any]:
    """A valid body with up to two fields taken from a noisy one: reaches checks past the first."""
    body = dict(draw(core))
    extra = draw(noisy)
    if extra:
        picked = draw(st.lists(st.sampled_from(sorted(extra)), max_size=2, unique=True))
        body.update({key: extra[key] for key in picked})
    return body


_text = st.text(max_size=8)
_text_parts = st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _text}), max_size=2)
_valid_openai_options = {
    "prompt_cache_options": st.sampled_from(
        [{}, {"mode": "implicit"}, {"ttl": "30m"}, {"mode": "implicit", "ttl": "30m"}]
    )
}
_valid_chat = st.fixed_dictionaries(
    {
        "model": st.just("m"),
        "messages": st.lists(
            st.fixed_dictionaries(
                {
                    "role": st.sampled_from(["system", "developer", "user", "assistant", "tool"]),
                    "content": _text | _text_parts,
                }
            ),
            min_size=1,
            max_size=3,
        ),
    },
    optional=_valid_openai_options,
)
_user_turn = st.fixed_dictionaries({"role": st.just("user"), "content": _text | _text_parts})
_valid_responses = st.fixed_dictionaries(
    {"model": st.just("m"), "input": _text | st.lists(_user_turn, min_size=1, max_size=2)},
    optional={
        "prompt_cache_options": st.sampled_from(
            [{}, {"ttl": "12h"}, {"mode": "implicit", "ttl": "30m", "prewarm": False}]
        )
    },
)
_tool = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["Read", "Bash"]),
        "input_schema": st.just({"type": "object", "properties": {"p": {"type": "string"}}}),
    },
    optional={"description": _text},
)
_tool_loop = st.tuples(_text, st.dictionaries(st.sampled_from(["p", "q"]), _text), _text).map(
    lambda t: [
        {"role": "user", "content": t[0]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": t[0], "signature": "s"},
                {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": t[1]},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": t[2]},
                {"type": "text", "text": t[2]},
            ],
        },
    ]
)
_valid_messages = st.fixed_dictionaries(
    {
        "model": st.just("m"),
        "max_tokens": st.integers(min_value=1, max_value=8),
        "messages": st.lists(_user_turn, min_size=1, max_size=2) | _tool_loop,
    },
    optional={
        "tools": st.lists(_tool, min_size=1, max_size=2, unique_by=lambda t: t["name"]),
        "tool_choice": st.sampled_from([{"type": "auto"}, {"type": "none"}]),
        "thinking": st.sampled_from([{"type": "adaptive"}, {"type": "disabled"}]),
        "metadata": st.fixed_dictionaries({"user_id": _text}),
        "cache_control": st.sampled_from(
            [
                {"type": "ephemeral"},
                {"type": "ephemeral", "ttl": "1h"},
                {"type": "ephemeral", "ttl": None},
            ]
        ),
    },
)
chat_parser_bodies = chat_bodies | _near_valid(chat_bodies, _valid_chat)
responses_parser_bodies = responses_bodies | _near_valid(responses_bodies, _valid_responses)
messages_parser_bodies = messages_bodies | _near_valid(messages_bodies, _valid_messages)
"""Noise, or a valid body with up to two noisy fields: every check gets a turn at failing."""
