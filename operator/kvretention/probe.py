"""``kvretention probe``: can this image's SGLang take KV hints, and apply them? One JSON report, an
exit status.

Runs inside a worker image, without a GPU and without starting the engine: SGLang's files are
located with ``importlib.util.find_spec`` and read with ``ast``. Two checks import things, each in a
child process so a native crash or a hang cannot take the probe down with it: the Mooncake store,
and the retention plugin, which SGLang's own plugin loader loads (that imports SGLang, and torch
with it) before the plugin's hook targets are checked in the same SGLang. The schema is documented
in ``docs/probe.md``; the operator reads it from the container's termination message
(``--termination-log /dev/termination-log``).

Exit status: 0 usable for a hinted fleet; 3 SGLang present but it cannot take ``kv_hints``;
4 SGLang not installed. Whether the plugin applies ``kv.retain`` is reported, not part of the exit
status (an image without it still transports hints).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Final

import click

from kvretention.api.probe_report import (
    DEVICES,
    PLUGIN_LOAD_FAILED,
    PLUGIN_LOADED,
    PLUGIN_NOT_INSTALLED,
    PLUGIN_NOT_SELECTED,
    PLUGIN_UNSUPPORTED,
    RETENTION_PLUGIN_STATES,
    TARGET_PROBLEMS_KEPT,
    ProbeReport,
    render_report,
)
from kvretention.dataplane.worker.dialect import Dialect, detect_dialect
from kvretention.dataplane.worker.sglang_source import (
    async_generate_params,
    has_versioned_decoder_source,
    hicache_storage_backends,
    locate_sglang,
    read_version,
)
from kvretention.retention import EVICTION_POLICY
from kvretention.retention.tree_core import core_label, plan_tree_core

EXIT_USABLE: Final = 0
EXIT_NO_HINTS: Final = 3
EXIT_NO_SGLANG: Final = 4
MOONCAKE_IMPORT: Final = "from mooncake.store import MooncakeDistributedStore"
MOONCAKE_TIMEOUT_S: Final = 60.0
ERROR_CHARS: Final = 400
TARGET_CHARS: Final = 200
TREE_CORE_CHARS: Final = 40
PLUGINS_GROUP: Final = "sglang.srt.plugins"
"""SGLang's entry-point group for general plugins (``GENERAL_PLUGINS_GROUP``)."""
PLUGINS_ENV: Final = "SGLANG_PLUGINS"
LOADER_LOGGER: Final = "sglang.srt.plugins"
"""The logger SGLang's plugin loader reports a plugin that fails to load on."""
RETENTION_CHECK: Final = (
    "from kvretention.probe import print_retention_check; print_retention_check()"
)
RETENTION_TIMEOUT_S: Final = 180.0
"""Importing SGLang imports torch: tens of seconds on a busy node."""


@dataclass(frozen=True)
class RetentionFinding:
    """What SGLang's plugin loader did with the retention plugin, and its hook targets' problems."""

    state: str
    error: str | None = None
    target_problems: tuple[str, ...] = ()
    device: str | None = None
    """``cuda`` or ``cpu``: what torch sees in the same interpreter SGLang loaded in."""
    tree_core: str | None = None
    """SGLang's default radix-tree core here
    (:func:`~kvretention.retention.tree_core.sglang_default_core`)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "error": self.error,
            "targets": list(self.target_problems),
            "device": self.device,
            "tree_core": self.tree_core,
        }


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:ERROR_CHARS] if lines else ""


def _selected(allowed: str, name: str) -> bool:
    """SGLang's reading of ``SGLANG_PLUGINS``: comma-separated names, blanks ignored, empty = all."""
    names = {x.strip() for x in allowed.split(",") if x.strip()}
    return not names or name in names


class _LoadErrors(logging.Handler):
    """Collects the exception SGLang's loader logs for one plugin (it logs and goes on)."""

    def __init__(self, plugin: str) -> None:
        super().__init__(logging.ERROR)
        self.plugin = plugin
        self.errors: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        if args[:1] == (self.plugin,) and record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            self.errors.append(f"{type(exc).__name__}: {exc}")


def judge_retention_plugin(
    *,
    plugin: str,
    installed: bool,
    allowed: str,
    load: Callable[[], Mapping[str, tuple[Callable[[], Any], str | None]]],
    check_targets: Callable[[], Sequence[str]],
) -> RetentionFinding:
    """The plugin as SGLang's loader sees it: ``load`` is SGLang's ``load_plugins_by_group`` bound
    to its general group (it honours ``SGLANG_PLUGINS``, logs a plugin whose import fails and
    leaves it out). A loaded plugin's entry function runs (it registers the hooks), then the hook
    targets are checked in this SGLang."""
    if not installed:
        return RetentionFinding(
            PLUGIN_NOT_INSTALLED,
            f"no entry point {plugin!r} in group {PLUGINS_GROUP} (kvretention is older or "
            "installed without its package metadata)",
        )
    if not _selected(allowed, plugin):
        return RetentionFinding(
            PLUGIN_NOT_SELECTED, f"{PLUGINS_ENV}={allowed!r} does not list {plugin!r}"
        )
    errors = _LoadErrors(plugin)
    loader_log = logging.getLogger(LOADER_LOGGER)
    loader_log.addHandler(errors)
    try:
        loaded = load()
    finally:
        loader_log.removeHandler(errors)
    if plugin not in loaded:
        why = errors.errors[-1] if errors.errors else "SGLang's plugin loader left it out"
        return RetentionFinding(PLUGIN_LOAD_FAILED, f"loading the entry point: {why}"[:ERROR_CHARS])
    func, _dist = loaded[plugin]
    try:
        func()
        problems = tuple(check_targets())
    except Exception as exc:  # any failure is the finding
        return RetentionFinding(PLUGIN_LOAD_FAILED, f"{type(exc).__name__}: {exc}"[:ERROR_CHARS])
    return RetentionFinding(
        PLUGIN_LOADED,
        target_problems=tuple(p[:TARGET_CHARS] for p in problems[:TARGET_PROBLEMS_KEPT]),
    )


def find_retention_plugin() -> RetentionFinding:
    """Run in the child: import SGLang's plugin framework and judge the plugin with it."""
    from kvretention.retention import PLUGIN_NAME

    try:
        from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group
    except Exception as exc:  # an older SGLang, or one that cannot import
        return RetentionFinding(
            PLUGIN_UNSUPPORTED,
            f"SGLang has no plugin framework here: {type(exc).__name__}: {exc}"[:ERROR_CHARS],
        )
    from kvretention.retention.contract import check_targets

    return judge_retention_plugin(
        plugin=PLUGIN_NAME,
        installed=any(ep.name == PLUGIN_NAME for ep in entry_points(group=GENERAL_PLUGINS_GROUP)),
        allowed=os.environ.get(PLUGINS_ENV, ""),
        load=lambda: load_plugins_by_group(GENERAL_PLUGINS_GROUP),
        check_targets=check_targets,
    )


def engine_device() -> str | None:
    """Where the worker's ``--device auto`` puts the engine: the GPU when torch sees one."""
    try:
        import torch
    except Exception:  # no torch, or one that cannot load: the engine cannot run either way
        return None
    return "cuda" if torch.cuda.is_available() else "cpu"


def print_retention_check() -> None:
    """The child's entry: its finding as one JSON line on stdout (SGLang logs go to stderr)."""
    from kvretention.retention.tree_core import sglang_default_core

    finding = replace(
        find_retention_plugin(), device=engine_device(), tree_core=sglang_default_core()
    )
    print(json.dumps(finding.to_json()))


def parse_retention_check(stdout: str) -> RetentionFinding | None:
    """The child's finding from the last line of its stdout, if it is one."""
    lines = stdout.strip().splitlines()
    try:
        data = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("state") not in RETENTION_PLUGIN_STATES:
        return None
    error = data.get("error")
    targets = data.get("targets") or []
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        return None
    device = data.get("device")
    tree_core = data.get("tree_core")
    return RetentionFinding(
        str(data["state"]),
        str(error) if error is not None else None,
        tuple(targets),
        device=device if device in DEVICES else None,
        tree_core=tree_core[:TREE_CORE_CHARS] if isinstance(tree_core, str) else None,
    )


def _run_python(python: str, code: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """``python -c code`` in a fresh interpreter, its output captured; raises on the timeout."""
    return subprocess.run(
        [python, "-c", code], capture_output=True, text=True, timeout=timeout_s, check=False
    )


def check_retention(
    *, python: str = sys.executable, timeout_s: float = RETENTION_TIMEOUT_S
) -> RetentionFinding:
    """The retention plugin as SGLang's loader sees it, from a fresh interpreter."""
    try:
        done = _run_python(python, RETENTION_CHECK, timeout_s)
    except subprocess.TimeoutExpired:
        return RetentionFinding(
            PLUGIN_LOAD_FAILED, f"checking the retention plugin took over {timeout_s:.0f}s"
        )
    if done.returncode == 0:
        finding = parse_retention_check(done.stdout)
        if finding is not None:
            return finding
        reason = f"no finding in its output {_last_line(done.stdout)!r}"
    elif done.returncode < 0:
        # The largest process in the container is this child: a memory limit kills it, not us.
        reason = (
            f"killed by signal {-done.returncode} (importing SGLang and torch needs about 1 GiB "
            "of memory: a container memory limit below that kills it)"
        )
    else:
        reason = _last_line(done.stderr) or f"exit status {done.returncode}"
    return RetentionFinding(PLUGIN_LOAD_FAILED, f"the check failed: {reason}"[:ERROR_CHARS])


def build_report(
    *,
    sglang_root: Path | None,
    mooncake_error: str | None,
    retention: RetentionFinding | None = None,
) -> ProbeReport:
    """The report for an SGLang install (or its absence), the Mooncake import outcome and the
    retention plugin (None: not checked, as a probe that predates it)."""
    params = async_generate_params(sglang_root) if sglang_root is not None else None
    names = [p.name for p in params] if params is not None else []
    dialect = Dialect.NONE
    if sglang_root is not None:
        dialect = detect_dialect(
            names, has_versioned_decoder=has_versioned_decoder_source(sglang_root)
        )
    return ProbeReport(
        sglang_installed=sglang_root is not None,
        sglang_version=read_version(sglang_root) if sglang_root is not None else None,
        kv_hints_parameter="kv_hints" in names,
        dialect=str(dialect),
        async_generate_parameters=tuple(names),
        hicache_storage_backends=(
            tuple(hicache_storage_backends(sglang_root)) if sglang_root is not None else ()
        ),
        mooncake_store_importable=mooncake_error is None,
        mooncake_error=mooncake_error,
        usable_for_hints=sglang_root is not None and dialect is not Dialect.NONE,
        retention_plugin=retention.state if retention is not None else None,
        retention_error=retention.error if retention is not None else None,
        retention_target_problems=retention.target_problems if retention is not None else (),
        engine_device=retention.device if retention is not None else None,
        **tree_cores(retention),
    )


def tree_cores(retention: RetentionFinding | None) -> dict[str, str | None]:
    """The report's tree-core fields: SGLang's default core (what a worker runs under any policy
    but ``kvretain``) and, with the plugin loaded, the core under ``kvretain``."""
    default = retention.tree_core if retention is not None else None
    loaded = retention is not None and retention.state == PLUGIN_LOADED
    return {
        "radix_tree_core": default,
        "radix_tree_core_kvretain": (
            core_label(plan_tree_core(EVICTION_POLICY, default=default))
            if loaded and default is not None
            else None
        ),
    }


def exit_code_of(report: ProbeReport) -> int:
    if not report.sglang_installed:
        return EXIT_NO_SGLANG
    return EXIT_USABLE if report.usable_for_hints else EXIT_NO_HINTS


def check_mooncake(
    *, python: str = sys.executable, timeout_s: float = MOONCAKE_TIMEOUT_S
) -> str | None:
    """None when the Mooncake store imports in a fresh interpreter, else why not (shortened)."""
    try:
        done = _run_python(python, MOONCAKE_IMPORT, timeout_s)
    except subprocess.TimeoutExpired:
        return f"importing mooncake.store took over {timeout_s:.0f}s"
    if done.returncode == 0:
        return None
    return _last_line(done.stderr) or f"exit status {done.returncode}"


@click.command("probe")
@click.option(
    "--termination-log",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the report here (Kubernetes: /dev/termination-log).",
)
@click.option("--skip-mooncake", is_flag=True, help="Do not try to import the Mooncake store.")
@click.option(
    "--skip-retention",
    is_flag=True,
    help="Do not check the retention plugin (the report then reads as a probe that predates it).",
)
@click.option(
    "--report-only",
    is_flag=True,
    help="Always exit 0: the report is the verdict. For an init container, so an image that "
    "cannot take hints still starts its worker under hints policy Optional, and the operator "
    "(not a crash loop) says why under Required.",
)
def probe_cmd(
    termination_log: Path | None, skip_mooncake: bool, skip_retention: bool, report_only: bool
) -> None:
    """Report whether this image's SGLang can take kv_hints (exit 0 yes, 3 no, 4 no SGLang) and
    whether it loads the retention plugin that applies them."""
    mooncake_error = "not checked (--skip-mooncake)" if skip_mooncake else check_mooncake()
    sglang_root = locate_sglang()
    retention = None
    if not skip_retention:
        retention = (
            check_retention()
            if sglang_root is not None
            else RetentionFinding(PLUGIN_UNSUPPORTED, "SGLang is not installed")
        )
    report = build_report(
        sglang_root=sglang_root, mooncake_error=mooncake_error, retention=retention
    )
    text = render_report(report)
    click.echo(text)
    if termination_log is not None:
        termination_log.write_text(text, encoding="utf-8")
    sys.exit(0 if report_only else exit_code_of(report))
