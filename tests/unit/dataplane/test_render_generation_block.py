"""A breakpoint on the newest message resolves against the prompt less its generation prompt,
only where the template provably writes that prompt last; and then that text is exactly what
transformers renders without the generation prompt.

The real templates of ``test_render_compiled.py`` are rendered over its conversations by
``apply_chat_template`` without the generation prompt and compared with what the compiled
template derives from minijinja's prompt; a table of template texts pins what the reading
accepts and refuses.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_render_compiled import CONVERSATIONS, TEMPLATES, _reference, _with_template

from kvretention.dataplane.compiled_template import CompiledTemplate, compile_template
from kvretention.dataplane.generation_block import generation_block
from kvretention.dataplane.template_input import build_template_input
from support import chat_tokenizer

PROVEN = {
    "kvretention tiny-model chat format",
    "qwen3-style reasoning after the last user turn",
    "helpers: macros, loop, break, dictsort, items, unique",
    "llama3.1-style strftime_now, tojson(indent)",
    "sglang tiktoken (installed)",
    "transformers qwen2-audio (installed)",
    "transformers smolvlm (installed)",
}
"""The real templates whose generation prompt is provably last (the others keep two renders)."""


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return chat_tokenizer.build_tokenizer()


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_the_prompt_less_its_generation_prompt_is_transformers_rendering_without_it(
    tokenizer: Any, name: str
) -> None:
    tok = _with_template(tokenizer, TEMPLATES[name]())
    compiled = compile_template(tok, verify_every=0)
    assert isinstance(compiled, CompiledTemplate), compiled
    assert compiled.generation == (name in PROVEN)
    derived = 0
    for conversation, (messages, tools, reasoning) in CONVERSATIONS.items():
        template_input = build_template_input(messages, tools=tools, reasoning=reasoning)
        prompt = _reference(tok, template_input, True)
        if prompt is None:
            continue
        got = compiled.without_generation_prompt(
            prompt,
            template_input.messages,
            template_input.tools,
            kwargs=template_input.template_kwargs,
        )
        if compiled.generation:
            assert got == _reference(tok, template_input, False), conversation
            derived += 1
        else:
            assert got is None
    assert derived >= 2 or name not in PROVEN


LAST = "{%- if add_generation_prompt -%}\n<|im_start|>assistant\n{%- endif -%}"
LOOP = "{%- for m in messages -%}{{ m.content }}{%- endfor -%}"
# (case, template text, whether the trailing block is provably last)
SOURCES: list[tuple[str, str, bool]] = [
    ("the block ends the template", LOOP + LAST, True),
    ("a newline after it (dropped)", LOOP + LAST + "\n", True),
    ("it reads a context switch", LOOP + "{%- if add_generation_prompt %}a{% if enable_thinking is false %}b{% endif %}{% endif %}", True),
    ("text after the block", LOOP + LAST + "tail", False),
    ("an else branch", LOOP + "{%- if add_generation_prompt %}a{% else %}b{% endif %}", False),
    ("an elif branch", LOOP + "{%- if add_generation_prompt %}a{% elif tools %}b{% endif %}", False),
    ("a nested if's else is the block's own", LOOP + "{%- if add_generation_prompt %}a{% if tools %}b{% else %}c{% endif %}{% endif %}", True),
    ("a tag after the block", LOOP + LAST + "{{ eos_token }}", False),
    ("the flag read twice", "{% if add_generation_prompt %}x{% endif %}" + LOOP + LAST, False),
    ("the block inside a loop", "{%- for m in messages -%}{{ m.content }}" + LAST + "{%- endfor -%}", False),
    ("a condition beyond the flag", LOOP + "{%- if add_generation_prompt and tools %}a{% endif %}", False),
    ("it reads what the template set", "{%- set ns = namespace(p='<|x|>') -%}" + LOOP + "{%- if add_generation_prompt %}{{ ns.p }}{% endif %}", False),
    ("it reads a loop variable's name", "{%- for p in messages -%}{{ p.content }}{%- endfor -%}{%- if add_generation_prompt %}{{ p }}{% endif %}", False),
    ("a comment could hide tags", "{# {% if x %} #}" + LOOP + LAST, False),
    ("a string holds a tag delimiter", "{{ '{% endif %}' }}" + LOOP + LAST, False),
    ("a raw block", "{% raw %}{% if %}{% endraw %}" + LOOP + LAST, False),
    ("no generation block", LOOP, False),
]  # fmt: skip


@pytest.mark.parametrize(("source", "proven"), [pytest.param(s, p, id=c) for c, s, p in SOURCES])
def test_the_generation_block_is_found_only_where_it_is_provably_last(
    tokenizer: Any, source: str, proven: bool
) -> None:
    compiled = compile_template(_with_template(tokenizer, source), verify_every=0)
    found = generation_block(source) is not None and isinstance(compiled, CompiledTemplate)
    assert (isinstance(compiled, CompiledTemplate) and compiled.generation) == proven
    if proven:
        assert found
