"""``spec.frontend`` and ``spec.router``: the request path's Service, API keys and tenant limits,
and the router's session affinity."""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import (
    Field,
    model_validator,
)

from kvretention.api.base import WireModel, cel_config, list_field, nested, port_field, require
from kvretention.api.spec_shared import (
    DEFAULT_IMAGE,
    UNSET_REQUESTS,
    Image,
    LocalObjectReference,
    PodOptions,
    Replicas,
    ResourceRequirements,
    _pod_field,
)
from kvretention.common.sessions import DEFAULT_SESSION_KEYS
from kvretention.common.tenancy import TENANT_PATTERN

__all__ = [
    "AuthSpec",
    "CodexInstructionsSpec",
    "ConfigMapKeyReference",
    "FrontendSpec",
    "RouterSpec",
    "ServiceSpec",
    "SessionAffinity",
    "SessionKey",
    "TenantLimitsOverride",
    "TenantLimitsSpec",
    "TenantName",
]


class ServiceSpec(WireModel):
    """The Kubernetes Service in front of the frontend."""

    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field(
        default="ClusterIP", description="Service type."
    )
    port: int = port_field(8000, "Service port clients connect to (HTTP).")


MAX_TENANT_REQUESTS: Final = 1_000_000
"""The largest tenant limit: requests per second, burst and concurrency alike."""
_RequestCount = Annotated[int, Field(ge=1, le=MAX_TENANT_REQUESTS)]
"""A tenant limit counted in requests (burst, concurrency)."""


class TenantLimitsSpec(WireModel):
    """Request limits of one tenant; each one unset is unlimited. Past a limit the frontend
    answers the provider's 429 with retry-after."""

    requests_per_second: float | None = Field(
        default=None, gt=0, le=MAX_TENANT_REQUESTS, description="Sustained requests per second."
    )
    burst: _RequestCount | None = Field(
        default=None,
        description="Requests a quiet tenant may send at once. Default: requestsPerSecond, rounded up.",
    )
    concurrency: _RequestCount | None = Field(
        default=None, description="Requests in flight at once (a stream counts until it ends)."
    )


TenantName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=63,
        pattern=TENANT_PATTERN,
        description="A tenant: a key of one of the auth Secrets.",
    ),
]


class TenantLimitsOverride(TenantLimitsSpec):
    """One tenant's own limits, in place of the defaults (unset fields: unlimited)."""

    name: TenantName


class AuthSpec(WireModel):
    """API keys: who may use the fleet, each key's tenant, and each tenant's limits."""

    secret_refs: list[LocalObjectReference] = Field(
        min_length=1,
        max_length=16,
        description=(
            "Secrets in the fleet's namespace holding the API keys. Each key of a Secret is a "
            "tenant (lower case, a DNS label with dots) and its value that tenant's keys, one "
            "per line (two lines while a key rotates). Mounted into the frontend and re-read "
            "when they change: a rotated key takes effect without a restart. A key listed for "
            "two tenants keeps the previous keys in force. Clients send a key as "
            "'Authorization: Bearer' or 'x-api-key'; each tenant's cached prompts are its own."
        ),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    limits: TenantLimitsSpec = nested(TenantLimitsSpec, "Every tenant's limits by default.")
    tenants: list[TenantLimitsOverride] = list_field(
        256,
        "Tenants with their own limits in place of the defaults.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    pin_share: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description=(
            "Share of the fleet's L3 pin budget (kvStore softPin.budgetRatio) one tenant may hold: "
            "retained pages past it are written unpinned. Unset: tenants share the budget."
        ),
    )


CONFIG_MAP_KEY_PATTERN: Final = r"^[-._a-zA-Z0-9]+$"
"""A ConfigMap data key, as the API server accepts it."""


class ConfigMapKeyReference(WireModel):
    """One key of a ConfigMap in the fleet's namespace."""

    name: str = Field(min_length=1, max_length=253, description="The ConfigMap's name.")
    key: str = Field(
        min_length=1,
        max_length=253,
        pattern=CONFIG_MAP_KEY_PATTERN,
        description="The key whose value is used.",
    )


class CodexInstructionsSpec(WireModel):
    """Where the frontend finds the instructions of Codex's model catalog."""

    config_map_key_ref: ConfigMapKeyReference = Field(
        description=(
            "The ConfigMap key holding the text (UTF-8). Mounted read-only into the frontend "
            "pods, which read it when they start: to roll out new text, name another ConfigMap "
            "or key, or restart the frontend Deployment. A ConfigMap or key that does not exist "
            "keeps the frontend pods from starting (FrontendReady False, reason "
            "CodexInstructionsMissing)."
        )
    )


MAX_REMEMBERED_CONVERSATIONS: Final = 100_000
"""A bound the schema states, far past any pod's memory (~3 MB a conversation)."""


class FrontendSpec(WireModel):
    """The OpenAI/Anthropic-compatible HTTP frontend."""

    replicas: Replicas = Field(default=1, description="Frontend pods.")
    image: Image = Field(default=DEFAULT_IMAGE, description="kvretention image.")
    resources: ResourceRequirements | None = Field(
        default=None, description="Frontend container resources. " + UNSET_REQUESTS
    )
    service: ServiceSpec = nested(ServiceSpec, "The client-facing Service.")
    pod: PodOptions | None = _pod_field("frontend")
    auth: AuthSpec | None = Field(
        default=None,
        description=(
            "Require API keys (from Secrets), keep each key's tenant apart in the KV caches and "
            "the pin budget, and limit each tenant's requests. Unset: no auth, every client is "
            "one tenant (only where the Service is reachable by trusted clients alone)."
        ),
    )
    remembered_conversations: int | None = Field(
        default=None,
        ge=1,
        le=MAX_REMEMBERED_CONVERSATIONS,
        description=(
            "Agent conversations each frontend pod keeps parsed, so that a conversation's next "
            "request parses only its new messages. The Service spreads requests over the pods, "
            "so each pod sees every live conversation: size it to the fleet's live conversations. "
            "Each costs about 15x its request body in memory (~3 MB for a 200 KB agent "
            "conversation, at most). Past it, requests are parsed whole at about 5x the CPU "
            "(watch kvretention_frontend_conversation_items_total). Unset: the frontend's "
            "default, 64."
        ),
    )
    codex_instructions: CodexInstructionsSpec | None = Field(
        default=None,
        description=(
            "Serve Codex's model catalog (a provider's model_catalog_url = <endpoint>/v1/models): "
            "every served name and alias, each with this text as its base_instructions, which "
            "Codex then sends as its system prompt in place of its built-in one. Unset: Codex's "
            "catalog request gets a 404 and Codex keeps its own prompt (the catalog would replace "
            "it, so the fleet never makes one up)."
        ),
    )


class SessionAffinity(WireModel):
    """Kubernetes Service session affinity for frontend -> router connections.

    Sticky sessions (``x-session-id``) are always honoured by the router itself; ClientIP affinity
    additionally keeps each frontend pod on one router pod.
    """

    type: Literal["None", "ClientIP"] = Field(
        default="None", description="Router Service sessionAffinity."
    )
    timeout_seconds: int = Field(
        default=10800,
        ge=1,
        le=86400,
        description="ClientIP affinity timeout (Service sessionAffinityConfig).",
    )


SessionKey = Annotated[
    str,
    Field(
        min_length=1,
        max_length=128,
        pattern=r"^((client_)?metadata\.[A-Za-z0-9_]+|[A-Za-z0-9][A-Za-z0-9_-]*)$",
        description="A header name, or metadata.<field> / client_metadata.<field> of the body.",
    ),
]


_KV_EVENTS_NEED_SESSIONS = (
    # sessionKeys omitted: the operator's default keys (the schema spells no default for it)
    "!has(self.kvEvents) || !self.kvEvents || !has(self.sessionKeys) || size(self.sessionKeys) > 0"
)
_KV_EVENTS_NEED_SESSIONS_MESSAGE = (
    "router.kvEvents places a request by its session, so it needs router.sessionKeys "
    "(empty: no request carries a session, and the workers' KV events would never be read)"
)


class RouterSpec(WireModel):
    """The router: picks workers, pairs prefill and decode, never reads kv_hints."""

    model_config = cel_config((_KV_EVENTS_NEED_SESSIONS, _KV_EVENTS_NEED_SESSIONS_MESSAGE))

    replicas: Replicas = Field(default=1, description="Router pods.")
    image: Image = Field(default=DEFAULT_IMAGE, description="kvretention image.")
    resources: ResourceRequirements | None = Field(
        default=None, description="Router container resources. " + UNSET_REQUESTS
    )
    session_affinity: SessionAffinity = nested(
        SessionAffinity, "Service-level affinity of frontend connections to router pods."
    )
    policy: Literal["CacheAware", "LeastOutstanding"] = Field(
        default="CacheAware",
        description=(
            "Placement of requests without a session key. CacheAware: the worker most likely to "
            "hold the prompt's longest prefix (the router remembers which conversation prefixes "
            "it sent where), unless that worker is much busier than the least loaded one. "
            "LeastOutstanding: the worker with the fewest requests in flight. A session key "
            "always wins over either. Each router pod keeps its own memory: with several "
            "replicas, sessionAffinity ClientIP keeps a frontend pod on one router pod."
        ),
    )
    session_keys: list[SessionKey] = Field(
        default_factory=lambda: list(DEFAULT_SESSION_KEYS),
        min_length=0,
        max_length=16,
        description=(
            "Where the frontend finds a request's session, in order; the first one present pins "
            "the conversation to one worker. A header name (x-session-id; x-dynamo-session-id, "
            "set by Dynamo-style gateways; Codex's thread-id, session-id and older session_id; "
            "x-claude-code-session-id) or metadata.<field> / client_metadata.<field> of the "
            "request body (Codex's client_metadata.session_id; Anthropic metadata.user_id, where "
            "Claude Code puts its session). prompt_cache_key is never an affinity key. Empty: no "
            "session affinity."
        ),
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    kv_events: bool = Field(
        default=False,
        description=(
            "Place a session without a pin by what the engines say they hold: each aggregated or "
            "prefill worker has SGLang publish its KV events and serves the blocks resident per "
            "tenant and session (worker --kv-events), and the router polls those summaries with "
            "its health checks and sends the session to the worker holding most of its tokens "
            "(router --kv-residency), before policy decides. A pin still wins; decode workers "
            "are never asked (the router places a disaggregated session by its prefill worker). "
            "A field of the router because it changes placement, which the router owns; the "
            "operator renders the worker side to match. Needs sessionKeys; an extraArgs "
            "--kv-events-config on those pools is refused (InvalidSpec). False: neither flag, "
            "placement as before."
        ),
    )
    placement: Literal["Router", "Frontend"] = Field(
        default="Router",
        description=(
            "Where a request is placed on a worker. Router: the frontend sends it to the router, "
            "which places it and relays the answer (two Python HTTP hops before the worker; one "
            "memory of sessions and prefixes per router pod). Frontend: each frontend pod places "
            "its requests itself with the router's placement (sessions, prefix index, kvEvents, "
            "health checks) and sends them straight to the worker: one hop, about a third less "
            "CPU and latency per request (benchmarks/README.md). Each frontend pod then keeps its "
            "own memory, so a session keeps its worker when one frontend pod serves it (one "
            "replica, or the Gateway's endpoint picker: gateway.inferencePool) or with kvEvents. "
            "The router Deployment stays for the endpoint picker. Aggregated workers only."
        ),
    )
    pod: PodOptions | None = _pod_field("router")

    @model_validator(mode="after")
    def _check_cel_equivalents(self) -> RouterSpec:
        require(not self.kv_events or len(self.session_keys) > 0, _KV_EVENTS_NEED_SESSIONS_MESSAGE)
        return self
