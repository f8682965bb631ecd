#!/usr/bin/env python3
"""Render a dashboard from a real run: start a data plane (frontend, router, two workers with the
stand-in engine), a real Prometheus scraping it with the chart's PodMonitor labels, drive agent-like
traffic for a while, then draw the dashboard's panels from Prometheus' answers as an SVG (the
dashboard JSON's own queries, layout, units and legends; no Grafana needed).

Usage: .venv/bin/python scripts/dashboard-snapshot.py [--seconds 120] \
         [--dashboard deploy/dashboards/kvretention-request-path.json ...] [--out docs/images]
Needs prometheus on PATH (scripts/install-prometheus.sh).
"""

from __future__ import annotations

import argparse
import html
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NS, FLEET = "team-a", "chat"
SCRAPE_S = 2
RATE_WINDOW = "20s"
TTLS = ({"type": "ephemeral"}, {"type": "ephemeral", "ttl": "1h"})
"""Anthropic cache controls: Claude Code's 5-minute default, and an hour."""
COLORS = ("#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#705da0")


# -- processes ------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    raise SystemExit(f"{url} not ready after {timeout_s}s")


class Plane:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []
        self.targets: dict[str, list[str]] = {}

    def start(self, component: str, args: list[str], env: dict[str, str] | None = None) -> str:
        port = free_port()
        cut = args.index("--") if "--" in args else len(args)
        argv = [sys.executable, "-m", "kvretention", *args[:cut], "--host", "127.0.0.1"]
        argv += ["--port", str(port), *args[cut:]]
        log = (self.tmp / f"{component}-{port}.log").open("wb")
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
        self.procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/healthz", proc)
        self.targets.setdefault(component, []).append(f"127.0.0.1:{port}")
        return url

    def prometheus(self) -> str:
        config = {
            "global": {"scrape_interval": f"{SCRAPE_S}s"},
            "scrape_configs": [
                {
                    "job_name": component,
                    # One target each, labelled as the chart's PodMonitor labels a pod.
                    "static_configs": [
                        {
                            "targets": [target],
                            "labels": {
                                "fleet_namespace": NS,
                                "fleet": FLEET,
                                "component": component,
                                "pod": f"{FLEET}-{component}-{i}",
                            },
                        }
                        for i, target in enumerate(targets)
                    ],
                }
                for component, targets in self.targets.items()
            ],
        }
        (self.tmp / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        port = free_port()
        binary = shutil.which("prometheus")
        if binary is None:
            raise SystemExit("prometheus is not installed: run scripts/install-prometheus.sh")
        log = (self.tmp / "prometheus.log").open("wb")
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={self.tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/-/ready", proc)
        return url

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


# -- traffic --------------------------------------------------------------------------------------


def post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    data = json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, headers={"content-type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            resp.read()
    except urllib.error.HTTPError as exc:
        exc.read()


def agent_turns(frontend: str, stop: threading.Event, seed: int) -> None:
    """One client: conversations of a few turns each, hinted the way Claude Code and Codex hint."""
    rng = random.Random(seed)
    while not stop.is_set():
        session = f"s{seed}-{rng.randrange(10**6)}"
        history: list[dict[str, Any]] = []
        for turn in range(rng.randint(2, 6)):
            history.append(
                {"role": "user", "content": f"turn {turn}: " + "word " * rng.randint(5, 80)}
            )
            kind = rng.random()
            if kind < 0.45:
                post(
                    frontend + "/v1/messages",
                    {
                        "model": "standin",
                        "max_tokens": 32,
                        "system": "You are an agent.",
                        "messages": history,
                        # Anthropic's automatic caching: the whole prompt, for the TTL asked.
                        "cache_control": rng.choice(TTLS),
                        "stream": rng.random() < 0.5,
                    },
                    {"x-session-id": session},
                )
            elif kind < 0.9:
                post(
                    frontend + "/v1/chat/completions",
                    {
                        "model": "standin",
                        "messages": history,
                        "prompt_cache_options": {
                            "mode": "implicit",
                            "ttl": "30m",
                        },
                        "stream": rng.random() < 0.5,
                        "client_metadata": {"session_id": session},
                    },
                )
            else:  # a malformed request the frontend rejects
                post(frontend + "/v1/chat/completions", {"model": "standin", "messages": "?"})
            history.append({"role": "assistant", "content": "ok"})
            stop.wait(rng.uniform(0.05, 0.4))


# -- rendering ------------------------------------------------------------------------------------


def query_range(
    prom: str, expr: str, start: float, end: float, step: float
) -> list[dict[str, Any]]:
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{prom}/api/v1/query_range?{params}", timeout=30) as resp:
        body = json.loads(resp.read())
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def concrete(expr: str) -> str:
    for name, value in (
        ("$__rate_interval", RATE_WINDOW),
        ("$fleet_namespace", NS),
        ("$fleet", FLEET),
    ):
        expr = expr.replace(name, value)
    return expr


def legend(fmt: str, labels: dict[str, str]) -> str:
    if fmt in ("", "__auto"):
        return ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__") or "value"
    out = fmt
    for key, value in labels.items():
        out = out.replace("{{" + key + "}}", value)
    return out


def fmt_value(value: float, unit: str) -> str:
    if unit == "percentunit":
        return f"{value * 100:.1f}%"
    if unit == "s":
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
    if unit == "bytes":
        for suffix in ("B", "KiB", "MiB", "GiB", "TiB"):
            if abs(value) < 1024:
                return f"{value:.0f} {suffix}"
            value /= 1024
        return f"{value:.0f} PiB"
    suffix = {"reqps": " req/s", "ops": "/s", "Bps": " B/s"}.get(unit, "")
    return f"{value:.3g}{suffix}"


COL_PX, ROW_PX = 50, 30


def render_panel(
    panel: dict[str, Any],
    series: list[tuple[str, list[tuple[float, float]]]],
    span: tuple[float, float],
) -> str:
    grid = panel["gridPos"]
    x0, y0 = grid["x"] * COL_PX, grid["y"] * ROW_PX
    w, h = grid["w"] * COL_PX - 8, grid["h"] * ROW_PX - 8
    unit = panel["fieldConfig"]["defaults"].get("unit", "short")
    parts = [
        f'<g transform="translate({x0 + 4},{y0 + 4})">',
        f'<rect width="{w}" height="{h}" rx="3" fill="#181b1f" stroke="#2c3235"/>',
        f'<text x="10" y="20" fill="#ccccdc" font-size="13" font-weight="600">{html.escape(panel["title"])}</text>',
    ]
    if not series:
        parts.append(
            f'<text x="{w / 2}" y="{h / 2}" fill="#8e8e8e" font-size="12" text-anchor="middle">No data</text>'
        )
        return "".join(parts) + "</g>"
    if panel["type"] == "stat":
        last = sum(points[-1][1] for _, points in series if points)
        parts.append(
            f'<text x="{w / 2}" y="{h / 2 + 18}" fill="#73bf69" font-size="40" text-anchor="middle">{html.escape(fmt_value(last, unit))}</text>'
        )
        return "".join(parts) + "</g>"
    left, top, right = 64, 32, 10
    legend_rows = min(len(series), 3)
    bottom = 18 + 14 * legend_rows
    pw, ph = w - left - right, h - top - bottom
    values = [v for _, points in series for _, v in points]
    vmax = max(values) if max(values) > 0 else 1.0
    vmin = min(0.0, min(values))
    t0, t1 = span
    for frac in (0.0, 0.5, 1.0):
        yy = top + ph - frac * ph
        parts.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#2c3235"/>'
        )
        label = fmt_value(vmin + frac * (vmax - vmin), unit)
        parts.append(
            f'<text x="{left - 6}" y="{yy + 4:.1f}" fill="#8e8e8e" font-size="10" text-anchor="end">{html.escape(label)}</text>'
        )
    for i, (name, points) in enumerate(series):
        color = COLORS[i % len(COLORS)]
        coords = " ".join(
            f"{left + (t - t0) / (t1 - t0) * pw:.1f},{top + ph - (v - vmin) / (vmax - vmin) * ph:.1f}"
            for t, v in points
        )
        parts.append(
            f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="1.5"/>'
        )
        if i < legend_rows:
            ly = top + ph + 16 + 14 * i
            parts.append(f'<rect x="{left}" y="{ly - 8}" width="10" height="3" fill="{color}"/>')
            parts.append(
                f'<text x="{left + 16}" y="{ly - 3}" fill="#ccccdc" font-size="10">{html.escape(name[:90])}</text>'
            )
    if len(series) > legend_rows:
        parts.append(
            f'<text x="{w - 10}" y="{h - 6}" fill="#8e8e8e" font-size="10" text-anchor="end">+{len(series) - legend_rows} more</text>'
        )
    return "".join(parts) + "</g>"


def render_dashboard(
    dashboard: dict[str, Any], prom: str, start: float, end: float, *, caption: str
) -> str:
    step = max(SCRAPE_S, (end - start) / 120)
    panels_svg = []
    height = 0
    for panel in dashboard["panels"]:
        series: list[tuple[str, list[tuple[float, float]]]] = []
        for target in panel["targets"]:
            for item in query_range(prom, concrete(target["expr"]), start, end, step):
                points = [
                    (float(t), float(v))
                    for t, v in item["values"]
                    if v not in ("NaN", "+Inf", "-Inf")
                ]
                if points:
                    series.append((legend(target.get("legendFormat", ""), item["metric"]), points))
        panels_svg.append(render_panel(panel, series, (start, end)))
        grid = panel["gridPos"]
        height = max(height, (grid["y"] + grid["h"]) * ROW_PX)
    width = 24 * COL_PX
    title = html.escape(dashboard["title"])
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 40}" '
        'font-family="Inter, Helvetica, Arial, sans-serif">'
        f'<rect width="100%" height="100%" fill="#111217"/>'
        f'<text x="8" y="24" fill="#ccccdc" font-size="16" font-weight="600">{title}</text>'
        f'<g transform="translate(0,32)">'
    )
    foot = (
        f'<text x="8" y="{height + 28}" fill="#8e8e8e" font-size="11">{html.escape(caption)}</text>'
    )
    return head + "".join(panels_svg) + "</g>" + foot + "</svg>\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument(
        "--dashboard",
        action="append",
        type=Path,
        help="dashboard JSON (repeatable; default: request path, retention, routing)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    args = parser.parse_args()
    boards = args.dashboard or [
        ROOT / "deploy" / "dashboards" / "kvretention-request-path.json",
        ROOT / "deploy" / "dashboards" / "kvretention-retention.json",
        ROOT / "deploy" / "dashboards" / "kvretention-routing.json",
    ]
    with tempfile.TemporaryDirectory(prefix="kvr-snapshot-") as tmp_name:
        plane = Plane(Path(tmp_name))
        try:
            workers = [
                plane.start("worker", ["worker", "--engine", "standin:versioned"]) for _ in range(2)
            ]
            router = plane.start(
                "router", ["router", *(a for w in workers for a in ("--worker", w))]
            )
            frontend = plane.start(
                "frontend", ["frontend", "--router-url", router, "--model", "standin"]
            )
            prom = plane.prometheus()
            time.sleep(3 * SCRAPE_S)
            start = time.time()
            stop = threading.Event()
            clients = [
                threading.Thread(target=agent_turns, args=(frontend, stop, seed), daemon=True)
                for seed in range(args.clients)
            ]
            for client in clients:
                client.start()
            time.sleep(args.seconds)
            stop.set()
            for client in clients:
                client.join(timeout=35)
            time.sleep(3 * SCRAPE_S)
            end = time.time()
            args.out.mkdir(parents=True, exist_ok=True)
            for board in boards:
                dashboard = json.loads(board.read_text())
                out = args.out / board.with_suffix(".svg").name
                caption = (
                    f"From a real run (scripts/dashboard-snapshot.py): {args.clients} agent clients for "
                    f"{args.seconds:.0f} s, frontend, router, 2 stand-in workers; Prometheus every {SCRAPE_S} s."
                )
                out.write_text(render_dashboard(dashboard, prom, start, end, caption=caption))
                print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
        finally:
            plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
