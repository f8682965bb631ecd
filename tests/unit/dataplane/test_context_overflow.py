"""A prompt longer than the model's context: the worker refuses it with the counts, and each
provider's error says so in the words its agents read (Codex: the code
``context_length_exceeded``; Claude Code: ``prompt is too long: N tokens > M maximum``)."""

from __future__ import annotations

import json
import types
from typing import Any

import pytest

from kvretention.dataplane.frontend import errors
from kvretention.dataplane.frontend.errors import Provider, error_body
from kvretention.dataplane.protocol import ContextOverflow, ErrorBody, ErrorCode, ErrorLine
from kvretention.dataplane.worker.app import RequestRejected, plan_call
from kvretention.dataplane.worker.call import engine_overflow
from kvretention.dataplane.worker.dialect import Dialect
from kvretention.dataplane.worker.engine import LoadedEngine


def _engine(context_len: int, *, reserved: int = 0, truncates: bool = False) -> LoadedEngine:
    manager = types.SimpleNamespace(
        tokenizer=None,
        context_len=context_len,
        num_reserved_tokens=reserved,
        allow_auto_truncate=truncates,
    )
    return LoadedEngine(
        engine=types.SimpleNamespace(tokenizer_manager=manager), name="t", dialect=Dialect.FLAT
    )


def _plan(tokens: int, engine: LoadedEngine, **fields: Any) -> Any:
    body = {"request_id": "r", "model": "m", "token_ids": list(range(tokens)), **fields}
    return plan_call(json.dumps(body).encode(), headers={}, state_role="aggregated", engine=engine)


# (prompt tokens, context_len, reserved, truncates, refused with (prompt, window) or None)
CASES = [
    pytest.param(99, 100, 0, False, None, id="one-token-of-room"),
    pytest.param(100, 100, 0, False, (100, 100), id="exactly-the-context"),
    pytest.param(250, 100, 0, False, (250, 100), id="far-over"),
    pytest.param(95, 100, 5, False, (95, 95), id="reserved-tokens-count"),
    pytest.param(94, 100, 5, False, None, id="under-with-reserved"),
    pytest.param(250, 100, 0, True, None, id="auto-truncate-cuts-instead"),
]


@pytest.mark.parametrize(("tokens", "context", "reserved", "truncates", "refused"), CASES)
def test_the_worker_refuses_what_sglang_would_with_the_counts(
    tokens: int,
    context: int,
    reserved: int,
    truncates: bool,
    refused: tuple[int, int] | None,
) -> None:
    engine = _engine(context, reserved=reserved, truncates=truncates)
    if refused is None:
        planned = _plan(tokens, engine, sampling={"max_new_tokens": 8})
        assert planned.kwargs["input_ids"] == list(range(tokens))
        return
    with pytest.raises(RequestRejected) as caught:
        _plan(tokens, engine)
    assert caught.value.code is ErrorCode.INVALID_REQUEST
    assert caught.value.overflow == ContextOverflow(
        prompt_tokens=refused[0], context_length=refused[1]
    )


def test_counting_tokens_is_never_refused_for_length() -> None:
    planned = _plan(250, _engine(100), count_only=True)
    assert planned.count_only == 250


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            "The input (120009 tokens) is longer than the model's context length (65536 tokens).",
            ContextOverflow(prompt_tokens=120009, context_length=65536),
        ),
        ("Requested token count exceeds the model's maximum context length of 8 tokens.", None),
        ("kv_hints: unknown action", None),
    ],
)
def test_sglangs_own_refusal_gives_its_counts(
    message: str, expected: ContextOverflow | None
) -> None:
    assert engine_overflow(message) == expected


def _upstream(overflow: ContextOverflow | None) -> errors.FrontendError:
    line = ErrorLine(
        error=ErrorBody(code=ErrorCode.INVALID_REQUEST, message="too long", overflow=overflow)
    )
    wire = ErrorLine.model_validate_json(line.model_dump_json())  # as it crosses the hops
    return errors.from_upstream(wire.error, hint_param=None)


def test_each_provider_words_the_overflow_as_its_agents_read_it() -> None:
    err = _upstream(ContextOverflow(prompt_tokens=120009, context_length=65536))
    assert err.status == 400
    openai = error_body(err, Provider.OPENAI)["error"]
    assert (openai["type"], openai["code"]) == ("invalid_request_error", "context_length_exceeded")
    assert "maximum context length is 65536 tokens" in openai["message"]
    assert "resulted in 120009 tokens" in openai["message"]
    anthropic = error_body(err, Provider.ANTHROPIC)
    assert anthropic == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "prompt is too long: 120009 tokens > 65536 maximum",
        },
    }


def test_another_invalid_request_keeps_its_own_words() -> None:
    err = _upstream(None)
    assert (err.status, err.code, err.message) == (400, "invalid_request", "too long")
    assert error_body(err, Provider.ANTHROPIC)["error"]["message"] == "too long"


def test_an_older_frontend_reads_the_refusal_as_a_plain_invalid_request() -> None:
    """A worker rolled before its frontend: the frontend's ErrorBody ignores the new field."""
    wire = json.dumps(
        {
            "error": {
                "code": "invalid_request",
                "message": "too long",
                "overflow": {"prompt_tokens": 9, "context_length": 8},
                "from_a_later_release": True,
            }
        }
    )
    assert ErrorLine.model_validate_json(wire).error.message == "too long"
