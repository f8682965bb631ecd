"""``spec.kvStore``: the Mooncake store, managed (master, soft pins, eviction) or external."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from kvretention.api.base import WireModel, cel_config, cel_rules, nested, port_field, require
from kvretention.api.spec_shared import (
    DEFAULT_WORKER_IMAGE,
    LARGEST_HINT_TTL_SECONDS,
    MAX_SOFT_PIN_TTL_SECONDS,
    UNSET_REQUESTS,
    Fraction,
    Image,
    PodOptions,
    ResourceRequirements,
    Share,
    SoftPinTtlSeconds,
    _pod_field,
)

__all__ = [
    "MASTER_PORT_MESSAGE",
    "EvictionSpec",
    "ExternalMooncakeSpec",
    "KvStoreSpec",
    "MooncakeMasterSpec",
    "MooncakeSpec",
    "SoftPinSpec",
    "TransferSpec",
]


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


_DEFAULT_TTL_MESSAGE = "softPin.defaultTtlSeconds must not exceed softPin.maxTtlSeconds"


class SoftPinSpec(WireModel):
    """Mooncake soft pins: how long hinted KV is protected from eviction."""

    model_config = cel_config(
        ("self.defaultTtlSeconds <= self.maxTtlSeconds", _DEFAULT_TTL_MESSAGE),
        (_PINS_HOLD_NEED_BUDGET, _PINS_HOLD_NEED_BUDGET_MESSAGE),
    )

    default_ttl_seconds: SoftPinTtlSeconds = Field(
        default=1800,
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
    budget_ratio: Fraction | None = Field(
        default=None,
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
        require(self.default_ttl_seconds <= self.max_ttl_seconds, _DEFAULT_TTL_MESSAGE)
        require(
            self.allow_eviction or self.budget_ratio is not None, _PINS_HOLD_NEED_BUDGET_MESSAGE
        )
        return self


_EVICTION_RATIO_MESSAGE = "eviction.ratio must be below eviction.highWatermarkRatio"


class EvictionSpec(WireModel):
    """When the Mooncake master evicts, and how much."""

    model_config = cel_config(("self.ratio < self.highWatermarkRatio", _EVICTION_RATIO_MESSAGE))

    high_watermark_ratio: Share = Field(
        default=0.9,
        description="Pool fill ratio that triggers eviction (--eviction_high_watermark_ratio).",
    )
    ratio: Fraction = Field(
        default=0.05,
        description="Fraction of objects evicted per round (--eviction_ratio).",
    )

    @model_validator(mode="after")
    def _check_cel_equivalents(self) -> EvictionSpec:
        require(self.ratio < self.high_watermark_ratio, _EVICTION_RATIO_MESSAGE)
        return self


class MooncakeMasterSpec(WireModel):
    """The managed ``mooncake_master`` (mode managed)."""

    model_config = cel_config((_BUDGET_BELOW_WATERMARK, _BUDGET_BELOW_WATERMARK_MESSAGE))

    image: Image = Field(
        default=DEFAULT_WORKER_IMAGE,
        description="Image with the mooncake_master binary (the worker image ships it).",
    )
    resources: ResourceRequirements | None = Field(
        default=None, description="Master container resources. " + UNSET_REQUESTS
    )
    rpc_port: int = port_field(50051, "Master RPC port.")
    metrics_port: int = port_field(9003, "Master metrics port (/metrics).")
    metadata_port: int = port_field(
        8080, "HTTP metadata server port (transfer-engine metadata at /metadata)."
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
    metrics_port: int | None = port_field(
        None,
        (
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


_EXTERNAL_NEEDS_ADDRESS_MESSAGE = (
    "kvStore.mooncake.mode external needs kvStore.mooncake.external.masterAddress"
)
_MANAGED_NO_EXTERNAL_MESSAGE = (
    "kvStore.mooncake.mode managed must not set kvStore.mooncake.external"
)


class MooncakeSpec(WireModel):
    """The Mooncake store that holds HiCache's L3 pages."""

    model_config = cel_config(
        ("self.mode != 'external' || has(self.external)", _EXTERNAL_NEEDS_ADDRESS_MESSAGE),
        ("self.mode != 'managed' || !has(self.external)", _MANAGED_NO_EXTERNAL_MESSAGE),
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
            require(self.external is not None, _EXTERNAL_NEEDS_ADDRESS_MESSAGE)
        else:
            require(self.external is None, _MANAGED_NO_EXTERNAL_MESSAGE)
        return self


class KvStoreSpec(WireModel):
    """The L3 KV store."""

    mooncake: MooncakeSpec = nested(MooncakeSpec, "Mooncake store settings.")
