"""Parse only what is new: a conversation's next body resumes where its last one's parse stopped.

Agents resend the whole conversation on every turn, and the previous turn's messages come back
byte for byte. A provider parser folds a body's message list (``messages``, ``input``) item by
item into a state (the neutral messages so far, the tool-call ids seen...). :class:`Resumer` keeps,
for the bodies it parsed last, each item's JSON encoding and a few checkpoints: the loop's state
after the first ``n`` items and the fields it recorded as ignored (``compat``) on the way. A new
body whose first ``n`` items encode to the same bytes, read in the same context (the tools, the
parser's mode), resumes from the checkpoint and parses only the rest. Bytes, not dict equality:
``1 == 1.0 == True`` and key order would hide differences a full parse sees.

A checkpoint also records the breakpoints (paths and TTLs, the normalizer's, from the whole body)
on the items it covers, and serves only a body with the same ones there. The parse is a
deterministic function of the context, the items and their marks, so the resumed result equals a
full parse (``tests/unit/dataplane/test_frontend_resume.py`` checks it on every recorded client shape and
on the agent sessions' consecutive turns). Entries are found by the first item's bytes and bounded
(LRU), so a session's next turn finds its last one without knowing its session key.

The same memory decodes a large body item by item (:meth:`Resumer.decode`): msgspec reads the
message list as each item's raw bytes (a fifth of a full decode), and an item whose bytes equal the
same item of the conversation's last body is that body's decoded value, not decoded again; nor
encoded again for the comparison above (:meth:`Resumer.encode_items`). The same bytes decode to
the same value, and nothing downstream changes a decoded body, so the body equals a full decode.
Conversations that open alike (the same task sent again, sub-agents started from one prompt) keep
one decoded list each, as the checkpoints do, however many open alike: a body takes the list it
repeats most of, and replaces it only when it is that conversation's next turn.

Every entry is the tenant's (:meth:`Resumer.scoped`): a body is only ever compared with the same
tenant's bodies. A memory shared between tenants would answer a tenant that sends another's recent
conversation faster, and so confirm a guess of it. The objects a parse makes (messages, tools)
are then never another tenant's either, so the memos keyed by them (``repeats.py``, the messages'
``memo_of``) are per tenant too.
"""

from __future__ import annotations

import operator
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, Protocol, TypeVar, Union

import msgspec

from kvretention.dataplane.frontend import compat
from kvretention.dataplane.frontend.affinity import BILLING_HEADER
from kvretention.dataplane.frontend.repeats import CAPACITY as WALKS_CAPACITY
from kvretention.dataplane.frontend.repeats import common_prefix

_S = TypeVar("_S")

CAPACITY: Final = WALKS_CAPACITY
"""Conversations remembered, least recently used out first (``--remembered-conversations``)."""
BACK: Final = 2
"""Checkpoints before the last item, for a client that rewrote its newest items (Claude Code
moves its newest breakpoint, so the last item comes back changed)."""
HEAD_BYTES: Final = 4096
"""How much of a raw body :meth:`Resumer.resumes` compares."""
_BILLING: Final = BILLING_HEADER.encode()
_ENCODE: Final = msgspec.json.Encoder().encode
_DECODE: Final = msgspec.json.Decoder().decode
_DECODE_TOP: Final = msgspec.json.Decoder(
    dict[str, Union[list[msgspec.Raw], dict[str, Any], str, int, float, bool, None]]  # noqa: UP007
).decode
"""A JSON object whose arrays stay raw, one ``Raw`` per element (every JSON value is one of
these types, each decoded as an untyped decode would)."""
CONTROL_KEY: Final = b'"cache_control"'
"""The key :meth:`Resumer.control_items` looks for (msgspec writes a key as itself)."""
ITEM_KEYS: Final = frozenset({"messages", "input"})
"""The body fields whose items :meth:`Resumer.decode` takes from the last body."""
SHARED_KEYS: Final = frozenset({"tools"})
"""The body fields :meth:`Resumer.decode` takes whole from an earlier body with the same bytes
(an agent resends the same tools on every turn), with what was derived from them
(:meth:`Resumer.derived`)."""


@dataclass(frozen=True)
class _Checkpoint(Generic[_S]):
    items: int
    state: _S
    ignored: tuple[str, ...]
    marks: tuple[tuple[str, int], ...]
    """The breakpoints on the items it covers."""


@dataclass(frozen=True)
class _Items:
    """A body's item list: each item's raw bytes, its decoded value, its encoding once made."""

    raws: list[msgspec.Raw]
    values: list[Any]
    blobs: list[bytes | None]
    names: dict[bytes, list[bool | None]]
    """Per key looked for (:meth:`Resumer.names`): whether each item's encoding names it."""


@dataclass(frozen=True)
class _Shared:
    """A top-level list (:data:`SHARED_KEYS`) decoded once for every body that holds its bytes."""

    values: list[Any]
    derived: dict[str, Any]
    """What :meth:`Resumer.derived` made from ``values``, by tag."""


class _Listed(Protocol):
    @property
    def values(self) -> list[Any]: ...


_K = TypeVar("_K", bound=Hashable)
_L = TypeVar("_L", bound=_Listed)


def _remember(
    table: OrderedDict[_K, _L], by_list: dict[int, _L], key: _K, entry: _L, *, capacity: int
) -> None:
    """Keep ``entry`` as the newest under ``key`` and under its decoded list's identity, dropping
    the least recently kept past ``capacity`` from both (the caller holds the lock)."""
    old = table.pop(key, None)
    if old is not None:
        by_list.pop(id(old.values), None)
    table[key] = entry
    by_list[id(entry.values)] = entry
    while len(table) > capacity:
        _, dropped = table.popitem(last=False)
        by_list.pop(id(dropped.values), None)


@dataclass
class _Counts:
    """What every view of one memory (:meth:`Resumer.scoped`) counts together."""

    entries: int = 0
    item_lists: int = 0
    resumed_items: int = 0
    parsed_items: int = 0
    reused_items: int = 0


@dataclass(frozen=True)
class _Entry:
    context: bytes
    encoded: list[bytes]
    checkpoints: tuple[_Checkpoint[Any], ...]
    """Longest first."""


class Resumer:
    """A bounded memory of recent conversations' item-by-item parse (see the module docstring).

    One memory serves every tenant: :meth:`scoped` gives the view a tenant's requests use, whose
    entries no other tenant's view finds (the bound is shared, the entries are not)."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self._capacity = capacity
        self._tenant: str | None = None
        self._entries: OrderedDict[Hashable, list[_Entry]] = OrderedDict()
        self._counts = _Counts()
        self._heads: OrderedDict[tuple[str | None, bytes], None] = OrderedDict()
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple[str | None, str, bytes], list[_Items]] = OrderedDict()
        """The last bodies' items per list and first item's bytes, newest first: one list per
        conversation, however many open alike (the same task sent again, sub-agents),
        ``capacity`` lists in all (least recently used out first)."""
        self._by_list: dict[int, _Items] = {}
        """The same, by the identity of the decoded list a body holds (for :meth:`encode_items`)."""
        self._shared: OrderedDict[tuple[str | None, str, bytes], _Shared] = OrderedDict()
        """Top-level lists by tenant, field and exact bytes (LRU, ``capacity``)."""
        self._shared_by_list: dict[int, _Shared] = {}
        """The same, by the identity of the decoded list (for :meth:`derived`)."""
        self._fresh: int | None = None
        """Bytes of items and shared lists the last :meth:`decode` of this view did not find
        (``None``: it decoded nothing item by item)."""

    def scoped(self, tenant: str | None) -> Resumer:
        """This memory as ``tenant``'s requests use it: they find only entries made through a
        view of the same tenant (``None``: auth off, one tenant)."""
        view = object.__new__(Resumer)  # the same tables, lock and counts (copy.copy, 5x faster)
        view.__dict__.update(self.__dict__)
        view._tenant = tenant
        view._fresh = None
        return view

    def fresh_bytes(self, default: int) -> int:
        """How many bytes of its item lists (and shared lists) the last body this view decoded
        had that no earlier body held: what its parse will mostly have to read. ``default`` when
        it was not decoded item by item (a small body, or one msgspec refused)."""
        return default if self._fresh is None else self._fresh

    @property
    def tenant(self) -> str | None:
        return self._tenant

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def resumed_items(self) -> int:
        """Items taken from checkpoints so far, by every view (for tests and benchmarks)."""
        return self._counts.resumed_items

    @property
    def parsed_items(self) -> int:
        """Items parsed (not taken from a checkpoint) so far, by every view: beside
        :attr:`resumed_items`, how well the memory serves the conversations it sees."""
        return self._counts.parsed_items

    @property
    def reused_items(self) -> int:
        """Items taken already decoded from an earlier body so far, by every view (for tests
        and benchmarks)."""
        return self._counts.reused_items

    def decode(self, text: str) -> dict[str, Any] | None:
        """The JSON object ``text`` as an untyped msgspec decode gives it, its item lists
        (:data:`ITEM_KEYS`) decoded only past what the conversation's last body (this tenant's)
        repeats byte for byte (the rest is that body's values, shared: read-only), and a list of
        :data:`SHARED_KEYS` whose bytes an earlier body of this tenant held exactly taken whole
        from that body (shared, read-only). ``None`` when msgspec refuses the text or it is not
        an object: the caller decodes it whole and answers its own error."""
        self._fresh = None
        fresh = 0
        try:
            body = _DECODE_TOP(text)
            for key, value in body.items():
                if type(value) is list:
                    if key in ITEM_KEYS and value:
                        body[key], new = self._decoded_items(key, value)
                        fresh += new
                    elif key in SHARED_KEYS and value:
                        body[key], new = self._shared_list(key, value)
                        fresh += new
                    else:
                        body[key] = [_DECODE(item) for item in value]
        except (msgspec.DecodeError, RecursionError):
            return None
        self._fresh = fresh
        return body

    def _decoded_items(self, key: str, raws: list[msgspec.Raw]) -> tuple[list[Any], int]:
        """The list's values, and how many bytes of it were decoded (not taken from a body
        before)."""
        mkey = (self._tenant, key, bytes(raws[0]))
        with self._lock:
            candidates = list(self._items.get(mkey, ()))
        last, same = None, 0
        for candidate in candidates:  # the conversation this body repeats most of
            shared = _common(candidate.raws, raws, upto=len(candidate.raws))
            if shared > same:
                last, same = candidate, shared
        if last is not None:
            values, blobs = last.values[:same], last.blobs[:same]
            names = {key: flags[:same] for key, flags in last.names.items()}
        else:
            values, blobs, names = [], [], {}
        new = len(raws) - same
        values += [_DECODE(raw) for raw in raws[same:]]
        blobs += [None] * new
        for flags in names.values():
            flags += [None] * new
        items = _Items(raws, values, blobs, names)
        # the conversation's next body (all but its last item or two repeated) replaces it;
        # another conversation that opens alike keeps its own
        extended = last if last is not None and same >= len(last.raws) - BACK else None
        with self._lock:
            self._counts.reused_items += same
            self._keep_items(mkey, items, replacing=extended)
        return values, sum(map(len, raws[same:]))

    def _keep_items(
        self, key: tuple[str | None, str, bytes], items: _Items, *, replacing: _Items | None
    ) -> None:
        """``items`` as the newest list under ``key``, in place of ``replacing`` (the same
        conversation's last body); the least recently used lists go past the bound (the caller
        holds the lock)."""
        lists = self._items.pop(key, [])
        kept = [old for old in lists if old is not replacing]
        dropped = [old for old in lists if old is replacing]
        self._items[key] = [items, *kept]
        self._by_list[id(items.values)] = items
        self._counts.item_lists += 1 - len(dropped)
        while self._counts.item_lists > self._capacity:
            oldest = next(iter(self._items))
            dropped.append(self._items[oldest].pop())
            self._counts.item_lists -= 1
            if not self._items[oldest]:
                del self._items[oldest]
        for old in dropped:
            if self._by_list.get(id(old.values)) is old:
                del self._by_list[id(old.values)]

    def _shared_list(self, key: str, raws: list[msgspec.Raw]) -> tuple[list[Any], int]:
        # "[" + the elements' bytes joined by "," + "]" is the list's JSON: one decoded value
        mkey = (self._tenant, key, b",".join(raws))
        with self._lock:
            known = self._shared.get(mkey)
            if known is not None:
                self._shared.move_to_end(mkey)
                return known.values, 0
        values = [_DECODE(raw) for raw in raws]
        shared = _Shared(values, {})
        with self._lock:
            _remember(self._shared, self._shared_by_list, mkey, shared, capacity=self._capacity)
        return values, len(mkey[2])

    def derived(self, values: Any, tag: str, make: Callable[[Any], _S]) -> _S:
        """``make(values)``, made once per list :meth:`decode` shares (:data:`SHARED_KEYS`) and
        ``tag``, and on every call for any other value. ``make`` must be a deterministic function
        of the list's JSON value that changes nothing, and its result is shared: read-only.
        What ``make`` raises is raised every time (nothing is remembered)."""
        shared = self._shared_by_list.get(id(values))
        if shared is None or shared.values is not values:
            return make(values)
        try:
            return shared.derived[tag]  # type: ignore[no-any-return]
        except KeyError:
            made = shared.derived[tag] = make(values)
            return made

    def names(self, items: Sequence[Any], encoded: list[bytes], key: bytes) -> list[bool] | None:
        """Whether each item's encoding (``encoded``, :meth:`encode_items` of ``items``) holds
        ``key``, looked at once per item that :meth:`decode` took from an earlier body; ``None``
        for a body it did not decode. msgspec writes a key as itself, so an item whose encoding
        lacks ``b'"name"'`` has no key ``name`` at any depth."""
        known = self._by_list.get(id(items))
        if known is None or known.values is not items or len(encoded) != len(items):
            return None
        flags = known.names.get(key)
        if flags is None:
            flags = known.names.setdefault(key, [None] * len(items))
        if None in flags:
            # a conversation's repeated items kept theirs: look from the first one not yet known
            for i in range(flags.index(None), len(flags)):
                if flags[i] is None:
                    flags[i] = key in encoded[i]
        return flags  # type: ignore[return-value]  # every flag set above

    def named_encodings(
        self, items: Sequence[Any], encoded: list[bytes], key: bytes
    ) -> list[bytes] | None:
        """For a hint walk that skips an item whose encoding lacks ``key``
        (``hints_from_*(encoded=...)``): each item's encoding where it names the key, ``b""``
        where it does not (the same skips), from :meth:`names`; ``None`` for a body
        :meth:`decode` did not decode."""
        flags = self.names(items, encoded, key)
        if flags is None:
            return None
        return list(map(operator.mul, encoded, flags))  # blob * True is blob, * False is b""

    def control_items(self, items: Sequence[Any], encoded: list[bytes]) -> list[bytes]:
        """:meth:`named_encodings` for ``"cache_control"`` (the Anthropic hint walk), or
        ``encoded`` as it is for a body :meth:`decode` did not decode (scanning every message
        still costs that walk less than walking it)."""
        named = self.named_encodings(items, encoded, CONTROL_KEY)
        return encoded if named is None else named

    def encode_items(self, items: Sequence[Any]) -> list[bytes] | None:
        """:func:`encode_items`, with the encodings of items :meth:`decode` took from an earlier
        body taken from there too."""
        known = self._by_list.get(id(items))
        if known is None or known.values is not items:
            return encode_items(items)
        blobs = known.blobs
        if None in blobs:
            # a conversation's repeated items kept theirs: encode from the first one not yet made
            for i in range(blobs.index(None), len(blobs)):
                if blobs[i] is None:
                    blob = _encoded(items[i])
                    if blob is None:
                        return None
                    blobs[i] = blob
        return list(blobs)  # type: ignore[arg-type]  # every item's encoding made

    def resumes(self, raw: bytes) -> bool:
        """Whether a body that starts like ``raw`` (its first :data:`HEAD_BYTES`) was parsed
        lately by this tenant: its parse will likely resume, cheaply enough for the event loop. A
        guess for scheduling only; :meth:`fold` decides what is reused."""
        with self._lock:
            return (self._tenant, head_of(raw)) in self._heads

    def parsed(self, raw: bytes) -> None:
        """Note that a body starting like ``raw`` was parsed (see :meth:`resumes`)."""
        head = (self._tenant, head_of(raw))
        with self._lock:
            self._heads[head] = None
            self._heads.move_to_end(head)
            while len(self._heads) > 2 * self._capacity:
                self._heads.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._heads.clear()
            self._items.clear()
            self._by_list.clear()
            self._shared.clear()
            self._shared_by_list.clear()
            self._counts.entries = 0
            self._counts.item_lists = 0

    def fold(
        self,
        items: Sequence[Any],
        *,
        scope: Hashable,
        context: bytes | None,
        marks: Mapping[str, int],
        prefix: str,
        start: Callable[[], _S],
        step: Callable[[_S, int, Any], None],
        copy: Callable[[_S], _S],
        encoded: Sequence[bytes] | None = None,
    ) -> _S:
        """``step(state, i, items[i])`` for every item from ``start()``, or from the latest
        checkpoint whose items (and breakpoints: ``marks`` keyed by path, the item's index
        after ``prefix``) this body repeats. ``copy`` must copy a state deeply enough that later
        steps do not change the copy. ``encoded`` is :func:`encode_items` of ``items`` when the
        caller has it already. Raises what ``step`` raises (and then remembers nothing)."""
        if encoded is None or len(encoded) != len(items):
            encoded = self.encode_items(items) if context is not None else None
        if context is None or not encoded:
            with self._lock:
                self._counts.parsed_items += len(items)
            return _run(items, start(), step)
        blobs = list(encoded)
        key = (self._tenant, scope, blobs[0])
        marked = _marked(marks, prefix)
        found, kept = self._find(key, context=context, encoded=blobs, marked=marked)
        n = len(blobs)
        wanted = {b for b in range(n - BACK, n + 1) if b >= 1}
        checkpoints: list[_Checkpoint[_S]] = []
        with compat.collecting() as ignored:
            if found is not None:
                state = copy(found.state)
                for label in found.ignored:
                    ignored.setdefault(label, None)
                first = found.items
                with self._lock:
                    self._counts.resumed_items += first
                checkpoints = [c for c in kept if c.items in wanted]
            else:
                state, first = start(), 0
            for i in range(first, len(items)):
                step(state, i, items[i])
                if i + 1 in wanted:
                    before = _before(marked, i + 1)
                    checkpoints.append(_Checkpoint(i + 1, copy(state), tuple(ignored), before))
        compat.record(ignored)
        with self._lock:
            self._counts.parsed_items += len(items) - first
        if checkpoints and context is not None:
            checkpoints.sort(key=lambda c: c.items, reverse=True)
            self._keep(key, _Entry(context, blobs, tuple(checkpoints)))
        return state

    def _find(
        self,
        key: Hashable,
        *,
        context: bytes | None,
        encoded: list[bytes],
        marked: list[tuple[int, str, int]],
    ) -> tuple[_Checkpoint[Any] | None, list[_Checkpoint[Any]]]:
        """The longest checkpoint this body repeats, and its entry's checkpoints up to it (still
        valid for the new body)."""
        with self._lock:
            entries = self._entries.get(key)
            if entries is None:
                return None, []
            self._entries.move_to_end(key)
            candidates = list(entries)
        best: _Checkpoint[Any] | None = None
        kept: list[_Checkpoint[Any]] = []
        for entry in candidates:
            if entry.context != context:
                continue
            same = _common(entry.encoded, encoded, upto=entry.checkpoints[0].items)
            for j, checkpoint in enumerate(entry.checkpoints):
                if checkpoint.items <= same and checkpoint.marks == _before(
                    marked, checkpoint.items
                ):
                    if best is None or checkpoint.items > best.items:
                        best, kept = checkpoint, list(entry.checkpoints[j:])
                    break
        return best, kept

    def _keep(self, key: Hashable, entry: _Entry) -> None:
        with self._lock:
            entries = self._entries.pop(key, [])
            # the new entry replaces any it extends (same context, a prefix of its items)
            kept = [e for e in entries if not _extends(entry, e)]
            self._counts.entries += len(kept) + 1 - len(entries)
            self._entries[key] = [entry, *kept]
            while self._counts.entries > self._capacity:  # the oldest of the least recent key
                oldest = next(iter(self._entries))
                self._entries[oldest].pop()
                self._counts.entries -= 1
                if not self._entries[oldest]:
                    del self._entries[oldest]

    def __len__(self) -> int:
        """Conversations remembered, every tenant's."""
        return self._counts.entries


def head_of(raw: bytes) -> bytes:
    """A body's first :data:`HEAD_BYTES`, less the value of Claude Code's billing header: it
    changes on every request (``cc_version=...; cch=...;``), and would make every turn of a
    Claude Code conversation look like a new one (parsed off the event loop, at the cost of a
    thread hand-off per turn)."""
    head = raw[:HEAD_BYTES]
    at = head.find(_BILLING)
    if at < 0:
        return head
    end = head.find(b'"', at)  # the JSON string's end (an escaped quote only ends it sooner)
    return head[:at] + head[end:] if end >= 0 else head[:at]


def context_bytes(*parts: object) -> bytes | None:
    """What a parse's items are read against (the tools...), as bytes to compare; ``None`` when
    it cannot be encoded (then nothing is resumed)."""
    return _encoded(parts)


def encode_items(items: Sequence[Any]) -> list[bytes] | None:
    """Each item's compact JSON (msgspec: a key is written as itself, only ``"``, ``\\`` and
    control characters escaped), or ``None`` when one cannot be encoded (an integer past 64
    bits: such a body is parsed whole). The Anthropic hint normalizer takes these too, to skip
    the messages whose bytes never name ``cache_control`` (its recursive walk costs more than the
    scan; the OpenAI ones look one level deep, cheaper than scanning the bytes)."""
    out = []
    for item in items:
        blob = _encoded(item)
        if blob is None:
            return None
        out.append(blob)
    return out


def _marked(marks: Mapping[str, int], prefix: str) -> list[tuple[int, str, int]]:
    """``(item index, path, ttl)`` of each breakpoint on an item (``prefix`` is ``"messages."``,
    ``"messages["`` or ``"input["``), in order."""
    out = []
    start = len(prefix)
    for path, ttl in marks.items():
        if path.startswith(prefix):
            end = start
            while end < len(path) and path[end].isdigit():
                end += 1
            if end > start:
                out.append((int(path[start:end]), path, ttl))
    out.sort()
    return out


def _before(marked: list[tuple[int, str, int]], items: int) -> tuple[tuple[str, int], ...]:
    return tuple((path, ttl) for index, path, ttl in marked if index < items)


def _encoded(item: Any) -> bytes | None:
    try:
        return _ENCODE(item)
    except (OverflowError, TypeError, msgspec.EncodeError):
        return None  # an integer past 64 bits: parse this body whole


def _run(items: Sequence[Any], state: _S, step: Callable[[_S, int, Any], None]) -> _S:
    for i, item in enumerate(items):
        step(state, i, item)
    return state


def _common(a: Sequence[object], b: Sequence[object], *, upto: int) -> int:
    """How many leading items ``a`` and ``b`` share, up to ``upto``."""
    return common_prefix(a, b, upto)


def _extends(new: _Entry, old: _Entry) -> bool:
    """Whether ``new`` is a later turn of ``old``'s conversation: the same context, and every
    item of ``old`` but its last repeated (the last one a client may rewrite: Claude Code moves
    its newest breakpoint). Such an ``old`` is dropped; kept, every Claude Code conversation
    would hold an entry per turn, and :data:`CAPACITY` growing conversations round-robin would
    push each other out before their next turn."""
    n = len(old.encoded)
    if new.context != old.context or len(new.encoded) < n:
        return False
    keep = n - 1 if n >= 2 else n
    if keep and new.encoded[keep - 1] != old.encoded[keep - 1]:  # one comparison rules most out
        return False
    return common_prefix(new.encoded, old.encoded, keep) == keep
