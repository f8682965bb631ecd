"""Real chat templates, as a table: the one the tiny model serves, the defaults that transformers
and SGLang ship in their installed packages, and templates written here in the style of Qwen3,
Llama 3.1 and Mistral with the helpers HF templates use. The minijinja check renders each one,
and the fleet's prompts are compared with SGLang's own server's over each."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable

from transformers.models.llama4 import processing_llama4
from transformers.models.qwen2_audio.processing_qwen2_audio import Qwen2AudioProcessor
from transformers.models.smolvlm import processing_smolvlm

from kvretention.dataplane.worker.cpu.chat_format import CHAT_TEMPLATE


def _sglang_tiktoken_template() -> str:
    """The template SGLang's tiktoken tokenizer (Grok) sets, read from the installed source."""
    from sglang.srt.tokenizer import tiktoken_tokenizer

    found = re.search(r'self\.chat_template = "(.*)"\n', inspect.getsource(tiktoken_tokenizer))
    assert found, "sglang's tiktoken tokenizer no longer sets a chat template inline"
    return str(found.group(1).encode().decode("unicode_escape"))


QWEN3_STYLE = """
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- "# Tools\\n\\n<tools>" }}
{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\\n</tools><|im_end|>\\n" }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
{%- set index = (messages|length - 1) - loop.index0 %}
{%- if ns.multi_step_tool and message.role == "user" and message.content is string
      and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}
{%- endif %}
{%- endfor %}
{%- for message in messages %}
{%- if message.content is string %}{%- set content = message.content %}{%- else %}{%- set content = '' %}{%- endif %}
{%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
{%- elif message.role == "assistant" %}
{%- set reasoning_content = '' %}
{%- if message.reasoning_content is string %}{%- set reasoning_content = message.reasoning_content %}
{%- elif '</think>' in content %}
{%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
{%- set content = content.split('</think>')[-1].lstrip('\\n') %}
{%- endif %}
{%- if loop.index0 > ns.last_query_index %}
{%- if loop.last or (not loop.last and reasoning_content) %}
{{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
{%- else %}{{- '<|im_start|>' + message.role + '\\n' + content }}{%- endif %}
{%- else %}{{- '<|im_start|>' + message.role + '\\n' + content }}{%- endif %}
{%- if message.tool_calls %}
{%- for tool_call in message.tool_calls %}
{%- if (loop.first and content) or (not loop.first) %}{{- '\\n' }}{%- endif %}
{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '<tool_call>\\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}
{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{%- endif %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == "tool" %}
{%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' }}{{- content }}{{- '\\n</tool_response>' }}
{%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}
{%- endif %}
""".strip()

LLAMA31_STYLE = """
{{- bos_token }}
{%- if not date_string is defined %}{%- set date_string = strftime_now("%Y") %}{%- endif %}
{%- if messages[0]['role'] == 'system' %}
{%- set system_message = messages[0]['content']|trim %}{%- set messages = messages[1:] %}
{%- else %}{%- set system_message = "" %}{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}{{- "Environment: ipython\\n" }}{%- endif %}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none %}
{%- for t in tools %}{{- t | tojson(indent=4) }}{{- "\\n\\n" }}{%- endfor %}
{%- endif %}
{{- system_message }}{{- "<|eot_id|>" }}
{%- for message in messages %}
{%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- elif 'tool_calls' in message %}
{%- if not message.tool_calls|length >= 1 %}
{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}
{%- else %}
{%- set tool_call = message.tool_calls[0].function %}
{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
{{- '{"name": "' + tool_call.name + '", ' }}{{- '"parameters": ' }}{{- tool_call.arguments | tojson }}{{- "}" }}
{{- "<|eot_id|>" }}
{%- endif %}
{%- elif message.role == "tool" or message.role == "ipython" %}
{{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
{%- if message.content is mapping or message.content is iterable %}{{- message.content | tojson }}
{%- else %}{{- message.content }}{%- endif %}
{{- "<|eot_id|>" }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}
""".strip()

MISTRAL_STYLE = """
{%- set user_messages = messages | selectattr("role", "equalto", "user") | list %}
{%- set ns = namespace(seen=0) %}
{{- bos_token }}
{%- for message in messages | rejectattr("role", "equalto", "system") %}
{%- if message["role"] == "user" %}
{%- set ns.seen = ns.seen + 1 %}
{%- if tools and ns.seen == user_messages | length %}
{{- "[AVAILABLE_TOOLS] [" }}
{%- for tool in tools %}{%- set tool = tool.function %}{{- '{"type": "function", "function": {' }}
{%- for key, val in tool.items() if key != "return" %}
{%- if val is string %}{{- '"' + key + '": "' + val + '"' }}{%- else %}{{- '"' + key + '": ' + val|tojson }}{%- endif %}
{%- if not loop.last %}{{- ", " }}{%- endif %}
{%- endfor %}{{- "}}" }}{%- if not loop.last %}{{- ", " }}{%- else %}{{- "]" }}{%- endif %}
{%- endfor %}{{- "[/AVAILABLE_TOOLS]" }}
{%- endif %}
{{- "[INST] " + message["content"] + "[/INST]" }}
{%- elif message.tool_calls is defined and message.tool_calls %}
{{- "[TOOL_CALLS] [" }}
{%- for tool_call in message.tool_calls %}
{%- set out = tool_call.function|tojson %}{{- out[:-1] }}
{%- if not tool_call.id is defined or tool_call.id|length < 1 %}{{- raise_exception("Tool call IDs must be set") }}{%- endif %}
{{- ', "id": "' + tool_call.id[-9:] + '"}' }}{%- if not loop.last %}{{- ", " }}{%- else %}{{- "]" + eos_token }}{%- endif %}
{%- endfor %}
{%- elif message["role"] == "assistant" %}{{- " " + message["content"]|trim + eos_token }}
{%- elif message["role"] == "tool" %}
{{- '[TOOL_RESULTS] {"content": ' + message.content|tojson + ', "call_id": "' + message.tool_call_id[-9:] + '"}[/TOOL_RESULTS]' }}
{%- else %}{{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
{%- endif %}
{%- endfor %}
""".strip()

HELPERS = """
{%- macro show(v) -%}{%- if v is mapping -%}{{ v | dictsort | map('first') | join('+') }}
{%- elif v is string -%}{{ v | upper | replace('A', 'a') }}{%- elif v is none -%}null
{%- elif v is iterable -%}{{ v | map('string') | join(',') | length }}{%- elif v is number -%}{{ v }}|{{ v | tojson }}{%- else -%}{{ v }}{%- endif -%}
{%- endmacro -%}
{%- for message in messages -%}
{%- if loop.first and message.role not in ['system', 'user'] -%}{{ raise_exception('first message: ' ~ message.role) }}{%- endif -%}
[{{ loop.index }}/{{ loop.length }}{{ '*' if loop.last }}] {{ message.role | capitalize }}: {{ message.content if message.content is string else message.content | selectattr('type', 'equalto', 'text') | map(attribute='text') | join(' ') }}
{%- for call in message.tool_calls | default([]) %}
{%- if loop.index > 3 %}{% break %}{% endif %}
 -> {{ call.function.name }}({% for k, v in call.function.arguments | items %}{{ k }}={{ show(v) }}{{ ', ' if not loop.last }}{% endfor %})
{%- endfor %}
{%- if message.reasoning_content is defined %} ~{{ message.reasoning_content | length }}{% endif %}
{% endfor -%}
{%- if tools %}{{ tools | map(attribute='function') | map(attribute='name') | unique | list | tojson(separators=(',', ':')) }}{% endif -%}
{%- if add_generation_prompt %}<assistant>{% if reasoning_effort is defined %}{{ reasoning_effort | default('low', true) }}{% endif %}{% endif -%}
""".strip()

TEMPLATES: dict[str, Callable[[], str]] = {
    "kvretention tiny-model chat format": lambda: CHAT_TEMPLATE,
    "transformers llama4 (installed)": lambda: processing_llama4.chat_template,
    "transformers smolvlm (installed)": lambda: processing_smolvlm.DEFAULT_CHAT_TEMPLATE,
    "transformers qwen2-audio (installed)": lambda: Qwen2AudioProcessor.default_chat_template.fget(
        None
    ),
    "sglang tiktoken (installed)": _sglang_tiktoken_template,
    "qwen3-style reasoning after the last user turn": lambda: QWEN3_STYLE,
    "llama3.1-style strftime_now, tojson(indent)": lambda: LLAMA31_STYLE,
    "mistral-style selectattr, raise_exception": lambda: MISTRAL_STYLE,
    "helpers: macros, loop, break, dictsort, items, unique": lambda: HELPERS,
}
