"""Reuse the previous turn's tokens: an agent's next prompt extends its last one.

A coding agent resends its whole conversation every turn, so turn N+1's rendered prompt starts
with turn N's (up to where turn N's generation prompt began). Tokenizing 200 KB of prompt costs
tens of milliseconds; tokenizing only what is new costs a fraction of one. This cache keeps, per
conversation, the last prompt's text, token ids and each token's end offset, and encodes a new
prompt as ``ids[:k] + encode(text[p:])``. That is exact, not approximate:

- ``p`` is where a **cut token** starts: a special added token (``<|im_start|>``, ...) that a
  Hugging Face tokenizer splits out before normalizing and pre-tokenizing, so the text on either
  side of it is tokenized independently. Tokens that strip whitespace around them, match single
  words or overlap another added token are never cut tokens.
- The new prompt's text must equal the cached one up to past that token (one C-speed string
  compare); the cut is the last cut token inside the common prefix. Anything else (an edited
  earlier message, changed tools, a template that renders history differently once a new user
  turn arrives, another conversation) moves the cut earlier or misses, and a miss is a full encode.
- The tokenizer's independence at a cut is checked once on the first prompt it encodes (prefix
  and suffix encoded apart must equal the whole); a tokenizer that fails it never reuses. Every
  ``verify_every``-th reuse is also checked against a full encode; a difference disables reuse
  for good and serves the full encode.

Entries are found by the request's session id, else by the frontend's prefix-hash chain
(``x-kvr-prefix``: one hash per block, each covering every block before it), so sessionless
clients reuse too. Memory is bounded: least recently used conversations go first once the
entries' estimated size passes ``max_bytes`` (text, ids at 36 bytes and ends at 8 per token).
The worker's planning threads share one cache: its tables are locked, the tokenizing is not
(an entry being extended in place is first taken out of the cache, so no other thread reads it).
"""

from __future__ import annotations

import itertools
import logging
import operator
import sys
import threading
from array import array
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from kvretention.dataplane.breakpoints import common_prefix
from kvretention.dataplane.compiled_template import compiled_template_for

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES: Final = 512 * 1024 * 1024
DEFAULT_VERIFY_EVERY: Final = 256
ID_BYTES: Final = 36
"""A list slot (8) and an int object (28) per token id: an upper bound."""
END_BYTES: Final = 8
SLICE_TOKENS: Final = 65_536
"""Token offsets read (and freed) per C call: ~15 ms each, so other threads get the GIL."""


class _Holder:
    def __init__(self) -> None:
        self.ids: list[int] = []


def _one_holder_refcount() -> int:
    holder = _Holder()
    return sys.getrefcount(holder.ids)


_ONLY_THE_ENTRY: Final = _one_holder_refcount()
"""``sys.getrefcount`` of a list that one object's attribute alone holds, as this interpreter
counts it (measured, not assumed: how the call's own argument is counted differs between
versions)."""


@dataclass(frozen=True)
class Encoded:
    """A prompt's tokens, each token's end offset in the text, and how many were reused."""

    ids: list[int]
    ends: Sequence[int]
    ordered: bool
    """Whether ``ends`` never decrease (bisectable)."""
    reused: int = 0


@dataclass(frozen=True)
class _Reuse:
    """What :meth:`RenderCache.encode` takes from an entry (under the lock) to reuse it."""

    entry: _Entry
    ids: list[int]
    """The entry's ids, held (so no other thread extends them in place meanwhile)."""
    j: int
    """The cut reused: the new text is tokenized from ``entry.cuts[j]`` on."""
    in_place: bool
    """Whether ``ids`` may be cut and extended in place (the entry is out of the cache and
    nothing else holds its ids: the prompt it served is done)."""
    extended: bool
    """Whether the new prompt carries all of the entry up to its last cut."""
    verify: bool
    """Whether to check the reuse against a full encode (every ``verify_every``-th)."""


@dataclass
class _Entry:
    text: str
    ids: list[int]
    ends: array[int]
    ordered: bool
    cuts: list[int]
    """Character offsets where a cut token starts, ascending."""
    cut_tokens: list[int]
    """The token index of each cut."""
    cut_ends: list[int]
    """Where each cut token ends in the text."""
    keys: tuple[str, ...] = ()
    memo: Any = None
    """What the turn decoded (a :class:`~kvretention.dataplane.worker.wire.ConversationMemo`),
    lent to the conversation's next turn."""
    memo_bytes: int = 0
    size: int = 0
    """:attr:`nbytes` when stored (what the cache counts for it until it is dropped)."""

    @property
    def nbytes(self) -> int:
        return sys.getsizeof(self.text) + len(self.ids) * (ID_BYTES + END_BYTES) + self.memo_bytes


def cut_tokens(tokenizer: Any) -> dict[int, str]:
    """Token id -> text of the added tokens a prompt may be cut before (see the module docstring);
    empty for a tokenizer without a Hugging Face fast backend."""
    backend = getattr(tokenizer, "_tokenizer", None)
    decoder = getattr(backend, "get_added_tokens_decoder", None)
    if decoder is None:
        return {}
    added = {int(i): t for i, t in decoder().items()}
    texts = [str(t.content) for t in added.values()]
    safe: dict[int, str] = {}
    for token_id, token in added.items():
        content = str(token.content)
        if not content or not token.special or token.normalized:
            continue
        if token.lstrip or token.rstrip or token.single_word:
            continue
        if any(_overlaps(other, content) for other in texts if other != content):
            continue
        safe[token_id] = content
    return safe


def _overlaps(other: str, content: str) -> bool:
    """Whether ``other`` could match across the start of ``content`` (it contains it, or one of
    its proper suffixes begins ``content`` / is begun by it)."""
    if content in other:
        return True
    return any(
        content.startswith(other[i:]) or other[i:].startswith(content) for i in range(1, len(other))
    )


class RenderCache:
    """Per-conversation previous prompts, reused as described in the module docstring."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        verify_every: int = DEFAULT_VERIFY_EVERY,
    ) -> None:
        self._tokenizer = tokenizer
        # At load, not on the first request: check the chat template under minijinja once
        compiled_template_for(tokenizer)
        self._cut = cut_tokens(tokenizer)
        self._max_bytes = max_bytes
        self._verify_every = verify_every
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._index: dict[str, int] = {}
        self._ids = itertools.count()
        self._bytes = 0
        self._reuses = 0
        self._lock = threading.Lock()
        self._checking = False
        """A first prompt's split check is under way (no reuse until it is done)."""
        self.checked = False
        self.enabled = bool(self._cut) and max_bytes > 0
        self.hits = 0
        self.misses = 0
        self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def memo_for(self, *, session: str | None, chain: Sequence[str] = ()) -> Any:
        """The memo the conversation's previous turn left (see :meth:`encode`), or ``None``;
        found as :meth:`encode` finds entries, and changes nothing."""
        if not self.enabled:
            return None
        keys = [f"s:{session}"] if session else []
        keys.extend(k for k in reversed(chain) if k)
        with self._lock:
            for key in keys:
                entry_id = self._index.get(key)
                if entry_id is not None:
                    memo = self._entries[entry_id].memo
                    if memo is not None:
                        return memo
        return None

    def encode(
        self, text: str, *, session: str | None, chain: Sequence[str] = (), memo: Any = None
    ) -> Encoded:
        """``text``'s tokens, reusing the conversation's previous prompt where it is a prefix.
        ``memo`` (with an ``nbytes``) is kept with the prompt for :meth:`memo_for`."""
        keys = tuple(k for k in ((f"s:{session}" if session else None), *chain) if k)
        if not self.enabled or not keys:
            return self._full(text)
        with self._lock:
            reuse = self._find_reuse(keys, text)
        if reuse is None:
            fresh = self._full_entry(text)
            encoded = Encoded(fresh.ids, fresh.ends, fresh.ordered)
            self._check_split(fresh)
        else:
            encoded, fresh = self._reuse(reuse, text)
        with self._lock:
            if reuse is None:
                self.misses += 1
            else:
                self.hits += 1
                self.reused_tokens += encoded.reused
            if self.enabled:
                if memo is not None:
                    fresh.memo, fresh.memo_bytes = memo, int(memo.nbytes)
                self._store(fresh, keys)
        return encoded

    # -------------------------------------------------------------- internals

    def _candidates(self, keys: Sequence[str]) -> Iterator[tuple[int, _Entry]]:
        """The session's entry, then the entry of the longest shared chain hash (two at most:
        a side call under the same session may have taken the session's key)."""
        session = [keys[0]] if keys[0].startswith("s:") else []
        chain = keys[len(session) :]
        seen: set[int] = set()
        for key in itertools.chain(session, reversed(chain)):
            entry_id = self._index.get(key)
            if entry_id is None or entry_id in seen:
                continue
            seen.add(entry_id)
            self._entries.move_to_end(entry_id)
            yield entry_id, self._entries[entry_id]
            if len(seen) == 2:
                return

    def _find_reuse(self, keys: Sequence[str], text: str) -> _Reuse | None:
        """The first candidate entry ``text`` shares a cut with (under the lock); one the new
        prompt carries whole up to its last cut is done and leaves the cache now."""
        if self._checking:
            return None
        for entry_id, entry in self._candidates(keys):
            shared = common_prefix(entry.text, text)
            j = bisect_right(entry.cuts, shared) - 1
            while j >= 0 and entry.cut_ends[j] > shared:
                j -= 1
            if j <= 0:  # nothing before the first cut token is worth a reuse
                continue
            extended = j == len(entry.cuts) - 1
            # Nothing else holds its ids (the prompt it served is done): extend them in place
            # instead of copying ~100k ids and freeing the old list.
            in_place = extended and sys.getrefcount(entry.ids) == _ONLY_THE_ENTRY
            if extended:  # the new prompt carries all of it: the old one is done
                self._drop(entry_id)
            self._reuses += 1
            verify = bool(self._verify_every) and (
                self._reuses % self._verify_every == 1 % self._verify_every
            )
            return _Reuse(entry, entry.ids, j, in_place, extended, verify)
        return None

    def _reuse(self, reuse: _Reuse, text: str) -> tuple[Encoded, _Entry]:
        """The new prompt's encoding from the entry, and the entry to keep for it."""
        entry, j = reuse.entry, reuse.j
        at, k = entry.cuts[j], entry.cut_tokens[j]
        tail = self._full_entry(text[at:])
        if reuse.in_place:
            ids = reuse.ids
            del ids[k:]
            ids.extend(tail.ids)
            entry.ids = []
        else:
            ids = reuse.ids[:k] + tail.ids
        ends = entry.ends[:k]
        ends.extend(e + at for e in tail.ends)
        ordered = (
            entry.ordered and tail.ordered and (k == 0 or not tail.ends or ends[k] >= ends[k - 1])
        )
        fresh = _Entry(
            text=text,
            ids=ids,
            ends=ends,
            ordered=ordered,
            cuts=entry.cuts[:j] + [c + at for c in tail.cuts],
            cut_tokens=entry.cut_tokens[:j] + [t + k for t in tail.cut_tokens],
            cut_ends=entry.cut_ends[:j] + [c + at for c in tail.cut_ends],
        )
        if reuse.verify:
            whole = self._full_entry(text)
            if whole.ids != ids or list(whole.ends) != list(ends):
                with self._lock:
                    self._disable(f"a reused prompt differed from its full encode at a cut at {at}")
                return Encoded(whole.ids, whole.ends, whole.ordered), whole
        return Encoded(ids, ends, ordered, reused=k), fresh

    def _full(self, text: str) -> Encoded:
        entry = self._full_entry(text)
        return Encoded(entry.ids, entry.ends, entry.ordered)

    def _full_entry(self, text: str) -> _Entry:
        encoded = self._tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(encoded["input_ids"])
        offsets = encoded["offset_mapping"]
        del encoded  # ``offsets`` is then the only holder of the offsets, which it frees in slices
        ends, ordered = token_ends(offsets)
        found: list[tuple[int, int, int]] = []
        for token_id, content in self._cut.items():  # C-speed finds, one per cut token kind
            at = text.find(content)
            while at >= 0:
                t = bisect_right(ends, at) if ordered else _index_of(ends, at)
                if t < len(ids) and ids[t] == token_id:
                    found.append((at, t, at + len(content)))
                at = text.find(content, at + len(content))
        found.sort()
        return _Entry(
            text,
            ids,
            ends,
            ordered,
            cuts=[f[0] for f in found],
            cut_tokens=[f[1] for f in found],
            cut_ends=[f[2] for f in found],
        )

    def _check_split(self, entry: _Entry) -> None:
        """Once: encoding apart at a cut must give the whole encoding (see the module docstring)."""
        inner = [j for j in range(len(entry.cuts)) if entry.cuts[j] > 0]
        with self._lock:
            if not inner or self.checked or self._checking:
                return
            self._checking = True
        try:
            j = inner[len(inner) // 2]
            at = entry.cuts[j]
            head = self._full_entry(entry.text[:at])
            tail = self._full_entry(entry.text[at:])
        finally:
            with self._lock:
                self._checking = False
                self.checked = True
        if head.ids + tail.ids != entry.ids:
            with self._lock:
                self._disable(f"encoding apart at a cut token ({at}) differs from the whole")

    def _disable(self, why: str) -> None:
        log.error("prompt token reuse disabled for this tokenizer: %s", why)
        self.enabled = False
        self._entries.clear()
        self._index.clear()
        self._bytes = 0

    def _store(self, entry: _Entry, keys: tuple[str, ...]) -> None:
        entry.keys = keys
        entry_id = next(self._ids)
        self._entries[entry_id] = entry
        entry.size = entry.nbytes
        self._bytes += entry.size
        for key in keys:
            old = self._index.get(key)
            self._index[key] = entry_id
            if old is not None and old != entry_id and old in self._entries:
                self._forget_key(old, key)
        while self._bytes > self._max_bytes and self._entries:
            oldest = next(iter(self._entries))
            self._drop(oldest)

    def _forget_key(self, entry_id: int, key: str) -> None:
        """``key`` now names a newer entry; an entry no key names any more is dropped."""
        entry = self._entries[entry_id]
        entry.keys = tuple(k for k in entry.keys if k != key)
        if not entry.keys:
            self._drop(entry_id)

    def _drop(self, entry_id: int) -> None:
        entry = self._entries.pop(entry_id, None)
        if entry is None:
            return
        self._bytes -= entry.size
        for key in entry.keys:
            if self._index.get(key) == entry_id:
                del self._index[key]


def token_ends(offsets: Sequence[tuple[int, int]]) -> tuple[array[int], bool]:
    """Each token's end, and whether the ends never decrease; a list of offsets is emptied.

    In slices of :data:`SLICE_TOKENS`, each one C call: between them the GIL passes to the event
    loop and the other planning threads (a 3 MB prompt's 3M offsets at once held it ~1 s to read
    and ~0.5 s to free)."""
    ends: array[int] = array("q")
    ordered = True
    for start in range(0, len(offsets), SLICE_TOKENS):
        part = array("q", map(operator.itemgetter(1), offsets[start : start + SLICE_TOKENS]))
        if ordered and part:
            ordered = (not ends or ends[-1] <= part[0]) and all(
                map(operator.le, part, itertools.islice(part, 1, None))
            )
        ends.extend(part)
    if isinstance(offsets, list):
        while offsets:
            del offsets[-SLICE_TOKENS:]
    return ends, ordered


def _index_of(ends: Sequence[int], at: int) -> int:
    """The first token that ends after ``at`` (a linear scan, for offsets out of order)."""
    for t, end in enumerate(ends):
        if end > at:
            return t
    return len(ends)
