"""The frontend's configuration, and the model-name checks it makes of each request."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from kvretention.dataplane.frontend import errors, model_names
from kvretention.dataplane.frontend.errors import Provider
from kvretention.dataplane.frontend.repeats import CAPACITY
from kvretention.dataplane.protocol import DEFAULT_SESSION_KEYS
from kvretention.hints.envelope import DEFAULT_PRIORITY
from kvretention.hints.intent import BreakpointMode

DEFAULT_MAX_BODY_BYTES: Final = 8 * 1024 * 1024
DEFAULT_UPSTREAM_TIMEOUT: Final = 300.0
DEFAULT_BODY_TIMEOUT: Final = 30.0
REMEMBERED_CONVERSATIONS: Final = CAPACITY


@dataclass(frozen=True)
class FrontendConfig:
    router_url: str
    served_models: tuple[str, ...] = ()
    """Model names clients may ask for; empty accepts any name."""
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    upstream_timeout: float = DEFAULT_UPSTREAM_TIMEOUT
    hint_providers: frozenset[Provider] = frozenset(Provider)
    """Providers whose cache controls become KV hints; others' are accepted and ignored."""
    model_aliases: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Client-facing name -> served name (Claude Code's small-fast model, Codex's model names).
    The router gets the served name; answers echo the name the client asked for."""
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    """Seconds a request body may take to arrive (408 after)."""
    session_keys: tuple[str, ...] = DEFAULT_SESSION_KEYS
    """Where a request's session is found, in order (headers, or ``metadata.<field>``)."""
    prefix_routing: bool = True
    """Send the router the prompt's prefix-hash chain (its cache-aware placement reads it)."""
    normalize_clients: bool = True
    """Drop Claude Code's per-request billing-header system block before templating."""
    breakpoints: BreakpointMode = "prefix"
    """Block-level breakpoints: prefix retention, or the v1 400."""
    hint_priority: int = DEFAULT_PRIORITY
    default_ttl_seconds: int | None = None
    """Fleet policy for requests with no cache control (off when ``None``)."""
    remembered_conversations: int = REMEMBERED_CONVERSATIONS
    """Conversations whose last parse the frontend keeps (``resume.py``, ``repeats.py``)."""
    codex_instructions: str | None = None
    """The ``base_instructions`` of Codex's model catalog (``GET /v1/models?client_version=``);
    ``None``: no catalog (a 404, and Codex keeps its built-in metadata and prompt)."""

    def served_name(self, model: str) -> str:
        served = model_names.resolve(model, served=self.served_models, aliases=self.model_aliases)
        return served or model


def check_model(model: str, *, config: FrontendConfig) -> None:
    """A served name, an alias or a name an alias pattern matches; with no served names
    configured, any name."""
    if not config.served_models:
        return
    aliases = config.model_aliases
    if model_names.resolve(model, served=config.served_models, aliases=aliases) is None:
        raise errors.unknown_model(model, served=(*config.served_models, *aliases))


def check_model_first(body: Any, *, config: FrontendConfig) -> None:
    """The model before the body's fields: a name nothing serves is the one 404, not the last
    answer after a 400 per field a client retries without (Claude Code drops one per retry)."""
    model = body.get("model") if isinstance(body, dict) else None
    if isinstance(model, str):
        check_model(model, config=config)
