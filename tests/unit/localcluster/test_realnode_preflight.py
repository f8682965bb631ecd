"""The real node's preflight (``realnode.preflight``): each thing a machine can lack is named, on a
fake /proc and /sys/fs/cgroup built per case."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kvretention_devtools.localcluster.realnode.preflight import HIERARCHIES, machine_problems

ALL_CAPS = "000001fffeffffff"  # this project's machines: every capability but CAP_SYS_RESOURCE
NO_NET_ADMIN = f"{int(ALL_CAPS, 16) & ~(1 << 12):016x}"


@dataclass
class Machine:
    euid: int = 0
    cap_eff: str = ALL_CAPS
    hierarchies: tuple[str, ...] = HIERARCHIES
    cgroup_v2: bool = False
    bridge_netfilter: bool = True
    netns: bool = True
    iptables_rc: int = 0
    expected: list[str] = field(default_factory=list)


CASES = {
    "a machine that can": Machine(),
    "not root": Machine(euid=1000, expected=["not root (euid 1000)"]),
    "no CAP_NET_ADMIN": Machine(cap_eff=NO_NET_ADMIN, expected=["missing capabilities CAP_NET_ADMIN"]),
    "cgroup v2 only": Machine(cgroup_v2=True, expected=["is cgroup v2 only"]),
    "no pids hierarchy": Machine(
        hierarchies=("cpu", "cpuacct", "cpuset", "memory"),
        expected=["no cgroup v1 hierarchy for pids"],
    ),
    "no br_netfilter": Machine(bridge_netfilter=False, expected=["no bridge netfilter"]),
    "no network namespaces": Machine(netns=False, expected=["no network namespaces"]),
    "no nat table": Machine(iptables_rc=1, expected=["iptables cannot use the nat table (nope)"]),
    "unprivileged container": Machine(
        euid=1000, cap_eff="0000000000000000", cgroup_v2=True, bridge_netfilter=False,
        expected=["not root", "missing capabilities CAP_NET_ADMIN, CAP_SYS_ADMIN, CAP_SYS_PTRACE",
                  "cgroup v2 only", "no bridge netfilter"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_machine_problems_name_what_is_missing(tmp_path: Path, case: Machine) -> None:
    proc, cgroup = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self" / "ns").mkdir(parents=True)
    (proc / "self" / "status").write_text(f"Name:\tpython\nCapEff:\t{case.cap_eff}\n")
    if case.netns:
        (proc / "self" / "ns" / "net").touch()
    if case.bridge_netfilter:
        (proc / "sys" / "net" / "bridge").mkdir(parents=True)
    cgroup.mkdir()
    if case.cgroup_v2:
        (cgroup / "cgroup.controllers").touch()
    for name in case.hierarchies:
        (cgroup / name).mkdir()
        (cgroup / name / "cgroup.procs").touch()
    iptables = tmp_path / "iptables"
    iptables.write_text(f"#!/bin/sh\necho nope >&2\nexit {case.iptables_rc}\n")
    iptables.chmod(0o755)

    problems = machine_problems(proc=proc, cgroup_fs=cgroup, euid=case.euid, iptables=str(iptables))

    assert len(problems) == len(case.expected), problems
    for problem, expected in zip(problems, case.expected, strict=True):
        assert expected in problem, problems
