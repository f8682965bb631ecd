"""``kvretention replay URL``: send recorded Claude Code- and Codex-shaped sessions to a fleet's
frontend and print, per turn, the share of the prompt the engine read from its cache beside the
share it could have. The one module here that does I/O (HTTP, the clock, stdout)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

import click

from kvretention.replay.plan import (
    SESSIONS,
    Step,
    Turn,
    interleave,
    plan_sessions,
    rows,
    summary,
    usage_of,
)

TIMEOUT_S = 600.0
"""A turn on a loaded CPU engine can take minutes; a fleet that answers nothing still ends."""


def _headers(path: str, key: str | None) -> dict[str, str]:
    """Each provider's own key header, as its clients send it."""
    if not key:
        return {}
    return (
        {"x-api-key": key}
        if path.startswith("/v1/messages")
        else {"authorization": f"Bearer {key}"}
    )


def _call(url: str, *, body: Mapping[str, Any] | None, headers: Mapping[str, str]) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url,
        data=data,
        headers={"content-type": "application/json", **headers},
        method="GET" if body is None else "POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as exc:
        raise click.ClickException(f"{url}: {exc.code} {_error_text(exc.read())}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise click.ClickException(f"{url}: {reason}") from None


def _error_text(raw: bytes) -> str:
    """The provider error's message (both shapes nest it under ``error``), else the raw text."""
    try:
        error = json.loads(raw).get("error", {})
        return f"{error.get('type') or error.get('code')}: {error.get('message')}"
    except (ValueError, AttributeError):
        return raw.decode(errors="replace")[:500]


def _served_model(base: str, key: str | None) -> str:
    listed = _call(base + "/v1/models", body=None, headers=_headers("/v1/models", key))
    names = [m.get("id") for m in listed.get("data", []) if isinstance(m, dict)]
    if not names or not isinstance(names[0], str):
        raise click.ClickException(f"{base}/v1/models lists no model: pass --model")
    return names[0]


def _send(base: str, step: Step, key: str | None) -> Turn:
    started = time.perf_counter()
    answer = _call(
        base + step.path, body=step.body, headers={**step.headers, **_headers(step.path, key)}
    )
    try:
        prompt, cached = usage_of(step.path, answer)
    except (ValueError, KeyError, TypeError) as exc:
        raise click.ClickException(f"{base}{step.path}: unreadable usage ({exc})") from None
    return Turn(step.session, step.turn, prompt, cached, round(time.perf_counter() - started, 3))


@click.command("replay")
@click.argument("url")
@click.option(
    "--api-key",
    envvar="KVRETENTION_API_KEY",
    default=None,
    help="A tenant key, when the fleet has auth on.",
)
@click.option(
    "--model", default=None, help="The model name to ask for (default: the first the fleet lists)."
)
@click.option(
    "--turns",
    type=click.IntRange(1, 200),
    default=8,
    show_default=True,
    help="Model calls per session.",
)
@click.option(
    "--session",
    "sessions",
    type=click.Choice(SESSIONS),
    multiple=True,
    help="Sessions to replay, interleaved round by round (default: all).",
)
@click.option(
    "--gap-seconds",
    type=click.FloatRange(0),
    default=0.0,
    help="Pause between rounds (a user's think time).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the rows and the summary as JSON.")
def replay_cmd(
    url: str,
    api_key: str | None,
    model: str | None,
    turns: int,
    sessions: tuple[str, ...],
    gap_seconds: float,
    as_json: bool,
) -> None:
    """Replay agent sessions against the frontend at URL and report, per turn, the share of the
    prompt the engine read from its cache (its own cached_tokens) beside the ideal share."""
    base = url.rstrip("/")
    names = sessions or SESSIONS
    chosen = model or _served_model(base, api_key)
    steps = interleave(plan_sessions(names, turns=turns, model=chosen))
    done: list[Turn] = []
    for step in steps:
        if gap_seconds and done and step.turn > done[-1].turn:
            time.sleep(gap_seconds)
        done.append(_send(base, step, api_key))
    table = rows(done)
    totals = summary(table)
    if as_json:
        result = {"url": base, "model": chosen, "rows": table, "summary": totals}
        click.echo(json.dumps(result, indent=1))
        return
    click.echo(
        f"{'session':<12} {'turn':>4} {'prompt':>7} {'cached':>7} {'share':>6} {'ideal':>6} {'s':>7}"
    )
    for r in table:
        click.echo(
            f"{r['session']:<12} {r['turn']:>4} {r['prompt_tokens']:>7} {r['cached_tokens']:>7} "
            f"{r['share']:>6.2f} {r['ideal']:>6.2f} {r['seconds']:>7.2f}"
        )
    s = totals
    if s["turns"]:
        click.echo(
            f"later turns: median share {s['median_share']:.2f} of an ideal {s['median_ideal']:.2f}; "
            f"{s['cached_tokens']} of {s['prompt_tokens']} prompt tokens read from cache"
        )
