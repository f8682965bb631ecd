"""The published ``kv.retain`` 1.0 rules, written down as a checker (not anyone's parser).

Envelope ``{"protocol_version": "0.1", "message_id": str, "actions": [...]}``; a ``kv.retain``
action (version ``1.0``) has payload ``{"scope": str | null, "directives": [...]}``; a directive is
``{"start": int >= 0 (default 0), "end": int > start | null, "priority": 0..100, "duration":
0..2592000 | null}`` or ``{"covers_output": true, "priority", "duration"}``, unknown keys being
errors; priorities never increase along the token axis; at most 16 ``kv.retain`` actions and 128
directives per envelope; every ``kv.retain`` action of an envelope shares one scope.
"""

from __future__ import annotations

import itertools
from typing import Any, Final

MAX_ACTIONS: Final = 16
MAX_DIRECTIVES: Final = 128
MAX_DURATION: Final = 2_592_000
RANGE_KEYS: Final = frozenset({"start", "end", "priority", "duration"})
OUTPUT_KEYS: Final = frozenset({"covers_output", "priority", "duration"})


class RuleViolation(AssertionError):
    pass


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require(ok: bool, why: str) -> None:
    if not ok:
        raise RuleViolation(why)


def check_envelope(envelope: Any) -> list[dict[str, Any]]:
    """Raise :class:`RuleViolation` on any broken rule; the ``kv.retain`` directives, in order."""
    _require(isinstance(envelope, dict), "the envelope is an object")
    _require(set(envelope) == {"protocol_version", "message_id", "actions"}, "envelope keys")
    _require(envelope["protocol_version"] == "0.1", "protocol_version is '0.1'")
    _require(isinstance(envelope["message_id"], str) and envelope["message_id"], "message_id")
    _require(isinstance(envelope["actions"], list), "actions is a list")
    retain = [a for a in envelope["actions"] if a.get("action_type") == "kv.retain"]
    _require(len(retain) <= MAX_ACTIONS, f"at most {MAX_ACTIONS} kv.retain actions")
    scopes = set()
    directives: list[dict[str, Any]] = []
    for action in retain:
        _require(
            set(action) == {"action_id", "action_type", "action_version", "payload"},
            "action keys",
        )
        _require(isinstance(action["action_id"], str) and action["action_id"], "action_id")
        _require(action["action_version"] == "1.0", "action_version is '1.0'")
        payload = action["payload"]
        _require(isinstance(payload, dict), "payload is an object")
        _require(set(payload) <= {"scope", "directives"}, "payload keys")
        scope = payload.get("scope")
        _require(scope is None or isinstance(scope, str), "scope is a string or null")
        scopes.add(scope)
        _require(isinstance(payload.get("directives"), list), "directives is a list")
        for directive in payload["directives"]:
            check_directive(directive)
            directives.append(directive)
    _require(len(scopes) <= 1, "all kv.retain actions share one scope")
    _require(len(directives) <= MAX_DIRECTIVES, f"at most {MAX_DIRECTIVES} directives")
    check_priorities(directives)
    return directives


def check_directive(d: Any) -> None:
    _require(isinstance(d, dict), "a directive is an object")
    _require(_int(d.get("priority")) and 0 <= d["priority"] <= 100, "priority in 0..100")
    duration = d.get("duration")
    _require(
        duration is None or (_int(duration) and 0 <= duration <= MAX_DURATION),
        f"duration in 0..{MAX_DURATION} or null",
    )
    if "covers_output" in d:
        _require(set(d) <= OUTPUT_KEYS and d["covers_output"] is True, "output directive keys")
        return
    _require(set(d) <= RANGE_KEYS, f"unknown directive keys {set(d) - RANGE_KEYS}")
    start = d.get("start", 0)
    _require(_int(start) and start >= 0, "start is an integer >= 0")
    end = d.get("end")
    _require(end is None or (_int(end) and end > start), "end is null or an integer > start")


def check_priorities(directives: list[dict[str, Any]]) -> None:
    """Along the token axis (output last) a later position never has a higher priority."""

    def position(d: dict[str, Any]) -> tuple[int, int]:
        return (1, 0) if d.get("covers_output") else (0, d.get("start", 0))

    ordered = sorted(directives, key=position)
    for before, after in itertools.pairwise(ordered):
        _require(
            before["priority"] >= after["priority"], "priorities are non-increasing along tokens"
        )


def retain_envelope(
    request_id: str, directives: list[tuple[int, int, int]], *, priority: int = 50
) -> dict[str, Any]:
    """The ``kv.retain`` 1.0 envelope a worker sends for ``(start, end, duration)`` ranges."""
    envelope = {
        "protocol_version": "0.1",
        "message_id": request_id,
        "actions": [
            {
                "action_id": f"{request_id}/kv.retain",
                "action_type": "kv.retain",
                "action_version": "1.0",
                "payload": {
                    "scope": None,
                    "directives": [
                        {"start": s, "end": e, "priority": priority, "duration": d}
                        for s, e, d in directives
                    ],
                },
            }
        ],
    }
    check_envelope(envelope)  # what the test expects is itself a valid kv.retain envelope
    return envelope
