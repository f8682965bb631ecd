"""The frontend reads each NDJSON line of a worker's answer: a chunk, an error line passed on with
its code, or something malformed (502). Chunks take a typed decode straight from the bytes; the
answer must be the one a plain ``json.loads`` first would give, escapes and all."""

from __future__ import annotations

import pytest

from kvretention.dataplane.frontend.errors import FrontendError
from kvretention.dataplane.frontend.upstream import _parse_line
from kvretention.dataplane.protocol import GenerateChunk

CHUNKS = [
    pytest.param(
        b'{"text": "hi", "token_ids": [1, 2]}', GenerateChunk(text="hi", token_ids=[1, 2])
    ),
    pytest.param(
        b'{"text": "", "finish_reason": "stop", "usage": {"prompt_tokens": 3, "completion_tokens": 1}}',
        GenerateChunk.model_validate(
            {"finish_reason": "stop", "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
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
]


@pytest.mark.parametrize(("line", "status", "code"), ERRORS)
def test_a_line_that_is_no_chunk_fails_with_its_status(line: bytes, status: int, code: str) -> None:
    with pytest.raises(FrontendError) as caught:
        _parse_line(line, hint_param=None)
    assert (caught.value.status, caught.value.code) == (status, code)
