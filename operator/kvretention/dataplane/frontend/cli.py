"""``kvretention frontend``: serve the OpenAI and Anthropic APIs in front of a router."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import cast

import click

from kvretention.common.kv_retain import MAX_PRIORITY
from kvretention.common.trace import TRACE_ENV, trace_from_env
from kvretention.dataplane.cli_options import (
    choice_option,
    host_option,
    seconds_option,
    switch_option,
)
from kvretention.dataplane.frontend.app import create_app
from kvretention.dataplane.frontend.auth import (
    DEFAULT_RELOAD_S,
    HOP_KEYS,
    Gate,
    KeysError,
    KeyStore,
)
from kvretention.dataplane.frontend.config import (
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_UPSTREAM_TIMEOUT,
    REMEMBERED_CONVERSATIONS,
    FrontendConfig,
)
from kvretention.dataplane.frontend.errors import Provider
from kvretention.dataplane.frontend.limits import LimitPolicy, parse_limits, parse_tenant_limits
from kvretention.dataplane.frontend.metrics import FrontendMetrics
from kvretention.dataplane.frontend.placing import PlacingClient, build_placing
from kvretention.dataplane.frontend.tokenizer import (
    ChatTokenizer,
    TokenizerUnavailable,
    load_tokenizer,
)
from kvretention.dataplane.gc_tuning import tune_gc
from kvretention.dataplane.hop_key import hop_key_file_option, load_hop_key_file
from kvretention.dataplane.http import metrics_port_option, serve_until_signal
from kvretention.dataplane.router.discovery import DiscoveryError
from kvretention.dataplane.router.placement import POLICIES, Policy
from kvretention.dataplane.session_keys import session_keys_option
from kvretention.hints.envelope import MAX_TTL_SECONDS
from kvretention.ports import FRONTEND_PORT


@click.command("frontend")
@host_option
@click.option("--port", default=FRONTEND_PORT, show_default=True, type=click.IntRange(0, 65535))
@metrics_port_option
@click.option(
    "--router-url",
    default=None,
    envvar="KVR_ROUTER_URL",
    help="Base URL of the router (POST {router}/v1/generate, GET {router}/healthz). Give this "
    "or --worker/--worker-dns.",
)
@click.option(
    "--worker",
    "workers",
    multiple=True,
    help="Place requests in this process and send each straight to a worker (one HTTP hop, the "
    "router's placement): an aggregated worker's URL (repeatable).",
)
@click.option(
    "--worker-dns",
    multiple=True,
    help="As --worker, the aggregated workers' headless Service as host:port (repeatable).",
)
@choice_option(
    "policy",
    POLICIES,
    help_="With --worker/--worker-dns: placement without a session pin, as the router's --policy.",
)
@click.option(
    "--kv-residency",
    is_flag=True,
    default=False,
    help="With --worker/--worker-dns: read each worker's /kv/residency with its health poll and "
    "send a session without a pin to the worker whose engine holds most of its tokens.",
)
@click.option(
    "--model",
    "models",
    multiple=True,
    help="A served model name (repeatable); others get a 404. None given: any name is accepted.",
)
@click.option(
    "--model-alias",
    "aliases",
    multiple=True,
    envvar="KVR_MODEL_ALIASES",
    metavar="ALIAS=SERVED",
    help="Another name for a served model (repeatable; env: space-separated). The router gets "
    "SERVED; answers echo ALIAS. An ALIAS with '*' is a pattern ('*' is any run of characters: "
    "claude-*=SERVED takes every Claude model name); exact aliases win, then patterns in order.",
)
@seconds_option(
    "--body-timeout",
    DEFAULT_BODY_TIMEOUT,
    "Seconds a request body may take to arrive; a stalled body gets a 408.",
)
@click.option(
    "--max-body-bytes",
    default=DEFAULT_MAX_BODY_BYTES,
    show_default=True,
    type=click.IntRange(1),
    help="Larger request bodies get a 413.",
)
@seconds_option(
    "--upstream-timeout",
    DEFAULT_UPSTREAM_TIMEOUT,
    "Seconds to wait for the router to connect and for each streamed read (504 after).",
)
@click.option(
    "--trace-file",
    default=None,
    help=f"Append one JSONL record per finished request here (or set {TRACE_ENV}).",
)
@click.option(
    "--tokenizer",
    "tokenizer_path",
    default=None,
    help="HF tokenizer path: apply the chat template here and send token ids (needs transformers).",
)
@switch_option(
    "openai-hints",
    envvar="KVR_HINTS_OPENAI",
    help_="Turn OpenAI prompt_cache_options into KV hints; off: the fields are accepted and ignored.",
)
@switch_option(
    "anthropic-hints",
    envvar="KVR_HINTS_ANTHROPIC",
    help_="Turn Anthropic top-level cache_control into KV hints; off: accepted and ignored.",
)
@session_keys_option(
    "Where a request's session is found, in order, comma-separated: header names or "
    "metadata.<field> of the body. The first present pins the conversation to a worker. "
    "Empty: no session affinity."
)
@switch_option(
    "prefix-routing",
    help_="Send the router the prompt's prefix-hash chain for cache-aware placement.",
)
@switch_option(
    "normalize-clients",
    envvar="KVR_NORMALIZE_CLIENTS",
    help_="Drop Claude Code's per-request billing-header system block before templating.",
)
@choice_option(
    "breakpoints",
    ["prefix", "reject"],
    help_="Block-level cache breakpoints: retain the prompt up to the end of each marked block "
    "(prefix, resolved to token offsets by the worker), or refuse them with the provider's 400 "
    "(reject, the v1 contract).",
)
@click.option(
    "--hint-priority",
    type=click.IntRange(1, MAX_PRIORITY),
    default=50,
    show_default=True,
    help="Priority of the retention asked for (kv.retain).",
)
@click.option(
    "--default-ttl-seconds",
    type=click.IntRange(1, MAX_TTL_SECONDS),
    default=None,
    help="Fleet policy: retain the prompt of requests with no cache control for this long "
    "(traced as policy, not client intent). Default: off.",
)
@click.option(
    "--auth-keys-dir",
    "auth_keys_dirs",
    multiple=True,
    envvar="KVR_AUTH_KEYS_DIRS",
    type=click.Path(file_okay=False, path_type=Path),
    help="Turn auth on: a directory of API keys (a mounted Secret: one file per tenant, named "
    "by the tenant, one key per line; docs/auth.md). Repeatable (env: space-separated). "
    "Re-read when it changes. None: no auth (every request is served, as one tenant).",
)
@click.option(
    "--auth-reload-seconds",
    default=DEFAULT_RELOAD_S,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="How often the key directories are checked for changes.",
)
@click.option(
    "--tenant-limits",
    "tenant_default_limits",
    default="",
    envvar="KVR_TENANT_LIMITS",
    help="Each tenant's default limits, e.g. 'rps=5,burst=10,concurrency=4' (any subset; "
    "empty: unlimited). Past them: the provider's 429 with retry-after. Needs auth.",
)
@click.option(
    "--tenant-limit",
    "tenant_limit_overrides",
    multiple=True,
    metavar="TENANT:LIMITS",
    help="One tenant's own limits in place of the defaults, e.g. 'team-a:rps=50,concurrency=16' "
    "(repeatable).",
)
@click.option(
    "--codex-instructions-file",
    "codex_instructions_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    envvar="KVR_CODEX_INSTRUCTIONS_FILE",
    help="Serve Codex's model catalog (model_catalog_url = <frontend>/v1/models) with this "
    "file's text as every model's base_instructions, which Codex sends in place of its own "
    "prompt. Unset: Codex's catalog request gets a 404 and Codex keeps its built-in prompt.",
)
@click.option(
    "--remembered-conversations",
    "remembered_conversations",
    type=click.IntRange(min=1),
    default=REMEMBERED_CONVERSATIONS,
    show_default=True,
    envvar="KVR_REMEMBERED_CONVERSATIONS",
    help="Agent conversations whose last request stays parsed, so that the next one parses only "
    "its new messages. Each costs about 15x its body in memory (~3 MB for a 200 KB agent "
    "conversation); past this many live conversations every request is parsed whole, at about "
    "5x the CPU (watch kvretention_frontend_conversation_items_total).",
)
@hop_key_file_option
@click.option("--log-level", default="info", show_default=True)
def frontend_cmd(
    host: str,
    port: int,
    metrics_port: int | None,
    router_url: str | None,
    workers: tuple[str, ...],
    worker_dns: tuple[str, ...],
    policy: str,
    kv_residency: bool,
    models: tuple[str, ...],
    aliases: tuple[str, ...],
    body_timeout: float,
    max_body_bytes: int,
    upstream_timeout: float,
    trace_file: str | None,
    tokenizer_path: str | None,
    openai_hints: bool,
    anthropic_hints: bool,
    session_keys: tuple[str, ...],
    prefix_routing: bool,
    normalize_clients: bool,
    breakpoints: str,
    hint_priority: int,
    default_ttl_seconds: int | None,
    auth_keys_dirs: tuple[Path, ...],
    auth_reload_seconds: float,
    tenant_default_limits: str,
    tenant_limit_overrides: tuple[str, ...],
    codex_instructions_file: Path | None,
    remembered_conversations: int,
    hop_key_file: Path | None,
    log_level: str,
) -> None:
    """Serve /v1/chat/completions, /v1/responses and /v1/messages, turning cache controls into KV hints."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    tokenizer: ChatTokenizer | None = None
    if tokenizer_path:
        try:
            tokenizer = load_tokenizer(tokenizer_path)
        except TokenizerUnavailable as exc:
            raise click.UsageError(str(exc)) from exc
    upstream = _placing(
        router_url, workers, worker_dns, cast(Policy, policy), kv_residency, upstream_timeout
    )
    config = FrontendConfig(
        router_url=router_url or "",
        served_models=models,
        model_aliases=parse_aliases(aliases, served=models),
        body_timeout=body_timeout,
        max_body_bytes=max_body_bytes,
        upstream_timeout=upstream_timeout,
        hint_providers=frozenset(
            provider
            for provider, enabled in (
                (Provider.OPENAI, openai_hints),
                (Provider.ANTHROPIC, anthropic_hints),
            )
            if enabled
        ),
        session_keys=session_keys,
        prefix_routing=prefix_routing,
        normalize_clients=normalize_clients,
        breakpoints="reject" if breakpoints == "reject" else "prefix",
        hint_priority=hint_priority,
        default_ttl_seconds=default_ttl_seconds,
        remembered_conversations=remembered_conversations,
        codex_instructions=(
            codex_instructions_file.read_text(encoding="utf-8")
            if codex_instructions_file is not None
            else None
        ),
    )
    gate = build_gate(
        auth_keys_dirs,
        reload_s=auth_reload_seconds,
        default_limits=tenant_default_limits,
        overrides=tenant_limit_overrides,
    )
    trace = trace_from_env(trace_file, component="frontend")
    metrics = FrontendMetrics()
    if upstream is not None:  # the placement's own metrics, as the router serves them
        metrics.registry.register(upstream.state.metrics.registry)
    app = create_app(
        config, trace=trace, tokenizer=tokenizer, gate=gate, metrics=metrics, upstream=upstream
    )
    hop_keys = load_hop_key_file(hop_key_file)
    if hop_keys is not None:
        app[HOP_KEYS] = hop_keys
    logging.getLogger("kvretention.frontend").info(
        "frontend on %s:%d -> %s (models: %s)",
        host,
        port,
        f"router {router_url}" if upstream is None else "workers placed in this process",
        ", ".join(models) or "any",
    )
    tune_gc()
    asyncio.run(
        serve_until_signal(
            app, host=host, port=port, metrics_port=metrics_port, shutdown_timeout=5.0
        )
    )


def _placing(
    router_url: str | None,
    workers: tuple[str, ...],
    worker_dns: tuple[str, ...],
    policy: Policy,
    kv_residency: bool,
    timeout: float,
) -> PlacingClient | None:
    """The frontend's own placement, or None to go through ``--router-url``: exactly one."""
    if bool(router_url) == bool(workers or worker_dns):
        raise click.UsageError("give --router-url or --worker/--worker-dns (exactly one)")
    if kv_residency and router_url:
        raise click.UsageError(
            "--kv-residency needs --worker/--worker-dns (the router has its own)"
        )
    try:
        return build_placing(
            workers, worker_dns, policy=policy, kv_residency=kv_residency, timeout=timeout
        )
    except DiscoveryError as exc:
        raise click.UsageError(str(exc)) from exc


def build_gate(
    directories: tuple[Path, ...],
    *,
    reload_s: float,
    default_limits: str = "",
    overrides: tuple[str, ...] = (),
) -> Gate | None:
    """The auth gate for ``--auth-keys-dir`` (None without one); a key set that cannot be used
    or malformed limits stop startup with a usage error."""
    try:
        policy = LimitPolicy(
            default=parse_limits(default_limits), tenants=parse_tenant_limits(overrides)
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--tenant-limits/--tenant-limit") from None
    if not directories:
        if default_limits.strip() or overrides:
            raise click.UsageError("--tenant-limits and --tenant-limit need --auth-keys-dir")
        return None
    try:
        keys = KeyStore(directories, reload_s=reload_s)
    except KeysError as exc:
        raise click.BadParameter(str(exc), param_hint="--auth-keys-dir") from None
    return Gate(keys=keys, limits=policy)


def parse_aliases(values: tuple[str, ...], *, served: tuple[str, ...]) -> Mapping[str, str]:
    """``ALIAS=SERVED`` pairs -> a mapping; SERVED must be a ``--model`` when any is given."""
    aliases: dict[str, str] = {}
    for value in values:
        alias, sep, target = value.partition("=")
        alias, target = alias.strip(), target.strip()
        if not sep or not alias or not target:
            raise click.BadParameter(f"{value!r} is not ALIAS=SERVED", param_hint="--model-alias")
        if served and target not in served:
            raise click.BadParameter(
                f"{target!r} is not a served model (--model {', '.join(served)})",
                param_hint="--model-alias",
            )
        if alias in served:
            raise click.BadParameter(
                f"{alias!r} is already a served model name", param_hint="--model-alias"
            )
        aliases[alias] = target
    return aliases
