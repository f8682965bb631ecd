"""Which ``kv_hints`` dialect an engine speaks, and the hint in that dialect.

SGLang's surface moves: older releases have no ``kv_hints`` parameter (``none``), the design this
project follows passes the flat envelope (``flat``), and 0.5.23 validates a versioned actions
envelope with ``sglang.srt.managers.kv_hints.decode_kv_hints_envelope`` (``versioned``). Everything
here is pure so the worker and ``kvretention probe`` decide the same way.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from enum import StrEnum
from typing import Any, Final

from kvretention.hints.envelope import WIRE_KEY, KvHintEnvelope

VERSIONED_MODULE: Final = "sglang.srt.managers.kv_hints"
VERSIONED_DECODER: Final = "decode_kv_hints_envelope"

# The versioned envelope's constants. SGLang 0.5.23 only requires these to be strings and ignores
# action types it does not implement; the values are this project's v1 of the retention action.
PROTOCOL_VERSION: Final = "1"
ACTION_TYPE: Final = "retain_full_prompt"
ACTION_VERSION: Final = "1"


class Dialect(StrEnum):
    """How an engine takes ``kv_hints``."""

    NONE = "none"
    FLAT = "flat"
    VERSIONED = "versioned"


def detect_dialect(parameters: Iterable[str], *, has_versioned_decoder: bool) -> Dialect:
    """``none`` without a ``kv_hints`` parameter; ``versioned`` when SGLang ships the decoder."""
    if WIRE_KEY not in set(parameters):
        return Dialect.NONE
    return Dialect.VERSIONED if has_versioned_decoder else Dialect.FLAT


def parameter_names(fn: Callable[..., Any]) -> list[str]:
    """Parameter names of a (bound or unbound) callable, without ``self``."""
    return [name for name in inspect.signature(fn).parameters if name != "self"]


def build_kv_hints(
    envelope: KvHintEnvelope, dialect: Dialect, *, request_id: str
) -> dict[str, Any] | None:
    """The ``kv_hints`` argument for ``Engine.async_generate``; ``None`` when nothing can be passed.

    ``None`` for an empty envelope or the ``none`` dialect: the caller must have rejected a hinted
    request on such an engine already, so ``None`` here never means a silently dropped hint.
    """
    hint = envelope.retain_full_prompt
    if hint is None or dialect is Dialect.NONE:
        return None
    if dialect is Dialect.FLAT:
        return envelope.to_wire()
    return {
        "protocol_version": PROTOCOL_VERSION,
        "message_id": request_id,
        "actions": [
            {
                "action_id": f"{request_id}/{ACTION_TYPE}",
                "action_type": ACTION_TYPE,
                "action_version": ACTION_VERSION,
                "payload": {"ttl_seconds": hint.ttl_seconds},
            }
        ],
    }
