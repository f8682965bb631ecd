"""What a request needs its worker to implement, so a worker older than its frontend says so.

A ``PreprocessedRequest`` field that changes the answer reaches a worker only if the worker knows
it; a worker that predates a field takes it as absent (the model ignores unknown keys, so older
workers keep serving newer frontends' other requests). The operator rolls workers before the
frontend (:mod:`kvretention.controller.rollout_order`), but a frontend can still be newer than a
worker: the images changed in two edits, or a worker left from before. So the frontend names each
such field a request uses in ``requires``; a worker refuses a request naming a feature it does
not know with ``worker_outdated`` (503) before anything is done, the router and the placing
frontend try the next worker, and only when none knows it does the client get that error.

Adding a field that changes the answer means adding it to :data:`FEATURES` here;
``tests/unit/dataplane/test_request_features.py`` fails on a field no table lists.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from kvretention.dataplane.protocol import PreprocessedRequest

FEATURES: Final[dict[str, Callable[[PreprocessedRequest], bool]]] = {
    "template_kwargs": lambda r: bool(r.template_kwargs),
    "continue_final_message": lambda r: r.continue_final_message,
    "separate_reasoning": lambda r: not r.separate_reasoning,
    "stream_reasoning": lambda r: not r.stream_reasoning,
    "deferred_tools": lambda r: bool(r.deferred_tools),
}
"""Each feature a worker may predate, and whether a request uses it."""
UNDERSTOOD: Final = frozenset(FEATURES)
"""The features this release's workers implement."""


def features_of(request: PreprocessedRequest) -> list[str]:
    """The features ``request`` uses (its ``requires``)."""
    return [name for name, used in FEATURES.items() if used(request)]


def not_understood(request: PreprocessedRequest) -> list[str]:
    """The features ``request`` requires that this worker does not implement."""
    return [name for name in request.requires if name not in UNDERSTOOD]
