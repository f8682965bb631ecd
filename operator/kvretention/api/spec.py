"""What a user declares: the ``KvRetentionDeployment`` spec models, the single source of the CRD's
``spec`` schema.

Field names are snake_case in Python and camelCase on the wire (aliases). Every field carries a
description (``kubectl explain`` shows it), bounds and a default where one is safe. Cross-field rules
live next to the model they constrain as CEL (``x-kubernetes-validations``); pydantic enforces the
same rules for ``render`` and tests through validators, so a CR file is judged the same way with or
without an API server.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    AliasChoices,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from kvretention.api.base import WireModel, cel_rules, nested, require
from kvretention.api.quantity import (
    QUANTITY_MAX_LENGTH,
    QUANTITY_MESSAGE,
    QUANTITY_RULE,
    quantity_problem,
)
from kvretention.dataplane.protocol import DEFAULT_SESSION_KEYS
from kvretention.dataplane.tenancy import TENANT_PATTERN
from kvretention.hints import LONGEST_EMITTED_TTL_SECONDS

__all__ = [
    "DEFAULT_IMAGE",
    "DEFAULT_WORKER_IMAGE",
    "EXTENDED_RESOURCE_PATTERN",
    "GPU_RESOURCE_MESSAGE",
    "GPU_RESOURCE_RULE",
    "LARGEST_HINT_TTL_SECONDS",
    "MASTER_PORT_MESSAGE",
    "MAX_NAME_LENGTH",
    "MAX_NODES_PER_REPLICA",
    "MAX_SOFT_PIN_TTL_SECONDS",
    "MAX_STARTUP_TIMEOUT_SECONDS",
    "MIN_STARTUP_TIMEOUT_SECONDS",
    "STARTUP_ALLOWANCE_SECONDS",
    "AuthSpec",
    "EvictionSpec",
    "ExternalMooncakeSpec",
    "ExtraArg",
    "FrontendSpec",
    "HiCacheSpec",
    "HintProviders",
    "HintsSpec",
    "KvRetentionDeploymentSpec",
    "KvStoreSpec",
    "LocalObjectReference",
    "ModelAlias",
    "ModelSpec",
    "ModelVolume",
    "MooncakeMasterSpec",
    "MooncakeSpec",
    "NetworkPolicySpec",
    "PodOptions",
    "PoolAutoscalingSpec",
    "PrefillPoolSpec",
    "Quantity",
    "ReasoningParserName",
    "ResourceRequirements",
    "RouterSpec",
    "ServiceSpec",
    "SessionAffinity",
    "SessionKey",
    "SoftPinSpec",
    "TenantLimitsOverride",
    "TenantLimitsSpec",
    "TenantName",
    "Toleration",
    "ToolCallParser",
    "TransferSpec",
    "WorkerPoolSpec",
    "WorkerRolloutSpec",
    "WorkersSpec",
    "is_extended_resource",
]


DEFAULT_IMAGE: Final = "ghcr.io/kvretention/kvretention:0.1.0"
"""The operator's own image: runs ``kvretention frontend`` and ``kvretention router``."""
DEFAULT_WORKER_IMAGE: Final = "ghcr.io/kvretention/worker:0.1.0"
"""SGLang + Mooncake + this package's worker; also ships ``mooncake_master``."""

MAX_NAME_LENGTH: Final = 54
"""Longest CR name whose child Service names (``<name>-mooncake``) stay DNS-1035 labels (63)."""
LARGEST_HINT_TTL_SECONDS: Final = LONGEST_EMITTED_TTL_SECONDS
"""The longest TTL the frontend emits (OpenAI Responses ``12h``): a soft pin must hold it."""
MAX_SOFT_PIN_TTL_SECONDS: Final = 86_400

Quantity = Annotated[
    int | str,
    Field(
        description="A Kubernetes resource quantity, such as 2, 500m or 16Gi.",
        json_schema_extra={"maxLength": QUANTITY_MAX_LENGTH},
    ),
]

_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_PATTERN: Final = (
    # distribution/reference's grammar, [domain[:port]/]path[:tag][@digest], where a first
    # component is a domain only with a dot, a port, or as localhost (else it is a path part)
    rf"^(?:(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})+(?::[0-9]+)?|{_DOMAIN_PART}:[0-9]+|localhost)/)?"
    rf"{_PATH_PART}(?:/{_PATH_PART})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
"""An image reference a Pod accepts and a runtime can pull: no spaces, a lowercase path."""
_IMAGE: Final = re.compile(IMAGE_PATTERN)
IMAGE_RULE: Final = "self.matches('" + IMAGE_PATTERN.replace("\\", "\\\\") + "')"
IMAGE_MESSAGE: Final = (
    "must be an image reference such as ghcr.io/org/name:tag or name@sha256:<hex>: no spaces, "
    "a lowercase repository path, a tag of letters, digits, '_', '.' and '-'"
)


def _check_image(value: str) -> str:
    require(_IMAGE.fullmatch(value) is not None, IMAGE_MESSAGE)
    return value


Image = Annotated[
    str,
    AfterValidator(_check_image),
    Field(min_length=1, max_length=1024, json_schema_extra=cel_rules((IMAGE_RULE, IMAGE_MESSAGE))),
]
"""A container image reference, checked at admission (CEL) and by ``render`` alike."""


# --- shared ---------------------------------------------------------------------------------------


_QUANTITIES: Final[dict[str, Any]] = {
    "maxProperties": 16,
    "x-kubernetes-validations": [
        {
            "rule": QUANTITY_RULE,
            "message": QUANTITY_MESSAGE,
        }
    ],
}


class ResourceRequirements(WireModel):
    """Container CPU/memory/accelerator requests and limits (the Kubernetes shape).

    Every value is a quantity within what one node can have (:data:`NODE_BOUNDS`): CEL at
    admission, the same table's check here."""

    requests: dict[str, Quantity] | None = Field(
        default=None,
        description="Minimum resources the scheduler reserves, e.g. {cpu: 2, memory: 8Gi}.",
        json_schema_extra=_QUANTITIES,
    )
    limits: dict[str, Quantity] | None = Field(
        default=None,
        description="Maximum resources the container may use, e.g. {nvidia.com/gpu: 1}.",
        json_schema_extra=_QUANTITIES,
    )

    @field_validator("requests", "limits")
    @classmethod
    def _within_a_node(cls, value: dict[str, int | str] | None) -> dict[str, int | str] | None:
        problems = [
            problem
            for key, quantity in sorted((value or {}).items())
            if (problem := quantity_problem(key, quantity)) is not None
        ]
        require(not problems, "; ".join(problems))
        return value


class Toleration(WireModel):
    """A Kubernetes toleration (the core/v1 shape): lets pods onto nodes with a matching taint."""

    key: str | None = Field(
        default=None, max_length=316, description="Taint key; empty with Exists matches every key."
    )
    operator: Literal["Exists", "Equal"] | None = Field(
        default=None, description="Exists or Equal (Kubernetes' default: Equal)."
    )
    value: str | None = Field(
        default=None, max_length=63, description="Taint value to match (operator Equal)."
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match; empty matches every effect."
    )
    toleration_seconds: int | None = Field(
        default=None,
        ge=0,
        description="NoExecute only: how long the pod stays bound after the taint appears.",
    )


class LocalObjectReference(WireModel):
    """A reference to an object in the fleet's namespace, by name."""

    name: str = Field(min_length=1, max_length=253, description="The object's name.")


_K8S_OBJECTS = "Kubernetes {} objects, passed through as is (the API server validates them)."
_MapValue = Annotated[str, Field(max_length=63 * 1024, description="The value for this key.")]


# Pass-through items: free-form objects the API server validates as the named kind.
_EnvVar = Annotated[dict[str, Any], Field(description="One Kubernetes EnvVar.")]
_Volume = Annotated[dict[str, Any], Field(description="One Kubernetes Volume.")]
_VolumeMount = Annotated[dict[str, Any], Field(description="One Kubernetes VolumeMount.")]
_TopologySpreadConstraint = Annotated[
    dict[str, Any], Field(description="One Kubernetes TopologySpreadConstraint.")
]


class PodOptions(WireModel):
    """Where this component's pods run and as whom: passed through to the pod template.

    The operator's own settings win: labels it selects on, its env, volumes and mounts cannot be
    overridden (``InvalidSpec``).
    """

    labels: dict[str, _MapValue] = Field(
        default_factory=dict,
        description="Extra pod labels (the operator's app.kubernetes.io/* labels are reserved).",
        json_schema_extra={"maxProperties": 64},
    )
    annotations: dict[str, _MapValue] = Field(
        default_factory=dict,
        description="Extra pod annotations.",
        json_schema_extra={"maxProperties": 64},
    )
    node_selector: dict[str, _MapValue] = Field(
        default_factory=dict,
        description="Node labels the pods must run on (pod spec nodeSelector).",
        json_schema_extra={"maxProperties": 64},
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        max_length=64,
        description="Tolerations, e.g. for tainted GPU nodes (pod spec tolerations).",
    )
    affinity: dict[str, Any] | None = Field(
        default=None,
        description=(
            "A Kubernetes Affinity object (nodeAffinity, podAffinity, podAntiAffinity), passed "
            "through as is (the API server validates it)."
        ),
    )
    topology_spread_constraints: list[_TopologySpreadConstraint] = Field(
        default_factory=list,
        max_length=16,
        description=_K8S_OBJECTS.format("TopologySpreadConstraint"),
    )
    priority_class_name: str | None = Field(
        default=None, max_length=253, description="PriorityClass of the pods."
    )
    runtime_class_name: str | None = Field(
        default=None, max_length=253, description="RuntimeClass of the pods (e.g. nvidia)."
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list,
        max_length=16,
        description="Secrets with registry credentials for the images.",
    )
    service_account_name: str | None = Field(
        default=None,
        max_length=253,
        description="ServiceAccount the pods run as (default: the namespace's default).",
    )
    env: list[_EnvVar] = Field(
        default_factory=list,
        max_length=128,
        description=_K8S_OBJECTS.format("EnvVar (name, value or valueFrom)")
        + " Added to the main container; the operator's own variables cannot be overridden.",
    )
    volumes: list[_Volume] = Field(
        default_factory=list,
        max_length=64,
        description=_K8S_OBJECTS.format("Volume") + " Added to the pod.",
    )
    volume_mounts: list[_VolumeMount] = Field(
        default_factory=list,
        max_length=64,
        description=_K8S_OBJECTS.format("VolumeMount") + " Added to the main container.",
    )


def _pod_field(component: str) -> Any:
    return Field(
        default=None,
        description=(
            f"Placement and identity of the {component} pods: tolerations, nodeSelector, affinity, "
            "topology spread, priority and runtime class, image pull secrets, service account, "
            "labels, annotations, extra env and volumes."
        ),
    )


# --- model ----------------------------------------------------------------------------------------


class ModelVolume(WireModel):
    """Where the weights live when ``model.path`` is a file path rather than a hub id."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (
                "has(self.claimName) != has(self.hostPath)",
                "model.volume needs exactly one of claimName or hostPath",
            )
        )
    )

    claim_name: str | None = Field(
        default=None,
        max_length=253,
        description="A PersistentVolumeClaim in the CR's namespace holding the weights.",
    )
    host_path: str | None = Field(
        default=None,
        max_length=4096,
        description="A directory on the node holding the weights (single-node and test setups).",
    )
    mount_path: str = Field(
        default="/models",
        min_length=1,
        max_length=4096,
        pattern=r"^/",
        description="Where the volume is mounted read-only in worker containers.",
    )

    @model_validator(mode="after")
    def _check_cel_equivalents(self) -> ModelVolume:
        require(
            (self.claim_name is None) != (self.host_path is None),
            "model.volume needs exactly one of claimName or hostPath",
        )
        return self


ModelAlias = Annotated[
    str,
    Field(
        min_length=1,
        max_length=256,
        pattern=r"^[A-Za-z0-9*][A-Za-z0-9._/:@\[\]*-]*$",
        description=(
            "A model name as clients send it, or a pattern: `*` stands for any run of characters "
            "(`claude-*`), every other character is literal."
        ),
    ),
]

ToolCallParser = Literal[
    "apertus2509", "beam", "cohere_command4", "deepseekv3", "deepseekv31", "deepseekv32",
    "deepseekv4", "deepseekv41", "dots", "glm", "glm45", "glm47", "gpt-oss", "k2_horizon",
    "kimi_k2", "kimi_k3", "lfm2", "ling3", "llama3", "mimo", "minicpm5", "mistral", "muse",
    "poolside_v1", "pythonic", "qwen", "qwen25", "qwen3_coder", "spark25", "step3", "step3p5",
    "minimax-m2", "minimax-m3", "nanbeige", "trinity", "interns1", "hermes", "hunyuan",
    "gigachat3", "gigachat35", "gemma4", "inkling", "iquest_q1", "response_template",
]  # fmt: skip
"""SGLang 0.5.23's ``FunctionCallParser.ToolCallParserEnum`` keys (a unit test keeps them equal)."""

ReasoningParserName = Literal[
    "apertus2509", "beam", "deepseek-r1", "deepseek-v3", "deepseek-v4", "deepseek-v41", "dots",
    "glm45", "ling3", "hunyuan", "gpt-oss", "k2_horizon", "kimi", "kimi_k2", "kimi_k3", "mimo",
    "muse", "poolside_v1", "qwen3", "qwen3-thinking", "minimax", "minimax-append-think",
    "minimax-m3", "nanbeige", "step3", "step3p5", "mistral", "nemotron_3",
    "granite_thinking_parser", "interns1", "gemma4", "gigachat35", "inkling", "iquest_q1",
    "cohere_command4", "response_template",
]  # fmt: skip
"""SGLang 0.5.23's ``ReasoningParser.DetectorMap`` keys (a unit test keeps them equal)."""


class ModelSpec(WireModel):
    """The model every worker serves."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (
                "!has(self.aliases) || !(self.name in self.aliases)",
                "model.aliases must not repeat model.name",
            )
        )
    )

    name: str = Field(
        min_length=1,
        max_length=256,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:-]*$",
        description="Served model name: the `model` clients put in requests (SGLang --served-model-name).",
    )
    path: str = Field(
        min_length=1,
        max_length=4096,
        description="Hugging Face id or path inside the worker container (SGLang --model-path).",
    )
    volume: ModelVolume | None = Field(
        default=None, description="Optional volume with the weights, mounted in every worker."
    )
    aliases: list[ModelAlias] = Field(
        default_factory=list,
        max_length=32,
        description=(
            "Other model names clients may send that the frontend serves with this model (for "
            "example Claude Code's small fast model or the names Codex is configured with); "
            "responses echo the name the client asked for. An alias with `*` is a pattern: `*` "
            "matches any run of characters, so `claude-*` and `gpt-*` take every name Claude Code "
            "and Codex send by default. Only exact aliases are listed by `/v1/models`."
        ),
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    tool_call_parser: ToolCallParser | None = Field(
        default=None,
        description=(
            "SGLang tool-call parser for the model's native tool-call format (SGLang "
            "--tool-call-parser), e.g. qwen25, qwen3_coder, llama3, deepseekv3, kimi_k2, glm45, "
            "gpt-oss. Unset: tool calls are not parsed and requests with tools are refused."
        ),
    )
    reasoning_parser: ReasoningParserName | None = Field(
        default=None,
        description=(
            "SGLang reasoning parser that separates the model's thinking from its answer (SGLang "
            "--reasoning-parser), e.g. qwen3, deepseek-r1, kimi_k2, glm45, gpt-oss. Unset: "
            "thinking, if any, stays in the answer text."
        ),
    )

    @model_validator(mode="after")
    def _check_aliases(self) -> ModelSpec:
        require(self.name not in self.aliases, "model.aliases must not repeat model.name")
        require(len(set(self.aliases)) == len(self.aliases), "model.aliases must be unique")
        return self


# --- hints ----------------------------------------------------------------------------------------


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


class HintsSpec(WireModel):
    """KV retention hints: what the frontend emits and whether the fleet must honour them."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (
                "self.policy != 'Required' || self.providers.openai || self.providers.anthropic",
                "hints.policy Required needs at least one provider in hints.providers enabled",
            )
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
        le=100,
        description="Priority of the retention the frontend asks for (kv.retain 1..100).",
    )
    default_ttl_seconds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_SOFT_PIN_TTL_SECONDS,
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
            "hints.policy Required needs at least one provider in hints.providers enabled",
        )
        return self


# --- frontend / router ----------------------------------------------------------------------------


class ServiceSpec(WireModel):
    """The Kubernetes Service in front of the frontend."""

    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field(
        default="ClusterIP", description="Service type."
    )
    port: int = Field(
        default=8000, ge=1, le=65535, description="Service port clients connect to (HTTP)."
    )


class TenantLimitsSpec(WireModel):
    """Request limits of one tenant; each one unset is unlimited. Past a limit the frontend
    answers the provider's 429 with retry-after."""

    requests_per_second: float | None = Field(
        default=None, gt=0, le=1_000_000, description="Sustained requests per second."
    )
    burst: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="Requests a quiet tenant may send at once. Default: requestsPerSecond, rounded up.",
    )
    concurrency: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="Requests in flight at once (a stream counts until it ends).",
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
    tenants: list[TenantLimitsOverride] = Field(
        default_factory=list,
        max_length=256,
        description="Tenants with their own limits in place of the defaults.",
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


class FrontendSpec(WireModel):
    """The OpenAI/Anthropic-compatible HTTP frontend."""

    replicas: int = Field(default=1, ge=0, le=1000, description="Frontend pods.")
    image: Image = Field(default=DEFAULT_IMAGE, description="kvretention image.")
    resources: ResourceRequirements | None = Field(
        default=None, description="Frontend container resources."
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


class RouterSpec(WireModel):
    """The router: picks workers, pairs prefill and decode, never reads kv_hints."""

    replicas: int = Field(default=1, ge=0, le=1000, description="Router pods.")
    image: Image = Field(default=DEFAULT_IMAGE, description="kvretention image.")
    resources: ResourceRequirements | None = Field(
        default=None, description="Router container resources."
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
    pod: PodOptions | None = _pod_field("router")


# --- workers --------------------------------------------------------------------------------------

MAX_NODES_PER_REPLICA: Final = 64
"""Most nodes one multinode worker (a LeaderWorkerSet group) may span."""


def _tp_divisible_rule(pool: str, *, always: bool) -> str:
    """CEL: pool ``pool``'s tensorParallelSize is a multiple of its nodes per replica (its own
    ``nodesPerReplica``, else ``workers.nodesPerReplica``). ``always``: an omitted pool has the
    defaults (the aggregated pool), so it must then be one node."""
    tp = f"self.{pool}.tensorParallelSize"
    nodes = (
        f"(has(self.{pool}.nodesPerReplica) ? self.{pool}.nodesPerReplica : self.nodesPerReplica)"
    )
    missing = "self.nodesPerReplica == 1" if always else "true"
    return f"(has(self.{pool}) ? {tp} % {nodes} == 0 : {missing})"


def tp_divisible_message(pool: str) -> str:
    return (
        f"workers.{pool}.tensorParallelSize must be a multiple of its nodesPerReplica "
        "(each node of a multinode worker runs tensorParallelSize / nodesPerReplica ranks)"
    )


ExtraArg = Annotated[str, Field(max_length=4096, description="One SGLang server argument.")]


class WorkerPoolSpec(WireModel):
    """One SGLang worker pool (its size comes from ``workers.replicas``)."""

    tensor_parallel_size: int = Field(
        default=1, ge=1, le=64, description="GPUs per worker (SGLang --tp-size)."
    )
    resources: ResourceRequirements | None = Field(
        default=None,
        description=(
            "Worker container resources. When limits omit workers.gpuResource, "
            "tensorParallelSize GPUs are requested (tensorParallelSize / nodesPerReplica on "
            "each pod of a multinode worker)."
        ),
    )
    extra_args: list[ExtraArg] = Field(
        default_factory=list,
        max_length=128,
        description="Extra SGLang server arguments appended after the ones the operator renders.",
    )
    nodes_per_replica: int | None = Field(
        default=None,
        ge=1,
        le=MAX_NODES_PER_REPLICA,
        description=(
            "Nodes one worker of this pool spans (overrides workers.nodesPerReplica). Above 1 "
            "each worker is a LeaderWorkerSet group of this many pods, one per node, each running "
            "tensorParallelSize / nodesPerReplica ranks (needs the LeaderWorkerSet controller)."
        ),
    )


class PoolAutoscalingSpec(WireModel):
    """A HorizontalPodAutoscaler for one worker pool, on the router's count of the pool's
    outstanding requests (an External metric, served by prometheus-adapter; docs/observability.md)."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (
                "self.minReplicas <= self.maxReplicas",
                "autoscaling.minReplicas must not exceed maxReplicas",
            ),
        )
    )

    min_replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description=(
            "Fewest workers. 0 (scale to zero) drops every prefix the pool retains with its last "
            "worker, so a retaining pool needs allowScaleToZero, and the cluster needs the "
            "HPAScaleToZero feature gate."
        ),
    )
    max_replicas: int = Field(ge=1, le=1000, description="Most workers.")
    target: int = Field(
        ge=1,
        le=100_000,
        description=(
            "Outstanding requests per worker the autoscaler holds the pool to (the router's "
            "kvretention_router_pool_outstanding_requests divided by the pool's replicas)."
        ),
    )
    allow_scale_to_zero: bool = Field(
        default=False,
        description="Let minReplicas be 0 while hints are retained (every retained prefix is lost at 0).",
    )

    @model_validator(mode="after")
    def _check_cel_equivalents(self) -> PoolAutoscalingSpec:
        require(
            self.min_replicas <= self.max_replicas,
            "autoscaling.minReplicas must not exceed maxReplicas",
        )
        return self


class PrefillPoolSpec(WorkerPoolSpec):
    """The prefill pool of a disaggregated fleet; sized on its own."""

    replicas: int = Field(default=1, ge=0, le=1000, description="Prefill workers.")
    autoscaling: PoolAutoscalingSpec | None = Field(
        default=None,
        description="Size the prefill pool with a HorizontalPodAutoscaler instead of replicas.",
    )


class HiCacheSpec(WireModel):
    """SGLang hierarchical cache (GPU -> host -> Mooncake L3) for every worker."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (
                "!(has(self.ratio) && has(self.sizeGiB))",
                "hicache: set ratio or sizeGiB, not both",
            ),
            (
                "self.storageBackend != 'mooncake' || self.memLayout != 'layer_first'",
                "hicache.storageBackend mooncake needs a page-first memLayout",
            ),
        )
    )

    enabled: bool = Field(
        default=True, description="Run HiCache (SGLang --enable-hierarchical-cache)."
    )
    ratio: float | None = Field(
        default=None,
        ge=1.0,
        le=100.0,
        description="Host pool size as a multiple of the GPU pool (--hicache-ratio; SGLang default 2).",
    )
    size_gib: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        alias="sizeGiB",
        validation_alias=AliasChoices("sizeGiB", "size_gib"),
        description="Host pool size in GiB per rank (--hicache-size); overrides ratio.",
    )
    write_policy: Literal["write_through", "write_through_selective", "write_back"] = Field(
        default="write_through",
        description="When pages are copied down a tier (--hicache-write-policy).",
    )
    io_backend: Literal["direct", "kernel"] = Field(
        default="kernel", description="GPU<->host copy engine (--hicache-io-backend)."
    )
    mem_layout: Literal[
        "layer_first", "page_first", "page_first_direct", "page_first_kv_split", "page_head"
    ] = Field(default="page_first", description="Host pool layout (--hicache-mem-layout).")
    page_size: int = Field(
        default=64,
        ge=1,
        le=4096,
        description="Tokens per KV page (SGLang --page-size); the unit stored in Mooncake.",
    )
    storage_backend: Literal["mooncake", "none"] = Field(
        default="mooncake",
        description="L3 tier (--hicache-storage-backend): mooncake (kvStore.mooncake) or none.",
    )
    prefetch_policy: Literal["best_effort", "wait_complete", "timeout"] = Field(
        default="timeout",
        description="When an L3 prefetch stops (--hicache-storage-prefetch-policy).",
    )

    @model_validator(mode="after")
    def _check_cel_equivalents(self) -> HiCacheSpec:
        require(
            not (self.ratio is not None and self.size_gib is not None),
            "hicache: set ratio or sizeGiB, not both",
        )
        require(
            self.storage_backend != "mooncake" or self.mem_layout != "layer_first",
            "hicache.storageBackend mooncake needs a page-first memLayout",
        )
        return self


EXTENDED_RESOURCE_PATTERN: Final = (
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
    r"/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
"""A vendor-qualified resource name (``nvidia.com/gpu``): Kubernetes' extended resources."""
_EXTENDED_RESOURCE: Final = re.compile(EXTENDED_RESOURCE_PATTERN)
GPU_RESOURCE_RULE: Final = (
    "self == '' || (self.matches('"
    + EXTENDED_RESOURCE_PATTERN.replace("\\", "\\\\")
    + "') && !self.startsWith('kubernetes.io/') && !self.contains('.kubernetes.io/'))"
)
GPU_RESOURCE_MESSAGE: Final = (
    "workers.gpuResource must be a vendor resource name such as nvidia.com/gpu "
    "(domain/name, outside kubernetes.io), not cpu or memory"
)


def is_extended_resource(name: str) -> bool:
    """Kubernetes' extended resources: vendor-qualified, outside the ``kubernetes.io`` domain."""
    return (
        _EXTENDED_RESOURCE.match(name) is not None
        and not name.startswith("kubernetes.io/")
        and ".kubernetes.io/" not in name
    )


MIN_STARTUP_TIMEOUT_SECONDS: Final = 60
MAX_STARTUP_TIMEOUT_SECONDS: Final = 86_400
STARTUP_ALLOWANCE_SECONDS: Final = 600
"""Added to ``workers.startupTimeoutSeconds`` for a worker Deployment's progress deadline: time to
schedule the pod and pull an SGLang image (tens of GB) before the startup probe's clock starts."""
_DEADLINE_AFTER_STARTUP = (
    "!has(self.rollout) || !has(self.rollout.progressDeadlineSeconds) "
    "|| self.rollout.progressDeadlineSeconds > self.startupTimeoutSeconds"
)
_DEADLINE_AFTER_STARTUP_MESSAGE = (
    "workers.rollout.progressDeadlineSeconds must exceed workers.startupTimeoutSeconds "
    "(a worker still loading its model would read as ProgressDeadlineExceeded)"
)


class WorkerRolloutSpec(WireModel):
    """How worker pods are replaced: one at a time, never with an extra GPU pod."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (
                "self.maxSurge + self.maxUnavailable >= 1",
                "workers.rollout: maxSurge and maxUnavailable must not both be 0",
            )
        )
    )

    max_surge: int = Field(
        default=0,
        ge=0,
        le=1000,
        description=(
            "Extra worker pods a rollout may start before old ones stop (the Deployment's "
            "maxSurge). 0 by default: a surge pod needs spare GPUs that a full pool does not have."
        ),
    )
    max_unavailable: int = Field(
        default=1,
        ge=0,
        le=1000,
        description=(
            "Workers of a pool that may be down at once: in a rollout (the Deployment's "
            "maxUnavailable) and in voluntary disruptions such as node drains (the pool's "
            "PodDisruptionBudget). 0 blocks drains until the pool is scaled up."
        ),
    )

    progress_deadline_seconds: int | None = Field(
        default=None,
        ge=MIN_STARTUP_TIMEOUT_SECONDS + 1,
        le=MAX_STARTUP_TIMEOUT_SECONDS + STARTUP_ALLOWANCE_SECONDS,
        description=(
            "Seconds a worker Deployment's rollout may make no progress before Kubernetes marks "
            "it ProgressDeadlineExceeded, which the fleet's status reports (the Deployment's "
            "progressDeadlineSeconds). Unset: workers.startupTimeoutSeconds + "
            f"{STARTUP_ALLOWANCE_SECONDS}, for scheduling and image pulls. Must exceed "
            "workers.startupTimeoutSeconds."
        ),
    )

    @model_validator(mode="after")
    def _check_cel_equivalents(self) -> WorkerRolloutSpec:
        require(
            self.max_surge + self.max_unavailable >= 1,
            "workers.rollout: maxSurge and maxUnavailable must not both be 0",
        )
        return self


class WorkersSpec(WireModel):
    """The SGLang workers: one aggregated pool, or a prefill and a decode pool."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (
                "self.mode != 'disaggregated' || (has(self.prefill) && has(self.decode))",
                "workers.mode disaggregated needs workers.prefill and workers.decode",
            ),
            (
                "self.mode != 'aggregated' || (!has(self.prefill) && !has(self.decode))",
                "workers.mode aggregated takes workers.aggregated, not prefill/decode",
            ),
            (
                "self.mode != 'disaggregated' || !has(self.aggregated)",
                "workers.mode disaggregated takes workers.prefill/decode, not aggregated",
            ),
            (_DEADLINE_AFTER_STARTUP, _DEADLINE_AFTER_STARTUP_MESSAGE),
            (
                "self.mode != 'aggregated' || " + _tp_divisible_rule("aggregated", always=True),
                tp_divisible_message("aggregated"),
            ),
            (_tp_divisible_rule("prefill", always=False), tp_divisible_message("prefill")),
            (_tp_divisible_rule("decode", always=False), tp_divisible_message("decode")),
        )
    )

    image: Image = Field(
        default=DEFAULT_WORKER_IMAGE,
        description="An SGLang image with this package's worker and Mooncake installed.",
    )
    mode: Literal["aggregated", "disaggregated"] = Field(
        default="aggregated", description="One pool, or separate prefill and decode pools."
    )
    replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="Workers in the aggregated pool, or the decode pool when disaggregated (scale subresource).",
    )
    autoscaling: PoolAutoscalingSpec | None = Field(
        default=None,
        description=(
            "Size the aggregated pool (the decode pool when disaggregated) with a "
            "HorizontalPodAutoscaler instead of replicas."
        ),
    )
    gpu_resource: str = Field(
        default="nvidia.com/gpu",
        max_length=253,
        description=(
            "Extended resource requested per tensor-parallel rank, a vendor name such as "
            "nvidia.com/gpu or amd.com/gpu (not cpu or memory); empty requests none."
        ),
        json_schema_extra=cel_rules((GPU_RESOURCE_RULE, GPU_RESOURCE_MESSAGE)),
    )
    aggregated: WorkerPoolSpec | None = Field(
        default=None, description="The aggregated pool (mode aggregated; defaults apply)."
    )
    prefill: PrefillPoolSpec | None = Field(
        default=None, description="The prefill pool (mode disaggregated)."
    )
    decode: WorkerPoolSpec | None = Field(
        default=None, description="The decode pool (mode disaggregated)."
    )
    bootstrap_port: int = Field(
        default=8998,
        ge=1,
        le=65535,
        description="Prefill workers' KV bootstrap port (SGLang --disaggregation-bootstrap-port).",
    )
    hicache: HiCacheSpec = nested(HiCacheSpec, "Hierarchical cache settings of every worker.")
    rollout: WorkerRolloutSpec = nested(
        WorkerRolloutSpec, "How worker pods are replaced and how many may be down at once."
    )
    pod: PodOptions | None = _pod_field("worker (every pool's)")
    drain_seconds: int = Field(
        default=30,
        ge=0,
        le=3600,
        description=(
            "How long a stopping worker lets its in-flight streams finish (after the router has "
            "stopped sending to it). The pod's terminationGracePeriodSeconds covers it."
        ),
    )

    nodes_per_replica: int = Field(
        default=1,
        ge=1,
        le=MAX_NODES_PER_REPLICA,
        description=(
            "Nodes each worker spans (each pool may override it). 1: a worker is one pod, and "
            "the pools are Deployments. Above 1: each worker is a LeaderWorkerSet group of this "
            "many pods, one per node, with SGLang's --nnodes/--node-rank/--dist-init-addr; "
            "tensorParallelSize must be a multiple of it. Needs the LeaderWorkerSet controller "
            "(leaderworkerset.x-k8s.io) in the cluster."
        ),
    )

    startup_timeout_seconds: int = Field(
        default=1800,
        ge=MIN_STARTUP_TIMEOUT_SECONDS,
        le=MAX_STARTUP_TIMEOUT_SECONDS,
        description=(
            "How long a started worker may take to load its model before the kubelet restarts it "
            "(the startup probe's window, rounded up to its 10 s period). The worker Deployments' "
            f"progress deadline follows: this + {STARTUP_ALLOWANCE_SECONDS} s unless "
            "workers.rollout.progressDeadlineSeconds is set."
        ),
    )

    @field_validator("gpu_resource")
    @classmethod
    def _check_gpu_resource(cls, value: str) -> str:
        require(is_extended_resource(value) or value == "", GPU_RESOURCE_MESSAGE)
        return value

    @model_validator(mode="after")
    def _check_cel_equivalents(self) -> WorkersSpec:
        pd = self.prefill is not None, self.decode is not None
        if self.mode == "disaggregated":
            require(all(pd), "workers.mode disaggregated needs workers.prefill and workers.decode")
            require(
                self.aggregated is None,
                "workers.mode disaggregated takes workers.prefill/decode, not aggregated",
            )
        else:
            require(
                not any(pd), "workers.mode aggregated takes workers.aggregated, not prefill/decode"
            )
        deadline = self.rollout.progress_deadline_seconds
        require(
            deadline is None or deadline > self.startup_timeout_seconds,
            _DEADLINE_AFTER_STARTUP_MESSAGE,
        )
        pools = {"aggregated": self.aggregated, "prefill": self.prefill, "decode": self.decode}
        for name, pool in pools.items():
            if pool is None and name == "aggregated" and self.mode == "aggregated":
                pool = WorkerPoolSpec()
            if pool is None or (name == "aggregated" and self.mode != "aggregated"):
                continue
            require(
                pool.tensor_parallel_size % self.nodes_for(pool) == 0, tp_divisible_message(name)
            )
        return self

    def nodes_for(self, pool: WorkerPoolSpec) -> int:
        """Nodes one worker of ``pool`` spans: its own ``nodesPerReplica``, else the fleet's."""
        return (
            pool.nodes_per_replica if pool.nodes_per_replica is not None else self.nodes_per_replica
        )


# --- kvStore --------------------------------------------------------------------------------------


_PINS_HOLD_NEED_BUDGET = "self.allowEviction || has(self.budgetRatio)"
_PINS_HOLD_NEED_BUDGET_MESSAGE = (
    "softPin.allowEviction false needs softPin.budgetRatio: pins that cannot be evicted must have "
    "a budget, or they can fill the pool"
)
_BUDGET_BELOW_WATERMARK = (
    "!has(self.softPin.budgetRatio) || self.softPin.budgetRatio < self.eviction.highWatermarkRatio"
)
_BUDGET_BELOW_WATERMARK_MESSAGE = (
    "softPin.budgetRatio must be below eviction.highWatermarkRatio (unpinned writes need room)"
)


class SoftPinSpec(WireModel):
    """Mooncake soft pins: how long hinted KV is protected from eviction."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (
                "self.defaultTtlSeconds <= self.maxTtlSeconds",
                "softPin.defaultTtlSeconds must not exceed softPin.maxTtlSeconds",
            ),
            (_PINS_HOLD_NEED_BUDGET, _PINS_HOLD_NEED_BUDGET_MESSAGE),
        )
    )

    default_ttl_seconds: int = Field(
        default=1800,
        ge=1,
        le=MAX_SOFT_PIN_TTL_SECONDS,
        description="Soft-pin TTL when a write asks for none (--default_kv_soft_pin_ttl).",
    )
    max_ttl_seconds: int = Field(
        default=MAX_SOFT_PIN_TTL_SECONDS,
        ge=LARGEST_HINT_TTL_SECONDS,
        le=MAX_SOFT_PIN_TTL_SECONDS,
        description=(
            "Longest soft pin a write may ask for (--max_kv_soft_pin_ttl); at least "
            f"{LARGEST_HINT_TTL_SECONDS}, the longest hint TTL the frontend emits, at most 86400."
        ),
    )
    allow_eviction: bool = Field(
        default=True,
        description=(
            "Evict soft-pinned objects once pinned data passes the high watermark "
            "(--allow_evict_soft_pinned_objects); false makes pins hold and needs budgetRatio."
        ),
    )
    budget_ratio: float | None = Field(
        default=None,
        gt=0.0,
        lt=1.0,
        description=(
            "Retention budget: the share of the pool's capacity pinned objects may hold. "
            "Enforced by the workers' retention plugin: each worker pins at most this share of "
            "the segment it contributes and writes further retained pages unpinned (counted in "
            "kvretention_l3_pages_total). The operator also reports pins against it "
            "(status.kvStore, the RetentionBudget condition, metrics and an alert)."
        ),
    )

    @model_validator(mode="after")
    def _check_cel_equivalents(self) -> SoftPinSpec:
        require(
            self.default_ttl_seconds <= self.max_ttl_seconds,
            "softPin.defaultTtlSeconds must not exceed softPin.maxTtlSeconds",
        )
        require(
            self.allow_eviction or self.budget_ratio is not None, _PINS_HOLD_NEED_BUDGET_MESSAGE
        )
        return self


class EvictionSpec(WireModel):
    """When the Mooncake master evicts, and how much."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (
                "self.ratio < self.highWatermarkRatio",
                "eviction.ratio must be below eviction.highWatermarkRatio",
            )
        )
    )

    high_watermark_ratio: float = Field(
        default=0.9,
        gt=0.0,
        le=1.0,
        description="Pool fill ratio that triggers eviction (--eviction_high_watermark_ratio).",
    )
    ratio: float = Field(
        default=0.05,
        gt=0.0,
        lt=1.0,
        description="Fraction of objects evicted per round (--eviction_ratio).",
    )

    @model_validator(mode="after")
    def _check_cel_equivalents(self) -> EvictionSpec:
        require(
            self.ratio < self.high_watermark_ratio,
            "eviction.ratio must be below eviction.highWatermarkRatio",
        )
        return self


class MooncakeMasterSpec(WireModel):
    """The managed ``mooncake_master`` (mode managed)."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules((_BUDGET_BELOW_WATERMARK, _BUDGET_BELOW_WATERMARK_MESSAGE))
    )

    image: Image = Field(
        default=DEFAULT_WORKER_IMAGE,
        description="Image with the mooncake_master binary (the worker image ships it).",
    )
    resources: ResourceRequirements | None = Field(
        default=None, description="Master container resources."
    )
    rpc_port: int = Field(default=50051, ge=1, le=65535, description="Master RPC port.")
    metrics_port: int = Field(
        default=9003, ge=1, le=65535, description="Master metrics port (/metrics)."
    )
    metadata_port: int = Field(
        default=8080,
        ge=1,
        le=65535,
        description="HTTP metadata server port (transfer-engine metadata at /metadata).",
    )
    lease_ttl_milliseconds: int = Field(
        default=10_000,
        ge=1,
        le=3_600_000,
        description="How long a read lease protects an object (--default_kv_lease_ttl).",
    )
    eviction: EvictionSpec = nested(EvictionSpec, "Eviction thresholds.")
    soft_pin: SoftPinSpec = nested(SoftPinSpec, "Soft-pin TTLs used for retention hints.")
    pod: PodOptions | None = _pod_field("Mooncake master")

    @model_validator(mode="after")
    def _check_cel_equivalents(self) -> MooncakeMasterSpec:
        budget = self.soft_pin.budget_ratio
        require(
            budget is None or budget < self.eviction.high_watermark_ratio,
            _BUDGET_BELOW_WATERMARK_MESSAGE,
        )
        return self


class TransferSpec(WireModel):
    """How workers move KV to and from the Mooncake pool."""

    protocol: Literal["tcp", "rdma"] = Field(
        default="tcp", description="Mooncake transfer-engine protocol."
    )
    device: str = Field(
        default="",
        max_length=1024,
        description="RDMA device names, comma separated (empty: let Mooncake choose).",
    )
    global_segment_size: str = Field(
        default="4gb",
        max_length=32,
        pattern=r"^[1-9][0-9]*(gb)?$",
        description="Host memory each worker contributes to the pool: bytes or '<N>gb'; split across TP ranks.",
    )


_PORT_OF_ADDRESS: Final = "int(self.substring(self.lastIndexOf(':') + 1))"
_MASTER_PORT_RULE: Final = (
    f"!self.matches('^.*:[0-9]{{1,5}}$') || "
    f"({_PORT_OF_ADDRESS} >= 1 && {_PORT_OF_ADDRESS} <= 65535)"
)
MASTER_PORT_MESSAGE: Final = "kvStore.mooncake.external.masterAddress port must be 1-65535"


class ExternalMooncakeSpec(WireModel):
    """An existing Mooncake master (mode external)."""

    master_address: str = Field(
        min_length=3,
        max_length=512,
        pattern=r"^[A-Za-z0-9.\-\[\]:]+:[0-9]{1,5}$",
        description="host:port of the external mooncake_master RPC endpoint (port 1-65535).",
        json_schema_extra=cel_rules((_MASTER_PORT_RULE, MASTER_PORT_MESSAGE)),
    )
    metadata_server: str = Field(
        default="P2PHANDSHAKE",
        min_length=1,
        max_length=1024,
        description="Transfer-engine metadata server: P2PHANDSHAKE or an http://.../metadata URL.",
    )
    tenant: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        pattern=r"^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$",
        description=(
            "Mooncake tenant the workers write as (the store client's tenant_id). On a master run "
            "with --enable_multi_tenants each tenant is its own key namespace with its own byte "
            "quota (a tenant at its quota evicts its own unpinned objects), so fleets sharing the "
            "store cannot evict each other; the master's quota policy must name the tenant or "
            "every write is refused. Unset: Mooncake's default tenant."
        ),
    )
    metrics_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description=(
            "The external master's --metrics_port, on masterAddress's host. Set it so a worker "
            "that restarts counts the soft pins its earlier run may have left against "
            "softPin.budgetRatio (read from the master's /metrics); unset, a restarted worker "
            "can pass the budget by its own share until those pins end."
        ),
    )

    @field_validator("master_address")
    @classmethod
    def _check_master_port(cls, value: str) -> str:
        port = value.rpartition(":")[2]
        require(not port.isdigit() or 1 <= int(port) <= 65535, MASTER_PORT_MESSAGE)
        return value


class MooncakeSpec(WireModel):
    """The Mooncake store that holds HiCache's L3 pages."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (
                "self.mode != 'external' || has(self.external)",
                "kvStore.mooncake.mode external needs kvStore.mooncake.external.masterAddress",
            ),
            (
                "self.mode != 'managed' || !has(self.external)",
                "kvStore.mooncake.mode managed must not set kvStore.mooncake.external",
            ),
        )
    )

    mode: Literal["managed", "external"] = Field(
        default="managed",
        description="managed: the operator runs a master; external: workers use external.masterAddress.",
    )
    master: MooncakeMasterSpec = nested(MooncakeMasterSpec, "The managed master (mode managed).")
    transfer: TransferSpec = nested(TransferSpec, "Worker-side transfer settings.")
    external: ExternalMooncakeSpec | None = Field(
        default=None, description="The external master (mode external)."
    )

    @model_validator(mode="after")
    def _check_cel_equivalents(self) -> MooncakeSpec:
        if self.mode == "external":
            require(
                self.external is not None,
                "kvStore.mooncake.mode external needs kvStore.mooncake.external.masterAddress",
            )
        else:
            require(
                self.external is None,
                "kvStore.mooncake.mode managed must not set kvStore.mooncake.external",
            )
        return self


class KvStoreSpec(WireModel):
    """The L3 KV store."""

    mooncake: MooncakeSpec = nested(MooncakeSpec, "Mooncake store settings.")


# --- network policies -----------------------------------------------------------------------------

_NetworkPolicyPeer = Annotated[
    dict[str, Any],
    Field(
        description="One Kubernetes NetworkPolicyPeer (podSelector, namespaceSelector, ipBlock)."
    ),
]


class NetworkPolicySpec(WireModel):
    """Ingress NetworkPolicies: each component is reachable only by the components that call it."""

    enabled: bool = Field(
        default=True,
        description=(
            "Render a NetworkPolicy per component: clients -> frontend, frontend -> router, router "
            "-> workers, workers <-> workers (PD and Mooncake transfers), workers -> Mooncake "
            "master. Needs a CNI that enforces NetworkPolicy; false renders none."
        ),
    )
    clients_from: list[_NetworkPolicyPeer] = Field(
        default_factory=list,
        max_length=16,
        description="Who may reach the frontend's port. Empty: anyone (it is the entry point).",
    )
    metrics_from: list[_NetworkPolicyPeer] = Field(
        default_factory=list,
        max_length=16,
        description=(
            "Who may scrape /metrics (e.g. the monitoring namespace): every component's HTTP port "
            "and the Mooncake master's metrics port. Empty: no one besides the callers above."
        ),
    )


# --- spec -----------------------------------------------------------------------------------------

_HINTS_NEED_L3 = (
    "(self.hints.policy != 'Required' && !self.hints.providers.openai && "
    "!self.hints.providers.anthropic) || (self.workers.hicache.enabled && "
    "self.workers.hicache.writePolicy != 'write_back' && "
    "self.workers.hicache.storageBackend == 'mooncake')"
)
_HINTS_NEED_L3_MESSAGE = (
    "retention hints (hints.policy Required or any hints.providers enabled) need "
    "workers.hicache.enabled true, a write-through writePolicy and storageBackend mooncake"
)


_DEFAULT_TTL_FITS: Final = (
    "!has(self.hints.defaultTtlSeconds) || "
    "self.hints.defaultTtlSeconds <= self.kvStore.mooncake.master.softPin.maxTtlSeconds"
)
_DEFAULT_TTL_FITS_MESSAGE: Final = (
    "hints.defaultTtlSeconds must not exceed kvStore.mooncake.master.softPin.maxTtlSeconds"
)


_ZERO_ALLOWED = "!has({a}) || {a}.minReplicas > 0 || {a}.allowScaleToZero"
_NO_ZERO_WHILE_RETAINED = (
    "(self.hints.policy != 'Required' && !self.hints.providers.openai && "
    "!self.hints.providers.anthropic && !has(self.hints.defaultTtlSeconds)) || ("
    "(self.workers.mode != 'aggregated' || "
    + _ZERO_ALLOWED.format(a="self.workers.autoscaling")
    + ") && (!has(self.workers.prefill) || "
    + _ZERO_ALLOWED.format(a="self.workers.prefill.autoscaling")
    + "))"
)
_NO_ZERO_WHILE_RETAINED_MESSAGE = (
    "autoscaling.minReplicas 0 on a pool that retains hinted prefixes (aggregated or prefill) "
    "drops them all with its last worker: set autoscaling.allowScaleToZero to accept that"
)


class KvRetentionDeploymentSpec(WireModel):
    """A hinted SGLang/Mooncake fleet: frontend, router, workers and the KV store."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (_HINTS_NEED_L3, _HINTS_NEED_L3_MESSAGE),
            (_DEFAULT_TTL_FITS, _DEFAULT_TTL_FITS_MESSAGE),
            (_NO_ZERO_WHILE_RETAINED, _NO_ZERO_WHILE_RETAINED_MESSAGE),
        )
    )

    model: ModelSpec = Field(description="The model the fleet serves.")
    hints: HintsSpec = nested(HintsSpec, "KV retention hints.")
    frontend: FrontendSpec = nested(FrontendSpec, "The HTTP frontend.")
    router: RouterSpec = nested(RouterSpec, "The router.")
    workers: WorkersSpec = nested(WorkersSpec, "The SGLang workers.")
    kv_store: KvStoreSpec = nested(KvStoreSpec, "The L3 KV store.")
    network_policy: NetworkPolicySpec = nested(
        NetworkPolicySpec, "Which pods may reach each component (NetworkPolicies)."
    )

    @model_validator(mode="after")
    def _check_cel_equivalents(self) -> KvRetentionDeploymentSpec:
        h = self.workers.hicache
        wired = h.enabled and h.write_policy != "write_back" and h.storage_backend == "mooncake"
        require(not self.hints.active() or wired, _HINTS_NEED_L3_MESSAGE)
        ttl = self.hints.default_ttl_seconds
        require(
            ttl is None or ttl <= self.kv_store.mooncake.master.soft_pin.max_ttl_seconds,
            _DEFAULT_TTL_FITS_MESSAGE,
        )
        retaining = [self.workers.prefill.autoscaling if self.workers.prefill else None]
        if self.workers.mode == "aggregated":
            retaining.append(self.workers.autoscaling)
        hints_on = self.hints.active() or self.hints.default_ttl_seconds is not None
        require(
            not hints_on
            or all(a is None or a.min_replicas > 0 or a.allow_scale_to_zero for a in retaining),
            _NO_ZERO_WHILE_RETAINED_MESSAGE,
        )
        return self
