"""Whether this machine can run a real node at all, before anything is built or installed: root,
the capabilities containerd, runc and the CNI bridge use, cgroup v1 hierarchies, the kernel's
bridge netfilter and network namespaces, and an iptables that reads the nat table.

:func:`main` prints each reason it cannot (exit 3) or nothing (exit 0): ``scripts/test-pods.sh``
runs it before the pods tier, and ``cluster up --real-node`` checks the same.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Final

from kvretention_devtools.localcluster.realnode.config import CGROUP_ROOT

CGROUP_FS: Final = Path("/sys/fs/cgroup")
# The v1 hierarchies the kubelet (cgroupfs driver) needs for its pods' cgroups.
HIERARCHIES: Final = ("cpu", "cpuacct", "cpuset", "memory", "pids")
# Bits of /proc/self/status CapEff (linux/capability.h).
CAPABILITIES: Final = {
    "CAP_NET_ADMIN": 12,  # the bridge, veths, iptables, sysctls under net.*
    "CAP_SYS_ADMIN": 21,  # mounts, network namespaces, cgroups
    "CAP_SYS_PTRACE": 19,  # the kubelet and containerd read /proc of other processes
}


def machine_problems(
    *,
    proc: Path = Path("/proc"),
    cgroup_fs: Path = CGROUP_FS,
    euid: int | None = None,
    iptables: str | None = None,
) -> list[str]:
    """Each reason this machine cannot run the real node, as a sentence naming what is missing."""
    problems: list[str] = []
    uid = os.geteuid() if euid is None else euid
    if uid != 0:
        problems.append(
            f"not root (euid {uid}): the node runs containerd, mounts, network namespaces and "
            "iptables (run make test as root, or sudo)"
        )
    problems += _capability_problems(proc / "self" / "status")
    problems += _cgroup_problems(cgroup_fs)
    if not (proc / "sys" / "net" / "bridge").is_dir():
        problems.append(
            "the kernel has no bridge netfilter (/proc/sys/net/bridge: modprobe br_netfilter)"
        )
    if not (proc / "self" / "ns" / "net").exists():
        problems.append("the kernel has no network namespaces (/proc/self/ns/net)")
    if uid == 0:
        problems += _iptables_problems(iptables or shutil.which("iptables"))
    return problems


def _capability_problems(status: Path) -> list[str]:
    try:
        fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        effective = int(fields["CapEff"].strip(), 16)
    except (OSError, KeyError, ValueError) as err:
        return [f"cannot read the process's capabilities from {status}: {err}"]
    missing = [name for name, bit in CAPABILITIES.items() if not effective >> bit & 1]
    if not missing:
        return []
    return [
        f"missing capabilities {', '.join(missing)} (CapEff {effective:#x}): an unprivileged "
        "container cannot run a node (run it privileged, or on a VM)"
    ]


def _cgroup_problems(cgroup_fs: Path) -> list[str]:
    if (cgroup_fs / "cgroup.controllers").exists():
        return [
            f"{cgroup_fs} is cgroup v2 only: the node's kubelet is set up for cgroup v1 "
            "hierarchies (cgroupfs driver, docs/real-node.md)"
        ]
    missing = [h for h in HIERARCHIES if not (cgroup_fs / h / "cgroup.procs").is_file()]
    if missing:
        return [
            f"no cgroup v1 hierarchy for {', '.join(missing)} under {cgroup_fs} "
            "(the kubelet puts each pod in every one)"
        ]
    readonly = [h for h in HIERARCHIES if not os.access(cgroup_fs / h, os.W_OK)]
    if readonly:
        return [
            f"cannot create the node's cgroup /{CGROUP_ROOT} in {', '.join(readonly)} "
            f"under {cgroup_fs} (read-only: a container without its own cgroup namespace?)"
        ]
    return []


def _iptables_problems(iptables: str | None) -> list[str]:
    if iptables is None:
        return []  # a missing package: scripts/install-node.sh installs it
    try:
        done = subprocess.run(
            [iptables, "-w", "5", "-t", "nat", "-S"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return [f"{iptables} -t nat -S failed: {err}"]
    if done.returncode != 0:
        why = (done.stderr.strip() or done.stdout.strip()).splitlines()[:1]
        return [
            f"iptables cannot use the nat table ({' '.join(why)}): kube-proxy needs it "
            "(kernel modules iptable_nat / nf_nat)"
        ]
    return []


def main() -> int:
    problems = machine_problems()
    for problem in problems:
        print(f"- {problem}")
    return 3 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
