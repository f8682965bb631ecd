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
from typing import cast

import click

from kvretention.api.names import Role
from kvretention.dataplane.gc_tuning import tune_gc
from kvretention.dataplane.http import serve_until_signal
from kvretention.dataplane.trace import trace_from_env
from kvretention.dataplane.worker.app import WorkerState, build_app, drain
from kvretention.dataplane.worker.engine import (
    EngineLoadError,
    build_sglang_argv,
    load_engine,
)
from kvretention.dataplane.worker.render_cache import DEFAULT_MAX_BYTES
from kvretention.ports import WORKER_PORT

log = logging.getLogger("kvretention.worker")


@click.command("worker", context_settings={"ignore_unknown_options": True})
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--port", default=WORKER_PORT, show_default=True, type=int, help="Port to listen on.")
@click.option(
    "--engine",
    "engine_spec",
    default="sglang",
    show_default=True,
    help="'sglang' (the real engine) or 'standin:none|flat|versioned' (no GPU, for tests).",
)
@click.option(
    "--role",
    type=click.Choice(["aggregated", "prefill", "decode"]),
    default="aggregated",
    show_default=True,
    help="This worker's place in the fleet; prefill/decode add SGLang's disaggregation flags "
    "(mode, Mooncake transfer backend, bootstrap port, RDMA device) unless given after --.",
)
@click.option(
    "--bootstrap-host",
    default=None,
    help="Host decode workers use to reach this prefill worker's bootstrap server "
    "(default: the address the router reaches this worker at).",
)
@click.option(
    "--bootstrap-port",
    type=int,
    default=None,
    help="This prefill worker's KV bootstrap port (SGLang --disaggregation-bootstrap-port).",
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
@click.option("--log-level", default="INFO", show_default=True)
@click.argument("server_args", nargs=-1, type=click.UNPROCESSED)
def worker_cmd(
    host: str,
    port: int,
    engine_spec: str,
    role: str,
    bootstrap_host: str | None,
    bootstrap_port: int | None,
    ib_device: str | None,
    drain_seconds: float,
    trace_file: str | None,
    render_cache_mb: int,
    log_level: str,
    server_args: tuple[str, ...],
) -> None:
    """Serve one SGLang engine (or the stand-in) behind the router."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    typed_role = cast(Role, role)
    argv = build_sglang_argv(
        server_args, role=typed_role, bootstrap_port=bootstrap_port, ib_device=ib_device
    )
    asyncio.run(
        _serve(
            host=host,
            port=port,
            engine_spec=engine_spec,
            role=typed_role,
            server_argv=argv,
            bootstrap_host=bootstrap_host,
            bootstrap_port=bootstrap_port,
            drain_seconds=drain_seconds,
            trace_file=trace_file,
            render_cache_bytes=render_cache_mb * 1024 * 1024,
        )
    )


async def _serve(
    *,
    host: str,
    port: int,
    engine_spec: str,
    role: Role,
    server_argv: list[str],
    bootstrap_host: str | None,
    bootstrap_port: int | None,
    drain_seconds: float,
    trace_file: str | None,
    render_cache_bytes: int,
) -> None:
    try:
        engine = load_engine(engine_spec, server_argv=server_argv, role=role)
    except EngineLoadError as exc:
        raise click.ClickException(str(exc)) from exc
    log.info("engine %s loaded, kv_hints dialect %s, role %s", engine.name, engine.dialect, role)
    state = WorkerState(
        engine=engine,
        role=role,
        bootstrap_host=bootstrap_host,
        bootstrap_port=bootstrap_port,
        trace=trace_from_env(trace_file, component="worker"),
        render_cache_bytes=render_cache_bytes,
    )
    tune_gc()  # after the engine and its tokenizer loaded: they are frozen, never rescanned

    async def drain_in_flight() -> None:
        log.info("draining %d in-flight request(s) for up to %.1fs", state.inflight, drain_seconds)
        if not await drain(state, deadline_s=drain_seconds):
            log.warning("drain deadline passed with %d request(s) in flight", state.inflight)

    try:
        await serve_until_signal(
            build_app(state),
            host=host,
            port=port,
            shutdown_timeout=1.0,
            on_listening=lambda: log.info("worker listening on %s:%d", host, port),
            before_close=drain_in_flight,
        )
    finally:
        engine.shutdown()
        if state.trace is not None:
            state.trace.close()
