"""Forward compatibility: the request fields the frontend accepts without acting on them.

The rule (docs/frontend.md, "Forward compatibility"): **keys are open, types are closed**. A key
this server does not know, on the request, a message, a content block, an input item or a tool, is
accepted and ignored: clients add such keys with every release, and a key that only annotates what
it sits on does not change what the model must compute. A ``type`` this server does not know (a
content block, an input item, a tool, a tool choice) is a 400 naming it: it carries content or a
capability the model would silently lose. Known fields that would change the answer and are not
implemented are refused by name (each provider's ``REFUSED`` table). The prompt-cache controls are
the contract and stay strict (``kvretention.hints``).

Each ignored field is recorded once per request by its path with indexes as ``*``
(``messages.*.output_config``, ``input[*].namespace``): the parsers call :func:`ignore` while a
:func:`collecting` block is open, and the request's ``ParsedRequest.ignored`` carries the list to
the metrics (``kvretention_frontend_ignored_fields_total{field}``) and the trace.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Final

_CURRENT: Final[ContextVar[dict[str, None] | None]] = ContextVar("kvr_ignored", default=None)
_INDEX: Final = re.compile(r"\.\d+(?=\.|$)|\[\d+\]")


def field_label(path: str) -> str:
    """A field's path with its indexes replaced by ``*`` (one label per field, not per position)."""
    return _INDEX.sub(lambda m: "[*]" if m.group().startswith("[") else ".*", path)


@contextmanager
def collecting() -> Iterator[dict[str, None]]:
    """Collect the fields :func:`ignore` records inside the block (in the order first seen)."""
    fields: dict[str, None] = {}
    token = _CURRENT.set(fields)
    try:
        yield fields
    finally:
        _CURRENT.reset(token)


def ignore(path: str) -> None:
    """Record that the field at ``path`` was accepted and not acted on (no-op outside a block)."""
    fields = _CURRENT.get()
    if fields is not None:
        fields.setdefault(field_label(path), None)


def record(labels: Iterable[str]) -> None:
    """Record fields already reduced to labels (what an inner :func:`collecting` block saw), in
    order, as if :func:`ignore` had met them here."""
    fields = _CURRENT.get()
    if fields is not None:
        for label in labels:
            fields.setdefault(label, None)


def ignore_unknown(
    obj: dict[str, object] | object, *, known: Callable[[str], bool], where: str, sep: str = "."
) -> None:
    """Record each key of ``obj`` that ``known`` does not accept; ``null`` values carry nothing."""
    if not isinstance(obj, dict):
        return
    for key, value in obj.items():
        if value is not None and not known(key):
            ignore(f"{where}{sep}{key}" if where else key)


def ignore_set(obj: Mapping[str, object], keys: Collection[str], *, where: str = "") -> None:
    """Record the documented no-ops among ``keys`` that ``obj`` sets (not ``null``), in the
    object's order."""
    if obj.keys().isdisjoint(keys):
        return  # none set: the common case
    for key, value in obj.items():
        if key in keys and value is not None:
            ignore(f"{where}.{key}" if where else key)


MAX_LABELS: Final = 64
"""Distinct ``field`` label values one frontend exports; later new ones count as ``other`` (the
names come from clients, so the series count must stay bounded)."""
_LABEL: Final = re.compile(r"^[A-Za-z0-9_.*:\[\]-]{1,128}$")


class LabelBudget:
    """Maps recorded fields to metric label values, at most :data:`MAX_LABELS` distinct ones."""

    def __init__(self, limit: int = MAX_LABELS) -> None:
        self._limit = limit
        self._seen: set[str] = set()

    def label(self, field: str) -> str:
        if field in self._seen:
            return field
        if not _LABEL.match(field) or len(self._seen) >= self._limit:
            return "other"
        self._seen.add(field)
        return field
