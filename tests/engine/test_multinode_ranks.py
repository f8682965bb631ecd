"""What each rank of a multinode worker hands SGLang: the rendered LeaderWorkerSet's flags, with
the values the LWS pod webhook injects, read by SGLang 0.5.23's own parser; and a non-zero rank's
worker exits when SGLang's engine returns (its schedulers ended), so the group is recreated."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvretention.api.models import KvRetentionDeployment
from kvretention.controller.resources import build_children
from kvretention.controller.resources.lws import DIST_INIT_PORT
from kvretention.dataplane.worker import engine as worker_engine
from kvretention.dataplane.worker.engine import EngineLoadError
from kvretention.dataplane.worker.sglang_source import locate_sglang
from kvretention.ports import WORKER_PORT

pytestmark = [pytest.mark.engine]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "multinode.yaml"
LEADER = "qwen-235b-worker-lws-1.qwen-235b-worker-lws.default"


def _sglang_argv(template: str, *, rank: int) -> list[str]:
    cr = KvRetentionDeployment.from_k8s(yaml.safe_load(EXAMPLE.read_text()))
    (lws,) = [c for c in build_children(cr) if c["kind"] == "LeaderWorkerSet"]
    pod = lws["spec"]["leaderWorkerTemplate"][template]["spec"]
    command: list[str] = pod["containers"][0]["command"]
    env = {"LWS_WORKER_INDEX": str(rank), "LWS_LEADER_ADDRESS": LEADER}
    argv = command[command.index("--") + 1 :]
    for name, value in env.items():  # the kubelet's $(VAR) expansion
        argv = [a.replace(f"$({name})", value) for a in argv]
    return argv


_PARSE = """
import json, sys
from kvretention.dataplane.worker.engine import parse_server_args
a = parse_server_args(json.loads(sys.argv[1]))
print(json.dumps({k: getattr(a, k) for k in ("nnodes", "node_rank", "tp_size", "dist_init_addr",
                                             "host", "port")}))
"""


def _parsed_in_own_process(argv: list[str]) -> types.SimpleNamespace:
    """SGLang's ServerArgs for ``argv``, parsed in a process of its own as a worker does: SGLang's
    plugin loader runs once per process, so parsing here would decide for later tests which
    plugins that process loaded."""
    out = subprocess.run(
        [sys.executable, "-c", _PARSE, json.dumps(argv)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return types.SimpleNamespace(**json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize(("template", "rank"), [("leaderTemplate", 0), ("workerTemplate", 1)])
def test_sglang_reads_each_ranks_multinode_flags(template: str, rank: int) -> None:
    if locate_sglang() is None:
        pytest.fail("sglang 0.5.23 is not installed (make bootstrap installs it)")
    args = _parsed_in_own_process(_sglang_argv(template, rank=rank))
    assert (args.nnodes, args.node_rank, args.tp_size) == (2, rank, 16)
    assert args.dist_init_addr == f"{LEADER}:{DIST_INIT_PORT}"
    if rank:  # SGLang's own health server on a non-zero rank answers the pod's probes
        assert (args.host, args.port) == ("0.0.0.0", WORKER_PORT)
    else:  # the leader's HTTP is the worker's; SGLang keeps its own default port
        assert args.port != WORKER_PORT


class _ReturnedEngine:
    """``sglang.Engine`` as it is on a non-zero rank once its schedulers have exited."""

    def __init__(self, server_args: Any) -> None:
        self.server_args = server_args

    async def async_generate(self, **kwargs: Any) -> Any:  # pragma: no cover - never called
        raise NotImplementedError


@pytest.mark.parametrize(("rank", "exits"), [(1, True), (0, False)])
def test_a_non_zero_rank_exits_when_its_engine_returns(
    monkeypatch: pytest.MonkeyPatch, rank: int, exits: bool
) -> None:
    fake = types.ModuleType("sglang")
    fake.Engine = _ReturnedEngine  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sglang", fake)
    server_args = types.SimpleNamespace(node_rank=rank)
    monkeypatch.setattr(worker_engine, "parse_server_args", lambda argv: server_args)
    stop = RuntimeError("reached the dialect check")

    def dialect_check(*_: Any, **__: Any) -> Any:
        raise stop

    monkeypatch.setattr(worker_engine, "has_versioned_decoder", dialect_check)
    with pytest.raises(EngineLoadError if exits else RuntimeError) as err:
        worker_engine._load_sglang(["--node-rank", str(rank)], device="cuda")
    if exits:
        assert "node rank 1: SGLang's schedulers exited" in str(err.value)
    else:
        assert err.value is stop
