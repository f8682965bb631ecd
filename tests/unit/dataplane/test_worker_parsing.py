"""Per-request output planning and parsing with SGLang's real parsers (pure, in-process)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from kvretention.dataplane.protocol import PreprocessedRequest, ToolCallDelta
from kvretention.dataplane.worker import output_parser, parsing
from kvretention.dataplane.worker.call import StreamAdapter
from kvretention.dataplane.worker.output_parser import BATCH_AFTER_CHARS, OutputParser
from kvretention.dataplane.worker.parsing import (
    ConstraintConflict,
    ParserNames,
    constrained_sampling,
    parser_names_from_argv,
    plan_output,
    thinking_requested,
)
from kvretention.dataplane.worker.standin_reply import plan_reply
from support.tool_call_texts import LEAD, LEADS, PARIS, ROME, TWO_CALLS, chunks, parser_name
from support.weather_tool import WEATHER

QWEN = ParserNames(tool_call_parser="qwen25", reasoning_parser="qwen3")
KEEP = {"skip_special_tokens"}


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], ParserNames()),
        (["--model-path", "m", "--tool-call-parser", "qwen25"], ParserNames("qwen25", None)),
        (["--reasoning-parser=qwen3", "--tool-call-parser=llama3"], ParserNames("llama3", "qwen3")),
        (["--tool-call-parser"], ParserNames()),
        (["--tool-call-parser", ""], ParserNames()),
    ],
)
def test_parser_names_come_from_sglangs_own_flags(argv: list[str], expected: ParserNames) -> None:
    assert parser_names_from_argv(argv) == expected


@pytest.mark.parametrize(
    ("default", "reasoning", "expected"),
    [
        (None, None, False),
        ("always", None, True),
        ("enable_thinking", None, True),
        ("enable_thinking", {"enabled": False}, False),
        ("thinking", {"enabled": True}, True),
        ("explicit_thinking", None, False),
        ("explicit_thinking", {"enabled": True}, True),
        ("mistral", None, False),
        ("mistral", {"enabled": True}, True),
    ],
)
def test_thinking_requested_mirrors_sglang(
    default: str | None, reasoning: dict[str, Any] | None, expected: bool
) -> None:
    from kvretention.dataplane.protocol import ReasoningControl

    control = None if reasoning is None else ReasoningControl.model_validate(reasoning)
    assert thinking_requested(default, control) is expected


def _request(**fields: Any) -> PreprocessedRequest:
    return PreprocessedRequest.model_validate(
        {"request_id": "r", "model": "m", "messages": [{"role": "user", "content": "x"}], **fields}
    )


@pytest.mark.parametrize(
    ("fields", "names", "keys"),
    [
        ({}, ParserNames(), set()),
        ({"tools": [WEATHER]}, ParserNames(), {"skip_special_tokens"}),
        ({"tools": [WEATHER]}, QWEN, {"skip_special_tokens"}),
        ({"tools": [WEATHER], "tool_choice": {"mode": "none"}}, QWEN, set()),
        (
            {"tools": [WEATHER], "tool_choice": {"mode": "required"}},
            QWEN,
            {"skip_special_tokens", "structural_tag"},
        ),
        (
            {"tools": [WEATHER], "tool_choice": {"mode": "required"}},
            ParserNames(),
            {"skip_special_tokens", "json_schema"},
        ),
        ({"response_format": {"type": "json_object"}}, QWEN, {"json_schema"}),
        (
            {"tools": [WEATHER], "response_format": {"type": "json_object"}},
            QWEN,
            {"skip_special_tokens", "json_schema"},
        ),
        ({"sampling": {"max_new_tokens": 5}}, QWEN, {"max_new_tokens"}),
        # SGLang keeps special tokens without tools for these models and reasoning formats
        ({}, ParserNames(reasoning_parser="gpt-oss", model_type="gpt_oss"), KEEP),
        ({}, ParserNames(model_type="gemma4"), KEEP),
        ({}, ParserNames(reasoning_parser="qwen3", model_type="qwen3"), set()),
        ({}, ParserNames(reasoning_parser="kimi_k3"), KEEP),
        ({}, ParserNames(reasoning_parser="muse"), KEEP),
        ({}, ParserNames(reasoning_parser="mistral"), set()),
        ({"reasoning": {"enabled": True}}, ParserNames(reasoning_parser="mistral"), KEEP),
        ({"reasoning": {"enabled": False}}, ParserNames(reasoning_parser="mistral"), set()),
    ],
)
def test_sampling_params_carry_sglangs_constraints(
    fields: dict[str, Any], names: ParserNames, keys: set[str]
) -> None:
    request = _request(**fields)
    params = constrained_sampling(request, plan_output(request, names))
    assert set(params) == keys


@pytest.mark.parametrize(
    "fields",
    [
        {"tools": [WEATHER], "tool_choice": {"mode": "named", "name": "nope"}},
        {
            "tools": [WEATHER],
            "tool_choice": {"mode": "required"},
            "response_format": {"type": "json_object"},
        },
    ],
)
def test_impossible_constraints_are_refused(fields: dict[str, Any]) -> None:
    request = _request(**fields)
    with pytest.raises(ConstraintConflict):
        constrained_sampling(request, plan_output(request, QWEN))


def _merge(deltas: list[ToolCallDelta]) -> list[tuple[str | None, str]]:
    merged: dict[int, list[Any]] = {}
    for d in deltas:
        entry = merged.setdefault(d.index, [d.name, ""])
        entry[1] += d.arguments
    return [(name, args) for name, args in (merged[i] for i in sorted(merged))]


@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "one_call"])
@pytest.mark.parametrize("marker", ["tool_call", "parallel_tool_calls"])
@pytest.mark.parametrize("tool_format", ["qwen25", "llama3"])
def test_streamed_and_whole_parses_agree(marker: str, tool_format: str, parallel: bool) -> None:
    """Streamed and whole parses give the same calls; with ``parallel_tool_calls: false`` an
    automatic choice (which SGLang leaves unconstrained) still gives the client one call."""
    names = ParserNames(tool_call_parser=tool_format, reasoning_parser="qwen3")
    request = _request(tools=[WEATHER], parallel_tool_calls=parallel)
    prompt = f"<tools>\n{json.dumps({'type': 'function', 'function': WEATHER})}\n</tools>"
    prompt += f"<|im_start|>user\n[[standin:reasoning]] [[standin:{marker}]]"
    pieces = plan_reply(prompt, sampling={}, tool_format=tool_format).pieces
    plan = plan_output(request, names)

    streamed = OutputParser(plan)
    steps = [streamed.feed(p) for p in pieces] + [streamed.finish()]
    whole = OutputParser(plan).parse_whole("".join(pieces))

    count = 2 if marker == "parallel_tool_calls" and parallel else 1
    expected = [("get_weather", '{"city": "stand-in"}')] * count
    stream_calls = _merge([d for s in steps for d in s.tool_calls])
    assert [(n, json.loads(a)) for n, a in stream_calls] == [
        (n, json.loads(a)) for n, a in expected
    ]
    assert [(d.name, json.loads(d.arguments)) for d in whole.tool_calls] == [
        (n, json.loads(a)) for n, a in expected
    ]
    assert "".join(s.reasoning for s in steps).strip() == whole.reasoning.strip() != ""
    assert streamed.called and len({d.id for d in whole.tool_calls}) == count


_LEADS = [(key, lead) for key in TWO_CALLS for lead in dict.fromkeys(("", LEADS.get(key, LEAD)))]


@pytest.mark.parametrize("tokens", [1, 3, 10, 40, 100_000], ids=lambda n: f"{n}_per_chunk")
@pytest.mark.parametrize(
    ("tool_format", "lead"), _LEADS, ids=[f"{f}-{'text' if t else 'calls'}" for f, t in _LEADS]
)
def test_streamed_calls_match_the_whole_parse_however_the_engine_chunks(
    tool_format: str, lead: str, tokens: int
) -> None:
    """An engine whose reader lags sends many tokens in one chunk, up to the whole answer
    before its finish: every call comes out with its arguments, and the text before them,
    as the whole parse gives them."""
    text = lead + TWO_CALLS[tool_format]
    names = ParserNames(tool_call_parser=parser_name(tool_format))
    plan = plan_output(_request(tools=[WEATHER]), names)
    whole = OutputParser(plan).parse_whole(text)
    expected = [("get_weather", PARIS), ("get_weather", ROME)]
    assert [(d.name, json.loads(d.arguments)) for d in whole.tool_calls] == expected
    assert (LEAD.strip() in whole.text) == bool(lead)
    parser = OutputParser(plan)
    steps = [parser.feed(c) for c in chunks(text, tokens, tool_format)] + [parser.finish()]
    streamed = _merge([d for s in steps for d in s.tool_calls])
    assert [(n, json.loads(a)) for n, a in streamed] == expected
    assert "".join(s.text for s in steps).strip() == whole.text.strip()
    assert not parser.differs_from_whole


@pytest.mark.parametrize("tokens", [1, 10], ids=lambda n: f"{n}_per_chunk")
@pytest.mark.parametrize("tool_format", sorted(TWO_CALLS))
def test_an_answer_read_whole_is_parsed_once_at_the_end(tool_format: str, tokens: int) -> None:
    """A client that does not stream gets SGLang's non-streaming parse of the whole answer,
    as SGLang's own server gives it, however the engine chunked it; with one call at most the
    answer is parsed as it streams (the engine is stopped once a second call begins)."""
    lead = LEADS.get(tool_format, LEAD)
    text = "<think>\nBoth cities.\n</think>\n\n" + lead + TWO_CALLS[tool_format]
    names = ParserNames(tool_call_parser=parser_name(tool_format), reasoning_parser="qwen3")
    plan = plan_output(_request(tools=[WEATHER], stream=False), names)
    parser = OutputParser(plan)
    steps = [parser.feed(chunk) for chunk in chunks(text, tokens, tool_format)]
    assert all(s == output_parser.ParsedDelta() for s in steps)
    end, whole = parser.finish(), OutputParser(plan).parse_whole(text)
    assert [(d.index, d.name, d.arguments) for d in end.tool_calls] == [
        (d.index, d.name, d.arguments) for d in whole.tool_calls
    ]
    assert (end.text, end.reasoning) == (whole.text, whole.reasoning)
    assert len(end.tool_calls) == 2 and parser.called and end.reasoning.strip() == "Both cities."
    one_call = plan_output(
        _request(tools=[WEATHER], stream=False, parallel_tool_calls=False), names
    )
    assert not one_call.read_whole


@pytest.mark.parametrize("tokens", [1, 100_000], ids=lambda n: f"{n}_per_chunk")
def test_calls_are_numbered_as_they_begin_whatever_the_detector_numbers(tokens: int) -> None:
    """Gemma 4's detector numbers a call by its tool's place in the request's list: a call of
    the second tool first, then one of the first, comes out as calls 0 and 1 all the same."""
    clock = {"name": "get_time", "parameters": {"type": "object", "properties": {}}}
    text = '<|tool_call>call:get_time{}<tool_call|><|tool_call>call:get_weather{city:<|"|>Rome<|"|>}<tool_call|>'
    plan = plan_output(_request(tools=[WEATHER, clock]), ParserNames(tool_call_parser="gemma4"))
    parser = OutputParser(plan)
    steps = [parser.feed(c) for c in chunks(text, tokens, "gemma4")] + [parser.finish()]
    deltas = [d for s in steps for d in s.tool_calls]
    assert [(d.index, d.name) for d in deltas if d.name] == [(0, "get_time"), (1, "get_weather")]
    assert [(n, json.loads(a)) for n, a in _merge(deltas)] == [
        ("get_time", {}),
        ("get_weather", ROME),
    ]


def _reasoning_texts() -> list[tuple[str, str]]:
    """A thought and an answer in each reasoning format, with its block's opening marker and
    without (the template opened it), as the model writes them."""
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    answers = {
        "cohere_command4": "<|START_TEXT|>The answer is 4.<|END_TEXT|>",
        "gpt-oss": "<|start|>assistant<|channel|>final<|message|>The answer is 4.<|return|>",
        "beam": "<|channel|>final<|message|>The answer is 4.<|return|>",
    }
    out = []
    for name, detector_class in sorted(ReasoningParser.DetectorMap.items()):
        if name == "response_template":
            continue  # needs a tokenizer's template
        detector = detector_class()
        start, end = detector.think_start_token, detector.think_end_token
        answer = answers.get(name, "\n\nThe answer is 4.")
        out.append((name, f"Plan it.{end}{answer}"))
        if name != "cohere_command4":  # its template opens the block; an echo leaks upstream
            out.append((name, f"{start}Plan it.{end}{answer}"))
    return out


_REASONING = _reasoning_texts()


@pytest.mark.parametrize("tokens", [1, 3, 10, 100_000], ids=lambda n: f"{n}_per_chunk")
@pytest.mark.parametrize(
    ("reasoning_parser", "text"),
    _REASONING,
    ids=[f"{n}-{'opened' if t.startswith('Plan') else 'opens'}" for n, t in _REASONING],
)
def test_reasoning_and_answer_match_the_whole_parse_however_the_engine_chunks(
    reasoning_parser: str, text: str, tokens: int
) -> None:
    """A chunk that holds the reasoning's end and what follows it loses nothing (Cohere
    Command's detector dropped the answer, or the calls, that shared its increment)."""
    plan = plan_output(
        _request(reasoning={"enabled": True}), ParserNames(reasoning_parser=reasoning_parser)
    )
    whole = OutputParser(plan).parse_whole(text)
    assert "The answer is 4." in whole.text
    parser = OutputParser(plan)
    steps = [parser.feed(c) for c in chunks(text, tokens)] + [parser.finish()]
    assert "".join(s.text for s in steps).strip() == whole.text.strip()
    assert "".join(s.reasoning for s in steps).strip() == whole.reasoning.strip()


_FAMILIES = [
    ("qwen25", "qwen3", "<think>"),
    ("deepseekv3", "deepseek-r1", "<think>"),
    ("glm45", "glm45", "<think>"),
    ("kimi_k2", "kimi_k2", "<think>"),
    ("minimax-m2", "minimax", "<think>"),
    ("step3", "step3", "<think>"),
    ("mistral", "mistral", "[THINK]"),
    ("cohere_command4", "cohere_command4", ""),
]
"""A model family's tool-call and reasoning parsers, and how its reasoning opens (``""``: the
template opened it)."""


@pytest.mark.parametrize("tokens", [1, 10, 100_000], ids=lambda n: f"{n}_per_chunk")
@pytest.mark.parametrize(("tool_format", "reasoning_parser", "opening"), _FAMILIES)
def test_reasoning_then_calls_stream_as_the_whole_parse_reads_them(
    tool_format: str, reasoning_parser: str, opening: str, tokens: int
) -> None:
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    end = ReasoningParser.DetectorMap[reasoning_parser]().think_end_token
    text = f"{opening}Plan it.{end}" + TWO_CALLS[tool_format]
    names = ParserNames(tool_call_parser=tool_format, reasoning_parser=reasoning_parser)
    plan = plan_output(_request(tools=[WEATHER], reasoning={"enabled": True}), names)
    whole = OutputParser(plan).parse_whole(text)
    assert [(d.name, json.loads(d.arguments)) for d in whole.tool_calls] == [
        ("get_weather", PARIS),
        ("get_weather", ROME),
    ]
    parser = OutputParser(plan)
    steps = [parser.feed(c) for c in chunks(text, tokens, tool_format)] + [parser.finish()]
    streamed = _merge([d for s in steps for d in s.tool_calls])
    assert [(n, json.loads(a)) for n, a in streamed] == [
        (d.name, json.loads(d.arguments)) for d in whole.tool_calls
    ]
    assert "".join(s.reasoning for s in steps).strip() == whole.reasoning.strip() == "Plan it."


@pytest.mark.parametrize(
    ("key", "streams"), [("mistral", False), ("mistral:name_args", True), ("interns1", False)]
)
def test_only_the_forms_streamed_wrong_wait_for_the_end(key: str, streams: bool) -> None:
    """Mistral's JSON array is held to the end; its ``[TOOL_CALLS]name[ARGS]{...}`` form
    streams each call as it is written, the first before the second begins."""
    plan = plan_output(_request(tools=[WEATHER]), ParserNames(tool_call_parser=parser_name(key)))
    parser = OutputParser(plan)
    steps = [parser.feed(c) for c in chunks(TWO_CALLS[key], 1, key)]
    early = [d.name for s in steps for d in s.tool_calls if d.name]
    end = parser.finish()
    assert early == (["get_weather", "get_weather"] if streams else [])
    assert len([d for d in end.tool_calls if d.name]) == (0 if streams else 2)


@pytest.mark.parametrize("tool_format", sorted(output_parser.WHOLE_SECTION_PARSERS))
def test_the_formats_held_whole_still_stream_wrong_in_sglang(tool_format: str) -> None:
    """Why their sections are held: SGLang's own streaming detector, fed the two calls a token
    at a time, gives other calls than its whole parse. When an SGLang upgrade fixes one, this
    fails and the format can stream again."""
    from sglang.srt.function_call.function_call_parser import FunctionCallParser

    plan = plan_output(_request(tools=[WEATHER]), ParserNames(tool_call_parser=tool_format))
    detector = FunctionCallParser(plan.tools, tool_format)
    deltas = [
        ToolCallDelta(index=c.tool_index, name=c.name, arguments=c.parameters or "")
        for chunk in chunks(TWO_CALLS[tool_format], 1, tool_format)
        for c in detector.parse_stream_chunk(chunk)[1]
    ]
    whole = OutputParser(plan).parse_whole(TWO_CALLS[tool_format])
    assert _merge(deltas) != [(d.name, d.arguments) for d in whole.tool_calls]
    assert len(whole.tool_calls) == 2


def test_a_long_call_reaches_the_detector_in_growing_batches() -> None:
    """SGLang's detectors re-parse a call's arguments whole on every increment: a 2,000-token
    file fed token by token made that quadratic. Its arguments reach the detector in batches
    that grow with the call past its first ``BATCH_AFTER_CHARS``, still stream to the client
    before the answer ends, and come out as the whole parse gives them; a short call after it
    streams token by token again."""
    write = {
        "name": "write",
        "parameters": {"type": "object", "properties": {"content": {"type": "string"}}},
    }
    content = "".join(f"line {i}: x = {i} * 2\n" for i in range(400))
    short = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    text = "<tool_call>\n" + json.dumps({"name": "write", "arguments": {"content": content}})
    text += "\n</tool_call>\n" + short
    plan = plan_output(_request(tools=[write, WEATHER]), ParserNames(tool_call_parser="qwen25"))
    parser = OutputParser(plan)
    fed: list[str] = []
    step = parser._step_tools

    def counted(piece: str) -> tuple[str, list[Any]]:
        fed.append(piece)
        return step(piece)

    parser._step_tools = counted  # type: ignore[method-assign]
    tokens = chunks(text, 1)
    steps = [parser.feed(token) for token in tokens]
    before_end = sum(1 for s in steps if s.tool_calls)
    steps.append(parser.finish())
    [(name, arguments), second] = _merge([d for s in steps for d in s.tool_calls])
    assert (name, json.loads(arguments)) == ("write", {"content": content})
    assert (second[0], json.loads(second[1])) == ("get_weather", {"city": "Paris"})
    # one increment a token (a character here) for the call's opening and first
    # BATCH_AFTER_CHARS of arguments, then batches a quarter of the call long: about a dozen;
    # then the short call one character at a time
    last_batch = max(i for i, piece in enumerate(fed) if len(piece) > 1)
    assert len(fed) - last_batch > len(short) - 20, (len(fed), last_batch)
    assert len(tokens) > 9_000 and len(fed) < BATCH_AFTER_CHARS + 80 + len(short), len(fed)
    assert before_end > 5  # the arguments stream while the engine writes them


class _LateDetector:
    """A tool-call parser that names the second call before it has streamed all of the
    first call's arguments (SGLang's base detectors flush them first; others need not). Its
    ``prev_tool_call_arr`` / ``streamed_args_for_tool`` are what SGLang's detectors keep."""

    STEPS = (
        [SimpleNamespace(tool_index=0, name="get_weather", parameters='{"city": "Pa')],
        [SimpleNamespace(tool_index=1, name="get_weather", parameters="")],
        [SimpleNamespace(tool_index=1, name=None, parameters='{"city": "Rome"}')],
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.detector = self
        self.prev_tool_call_arr: list[dict[str, Any]] = []
        self.streamed_args_for_tool: list[str] = []
        self._step = 0

    def parse_stream_chunk(self, text: str) -> tuple[str, list[Any]]:
        calls = self.STEPS[self._step] if self._step < len(self.STEPS) else []
        self._step += 1
        if self._step == 2:  # the first call parsed whole, its end never streamed
            self.prev_tool_call_arr = [{"name": "get_weather", "arguments": {"city": "Paris"}}]
        for call in calls:
            while len(self.streamed_args_for_tool) <= call.tool_index:
                self.streamed_args_for_tool.append("")
            self.streamed_args_for_tool[call.tool_index] += call.parameters
        return "", calls

    def parse_stream_end(self) -> tuple[str, list[Any]]:
        return "", []

    WHOLE = (("get_weather", PARIS), ("get_weather", ROME))
    """What its non-streaming parse reads from any text."""

    def has_tool_call(self, text: str) -> bool:
        return True

    def parse_non_stream(self, text: str) -> tuple[str, list[Any]]:
        return "", [SimpleNamespace(name=n, parameters=json.dumps(a)) for n, a in self.WHOLE]


class _LosingDetector(_LateDetector):
    """One whose whole parse reads a third call its streaming never gave."""

    WHOLE = (*_LateDetector.WHOLE, ("get_weather", {"city": "Oslo"}))


@pytest.mark.parametrize("detector", [_LateDetector, _LosingDetector])
def test_streamed_calls_that_differ_from_the_whole_parse_are_told(
    monkeypatch: pytest.MonkeyPatch, detector: type[_LateDetector]
) -> None:
    """The worker counts an answer whose streamed calls are not what SGLang's whole parse of
    the same text reads (``kvretention_worker_tool_calls_unlike_whole_total``)."""
    plan = plan_output(_request(tools=[WEATHER]), ParserNames(tool_call_parser="qwen25"))
    real = parsing.sglang_parsers()
    monkeypatch.setattr(output_parser, "sglang_parsers", lambda: (detector, real[1]))
    parser = OutputParser(plan)
    for piece in ("a", "b", "c"):
        parser.feed(piece)
    parser.finish()
    assert parser.differs_from_whole is (detector is _LosingDetector)


@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "one_call"])
def test_a_call_the_detector_finishes_late_is_sent_whole(
    monkeypatch: pytest.MonkeyPatch, parallel: bool
) -> None:
    """The first call's unstreamed arguments go out when the second call begins, before an
    answer under ``parallel_tool_calls: false`` ends there."""
    request = _request(tools=[WEATHER], parallel_tool_calls=parallel)
    plan = plan_output(request, ParserNames(tool_call_parser="qwen25"))
    real = parsing.sglang_parsers()
    monkeypatch.setattr(output_parser, "sglang_parsers", lambda: (_LateDetector, real[1]))
    parser = OutputParser(plan)
    steps = [parser.feed(piece) for piece in ("a", "b", "c")]
    if parallel:
        steps.append(parser.finish())
    calls = _merge([d for s in steps for d in s.tool_calls])
    assert calls[0] == ("get_weather", '{"city": "Paris"}')
    assert calls[1:] == ([("get_weather", '{"city": "Rome"}')] if parallel else [])
    assert parser.dropped_call is not parallel


def test_a_single_final_output_is_parsed_whole() -> None:
    request = _request(tools=[WEATHER])
    adapter = StreamAdapter(parser=OutputParser(plan_output(request, QWEN)))
    text = '<think>\nhm\n</think>\n\nOk.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    meta = {"finish_reason": {"type": "stop"}, "prompt_tokens": 3, "completion_tokens": 9}
    chunk = adapter.chunk({"text": text, "output_ids": [1], "meta_info": meta})
    assert chunk.reasoning.strip() == "hm"
    assert chunk.text.strip() == "Ok."
    (call,) = chunk.tool_calls
    assert (call.index, call.name, json.loads(call.arguments)) == (
        0,
        "get_weather",
        {"city": "Rome"},
    )
    assert call.id is not None and call.id.startswith("call_")
    assert chunk.finish_reason == "tool_calls"


def test_length_finish_is_not_turned_into_tool_calls() -> None:
    request = _request(tools=[WEATHER])
    adapter = StreamAdapter(parser=OutputParser(plan_output(request, QWEN)))
    adapter.chunk({"text": "<think>\n</think>\n\n<tool_call>\n", "meta_info": {}})
    last = adapter.chunk(
        {
            "text": '<think>\n</think>\n\n<tool_call>\n{"name": "get_weather", "argu',
            "meta_info": {"finish_reason": {"type": "length"}},
        }
    )
    assert last.finish_reason == "length"


def test_a_regex_custom_tool_is_enforced_through_sglangs_structural_tag() -> None:
    patch = {
        "kind": "custom",
        "name": "apply_patch",
        "strict": True,
        "grammar": {"syntax": "regex", "definition": "\\*\\*\\* Begin Patch[\\s\\S]*"},
    }
    request = _request(tools=[patch], tool_choice={"mode": "required"})
    params = constrained_sampling(request, plan_output(request, QWEN))
    (structure,) = json.loads(params["structural_tag"])["structures"]
    assert structure["schema"]["properties"]["input"]["pattern"] == patch["grammar"]["definition"]


@pytest.mark.parametrize(
    ("tool_format", "lead", "reasoning"),
    [
        ("qwen25", "\n\n", ""),  # Qwen writes "\n\n<tool_call>"
        ("qwen25", "", "[[standin:reasoning]] "),  # the "\n\n" after </think>
        ("llama3", "", "[[standin:reasoning]] "),
    ],
)
def test_no_whitespace_only_text_comes_before_tool_calls(
    tool_format: str, lead: str, reasoning: str
) -> None:
    """Templates write ``"\n\n"`` before a call; it must not reach clients as a text block or
    message of its own (issue 20, item 7), streamed or whole."""
    request = _request(tools=[WEATHER])
    prompt = f"<tools>\n{json.dumps({'type': 'function', 'function': WEATHER})}\n</tools>"
    prompt += f"<|im_start|>user\n{reasoning}[[standin:tool_call]]"
    pieces = [lead, *plan_reply(prompt, sampling={}, tool_format=tool_format).pieces]
    plan = plan_output(request, ParserNames(tool_format, "qwen3" if reasoning else None))
    streamed = OutputParser(plan)
    steps = [*(streamed.feed(p) for p in pieces), streamed.finish()]
    assert "".join(s.text for s in steps) == ""
    assert [d.name for s in steps for d in s.tool_calls if d.name] == ["get_weather"]
    whole = OutputParser(plan).parse_whole("".join(pieces))
    assert whole.text == "" and [d.name for d in whole.tool_calls] == ["get_weather"]


def test_whitespace_between_texts_is_kept() -> None:
    """Held whitespace is sent with the text that follows it: only a run before a call goes."""
    streamed = OutputParser(plan_output(_request(tools=[WEATHER]), ParserNames("qwen25")))
    steps = [streamed.feed(p) for p in ("Hello", "\n\n", "world", "\n")] + [streamed.finish()]
    assert "".join(s.text for s in steps) == "Hello\n\nworld\n"
    plain = OutputParser(plan_output(_request(), ParserNames()))
    assert plain.feed("\n\n").text == "" and plain.finish().text == "\n\n"


def test_deferred_tools_are_parsed_but_not_required_in_the_prompt() -> None:
    """A deferred tool a tool search loaded is called like any other tool."""
    request = _request(tools=[], deferred_tools=[WEATHER])
    plan = plan_output(request, QWEN)
    assert plan.parses_tools and plan.tool_kinds == {"get_weather": "function"}
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    (call,) = OutputParser(plan).parse_whole(text).tool_calls
    assert call.name == "get_weather"


def test_an_empty_think_block_is_no_reasoning() -> None:
    """``<think>\\n\\n</think>`` before a call would be a whitespace-only thinking block or
    reasoning item; real reasoning that starts with whitespace keeps it."""
    plan = plan_output(_request(tools=[WEATHER]), QWEN)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    streamed = OutputParser(plan)
    steps = [streamed.feed(p) for p in ("<think>", "\n\n", "</think>", "\n\n", call)]
    steps.append(streamed.finish())
    assert "".join(s.reasoning for s in steps) == ""
    assert "".join(s.text for s in steps) == ""
    whole = OutputParser(plan).parse_whole("<think>\n\n</think>\n\n" + call)
    assert (whole.reasoning, whole.text, len(whole.tool_calls)) == ("", "", 1)
    thinking = OutputParser(plan)
    kept = [thinking.feed(p) for p in ("<think>", "\n", "plan", "</think>", "Hi")]
    kept.append(thinking.finish())
    assert "".join(s.reasoning for s in kept) == "\nplan"


def _structural_tag_grammar(key: str) -> Any:
    """The grammar SGLang's xgrammar backend compiles from a ``structural_tag`` sampling param
    (``dispatch_structural_tag``: the legacy form is converted first)."""
    from xgrammar import Grammar, StructuralTag, StructuralTagItem

    tag = json.loads(key)
    if "structures" not in tag:
        return Grammar.from_structural_tag(key)
    items = [
        StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"] or {}), end=s["end"])
        for s in tag["structures"]
    ]
    converted = StructuralTag.from_legacy_structural_tag(items, tag["triggers"])
    converted.format.at_least_one = tag.get("at_least_one", False)
    return Grammar.from_structural_tag(converted)


ONE_CALL = '<tool_call>\n{"name":"get_weather", "arguments":{"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize(
    ("choice", "parallel", "accepts_two"),
    [
        ({"mode": "required"}, True, True),
        ({"mode": "required"}, False, False),
        ({"mode": "named", "name": "get_weather"}, False, False),
    ],
)
def test_parallel_tool_calls_false_lets_one_forced_call_through(
    choice: dict[str, Any], parallel: bool, accepts_two: bool
) -> None:
    """SGLang's legacy structural tag (qwen25) has no count: the plan adds xgrammar's
    stop-after-first, so the grammar itself refuses a second call."""
    from xgrammar.testing import _is_grammar_accept_string

    request = _request(tools=[WEATHER], tool_choice=choice, parallel_tool_calls=parallel)
    params = constrained_sampling(request, plan_output(request, QWEN))
    grammar = _structural_tag_grammar(params["structural_tag"])
    assert _is_grammar_accept_string(grammar, ONE_CALL)
    assert _is_grammar_accept_string(grammar, ONE_CALL + ONE_CALL) is accepts_two
    assert not _is_grammar_accept_string(grammar, "no call")
