"""``kvretention worker``: load the engine, serve the router's protocol, drain on SIGTERM.

Everything after ``--`` is passed to SGLang as server arguments, for example::

    kvretention worker --engine sglang --port 8002 -- --model-path Qwen/Qwen3-0.6B --tp-size 1 \\
        --enable-hierarchical-cache --hicache-storage-backend mooncake \\
        --tool-call-parser qwen25 --reasoning-parser qwen3

The worker reads two of those SGLang flags itself: ``--tool-call-parser NAME`` and
``--reasoning-parser NAME`` (``--flag NAME`` or ``--flag=NAME``) select SGLang's own output
parsers, so engine and worker agree; a name SGLang does not know stops the worker at start with the
list of valid names. Without them the answer's text is passed through unparsed. The stand-in
engine takes the same argv (``--model-path`` naming a local tokenizer directory).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import cast

import click

from kvretention.api.names import Role
from kvretention.common.hop_auth import HopKeyFile
from kvretention.common.trace import trace_from_env
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
from kvretention.dataplane.worker.app import WorkerMetrics, WorkerState, build_app, drain
from kvretention.dataplane.worker.cpu.flags import DeviceChoice
from kvretention.dataplane.worker.engine import (
    EngineLoadError,
    build_sglang_argv,
    load_engine,
)
from kvretention.dataplane.worker.kv_feed import ResidencyFeed, kv_events_argv
from kvretention.dataplane.worker.planning import DEFAULT_THREADS
from kvretention.dataplane.worker.render_cache import DEFAULT_MAX_BYTES
from kvretention.ports import WORKER_PORT, free_port
from kvretention.retention.failures import prepare_stats_dir

log = logging.getLogger("kvretention.worker")


@click.command("worker", context_settings={"ignore_unknown_options": True})
@host_option
@port_option(WORKER_PORT)
@metrics_port_option
@click.option(
    "--engine",
    "engine_spec",
    default="sglang",
    show_default=True,
    help="'sglang' (the real engine) or 'standin:none|flat|versioned' (no GPU, for tests).",
)
@choice_option(
    "device",
    ["auto", "cuda", "cpu"],
    help_="Where --engine sglang runs: auto is the GPU when torch sees one, else SGLang's CPU engine "
    "(torch-native attention, no HiCache: docs/cpu-engine.md).",
)
@choice_option(
    "role",
    ["aggregated", "prefill", "decode"],
    help_="This worker's place in the fleet; prefill/decode add SGLang's disaggregation flags "
    "(mode, Mooncake transfer backend, bootstrap port, RDMA device) unless given after --.",
)
@click.option(
    "--bootstrap-host",
    default=None,
    help="Host decode workers use to reach this prefill worker's bootstrap server "
    "(default: the address the router reaches this worker at).",
)
@bootstrap_port_option(
    "This prefill worker's KV bootstrap port (SGLang --disaggregation-bootstrap-port)."
)
@click.option(
    "--ib-device",
    default=None,
    help="RDMA device(s) for prefill/decode KV transfers (SGLang --disaggregation-ib-device).",
)
@click.option(
    "--drain-seconds",
    type=float,
    default=30.0,
    show_default=True,
    help="On SIGTERM, how long in-flight streams may take to finish.",
)
@click.option(
    "--trace-file",
    default=None,
    help="Append one JSONL record per request (default: $KVR_REQUEST_TRACE, else off).",
)
@click.option(
    "--render-cache-mb",
    type=click.IntRange(0),
    default=DEFAULT_MAX_BYTES // (1024 * 1024),
    show_default=True,
    help="Memory for each conversation's previous prompt tokens, reused when its next prompt "
    "extends it (least recently used conversations go first; 0: tokenize every prompt whole).",
)
@click.option(
    "--planning-threads",
    type=click.IntRange(1),
    default=DEFAULT_THREADS,
    show_default=True,
    help="Requests rendered and tokenized at once, shared round-robin by tenants (one tenant "
    "holds all but one of them at most): a huge prompt does not hold up a small one.",
)
@click.option(
    "--kv-events",
    is_flag=True,
    default=False,
    help="Have SGLang publish its KV events on a free loopback port and serve the blocks they "
    "say are resident, per tenant salt and session, on GET /kv/residency (--engine sglang only).",
)
@hop_key_file_option
@log_level_option
@click.argument("server_args", nargs=-1, type=click.UNPROCESSED)
def worker_cmd(
    host: str,
    port: int,
    metrics_port: int | None,
    engine_spec: str,
    device: str,
    role: str,
    bootstrap_host: str | None,
    bootstrap_port: int | None,
    ib_device: str | None,
    drain_seconds: float,
    trace_file: str | None,
    render_cache_mb: int,
    planning_threads: int,
    kv_events: bool,
    hop_key_file: Path | None,
    log_level: str,
    server_args: tuple[str, ...],
) -> None:
    """Serve one SGLang engine (or the stand-in) behind the router."""
    configure_logging(log_level)
    typed_role = cast(Role, role)
    hop_keys = load_hop_key_file(hop_key_file)  # before the engine loads: a bad file stops it now
    argv = build_sglang_argv(
        server_args, role=typed_role, bootstrap_port=bootstrap_port, ib_device=ib_device
    )
    residency = None
    if kv_events:
        if engine_spec != "sglang":
            raise click.UsageError("--kv-events needs --engine sglang (the stand-in has no cache)")
        try:
            argv, endpoint = kv_events_argv(argv, port=free_port())
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        residency = ResidencyFeed(endpoint)
    asyncio.run(
        _serve(
            host=host,
            port=port,
            metrics_port=metrics_port,
            engine_spec=engine_spec,
            device=cast(DeviceChoice, device),
            role=typed_role,
            server_argv=argv,
            bootstrap_host=bootstrap_host,
            bootstrap_port=bootstrap_port,
            drain_seconds=drain_seconds,
            trace_file=trace_file,
            render_cache_bytes=render_cache_mb * 1024 * 1024,
            planning_threads=planning_threads,
            hop_keys=hop_keys,
            residency=residency,
        )
    )


def _exit_while_loading(signum: int, _frame: object) -> None:
    log.info("signal %d while the engine loads: exiting", signum)
    raise SystemExit(128 + signum)


async def _serve(
    *,
    host: str,
    port: int,
    metrics_port: int | None,
    engine_spec: str,
    device: DeviceChoice,
    role: Role,
    server_argv: list[str],
    bootstrap_host: str | None,
    bootstrap_port: int | None,
    drain_seconds: float,
    trace_file: str | None,
    render_cache_bytes: int,
    planning_threads: int,
    hop_keys: HopKeyFile | None,
    residency: ResidencyFeed | None,
) -> None:
    # Before the engine spawns its scheduler: the child inherits the directory and the retention
    # plugin there writes its failure counts to it, which this process's /metrics exports.
    stats_dir = prepare_stats_dir()
    # Loading takes from seconds to minutes, and the serving loop's signal handlers come after it:
    # until then SIGTERM must stop the worker (as a container's PID 1 it would be ignored).
    signal.signal(signal.SIGTERM, _exit_while_loading)
    if residency is not None:
        residency.start()  # subscribed before the engine publishes its first batch
    try:
        engine = load_engine(engine_spec, server_argv=server_argv, role=role, device=device)
    except EngineLoadError as exc:
        raise click.ClickException(str(exc)) from exc
    log.info(
        "engine %s loaded on %s, kv_hints dialect %s, role %s",
        engine.name,
        engine.device or "no device (stand-in)",
        engine.dialect,
        role,
    )
    state = WorkerState(
        engine=engine,
        role=role,
        bootstrap_host=bootstrap_host,
        bootstrap_port=bootstrap_port,
        trace=trace_from_env(trace_file, component="worker"),
        render_cache_bytes=render_cache_bytes,
        planning_threads=planning_threads,
        metrics=WorkerMetrics(retention_stats_dir=stats_dir),
        hop_keys=hop_keys,
        residency=residency,
    )
    tune_gc()  # after the engine and its tokenizer loaded: they are frozen, never rescanned

    async def drain_in_flight() -> None:
        # Whatever drain_seconds says (0 included), new work is refused from here on (503, and
        # /readyz 503), and what is still in flight at the deadline is cancelled at once.
        log.info("draining %d in-flight request(s) for up to %.1fs", state.inflight, drain_seconds)
        if not await drain(state, deadline_s=drain_seconds):
            log.warning("drain deadline passed with %d request(s) in flight", state.inflight)

    try:
        await serve_until_signal(
            build_app(state),
            host=host,
            port=port,
            metrics_port=metrics_port,
            shutdown_timeout=0.0,  # the drain was their time: no second grace after it
            on_listening=lambda: log.info("worker listening on %s:%d", host, port),
            before_close=drain_in_flight,
        )
    finally:
        engine.shutdown()
        if residency is not None:
            residency.stop()
        if state.trace is not None:
            state.trace.close()
