"""Pure translation between the router's protocol and ``Engine.async_generate``.

``build_generate_kwargs`` decides exactly what the engine is called with (an unhinted request gets
no ``kv_hints`` key at all); ``StreamAdapter`` turns SGLang's stream outputs into
:class:`GenerateChunk` deltas.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kvretention.dataplane.protocol import ChatMessage, GenerateChunk, PreprocessedRequest, Usage


@dataclass(frozen=True)
class Bootstrap:
    """Where a prefill/decode pair meets to move KV: the prefill worker's bootstrap server."""

    host: str
    port: int
    room: int


def render_chat_fallback(messages: Sequence[ChatMessage]) -> str:
    """The prompt for an engine without a chat template: one ``<|role|>`` block per message.

    Only used when the engine has no tokenizer with a chat template (the stand-in); a real SGLang
    engine renders with its model's template.
    """
    blocks = [f"<|{m.role}|>\n{m.content}\n" for m in messages]
    return "".join(blocks) + "<|assistant|>\n"


def render_prompt(messages: Sequence[ChatMessage], *, tokenizer: Any) -> str:
    """Apply the engine tokenizer's chat template when it has one, else the fallback."""
    apply = getattr(tokenizer, "apply_chat_template", None)
    if apply is not None and getattr(tokenizer, "chat_template", None):
        rendered = apply(
            [m.model_dump() for m in messages], tokenize=False, add_generation_prompt=True
        )
        if isinstance(rendered, str):
            return rendered
    return render_chat_fallback(messages)


def build_generate_kwargs(
    request: PreprocessedRequest,
    *,
    prompt: str | None,
    kv_hints: dict[str, Any] | None,
    bootstrap: Bootstrap | None,
) -> dict[str, Any]:
    """Keyword arguments for ``Engine.async_generate``; ``kv_hints`` only when there is a hint."""
    kwargs: dict[str, Any] = {
        "sampling_params": request.sampling.to_sglang(),
        "stream": True,
        "rid": request.request_id,
    }
    if request.token_ids is not None:
        kwargs["input_ids"] = list(request.token_ids)
    else:
        kwargs["prompt"] = prompt
    if bootstrap is not None:
        kwargs["bootstrap_host"] = bootstrap.host
        kwargs["bootstrap_port"] = bootstrap.port
        kwargs["bootstrap_room"] = bootstrap.room
    if kv_hints is not None:
        kwargs["kv_hints"] = kv_hints
    return kwargs


FinishReason = Literal["stop", "length", "abort"]


def finish_reason_of(meta_info: dict[str, Any]) -> FinishReason | None:
    """SGLang's ``{"type": "stop"|"length"|"abort", ...}`` (or a bare string) as our literal."""
    reason = meta_info.get("finish_reason")
    if reason is None:
        return None
    kind = reason.get("type") if isinstance(reason, dict) else reason
    if kind in ("length", "abort"):
        return "length" if kind == "length" else "abort"
    return "stop"


class StreamAdapter:
    """Turns SGLang stream outputs (cumulative by default, deltas when incremental) into deltas."""

    def __init__(self, *, incremental: bool = False) -> None:
        self._incremental = incremental
        self._text = ""
        self._ids = 0

    def chunk(self, output: dict[str, Any]) -> GenerateChunk:
        text = output.get("text") or ""
        ids = list(output.get("output_ids") or [])
        if self._incremental:
            delta_text, delta_ids = text, ids
        else:
            delta_text = text[len(self._text) :] if text.startswith(self._text) else text
            delta_ids = ids[self._ids :]
            self._text, self._ids = text, len(ids)
        meta = output.get("meta_info") or {}
        finish = finish_reason_of(meta)
        usage = None
        if finish is not None:
            usage = Usage(
                prompt_tokens=int(meta.get("prompt_tokens") or 0),
                completion_tokens=int(meta.get("completion_tokens") or 0),
                cached_tokens=int(meta.get("cached_tokens") or 0),
            )
        return GenerateChunk(
            text=delta_text, token_ids=delta_ids, finish_reason=finish, usage=usage
        )
