"""What a request needs its worker to implement: named by the frontend, refused by a worker that
does not know it, and a table that fails when a new request field is not classified."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvretention.dataplane.features import FEATURES, features_of, not_understood
from kvretention.dataplane.frontend.anthropic import parse_messages
from kvretention.dataplane.frontend.prepare import build_preprocessed
from kvretention.dataplane.protocol import (
    ErrorCode,
    PreprocessedRequest,
    ReasoningControl,
    ToolDefinition,
)
from kvretention.dataplane.worker.app import RequestRejected, plan_call
from kvretention.dataplane.worker.dialect import Dialect
from kvretention.dataplane.worker.engine import LoadedEngine

KNOWN_TO_EVERY_WORKER = frozenset(
    {
        "request_id",
        "model",
        "token_ids",
        "messages",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "reasoning",
        "sampling",
        "session_id",
        "count_only",
        "kv_hints",
        "requires",
    }
)
"""Fields every worker that reads ``requires`` implements."""
IGNORED_SAFELY = frozenset({"stream"})
"""Fields an older worker may ignore without changing the answer (``stream``: its chunking)."""

USES: dict[str, dict[str, Any]] = {
    "template_kwargs": {"template_kwargs": {"enable_thinking": False}},
    "continue_final_message": {"continue_final_message": True},
    "separate_reasoning": {"separate_reasoning": False},
    "stream_reasoning": {"stream_reasoning": False},
    "deferred_tools": {"deferred_tools": [ToolDefinition(name="later")]},
}


def _request(**fields: Any) -> PreprocessedRequest:
    return PreprocessedRequest(request_id="r", model="m", token_ids=[1, 2], **fields)


def test_every_request_field_is_a_feature_or_known_to_every_worker() -> None:
    """A new field must be classified: a feature a worker may predate, or safe to ignore."""
    classified = KNOWN_TO_EVERY_WORKER | IGNORED_SAFELY | set(FEATURES)
    assert set(PreprocessedRequest.model_fields) == classified
    assert set(USES) == set(FEATURES)


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_a_request_requires_exactly_the_features_it_uses(feature: str) -> None:
    assert features_of(_request()) == []
    assert features_of(_request(**USES[feature])) == [feature]


def test_the_frontend_names_what_a_request_uses() -> None:
    """An Anthropic prefill is continued: a worker that predates that must not answer it."""
    body = {
        "model": "m",
        "max_tokens": 16,
        "messages": [
            {"role": "user", "content": "Answer in JSON."},
            {"role": "assistant", "content": "{"},
        ],
    }
    parsed = parse_messages(body, hints=False)
    request = build_preprocessed(parsed, request_id="r", session_id=None, tokenizer=None)
    assert request.requires == ["continue_final_message"]
    assert json.loads(request.to_json_bytes())["requires"] == ["continue_final_message"]
    plain = parse_messages({**body, "messages": body["messages"][:1]}, hints=False)
    assert build_preprocessed(plain, request_id="r", session_id=None, tokenizer=None).requires == []


def _plan(request: PreprocessedRequest) -> Any:
    engine = LoadedEngine(engine=object(), name="test", dialect=Dialect.FLAT)
    return plan_call(request.to_json_bytes(), headers={}, state_role="aggregated", engine=engine)


def test_a_worker_refuses_what_it_does_not_implement_before_doing_anything() -> None:
    request = _request(requires=["continue_final_message", "from_a_later_release"])
    assert not_understood(request) == ["from_a_later_release"]
    with pytest.raises(RequestRejected) as refused:
        _plan(request)
    assert refused.value.code is ErrorCode.WORKER_OUTDATED
    assert "from_a_later_release" in str(refused.value)
    assert "continue_final_message" not in str(refused.value)


def test_a_worker_serves_what_it_implements() -> None:
    request = _request(reasoning=ReasoningControl(enabled=False))
    request.requires = list(FEATURES)
    assert _plan(request).request.request_id == "r"
