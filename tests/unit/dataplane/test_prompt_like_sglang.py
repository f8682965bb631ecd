"""A Chat Completions request gets the prompt and sampling SGLang's own server would give it.

Each body goes through this fleet (the frontend's ``parse_chat``, the wire, the worker's
``plan_call``) and through SGLang 0.5.23's ``OpenAIServingChat._process_messages`` and
``to_sampling_params``, with the same tokenizer and parsers, over each template of
``support.real_templates``. The prompt token ids must be equal (or both sides refuse the
conversation), and the sampling parameters must be equal once SGLang's ``SamplingParams`` has
filled in its defaults (what the engine computes with). Where the fleet renders unlike SGLang's server
on purpose (docs/frontend.md, "OpenAI Chat Completions fields"), the difference is named and
must stay exactly that.
"""

from __future__ import annotations

import contextlib
import copy
import json
import types
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from kvretention.dataplane.frontend.openai import parse_chat
from kvretention.dataplane.frontend.prepare import build_preprocessed
from kvretention.dataplane.worker.app import plan_call
from kvretention.dataplane.worker.dialect import Dialect
from kvretention.dataplane.worker.engine import LoadedEngine, sampling_defaults_of
from kvretention.dataplane.worker.parsing import ParserNames
from support.chat_tokenizer import build_tokenizer
from support.real_templates import HELPERS, TEMPLATES

PARSERS = ParserNames(tool_call_parser="qwen25", reasoning_parser="qwen3", model_type="llama")
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
CALL = {
    "id": "c1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
USER = {"role": "user", "content": "Weather in Paris?"}


def _body(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": list(messages or [USER]), **fields}


SAME: dict[str, dict[str, Any]] = {
    "plain": _body(),
    "system": _body({"role": "system", "content": "Be brief."}, USER),
    "empty content": _body({"role": "user", "content": ""}),
    "a participant name": _body({"role": "user", "content": "hi", "name": "bob"}),
    "reasoning replayed": _body(
        USER,
        {"role": "assistant", "content": "Sunny.", "reasoning_content": "Look it up."},
        {"role": "user", "content": "And Rome?"},
    ),
    "thinking off by template kwargs": _body(chat_template_kwargs={"enable_thinking": False}),
    "thinking on by template kwargs": _body(chat_template_kwargs={"enable_thinking": True}),
    "a template kwarg the template does not read": _body(chat_template_kwargs={"house": "x"}),
    "thinking off by effort": _body(reasoning_effort="none"),
    "sampling, OpenAI's": _body(
        temperature=0.3,
        top_p=0.9,
        frequency_penalty=0.5,
        presence_penalty=-0.5,
        seed=7,
        max_tokens=12,
        stop=["END", "STOP"],
        logit_bias={"17": 5},
    ),
    "sampling, SGLang's": _body(
        top_k=20,
        min_p=0.05,
        repetition_penalty=1.1,
        min_tokens=3,
        max_tokens=30,
        stop_token_ids=[5, 6],
        ignore_eos=True,
        no_stop_trim=True,
    ),
    "top_k -1 is every token": _body(top_k=-1),
    "special tokens kept": _body(skip_special_tokens=False),
    "regex": _body(regex="(yes|no)"),
    "ebnf": _body(ebnf='root ::= "yes" | "no"'),
    "json_schema": _body(
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "object"}},
        }
    ),
    "json_object": _body(response_format={"type": "json_object"}),
    "continue the last assistant message": _body(
        USER, {"role": "assistant", "content": "It is"}, continue_final_message=True
    ),
    "continue with thinking off": _body(
        USER,
        {"role": "assistant", "content": "{"},
        continue_final_message=True,
        chat_template_kwargs={"enable_thinking": False},
    ),
    "continue without an assistant message": _body(continue_final_message=True),
    "tool_choice none": _body(tools=[WEATHER], tool_choice="none"),
}

DEFER_LOADING = ', "defer_loading": null'
"""SGLang's server dumps each tool with its ``defer_loading`` field, set or not; the fleet shows
the model the tool as the client wrote it."""
WITH_TOOLS: dict[str, dict[str, Any]] = {
    "tools": _body(tools=[WEATHER]),
    "tools required": _body(tools=[WEATHER], tool_choice="required"),
    "a named tool": _body(
        tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}
    ),
    "one call at most": _body(tools=[WEATHER], parallel_tool_calls=False),
    "a call and its result": _body(
        USER,
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        tools=[WEATHER],
    ),
    "text, a call, a result in parts": _body(
        USER,
        {"role": "assistant", "content": "Let me see.", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "sunny"}]},
        tools=[WEATHER],
    ),
}


TINY = "kvretention tiny-model chat format"


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer()


@pytest.fixture(scope="module")
def sglang_server(tokenizer: Any) -> Any:
    return sglang_serving(tokenizer)


@pytest.fixture(scope="module", params=sorted(TEMPLATES))
def served(request: pytest.FixtureRequest) -> tuple[Any, Any]:
    """A tokenizer with one of the real templates, and SGLang's serving over it."""
    tokenizer = build_tokenizer()
    tokenizer.chat_template = TEMPLATES[request.param]()
    return tokenizer, sglang_serving(tokenizer)


def sglang_serving(tokenizer: Any) -> Any:
    """SGLang's OpenAI chat serving over ``tokenizer`` and its template, as its server builds it
    (``TemplateManager.load_chat_template``), with no engine behind it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SGLang's GPU-only quantizers warn on import
        from sglang.srt.entrypoints.openai import serving_chat
        from sglang.srt.parser.template_manager import TemplateManager

    hf_config = types.SimpleNamespace(model_type="llama", architectures=["LlamaForCausalLM"])
    config = {"tool_call_parser": PARSERS.tool_call_parser, "reasoning_parser": "qwen3"}
    manager = types.SimpleNamespace(
        config_value=config.get,
        tokenizer=tokenizer,
        model_config=types.SimpleNamespace(
            hf_config=hf_config, get_default_sampling_params=lambda: {}
        ),
        server_args=None,
        served_model_name="m",
    )
    templates = TemplateManager()
    templates.load_chat_template(manager, None, "/no/model")
    serving = types.SimpleNamespace(default_chat_template_kwargs=None)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(serving_chat, "get_serving", lambda: serving)
        return serving_chat.OpenAIServingChat(manager, templates)


def _sglang(server: Any, body: dict[str, Any]) -> tuple[list[int], dict[str, Any]]:
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    return _processed(server, ChatCompletionRequest.model_validate(copy.deepcopy(body)))


def _processed(
    server: Any, request: Any, generation: dict[str, Any] | None = None
) -> tuple[list[int], dict[str, Any]]:
    """SGLang's prompt ids and sampling for a ``ChatCompletionRequest``, as its server makes
    them before calling the engine (``generation``: its ``default_sampling_params``)."""
    processed = server._process_messages(request, False)
    params = request.to_sampling_params(
        stop=processed.stop,
        model_generation_config=generation or {},
        tool_call_constraint=processed.tool_call_constraint,
    )
    return list(processed.prompt_ids), _engine_view(params)


def _ours(tokenizer: Any, body: dict[str, Any]) -> tuple[list[int], dict[str, Any]]:
    return _planned(tokenizer, parse_chat(copy.deepcopy(body)))


def _planned(
    tokenizer: Any, parsed: Any, generation: dict[str, Any] | None = None
) -> tuple[list[int], dict[str, Any]]:
    """The worker's engine call for a parsed request: its prompt ids and sampling.
    ``generation``: the model's generation-config sampling, as SGLang's model config gives it."""
    model_config = types.SimpleNamespace(get_default_sampling_params=lambda: dict(generation or {}))
    manager = types.SimpleNamespace(tokenizer=tokenizer, model_config=model_config)
    engine = LoadedEngine(
        engine=types.SimpleNamespace(tokenizer_manager=manager),
        name="test",
        dialect=Dialect.FLAT,
        parsers=PARSERS,
        sampling_defaults=sampling_defaults_of(types.SimpleNamespace(tokenizer_manager=manager)),
    )
    request = build_preprocessed(parsed, request_id="r", session_id=None, tokenizer=None)
    planned = plan_call(request.to_json_bytes(), headers={}, state_role="aggregated", engine=engine)
    return planned.kwargs["input_ids"], _engine_view(planned.kwargs["sampling_params"])


def _engine_view(params: dict[str, Any]) -> dict[str, Any]:
    """What the engine samples with: SGLang's ``SamplingParams`` with its defaults filled in,
    grammars read as JSON where they are JSON (the same value written either way)."""
    import msgspec
    from sglang.srt.sampling.sampling_params import SamplingParams

    given = {k: v for k, v in params.items() if v is not None}
    view = msgspec.structs.asdict(SamplingParams(**given))
    for key in ("json_schema", "structural_tag"):
        if isinstance(view.get(key), str):
            view[key] = json.loads(view[key])
    return view


Outcome = tuple[list[int], dict[str, Any]] | str


def _outcome(run: Any, *args: Any) -> Outcome:
    """The prompt and sampling, or ``"refused"`` where the template refuses the conversation."""
    from kvretention.dataplane.worker.app import RequestRejected

    try:
        return run(*args)  # type: ignore[no-any-return]
    except (RequestRejected, ValueError):
        return "refused"


KNOWN: dict[tuple[str, str], str] = {
    ("thinking off by effort", "helpers: macros, loop, break, dictsort, items, unique"): (
        "reasoning_effort none is a thinking switch here, not a template variable"
    ),
}
"""(row, template) pairs that differ on purpose; each has its own test below."""


@pytest.mark.parametrize("name", sorted(SAME))
def test_the_prompt_and_sampling_are_sglangs(served: tuple[Any, Any], name: str) -> None:
    tokenizer, server = served
    ours = _outcome(_ours, tokenizer, SAME[name])
    theirs = _outcome(_sglang, server, SAME[name])
    if (name, _template_of(tokenizer)) in KNOWN:
        assert ours != theirs
        return
    if isinstance(ours, tuple) and isinstance(theirs, tuple):
        assert tokenizer.decode(ours[0]) == tokenizer.decode(theirs[0])
    assert ours == theirs


def _template_of(tokenizer: Any) -> str:
    return next(name for name, source in TEMPLATES.items() if source() == tokenizer.chat_template)


@pytest.mark.parametrize("name", sorted(WITH_TOOLS))
def test_with_tools_the_prompt_and_sampling_are_sglangs_but_for_defer_loading(
    served: tuple[Any, Any], name: str
) -> None:
    tokenizer, server = served
    with _tools_as_the_client_wrote_them():
        theirs = _outcome(_sglang, server, WITH_TOOLS[name])
    assert _outcome(_ours, tokenizer, WITH_TOOLS[name]) == theirs


@contextlib.contextmanager
def _tools_as_the_client_wrote_them() -> Iterator[None]:
    """SGLang's tool dumps without the fields the client did not set: ``defer_loading: null``,
    and the ``strict: false`` its Anthropic adapter writes."""
    from sglang.srt.entrypoints.openai.protocol import Tool

    dump = Tool.model_dump

    def unset_dropped(tool: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        data: dict[str, Any] = dump(tool, *args, **kwargs)
        if data.get("defer_loading") is None:
            data.pop("defer_loading", None)
        if data.get("function", {}).get("strict") is False:
            del data["function"]["strict"]
        return data

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Tool, "model_dump", unset_dropped)
        yield


@pytest.mark.parametrize("name", sorted(WITH_TOOLS))
def test_sglang_shows_the_model_each_tools_defer_loading(
    tokenizer: Any, sglang_server: Any, name: str
) -> None:
    body = WITH_TOOLS[name]
    (ours, our_params), (theirs, their_params) = (
        _ours(tokenizer, body),
        _sglang(sglang_server, body),
    )
    their_text = tokenizer.decode(theirs)
    assert DEFER_LOADING in their_text
    assert tokenizer.decode(ours) == their_text.replace(DEFER_LOADING, "")
    assert our_params == their_params


def test_reasoning_effort_none_switches_thinking_off_without_naming_an_effort() -> None:
    tokenizer = build_tokenizer()
    tokenizer.chat_template = HELPERS
    body = _body(reasoning_effort="none")
    ours, theirs = _ours(tokenizer, body), _sglang(sglang_serving(tokenizer), body)
    assert tokenizer.decode(ours[0]).endswith("<assistant>")
    assert tokenizer.decode(theirs[0]).endswith("<assistant>none")


SYSTEM = {"role": "system", "content": "Be brief."}
DIFFERENT: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # our body -> the body SGLang renders as we render ours
    "developer is system where the template has no developer role": (
        _body({"role": "developer", "content": "Be brief."}, USER),
        _body(SYSTEM, USER),
    ),
    "text parts joined by newlines": (
        _body({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}),
        _body({"role": "user", "content": "a\nb"}),
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(DIFFERENT))
def test_where_the_fleet_renders_unlike_sglang_on_purpose(
    tokenizer: Any, sglang_server: Any, name: str
) -> None:
    body, equivalent = DIFFERENT[name]
    ours = _ours(tokenizer, body)
    assert ours != _sglang(sglang_server, body)
    assert ours == _sglang(sglang_server, equivalent)


def test_a_last_assistant_message_is_history_not_a_user_turn(
    tokenizer: Any, sglang_server: Any
) -> None:
    body = _body(USER, {"role": "assistant", "content": "It is"})
    ours, theirs = _ours(tokenizer, body), _sglang(sglang_server, body)
    assert tokenizer.decode(ours[0]).endswith(
        "<|im_start|>assistant\nIt is<|im_end|>\n<|im_start|>assistant\n"
    )
    assert "<|im_start|>user\nIt is<|im_end|>" in tokenizer.decode(theirs[0])
    assert ours[1] == theirs[1]


# -- Anthropic Messages, against SGLang's own Anthropic adapter --------------------------------

ANTHROPIC_WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city.",
    "input_schema": WEATHER["function"]["parameters"],  # type: ignore[index]
}
USE = {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}


def _messages(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 16, "messages": list(messages or [USER]), **fields}


def _answered(content: Any, **result: Any) -> dict[str, Any]:
    """A tool loop: the question, a call, and ``content`` as its result."""
    return _messages(
        USER,
        {"role": "assistant", "content": [{"type": "text", "text": "Let me see."}, USE]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": content, **result}]},
        tools=[ANTHROPIC_WEATHER],
    )  # fmt: skip


THINKING = {"type": "enabled", "budget_tokens": 2048}
ANTHROPIC_SAME: dict[str, dict[str, Any]] = {
    "plain": _messages(),
    "system": _messages(system="Be brief."),
    "system blocks": _messages(system=[{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]),
    "tools": _messages(tools=[ANTHROPIC_WEATHER]),
    "any tool": _messages(tools=[ANTHROPIC_WEATHER], tool_choice={"type": "any"}),
    "a named tool": _messages(tools=[ANTHROPIC_WEATHER], tool_choice={"type": "tool", "name": "get_weather"}),
    "no tool": _messages(tools=[ANTHROPIC_WEATHER], tool_choice={"type": "none"}),
    "a call and its result": _answered("sunny"),
    "a result in blocks": _answered([{"type": "text", "text": "sunny"}]),
    "thinking on": _messages(thinking=THINKING, max_tokens=4096),
    "thinking off": _messages(thinking={"type": "disabled"}),
    "sampling": _messages(temperature=0.5, top_p=0.9, top_k=20, stop_sequences=["END"]),
    "effort": _messages(output_config={"effort": "low"}),
    "format": _messages(output_config={"format": {"type": "json_schema", "schema": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": False}}}),
}  # fmt: skip


def _ours_anthropic(tokenizer: Any, body: dict[str, Any]) -> tuple[list[int], dict[str, Any]]:
    from kvretention.dataplane.frontend.anthropic import parse_messages

    return _planned(tokenizer, parse_messages(copy.deepcopy(body)))


def _sglang_anthropic(server: Any, body: dict[str, Any]) -> tuple[list[int], dict[str, Any]]:
    from sglang.srt.entrypoints.anthropic.protocol import AnthropicMessagesRequest
    from sglang.srt.entrypoints.anthropic.serving import AnthropicServing

    request = AnthropicMessagesRequest.model_validate(copy.deepcopy(body))
    with warnings.catch_warnings(), _tools_as_the_client_wrote_them():
        warnings.simplefilter("ignore")
        chat = AnthropicServing(server)._convert_to_chat_completion_request(request)
        return _processed(server, chat)


@pytest.mark.parametrize("name", sorted(ANTHROPIC_SAME))
def test_anthropic_prompts_and_sampling_are_sglangs(served: tuple[Any, Any], name: str) -> None:
    tokenizer, server = served
    body = ANTHROPIC_SAME[name]
    ours = _outcome(_ours_anthropic, tokenizer, body)
    assert ours == _outcome(_sglang_anthropic, server, body)


ANTHROPIC_DIFFERENT: dict[str, tuple[dict[str, Any], str, str]] = {
    # our body -> the end of our prompt, the end of SGLang's (the tiny model's format)
    "a prefill is continued (SGLang's adapter makes it a user turn)": (
        _messages(USER, {"role": "assistant", "content": "{"}),
        "Paris?<|im_end|>\n<|im_start|>assistant\n{",
        "Paris?<|im_end|>\n<|im_start|>user\n{<|im_end|>\n<|im_start|>assistant\n",
    ),
    "a failed tool's result says so (SGLang drops is_error)": (
        _answered("boom", is_error=True),
        "<tool_response>\nError: boom\n</tool_response>\n<|im_end|>\n<|im_start|>assistant\n",
        "<tool_response>\nboom\n</tool_response>\n<|im_end|>\n<|im_start|>assistant\n",
    ),
    "earlier thinking is left to the template (SGLang writes it into the text)": (
        _messages(
            USER,
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "x"}, {"type": "text", "text": "Sunny."}]},
            {"role": "user", "content": "And Rome?"},
            thinking=THINKING,
            max_tokens=4096,
        ),
        "assistant\nSunny.<|im_end|>\n<|im_start|>user\nAnd Rome?<|im_end|>\n<|im_start|>assistant\n",
        "assistant\n<think>hmm\n</think> Sunny.<|im_end|>\n<|im_start|>user\nAnd Rome?<|im_end|>\n<|im_start|>assistant\n",
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(ANTHROPIC_DIFFERENT))
def test_where_anthropic_prompts_differ_from_sglangs_adapter_on_purpose(
    tokenizer: Any, sglang_server: Any, name: str
) -> None:
    body, our_end, their_end = ANTHROPIC_DIFFERENT[name]
    ours, theirs = _ours_anthropic(tokenizer, body), _sglang_anthropic(sglang_server, body)
    assert tokenizer.decode(ours[0]).endswith(our_end)
    assert tokenizer.decode(theirs[0]).endswith(their_end)


QWEN3_GENERATION = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0}
"""Qwen3's ``generation_config.json`` sampling, which SGLang's server applies by default
(``--sampling-defaults model``) and its engine does not."""


@pytest.mark.parametrize(
    "fields",
    [{}, {"temperature": 1.0}, {"top_k": 5, "min_p": 0.2}, {"temperature": 0}, {"top_p": 0.5}],
    ids=str,
)
def test_the_models_generation_config_fills_what_the_request_leaves_unset(
    tokenizer: Any, sglang_server: Any, fields: dict[str, Any]
) -> None:
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    body = _body(**fields)
    ours = _planned(tokenizer, parse_chat(copy.deepcopy(body)), QWEN3_GENERATION)
    request = ChatCompletionRequest.model_validate(copy.deepcopy(body))
    assert ours == _processed(sglang_server, request, QWEN3_GENERATION)
    assert ours[1] != _ours(tokenizer, body)[1] or fields.keys() >= QWEN3_GENERATION.keys()
