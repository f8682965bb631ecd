"""L3: SGLang 0.5.23's own Mooncake backend against the operator's rendered config and worker env.

Two layers, both SGLang's real code:

* ``MooncakeStoreConfig.from_file`` (how a worker reads the mounted ``mooncake.json``), taken from
  SGLang's installed source with ``ast`` so that it runs without SGLang's heavy import chain;
* the whole ``MooncakeStore`` class, which runs on CPU (torch's PyPI wheel, the test-only libcuda
  stand-in, and seven import-only packages that ``sglang.srt.configs`` and the quantization
  layers pull in): it sets up from the rendered file, warms up, and writes and reads KV pages
  through Mooncake, in a subprocess.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import subprocess
import sys
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sglang
from mooncake_harness import (
    ROOT,
    Master,
    MasterFactory,
    build_standin,
    sglang_import_deps,
)

from kvretention.api.models import KvRetentionDeployment
from kvretention.controller.kvstore_metrics import parse_usage
from kvretention.controller.resources import build_children
from kvretention.controller.resources.mooncake import CONFIG_KEY, CONFIG_PATH, config_data

pytestmark = pytest.mark.l3

MOONCAKE_SOURCE = (
    Path(sglang.__file__).parent / "srt/mem_cache/storage/mooncake_store/mooncake_store.py"
)
CONFIG_NAMES = frozenset(
    {
        "DEFAULT_TENANT_ID",
        "_parse_global_segment_size",
        "_normalize_tenant_id",
        "MooncakeStoreConfig",
    }
)
POD_IP = "10.1.2.3"


def sglang_mooncake_config_class() -> Any:
    """SGLang's ``MooncakeStoreConfig`` and the helpers it calls, compiled from its own source."""
    from sglang.srt.environ import envs

    tree = ast.parse(MOONCAKE_SOURCE.read_text())
    picked: list[ast.stmt] = []
    for node in tree.body:
        if (isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name in CONFIG_NAMES) or (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id in CONFIG_NAMES for t in node.targets)
        ):
            picked.append(node)
    found = {getattr(n, "name", None) or n.targets[0].id for n in picked}  # type: ignore[attr-defined]
    assert found == CONFIG_NAMES, f"SGLang moved its Mooncake config code: found {found}"
    # A registered module: dataclasses resolves annotations through sys.modules[cls.__module__].
    module = types.ModuleType("kvr_sglang_mooncake_config")
    module.__dict__.update(
        envs=envs, os=os, json=json, dataclass=dataclasses.dataclass, Optional=typing.Optional
    )
    sys.modules[module.__name__] = module
    code = compile(ast.Module(body=picked, type_ignores=[]), str(MOONCAKE_SOURCE), "exec")
    exec(code, module.__dict__)
    namespace = module.__dict__
    return namespace["MooncakeStoreConfig"]


def fleet(mooncake: dict[str, Any]) -> KvRetentionDeployment:
    return KvRetentionDeployment.from_k8s(
        {
            "apiVersion": "kvretention.io/v1alpha1",
            "kind": "KvRetentionDeployment",
            "metadata": {"name": "f", "namespace": "ns"},
            "spec": {"model": {"name": "m", "path": "p"}, "kvStore": {"mooncake": mooncake}},
        }
    )


def worker_env(cr: KvRetentionDeployment) -> dict[str, str]:
    """The Mooncake variables of the rendered worker container as the kubelet resolves them: the
    pod IP filled in, ``$(VAR)`` references expanded from the variables defined before."""
    for manifest in build_children(cr):
        if manifest["kind"] != "Deployment":
            continue
        for container in manifest["spec"]["template"]["spec"]["containers"]:
            names = [e["name"] for e in container.get("env", [])]
            if "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH" not in names:
                continue
            resolved: dict[str, str] = {}
            for e in container["env"]:
                if "value" in e:
                    resolved[e["name"]] = re.sub(
                        r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                        lambda m, known=resolved: known.get(m.group(1), m.group(0)),
                        e["value"],
                    )
                elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
                    resolved[e["name"]] = POD_IP
            return {
                k: v for k, v in resolved.items() if k.startswith(("MOONCAKE_", "SGLANG_HICACHE_"))
            }
    raise AssertionError("no rendered worker container mounts the Mooncake config")


@pytest.fixture
def as_worker(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[Callable[[KvRetentionDeployment], dict[str, str]]]:
    """Put the rendered config file where the worker env says, and that env in this process."""

    def apply(cr: KvRetentionDeployment) -> dict[str, str]:
        for name in [n for n in os.environ if n.startswith("MOONCAKE_")]:
            monkeypatch.delenv(name)
        env = worker_env(cr)
        assert env["SGLANG_HICACHE_MOONCAKE_CONFIG_PATH"] == CONFIG_PATH
        path = tmp_path / CONFIG_KEY
        path.write_text(config_data(cr)[CONFIG_KEY])
        env["SGLANG_HICACHE_MOONCAKE_CONFIG_PATH"] = str(path)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return env

    yield apply


CLIENT_CONFIG_KEYS = (
    "master_server_address",
    "metadata_server",
    "protocol",
    "device_name",
    "global_segment_size",
    "master_metrics_port",
)


def client_config(*values: object, **extra: object) -> dict[str, object]:
    """SGLang's Mooncake config fields, in ``CLIENT_CONFIG_KEYS`` order, plus ``extra``."""
    return {**dict(zip(CLIENT_CONFIG_KEYS, values, strict=True)), **extra}


@pytest.mark.parametrize(
    ("mooncake", "expected"),
    [
        pytest.param(
            {},
            client_config(
                "f-mooncake.ns.svc:50051",
                "http://f-mooncake.ns.svc:8080/metadata",
                "tcp",
                "",
                4 * 1024**3,
                9003,
            ),
            id="managed-defaults",
        ),
        pytest.param(
            {
                "master": {"rpcPort": 50052, "metadataPort": 8081, "metricsPort": 9100},
                "transfer": {
                    "protocol": "rdma",
                    "device": "mlx5_0,mlx5_1",
                    "globalSegmentSize": "16gb",
                },
            },
            client_config(
                "f-mooncake.ns.svc:50052",
                "http://f-mooncake.ns.svc:8081/metadata",
                "rdma",
                "mlx5_0,mlx5_1",
                16 * 1024**3,
                9100,
            ),
            id="managed-rdma",
        ),
        pytest.param(
            {
                "mode": "external",
                "external": {"masterAddress": "mc.example:50051"},
                "transfer": {"globalSegmentSize": "1073741824"},
            },
            # 9003: SGLang's default metrics port (nothing rendered)
            client_config(
                "mc.example:50051", "P2PHANDSHAKE", "tcp", "", 1024**3, 9003, tenant_id="default"
            ),
            id="external",
        ),
        pytest.param(
            {"mode": "external", "external": {"masterAddress": "mc:1", "tenant": "team.fleet"}},
            {"master_server_address": "mc:1", "tenant_id": "team.fleet"},
            id="external-tenant",
        ),
    ],
)
def test_sglang_reads_the_rendered_config_as_rendered(
    as_worker: Callable[[KvRetentionDeployment], dict[str, str]],
    mooncake: dict[str, Any],
    expected: dict[str, Any],
) -> None:
    cr = fleet(mooncake)
    as_worker(cr)
    config = sglang_mooncake_config_class().from_file()
    got = {name: getattr(config, name) for name in expected}
    assert got == expected
    assert config.local_hostname == POD_IP  # MOONCAKE_LOCAL_HOSTNAME from the pod IP wins
    assert config.check_server is False and config.standalone_storage is False


# -- the whole backend ---------------------------------------------------------------------------


def _torch_error() -> str | None:
    proc = subprocess.run(
        [sys.executable, "-c", "import torch"], capture_output=True, text=True, timeout=300
    )
    return None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["?"])[-1]


def test_sglang_mooncake_store_writes_and_reads_pages_on_cpu(
    start_master: MasterFactory,
    as_worker: Callable[[KvRetentionDeployment], dict[str, str]],
    tmp_path: Path,
) -> None:
    """SGLang's ``MooncakeStore`` sets up from the rendered file and worker env, and its
    zero-copy ``batch_set``/``get`` round-trip KV pages through the managed master. It writes no
    soft pins: SGLang 0.5.23 never sets ``ReplicateConfig.soft_pin_action``."""
    torch_error = _torch_error()
    if torch_error is not None:
        # SGLang's backend imports torch at module level; the config test above still runs.
        if os.environ.get("KVR_REQUIRE_TORCH"):
            pytest.fail(f"torch does not import: {torch_error}")
        pytest.skip(f"SGLang's MooncakeStore needs torch, which does not import: {torch_error}")
    deps = sglang_import_deps()
    pages, page_bytes = 16, 64 * 1024
    with start_master(master={"leaseTtlMilliseconds": 50}) as master:
        env = as_worker(master.cr)
        env["MOONCAKE_LOCAL_HOSTNAME"] = "127.0.0.1"
        # The rendered file names the Service's DNS name; on loopback the master is 127.0.0.1.
        loopback = master.config()
        Path(env["SGLANG_HICACHE_MOONCAKE_CONFIG_PATH"]).write_text(json.dumps(loopback))
        report = _run_backend(master, env, deps, pages=pages, page_bytes=page_bytes)
    usage = parse_usage(report["metrics"])
    assert report["config"] == {
        **{k: loopback[k] for k in ("master_server_address", "metadata_server", "protocol")},
        "device_name": loopback["device_name"],
        "global_segment_size": int(loopback["global_segment_size"]),
        "master_metrics_port": loopback["master_metrics_port"],
        "local_hostname": "127.0.0.1",
    }
    assert report["batch_set"] is True
    assert report["exists"] == [True] * pages
    assert report["get"] == [True] * pages
    assert report["equal"] is True
    assert usage.keys >= pages
    assert usage.pinned_keys == 0


def _run_backend(
    master: Master, env: dict[str, str], deps: Path, *, pages: int, page_bytes: int
) -> dict[str, Any]:
    script = Path(__file__).with_name("sglang_backend_check.py")
    run_env = {
        **os.environ,
        **env,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(deps)]),
        "PYTHONWARNINGS": "ignore",
    }
    proc = subprocess.run(
        [
            sys.executable,
            str(script),
            str(build_standin()),
            str(pages),
            str(page_bytes),
            master.metrics_url,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=run_env,
        check=False,
    )
    assert proc.returncode == 0, f"SGLang's MooncakeStore failed:\n{proc.stderr[-4000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no report:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    report: dict[str, Any] = json.loads(lines[-1])
    return report
