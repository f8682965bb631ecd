"""What the worker calls the engine with, and what it refuses before calling it (pure)."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest

from kvretention.dataplane.protocol import ChatMessage, ErrorCode, PreprocessedRequest, Usage
from kvretention.dataplane.worker.app import RequestRejected, plan_call
from kvretention.dataplane.worker.call import (
    Bootstrap,
    EnginePrompt,
    StreamAdapter,
    build_engine_prompt,
    build_generate_kwargs,
    finish_reason_of,
    render_chat_fallback,
)
from kvretention.dataplane.worker.dialect import Dialect
from kvretention.dataplane.worker.engine import LoadedEngine, build_sglang_argv
from support.kv_retain_rules import retain_envelope

WIRE = Path(__file__).resolve().parents[2] / "fixtures" / "kv_hints_wire.json"
INVALID = json.loads(WIRE.read_text())["invalid"]
BOOT = {
    "x-kvr-bootstrap-host": "10.0.0.5",
    "x-kvr-bootstrap-port": "8998",
    "x-kvr-bootstrap-room": "42",
}


def _engine(dialect: Dialect) -> LoadedEngine:
    return LoadedEngine(engine=object(), name=f"test:{dialect}", dialect=dialect)


def _body(**fields: Any) -> bytes:
    base: dict[str, Any] = {"request_id": "r1", "model": "m", "token_ids": [1, 2, 3]}
    return json.dumps({**base, **fields}).encode()


def _plan(body: bytes, dialect: Dialect = Dialect.FLAT, **headers: str) -> Any:
    return plan_call(body, headers=headers, state_role="aggregated", engine=_engine(dialect))


def test_unhinted_call_has_no_kv_hints_argument_at_all() -> None:
    for dialect in Dialect:
        planned = _plan(_body(), dialect)
        assert "kv_hints" not in planned.kwargs
        assert planned.kwargs == {
            "sampling_params": {},
            "stream": True,
            "rid": "r1",
            "input_ids": [1, 2, 3],
        }


@pytest.mark.parametrize(
    ("dialect", "expected"),
    [
        (Dialect.FLAT, {"retain_full_prompt": {"ttl_seconds": 1800}}),
        (
            Dialect.VERSIONED,
            retain_envelope("r1", [(0, 3, 1800)]),
        ),
    ],
)
def test_hinted_call_passes_the_dialects_form(dialect: Dialect, expected: dict[str, Any]) -> None:
    planned = _plan(_body(kv_hints={"retain_full_prompt": {"ttl_seconds": 1800}}), dialect)
    assert planned.kwargs["kv_hints"] == expected
    assert planned.kv_hints == expected


def test_envelope_without_known_action_is_no_hint() -> None:
    planned = _plan(_body(kv_hints={"prefetch_prefix": {"tokens": 1}}), Dialect.NONE)
    assert "kv_hints" not in planned.kwargs


@pytest.mark.parametrize("entry", INVALID, ids=lambda e: e["name"])
def test_malformed_envelope_is_invalid_request_naming_the_field(entry: dict[str, Any]) -> None:
    with pytest.raises(RequestRejected) as info:
        _plan(_body(kv_hints=entry["wire"]))
    assert info.value.code is ErrorCode.INVALID_REQUEST
    assert info.value.param == entry["field"]


def test_hint_on_engine_without_kv_hints_is_a_compatibility_error() -> None:
    with pytest.raises(RequestRejected) as info:
        _plan(_body(kv_hints={"retain_full_prompt": {"ttl_seconds": 300}}), Dialect.NONE)
    assert info.value.code is ErrorCode.KV_HINTS_UNSUPPORTED
    assert info.value.param == "kv_hints"
    assert "kv_hints" in str(info.value)


@pytest.mark.parametrize(
    ("body", "headers", "param"),
    [
        (b"not json", {}, None),
        (b"[1]", {}, None),
        (_body(request_id=""), {}, "request_id"),
        (json.dumps({"request_id": "r", "model": "m"}).encode(), {}, "messages"),
        (_body(), {"x-kvr-role": "sideways"}, None),
        (_body(), {"x-kvr-role": "prefill"}, None),
        (_body(), {"x-kvr-role": "decode", "x-kvr-bootstrap-host": "h"}, None),
        (_body(), {"x-kvr-role": "decode", **BOOT, "x-kvr-bootstrap-room": "x"}, None),
    ],
)
def test_bad_requests_are_rejected_before_the_engine(
    body: bytes, headers: dict[str, str], param: str | None
) -> None:
    with pytest.raises(RequestRejected) as info:
        _plan(body, **headers)
    assert info.value.code is ErrorCode.INVALID_REQUEST
    assert info.value.param == param


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_pd_halves_get_bootstrap_args_and_the_hint(role: str) -> None:
    planned = _plan(
        _body(kv_hints={"retain_full_prompt": {"ttl_seconds": 60}}), **{"x-kvr-role": role, **BOOT}
    )
    assert planned.role == role
    assert planned.kwargs["bootstrap_host"] == "10.0.0.5"
    assert planned.kwargs["bootstrap_port"] == 8998
    assert planned.kwargs["bootstrap_room"] == 42
    assert planned.kwargs["kv_hints"] == {"retain_full_prompt": {"ttl_seconds": 60}}


def test_messages_become_a_prompt() -> None:
    body = json.dumps(
        {"request_id": "r", "model": "m", "messages": [{"role": "user", "content": "hi"}]}
    ).encode()
    planned = _plan(body)
    assert planned.kwargs["prompt"] == "<|user|>\nhi\n<|assistant|>\n"
    assert "input_ids" not in planned.kwargs


def test_without_a_template_the_prompt_is_the_fallback_rendering() -> None:
    msgs = [ChatMessage(role="system", content="s"), ChatMessage(role="user", content="u")]
    req = PreprocessedRequest(request_id="r", model="m", messages=msgs)
    prompt = build_engine_prompt(req, tokenizer=None)
    assert prompt.text == render_chat_fallback(msgs)
    assert prompt.input_ids is None


def test_build_kwargs_sampling_and_bootstrap() -> None:
    req = PreprocessedRequest.model_validate(
        {"request_id": "a", "model": "m", "token_ids": [5], "sampling": {"max_new_tokens": 3}}
    )
    prompt = EnginePrompt(input_ids=[5], text=None, image_urls=[], rendered="", prompt_tokens=1)
    kwargs = build_generate_kwargs(
        req, prompt=prompt, kv_hints=None, bootstrap=Bootstrap(host="h", port=1, room=2)
    )
    assert kwargs["sampling_params"] == {"max_new_tokens": 3}
    assert (kwargs["bootstrap_host"], kwargs["bootstrap_port"], kwargs["bootstrap_room"]) == (
        "h",
        1,
        2,
    )


@pytest.mark.parametrize(
    ("meta", "expected"),
    [
        ({}, None),
        ({"finish_reason": None}, None),
        ({"finish_reason": {"type": "stop", "matched": 2}}, "stop"),
        ({"finish_reason": {"type": "length", "length": 8}}, "length"),
        ({"finish_reason": {"type": "abort", "message": "x"}}, "abort"),
        ({"finish_reason": "length"}, "length"),
        ({"finish_reason": {"type": "something_new"}}, "stop"),
    ],
)
def test_finish_reason_of(meta: dict[str, Any], expected: str | None) -> None:
    assert finish_reason_of(meta) == expected


def _out(text: str, ids: list[int], finish: dict[str, Any] | None = None) -> dict[str, Any]:
    meta = {"finish_reason": finish, "prompt_tokens": 4, "completion_tokens": len(ids)}
    return {"text": text, "output_ids": ids, "meta_info": {**meta, "cached_tokens": 1}}


def test_cumulative_stream_becomes_deltas() -> None:
    adapter = StreamAdapter()
    chunks = [
        adapter.chunk(_out("He", [1])),
        adapter.chunk(_out("Hello", [1, 2])),
        adapter.chunk(_out("Hello!", [1, 2, 3], {"type": "stop"})),
    ]
    assert [c.text for c in chunks] == ["He", "llo", "!"]
    assert [c.token_ids for c in chunks] == [[1], [2], [3]]
    assert chunks[-1].finish_reason == "stop"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage == Usage(prompt_tokens=4, completion_tokens=3, cached_tokens=1)
    assert chunks[0].usage is None


def test_only_the_first_chunk_carries_the_prompts_counts() -> None:
    """Anthropic's ``message_start`` needs the prompt's counts before any text: SGLang has them
    from its first output on; later chunks and the final usage do not repeat them here."""
    adapter = StreamAdapter()
    chunks = [
        adapter.chunk(_out("He", [1])),
        adapter.chunk(_out("Hello", [1, 2])),
        adapter.chunk(_out("Hello!", [1, 2, 3], {"type": "stop"})),
    ]
    first = chunks[0].prompt_usage
    assert first is not None and (first.prompt_tokens, first.cached_tokens) == (4, 1)
    assert first.completion_tokens == 0
    assert [c.prompt_usage for c in chunks[1:]] == [None, None]


def test_a_one_chunk_answer_carries_its_counts_in_usage_only() -> None:
    chunk = StreamAdapter().chunk(_out("Hi", [1], {"type": "stop"}))
    assert chunk.prompt_usage is None and chunk.usage is not None


def test_incremental_stream_passes_deltas_through() -> None:
    adapter = StreamAdapter(incremental=True)
    assert adapter.chunk(_out("ab", [1])).text == "ab"
    assert adapter.chunk(_out("ab", [2])).text == "ab"


MOONCAKE = ["--disaggregation-transfer-backend", "mooncake"]


@pytest.mark.parametrize(
    ("passthrough", "role", "port", "device", "expected"),
    [
        (["--model-path", "m"], "aggregated", None, None, ["--model-path", "m"]),
        (["--model-path", "m"], "aggregated", 8998, "mlx5_0", ["--model-path", "m"]),
        (
            ["--model-path", "m"],
            "decode",
            8998,
            None,
            ["--model-path", "m", "--disaggregation-mode", "decode", *MOONCAKE],
        ),
        (
            ["--model-path", "m"],
            "prefill",
            8998,
            None,
            [
                "--model-path",
                "m",
                "--disaggregation-mode",
                "prefill",
                *MOONCAKE,
                "--disaggregation-bootstrap-port",
                "8998",
            ],
        ),
        (
            [],
            "decode",
            None,
            "mlx5_0,mlx5_1",
            [
                "--disaggregation-mode",
                "decode",
                *MOONCAKE,
                "--disaggregation-ib-device",
                "mlx5_0,mlx5_1",
            ],
        ),
        (
            [
                "--disaggregation-mode=prefill",
                "--disaggregation-bootstrap-port",
                "1",
                "--disaggregation-transfer-backend=nixl",
            ],
            "prefill",
            8998,
            None,
            [
                "--disaggregation-mode=prefill",
                "--disaggregation-bootstrap-port",
                "1",
                "--disaggregation-transfer-backend=nixl",
            ],
        ),
    ],
)
def test_sglang_argv_adds_only_missing_role_flags(
    passthrough: list[str], role: Any, port: int | None, device: str | None, expected: list[str]
) -> None:
    argv = build_sglang_argv(passthrough, role=role, bootstrap_port=port, ib_device=device)
    assert argv == expected


@pytest.mark.parametrize(
    ("wanted", "prompt", "context", "sent"),
    [
        (128_000, 25_000, 65_536, 40_536),  # Claude Code's budget on a smaller context: cut
        (100, 25_000, 65_536, 100),  # fits: unchanged
        (100, 70_000, 65_536, 100),  # the prompt alone is too long: SGLang refuses it
        (100, 25_000, None, 100),  # the engine does not say its context
        (None, 25_000, 65_536, None),  # no limit asked
    ],
)
def test_max_new_tokens_fits_what_the_context_leaves(
    wanted: int | None, prompt: int, context: int | None, sent: int | None
) -> None:
    from kvretention.dataplane.worker.call import fit_max_new_tokens

    sampling = {} if wanted is None else {"max_new_tokens": wanted}
    fitted = fit_max_new_tokens(sampling, prompt_tokens=prompt, context_length=context)
    assert fitted.get("max_new_tokens") == sent


def _with_images(count: int) -> bytes:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "What is in these?"}]
    parts += [{"type": "image", "url": "data:image/png;base64,AA=="}] * count
    return _body(token_ids=None, messages=[{"role": "user", "content": parts}])


@pytest.mark.parametrize(
    ("multimodal", "images", "refused"),
    [
        (False, 0, None),
        (False, 1, "the request has 1 image;"),
        (False, 3, "the request has 3 images;"),
        (True, 2, None),
    ],
)
def test_a_text_only_model_refuses_images_instead_of_dropping_them(
    multimodal: bool, images: int, refused: str | None
) -> None:
    """SGLang drops ``image_data`` silently when the model has no multimodal processor, which
    would answer a different question: the worker says so before calling the engine."""
    manager = types.SimpleNamespace(tokenizer=None, mm_processor=object() if multimodal else None)
    engine = LoadedEngine(
        engine=types.SimpleNamespace(tokenizer_manager=manager), name="t", dialect=Dialect.FLAT
    )
    body = _with_images(images)
    if refused is None:
        planned = plan_call(body, headers={}, state_role="aggregated", engine=engine)
        assert len(planned.kwargs.get("image_data") or []) == images
        return
    with pytest.raises(RequestRejected) as caught:
        plan_call(body, headers={}, state_role="aggregated", engine=engine)
    assert caught.value.code is ErrorCode.INVALID_REQUEST
    assert "image input is not supported" in str(caught.value)
    assert refused in str(caught.value)
