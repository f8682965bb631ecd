"""``kvretention router``: place requests on workers and stream their answers back.

Aggregated::

    kvretention router --worker http://w0:8002 --worker http://w1:8002
    kvretention router --worker-dns workers.ns.svc.cluster.local:8002

Disaggregated (one prefill and one decode worker per request, sharing a bootstrap room)::

    kvretention router --prefill-dns prefill.ns.svc:8002 --decode-dns decode.ns.svc:8002

Also the Gateway's endpoint picker (Envoy ext_proc) over the fleet's frontends::

    kvretention router --worker-dns ... --ext-proc-port 9004 --endpoint-dns frontends.ns.svc:8000
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import cast

import click

from kvretention.dataplane.cli_options import (
    bootstrap_port_option,
    choice_option,
    configure_logging,
    host_option,
    log_level_option,
    port_option,
)
from kvretention.dataplane.gc_tuning import tune_gc
from kvretention.dataplane.hop_key import hop_key_file_option, load_hop_key_file
from kvretention.dataplane.http import metrics_port_option, serve_until_signal
from kvretention.dataplane.router.app import RouterConfig, RouterState, build_app
from kvretention.dataplane.router.discovery import DiscoveryError, build_endpoints, build_sources
from kvretention.dataplane.router.health import DEFAULT_EJECT_AFTER
from kvretention.dataplane.router.placement import (
    DEFAULT_MAX_PREFIXES,
    DEFAULT_MAX_SESSIONS,
    POLICIES,
    Policy,
)
from kvretention.dataplane.session_keys import session_keys_option
from kvretention.ports import ROUTER_PORT

log = logging.getLogger("kvretention.router")


@click.command("router")
@host_option
@port_option(ROUTER_PORT)
@metrics_port_option
@click.option("--worker", "workers", multiple=True, help="Aggregated worker URL (repeatable).")
@click.option(
    "--worker-dns", multiple=True, help="Aggregated workers' headless Service as host:port."
)
@click.option("--prefill-worker", "prefill", multiple=True, help="Prefill worker URL (repeatable).")
@click.option("--decode-worker", "decode", multiple=True, help="Decode worker URL (repeatable).")
@click.option("--prefill-dns", multiple=True, help="Prefill workers' headless Service host:port.")
@click.option("--decode-dns", multiple=True, help="Decode workers' headless Service host:port.")
@bootstrap_port_option(
    "Prefill bootstrap port to use when a prefill worker's /v1/info does not report one."
)
@click.option("--health-interval", type=float, default=2.0, show_default=True)
@click.option("--health-timeout", type=float, default=1.0, show_default=True)
@click.option(
    "--eject-after",
    type=click.IntRange(1),
    default=DEFAULT_EJECT_AFTER,
    show_default=True,
    help="Failed polls in a row, with no request answered in between, that take a worker out of "
    "rotation (a refused connection or a not-ready answer does at once; a pool's last worker is "
    "never taken out for slowness alone).",
)
@click.option("--dns-interval", type=float, default=5.0, show_default=True)
@click.option("--connect-timeout", type=float, default=5.0, show_default=True)
@click.option(
    "--read-timeout",
    type=float,
    default=600.0,
    show_default=True,
    help="Longest silence between two streamed chunks before the request fails.",
)
@click.option("--max-sessions", type=int, default=DEFAULT_MAX_SESSIONS, show_default=True)
@choice_option(
    "policy",
    POLICIES,
    help_="Placement without a session pin: the worker most likely to hold the prompt's longest "
    "prefix (with a load guard), or simply the least outstanding.",
)
@click.option(
    "--max-prefixes",
    type=click.IntRange(1),
    default=DEFAULT_MAX_PREFIXES,
    show_default=True,
    help="Prefix hashes the cache-aware index remembers (least recently used go first).",
)
@click.option(
    "--kv-residency",
    is_flag=True,
    default=False,
    help="Fetch each worker's /kv/residency with its health poll (workers run with --kv-events) "
    "and send a session without a pin to the worker whose engine holds most of its tokens.",
)
@click.option(
    "--ext-proc-port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="Serve Envoy ext_proc (gRPC) here as a Gateway API Inference Extension endpoint picker "
    "that chooses among the frontends (--endpoint/--endpoint-dns); 0: off.",
)
@click.option(
    "--endpoint", "endpoints", multiple=True, help="Frontend the picker may choose (repeatable)."
)
@click.option(
    "--endpoint-dns",
    multiple=True,
    help="Frontends' headless Service as host:port, for the picker (repeatable).",
)
@session_keys_option(
    "Where the endpoint picker finds a request's session, in order (header names or "
    "metadata.<field> of the body): give the frontends' own --session-keys."
)
@hop_key_file_option
@log_level_option
def router_cmd(
    host: str,
    port: int,
    metrics_port: int | None,
    workers: tuple[str, ...],
    worker_dns: tuple[str, ...],
    prefill: tuple[str, ...],
    decode: tuple[str, ...],
    prefill_dns: tuple[str, ...],
    decode_dns: tuple[str, ...],
    bootstrap_port: int | None,
    health_interval: float,
    health_timeout: float,
    eject_after: int,
    dns_interval: float,
    connect_timeout: float,
    read_timeout: float,
    max_sessions: int,
    policy: str,
    max_prefixes: int,
    kv_residency: bool,
    ext_proc_port: int,
    endpoints: tuple[str, ...],
    endpoint_dns: tuple[str, ...],
    session_keys: tuple[str, ...],
    hop_key_file: Path | None,
    log_level: str,
) -> None:
    """Route PreprocessedRequests to workers: sticky sessions, least outstanding, PD pairs."""
    configure_logging(log_level)
    try:
        sources = build_sources(
            workers=workers,
            worker_dns=worker_dns,
            prefill=prefill,
            prefill_dns=prefill_dns,
            decode=decode,
            decode_dns=decode_dns,
        )
        frontends = build_endpoints(static=endpoints, dns=endpoint_dns)
    except DiscoveryError as exc:
        raise click.UsageError(str(exc)) from exc
    if bool(ext_proc_port) != (frontends is not None):
        raise click.UsageError(
            "--ext-proc-port and --endpoint/--endpoint-dns go together (the picker's frontends)"
        )
    config = RouterConfig(
        health_interval_s=health_interval,
        health_timeout_s=health_timeout,
        eject_after=eject_after,
        dns_interval_s=dns_interval,
        connect_timeout_s=connect_timeout,
        read_timeout_s=read_timeout,
        bootstrap_port=bootstrap_port,
        max_sessions=max_sessions,
        policy=cast(Policy, policy),
        max_prefixes=max_prefixes,
        kv_residency=kv_residency,
        ext_proc_host=host,
        ext_proc_port=ext_proc_port,
        session_keys=session_keys,
    )
    tune_gc()
    state = RouterState(
        sources=sources,
        config=config,
        hop_keys=load_hop_key_file(hop_key_file),
        endpoints=frontends,
    )
    asyncio.run(_serve(state, host=host, port=port, metrics_port=metrics_port))


async def _serve(state: RouterState, *, host: str, port: int, metrics_port: int | None) -> None:
    def listening() -> None:
        log.info(
            "router listening on %s:%d (%s), %d worker(s) known",
            host,
            port,
            "disaggregated" if state.disaggregated else "aggregated",
            len(state.workers),
        )

    await serve_until_signal(
        build_app(state),
        host=host,
        port=port,
        metrics_port=metrics_port,
        shutdown_timeout=5.0,
        on_listening=listening,
    )
