"""The SGLang server arguments of each worker role (what follows ``--`` in ``kvretention worker``).

Flag names are SGLang 0.5.23's (``sglang/srt/arg_groups/fields/*.py``; a field ``x_y`` is ``--x-y``).
``--host``/``--port`` are not passed: the worker process owns the pod's port and embeds the engine,
and SGLang derives internal ZMQ ports from its own ``--port``, which must not collide with ours.
The ``--disaggregation-*`` flags are not here: the worker adds them from its own ``--role``,
``--bootstrap-port`` and ``--ib-device`` (``build_worker_command``), so they are decided once.
Decode workers get no HiCache flags: in PD serving the prompt is prefilled (and retained) on the
prefill side, and SGLang keeps decode's radix cache off by default.

Retention (``docs/operator.md``): when hints are on, the pools that retain (aggregated, prefill) run
``--radix-eviction-policy kvretain``, the policy the retention plugin adds. The user's own choices
win: an ``extraArgs`` eviction policy, or a ``SGLANG_PLUGINS`` in ``workers.pod.env`` that leaves
the plugin out, means the operator renders no ``kvretain`` (SGLang would refuse the choice without
the plugin) and ``RetentionApplied`` says why. The operator sets no ``SGLANG_PLUGINS`` itself: in
SGLang 0.5.23 it is a whitelist (comma-separated names; unset loads every installed plugin, ours
included), and setting it would silently stop the image's other plugins, out-of-tree platform
plugins among them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from kvretention.api.models import KvRetentionDeploymentSpec, WorkerPoolSpec
from kvretention.api.names import Role
from kvretention.controller.resources.sglang_cli import SglangArgsError, parse_sglang_args
from kvretention.retention import EVICTION_POLICY, PLUGIN_NAME

EVICTION_POLICY_FLAG: Final = "--radix-eviction-policy"
EVICTION_POLICY_DEST: Final = "radix_eviction_policy"
PLUGINS_ENV: Final = "SGLANG_PLUGINS"
"""SGLang's plugin whitelist (``sglang/srt/plugins/__init__.py``): comma-separated entry-point
names, blanks ignored; unset or empty loads every plugin installed in the image."""
RETAINING_ROLES: Final[tuple[Role, ...]] = ("aggregated", "prefill")
"""The roles whose radix cache holds retained prefixes (decode's is off in PD serving)."""
EVICTION_POLICY_OVERRIDDEN: Final = "EvictionPolicyOverridden"
PLUGIN_NOT_SELECTED_REASON: Final = "PluginNotSelected"

MANAGED_FLAGS: Final = frozenset(
    {
        "--model-path",
        "--served-model-name",
        "--tp-size",
        "--tensor-parallel-size",
        "--host",
        "--port",
        "--enable-metrics",
        "--page-size",
        "--enable-hierarchical-cache",
        "--enable-hicache",
        "--hicache-ratio",
        "--hicache-size",
        "--hicache-write-policy",
        "--hicache-io-backend",
        "--hicache-mem-layout",
        "--hicache-storage-backend",
        "--hicache-storage-prefetch-policy",
        "--hicache-storage-backend-extra-config",
        "--disaggregation-mode",
        "--disaggregation-bootstrap-port",
        "--disaggregation-transfer-backend",
        "--disaggregation-ib-device",
        "--tool-call-parser",
        "--reasoning-parser",
        "--nnodes",
        "--node-rank",
        "--dist-init-addr",
        "--nccl-init-addr",
    }
)
"""Flags the operator renders from the spec, or the worker adds for its role (``--disaggregation-*``);
``extraArgs`` may not set them (``check_spec``)."""


def pool_for(spec: KvRetentionDeploymentSpec, role: Role) -> WorkerPoolSpec:
    """The pool settings of a role (the aggregated pool defaults when omitted)."""
    workers = spec.workers
    pool = {"aggregated": workers.aggregated, "prefill": workers.prefill, "decode": workers.decode}[
        role
    ]
    return pool if pool is not None else WorkerPoolSpec()


def build_hicache_args(spec: KvRetentionDeploymentSpec) -> list[str]:
    """HiCache and L3 storage flags (empty when HiCache is off)."""
    h = spec.workers.hicache
    if not h.enabled:
        return []
    args = ["--enable-hierarchical-cache"]
    if h.size_gib is not None:
        args += ["--hicache-size", str(h.size_gib)]
    elif h.ratio is not None:
        args += ["--hicache-ratio", repr(h.ratio)]
    args += [
        "--hicache-write-policy",
        h.write_policy,
        "--hicache-io-backend",
        h.io_backend,
        "--hicache-mem-layout",
        h.mem_layout,
    ]
    if h.storage_backend == "mooncake":
        args += [
            "--hicache-storage-backend",
            "mooncake",
            "--hicache-storage-prefetch-policy",
            h.prefetch_policy,
        ]
    return args


def build_parser_args(spec: KvRetentionDeploymentSpec) -> list[str]:
    """The output parsers: SGLang's own flags, which the worker reads to parse tool calls and
    reasoning with SGLang's parsers (engine and worker agree on one source)."""
    args: list[str] = []
    if spec.model.tool_call_parser is not None:
        args += ["--tool-call-parser", spec.model.tool_call_parser]
    if spec.model.reasoning_parser is not None:
        args += ["--reasoning-parser", spec.model.reasoning_parser]
    return args


def user_eviction_policy(extra_args: list[str]) -> str | None:
    """The ``--radix-eviction-policy`` value ``extraArgs`` sets, read as SGLang reads it (an
    abbreviation counts; the last one wins), else None. Unparsable extras set nothing here:
    ``check_spec`` refuses them."""
    try:
        options = parse_sglang_args(extra_args)
    except SglangArgsError:
        return None
    value = None
    for opt in options:
        if opt.dest != EVICTION_POLICY_DEST or opt.index < 0:
            continue
        token = extra_args[opt.index]
        if "=" in token:
            value = token.split("=", 1)[1]
        elif opt.index + 1 < len(extra_args):
            value = extra_args[opt.index + 1]
    return value


def user_plugins_env(spec: KvRetentionDeploymentSpec) -> Mapping[str, Any] | None:
    """The ``SGLANG_PLUGINS`` EnvVar in ``workers.pod.env`` (the worker container gets it), if any."""
    pod = spec.workers.pod
    for env in pod.env if pod is not None else []:
        if env.get("name") == PLUGINS_ENV:
            return env
    return None


def plugin_selected(env: Mapping[str, Any] | None) -> bool | None:
    """Whether SGLang, run with this ``SGLANG_PLUGINS`` EnvVar, loads the retention plugin: parsed
    as SGLang parses it; None when the value comes from ``valueFrom`` (unknown here)."""
    if env is None:
        return True
    if "value" not in env and env.get("valueFrom") is not None:
        return None
    names = {name.strip() for name in str(env.get("value") or "").split(",") if name.strip()}
    return not names or PLUGIN_NAME in names


@dataclass(frozen=True)
class RetentionWiring:
    """How the workers are wired for the retention plugin: what ``RetentionApplied`` reads
    besides the probe reports."""

    hints: bool = False
    """Some request can carry ``kv.retain`` (:func:`retention_requested`)."""
    blocked_reason: str | None = None
    """Why the operator renders no ``kvretain`` policy although hints are on (the user's setting
    wins): :data:`EVICTION_POLICY_OVERRIDDEN` or :data:`PLUGIN_NOT_SELECTED_REASON`."""
    blocked_message: str = ""


def retention_requested(spec: KvRetentionDeploymentSpec) -> bool:
    """Whether any request can carry ``kv.retain``: a provider's cache controls are turned into
    hints (``hints.active()``), or the fleet's ``defaultTtlSeconds`` retains requests that carry
    no cache control (applied by the frontend whatever the provider switches say)."""
    return spec.hints.active() or spec.hints.default_ttl_seconds is not None


def plan_retention(spec: KvRetentionDeploymentSpec) -> RetentionWiring:
    """Hints on or off, and the user's setting (if any) that keeps the plugin's policy out."""
    if not retention_requested(spec):
        return RetentionWiring()
    env = spec.workers.pod.env if spec.workers.pod is not None else []
    plugins = user_plugins_env(spec)
    selected = plugin_selected(plugins)
    if not selected:
        index = next(i for i, e in enumerate(env) if e.get("name") == PLUGINS_ENV)
        given = (
            "from valueFrom, which the operator cannot read"
            if selected is None
            else f"to {str((plugins or {}).get('value'))!r}, which leaves out {PLUGIN_NAME}"
        )
        return RetentionWiring(
            hints=True,
            blocked_reason=PLUGIN_NOT_SELECTED_REASON,
            blocked_message=(
                f"spec.workers.pod.env[{index}] sets {PLUGINS_ENV} {given}: SGLang would not "
                f"load the retention plugin, so the workers run without {EVICTION_POLICY_FLAG} "
                f"{EVICTION_POLICY} and kv.retain is not applied; list {PLUGIN_NAME} in it"
            ),
        )
    for role in _retaining_roles(spec):
        policy = user_eviction_policy(list(pool_for(spec, role).extra_args))
        if policy is not None and policy != EVICTION_POLICY:
            return RetentionWiring(
                hints=True,
                blocked_reason=EVICTION_POLICY_OVERRIDDEN,
                blocked_message=(
                    f"spec.workers.{role}.extraArgs sets {EVICTION_POLICY_FLAG} {policy}, which "
                    f"takes precedence over the plugin's {EVICTION_POLICY}: the device and host "
                    "tiers evict retained prefixes like any other; drop it to apply kv.retain"
                ),
            )
    return RetentionWiring(hints=True)


def _retaining_roles(spec: KvRetentionDeploymentSpec) -> tuple[Role, ...]:
    if spec.workers.mode == "disaggregated":
        return ("prefill",)
    return ("aggregated",)


def build_retention_args(spec: KvRetentionDeploymentSpec, *, role: Role) -> list[str]:
    """``--radix-eviction-policy kvretain`` where the plugin applies ``kv.retain``: hints on, a
    pool that retains, and no user setting that keeps the plugin or its policy out."""
    if role not in RETAINING_ROLES or not retention_requested(spec):
        return []
    if not plugin_selected(user_plugins_env(spec)):
        return []
    if user_eviction_policy(list(pool_for(spec, role).extra_args)) is not None:
        return []
    return [EVICTION_POLICY_FLAG, EVICTION_POLICY]


def build_sglang_args(spec: KvRetentionDeploymentSpec, *, role: Role) -> list[str]:
    """The SGLang argv of one role: model, parallelism, cache, retention, then the user's extras."""
    pool = pool_for(spec, role)
    args = [
        "--model-path",
        spec.model.path,
        "--served-model-name",
        spec.model.name,
        "--tp-size",
        str(pool.tensor_parallel_size),
        "--page-size",
        str(spec.workers.hicache.page_size),
        "--enable-metrics",
    ]
    args += build_parser_args(spec)
    if role != "decode":
        args += build_hicache_args(spec)
    args += build_retention_args(spec, role=role)
    return args + list(pool.extra_args)
