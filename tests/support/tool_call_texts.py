"""Two tool calls (``get_weather`` for Paris, then Rome) in each of SGLang's tool-call formats, as
the model writes them, and the same text cut into engine chunks.

Each text is one the format's own non-streaming parser reads back as the two calls
(``test_worker_parsing.py`` checks it); the markers a format's tokenizer holds as one token stay
whole when the text is cut into chunks, as an engine streams them.
"""

from __future__ import annotations

import json
import re
from typing import Final

PARIS: Final = {"city": "Paris"}
ROME: Final = {"city": "Rome"}
_BOTH = (PARIS, ROME)
_BAR, _SPACE = "\uff5c", "\u2581"  # DeepSeek's special tokens: fullwidth bars, block spaces


def _ds(words: str) -> str:
    """A DeepSeek special token: ``_ds("tool sep")`` is ``<BAR tool SPACE sep BAR>``."""
    return f"<{_BAR}{words.replace(' ', _SPACE)}{_BAR}>"


def _dsml(block: str, mark: str = "DSML", *, space: str = "") -> str:
    """DeepSeek V3.2's (and GigaChat 3.5's) XML-like calls: ``<|DSML|invoke name=...>``."""
    tag = f"{_BAR}{mark}{_BAR}{space}"
    invokes = "".join(
        f'<{tag}invoke name="get_weather">\n'
        f'<{tag}parameter name="city" string="true">{a["city"]}</{tag}parameter>\n'
        f"</{tag}invoke>\n"
        for a in _BOTH
    )
    return f"<{tag}{block}>\n{invokes}</{tag}{block}>"


def _each(template: str) -> str:
    """``template`` once per call, ``{city}`` and ``{args}`` (the JSON arguments) filled in."""
    return "".join(template.format(city=a["city"], args=json.dumps(a)) for a in _BOTH)


def _json_calls(key: str = "arguments") -> list[str]:
    return [json.dumps({"name": "get_weather", key: a}) for a in _BOTH]


_QWEN = _each('<tool_call>\n{{"name": "get_weather", "arguments": {args}}}\n</tool_call>\n')
_QWEN3_CODER = _each(
    "<tool_call>\n<function=get_weather>\n<parameter=city>\n{city}\n</parameter>\n"
    "</function>\n</tool_call>\n"
)
_GLM = _each(
    "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>{city}</arg_value>\n</tool_call>"
)
_GLM_LINES = _GLM.replace("</tool_call>", "</tool_call>\n")
_MINIMAX = "]<]minimax[>["
_BEAM_CALL = (
    " to=get_weather<|channel|>analysis <|constrain|>xml<|message|>"
    '<rfl:parameter name="city">\n{city}\n</rfl:parameter>'
)

TWO_CALLS: Final[dict[str, str]] = {
    "qwen25": _QWEN,
    "hermes": _QWEN,
    "qwen": _QWEN,
    "trinity": _QWEN,
    "llama3": "<|python_tag|>" + ";".join(_json_calls("parameters")),
    "kimi_k2": "<|tool_calls_section_begin|>"
    + "".join(
        f"<|tool_call_begin|>functions.get_weather:{i}<|tool_call_argument_begin|>"
        f"{json.dumps(a)}<|tool_call_end|>"
        for i, a in enumerate(_BOTH)
    )
    + "<|tool_calls_section_end|>",
    "deepseekv3": _ds("tool calls begin")
    + "\n".join(
        f"{_ds('tool call begin')}function{_ds('tool sep')}get_weather\n```json\n"
        f"{json.dumps(a)}\n```{_ds('tool call end')}"
        for a in _BOTH
    )
    + _ds("tool calls end"),
    "deepseekv31": _ds("tool calls begin")
    + "".join(
        f"{_ds('tool call begin')}get_weather{_ds('tool sep')}{json.dumps(a)}{_ds('tool call end')}"
        for a in _BOTH
    )
    + _ds("tool calls end"),
    "deepseekv32": _dsml("function_calls"),
    "deepseekv4": _dsml("tool_calls"),
    "deepseekv41": _dsml("calls", space=" "),
    "gigachat35": _dsml("tool_calls", "GCML"),
    "pythonic": "[get_weather(city='Paris'), get_weather(city='Rome')]",
    "qwen3_coder": _QWEN3_CODER,
    "step3p5": _QWEN3_CODER,
    "nanbeige": _QWEN3_CODER,
    "mimo": _each(
        "<tool_call>\n<function=get_weather>\n<parameter=city>{city}</parameter>\n"
        "</function>\n</tool_call>\n"
    ),
    "glm45": _GLM,
    "glm": _GLM,
    "glm47": _GLM.replace("\n", ""),
    "ling3": _GLM_LINES,
    "poolside_v1": _GLM_LINES,
    "spark25": _each(
        "<tool_call>get_weather\n<arg_key>city</arg_key><arg_value>{city}</arg_value>\n"
        "</tool_call>\n"
    ),
    "iquest_q1": _each(
        "<iquest_tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>{city}</arg_value>\n"
        "</iquest_tool_call>\n"
    ),
    "hunyuan": "<tool_calls>\n"
    + _each(
        "<tool_call>get_weather<tool_sep>\n<arg_key>city</arg_key>\n<arg_value>{city}</arg_value>\n"
        "</tool_call>\n"
    )
    + "</tool_calls>",
    "k2_horizon": "<ifm|tool_calls>"
    + _each(
        "<ifm|tool_call>get_weather<ifm|arg_key>city</ifm|arg_key>"
        "<ifm|arg_value>{city}</ifm|arg_value></ifm|tool_call>"
    )
    + "</ifm|tool_calls>",
    "kimi_k3": "<|open|>tools<|sep|>"
    + "".join(
        f'<|open|>call tool="get_weather" index="{i}"<|sep|>'
        f'<|open|>argument key="city" type="string"<|sep|>{a["city"]}<|close|>argument<|sep|>'
        "<|close|>call<|sep|>"
        for i, a in enumerate(_BOTH, 1)
    )
    + "<|close|>tools<|sep|>",
    "minimax-m2": "<minimax:tool_call>\n"
    + _each('<invoke name="get_weather">\n<parameter name="city">{city}</parameter>\n</invoke>\n')
    + "</minimax:tool_call>",
    "minimax-m3": f"{_MINIMAX}<tool_call>\n"
    + _each(
        f'{_MINIMAX}<invoke name="get_weather">\n{_MINIMAX}<city>{{city}}{_MINIMAX}</city>\n'
        f"{_MINIMAX}</invoke>\n"
    )
    + f"{_MINIMAX}</tool_call>",
    "dots": "<dots_function_call>\n"
    + _each('<invoke name="get_weather">\n<parameter name="city">{city}</parameter>\n</invoke>\n')
    + "</dots_function_call>",
    "minicpm5": _each(
        '<function name="get_weather"><param name="city">{city}</param></function>\n'
    ),
    "step3": _ds("tool_calls_begin")
    + "\n"
    + _each(
        f"{_ds('tool_call_begin')}function{_ds('tool_sep')}"
        '<steptml:invoke name="get_weather">\n'
        '<steptml:parameter name="city">{city}</steptml:parameter>\n</steptml:invoke>'
        f"{_ds('tool_call_end')}\n"
    )
    + _ds("tool_calls_end"),
    "gemma4": _each('<|tool_call>call:get_weather{{city:<|"|>{city}<|"|>}}<tool_call|>'),
    "apertus2509": "<|tools_prefix|>"
    + json.dumps([{"get_weather": a} for a in _BOTH])
    + "<|tools_suffix|>",
    "lfm2": '<|tool_call_start|>[get_weather(city="Paris"), get_weather(city="Rome")]'
    "<|tool_call_end|>",
    "lfm2:json": "<|tool_call_start|>[" + ", ".join(_json_calls()) + "]<|tool_call_end|>",
    "inkling": _each(
        '<|message_model|>get_weather<|content_invoke_tool_json|>{{"name": "get_weather", '
        '"args": {args}}}<|end_message|>'
    ),
    "muse": " to=functions.get_weather<|message|><atem:function_calls>\n"
    + _each(
        '<atem:invoke name="get_weather">\n<atem:parameter name="city">{city}</atem:parameter>\n'
        "</atem:invoke>\n"
    )
    + "</atem:function_calls><|eom|>",
    "beam": _BEAM_CALL.format(city="Paris")
    + "<|end|><|start|>assistant"
    + _BEAM_CALL.format(city="Rome")
    + "<|call|>",
    "gpt-oss": _each(
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        "<|message|>{args}<|call|>"
    ),
    "mistral": "[TOOL_CALLS] "
    + json.dumps([{"name": "get_weather", "arguments": a} for a in _BOTH]),
    "mistral:name_args": _each("[TOOL_CALLS]get_weather[ARGS]{args}"),
    "cohere_command4": "<|START_ACTION|>"
    + json.dumps(
        [
            {"tool_call_id": str(i), "tool_name": "get_weather", "parameters": a}
            for i, a in enumerate(_BOTH)
        ]
    )
    + "<|END_ACTION|>",
    "interns1": _each(
        '<|action_start|> <|plugin|>\n{{"name": "get_weather", "parameters": {args}}}<|action_end|>'
    ),
}
"""Two calls in each tool-call format; a key's part before ``:`` is the parser's name (``lfm2``
reads a pythonic list and a JSON one, ``mistral`` a JSON array and Devstral's and Magistral's
``[TOOL_CALLS]name[ARGS]{...}``)."""

LEADS: Final[dict[str, str]] = {
    "muse": " to=user<|message|>Let me check both. <|eom|><|start|>assistant",
    "beam": "<|channel|>final<|message|>Let me check both.<|end|><|start|>assistant",
    "gpt-oss": "",  # harmony writes text in a channel of its own
}
"""Text before the calls, where the format does not take plain text there."""
LEAD: Final = "Let me check both. "

_TOKENS: Final = (
    r"<\|[^|<>]*\|>",
    rf"<{_BAR}[^{_BAR}]*{_BAR}>",
    re.escape("[TOOL_CALLS]"),
    re.escape("[ARGS]"),
)
"""Markers every tokenizer here holds as one token: ``<|...|>``, DeepSeek's, Mistral's."""
_TAGS: Final = ("<tool_call>", "</tool_call>")
_ARG_TAGS: Final = (*_TAGS, "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")
FORMAT_TOKENS: Final[dict[str, tuple[str, ...]]] = {
    "mimo": _TAGS,
    "step3p5": _TAGS,
    "nanbeige": _TAGS,
    "ling3": _ARG_TAGS,
    "poolside_v1": _ARG_TAGS,
    "spark25": _ARG_TAGS,
    "glm47": _ARG_TAGS,
    "iquest_q1": ("<iquest_tool_call>", "</iquest_tool_call>", *_ARG_TAGS[2:]),
    "hunyuan": ("<tool_calls>", "</tool_calls>", "<tool_sep>", *_ARG_TAGS),
    "k2_horizon": tuple(
        f"<{end}ifm|{tag}>"
        for tag in ("tool_calls", "tool_call", "arg_key", "arg_value")
        for end in ("", "/")
    ),
    "deepseekv32": (f"{_BAR}DSML{_BAR}",),
    "deepseekv4": (f"{_BAR}DSML{_BAR}",),
    "deepseekv41": (f"{_BAR}DSML{_BAR}",),
    "gigachat35": (f"{_BAR}GCML{_BAR}",),
    "minimax-m2": ("<minimax:tool_call>", "</minimax:tool_call>"),
    "minimax-m3": (_MINIMAX,),
    "gemma4": ("<|tool_call>", "<tool_call|>", '<|"|>'),
    "dots": ("<dots_function_call>", "</dots_function_call>"),
    "muse": ("<atem:function_calls>", "</atem:function_calls>"),
    "beam": ("\n</rfl:parameter>",),
}
"""Markers more a format's tokenizer holds as one token (an engine never splits them)."""


def parser_name(key: str) -> str:
    return key.split(":", 1)[0]


def chunks(text: str, tokens: int, key: str = "") -> list[str]:
    """``text`` as an engine streams it, ``tokens`` characters (special tokens whole, those of
    format ``key`` too) a chunk."""
    more = [re.escape(t) for t in FORMAT_TOKENS.get(key, ())]
    special = re.compile("(" + "|".join([*more, *_TOKENS]) + ")")
    atoms = [a for p in special.split(text) for a in ([p] if special.fullmatch(p) else p)]
    return ["".join(atoms[i : i + tokens]) for i in range(0, len(atoms), tokens)]
