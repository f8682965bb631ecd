"""What the real node changes on this machine, recorded before it starts and put back after.

The record (a JSON file in the node's folder, written before anything changes) holds each sysctl
the kubelet, kube-proxy or the CNI bridge may set, the iptables and ip6tables rules, the mount
points, network namespaces and links, and which fixed paths already existed. ``restore`` undoes
the difference: it unmounts what was mounted, deletes what was created, restores each changed
sysctl and puts every iptables table back as it was (a table that did not exist is emptied), so
no rule such as the kubelet's ``KUBE-FIREWALL`` (which drops non-loopback sources to 127/8) is
left to break loopback tests. ``leftovers`` says what is still different, for tests and ``down``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from kvretention_devtools.localcluster.errors import ClusterError
from kvretention_devtools.localcluster.realnode.config import (
    BRIDGE,
    CGROUP_ROOT,
    FIXED_PATHS,
    SYSCTLS,
)

Echo = Callable[[str], None]
CGROUP_FS = Path("/sys/fs/cgroup")
_COUNTERS = re.compile(r" \[\d+:\d+\]$")
_BUILTIN_CHAINS = {
    "filter": ("INPUT", "FORWARD", "OUTPUT"),
    "nat": ("PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"),
    "mangle": ("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"),
    "raw": ("PREROUTING", "OUTPUT"),
    "security": ("INPUT", "FORWARD", "OUTPUT"),
}


@dataclass(frozen=True)
class HostRecord:
    sysctls: dict[str, str]
    iptables: dict[str, str]
    """``iptables-save`` / ``ip6tables-save`` output per family, before the node."""
    mounts: list[str]
    netns: list[str]
    links: list[str]
    existing_paths: list[str]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> HostRecord:
        return cls(**json.loads(text))


def record() -> HostRecord:
    return HostRecord(
        sysctls={name: value for name in SYSCTLS if (value := read_sysctl(name)) is not None},
        iptables={family: _save_rules(family) for family in ("iptables", "ip6tables")},
        mounts=mount_points(),
        netns=_netns(),
        links=_links(),
        existing_paths=[str(p) for p in FIXED_PATHS if p.exists()],
    )


def restore(rec: HostRecord, *, owned: Sequence[Path], echo: Echo) -> list[str]:
    """Undo everything the node changed; returns what could not be undone (empty when clean)."""
    problems: list[str] = []
    for mount in sorted(set(mount_points()) - set(rec.mounts), key=len, reverse=True):
        if _under(mount, [*owned, *FIXED_PATHS]):
            done = subprocess.run(["umount", "-l", mount], capture_output=True, text=True)
            if done.returncode != 0:
                problems.append(f"umount {mount}: {done.stderr.strip()}")
    for ns in sorted(set(_netns()) - set(rec.netns)):
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
    for link in sorted(set(_links()) - set(rec.links)):
        if link == BRIDGE or link.startswith("veth"):
            subprocess.run(["ip", "link", "delete", link], capture_output=True)
    _remove_cgroups(echo)
    for family, saved in rec.iptables.items():
        problems += _restore_rules(family, saved)
    for name, value in rec.sysctls.items():
        if read_sysctl(name) != value:
            echo(f"restoring {name}={value} (was {read_sysctl(name)})")
            write_sysctl(name, value)
    for path in FIXED_PATHS:
        if str(path) not in rec.existing_paths and path.exists():
            shutil.rmtree(path, ignore_errors=True)
    return problems + leftovers(rec)


def leftovers(rec: HostRecord) -> list[str]:
    """What still differs from the record: rules, sysctls, mounts, links, cgroups, paths."""
    found: list[str] = []
    for family, saved in rec.iptables.items():
        before, after = _rules(saved), _rules(_save_rules(family))
        found += [f"{family} rule left: {rule}" for rule in sorted(after - before)]
    found += [
        f"sysctl {name}={read_sysctl(name)} (was {value})"
        for name, value in rec.sysctls.items()
        if read_sysctl(name) != value
    ]
    found += [f"mount left: {m}" for m in sorted(set(mount_points()) - set(rec.mounts))]
    found += [f"netns left: {n}" for n in sorted(set(_netns()) - set(rec.netns))]
    found += [f"link left: {link}" for link in sorted(set(_links()) - set(rec.links))]
    found += [f"cgroup left: {c}" for c in _cgroup_dirs()]
    found += [
        f"path left: {p}" for p in FIXED_PATHS if str(p) not in rec.existing_paths and p.exists()
    ]
    return found


def read_sysctl(name: str) -> str | None:
    try:
        return _sysctl_path(name).read_text().strip()
    except OSError:
        return None


def write_sysctl(name: str, value: str) -> None:
    try:
        _sysctl_path(name).write_text(value + "\n")
    except OSError as err:
        raise ClusterError(f"cannot set {name}={value}: {err}") from err


def mount_points() -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        points.append(fields[4].replace("\\040", " "))
    return points


def prepare_cgroups() -> None:
    """The kubelet's cgroup root in every v1 hierarchy (it fails on a missing one); cpuset needs
    its cpus and mems copied from the parent before any task can join."""
    for hierarchy in _hierarchies():
        path = hierarchy / CGROUP_ROOT
        path.mkdir(exist_ok=True)
        for name in ("cpuset.cpus", "cpuset.mems"):
            if (hierarchy / name).exists():
                (path / name).write_text((hierarchy / name).read_text())


def _remove_cgroups(echo: Echo) -> None:
    for path in _cgroup_dirs():
        with contextlib.suppress(OSError):
            path.rmdir()
            continue
        echo(f"cannot remove cgroup {path} (tasks still in it?)")


def _cgroup_dirs() -> list[Path]:
    """Every folder under the node's cgroup root, deepest first."""
    dirs: list[Path] = []
    for hierarchy in _hierarchies():
        root = hierarchy / CGROUP_ROOT
        if root.is_dir():
            dirs += [Path(d) for d, _, _ in os.walk(root)]
    return sorted(dirs, key=lambda p: len(p.parts), reverse=True)


def _hierarchies() -> list[Path]:
    if (CGROUP_FS / "cgroup.controllers").exists():
        return [CGROUP_FS]  # v2: one hierarchy
    return [p for p in sorted(CGROUP_FS.iterdir()) if p.is_dir() and not p.is_symlink()]


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def _save_rules(family: str) -> str:
    tool = shutil.which(f"{family}-save")
    if tool is None:
        return ""
    return subprocess.run([tool], capture_output=True, text=True, check=False).stdout


def _rules(saved: str) -> set[str]:
    """Rules and user chains of a dump, without counters, comments or the built-in policies."""
    out = set()
    table = ""
    for line in saved.splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith("-A") or (
            line.startswith(":") and line[1:].split()[0] not in _BUILTIN_CHAINS.get(table, ())
        ):
            out.add(f"{table} {_COUNTERS.sub('', line)}")
    return out


def _restore_rules(family: str, saved: str) -> list[str]:
    """Put back every table as saved; a table created since is emptied (built-ins, no rules)."""
    now = _save_rules(family)
    tables_now = {line[1:] for line in now.splitlines() if line.startswith("*")}
    sections = _sections(saved)
    script = []
    for table in sorted(tables_now | set(sections)):
        if table in sections:
            script.append(sections[table])
        else:
            chains = _BUILTIN_CHAINS.get(table, ())
            script.append(
                "\n".join([f"*{table}", *(f":{c} ACCEPT [0:0]" for c in chains), "COMMIT"])
            )
    if not script:
        return []
    tool = shutil.which(f"{family}-restore")
    if tool is None:
        return [f"{family}-restore not found; rules may be left behind"]
    done = subprocess.run(
        [tool], input="\n".join(script) + "\n", capture_output=True, text=True, check=False
    )
    return [f"{family}-restore: {done.stderr.strip()}"] if done.returncode != 0 else []


def _sections(saved: str) -> dict[str, str]:
    sections: dict[str, str] = {}
    current: list[str] = []
    for line in saved.splitlines():
        if line.startswith("*"):
            current = [line]
        elif current:
            current.append(line)
            if line == "COMMIT":
                sections[current[0][1:]] = "\n".join(current)
                current = []
    return sections


def _netns() -> list[str]:
    base = Path("/run/netns")
    return sorted(p.name for p in base.iterdir()) if base.is_dir() else []


def _links() -> list[str]:
    done = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True)
    return [line.split(":")[1].strip().split("@")[0] for line in done.stdout.splitlines()]


def _under(path: str, roots: Iterable[Path]) -> bool:
    return any(path == str(r) or path.startswith(str(r) + "/") for r in roots)
