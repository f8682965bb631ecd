"""What a request's ``kv.retain`` directives ask the engine to keep, as page-aligned token holds.

Pure and import-light (no SGLang, no torch): the radix plugin, the Mooncake (L3) storage hook and
the tests share it. :func:`read_retain` is the executor's *lenient* read of the versioned envelope
(kv.retain 1.0; the frontends validate strictly, an executor skips invalid actions and keeps the
valid ones), and :func:`holds_for` turns the plan into whole-page token ranges, never widened.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final

from kvretention.common.kv_retain import (
    ACTION_TYPE,
    ACTION_VERSION,
    MAX_ACTIONS,
    MAX_DIRECTIVES,
    MAX_DURATION_SECONDS,
    MAX_PRIORITY,
)

_RANGE_KEYS: Final = frozenset({"start", "end", "priority", "duration"})
_OUTPUT_KEYS: Final = frozenset({"covers_output", "priority", "duration"})
_PAYLOAD_KEYS: Final = frozenset({"scope", "directives"})


@dataclass(frozen=True, slots=True)
class Directive:
    """One valid directive: tokens ``[start, end)`` (``end`` None = to the end, output included),
    or the output tokens when ``covers_output``; ``duration`` None never expires."""

    start: int
    end: int | None
    priority: int
    duration: float | None
    covers_output: bool = False


@dataclass(frozen=True, slots=True)
class RetainPlan:
    """The valid ``kv.retain`` directives of one envelope and the scope they share."""

    scope: str | None
    directives: tuple[Directive, ...]


@dataclass(frozen=True, slots=True)
class Hold:
    """Keep tokens ``[start, end)`` (whole pages) at ``priority`` until ``until`` (by the clock
    of the ``now`` it was made with: the radix tree's monotonic one, L3's wall clock; None = no
    expiry). Priority 0 releases the scope's hold on these tokens."""

    start: int
    end: int
    priority: int
    until: float | None

    @property
    def releases(self) -> bool:
        return self.priority == 0


def _get(obj: object, name: str) -> object:
    """A field of a JSON object or of SGLang's msgspec struct (``Req.kv_hints`` holds the struct)."""
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _bounded_int(value: object, low: int, high: int | None = None) -> int | None:
    """``value`` when it is a JSON integer (not a bool) within ``[low, high]``, else None."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        return None
    return value if high is None or value <= high else None


def _directive(raw: object) -> Directive | None:
    """One directive per the kv.retain 1.0 rules, or None when it breaks any of them."""
    if not isinstance(raw, Mapping):
        return None
    priority = _bounded_int(raw.get("priority"), 0, MAX_PRIORITY)
    duration = _bounded_int(raw.get("duration"), 0, MAX_DURATION_SECONDS)
    if priority is None or (duration is None and raw.get("duration") is not None):
        return None
    if "covers_output" in raw:
        if not (set(raw) <= _OUTPUT_KEYS and raw["covers_output"] is True):
            return None
        return Directive(0, None, priority, duration, covers_output=True)
    if not set(raw) <= _RANGE_KEYS:
        return None
    start = _bounded_int(raw.get("start", 0), 0)
    end = _bounded_int(raw.get("end"), 1 if start is None else start + 1)
    if start is None or (end is None and raw.get("end") is not None):
        return None
    return Directive(start, end, priority, duration)


def _axis_position(d: Directive) -> tuple[int, int]:
    return (1, 0) if d.covers_output else (0, d.start)


def _non_increasing(directives: Iterable[Directive]) -> bool:
    """kv.retain 1.0: along the token axis (output last) priorities never increase."""
    ordered = sorted(directives, key=_axis_position)
    return all(a.priority >= b.priority for a, b in itertools.pairwise(ordered))


def _action_directives(action: object) -> tuple[str | None, tuple[Directive, ...]] | None:
    """``(scope, directives)`` of a valid kv.retain 1.0 action; None for any other action."""
    if _get(action, "action_type") != ACTION_TYPE or _get(action, "action_version") != (
        ACTION_VERSION
    ):
        return None
    payload = _get(action, "payload")
    if not isinstance(payload, Mapping) or not set(payload) <= _PAYLOAD_KEYS:
        return None
    scope = payload.get("scope")
    raw = payload.get("directives")
    if not (scope is None or isinstance(scope, str)) or not isinstance(raw, list):
        return None
    directives = tuple(d for d in map(_directive, raw) if d is not None)
    if len(directives) != len(raw) or not _non_increasing(directives):
        return None
    return scope, directives


def _retain_actions(kv_hints: object) -> Iterator[object]:
    actions = _get(kv_hints, "actions")
    if not isinstance(actions, list | tuple):
        return
    kept = 0
    for action in actions:
        if _get(action, "action_type") == ACTION_TYPE:
            kept += 1
            if kept > MAX_ACTIONS:
                return
            yield action


def read_retain(kv_hints: object) -> RetainPlan | None:
    """The valid ``kv.retain`` directives of ``kv_hints``; None when it holds none.

    ``kv_hints`` is the JSON envelope the worker sends or SGLang's decoded ``KvHintsEnvelope``
    (``Req.kv_hints``). Lenient, as an executor must be: an action that breaks a rule is skipped
    whole (a bad directive, another version, a scope different from the first valid action's, one
    that would pass the 128-directive cap or make priorities increase along the tokens); the valid
    ones are kept. Other action types are ignored.
    """
    if kv_hints is None:
        return None
    scope: str | None = None
    kept: list[Directive] = []
    found = False
    for action in _retain_actions(kv_hints):
        read = _action_directives(action)
        if read is None:
            continue
        action_scope, directives = read
        if found and action_scope != scope:
            continue
        if len(kept) + len(directives) > MAX_DIRECTIVES:
            continue
        if not _non_increasing([*kept, *directives]):
            continue
        scope, found = action_scope, True
        kept.extend(directives)
    return RetainPlan(scope, tuple(kept)) if found else None


def holds_for(
    plan: RetainPlan,
    *,
    seq_len: int,
    page_size: int,
    now: float,
    prompt_len: int | None = None,
) -> tuple[Hold, ...]:
    """The page-aligned token holds ``plan`` asks for on a sequence of ``seq_len`` tokens.

    A range is cut to the sequence, then rounded to whole pages inwards (start up, end down) so a
    hold never covers a token the directive did not name; a range left empty holds nothing.
    ``end`` None runs to ``seq_len``; ``covers_output`` covers ``[prompt_len, seq_len)``
    (``prompt_len`` None = no output known yet). ``until`` is ``now + duration`` (``now``'s
    clock) or None; priority-0 holds are releases and are returned too.
    """
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    holds: list[Hold] = []
    for d in plan.directives:
        if d.covers_output:
            start, end = (seq_len if prompt_len is None else prompt_len), seq_len
        else:
            start, end = d.start, seq_len if d.end is None else min(d.end, seq_len)
        start = -(-start // page_size) * page_size
        end = end // page_size * page_size
        if end <= start:
            continue
        until = None if d.duration is None else now + d.duration
        holds.append(Hold(start, end, d.priority, until))
    return tuple(holds)
