"""The L3 harness: the real ``mooncake_master`` started with the operator's rendered argv, and the
real Mooncake store client set up from the rendered worker config.

Shared by the L3 tests and ``benchmarks/mooncake_pressure.py``. The store client's native module
links ``libcuda.so.1``; on a CPU host ``scripts/build-cuda-standin.sh`` builds a TEST-ONLY stand-in
(every driver call answers "no device") which is loaded here before ``mooncake.store`` is imported.
Worker images keep the real NVIDIA driver.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import importlib.metadata
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from kvretention.api.models import KvRetentionDeployment
from kvretention.controller.kvstore_metrics import parse_master_metrics
from kvretention.controller.resources import (
    build_mooncake_client_config,
    build_mooncake_master_args,
)
from kvretention.ports import free_ports

ROOT = Path(__file__).resolve().parents[2]
STANDIN_SCRIPT = ROOT / "scripts" / "build-cuda-standin.sh"
MASTER_BIN = Path(sys.executable).parent / "mooncake_master"
STARTUP_S = 20.0
MIB = 1024 * 1024
SEGMENT_BYTES = 16 * MIB
"""The smallest segment the client accepts ("Total size must be at least 16777216")."""

# Mooncake's ErrorCode values (mooncake-store/include/types.h), as the Python client returns them.
OK = 0
NO_AVAILABLE_HANDLE = -200
INVALID_PARAMS = -600
OBJECT_HAS_LEASE = -706


class StandinError(RuntimeError):
    """The stand-in libcuda could not be built: the L3 store tests cannot run."""


def build_standin() -> Path:
    """Build (or reuse from the cache) the test-only libcuda stand-in; its directory."""
    proc = subprocess.run(
        ["bash", str(STANDIN_SCRIPT)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "KVR_VENV": str(Path(sys.executable).parent.parent)},
    )
    if proc.returncode != 0:
        raise StandinError(f"{STANDIN_SCRIPT.name} failed:\n{proc.stderr}")
    return Path(proc.stdout.strip().splitlines()[-1])


SGLANG_IMPORT_DEPS = (
    "dill==0.4.1",
    "sentencepiece==0.2.3",
    "networkx==3.6.1",
    "compressed-tensors==0.20.1",
    "gguf==0.19.0",
    "loguru==0.7.3",
)
"""What ``sglang.srt.mem_cache.storage.mooncake_store.mooncake_store`` imports at module level
beyond torch (through ``sglang.srt.configs`` and the quantization layers), found by importing it
until it loaded; none of them needs a GPU. Plus torchvision, whose release must pair with the
installed torch (``torchvision_requirement``)."""


def torchvision_requirement(torch_version: str) -> str:
    """The torchvision release line built against a torch release: 0.(minor + 15) for torch 2.x
    (torch 2.14 -> torchvision 0.29), the pairing PyTorch has kept since torch 2.0 / 0.15."""
    major, minor = (int(part) for part in torch_version.split("+")[0].split(".")[:2])
    if major != 2:
        raise ValueError(f"no known torchvision pairing for torch {torch_version}")
    return f"torchvision==0.{minor + 15}.*"


def sglang_import_deps() -> Path:
    """SGLang's import-only dependencies in a cache dir (``--no-deps``, pinned), for a subprocess's
    ``PYTHONPATH``; kept out of the shared venv so they change no other test's imports."""
    requirements = (
        torchvision_requirement(importlib.metadata.version("torch")),
        *SGLANG_IMPORT_DEPS,
    )
    key = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:12]
    cache = Path(os.environ.get("KVR_CACHE", Path.home() / ".cache" / "kvretention"))
    target = cache / "sglang-import-deps" / key
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / f"{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel test workers may race on a cold cache
        if not (target / ".complete").exists():
            _install_import_deps(requirements, target)
    return target


def _install_import_deps(requirements: Sequence[str], target: Path) -> None:
    work = target.with_name(f"{target.name}.partial")
    shutil.rmtree(work, ignore_errors=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--disable-pip-version-check",
            "--target",
            str(work),
            *requirements,
        ],
        check=True,
        timeout=600,
    )
    (work / ".complete").touch()
    work.replace(target)


def load_store_module(standin: Path) -> ModuleType:
    """``mooncake.store``, after loading the stand-in driver and libcudart into the process.

    The loader satisfies the module's ``DT_NEEDED`` entries by soname from libraries already loaded,
    so no ``LD_LIBRARY_PATH`` (which only a new process would read) is needed.
    """
    for name in ("libcuda.so.1", "libcudart.so.12"):
        ctypes.CDLL(str(standin / name), mode=ctypes.RTLD_GLOBAL)
    import mooncake.store

    return mooncake.store


def fleet_cr(
    *, master: Mapping[str, Any], segment_bytes: int = SEGMENT_BYTES
) -> KvRetentionDeployment:
    """A fleet whose managed master listens on free loopback ports; ``master`` overrides the rest."""
    rpc, metrics, metadata = free_ports(3)
    return KvRetentionDeployment.from_k8s(
        {
            "apiVersion": "kvretention.io/v1alpha1",
            "kind": "KvRetentionDeployment",
            "metadata": {"name": "l3", "namespace": "test"},
            "spec": {
                "model": {"name": "m", "path": "p"},
                "kvStore": {
                    "mooncake": {
                        "master": {
                            "rpcPort": rpc,
                            "metricsPort": metrics,
                            "metadataPort": metadata,
                            **master,
                        },
                        "transfer": {"protocol": "tcp", "globalSegmentSize": str(segment_bytes)},
                    }
                },
            },
        }
    )


@dataclass(frozen=True)
class Master:
    """A running ``mooncake_master`` and the fleet whose rendered argv started it."""

    cr: KvRetentionDeployment
    argv: list[str]
    process: subprocess.Popen[bytes]
    log: Path
    clients: list[Store] = field(default_factory=list)
    """Store clients of this master: closed before it stops (a client whose master is gone
    retries its RPCs for seconds on close)."""

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.cr.spec.kv_store.mooncake.master.metrics_port}/metrics"

    def config(self) -> dict[str, Any]:
        """The worker's rendered Mooncake client config, pointed at this loopback master."""
        return build_mooncake_client_config(self.cr.spec, master_host="127.0.0.1")

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=3) as response:
            return str(response.read().decode())

    def metrics(self) -> dict[str, float]:
        """The master's /metrics, through the operator's own parser."""
        return parse_master_metrics(self.metrics_text())

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def running_master(
    cr: KvRetentionDeployment, workdir: Path, *, extra_args: Sequence[str] = ()
) -> Iterator[Master]:
    """Start ``mooncake_master`` with exactly the rendered argv (plus ``extra_args``, for a master
    set up apart from the operator, e.g. an external one); stop it (by pid) on exit."""
    if not MASTER_BIN.exists():
        raise FileNotFoundError(f"{MASTER_BIN} missing: run scripts/bootstrap.sh")
    argv = build_mooncake_master_args(cr.spec)
    assert argv[0] == "mooncake_master"
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "master.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(MASTER_BIN), *argv[1:], *extra_args],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=workdir,
        )
    master = Master(cr, argv, process, log)
    try:
        _wait_ready(master)
        yield master
    finally:
        for client in master.clients:
            client.close()
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _wait_ready(master: Master) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if master.process.poll() is not None:
            raise RuntimeError(
                f"mooncake_master exited {master.process.returncode}:\n{master.log_text()}"
            )
        # The master logs "started on port" and serves metrics before its RPC server listens.
        with contextlib.suppress(OSError):
            master.metrics_text()
            rpc_port = master.cr.spec.kv_store.mooncake.master.rpc_port
            socket.create_connection(("127.0.0.1", rpc_port), timeout=1).close()
            return
        time.sleep(0.1)
    raise TimeoutError(f"mooncake_master not ready in {STARTUP_S}s:\n{master.log_text()}")


MasterFactory = Callable[..., contextlib.AbstractContextManager[Master]]
"""The ``start_master`` fixture: ``with start_master(master={...}) as master``."""


class Store:
    """The real ``MooncakeDistributedStore``, set up from the worker's rendered config."""

    def __init__(
        self, module: ModuleType, master: Master, config: Mapping[str, Any] | None = None
    ) -> None:
        """``config``: a worker config rendered for another fleet on this master (external mode)."""
        self.module = module
        config = master.config() if config is None else config
        self.client = module.MooncakeDistributedStore()
        rc = self.client.setup(
            "127.0.0.1",
            config["metadata_server"],
            int(config["global_segment_size"]),
            SEGMENT_BYTES,  # the local transfer buffer; 16 MiB is the client's minimum
            config["protocol"],
            config["device_name"],
            config["master_server_address"],
            tenant_id=config.get("tenant_id", "default"),
        )
        if rc != OK:
            raise RuntimeError(f"MooncakeDistributedStore.setup returned {rc}")
        self.closed = False
        master.clients.append(self)

    def pin_config(self, ttl_ms: int | None) -> Any:
        """A soft-pinned write; ``None`` leaves the TTL to the master's default."""
        config = self.module.ReplicateConfig()
        config.soft_pin_action = self.module.SoftPinAction.ENABLE
        if ttl_ms is not None:
            config.soft_pin_ttl_ms = ttl_ms
        return config

    def put(
        self, key: str, value: bytes, *, pin_ttl_ms: int | None = None, pin: bool = False
    ) -> int:
        if pin or pin_ttl_ms is not None:
            return int(self.client.put(key, value, self.pin_config(pin_ttl_ms)))
        return int(self.client.put(key, value))

    def put_under_pressure(self, key: str, value: bytes, *, retry_s: float = 2.0) -> int:
        """A write that waits for the master's eviction thread while the pool is full.

        Eviction runs asynchronously, so a write into a full pool fails with NO_AVAILABLE_HANDLE
        until the next eviction round frees space; a writer such as HiCache simply writes again.
        """
        deadline = time.monotonic() + retry_s
        while True:
            rc = self.put(key, value)
            if rc != NO_AVAILABLE_HANDLE or time.monotonic() > deadline:
                return rc
            time.sleep(0.02)

    def get(self, key: str) -> bytes:
        return bytes(self.client.get(key))

    def exists(self, key: str) -> bool:
        return int(self.client.is_exist(key)) == 1

    def remove(self, key: str) -> int:
        return int(self.client.remove(key))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.client.close()


def value_for(key: str, size: int) -> bytes:
    """A value whose bytes depend on the key, so a read can tell objects apart."""
    seed = key.encode()
    return (seed * (size // len(seed) + 1))[:size]
