"""What a user declares: the ``KvRetentionDeployment`` spec models, the single source of the CRD's
``spec`` schema.

Field names are snake_case in Python and camelCase on the wire (aliases). Every field carries a
description (``kubectl explain`` shows it), bounds and a default where one is safe. Cross-field rules
live next to the model they constrain as CEL (``x-kubernetes-validations``); pydantic enforces the
same rules for ``render`` and tests through validators, so a CR file is judged the same way with or
without an API server.

Its parts, one module per part of the spec along the CRD's own sections: the shared pod options
(:mod:`~kvretention.api.spec_shared`), ``model``, ``hints``, ``frontend`` and ``router``,
``workers``, ``kvStore``, ``networkPolicies`` and ``gateway`` (``spec_*.py``). This module holds
the whole spec, :class:`KvRetentionDeploymentSpec`, with the rules that cross its parts, and names
every model.
"""

from __future__ import annotations

from typing import Final

from pydantic import (
    Field,
    model_validator,
)

from kvretention.api.base import WireModel, cel_config, nested, require
from kvretention.api.spec_frontend import (
    AuthSpec,
    FrontendSpec,
    RouterSpec,
    ServiceSpec,
    SessionAffinity,
    SessionKey,
    TenantLimitsOverride,
    TenantLimitsSpec,
    TenantName,
)
from kvretention.api.spec_hints import (
    HintProviders,
    HintsSpec,
)
from kvretention.api.spec_kvstore import (
    MASTER_PORT_MESSAGE,
    EvictionSpec,
    ExternalMooncakeSpec,
    KvStoreSpec,
    MooncakeMasterSpec,
    MooncakeSpec,
    SoftPinSpec,
    TransferSpec,
)
from kvretention.api.spec_model import (
    ModelAlias,
    ModelSpec,
    ModelVolume,
    ReasoningParserName,
    ToolCallParser,
)
from kvretention.api.spec_network import (
    FRONTEND_PODS_SUFFIX,
    PICKER_MAX_NAME_LENGTH,
    PICKER_NAME_MESSAGE,
    EndpointPickerSpec,
    GatewaySpec,
    InferencePoolSpec,
    NetworkPolicySpec,
)
from kvretention.api.spec_shared import (
    DEFAULT_IMAGE,
    DEFAULT_SERVICE_REQUESTS,
    DEFAULT_WORKER_IMAGE,
    LARGEST_HINT_TTL_SECONDS,
    MAX_NAME_LENGTH,
    MAX_SOFT_PIN_TTL_SECONDS,
    LocalObjectReference,
    PodOptions,
    Quantity,
    ResourceRequirements,
    Toleration,
)
from kvretention.api.spec_shared import (
    IMAGE_MESSAGE as IMAGE_MESSAGE,
)
from kvretention.api.spec_workers import (
    EXTENDED_RESOURCE_PATTERN,
    GPU_RESOURCE_MESSAGE,
    GPU_RESOURCE_RULE,
    MAX_NODES_PER_REPLICA,
    MAX_STARTUP_TIMEOUT_SECONDS,
    MIN_STARTUP_TIMEOUT_SECONDS,
    STARTUP_ALLOWANCE_SECONDS,
    ExtraArg,
    HiCacheSpec,
    PoolAutoscalingSpec,
    PrefillPoolSpec,
    WorkerPoolSpec,
    WorkerRolloutSpec,
    WorkersSpec,
    is_extended_resource,
)

__all__ = [
    "DEFAULT_IMAGE",
    "DEFAULT_SERVICE_REQUESTS",
    "DEFAULT_WORKER_IMAGE",
    "EXTENDED_RESOURCE_PATTERN",
    "FRONTEND_PODS_SUFFIX",
    "GPU_RESOURCE_MESSAGE",
    "GPU_RESOURCE_RULE",
    "LARGEST_HINT_TTL_SECONDS",
    "MASTER_PORT_MESSAGE",
    "MAX_NAME_LENGTH",
    "MAX_NODES_PER_REPLICA",
    "MAX_SOFT_PIN_TTL_SECONDS",
    "MAX_STARTUP_TIMEOUT_SECONDS",
    "MIN_STARTUP_TIMEOUT_SECONDS",
    "PICKER_MAX_NAME_LENGTH",
    "PICKER_NAME_MESSAGE",
    "STARTUP_ALLOWANCE_SECONDS",
    "AuthSpec",
    "EndpointPickerSpec",
    "EvictionSpec",
    "ExternalMooncakeSpec",
    "ExtraArg",
    "FrontendSpec",
    "GatewaySpec",
    "HiCacheSpec",
    "HintProviders",
    "HintsSpec",
    "InferencePoolSpec",
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


_FRONTEND_PLACES_AGGREGATED: Final = (
    "self.router.placement != 'Frontend' || self.workers.mode == 'aggregated'"
)
_FRONTEND_PLACES_AGGREGATED_MESSAGE: Final = (
    "router.placement Frontend places on aggregated workers only: a prefill/decode pair "
    "needs the router's bootstrap rooms (use router.placement Router)"
)


class KvRetentionDeploymentSpec(WireModel):
    """A hinted SGLang/Mooncake fleet: frontend, router, workers and the KV store."""

    model_config = cel_config(
        (_HINTS_NEED_L3, _HINTS_NEED_L3_MESSAGE),
        (_DEFAULT_TTL_FITS, _DEFAULT_TTL_FITS_MESSAGE),
        (_NO_ZERO_WHILE_RETAINED, _NO_ZERO_WHILE_RETAINED_MESSAGE),
        (_FRONTEND_PLACES_AGGREGATED, _FRONTEND_PLACES_AGGREGATED_MESSAGE),
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
    gateway: GatewaySpec = nested(
        GatewaySpec, "Gateway API objects through which a cluster's Gateway reaches the fleet."
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
        require(
            self.router.placement != "Frontend" or self.workers.mode == "aggregated",
            _FRONTEND_PLACES_AGGREGATED_MESSAGE,
        )
        return self
