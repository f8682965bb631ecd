#!/usr/bin/env python3
"""Generate the Grafana dashboards: deploy/dashboards/*.json and the chart's copy under
charts/kvretention/dashboards/ (shipped as ConfigMaps for the Grafana sidecar).

Every query names only metrics the processes export (tests/observability checks it against the
registries and against a real Prometheus). Data-plane series carry ``fleet_namespace``, ``fleet``
and ``component`` from the chart's PodMonitor relabelings; the operator's ``kvretention_kvstore_*``
gauges carry ``fleet_namespace`` and ``fleet`` themselves.

Usage: scripts/gen-dashboards.py           # rewrite both copies
       scripts/gen-dashboards.py --check   # exit 1 and name the files that drifted
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT_DIRS = (ROOT / "deploy" / "dashboards", ROOT / "charts" / "kvretention" / "dashboards")

SEL = 'fleet_namespace=~"$fleet_namespace", fleet=~"$fleet"'
RATE = "[$__rate_interval]"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
WIDTH = 24
FLEET = "fleet_namespace, fleet"


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    targets: tuple[Target, ...]
    unit: str = "short"
    kind: str = "timeseries"
    width: int = 12
    height: int = 8
    extra: dict[str, Any] = field(default_factory=dict)


def rate(metric: str, *, where: str = "", by: str = "", sel: str = SEL) -> str:
    """``sum [by] (rate(...))`` over the fleet selector ``sel`` (the operator's own series: none)."""
    matchers = ", ".join(m for m in (sel, where) if m)
    selector = f"{{{matchers}}}" if matchers else ""
    inner = f"rate({metric}{selector}{RATE})"
    return f"sum by ({by}) ({inner})" if by else f"sum({inner})"


def gauge(metric: str, *, by: str, where: str = "", agg: str = "sum") -> str:
    matchers = f"{SEL}, {where}" if where else SEL
    return f"{agg} by ({by}) ({metric}{{{matchers}}})"


def quantile(q: float, metric: str, *, where: str = "", by: str = "", sel: str = SEL) -> str:
    group = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, {rate(metric + '_bucket', where=where, by=group, sel=sel)})"


def stat(title: str, description: str, target: Target, *, width: int = 6) -> Panel:
    """One number (its last value) on a narrow panel."""
    return Panel(title, description, (target,), kind="stat", width=width)


def legend_of(by: str) -> str:
    """A series named by its ``by`` labels: ``role, reason`` -> ``{{role}} {{reason}}``."""
    return " ".join(f"{{{{{label}}}}}" for label in by.split(", "))


def rate_target(metric: str, *, by: str, name: str = "", sel: str = SEL) -> Target:
    """Per-second ``metric``, a series per ``by`` group named ``name`` and the group's labels."""
    legend = legend_of(by)
    return Target(rate(metric, by=by, sel=sel), f"{name} {legend}" if name else legend)


def rate_by(
    title: str, description: str, metric: str, *, by: str, unit: str, sel: str = SEL
) -> Panel:
    """Per-second ``metric``, a series per ``by`` group named by its labels."""
    return Panel(title, description, (rate_target(metric, by=by, sel=sel),), unit=unit)


def gauge_by(title: str, description: str, metric: str, *, by: str) -> Panel:
    """``metric`` summed per ``by`` group, a series per group named by its labels."""
    return Panel(title, description, (Target(gauge(metric, by=by), legend_of(by)),))


def pinned_vs_budget(title: str, description: str) -> Panel:
    """Soft pins' share of the Mooncake pool beside the budget, per fleet (the operator's gauges)."""
    return Panel(
        title,
        description,
        tuple(
            Target(gauge(f"kvretention_kvstore_{m}_ratio", by=FLEET), f"{{{{fleet}}}} {what}")
            for m, what in (("pinned", "pinned"), ("budget", "budget"))
        ),
        unit="percentunit",
    )


def variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": f"{name}-values"},
        "definition": query,
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


def templating(source_metric: str) -> dict[str, Any]:
    return {
        "list": [
            {
                "name": "datasource",
                "label": "Data source",
                "type": "datasource",
                "query": "prometheus",
                "current": {},
                "hide": 0,
            },
            variable(
                "fleet_namespace", "Namespace", f"label_values({source_metric}, fleet_namespace)"
            ),
            variable(
                "fleet",
                "Fleet",
                f'label_values({source_metric}{{fleet_namespace=~"$fleet_namespace"}}, fleet)',
            ),
        ]
    }


def panel_json(panel: Panel, *, panel_id: int, x: int, y: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {
                "datasource": DATASOURCE,
                "expr": t.expr,
                "legendFormat": t.legend or "__auto",
                "refId": chr(ord("A") + i),
            }
            for i, t in enumerate(panel.targets)
        ],
    }
    if panel.kind == "stat":
        out["options"] = {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "value"}
    out.update(panel.extra)
    return out


def dashboard(
    *, uid: str, title: str, description: str, source_metric: str, panels: list[Panel]
) -> dict[str, Any]:
    laid: list[dict[str, Any]] = []
    x = y = row_h = 0
    for i, panel in enumerate(panels, start=1):
        if x + panel.width > WIDTH:
            x, y, row_h = 0, y + row_h, 0
        laid.append(panel_json(panel, panel_id=i, x=x, y=y))
        x += panel.width
        row_h = max(row_h, panel.height)
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["kvretention"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "",
        "graphTooltip": 1,
        "links": [
            {
                "type": "dashboards",
                "tags": ["kvretention"],
                "asDropdown": True,
                "title": "kvretention",
            }
        ],
        "templating": templating(source_metric),
        "annotations": {"list": []},
        "panels": laid,
    }


FRONTEND_REQ = "kvretention_frontend_requests_total"
CONDITION = "kvretention_operator_fleet_condition"
LATENCY = "kvretention_frontend_upstream_latency_seconds"


def request_path() -> dict[str, Any]:
    return dashboard(
        uid="kvretention-request-path",
        title="kvretention / Request path",
        description="Frontend and workers: request rate, errors, latency, what clients sent that "
        "was ignored or normalized.",
        source_metric=FRONTEND_REQ,
        panels=[
            rate_by(
                "Requests by endpoint and outcome",
                "Finished frontend requests per second (ok, rejected, error, client_disconnected).",
                FRONTEND_REQ,
                by="endpoint, outcome",
                unit="reqps",
            ),
            Panel(
                "Error ratio",
                "Share of finished requests that ended in an error after admission "
                "(what KvRetentionErrorRatioHigh alerts on).",
                (
                    Target(
                        rate(FRONTEND_REQ, where='outcome="error"') + " / " + rate(FRONTEND_REQ),
                        "errors / all",
                    ),
                ),
                unit="percentunit",
            ),
            rate_by(
                "Rejections by reason",
                "Requests refused before anything was forwarded, by error code.",
                "kvretention_frontend_rejections_total",
                by="reason",
                unit="reqps",
            ),
            Panel(
                "Time to first token (p50, p95, p99)",
                "Router latency to the first streamed chunk, as the frontend measured it.",
                tuple(
                    Target(quantile(q, LATENCY, where='phase="first_chunk"'), f"p{int(q * 100)}")
                    for q in (0.5, 0.95, 0.99)
                ),
                unit="s",
            ),
            Panel(
                "Request latency p95 by endpoint",
                "Router latency to the end of the answer.",
                (
                    Target(
                        quantile(0.95, LATENCY, where='phase="total"', by="endpoint"),
                        "{{endpoint}}",
                    ),
                ),
                unit="s",
            ),
            Panel(
                "Ignored request fields (top 10)",
                "Fields accepted and not acted on, per field path (docs/frontend.md, Forward "
                "compatibility).",
                (
                    Target(
                        f"topk(10, {rate('kvretention_frontend_ignored_fields_total', by='field')})",
                        "{{field}}",
                    ),
                ),
                unit="reqps",
            ),
            rate_by(
                "Client quirks normalized",
                "Client quirks removed before templating, by kind.",
                "kvretention_frontend_normalized_total",
                by="kind",
                unit="reqps",
            ),
            rate_by(
                "Worker requests by outcome",
                "Generate requests the workers finished.",
                "kvretention_worker_requests_total",
                by="component, outcome",
                unit="reqps",
            ),
            Panel(
                "Worker requests in flight",
                "Generate requests in flight per worker pod.",
                (Target(gauge("kvretention_worker_inflight", by="component, pod"), "{{pod}}"),),
            ),
            rate_by(
                "Streamed tool calls unlike SGLang's whole parse",
                "Streamed answers whose tool calls differ from what SGLang's non-streaming parse "
                "reads from the same text, by --tool-call-parser: its streaming detector lost, "
                "joined or misplaced a call (docs/request-path.md, Tool calls out of the "
                "engine's chunks). Zero is the norm.",
                "kvretention_worker_tool_calls_unlike_whole_total",
                by="parser",
                unit="reqps",
            ),
        ],
    )


def retention() -> dict[str, Any]:
    hints = "kvretention_frontend_kv_hints_total"
    passed = "kvretention_worker_kv_hints_passed_total"
    return dashboard(
        uid="kvretention-retention",
        title="kvretention / Retention",
        description="KV-retention hints: what the frontend attached, what reached the engine, "
        "and how much of the pool pins hold.",
        source_metric=FRONTEND_REQ,
        panels=[
            Panel(
                "Hints attached by TTL",
                "KV-hint envelopes the frontend attached to forwarded requests, by TTL (seconds).",
                (Target(rate(hints, by="ttl_seconds"), "ttl {{ttl_seconds}}s"),),
                unit="reqps",
            ),
            Panel(
                "Hinted share of answered requests",
                "Hints attached / requests answered ok.",
                (Target(rate(hints) + " / " + rate(FRONTEND_REQ, where='outcome="ok"'), "hinted"),),
                unit="percentunit",
            ),
            Panel(
                "Hints attached vs passed to the engine",
                "Attached by the frontend vs handed to Engine.async_generate by a worker; "
                "a gap means workers refuse or drop hints (KvRetentionHintsUnsupported).",
                (
                    Target(rate(hints), "attached (frontend)"),
                    Target(rate(passed, where='dialect!="none"'), "passed (workers)"),
                ),
                unit="reqps",
            ),
            rate_by(
                "Hints passed by engine dialect",
                "versioned: kv.retain token ranges (SGLang >= 0.5.23); flat: full prompt only.",
                passed,
                by="dialect",
                unit="reqps",
            ),
            rate_by(
                "Prompt tokens reused vs tokenized",
                "Worker render cache: tokens reused from the conversation's previous prompt vs "
                "tokenized anew.",
                "kvretention_worker_prompt_tokens_total",
                by="how",
                unit="short",
            ),
            Panel(
                "Worker fast paths serving",
                "Lowest over the workers, per fast path: 1 serving, 0 a worker turned it off after "
                "a difference from the exact path (token_reuse: the previous prompt's tokens; "
                "compiled_template: minijinja for the chat template); answers stay exact, turns "
                "cost more CPU (KvRetentionWorkerFastPathOff).",
                (
                    Target(
                        gauge("kvretention_worker_fast_path_enabled", by="path", agg="min"),
                        "{{path}}",
                    ),
                ),
            ),
            stat(
                "Workers by radix-tree core",
                "Worker pods by the radix-tree core SGLang's unified cache runs on and its "
                "--radix-eviction-policy: kvretain keeps SGLang's default, rust, with its holds as "
                "pins; python only where SGLang falls back to it (docs/retention.md).",
                Target(
                    gauge("kvretention_worker_radix_core_info", by="core, policy"),
                    "{{core}} ({{policy}})",
                ),
                width=12,
            ),
            Panel(
                "Radix pins: tokens kept vs budget",
                "Largest over the workers: device KV tokens the kvretain pins keep out of "
                "eviction on SGLang's Rust tree core, and the most they may keep "
                "(spec.workers.radixPinRatio of the pool, room left for the longest request; "
                "docs/retention.md).",
                (
                    Target(
                        gauge("kvretention_worker_radix_pinned_tokens", by="kind", agg="max"),
                        "{{kind}}",
                    ),
                ),
            ),
            Panel(
                "Radix pins left out by the budget",
                "kv.retain holds the pin budget left out or dropped for higher-ranked ones: "
                "those prefixes are evicted as LRU evicts them (KvRetentionRadixPinsDropped).",
                (Target(rate("kvretention_worker_radix_pins_dropped_total"), "left out"),),
                unit="ops",
            ),
            pinned_vs_budget(
                "Pinned share of the L3 pool vs budget",
                "Soft pins' estimated share of the Mooncake pool and softPin.budgetRatio.",
            ),
        ],
    )


def kvstore() -> dict[str, Any]:
    def g(metric: str) -> str:
        return gauge(f"kvretention_kvstore_{metric}", by=FLEET)

    return dashboard(
        uid="kvretention-kvstore",
        title="kvretention / L3 store (Mooncake)",
        description="The managed Mooncake master as the operator reads its /metrics: capacity, "
        "use, soft pins, evictions, the retention budget.",
        source_metric="kvretention_kvstore_metrics_up",
        panels=[
            stat(
                "Master metrics readable",
                "1 when the operator's last read of the master's /metrics succeeded.",
                Target(g("metrics_up"), "{{fleet}}"),
            ),
            stat(
                "Over budget",
                "1 while pins hold more of the pool than softPin.budgetRatio allows.",
                Target(g("over_budget"), "{{fleet}}"),
            ),
            pinned_vs_budget(
                "Pinned share vs budget",
                "Estimated share of capacity soft pins hold, and the budget.",
            ),
            Panel(
                "Capacity, used, pinned",
                "Pool capacity (mounted segments), bytes allocated, and pinned bytes (estimate).",
                (
                    Target(g("capacity_bytes"), "{{fleet}} capacity"),
                    Target(g("used_bytes"), "{{fleet}} used"),
                    Target(g("pinned_bytes_estimate"), "{{fleet}} pinned"),
                ),
                unit="bytes",
            ),
            Panel(
                "Objects and pinned objects",
                "Objects stored and soft-pinned objects.",
                (
                    Target(g("objects"), "{{fleet}} objects"),
                    Target(g("pinned_objects"), "{{fleet}} pinned"),
                ),
            ),
            Panel(
                "Evictions",
                "Eviction rounds, objects and bytes evicted per second.",
                (
                    Target(rate("kvretention_kvstore_evictions", by=FLEET), "{{fleet}} rounds"),
                    Target(
                        rate("kvretention_kvstore_evicted_objects", by=FLEET), "{{fleet}} objects"
                    ),
                ),
                unit="ops",
            ),
            Panel(
                "Bytes evicted",
                "Bytes evicted per second.",
                (Target(rate("kvretention_kvstore_evicted_bytes", by=FLEET), "{{fleet}}"),),
                unit="Bps",
            ),
            rate_by(
                "Pages the workers put, by outcome",
                "The retention plugin's L3 hook on the workers: retained pages pinned, and those "
                "written unpinned (over_budget, over_tenant_budget, expired, pin_refused).",
                "kvretention_l3_pages_total",
                by="outcome",
                unit="ops",
            ),
            Panel(
                "Workers' pins vs their budget",
                "What the workers' ledgers count pinned (and per tenant), and their pin budget.",
                (
                    Target(gauge("kvretention_l3_pinned_bytes", by=FLEET), "{{fleet}} pinned"),
                    Target(gauge("kvretention_l3_pin_budget_bytes", by=FLEET), "{{fleet}} budget"),
                    Target(gauge("kvretention_l3_tenant_pinned_bytes", by="tenant"), "{{tenant}}"),
                ),
                unit="bytes",
            ),
            Panel(
                "Master restarts seen by the workers",
                "Restarts of the master the workers saw in its /metrics (one per store client), "
                "and the pinned pages they lost (pinned again only when written again).",
                (
                    Target(rate("kvretention_l3_master_restarts_total", by=FLEET), "{{fleet}}"),
                    Target(rate("kvretention_l3_pins_lost_total", by=FLEET), "{{fleet}} pins"),
                ),
                unit="ops",
            ),
        ],
    )


def routing() -> dict[str, Any]:
    outstanding = "kvretention_router_outstanding_requests"
    routed = "kvretention_router_requests_total"
    return dashboard(
        uid="kvretention-routing",
        title="kvretention / Routing",
        description="The router: how requests were placed, worker health, load per pool and "
        "per worker.",
        source_metric="kvretention_router_healthy_workers",
        panels=[
            Panel(
                "Placements: sticky, resident, prefix, least outstanding",
                "Session pins, the engines' KV events (router.kvEvents), prefix matches "
                "(cache-aware), and the rest.",
                (
                    Target(rate("kvretention_router_sticky_placements_total"), "sticky (session)"),
                    Target(
                        rate("kvretention_router_resident_placements_total"),
                        "resident (KV events)",
                    ),
                    Target(rate("kvretention_router_prefix_placements_total"), "prefix match"),
                    Target(
                        f"{rate(routed)} - {rate('kvretention_router_sticky_placements_total')}"
                        f" - {rate('kvretention_router_resident_placements_total')}"
                        f" - {rate('kvretention_router_prefix_placements_total')}",
                        "least outstanding (fallback)",
                    ),
                ),
                unit="reqps",
            ),
            rate_by(
                "Routed requests by mode and outcome",
                "Requests the router forwarded.",
                routed,
                by="mode, outcome",
                unit="reqps",
            ),
            Panel(
                "Endpoint picker: picks, served reports, ready frontends",
                "The router as the InferencePool's endpoint picker (gateway.inferencePool): the "
                "Gateway's ext_proc answers by outcome (unavailable: 503, no frontend ready), "
                "what the Gateway reported served, and the frontends it may pick.",
                (
                    rate_target(
                        "kvretention_router_endpoint_picks_total", by="outcome", name="pick"
                    ),
                    rate_target(
                        "kvretention_router_endpoint_served_total", by="endpoint", name="served"
                    ),
                    Target(
                        gauge("kvretention_router_ready_endpoints", by=FLEET, agg="min"),
                        "ready frontends {{fleet}}",
                    ),
                ),
            ),
            gauge_by(
                "Healthy workers by pool",
                "Workers in rotation (KvRetentionNoReadyWorkers fires at 0).",
                "kvretention_router_healthy_workers",
                by="role",
            ),
            gauge_by(
                "Outstanding requests by pool",
                "In flight per pool: what the pool's autoscaler reads.",
                "kvretention_router_pool_outstanding_requests",
                by="role",
            ),
            gauge_by(
                "Outstanding requests per worker",
                "In flight per worker URL.",
                outstanding,
                by="role, url",
            ),
            Panel(
                "Imbalance (max - min outstanding) by pool",
                "How unevenly the pool's workers are loaded right now.",
                (
                    Target(
                        f"{gauge(outstanding, by='role', agg='max')}"
                        f" - {gauge(outstanding, by='role', agg='min')}",
                        "{{role}}",
                    ),
                ),
            ),
            rate_by(
                "Worker ejections by reason",
                "Workers taken out of rotation (refused, broken, not_ready, timeout, error).",
                "kvretention_router_worker_ejections_total",
                by="role, reason",
                unit="ops",
            ),
            rate_by(
                "Failed health polls and broken requests",
                "By what they showed.",
                "kvretention_router_worker_health_failures_total",
                by="role, evidence",
                unit="ops",
            ),
            rate_by(
                "Failing workers kept in rotation",
                "Answering real requests, or the pool's last one.",
                "kvretention_router_worker_kept_total",
                by="role, why",
                unit="ops",
            ),
            Panel(
                "Hop refusals (unsigned or forged tenant)",
                "Requests that reached a router or worker without the frontend's signature on "
                "their tenant (--hop-key-file), by reason: a peer inside the cluster, or keys "
                "out of step between components.",
                (
                    rate_target(
                        "kvretention_router_hop_refusals_total", by="reason", name="router"
                    ),
                    rate_target(
                        "kvretention_worker_hop_refusals_total", by="reason", name="worker"
                    ),
                ),
                unit="ops",
            ),
        ],
    )


def operator() -> dict[str, Any]:
    def orate(metric: str, by: str = "") -> str:
        return rate(metric, by=by, sel="")

    return dashboard(
        uid="kvretention-operator",
        title="kvretention / Operator",
        description="The operator: fleets' conditions, reconciles, writes to the API server, "
        "leadership.",
        source_metric=CONDITION,
        panels=[
            stat(
                "Fleets Ready",
                "Fleets whose Ready condition is True.",
                Target(f'sum({CONDITION}{{{SEL}, type="Ready", status="True"}})', "ready"),
            ),
            stat(
                "Fleets not Ready",
                "Fleets whose Ready condition is False or Unknown.",
                Target(f'sum({CONDITION}{{{SEL}, type="Ready", status!="True"}})', "not ready"),
            ),
            Panel(
                "Conditions not True, by reason",
                "Each fleet's conditions that are False or Unknown, with the reason the operator "
                "gave (kubectl describe shows the message).",
                (
                    Target(
                        gauge(
                            CONDITION,
                            by="fleet_namespace, fleet, type, status, reason",
                            where='status!="True"',
                        ),
                        "{{fleet_namespace}}/{{fleet}} {{type}}={{status}} {{reason}}",
                    ),
                ),
                width=24,
            ),
            stat(
                "Leader",
                "1 on the replica that holds the leader Lease.",
                Target("sum(kvretention_operator_leader)", "leaders"),
            ),
            stat(
                "Fleets watched",
                "KvRetentionDeployments the leader knows about.",
                Target("max(kvretention_operator_watched_objects)", "fleets"),
            ),
            rate_by(
                "Reconciles by result",
                "ok, invalid (a spec that can never work), error (requeued with backoff).",
                "kvretention_operator_reconciles_total",
                by="result",
                unit="ops",
                sel="",
            ),
            Panel(
                "Reconcile duration (p50, p95)",
                "Wall time of one reconcile.",
                tuple(
                    Target(
                        quantile(q, "kvretention_operator_reconcile_duration_seconds", sel=""),
                        f"p{int(q * 100)}",
                    )
                    for q in (0.5, 0.95)
                ),
                unit="s",
            ),
            Panel(
                "API writes by kind",
                "Server-side applies that changed a child, drift dry-runs, deletions.",
                (
                    rate_target(
                        "kvretention_operator_apply_writes_total", by="kind", name="apply", sel=""
                    ),
                    rate_target(
                        "kvretention_operator_dry_runs_total", by="kind", name="dry-run", sel=""
                    ),
                    rate_target(
                        "kvretention_operator_deletes_total", by="kind", name="delete", sel=""
                    ),
                ),
                unit="ops",
            ),
            Panel(
                "Status writes, events, errors",
                "Status subresource writes, Events posted on condition transitions, failed "
                "reconciles.",
                (
                    Target(orate("kvretention_operator_status_writes_total"), "status writes"),
                    Target(orate("kvretention_operator_events_total"), "events"),
                    Target(orate("kvretention_operator_errors_total"), "errors"),
                ),
                unit="ops",
            ),
        ],
    )


DASHBOARDS = {
    "kvretention-request-path.json": request_path,
    "kvretention-retention.json": retention,
    "kvretention-kvstore.json": kvstore,
    "kvretention-routing.json": routing,
    "kvretention-operator.json": operator,
}


def render() -> dict[str, str]:
    return {name: json.dumps(build(), indent=2) + "\n" for name, build in DASHBOARDS.items()}


def main(argv: list[str]) -> int:
    check = argv[1:] == ["--check"]
    if argv[1:] not in ([], ["--check"]):
        print(f"usage: {argv[0]} [--check]", file=sys.stderr)
        return 2
    wanted = render()
    drifted: list[str] = []
    for out_dir in OUT_DIRS:
        present = {p.name for p in out_dir.glob("*.json")} if out_dir.is_dir() else set()
        for name in sorted(present - set(wanted)):
            drifted.append(str(out_dir / name))
            if not check:
                (out_dir / name).unlink()
        for name, text in wanted.items():
            path = out_dir / name
            if not path.is_file() or path.read_text() != text:
                drifted.append(str(path))
                if not check:
                    out_dir.mkdir(parents=True, exist_ok=True)
                    path.write_text(text)
    if check and drifted:
        print("dashboards drifted (run scripts/gen-dashboards.py):", *drifted, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
