"""Claude Code and Codex, as users run them, against SGLang's real engine on CPU.

The fleet of ``examples/agents.yaml`` as the operator renders it (``support.rendered_plane``), with
one worker on ``sglang.Engine`` serving the project's tiny model instead of the stand-in. The
model's answers are noise that ends after a few tokens, so each CLI finishes its task with a text
answer; what is asserted is what the engine did with the agents' real requests: every one served
(none refused), the retention hint on each engine call, and SGLang's own ``cached_tokens``: a
second task of the same CLI reads its system prompt and tools from the radix cache.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import pytest

from support.processes import StartKvretention
from support.real_clients import (
    AGENTS_EXAMPLE,
    Client,
    Exchange,
    Recorder,
    run_claude,
    run_codex,
    run_report,
)
from support.rendered_plane import RenderedPlane, start_rendered_plane
from support.worker_client import wait_for

pytestmark = [pytest.mark.clients, pytest.mark.cpu_engine]

GENERATE_PATHS = ("/v1/messages", "/v1/responses")
SHARED_PREFIX = 1000
"""Tokens a second task surely shares with the first: the CLI's system prompt and tool list."""


@dataclass
class Fleet:
    plane: RenderedPlane
    recorder: Recorder
    tmp: Path

    def worker_trace(self) -> list[dict[str, Any]]:
        path = self.tmp / "w0-trace.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@dataclass
class Task:
    result: CompletedProcess[str]
    exchanges: list[Exchange]
    served: list[dict[str, Any]]
    """The worker's trace entries for this task's generations."""

    def failure(self) -> str:
        return (
            f"{run_report(self.result, self.exchanges, tail=1200)}\n"
            f"requests: {[(e.method, e.path, e.status) for e in self.exchanges]}\n"
            f"served: {[(e['outcome'], e.get('cached_tokens')) for e in self.served]}"
        )


@pytest.fixture(scope="module")
def fleet(start: StartKvretention, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("cpu-plane")
    plane = start_rendered_plane(AGENTS_EXAMPLE, start=start, tmp=tmp, engine="cpu")
    with Recorder(plane.frontend.base_url) as recorder:
        yield Fleet(plane, recorder, tmp)


def _generations(exchanges: list[Exchange]) -> int:
    return sum(
        e.method == "POST" and e.path.split("?")[0] in GENERATE_PATHS and not e.refused
        for e in exchanges
    )


def _task(fleet: Fleet, client: Client, launch: Any, tmp: Path, n: int) -> Task:
    mark, traced = fleet.recorder.mark(), len(fleet.worker_trace())
    workdir = tmp / f"work{n}"
    workdir.mkdir()
    result = launch(
        client,
        "Say hello in one word.",
        base_url=fleet.recorder.base_url,
        workdir=workdir,
        home=tmp / f"home{n}",
    )
    exchanges = fleet.recorder.since(mark)

    def served() -> list[dict[str, Any]]:
        return [e for e in fleet.worker_trace()[traced:] if e["outcome"] == "ok"]

    with contextlib.suppress(AssertionError):  # the tests then say what was not served
        wait_for(lambda: len(served()) >= _generations(exchanges), timeout=30.0)
    return Task(result=result, exchanges=exchanges, served=served())


def _two_tasks(fleet: Fleet, client: Client, launch: Any, tmp: Path) -> list[Task]:
    return [_task(fleet, client, launch, tmp, n) for n in (1, 2)]


@pytest.fixture(scope="module")
def claude(
    fleet: Fleet, clients: dict[str, Client], tmp_path_factory: pytest.TempPathFactory
) -> list[Task]:
    return _two_tasks(fleet, clients["claude"], run_claude, tmp_path_factory.mktemp("claude"))


@pytest.fixture(scope="module")
def codex(
    fleet: Fleet,
    clients: dict[str, Client],
    claude: list[Task],
    tmp_path_factory: pytest.TempPathFactory,
) -> list[Task]:
    return _two_tasks(fleet, clients["codex"], run_codex, tmp_path_factory.mktemp("codex"))


@pytest.mark.parametrize("name", ["claude", "codex"])
def test_each_task_finishes_with_every_request_served(
    name: str, request: pytest.FixtureRequest
) -> None:
    for task in request.getfixturevalue(name):
        assert task.result.returncode == 0, task.failure()
        assert [e for e in task.exchanges if e.refused] == [], task.failure()
        assert len(task.served) == _generations(task.exchanges) > 0, task.failure()


@pytest.mark.parametrize("name", ["claude", "codex"])
def test_every_engine_call_carried_kv_retain(name: str, request: pytest.FixtureRequest) -> None:
    for task in request.getfixturevalue(name):
        for entry in task.served:
            actions = entry["kv_hints"]["actions"]
            assert {(a["action_type"], a["action_version"]) for a in actions} == {
                ("kv.retain", "1.0")
            }


@pytest.mark.parametrize("name", ["claude", "codex"])
def test_a_second_task_reads_the_agents_prefix_from_sglangs_cache(
    name: str, request: pytest.FixtureRequest
) -> None:
    first, second = request.getfixturevalue(name)
    largest = max(e["prompt_tokens"] for e in first.served)
    assert largest > SHARED_PREFIX, first.failure()
    assert max(e["cached_tokens"] for e in second.served) >= SHARED_PREFIX, second.failure()
