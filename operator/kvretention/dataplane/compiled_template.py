"""The model's chat template rendered by minijinja (Rust), where it renders what transformers does.

``apply_chat_template`` renders with Jinja2 in an ``ImmutableSandboxedEnvironment``: ~10 ms for
a 200 KB agent conversation, every turn, because every turn's prompt is the whole conversation.
minijinja renders the same template in about a fifth of that. It is used only where it is exact:

- **At load, per template**: the template must compile in minijinja with transformers'
  environment (``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``, its ``tojson``,
  ``raise_exception`` and ``strftime_now``), use none of the constructs known to behave
  differently (:data:`DIVERGENT_CONSTRUCTS`), and render every probe conversation
  (:func:`probe_inputs`: roles, tool calls with nested and odd-valued arguments, consecutive tool
  results, reasoning before and after the last user turn, image parts, thinking switches, with and
  without tools and generation prompt) byte for byte as ``apply_chat_template`` does. It must also
  refuse wherever Jinja2 refuses. Otherwise the template is rendered by Jinja2, as before.
- **Per request**: values minijinja formats unlike Python are not handed to it. A float that is
  integral (``1.0`` comes back to a filter as ``1``) or that Python prints with an exponent, and an
  integer past 128 bits, go to Jinja2 (:func:`odd_float`, :func:`odd_int`); the template input
  says whether it holds one. A render holding U+FFFD is done again by Jinja2 (minijinja writes it
  for a lone surrogate, which Python keeps). A template error in minijinja is rendered again by
  Jinja2, so the request gets transformers' outcome and message.
- **Sampled**: the first render and every ``verify_every``-th are also rendered by Jinja2; a
  difference logs an error, serves Jinja2's text and turns minijinja off for that template.

Tokenizers whose ``chat_template`` is a dict of named templates, or templates using the
``{% generation %}`` tag (transformers' extension), stay on Jinja2.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, NotRequired, ParamSpec, TypedDict, Unpack

from kvretention.dataplane.generation_block import block_reads_only_context, generation_block

log = logging.getLogger(__name__)
_P = ParamSpec("_P")

GENERATION: Final = "generation"
"""The template's trailing generation-prompt block, alone (where it is provably last)."""

DEFAULT_VERIFY_EVERY: Final = 128
DIVERGENT_CONSTRUCTS: Final = (
    "is sequence",  # Jinja2: strings and dicts are sequences; minijinja: lists only
    "is not sequence",
    "wordcount",  # not a minijinja filter
)
"""Template text that minijinja evaluates unlike Jinja2 on some inputs a probe may not reach."""
FLOAT_SAME_MIN: Final = 1e-4
FLOAT_SAME_MAX: Final = 1e16
"""Python prints a float without an exponent in this range, as minijinja always does."""
INT_SAME_MIN: Final = -(2**127)
INT_SAME_MAX: Final = 2**128 - 1
REPLACEMENT: Final = "\ufffd"
"""What minijinja writes for a lone surrogate, which Python keeps as it is."""

minijinja: Any
try:  # pragma: no branch - minijinja is a dependency; without it everything renders with Jinja2
    import minijinja
except ImportError:  # pragma: no cover
    minijinja = None


def odd_float(value: float) -> bool:
    """Whether minijinja would print or hand back ``value`` unlike Python: integral floats come
    back to filters as ints, and outside [1e-4, 1e16) Python switches to an exponent."""
    if value.is_integer() or not math.isfinite(value):
        return True
    return not FLOAT_SAME_MIN <= abs(value) < FLOAT_SAME_MAX


def odd_int(value: int) -> bool:
    """Whether minijinja holds ``value`` as a float (past its 128-bit integers: i128 and u128)."""
    return not INT_SAME_MIN <= value <= INT_SAME_MAX


def has_odd_number(value: Any) -> bool:
    """Whether a JSON-like value holds an :func:`odd_float` or :func:`odd_int` anywhere."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is dict:
            stack.extend(item.values())
        elif kind is list:
            stack.extend(item)
        elif (kind is float and odd_float(item)) or (kind is int and odd_int(item)):
            return True
    return False


_ENCODER: Final = json.JSONEncoder(ensure_ascii=False)


def tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """transformers' ``tojson`` (Jinja's own escapes HTML characters; this one does not)."""
    if not ensure_ascii and indent is None and separators is None and not sort_keys:
        return _ENCODER.encode(value)  # what json.dumps builds per call, built once (~2 µs a call)
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


class JsonMemo:
    """``tojson`` results of one conversation's turn, by the value object: an agent's
    conversation hands the template the same tool-call argument dicts turn after turn (the worker
    keeps each converted message, :class:`~kvretention.dataplane.template_input.ConvertedMessages`,
    which carries this memo), so each is encoded once. Exact because the result is a pure function
    of the value and the options, a hit needs the very object (held here, so its ``id`` cannot
    name another object), and nothing mutates a template input once built (templates only read;
    the worker never writes a converted message). ``earlier`` is the previous turn's (read);
    ``current`` keeps what this turn used, so the memo holds no more than one turn's values."""

    __slots__ = ("current", "earlier")

    def __init__(self, earlier: dict[int, tuple[Any, tuple[Any, ...], str]] | None = None) -> None:
        self.earlier = earlier if earlier is not None else {}
        self.current: dict[int, tuple[Any, tuple[Any, ...], str]] = {}

    def after(self) -> JsonMemo:
        """The next turn's memo: this turn's results become its earlier ones."""
        return JsonMemo(self.current)

    def tojson(self, value: Any, *options: Any, **named: Any) -> str:
        """:func:`tojson` of ``value`` with these options, encoded once per object and options."""
        key = id(value)
        found = self.current.get(key) or self.earlier.get(key)
        if found is None or found[0] is not value or found[1] != (options, named):
            found = (value, (options, named), tojson(value, *options, **named))
        self.current[key] = found
        return found[2]


class TemplateRaised(Exception):
    """``raise_exception`` from the template (the message is the template's)."""


def raise_exception(message: str) -> None:
    raise TemplateRaised(message)


def strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@dataclass(frozen=True)
class ProbeInput:
    """One conversation the template renders at load, with both engines."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    kwargs: dict[str, Any] = field(default_factory=dict)
    add_generation_prompt: bool = True


def _probe_tools() -> tuple[dict[str, Any], dict[str, Any]]:
    """The probes' two tools: a schema of every JSON type, and a strict one."""
    tool = {
        "type": "function",
        "function": {
            "name": "Bash",
            "description": "Runs a command <in a shell> & returns 'its' output.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The command."},
                    "timeout": {"type": "integer", "minimum": 0, "maximum": 600000},
                    "ratio": {"type": "number", "default": 0.5},
                    "flags": {"type": "array", "items": {"type": "string"}},
                    "mode": {"type": "string", "enum": ["a", "b"]},
                    "dry": {"type": "boolean", "default": False},
                    "note": {"type": ["string", "null"]},
                },
                "required": ["command"],
            },
        },
    }
    edit = {
        "type": "function",
        "function": {
            "name": "Edit",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
            "strict": True,
        },
    }
    return tool, edit


def _probe_agent(system: dict[str, Any], user: dict[str, Any]) -> list[dict[str, Any]]:
    """An agent's conversation: reasoning, parallel tool calls, a failed and an empty result."""
    args = {
        "command": "grep -n \"x\" a.py && echo '<ok>' \\ é 漢 \u2028",
        "timeout": 120000,
        "ratio": 0.25,
        "flags": ["-n", "", "--"],
        "dry": True,
        "note": None,
        "nested": {"a": [1, {"b": False}], "empty": {}, "list": []},
    }
    call = {"id": "call_1", "type": "function", "function": {"name": "Bash", "arguments": args}}
    call2 = {
        "id": "call_2",
        "type": "function",
        "function": {"name": "Edit", "arguments": {"path": "a.py"}},
    }
    empty_args = {"id": "call_3", "type": "function", "function": {"name": "Edit", "arguments": {}}}
    agent: list[dict[str, Any]] = [
        system,
        user,
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Look first.",
            "tool_calls": [call],
        },
        {"role": "tool", "content": "ok\n<b>1</b>", "tool_call_id": "call_1", "name": "Bash"},
        {
            "role": "assistant",
            "content": "Two edits.",
            "reasoning_content": "Then edit.",
            "tool_calls": [call2, empty_args],
        },
        {
            "role": "tool",
            "content": "Error: no such file",
            "tool_call_id": "call_2",
            "name": "Edit",
        },
        {"role": "tool", "content": "", "tool_call_id": "call_3", "name": "Edit"},
        {"role": "assistant", "content": "Done. Tests pass.", "reasoning_content": "Verify."},
        {"role": "user", "content": "Thanks; one more thing."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "done", "tool_call_id": "call_1", "name": "Bash"},
    ]
    return agent


def probe_inputs() -> list[ProbeInput]:
    """The conversations a template must render identically before minijinja serves it."""
    system: dict[str, Any] = {"role": "system", "content": "You are a coding agent.\n\nBe brief.  "}
    user: dict[str, Any] = {"role": "user", "content": "Fix the test.\n"}
    tool, edit = _probe_tools()
    agent = _probe_agent(system, user)
    images: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]},
        {"role": "assistant", "content": "A cat."},
        {"role": "user", "content": [{"type": "text", "text": "And"}, {"type": "image"}]},
    ]
    chat: list[dict[str, Any]] = [
        user,
        {"role": "assistant", "content": "Sure.", "name": "helper"},
        {"role": "user", "content": "  spaced  \n\n"},
    ]
    out = [
        ProbeInput([user], None),
        ProbeInput([system, user], None),
        ProbeInput([system, user], None, add_generation_prompt=False),
        ProbeInput(chat, None),
        ProbeInput([{"role": "system", "content": ""}, *chat], None),
        ProbeInput(agent, [tool, edit]),
        ProbeInput(agent, [tool, edit], add_generation_prompt=False),
        ProbeInput(agent[1:], [tool]),
        ProbeInput(agent[:-2], [tool, edit]),
        ProbeInput(agent[:3], [tool, edit]),
        ProbeInput(agent, None),
        ProbeInput([system, *images], None),
    ]
    for kwargs in (
        {"enable_thinking": False, "thinking": False},
        {"enable_thinking": True, "thinking": True},
        {"enable_thinking": True, "thinking": True, "reasoning_effort": "high"},
    ):
        out.append(ProbeInput(agent, [tool, edit], kwargs))
        out.append(ProbeInput([system, user], None, kwargs))
    return out


class RenderCall(TypedDict):
    """How :meth:`CompiledTemplate.render` renders: with the generation prompt or not, the
    template's extra variables, and (``json_memo``) the conversation's ``tojson`` results (see
    :class:`JsonMemo`)."""

    add_generation_prompt: bool
    kwargs: dict[str, Any]
    json_memo: NotRequired[JsonMemo | None]


class CompiledTemplate:
    """One chat template in a minijinja environment that mirrors transformers' Jinja2 one."""

    def __init__(
        self,
        source: str,
        *,
        special_tokens: dict[str, Any],
        reference: Callable[..., str],
        verify_every: int = DEFAULT_VERIFY_EVERY,
    ) -> None:
        if minijinja is None:  # pragma: no cover
            raise ValueError("minijinja is not installed")
        self.source = source
        self._special = dict(special_tokens)
        self._reference = reference
        self._verify_every = verify_every
        self._lock = threading.Lock()
        self._local = threading.local()
        """The render in progress on this thread: its :class:`JsonMemo`, if any."""
        self._renders = 0
        self.enabled = True
        self.fallbacks = 0
        self.verified = 0
        self._env = minijinja.Environment(
            templates={"chat": source},
            filters={"tojson": self._tojson},
            globals={"raise_exception": raise_exception, "strftime_now": strftime_now},
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=False,
            undefined_behavior="lenient",
            pycompat=True,
            debug=False,
        )
        self._env.undeclared_variables_in_template("chat")  # parse now: a syntax error raises here
        self.generation = self._generation_block(source)
        """Whether the template provably writes its generation prompt last
        (:mod:`kvretention.dataplane.generation_block`; confirmed on the probes at load)."""

    def _generation_block(self, source: str) -> bool:
        block = generation_block(source)
        if block is None:
            return False
        try:
            self._env.add_template(GENERATION, block)
            reads = self._env.undeclared_variables_in_template(GENERATION)
        except Exception:  # the block alone does not parse: the reading above was wrong
            return False
        return block_reads_only_context(source, reads)

    def _tojson(self, value: Any, *options: Any, **named: Any) -> str:
        """The ``tojson`` filter: :func:`tojson`'s options, through this render's memo if any."""
        memo: JsonMemo | None = getattr(self._local, "memo", None)
        if memo is None:
            return tojson(value, *options, **named)
        return memo.tojson(value, *options, **named)

    def _context(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool,
        kwargs: dict[str, Any],
    ) -> dict[str, Any]:
        return {
            **self._special,
            **kwargs,
            "messages": messages,
            "tools": tools,
            "documents": None,
            "add_generation_prompt": add_generation_prompt,
        }

    def without_generation_prompt(
        self,
        prompt: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        kwargs: dict[str, Any],
    ) -> str | None:
        """What this template renders for the input without the generation prompt, taken from
        ``prompt`` (what minijinja rendered for it with the generation prompt): the prompt less
        what the trailing generation block writes, rendered alone with the same context. ``None``
        where that is not proven (see :mod:`kvretention.dataplane.generation_block`)."""
        if not (self.generation and self.enabled):
            return None
        context = self._context(messages, tools, add_generation_prompt=True, kwargs=kwargs)
        try:
            tail = str(self._env.render_template(GENERATION, **context))
        except Exception:
            return None
        if not prompt.endswith(tail):
            return None
        return prompt[: len(prompt) - len(tail)]

    def render_compiled(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        **call: Unpack[RenderCall],
    ) -> str:
        """minijinja's rendering alone (raises minijinja's ``TemplateError``)."""
        context = self._context(
            messages,
            tools,
            add_generation_prompt=call["add_generation_prompt"],
            kwargs=call["kwargs"],
        )
        self._local.memo = call.get("json_memo")
        try:
            return str(self._env.render_template("chat", **context))
        finally:
            self._local.memo = None

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        **call: Unpack[RenderCall],
    ) -> str | None:
        """The prompt as ``apply_chat_template`` renders it, or ``None`` where Jinja2 must render
        (minijinja refused, or is off for this template)."""
        if not self.enabled:
            return None
        try:
            text = self.render_compiled(messages, tools, **call)
        except Exception:  # the template refused (raise_exception, bad input): Jinja2's outcome
            self.fallbacks += 1
            return None
        if REPLACEMENT in text:  # maybe a lone surrogate minijinja replaced
            self.fallbacks += 1
            return None
        with self._lock:
            self._renders += 1
            check = self._verify_every > 0 and (self._renders - 1) % self._verify_every == 0
        if check:
            expected = self._reference(
                messages,
                tools=tools,
                add_generation_prompt=call["add_generation_prompt"],
                **call["kwargs"],
            )
            self.verified += 1
            if expected != text:
                self.enabled = False
                at = next(
                    (i for i, (a, b) in enumerate(zip(expected, text, strict=False)) if a != b),
                    min(len(expected), len(text)),
                )
                log.error(
                    "minijinja rendered the chat template unlike transformers (first difference "
                    "at character %d): rendering it with Jinja2 from now on",
                    at,
                )
                return expected
        return text


@dataclass(frozen=True)
class Refusal:
    """Why a template stays on Jinja2."""

    reason: str


def _text_or_none(render: Callable[_P, str], /, *args: _P.args, **kwargs: _P.kwargs) -> str | None:
    """What ``render`` gives, or ``None`` where it raises: the probes compare refusals too."""
    try:
        return render(*args, **kwargs)
    except Exception:
        return None


def compile_template(
    tokenizer: Any, *, verify_every: int = DEFAULT_VERIFY_EVERY
) -> CompiledTemplate | Refusal:
    """The tokenizer's chat template under minijinja, if it renders every probe as
    ``apply_chat_template`` does (see the module docstring); else why not."""
    if minijinja is None:  # pragma: no cover
        return Refusal("minijinja is not installed")
    source = getattr(tokenizer, "chat_template", None)
    if not isinstance(source, str) or not source:
        return Refusal("the chat template is not one template string")
    for construct in DIVERGENT_CONSTRUCTS:
        if construct in source:
            return Refusal(
                f"the template uses {construct!r}, which minijinja evaluates differently"
            )

    def reference(messages: list[dict[str, Any]], **kwargs: Any) -> str:
        return str(tokenizer.apply_chat_template(messages, tokenize=False, **kwargs))

    try:
        compiled = CompiledTemplate(
            source,
            special_tokens=dict(getattr(tokenizer, "special_tokens_map", {}) or {}),
            reference=reference,
            verify_every=verify_every,
        )
    except Exception as exc:  # minijinja cannot parse it ({% generation %}, Python-only syntax)
        return Refusal(f"minijinja cannot compile the template: {exc}")
    for n, probe in enumerate(probe_inputs()):
        expected = _text_or_none(
            reference,
            probe.messages,
            tools=probe.tools,
            add_generation_prompt=probe.add_generation_prompt,
            **probe.kwargs,
        )
        got = _text_or_none(
            compiled.render_compiled,
            probe.messages,
            probe.tools,
            add_generation_prompt=probe.add_generation_prompt,
            kwargs=probe.kwargs,
        )
        if got != expected:
            what = (
                "rendered where Jinja2 refused"
                if expected is None
                else "refused where Jinja2 rendered"
                if got is None
                else "rendered differently"
            )
            return Refusal(f"minijinja {what} on probe {n}")
        if compiled.generation and got is not None and probe.add_generation_prompt:
            without = _text_or_none(
                compiled.render_compiled,
                probe.messages,
                probe.tools,
                add_generation_prompt=False,
                kwargs=probe.kwargs,
            )
            derived = compiled.without_generation_prompt(
                got, probe.messages, probe.tools, kwargs=probe.kwargs
            )
            if without is None or derived != without:
                log.warning("chat template: its generation prompt is not its last output")
                compiled.generation = False
    return compiled


_COMPILED: weakref.WeakKeyDictionary[Any, tuple[Any, CompiledTemplate | Refusal]] = (
    weakref.WeakKeyDictionary()
)
_COMPILED_LOCK = threading.Lock()


def compiled_template_serving(tokenizer: Any) -> bool | None:
    """Whether minijinja still renders ``tokenizer``'s template (``False``: a difference from
    Jinja2 turned it off); ``None`` before its first render compiled it, or where Jinja2 renders it
    from the start. Compiles nothing: the worker's metrics read it on each scrape."""
    try:
        memo = _COMPILED.get(tokenizer)
    except TypeError:
        return None
    if memo is None or memo[0] != getattr(tokenizer, "chat_template", None):
        return None
    return memo[1].enabled if isinstance(memo[1], CompiledTemplate) else None


def compiled_template_for(tokenizer: Any) -> CompiledTemplate | None:
    """The tokenizer's compiled template (checked once per tokenizer and template text), or
    ``None`` where Jinja2 renders it; a refusal is logged once."""
    source = getattr(tokenizer, "chat_template", None)
    try:
        memo = _COMPILED.get(tokenizer)
    except TypeError:  # not weakly referenceable: checked every time would cost more than it saves
        return None
    if memo is not None and memo[0] == source:
        result = memo[1]
        return result if isinstance(result, CompiledTemplate) else None
    with _COMPILED_LOCK:
        result = compile_template(tokenizer)
        _COMPILED[tokenizer] = (source, result)
    if isinstance(result, Refusal):
        log.info("chat template rendered with Jinja2: %s", result.reason)
        return None
    log.info("chat template rendered with minijinja (it rendered every probe identically)")
    return result
