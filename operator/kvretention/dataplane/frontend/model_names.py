"""Which model names a frontend serves: its served names, exact aliases, and alias patterns.

An alias with ``*`` in it is a pattern: ``*`` stands for any run of characters (none included),
every other character is literal (``[1m]`` and ``.`` too), and the whole name must match, case
sensitive. Patterns let a fleet take every name a client sends by default (``claude-*`` for Claude
Code's ``claude-opus-5-5`` or whatever its next release picks, ``gpt-*`` for Codex's catalog)
without listing each. A served name always wins, then an exact alias, then the first pattern that
matches, in the order given.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from typing import Final

WILDCARD: Final = "*"


def is_pattern(alias: str) -> bool:
    return WILDCARD in alias


@functools.lru_cache(maxsize=256)
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in pattern.split(WILDCARD)), re.DOTALL)


def matches(pattern: str, name: str) -> bool:
    """Whether ``name`` is one of the names ``pattern`` (or an exact alias) stands for."""
    return _regex(pattern).fullmatch(name) is not None


def resolve(model: str, *, served: Iterable[str], aliases: Mapping[str, str]) -> str | None:
    """The served name a request for ``model`` goes to, or None when nothing serves it."""
    if model in served:
        return model
    if (target := aliases.get(model)) is not None:
        return target
    for alias, target in aliases.items():
        if is_pattern(alias) and matches(alias, model):
            return target
    return None


def listed(served: Iterable[str], aliases: Mapping[str, str]) -> tuple[str, ...]:
    """Names a model list shows: served names, then exact aliases (a pattern is not a name)."""
    names = tuple(served)
    return (*names, *(a for a in aliases if not is_pattern(a) and a not in names))
