"""``kvretention operator``: the operator process.

Starts health and metrics endpoints, waits for the leader Lease (unless ``--no-leader-elect``),
waits for the CRD to be served, then runs the watches of :mod:`kvretention.controller.watch` (kopf
for the custom resources, the informers for their children and pods) and the reconcile work queue. Losing the Lease exits with
status 1 so Kubernetes restarts the pod as a standby; SIGTERM releases the Lease and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import click
from aiohttp import web

from kvretention.api.models import GROUP, PLURAL, VERSION
from kvretention.controller.executor import Controller
from kvretention.controller.kube import Kube, load_config
from kvretention.controller.leader import (
    DEFAULT_LEASE_DURATION_S,
    LeaderElector,
    LeadershipLost,
    default_identity,
    election_timings,
)
from kvretention.controller.metrics import Metrics
from kvretention.controller.watch import Watches
from kvretention.dataplane.cli_options import log_level_option, switch_option
from kvretention.dataplane.http import Readiness, add_metrics, add_probes, start_site
from kvretention.ports import OPERATOR_HEALTH_PORT, OPERATOR_METRICS_PORT

log = logging.getLogger("kvretention.operator")

CRD_POLL_SECONDS = 2.0
KOPF_STOP_TIMEOUT_S = 10.0
DEFAULT_WORKERS = 8
API_PING_AFTER_S = 5.0
"""Ask the API server for ``/version`` when nothing else has reached it for this long (the Lease
renewal every 2 s and the reconciles usually have, so an idle operator costs one request in 5 s)."""
API_STALE_AFTER_S = 15.0
"""``/readyz`` is 503 once the API server's last answer is older than this."""
KUBE_THREADS = 32
"""API calls run in threads (the kubernetes client is synchronous); reconciles apply their
children concurrently, so the default pool (cores + 4 threads) would serialize them."""


@dataclass(frozen=True)
class OperatorConfig:
    """The command line, validated."""

    namespaces: tuple[str, ...] = ()
    """The watched namespaces; none: every namespace."""
    health_port: int = OPERATOR_HEALTH_PORT
    metrics_port: int = OPERATOR_METRICS_PORT
    leader_elect: bool = True
    leader_election_namespace: str = "default"
    lease_duration_seconds: int = DEFAULT_LEASE_DURATION_S
    resync_seconds: float = 60.0
    workers: int = DEFAULT_WORKERS
    identity: str = field(default_factory=default_identity)


def api_reachable(seconds_since_answer: float | None, *, stale_after: float) -> bool:
    """Whether the API server answered recently enough to call the operator ready."""
    return seconds_since_answer is not None and seconds_since_answer <= stale_after


def plan_api_ping(seconds_since_answer: float | None, *, after: float) -> bool:
    """Whether the heartbeat should ask the API server itself (nothing else did for a while)."""
    return seconds_since_answer is None or seconds_since_answer >= after


@dataclass
class ProcessState:
    """What the health endpoints report."""

    identity: str = ""
    role: str = "starting"  # starting | standby | leader | stopping
    kopf_ready: asyncio.Event = field(default_factory=asyncio.Event)
    api_age: Callable[[], float | None] = field(default=lambda: None)
    """Seconds since the API server last answered (:meth:`Kube.seconds_since_answer`)."""
    stale_after: float = API_STALE_AFTER_S

    def api_reachable(self) -> bool:
        return api_reachable(self.api_age(), stale_after=self.stale_after)

    def ready(self) -> bool:
        role_ready = self.role == "standby" or (self.role == "leader" and self.kopf_ready.is_set())
        return role_ready and self.api_reachable()


def build_health_app(state: ProcessState) -> web.Application:
    """``/healthz`` (the loop answers; never the API server, so an outage restarts nothing) and
    ``/readyz`` (standby waiting, or leader watching, and the API server answered lately)."""

    def body(ok: bool) -> dict[str, Any]:
        age = state.api_age()
        return {
            "ok": ok,
            "role": state.role,
            "identity": state.identity,
            "apiServer": "reachable" if state.api_reachable() else "unreachable",
            "apiServerAnsweredSecondsAgo": None if age is None else round(age, 1),
        }

    async def ready() -> Readiness:
        ok = state.ready()
        return Readiness(ready=ok, body=body(ok))

    app = web.Application()
    add_probes(app, ready=ready, health=lambda: body(True))
    return app


def build_metrics_app(metrics: Metrics) -> web.Application:
    app = web.Application()
    add_metrics(app, metrics.registry)
    return app


async def _serve(app: web.Application, port: int) -> web.AppRunner:
    return await start_site(app, host="0.0.0.0", port=port)


async def _keep_in_touch(kube: Kube, *, after: float = API_PING_AFTER_S) -> None:
    """Ping the API server whenever nothing else has reached it for ``after`` seconds, so
    ``/readyz`` can tell an idle operator from one that lost the API server."""
    while True:
        if plan_api_ping(kube.seconds_since_answer(), after=after):
            await kube.ping()
        await asyncio.sleep(after / 2)


async def _wait_for_crd(kube: Kube, stop: asyncio.Event) -> bool:
    """Poll discovery until the CRD is served; False if asked to stop first."""
    warned = False
    while not stop.is_set():
        if await kube.served(GROUP, VERSION, PLURAL):
            return True
        if not warned:
            log.warning("waiting for the CRD: %s.%s/%s is not served yet", PLURAL, GROUP, VERSION)
            warned = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), CRD_POLL_SECONDS)
    return False


async def _first(*aws: Any) -> tuple[set[asyncio.Task[Any]], set[asyncio.Task[Any]]]:
    tasks = [a if isinstance(a, asyncio.Task) else asyncio.ensure_future(a) for a in aws]
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    return done, pending


async def _cancel(tasks: Any) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


async def run_operator(cfg: OperatorConfig, *, kube: Kube | None = None) -> int:
    """Run until SIGTERM (0), a lost Lease (1) or kopf failing (1)."""
    kube = kube or Kube(load_config(pool_size=KUBE_THREADS))
    metrics = Metrics()
    state = ProcessState(identity=cfg.identity, api_age=kube.seconds_since_answer)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    runners = [
        await _serve(build_health_app(state), cfg.health_port),
        await _serve(build_metrics_app(metrics), cfg.metrics_port),
    ]
    heartbeat = asyncio.create_task(_keep_in_touch(kube), name="api-heartbeat")
    elector: LeaderElector | None = None
    code = 0
    try:
        if cfg.leader_elect:
            renew_deadline_s, retry_period_s = election_timings(cfg.lease_duration_seconds)
            elector = LeaderElector(
                kube,
                namespace=cfg.leader_election_namespace,
                identity=cfg.identity,
                duration_s=cfg.lease_duration_seconds,
                renew_deadline_s=renew_deadline_s,
                retry_period_s=retry_period_s,
            )
            state.role = "standby"
            _, pending = await _first(elector.acquire(), stop.wait())
            await _cancel(pending)
            if stop.is_set():
                return 0
        state.role = "leader"
        metrics.leader.set(1)
        if not await _wait_for_crd(kube, stop):
            return 0
        code = await _lead(cfg, kube=kube, metrics=metrics, state=state, stop=stop, elector=elector)
        return code
    finally:
        state.role = "stopping"
        metrics.leader.set(0)
        await _cancel([heartbeat])
        if elector is not None and code == 0:
            await elector.release()
        for runner in runners:
            await runner.cleanup()
        kube.close()


async def _lead(
    cfg: OperatorConfig,
    *,
    kube: Kube,
    metrics: Metrics,
    state: ProcessState,
    stop: asyncio.Event,
    elector: LeaderElector | None,
) -> int:
    """The watches + the reconcile queue (+ Lease renewal) until one of them ends."""
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(max_workers=KUBE_THREADS, thread_name_prefix="kube")
    )
    controller = Controller(
        kube,
        metrics=metrics,
        resync_seconds=cfg.resync_seconds,
        workers=cfg.workers,
    )
    watches = Watches.build(kube, controller, namespaces=cfg.namespaces)
    kopf_stop = asyncio.Event()
    signals = _own_signals_once(state.kopf_ready, stop)
    kopf_task = asyncio.create_task(
        watches.run_kopf(ready=state.kopf_ready, stop=kopf_stop), name="kopf"
    )
    others = [
        *watches.run_informers(),
        asyncio.create_task(controller.run(), name="controller"),
        asyncio.create_task(stop.wait(), name="stop"),
    ]
    if elector is not None:
        others.append(asyncio.create_task(elector.hold(), name="lease"))
    done, _ = await _first(kopf_task, *others)
    code = 0
    for task in done:
        if task.cancelled():
            continue
        exc = task.exception()
        if isinstance(exc, LeadershipLost):
            log.error("%s: exiting so a standby can lead", exc)
            code = 1
        elif exc is not None:
            log.error("%s failed: %r", task.get_name(), exc)
            code = 1
    # Ours stop first, then kopf: kopf re-raises, when it stops, the exception of every task in
    # the loop that ended with one, ours included; none of ours is left running by then.
    await _cancel([*others, signals])
    kopf_stop.set()
    if not kopf_task.done():
        try:
            await asyncio.wait_for(kopf_task, KOPF_STOP_TIMEOUT_S)
        except TimeoutError:
            log.warning("kopf did not stop in %.0fs", KOPF_STOP_TIMEOUT_S)
        except Exception as exc:  # asked to stop: what kopf re-raises on the way out is no failure
            log.warning("kopf stopped with %r", exc)
    return code


def _own_signals_once(kopf_ready: asyncio.Event, stop: asyncio.Event) -> asyncio.Task[None]:
    """Take SIGINT/SIGTERM back once kopf has installed its own handlers (it does so on start,
    replacing ours), so a signal stops the operator's own tasks before kopf's."""
    loop = asyncio.get_running_loop()

    async def take_back() -> None:
        await kopf_ready.wait()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)

    return loop.create_task(take_back(), name="signals")


@click.command("operator")
@click.option(
    "--namespace",
    "namespaces",
    multiple=True,
    help="Watch this namespace (repeatable). Default: all namespaces.",
)
@click.option("--all-namespaces", is_flag=True, help="Watch every namespace (the default).")
@click.option(
    "--health-port", default=OPERATOR_HEALTH_PORT, show_default=True, help="/healthz and /readyz."
)
@click.option(
    "--metrics-port", default=OPERATOR_METRICS_PORT, show_default=True, help="Prometheus /metrics."
)
@switch_option("leader-elect", help_="Hold the kvretention-operator Lease before acting.")
@click.option(
    "--leader-election-namespace",
    default=None,
    help="Namespace of the Lease. Default: $POD_NAMESPACE, else default.",
)
@click.option(
    "--lease-duration-seconds",
    default=DEFAULT_LEASE_DURATION_S,
    show_default=True,
    type=click.IntRange(min=2, max=3600),
    help="How long a standby waits on an unrenewed Lease before taking over (after a crash). "
    "The leader renews every 2/15 of it and gives up after 2/3 of it without a renewal.",
)
@click.option(
    "--resync-seconds",
    default=60.0,
    show_default=True,
    type=click.FloatRange(min=1.0),
    help="Reconcile every object at least this often.",
)
@click.option(
    "--workers",
    default=DEFAULT_WORKERS,
    show_default=True,
    type=click.IntRange(min=1, max=64),
    help="Objects reconciled at once (one reconcile per object at a time, whatever this is).",
)
@log_level_option
def operator_cmd(
    namespaces: tuple[str, ...],
    all_namespaces: bool,
    health_port: int,
    metrics_port: int,
    leader_elect: bool,
    leader_election_namespace: str | None,
    lease_duration_seconds: int,
    resync_seconds: float,
    workers: int,
    log_level: str,
) -> None:
    """Run the KvRetentionDeployment operator."""
    if all_namespaces and namespaces:
        raise click.UsageError("--all-namespaces and --namespace exclude each other")
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # kopf logs every handler call at INFO ("Handler ... succeeded"): one line per watch event.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    cfg = OperatorConfig(
        namespaces=tuple(namespaces),
        health_port=health_port,
        metrics_port=metrics_port,
        leader_elect=leader_elect,
        leader_election_namespace=(
            leader_election_namespace or os.environ.get("POD_NAMESPACE") or "default"
        ),
        lease_duration_seconds=lease_duration_seconds,
        resync_seconds=resync_seconds,
        workers=workers,
    )
    sys.exit(asyncio.run(run_operator(cfg)))
