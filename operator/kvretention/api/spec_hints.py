"""``spec.hints``: which providers' cache controls the frontend turns into retention hints."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    model_validator,
)

from kvretention.api.base import WireModel, cel_config, nested, require
from kvretention.api.spec_shared import SoftPinTtlSeconds
from kvretention.common.kv_retain import MAX_PRIORITY

__all__ = [
    "HintProviders",
    "HintsSpec",
]


class HintProviders(WireModel):
    """Which provider-native cache controls the frontend turns into KV hints."""

    openai: bool = Field(
        default=True,
        description="Turn OpenAI implicit prompt_cache_options (30m) into a 1800 s retention hint.",
    )
    anthropic: bool = Field(
        default=True,
        description="Turn Anthropic top-level cache_control (5m/1h) into a 300/3600 s retention hint.",
    )


_PROVIDER_NEEDED_MESSAGE = (
    "hints.policy Required needs at least one provider in hints.providers enabled"
)


class HintsSpec(WireModel):
    """KV retention hints: what the frontend emits and whether the fleet must honour them."""

    model_config = cel_config(
        (
            "self.policy != 'Required' || self.providers.openai || self.providers.anthropic",
            _PROVIDER_NEEDED_MESSAGE,
        )
    )

    policy: Literal["Required", "Optional"] = Field(
        default="Optional",
        description=(
            "Required: the fleet is not Ready unless the worker image's SGLang accepts kv_hints. "
            "Optional: the fleet can be Ready on an engine without kv_hints "
            "(KvHintsSupported=False); hinted requests then fail visibly with HTTP 501 "
            "kv_hints_unsupported, never silently. To serve cache-control clients on such an "
            "engine, turn the providers off: their cache controls are then accepted and ignored."
        ),
    )
    providers: HintProviders = nested(HintProviders, "Per-provider switches for hint extraction.")
    breakpoints: Literal["Prefix", "Reject"] = Field(
        default="Prefix",
        description=(
            "Block-level cache breakpoints (Anthropic cache_control on tools, system and message "
            "blocks; OpenAI explicit-mode prompt_cache_breakpoint parts). Prefix: each retains "
            "the rendered prompt up to the end of its block for its TTL, resolved by the worker "
            "to the exact token offset in the model's template and sent as kv.retain token "
            "ranges (never widened; an engine on the flat kv_hints dialect answers 501). "
            "Reject: refused with the provider's 400, exactly as the v1 contract."
        ),
    )
    priority: int = Field(
        default=50,
        ge=1,
        le=MAX_PRIORITY,
        description="Priority of the retention the frontend asks for (kv.retain 1..100).",
    )
    default_ttl_seconds: SoftPinTtlSeconds | None = Field(
        default=None,
        description=(
            "Fleet policy, off when unset: retain the prompt of requests that carry no cache "
            "control at all (Codex sends none) for this many seconds. Recorded in the request "
            "trace as policy, not as client intent."
        ),
    )
    normalize_clients: bool = Field(
        default=True,
        description=(
            "Drop Claude Code's per-request billing-header system block before templating, so "
            "consecutive requests share their prefix (counted in metrics, noted in the trace)."
        ),
    )

    def active(self) -> bool:
        """Whether any request can carry a hint (and so retention must be wired)."""
        return self.policy == "Required" or self.providers.openai or self.providers.anthropic

    @model_validator(mode="after")
    def _check_cel_equivalents(self) -> HintsSpec:
        require(
            self.policy != "Required" or self.providers.openai or self.providers.anthropic,
            _PROVIDER_NEEDED_MESSAGE,
        )
        return self
