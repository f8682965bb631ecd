"""Where a chat template writes its generation prompt, when that is provably its last output.

A breakpoint on the newest message is resolved against the conversation rendered *without* the
generation prompt (:mod:`kvretention.dataplane.breakpoints`), which costs a second render of the
whole conversation. Most templates end with

    {%- if add_generation_prompt %}<|im_start|>assistant\\n...{%- endif %}

and name ``add_generation_prompt`` nowhere else. For such a template the rendering without the
generation prompt is, by the template's own text, the rendering with it less what that last block
wrote: every statement before the block runs the same either way (none can read the flag), and
nothing follows it. :func:`generation_block` finds that block by the text alone and refuses
(``None``) whenever the argument does not hold as stated:

- the flag's name occurs exactly once, as the whole condition of an ``if`` at the top level
  (outside every loop, macro and other block) with no ``elif`` or ``else`` of its own, whose
  ``endif`` ends the template (a single newline may follow, which the environment drops);
- no comment or ``raw`` block could hide tags from this reading;
- the block reads no name the template assigns (``set``, ``for``, ``macro``, ``with``, imports):
  the block alone is then rendered with the request's context and writes exactly what it wrote
  at the end of the whole template (:func:`block_reads_only_context`).

The caller also checks each probe conversation at load (with and without the generation prompt)
and that the prompt ends with the block's output on every use.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

FLAG: Final = "add_generation_prompt"
_TAG: Final = re.compile(r"\{%(-|\+)?\s*(\w+)(.*?)(-|\+)?%\}", re.S)
_OPENERS: Final = frozenset(
    {"if", "for", "macro", "call", "filter", "with", "block", "autoescape", "trans"}
)
_ASSIGNING: Final = frozenset(
    {"set", "for", "macro", "with", "import", "from", "call", "filter", "block"}
)
_GENERATION_IF: Final = re.compile(r"\{%(-|\+)?\s*if\s+" + FLAG + r"\s*(-|\+)?%\}")


def generation_block(source: str) -> str | None:
    """The template's trailing ``{% if add_generation_prompt %}...{% endif %}`` block, exactly
    as written (tags included), or ``None`` where that is not provably its last output."""
    if source.count(FLAG) != 1 or "{#" in source or re.search(r"\{%-?\s*raw\b", source):
        return None
    if _quoted_delimiter(source):  # a string holding a tag delimiter: not read here
        return None
    found = _GENERATION_IF.search(source)
    if found is None or _depth(_TAG.finditer(source, 0, found.start())) != 0:
        return None
    depth, end = 0, None
    for tag in _TAG.finditer(source, found.start()):
        if depth == 1 and tag.group(2) in ("elif", "else"):
            return None  # a branch the template renders without the generation prompt
        depth += _step(tag)
        if depth == 0:
            end = tag.end()
            break
        if depth < 0:
            return None
    if end is None or source[end:] not in ("", "\n"):
        return None
    return source[found.start() : end]


def block_reads_only_context(source: str, reads: Iterable[str]) -> bool:
    """Whether none of the names the block ``reads`` (its undeclared variables) is named in any
    assigning statement of the template (conservative: anywhere in such a tag)."""
    names = [n for n in reads if n != FLAG]
    for tag in _TAG.finditer(source):
        if tag.group(2) not in _ASSIGNING:
            continue
        for name in names:
            if re.search(rf"\b{re.escape(name)}\b", tag.group(3)):
                return False
    return True


def _step(tag: re.Match[str]) -> int:
    keyword, rest = tag.group(2), tag.group(3)
    if keyword in _OPENERS or (keyword == "set" and "=" not in rest):
        return 1
    if keyword.startswith("end"):
        return -1
    return 0


def _depth(tags: Iterable[re.Match[str]]) -> int | None:
    depth = 0
    for tag in tags:
        depth += _step(tag)
        if depth < 0:
            return None
    return depth


def _quoted_delimiter(source: str) -> bool:
    """Whether a string literal inside a tag or an expression holds ``{%`` or ``%}`` (or one is
    left open), which the tag pattern above would misread."""
    at = 0
    while True:
        starts = [i for i in (source.find("{%", at), source.find("{{", at)) if i >= 0]
        if not starts:
            return False
        start = min(starts)
        close = "%}" if source[start + 1] == "%" else "}}"
        j, quote = start + 2, ""
        while j < len(source):
            c = source[j]
            if quote:
                if c == "\\":
                    j += 2
                    continue
                if c == quote:
                    quote = ""
                elif source.startswith(("{%", "%}"), j):
                    return True
            elif c in "'\"":
                quote = c
            elif source.startswith(close, j):
                break
            j += 1
        else:
            return True
        at = j + 2
