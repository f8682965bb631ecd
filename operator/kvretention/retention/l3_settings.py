"""The L3 (Mooncake) half of the retention plugin: its settings, read from the ``kvretention``
section of the Mooncake config file the operator renders (:data:`SETTINGS_KEY`)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

logger = logging.getLogger("kvretention.retention.l3")

SETTINGS_KEY: Final = "kvretention"
"""Section of the worker's Mooncake config file (``mooncake.json``) the plugin reads; SGLang's
``MooncakeStoreConfig.from_file`` ignores keys it does not know."""
CONFIG_PATH_ENV: Final = "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH"
DEFAULT_MAX_PIN_TTL_MS: Final = 86_400_000
"""``mooncake_master``'s own default ``--max_kv_soft_pin_ttl`` (24 h)."""


@dataclass(frozen=True, slots=True)
class L3Settings:
    """What the operator renders for the plugin beside SGLang's Mooncake config."""

    budget_ratio: float | None = None
    """Share of its own segment a store client may hold pinned; None: no budget."""
    max_pin_ttl_ms: int = DEFAULT_MAX_PIN_TTL_MS
    """The master's ``--max_kv_soft_pin_ttl``: a longer pin would be refused, so pins are capped."""
    metrics_url: str | None = None
    """The managed master's ``/metrics`` (from the file's ``master_server_address`` host and
    ``master_metrics_port``); None for an external master without ``external.metricsPort``."""
    tenant_share: float | None = None
    """Share of the client's budget one tenant may hold pinned; None: no per-tenant cap."""

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> L3Settings:
        """From a parsed ``mooncake.json``; a missing or malformed section keeps the defaults (the
        plugin must never stop a worker from serving)."""
        url = master_metrics_url(config)
        section = config.get(SETTINGS_KEY)
        if not isinstance(section, Mapping):
            return cls(metrics_url=url)
        ratio = section.get("pin_budget_ratio")
        ttl = section.get("max_pin_ttl_ms")
        share = section.get("tenant_pin_share")
        budget = float(ratio) if isinstance(ratio, int | float) and 0 <= ratio <= 1 else None
        max_ttl = ttl if isinstance(ttl, int) and ttl > 0 else DEFAULT_MAX_PIN_TTL_MS
        tenant_share = float(share) if isinstance(share, int | float) and 0 < share <= 1 else None
        return cls(
            budget_ratio=budget, max_pin_ttl_ms=max_ttl, metrics_url=url, tenant_share=tenant_share
        )

    def to_config(self) -> dict[str, Any]:
        """The ``kvretention`` section as the operator renders it."""
        out: dict[str, Any] = {"max_pin_ttl_ms": self.max_pin_ttl_ms}
        if self.budget_ratio is not None:
            out["pin_budget_ratio"] = self.budget_ratio
        if self.tenant_share is not None:
            out["tenant_pin_share"] = self.tenant_share
        return out


def master_metrics_url(config: Mapping[str, Any]) -> str | None:
    """``http://<master host>:<master_metrics_port>/metrics``, as the operator renders a managed
    master's client config; None when either is missing or malformed."""
    address = config.get("master_server_address")
    port = config.get("master_metrics_port")
    if not isinstance(address, str) or not isinstance(port, int) or isinstance(port, bool):
        return None
    host = address.rsplit(":", 1)[0] if ":" in address else address
    if not host or not 0 < port < 65536:
        return None
    return f"http://{host}:{port}/metrics"


def read_settings(environ: Mapping[str, str] | None = None) -> L3Settings:
    """The settings from the file SGLang's Mooncake backend reads (``CONFIG_PATH_ENV``)."""
    path = (os.environ if environ is None else environ).get(CONFIG_PATH_ENV)
    if not path:
        return L3Settings()
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as err:
        logger.warning("kvretention: cannot read %s (%s); L3 pins use defaults", path, err)
        return L3Settings()
    return L3Settings.from_config(config if isinstance(config, Mapping) else {})
