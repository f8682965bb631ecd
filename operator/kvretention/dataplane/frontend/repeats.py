"""Walks over the neutral conversation that a conversation's next request need not repeat.

An agent's next request holds the last one's messages as the same objects (``resume.py``), then a
few new ones. A pass that is a function of each message and what came before it (the prefix
chain's hashers, the breakpoint markers) keeps its last result per conversation, found by the
identity of the conversation's first message after the head, and redoes only the positions past
the longest run of the same message objects as the last walk's. Identity, not equality: ``1 ==
True`` would let a message that encodes differently pass for the last one. The walk keeps its
messages alive, so an ``id`` seen again is the same object.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Generic, TypeVar

from kvretention.dataplane.breakpoints import Marker, find_markers
from kvretention.dataplane.protocol import ChatMessage, ToolDefinition, message_json

_T = TypeVar("_T")

CAPACITY: Final = 64
"""Conversations remembered per walk, least recently used out first: as many as ``resume.py``
remembers, since a conversation it forgot comes back as new message objects anyway. The
frontend's ``--remembered-conversations`` default: each conversation costs about 15 times its
body (~3 MB for a 200 KB agent body, measured with tracemalloc: its items' bytes and decoded
values, the neutral messages, the checkpoints, these walks and the messages' memos), and a
frontend that serves more live conversations than this parses every request whole (~5x the CPU
per request)."""
MIN_ELEMENTS: Final = 16
"""Shorter conversations are walked whole, not remembered."""
HEAD: Final = 8
"""Leading elements :func:`common_prefix` looks at first."""
BACK: Final = 2
"""A walk that repeats all but the last ``BACK`` elements of an earlier one is that
conversation's next turn and takes its place (Claude Code rewrites its newest message)."""


def common_prefix(a: Sequence[Any], b: Sequence[Any], upto: int | None = None) -> int:
    """How many leading elements ``a`` and ``b`` share (``==``), at most ``upto``, never in a
    Python loop over every element. The first :data:`HEAD` first: another conversation that
    opens alike differs there, and costs a few short slices. Then the whole: one comparison when
    they agree, else steps back from the end (where a conversation's next turn differs) and
    bisects."""
    n = min(len(a), len(b)) if upto is None else min(len(a), len(b), upto)
    head = min(n, HEAD)
    if a[:head] != b[:head]:
        good, bad = 0, head
    elif a[:n] == b[:n]:
        return n
    else:
        good, bad, step = head, n, 1
        while bad - step > good:  # a[:bad] differs; step back until a prefix agrees
            k = bad - step
            if a[:k] == b[:k]:
                good = k
                break
            bad, step = k, step * 2
    while bad - good > 1:
        mid = (good + bad) // 2
        if a[:mid] == b[:mid]:
            good = mid
        else:
            bad = mid
    return good


@dataclass(frozen=True)
class Walk(Generic[_T]):
    """A walk's elements (kept alive, so their ids stay theirs), their ids, and its result after
    each: ``after[i]`` once ``elements[: i + 1]`` were walked. ``context`` is what the walk
    started from."""

    context: object
    elements: list[Any]
    ids: list[int]
    after: list[_T]


class Walks(Generic[_T]):
    """The last walk per conversation, bounded (see the module docstring). Conversations that
    open alike (sub-agents started from one task, the same prompt sent again) share their first
    message object, so each keeps its own walk under it and a request takes the walk it repeats
    most of."""

    capacity: ClassVar[int] = CAPACITY
    """The bound of every instance made without one: the frontend sets it from its
    ``--remembered-conversations`` before serving."""

    def __init__(self, capacity: int | None = None) -> None:
        self._capacity = capacity
        self._walks: OrderedDict[int, Walk[_T]] = OrderedDict()
        """By the identity of the walk's ``ids`` list, least recently kept first."""
        self._by_head: dict[int, list[Walk[_T]]] = {}
        self._lock = threading.Lock()

    def repeated(
        self, elements: Sequence[Any], *, context: object
    ) -> tuple[int, list[_T], list[int]]:
        """How many leading ``elements`` the last walk of this conversation (same ``context``,
        compared with ``is``) walked too, its results for them, and the ids of ``elements``
        (for :meth:`keep`; none for a conversation shorter than :data:`MIN_ELEMENTS`)."""
        if len(elements) < MIN_ELEMENTS:
            return 0, [], []  # walked whole: cheaper than remembering (keep() keeps nothing)
        ids = list(map(id, elements))
        with self._lock:
            candidates = list(self._by_head.get(ids[0], ()))
        best: Walk[_T] | None = None
        same = 0
        for walk in candidates:
            if walk.context is context:
                shared = common_prefix(walk.ids, ids)
                if shared > same:
                    best, same = walk, shared
        return same, best.after[:same] if best is not None else [], ids

    def keep(
        self, elements: Sequence[Any], ids: list[int], after: list[_T], *, context: object
    ) -> None:
        """Remember this walk, in place of the walk of this conversation's last request."""
        if not ids:
            return
        walk = Walk(context, list(elements), ids, after)
        limit = self.capacity if self._capacity is None else self._capacity
        with self._lock:
            kept = []
            for old in self._by_head.get(ids[0], ()):
                if old.context is context and _extends(ids, old.ids):
                    del self._walks[id(old.ids)]  # this conversation's last walk
                else:
                    kept.append(old)
            self._by_head[ids[0]] = [walk, *kept]
            self._walks[id(walk.ids)] = walk
            while len(self._walks) > limit:
                _, oldest = self._walks.popitem(last=False)
                left = [w for w in self._by_head[oldest.ids[0]] if w is not oldest]
                if left:
                    self._by_head[oldest.ids[0]] = left
                else:
                    del self._by_head[oldest.ids[0]]

    def __len__(self) -> int:
        return len(self._walks)


def _extends(new: Sequence[Any], old: Sequence[Any]) -> bool:
    """Whether ``new`` repeats all of ``old`` but its last :data:`BACK` elements (the element
    just before those first: one comparison rules out a conversation that only opened alike)."""
    keep = max(len(old) - BACK, 0)
    if keep > len(new) or (keep and new[keep - 1] != old[keep - 1]):
        return False
    return common_prefix(new, old, keep) == keep


def conversation_markers(
    messages: Sequence[ChatMessage], tools: Sequence[ToolDefinition]
) -> list[Marker]:
    """``find_markers(messages, tools)``, walking only the messages past those this
    conversation's last request had too (and the leading system messages, rebuilt per request)."""
    head = 0
    while head < len(messages) and messages[head].role in ("system", "developer"):
        head += 1
    found = find_markers(messages[:head], tools)
    rest = messages[head:]
    same, after, ids = _MARKERS.repeated(rest, context=None)
    # after[i] = (c, walked): walked[:c] are the markers on rest[: i + 1], indexed within rest
    walked = after[-1][1][: after[-1][0]] if after else []
    for i in range(same, len(rest)):
        walked += [
            Marker(m.kind, m.index + i, m.sub, m.ttl_seconds) for m in find_markers([rest[i]], [])
        ]
        after.append((len(walked), walked))
    _MARKERS.keep(rest, ids, after, context=None)
    found += [Marker(m.kind, m.index + head, m.sub, m.ttl_seconds) for m in walked]
    return found


_MARKERS: Final[Walks[tuple[int, list[Marker]]]] = Walks()


def router_messages(messages: Sequence[ChatMessage]) -> list[Any]:
    """``message_json`` of each message (the router body's), taking the messages past the head
    that this conversation's last request had too from its walk."""
    head = 0
    while head < len(messages) and messages[head].role in ("system", "developer"):
        head += 1
    rest = messages[head:]
    same, after, ids = _WIRES.repeated(rest, context=None)
    after += [message_json(m) for m in rest[same:]]
    _WIRES.keep(rest, ids, after, context=None)
    return [*(message_json(m) for m in messages[:head]), *after]


_WIRES: Final[Walks[Any]] = Walks()
