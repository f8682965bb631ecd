"""The PreprocessedRequest wire form: kv_hints top level, absent when there is no hint."""

from __future__ import annotations

import json

from kvretention.dataplane.protocol import ChatMessage, PreprocessedRequest, SamplingParams
from kvretention.hints import KvHintEnvelope


def _request(**extra: object) -> PreprocessedRequest:
    return PreprocessedRequest(
        request_id="r1",
        model="m",
        messages=[ChatMessage(role="user", content="hi")],
        sampling=SamplingParams(max_new_tokens=8),
        **extra,  # type: ignore[arg-type]
    )


def test_hinted_request_carries_envelope_at_top_level() -> None:
    body = json.loads(_request(kv_hints=KvHintEnvelope.retain(300).to_wire()).to_json_bytes())
    assert body["kv_hints"] == {"retain_full_prompt": {"ttl_seconds": 300}}


def test_unhinted_request_has_no_kv_hints_key() -> None:
    body = json.loads(_request().to_json_bytes())
    assert "kv_hints" not in body
    assert body["sampling"] == {"max_new_tokens": 8}
