"""minijinja renders a chat template only where it renders what ``apply_chat_template`` renders.

A table of real templates (the two the data-plane tests serve, the default templates that
transformers and SGLang ship in their installed packages, and templates written here in the style
of Qwen3 / Llama 3.1 / Mistral with the helpers HF templates use) is compiled, checked with the
probes, and then every conversation of a second table must render byte for byte as transformers
renders it, through minijinja itself (not a fallback). Templates minijinja would render
differently are refused at load; values it formats unlike Python go to Jinja2 per request; a
sampled check that finds a difference turns minijinja off and serves transformers' text.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvretention.dataplane import compiled_template
from kvretention.dataplane.chat_template import render_template
from kvretention.dataplane.compiled_template import (
    CompiledTemplate,
    JsonMemo,
    Refusal,
    compile_template,
    compiled_template_for,
    compiled_template_serving,
    has_odd_number,
    probe_inputs,
    tojson,
)
from kvretention.dataplane.protocol import (
    ChatMessage,
    ImagePart,
    Reasoning,
    ReasoningControl,
    TextPart,
    ToolCall,
    ToolDefinition,
)
from kvretention.dataplane.template_input import build_template_input
from kvretention.dataplane.worker.cpu.chat_format import CHAT_TEMPLATE
from support import chat_tokenizer
from support.real_templates import MISTRAL_STYLE, QWEN3_STYLE, TEMPLATES

BASH = ToolDefinition(
    name="Bash",
    description="Runs a command.",
    parameters={"type": "object", "properties": {"command": {"type": "string"}}},
)


def _call(n: int, arguments: str) -> ToolCall:
    return ToolCall(id=f"call_{n:09d}", name="Bash", arguments=arguments)


def _agent(
    turns: int, *, text: str = "", arguments: str = '{"command": "pytest -x"}'
) -> list[ChatMessage]:
    messages = [
        ChatMessage(role="system", content="You are a coding agent."),
        ChatMessage(
            role="user", content=[TextPart(text="Fix the test."), TextPart(text=text or "Go.")]
        ),
    ]
    for t in range(turns):
        messages.append(
            ChatMessage(
                role="assistant",
                content=f"Step {t}." if t % 2 else "",
                reasoning=Reasoning(text=f"Think {t}."),
                tool_calls=[_call(t, arguments)],
            )
        )
        messages.append(
            ChatMessage(role="tool", tool_call_id=f"call_{t:09d}", content=f"FAILED {t}\n{text}")
        )
    return messages


CONVERSATIONS: dict[str, tuple[list[ChatMessage], list[ToolDefinition], ReasoningControl | None]] = {
    "agent, 6 rounds, tools": (_agent(6), [BASH], None),
    "agent, new user turn": ([*_agent(3), ChatMessage(role="user", content="Docs too.")], [BASH], None),
    "agent, thinking off": (_agent(2), [BASH], ReasoningControl(enabled=False)),
    "agent, effort": (_agent(2), [], ReasoningControl(enabled=True, effort="high")),
    "non-ASCII and markup": (_agent(2, text="é 漢字 🙂 <b>&amp;</b> \"q\" 'a' \\n"), [BASH], None),
    "fine numbers": (_agent(2, arguments='{"a": 0.5, "b": -3, "c": 2e-3, "d": [true, null], "e": 12345678901234567890123}'), [BASH], None),
    "no tools, chat": ([ChatMessage(role="user", content="Hi"), ChatMessage(role="assistant", content="Hello."), ChatMessage(role="user", content="  Bye \n")], [], None),
    "image": ([ChatMessage(role="user", content=[ImagePart(url="data:image/png;base64,AA=="), TextPart(text="What?")])], [], None),
    "assistant first (some templates refuse)": ([ChatMessage(role="assistant", content="Hi")], [], None),
}  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return chat_tokenizer.build_tokenizer()


def _with_template(tokenizer: Any, source: str) -> Any:
    tokenizer.chat_template = source
    return tokenizer


def _reference(tokenizer: Any, template_input: Any, generation: bool = True) -> str | None:
    try:
        return str(
            tokenizer.apply_chat_template(
                template_input.messages,
                tools=template_input.tools,
                tokenize=False,
                add_generation_prompt=generation,
                **template_input.template_kwargs,
            )
        )
    except Exception:
        return None


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_real_templates_render_byte_identical_through_minijinja(tokenizer: Any, name: str) -> None:
    tok = _with_template(tokenizer, TEMPLATES[name]())
    compiled = compile_template(tok, verify_every=0)
    assert isinstance(compiled, CompiledTemplate), compiled
    rendered = 0
    for conversation, (messages, tools, reasoning) in CONVERSATIONS.items():
        template_input = build_template_input(messages, tools=tools, reasoning=reasoning)
        assert not template_input.odd_numbers, conversation
        for generation in (True, False):
            expected = _reference(tok, template_input, generation)
            try:
                got: str | None = compiled.render_compiled(
                    template_input.messages,
                    template_input.tools,
                    add_generation_prompt=generation,
                    kwargs=template_input.template_kwargs,
                )
            except Exception:
                got = None
            assert got == expected, (conversation, generation)
            rendered += expected is not None
    assert rendered >= 2, "the template refused nearly every conversation: the table proves nothing"


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("{{ messages[0].content is sequence }}", "'is sequence'"),
        ("{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}", "cannot compile"),
        ("{{ '%s!' % messages[0].content }}", "refused where Jinja2 rendered"),
        ("{{ 1e20 }}{{ messages | length }}", "rendered differently"),
        ("{{ messages[0].content | wordcount }}", "'wordcount'"),
        ("{{ messages.append(1) }}", "rendered where Jinja2 refused"),  # the sandbox is immutable
        (  # minijinja: none is iterable
            "{% for m in messages %}{% for c in m.tool_calls | default([]) %}"
            "{% for k, v in c.function.arguments | items %}{{ v is iterable }}{% endfor %}"
            "{% endfor %}{% endfor %}",
            "rendered differently",
        ),
    ],
)  # fmt: skip
def test_templates_that_render_differently_are_refused(
    tokenizer: Any, source: str, reason: str
) -> None:
    result = compile_template(_with_template(tokenizer, source))
    assert isinstance(result, Refusal)
    assert reason in result.reason


def test_a_dict_of_named_templates_stays_on_jinja2(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    tok = _with_template(tokenizer, {"default": CHAT_TEMPLATE})
    assert isinstance(compile_template(tok), Refusal)
    assert compiled_template_for(tok) is None
    assert compiled_template_serving(tok) is None  # Jinja2 from the start: not a fault
    checks: list[Any] = []
    monkeypatch.setattr(compiled_template, "compile_template", checks.append)
    assert compiled_template_for(tok) is None
    assert checks == []  # the refusal is remembered, not checked again per request


@pytest.mark.parametrize(
    ("arguments", "odd", "minijinja_differs"),
    [
        ('{"v": 0.5}', False, False),
        ('{"v": -1234.5678}', False, False),
        ('{"v": 3}', False, False),
        ('{"v": 340282366920938463463374607431768211455}', False, False),
        ('{"v": -170141183460469231731687303715884105728}', False, False),
        ('{"v": [0.25, {"w": "1.0"}]}', False, False),
        ('{"v": 1.0}', True, True),
        ('{"v": 1e20}', True, True),
        ('{"v": 1e-5}', True, True),
        ('{"v": 340282366920938463463374607431768211456}', True, True),
        ('{"v": -170141183460469231731687303715884105729}', True, True),
        ('{"v": [1, {"w": 2.0}]}', True, False),  # containers come back to tojson as they were
        ('{"v": -0.0}', True, None),
        ('{"v": NaN}', True, None),
        ('{"v": -Infinity}', True, None),
    ],
)
def test_numbers_minijinja_formats_unlike_python_go_to_jinja2(
    tokenizer: Any, arguments: str, odd: bool, minijinja_differs: bool | None
) -> None:
    """The template prints each argument raw, through ``| string`` and through ``| tojson`` (as
    Qwen3-Coder and GLM templates do): whichever engine renders, the text is transformers'. The
    guard is conservative (``None``: not asserted either way)."""
    source = (
        "{% for m in messages %}{% for c in m.tool_calls | default([]) %}"
        "{% for k, v in c.function.arguments | items %}{{ k }}={{ v }}|{{ v | string }}|"
        "{{ v | tojson }}|{% if v is iterable %}{% for x in v %}{{ x }};{{ x | tojson }}{% endfor %}"
        "{% endif %}\n{% endfor %}{% endfor %}{% endfor %}"
    )
    tok = _with_template(tokenizer, source)
    messages = [
        ChatMessage(role="user", content="go"),
        ChatMessage(role="assistant", tool_calls=[_call(0, arguments)]),
    ]
    template_input = build_template_input(messages)
    assert template_input.odd_numbers is odd
    expected = _reference(tok, template_input)
    assert render_template(tok, template_input) == expected
    compiled = compiled_template_for(tok)
    assert compiled is not None
    got = compiled.render_compiled(
        template_input.messages, None, add_generation_prompt=True, kwargs={}
    )
    if minijinja_differs is not None:
        assert (got != expected) is minijinja_differs  # what the guard keeps from minijinja


@pytest.mark.parametrize(
    ("schema", "odd"),
    [
        ({"type": "number", "minimum": 0, "maximum": 0.75}, False),
        ({"type": "number", "default": 1.0}, True),
        ({"type": "array", "items": {"enum": [1, 2.5e30]}}, True),
    ],
)
def test_tool_schemas_are_checked_for_odd_numbers(schema: dict[str, Any], odd: bool) -> None:
    tool = ToolDefinition(name="t", parameters={"type": "object", "properties": {"x": schema}})
    assert (
        build_template_input([ChatMessage(role="user", content="go")], tools=[tool]).odd_numbers
        is odd
    )
    assert has_odd_number(schema) is odd


def test_a_lone_surrogate_renders_as_transformers_does(tokenizer: Any) -> None:
    tok = _with_template(tokenizer, CHAT_TEMPLATE)
    template_input = build_template_input([ChatMessage(role="user", content="broken \ud83d emoji")])
    assert render_template(tok, template_input) == _reference(tok, template_input)


def test_a_template_error_gets_transformers_error(tokenizer: Any) -> None:
    from kvretention.dataplane.chat_template import TemplateInputError

    tok = _with_template(tokenizer, MISTRAL_STYLE)
    template_input = build_template_input([ChatMessage(role="developer", content="rules")])
    template_input.messages[0]["role"] = "critic"
    with pytest.raises(TemplateInputError, match="Only user and assistant roles"):
        render_template(tok, template_input)


def _checked_every_third(reference_text: str) -> tuple[CompiledTemplate, list[bool]]:
    """A template rendering the first message's content, checked against a reference renderer
    that answers ``reference_text`` on every third render; the list grows by one per check."""
    calls: list[bool] = []

    def reference(messages: list[dict[str, Any]], **kwargs: Any) -> str:
        calls.append(True)
        return reference_text

    compiled = CompiledTemplate(
        "{{ messages[0].content }}", special_tokens={}, reference=reference, verify_every=3
    )
    return compiled, calls


def test_a_sampled_difference_serves_transformers_text_and_turns_minijinja_off() -> None:
    compiled, calls = _checked_every_third("transformers' text")
    messages = [{"role": "user", "content": "hi"}]
    first = compiled.render(messages, None, add_generation_prompt=True, kwargs={})
    assert first == "transformers' text" and calls == [True]
    assert not compiled.enabled
    assert compiled.render(messages, None, add_generation_prompt=True, kwargs={}) is None


def test_renders_are_sampled_every_verify_every() -> None:
    compiled, calls = _checked_every_third("hi")
    for _ in range(7):
        assert (
            compiled.render([{"content": "hi"}], None, add_generation_prompt=True, kwargs={})
            == "hi"
        )
    assert len(calls) == 3  # renders 1, 4 and 7
    assert compiled.enabled


def test_probes_cover_what_the_worker_hands_templates() -> None:
    """The probes hold every role, tool calls, reasoning, image parts and the thinking switches."""
    probes = probe_inputs()
    messages = [m for p in probes for m in p.messages]
    assert {m["role"] for m in messages} >= {"system", "user", "assistant", "tool"}
    assert any("tool_calls" in m for m in messages)
    assert any("reasoning_content" in m for m in messages)
    assert any(isinstance(m["content"], list) for m in messages)
    assert any(p.kwargs.get("enable_thinking") is False for p in probes)
    assert any(not p.add_generation_prompt for p in probes)
    assert not any(has_odd_number([p.messages, p.tools]) for p in probes)


def test_the_compiled_template_is_checked_once_per_tokenizer_and_template(tokenizer: Any) -> None:
    tok = _with_template(tokenizer, CHAT_TEMPLATE + "{# not compiled yet #}")
    assert compiled_template_serving(tok) is None  # reading the state compiles nothing
    first = compiled_template_for(tok)
    assert first is not None and compiled_template_for(tok) is first
    assert compiled_template_serving(tok) is True
    tok.chat_template = QWEN3_STYLE
    assert compiled_template_serving(tok) is None  # the memo is the old template's
    second = compiled_template_for(tok)
    assert second is not None and second is not first and second.source == QWEN3_STYLE
    assert compiled_template.compiled_template_for(tok) is second


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"indent": 4}, {"separators": (",", ":")}, {"sort_keys": True}, {"ensure_ascii": True}],
)
def test_tojson_is_transformers_tojson(kwargs: dict[str, Any]) -> None:
    from transformers.utils.chat_template_utils import _compile_jinja_template

    theirs = _compile_jinja_template("{{ 1 }}").environment.filters["tojson"]
    for value in ({"b": "<é>\n", "a": [1, 0.5, None, True]}, "é\u2028", 3, [], {"x": {}}):
        assert compiled_template.tojson(value, **kwargs) == theirs(value, **kwargs)


@pytest.mark.parametrize(
    ("value", "options"),
    [
        ({"command": "ls", "n": [1, 2.5, None]}, ()),
        ({"b": 1, "a": "é"}, (False, None, None, True)),
        ({"a": "é"}, (True,)),
        ([{"x": 1}], (False, 2)),
        ("plain text", ()),
    ],
)
def test_tojson_memo_answers_what_tojson_does(value: Any, options: tuple[Any, ...]) -> None:
    memo = JsonMemo()
    first = memo.tojson(value, *options)
    assert first == tojson(value, *options)
    later = memo.after()  # the next turn: the same object is remembered
    assert later.tojson(value, *options) is first
    copy = json.loads(json.dumps(value))
    assert later.tojson(copy, *options) == first  # an equal object: encoded again, equal
    other = (not options[0],) if options else (True,)
    assert later.tojson(value, *other) == tojson(value, *other)  # other options: not the memo's
    gone = {"n": 1}
    memo.tojson(gone)
    assert id(gone) not in later.after().after().current  # a value no turn used is let go
