"""An answer the client reads whole: merged chunks fold as the chunks they replace did."""

from __future__ import annotations

import pytest

from kvretention.dataplane.frontend.common import Completion
from kvretention.dataplane.protocol import GenerateChunk, ToolCallDelta, Usage
from kvretention.dataplane.worker.whole_answer import HeldChunks, merge_chunks


def fold(chunks: list[GenerateChunk]) -> Completion:
    out = Completion()
    for chunk in chunks:
        out.add(chunk)
    return out


def delta(index: int, arguments: str, **first: str) -> ToolCallDelta:
    return ToolCallDelta(index=index, arguments=arguments, **first)


FINAL = Usage(prompt_tokens=9, completion_tokens=5)

CASES = {
    "text": [GenerateChunk(text="He", token_ids=[1]), GenerateChunk(text="llo", token_ids=[2, 3])],
    "reasoning then text": [
        GenerateChunk(reasoning="think", prompt_usage=Usage(prompt_tokens=9)),
        GenerateChunk(reasoning=" more"),
        GenerateChunk(text="answer", finish_reason="stop", usage=FINAL),
    ],
    "two calls in pieces": [
        GenerateChunk(text="\n\n"),
        GenerateChunk(tool_calls=[delta(0, '{"ci', id="call_a", name="get_weather")]),
        GenerateChunk(tool_calls=[delta(0, 'ty": "Paris"}')]),
        GenerateChunk(tool_calls=[delta(1, "", id="call_b", name="get_time")]),
        GenerateChunk(tool_calls=[delta(1, '{"zone": "UTC"}')], finish_reason="tool_calls"),
        GenerateChunk(usage=FINAL),
    ],
    "a custom call": [
        GenerateChunk(
            tool_calls=[delta(0, "*** Begin", id="c", name="apply_patch", kind="custom")]
        ),
        GenerateChunk(tool_calls=[delta(0, " Patch")], finish_reason="tool_calls", usage=FINAL),
    ],
    "usage replaced later": [
        GenerateChunk(text="a", usage=Usage(completion_tokens=1)),
        GenerateChunk(text="b", finish_reason="length", usage=FINAL),
    ],
}


@pytest.mark.parametrize("chunks", list(CASES.values()), ids=list(CASES))
def test_a_merged_chunk_folds_as_its_chunks(chunks: list[GenerateChunk]) -> None:
    merged = merge_chunks(chunks)
    assert fold([merged]) == fold(chunks)
    assert merged.token_ids == [t for c in chunks for t in c.token_ids]
    assert merged.prompt_usage == next((c.prompt_usage for c in chunks if c.prompt_usage), None)
    # each call once, its id and name first
    assert [d.index for d in merged.tool_calls] == sorted(
        {d.index for c in chunks for d in c.tool_calls}
    )


def test_one_chunk_is_sent_as_it_is() -> None:
    chunk = GenerateChunk(text="x", finish_reason="stop")
    assert merge_chunks([chunk]) is chunk


def test_held_chunks_go_out_merged_once_the_interval_passed() -> None:
    held = HeldChunks(interval_s=0.5, last_write=10.0)
    assert held.add(GenerateChunk(text="a"), 10.1) is None
    assert held.add(GenerateChunk(text="b"), 10.49) is None
    due = held.add(GenerateChunk(text="c"), 10.5)
    assert due is not None and due.text == "abc"
    assert held.last_write == 10.5
    assert held.add(GenerateChunk(text="d"), 10.9) is None  # counted from the last write
    rest = held.take(11.0)
    assert rest is not None and rest.text == "d"
    assert held.take(11.1) is None  # nothing held
