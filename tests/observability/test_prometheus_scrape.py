"""A real Prometheus scrapes a real data plane (frontend -> router -> two workers, the engine a
stand-in) on each process's ``--metrics-port``, labelled as the chart's PodMonitor labels it, and every query of the request-path,
retention and routing dashboards runs on it: each is accepted, and each returns data unless the
run gives it nothing to show (named below, with why)."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import yaml
from promlib import ROOT, Query, load_dashboards, prometheus, queries

from support.processes import KvrProcess, StartKvretention, free_port, http_ok, started_in_module

NS, FLEET = "team-a", "chat"
PANEL_SET = (
    "kvretention-request-path.json",
    "kvretention-retention.json",
    "kvretention-routing.json",
)
NOTHING_TO_SHOW = {
    # (dashboard, panel): why this run leaves it empty
    ("kvretention-request-path.json", "Error ratio"): "no request fails",
    ("kvretention-request-path.json", "Client quirks normalized"): "no Claude Code billing header",
    (
        "kvretention-request-path.json",
        "Streamed tool calls unlike SGLang's whole parse",
    ): "every streamed answer's calls are what the whole parse reads",
    (
        "kvretention-retention.json",
        "Pinned share of the L3 pool vs budget",
    ): "the operator's series",
    ("kvretention-routing.json", "Worker ejections by reason"): "no worker is ejected",
    ("kvretention-routing.json", "Failed health polls and broken requests"): "every poll passes",
    ("kvretention-routing.json", "Failing workers kept in rotation"): "no worker fails",
    ("kvretention-routing.json", "Hop refusals (unsigned or forged tenant)"): "every hop is signed",
    ("kvretention-retention.json", "Workers by radix-tree core"): "stand-in engines have no tree",
    ("kvretention-retention.json", "Radix pins: tokens kept vs budget"): "stand-ins have no tree",
    ("kvretention-retention.json", "Radix pins left out by the budget"): "stand-ins have no tree",
    (
        "kvretention-retention.json",
        "Worker fast paths serving",
    ): "stand-in engines have no tokenizer: no fast path runs",
    (
        "kvretention-routing.json",
        "Endpoint picker: picks, served reports, ready frontends",
    ): "no Gateway asks the router: the plane's fleet has no InferencePool",
}
VARIABLES = {"$__rate_interval": "1m", "$fleet_namespace": NS, "$fleet": FLEET}


@dataclass
class Prometheus:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def get(self, path: str, **params: str) -> dict[str, Any]:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as resp:
            body: dict[str, Any] = json.loads(resp.read())
            return body

    def query(self, expr: str) -> dict[str, Any]:
        return self.get("/api/v1/query", query=expr)


@dataclass
class Plane:
    frontend: KvrProcess
    router: KvrProcess
    workers: list[KvrProcess]
    metrics_ports: dict[int, int]
    """Each process's ``--metrics-port`` by its client port: what the PodMonitor scrapes."""

    def targets(self) -> dict[str, list[str]]:
        """Per component, the ``host:port`` of each process's metrics port."""
        procs = {"frontend": [self.frontend], "router": [self.router], "worker": self.workers}
        return {
            component: [f"127.0.0.1:{self.metrics_ports[p.port]}" for p in members]
            for component, members in procs.items()
        }


@pytest.fixture(scope="module")
def start(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartKvretention]:
    yield from started_in_module(tmp_path_factory.mktemp("scrape-logs"))


@pytest.fixture(scope="module")
def plane(start: StartKvretention, tmp_path_factory: pytest.TempPathFactory) -> Plane:
    tmp = tmp_path_factory.mktemp("plane")
    metrics_ports: dict[int, int] = {}

    def start_scraped(args: list[str], **kwargs: Any) -> KvrProcess:
        port = free_port()
        process = start([*args, "--metrics-port", str(port)], **kwargs)
        metrics_ports[process.port] = port
        return process

    workers = [
        start_scraped(
            ["worker", "--engine", "standin:versioned"],
            env={"KVR_STANDIN_RECORD": str(tmp / f"w{i}.jsonl")},
        )
        for i in range(2)
    ]
    urls = [a for w in workers for a in ("--worker", w.base_url)]
    router = start_scraped(["router", *urls, "--health-interval", "0.3"])
    frontend = start_scraped(["frontend", "--router-url", router.base_url, "--model", "standin"])
    return Plane(frontend, router, workers, metrics_ports)


@pytest.fixture(scope="module")
def prom(plane: Plane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    tmp = tmp_path_factory.mktemp("prometheus")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": component,
                "static_configs": [
                    {
                        "targets": targets,
                        # What the chart's PodMonitor relabelings add to every data-plane series.
                        "labels": {"fleet_namespace": NS, "fleet": FLEET, "component": component},
                    }
                ],
            }
            for component, targets in plane.targets().items()
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = tmp / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                str(prometheus()),
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = Prometheus(f"http://127.0.0.1:{port}", proc, log)
    try:
        deadline = time.monotonic() + 60
        while not http_ok(server.url + "/-/ready"):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "prometheus not ready:\n" + log.read_text()[-3000:]
            time.sleep(0.2)
        yield server
    finally:
        KvrProcess(proc, server.url, port, log).stop()  # SIGTERM, then SIGKILL


def send_traffic(plane: Plane) -> None:
    """Hinted OpenAI and Anthropic requests, streamed and not, a pinned session, a field the
    frontend ignores, and one request it rejects."""
    oai = openai.OpenAI(base_url=plane.frontend.base_url + "/v1", api_key="x", max_retries=0)
    ant = anthropic.Anthropic(base_url=plane.frontend.base_url, api_key="x", max_retries=0)
    for n in range(3):
        oai.chat.completions.create(
            model="standin",
            messages=[{"role": "user", "content": f"hello {n}"}],
            extra_body={"prompt_cache_options": {"mode": "implicit"}, "future_field": n},
            extra_headers={"x-session-id": "conversation-1"},
        )
        list(
            oai.chat.completions.create(
                model="standin", messages=[{"role": "user", "content": f"hi {n}"}], stream=True
            )
        )
        ant.messages.create(
            model="standin",
            max_tokens=16,
            system=[{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
            messages=[{"role": "user", "content": f"hey {n}"}],
        )
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model="standin", messages="not a list")  # type: ignore[arg-type]


def _all_targets_up(prom: Prometheus, expected: int) -> bool:
    result = prom.query("up")["data"]["result"]
    return len(result) == expected and all(r["value"][1] == "1" for r in result)


@pytest.fixture(scope="module")
def scraped(plane: Plane, prom: Prometheus) -> Prometheus:
    expected = sum(len(p) for p in plane.targets().values())
    deadline = time.monotonic() + 60
    while not _all_targets_up(prom, expected):
        assert time.monotonic() < deadline, prom.query("up")
        time.sleep(0.5)
    send_traffic(plane)
    # rate() needs two samples of the new values: wait out a few scrapes after the traffic.
    deadline = time.monotonic() + 60
    probe = f'sum(kvretention_frontend_kv_hints_total{{fleet="{FLEET}"}})'
    while True:
        result = prom.query(probe)["data"]["result"]
        if result and float(result[0]["value"][1]) >= 6:
            break
        assert time.monotonic() < deadline, f"hints never reached Prometheus: {result}"
        time.sleep(0.5)
    time.sleep(3)
    return prom


PANELS = [q for q in queries(load_dashboards()) if q.dashboard in PANEL_SET]


def test_the_panel_set_is_not_empty() -> None:
    assert {q.dashboard for q in PANELS} == set(PANEL_SET)
    titled = {(q.dashboard, q.panel) for q in PANELS}
    assert set(NOTHING_TO_SHOW) <= titled, set(NOTHING_TO_SHOW) - titled


@pytest.mark.parametrize("query", PANELS, ids=lambda q: f"{q.dashboard[12:-5]}:{q.panel}:{q.ref}")
def test_panel_query_returns_data_from_the_scraped_plane(scraped: Prometheus, query: Query) -> None:
    answer = scraped.query(query.concrete(VARIABLES))
    assert answer["status"] == "success", answer
    result = answer["data"]["result"]
    if (query.dashboard, query.panel) in NOTHING_TO_SHOW:
        return
    assert result, f"{query.panel} ({query.ref}) returned nothing: {query.concrete(VARIABLES)}"
    # Every series answers for this fleet only (the fleet variable really selects).
    for series in result:
        assert series["metric"].get("fleet", FLEET) == FLEET


def test_a_fleet_the_plane_is_not_returns_nothing(scraped: Prometheus) -> None:
    (query,) = [q for q in PANELS if q.panel == "Requests by endpoint and outcome"]
    other = {**VARIABLES, "$fleet": "another-fleet"}
    assert scraped.query(query.concrete(other))["data"]["result"] == []
    assert scraped.query(query.concrete(VARIABLES))["data"]["result"]


ADAPTER_VALUES = ROOT / "deploy" / "prometheus-adapter" / "values.yaml"


def test_the_adapter_rule_serves_the_metric_the_hpas_read() -> None:
    from kvretention.controller.resources.autoscaling import EXTERNAL_METRIC, ROUTER_SERIES

    (rule,) = yaml.safe_load(ADAPTER_VALUES.read_text())["rules"]["external"]
    assert rule["seriesQuery"].startswith(ROUTER_SERIES + "{")
    assert re.fullmatch(rule["name"]["matches"], ROUTER_SERIES)
    assert rule["name"]["as"] == EXTERNAL_METRIC
    assert rule["resources"]["overrides"] == {"fleet_namespace": {"resource": "namespace"}}


@pytest.mark.parametrize("role", ["aggregated", "prefill", "decode"])
def test_the_adapter_query_answers_one_value_per_pool(scraped: Prometheus, role: str) -> None:
    """What prometheus-adapter asks Prometheus for an HPA in namespace NS selecting
    fleet=FLEET, role=ROLE (its <<.Series>> and <<.LabelMatchers>> filled in as it does): one
    value, 0 once the traffic has been answered."""
    (rule,) = yaml.safe_load(ADAPTER_VALUES.read_text())["rules"]["external"]
    series = rule["seriesQuery"].split("{")[0]
    matchers = f'fleet="{FLEET}",role="{role}",fleet_namespace="{NS}"'
    query = rule["metricsQuery"].replace("<<.Series>>", series)
    query = query.replace("<<.LabelMatchers>>", matchers)
    (sample,) = scraped.query(query)["data"]["result"]
    assert float(sample["value"][1]) == 0
