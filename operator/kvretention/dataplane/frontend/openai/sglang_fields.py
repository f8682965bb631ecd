"""SGLang's own Chat Completions extensions: the fields a client of SGLang's server sends beside
OpenAI's (the OpenAI SDK's ``extra_body``), checked and mapped as SGLang 0.5.23 reads them.

Clients that move here from SGLang's server keep sending them: model cards ask for ``top_k`` and
``min_p``, and ``chat_template_kwargs`` is how a Qwen3 request turns thinking off. As unknown keys
they would be ignored while they change the answer, so each is in one table: honoured, a no-op
(scheduling and placement hints the fleet decides itself, or details of SGLang's own response),
or refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from kvretention.dataplane.frontend.openai.fields import F, obj
from kvretention.dataplane.protocol import ReasoningControl, ResponseFormat

BOTH_HONOURED: Final = frozenset({"top_k", "min_p", "repetition_penalty", "chat_template_kwargs"})
"""What both SGLang endpoints take beyond OpenAI's fields and act on, as ``PLACEMENT`` is what both
ignore."""
HONOURED: Final = BOTH_HONOURED | {
    "min_tokens",
    "stop_token_ids",
    "ignore_eos",
    "no_stop_trim",
    "skip_special_tokens",
    "regex",
    "ebnf",
    "continue_final_message",
    "separate_reasoning",
    "stream_reasoning",
}
PLACEMENT: Final = frozenset(
    {
        "extra_key",
        "priority",
        "session_id",
        "data_parallel_rank",
        "routed_dp_rank",
        "disagg_prefill_dp_rank",
        "bootstrap_host",
        "bootstrap_port",
        "bootstrap_room",
    }
)
"""Priorities and placement, which both SGLang endpoints take: the fleet's router places (on the
session), so these are counted no-ops."""
NO_OP: Final = PLACEMENT | {
    "rid",
    "routed_experts_start_len",
    "return_cached_tokens_details",
    "return_spec_tokens_details",
    "return_flat_raw_top_logprobs_b64",
    "thinking",
}
"""Request ids, priorities and placement (the router places, on the session), and details of
SGLang's own usage object or log probabilities (refused apart): nothing the model computes.
``thinking`` is MiniMax M3's switch in SGLang (its server reads it for no other model); the
switches this fleet reads are ``reasoning_effort`` and ``chat_template_kwargs``."""
_MEDIA: Final = "per-request media processing options are not supported."
_RETURNED: Final = "is not returned by this server."
REFUSED: Final[Mapping[str, str]] = {
    "input_ids": "a prompt of token ids is not supported; send the messages.",
    "lora_path": "LoRA adapters are not supported.",
    "custom_logit_processor": "custom logit processors are not supported.",
    "custom_params": "custom logit processors are not supported.",
    "stop_regex": "stop patterns are not supported; use 'stop'.",
    "session_params": "SGLang sessions are not supported; send the whole conversation.",
    "cache_salt": "per-request cache salts are not supported.",
    "watermark": "watermarking is not supported.",
    "task": "DeepSeek quick-instruction tasks are not supported.",
    "sampling_logprobs_mode": "log probabilities are not supported.",
    "return_hidden_states": f"hidden state {_RETURNED}",
    "return_routed_experts": f"the routed experts' record {_RETURNED}",
    "return_prompt_token_ids": f"the prompt's token ids {_RETURNED}",
    "return_token_ids": f"the answer's token ids {_RETURNED}",
    "return_meta_info": f"SGLang's meta info {_RETURNED}",
    "return_input_ids_in_sglext": f"the prompt's token ids {_RETURNED}",
    "return_output_ids_in_sglext": f"the answer's token ids {_RETURNED}",
    "return_sampling_mask": f"the sampling mask {_RETURNED}",
    "return_flat_raw_output_top_logprobs": "log probabilities are not supported.",
    "images_config": _MEDIA,
    "video_config": _MEDIA,
    "mm_processor_kwargs": _MEDIA,
    "max_dynamic_patch": _MEDIA,
    "min_dynamic_patch": _MEDIA,
    "use_audio_in_video": _MEDIA,
}
"""Set to anything but ``null``, ``false`` or empty: a 400 naming the field."""
FIELDS: Final = HONOURED | NO_OP | frozenset(REFUSED)

RESPONSES_HONOURED: Final = BOTH_HONOURED | {"frequency_penalty", "presence_penalty", "stop"}
"""What SGLang's ``ResponsesRequest`` takes beyond OpenAI's Responses fields and acts on."""
RESPONSES_NO_OP: Final = PLACEMENT | {"request_id"}
RESPONSES_REFUSED: Final[Mapping[str, str]] = {"cache_salt": REFUSED["cache_salt"]}
RESPONSES_FIELDS: Final = RESPONSES_HONOURED | RESPONSES_NO_OP | frozenset(RESPONSES_REFUSED)

TEMPLATE_RESERVED: Final = frozenset(
    {
        "messages",
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)
"""``apply_chat_template``'s own arguments: a template kwarg of one of these names would clash."""
THINKING_SWITCHES: Final = ("enable_thinking", "thinking")
MAX_STOP_TOKEN_IDS: Final = 64


def sglang_sampling(
    body: Mapping[str, Any], *, max_tokens: int | None, response_format: ResponseFormat | None
) -> dict[str, Any]:
    """The SGLang sampling parameters the body sets (``SamplingParams`` names), checked as
    SGLang's ``SamplingParams.verify`` checks them, so a bad value is the client's 400 here."""
    out = shared_sampling(body)
    least = F.opt_int(body, "min_tokens", minimum=0)
    if least is not None and max_tokens is not None and least > max_tokens:
        raise F.invalid_value("min_tokens", f"{least} is above max_tokens ({max_tokens}).")
    out["min_new_tokens"] = least or None
    out["stop_token_ids"] = _token_ids(body.get("stop_token_ids"))
    out["ignore_eos"] = F.opt_bool(body, "ignore_eos") or None
    out["no_stop_trim"] = F.opt_bool(body, "no_stop_trim") or None
    if not F.opt_bool(body, "skip_special_tokens", default=True):
        out["skip_special_tokens"] = False
    grammars = [k for k in ("regex", "ebnf") if F.opt_str(body, k)]
    if len(grammars) > 1 or (grammars and response_format is not None):
        named = [*grammars, *(["response_format"] if response_format is not None else [])]
        raise F.invalid_value(
            grammars[-1], f"{' and '.join(named)} each constrain the answer: set one of them."
        )
    for key in grammars:
        out[key] = body[key]
    return {k: v for k, v in out.items() if v is not None}


def shared_sampling(body: Mapping[str, Any]) -> dict[str, Any]:
    """``top_k``, ``min_p`` and ``repetition_penalty``, which both SGLang endpoints take."""
    top_k = F.opt_int(body, "top_k", minimum=-1)
    if top_k == 0:
        raise F.invalid_value("top_k", "0 is not allowed: -1 (every token) or at least 1.")
    penalty = F.opt_number(body, "repetition_penalty", minimum=0, maximum=2)
    if penalty == 0:
        raise F.invalid_value("repetition_penalty", "0 is below the exclusive minimum of 0.")
    out = {
        "top_k": top_k,
        "min_p": F.opt_number(body, "min_p", minimum=0, maximum=1),
        "repetition_penalty": penalty,
    }
    return {k: v for k, v in out.items() if v is not None}


def _token_ids(value: object) -> list[int] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise F.invalid_type("stop_token_ids", value, expected="an array")
    if len(value) > MAX_STOP_TOKEN_IDS:
        raise F.invalid_value(
            "stop_token_ids", f"{len(value)} ids; at most {MAX_STOP_TOKEN_IDS} are allowed."
        )
    for i, token in enumerate(value):
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise F.invalid_type(f"stop_token_ids[{i}]", token, expected="a token id (an integer)")
    return list(value) or None


def template_kwargs(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """``chat_template_kwargs``: passed to the model's template as they are, after the thinking
    switches (as SGLang's server passes them), so the client's win."""
    raw = body.get("chat_template_kwargs")
    if raw is None:
        return None
    kwargs = obj(raw, where="chat_template_kwargs")
    for key in kwargs:
        if key in TEMPLATE_RESERVED:
            raise F.invalid_value(
                f"chat_template_kwargs.{key}",
                f"'{key}' is an argument of the template call itself, not a template variable.",
            )
    return dict(kwargs) or None


def thinking_switch(
    kwargs: Mapping[str, Any] | None, reasoning: ReasoningControl | None
) -> ReasoningControl | None:
    """``reasoning_effort`` with the template kwargs' own thinking switch over it: the worker's
    reasoning parser must know a request asked its template not to think (SGLang reads the same
    two switches in ``_get_reasoning_from_request``)."""
    switch = next(
        (kwargs[k] for k in THINKING_SWITCHES if kwargs and isinstance(kwargs.get(k), bool)), None
    )
    if switch is None:
        return reasoning
    effort = reasoning.effort if reasoning is not None and switch else None
    return ReasoningControl(enabled=switch, effort=effort)


def reasoning_shape(body: Mapping[str, Any]) -> tuple[bool, bool]:
    """``separate_reasoning`` and ``stream_reasoning`` (both default ``true``): whether the
    reasoning is split off the answer, and whether it is streamed as it comes."""
    return (
        F.opt_bool(body, "separate_reasoning", default=True),
        F.opt_bool(body, "stream_reasoning", default=True),
    )
