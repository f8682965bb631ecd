"""The frontend reads each NDJSON line of a worker's answer: a chunk, an error line passed on with
its code, or something malformed (502). Chunks take a typed decode straight from the bytes; the
answer must be the one a plain ``json.loads`` first would give, escapes and all."""

from __future__ import annotations

import msgspec
import pytest

from kvretention.dataplane.frontend.errors import FrontendError
from kvretention.dataplane.frontend.upstream import _parse_line
from kvretention.dataplane.protocol import GenerateChunk, ToolCallDelta, Usage, chunk_line

CHUNKS = [
    pytest.param(
        b'{"text": "hi", "token_ids": [1, 2]}', GenerateChunk(text="hi", token_ids=[1, 2])
    ),
    pytest.param(
        b'{"text": "", "finish_reason": "stop", "usage": {"prompt_tokens": 3, "completion_tokens": 1}}',
        msgspec.convert(
            {"finish_reason": "stop", "usage": {"prompt_tokens": 3, "completion_tokens": 1}},
            GenerateChunk,
        ),
        id="finish",
    ),
    pytest.param(
        b'{"text": "say \\"error\\" \\u00e9", "unknown": 1}',
        GenerateChunk(text='say "error" \u00e9'),
        id="escapes-and-an-unknown-key",
    ),
    pytest.param(b'{"text": "error"}', GenerateChunk(text="error"), id="the-word-as-a-value"),
]


@pytest.mark.parametrize(("line", "chunk"), CHUNKS)
def test_a_chunk_line_reads_as_its_chunk(line: bytes, chunk: GenerateChunk) -> None:
    assert _parse_line(line, hint_param=None) == chunk


WRITTEN = [
    pytest.param(GenerateChunk(text="a"), b'{"text":"a"}', id="a-text-delta-stays-small"),
    pytest.param(GenerateChunk(reasoning="r", token_ids=[7]), None, id="reasoning"),
    pytest.param(
        GenerateChunk(
            tool_calls=[
                ToolCallDelta(index=0, id="call_1", name="Read", arguments='{"p": "\\u00e9\n"}'),
                ToolCallDelta(index=1, arguments="*** Begin Patch", kind="custom"),
            ]
        ),
        None,
        id="tool-calls",
    ),
    pytest.param(
        GenerateChunk(
            finish_reason="tool_calls",
            usage=Usage(prompt_tokens=9, completion_tokens=2, cached_tokens=4, retained_tokens=0),
            prompt_usage=Usage(prompt_tokens=9),
        ),
        None,
        id="finish-with-usage",
    ),
    pytest.param(GenerateChunk(finish_reason="stop", usage=Usage()), None, id="zero-usage"),
]


@pytest.mark.parametrize(("chunk", "exact"), WRITTEN)
def test_what_the_worker_writes_reads_back_as_the_same_chunk(
    chunk: GenerateChunk, exact: bytes | None
) -> None:
    line = chunk_line(chunk)
    assert _parse_line(line, hint_param=None) == chunk
    if exact is not None:
        assert line == exact


ERRORS = [
    pytest.param(b'{"error": {"code": "no_workers", "message": "none"}}', 503, "no_workers"),
    pytest.param(
        b'{"\\u0065rror": {"code": "no_workers", "message": "none"}}',
        503,
        "no_workers",
        id="an-escaped-error-key",
    ),
    pytest.param(b'{"error": {"nope": 1}}', 502, "bad_gateway", id="an-error-line-out-of-shape"),
    pytest.param(b"not json", 502, "bad_gateway", id="not-json"),
    pytest.param(b"[1, 2]", 502, "bad_gateway", id="not-an-object"),
    pytest.param(b'{"text": 5}', 502, "bad_gateway", id="a-chunk-out-of-shape"),
    pytest.param(b'{"finish_reason": "abort"}', 500, "engine_error", id="aborted"),
    pytest.param(b'{"finish_reason": "done"}', 502, "bad_gateway", id="an-unknown-finish"),
    pytest.param(b'{"tool_calls": [{"index": -1}]}', 502, "bad_gateway", id="a-negative-index"),
    pytest.param(b'{"tool_calls": [{"name": "x"}]}', 502, "bad_gateway", id="a-call-without-index"),
    pytest.param(b'{"usage": {"prompt_tokens": "3"}}', 502, "bad_gateway", id="a-count-as-text"),
]


@pytest.mark.parametrize(("line", "status", "code"), ERRORS)
def test_a_line_that_is_no_chunk_fails_with_its_status(line: bytes, status: int, code: str) -> None:
    with pytest.raises(FrontendError) as caught:
        _parse_line(line, hint_param=None)
    assert (caught.value.status, caught.value.code) == (status, code)
