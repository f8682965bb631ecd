"""The SGLang server arguments of each worker role (what follows ``--`` in ``kvretention worker``).

Flag names are SGLang 0.5.23's (``sglang/srt/arg_groups/fields/*.py``; a field ``x_y`` is ``--x-y``).
``--host``/``--port`` are not passed: the worker process owns the pod's port and embeds the engine,
and SGLang derives internal ZMQ ports from its own ``--port``, which must not collide with ours.
The ``--disaggregation-*`` flags are not here: the worker adds them from its own ``--role``,
``--bootstrap-port`` and ``--ib-device`` (``build_worker_command``), so they are decided once.
Decode workers get no HiCache flags: in PD serving the prompt is prefilled (and retained) on the
prefill side, and SGLang keeps decode's radix cache off by default.
"""

from __future__ import annotations

from typing import Final

from kvretention.api.models import KvRetentionDeploymentSpec, WorkerPoolSpec
from kvretention.api.names import Role

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


def build_sglang_args(spec: KvRetentionDeploymentSpec, *, role: Role) -> list[str]:
    """The SGLang argv of one role: model, parallelism, cache, then the user's extras."""
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
    return args + list(pool.extra_args)
