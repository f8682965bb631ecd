"""The ``kv.retain`` 1.0 wire format's names and limits: one home for what the frontend's planner
(:mod:`kvretention.dataplane.breakpoints`), the hint envelope (:mod:`kvretention.hints.envelope`)
and the retention plugin's lenient reader (:mod:`kvretention.retention.directives`) share.

An envelope (protocol ``PROTOCOL_VERSION``) carries actions; a ``kv.retain`` action's payload is a
``scope`` and ``directives``, each keeping tokens ``[start, end)`` (or the output) at a
``priority`` for a ``duration`` in seconds.
"""

from __future__ import annotations

from typing import Final

PROTOCOL_VERSION: Final = "0.1"
"""The KV-hint envelope's version."""
ACTION_TYPE: Final = "kv.retain"
ACTION_VERSION: Final = "1.0"
MAX_ACTIONS: Final = 16
"""kv.retain 1.0: at most 16 ``kv.retain`` actions per envelope (later ones are skipped)."""
MAX_DIRECTIVES: Final = 128
"""kv.retain 1.0: at most 128 directives per envelope (an action past the cap is skipped)."""
MAX_PRIORITY: Final = 100
"""kv.retain 1.0: priorities run 0..100 (0 releases)."""
MAX_DURATION_SECONDS: Final = 2_592_000
"""kv.retain 1.0: a duration is at most 30 days (seconds)."""
