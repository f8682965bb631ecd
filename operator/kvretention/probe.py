"""``kvretention probe``: can this image's SGLang take KV hints? One JSON report, an exit status.

Runs inside a worker image, without a GPU and without starting (or even importing) the engine:
SGLang's files are located with ``importlib.util.find_spec`` and read with ``ast``. The Mooncake
store is imported in a child process so a native crash cannot take the probe down with it. The
schema is documented in ``docs/probe.md``; the operator reads it from the container's termination
message (``--termination-log /dev/termination-log``).

Exit status: 0 usable for a hinted fleet; 3 SGLang present but it cannot take ``kv_hints``;
4 SGLang not installed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Final

import click

from kvretention.api.probe_report import ProbeReport, render_report
from kvretention.dataplane.worker.dialect import Dialect, detect_dialect
from kvretention.dataplane.worker.sglang_source import (
    async_generate_params,
    has_versioned_decoder_source,
    hicache_storage_backends,
    locate_sglang,
    read_version,
)

EXIT_USABLE: Final = 0
EXIT_NO_HINTS: Final = 3
EXIT_NO_SGLANG: Final = 4
MOONCAKE_IMPORT: Final = "from mooncake.store import MooncakeDistributedStore"
MOONCAKE_TIMEOUT_S: Final = 60.0
ERROR_CHARS: Final = 400


def build_report(
    *,
    sglang_root: Path | None,
    mooncake_error: str | None,
) -> ProbeReport:
    """The report for an SGLang install (or its absence) and the Mooncake import outcome."""
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
    )


def exit_code_of(report: ProbeReport) -> int:
    if not report.sglang_installed:
        return EXIT_NO_SGLANG
    return EXIT_USABLE if report.usable_for_hints else EXIT_NO_HINTS


def check_mooncake(
    *, python: str = sys.executable, timeout_s: float = MOONCAKE_TIMEOUT_S
) -> str | None:
    """None when the Mooncake store imports in a fresh interpreter, else why not (shortened)."""
    try:
        done = subprocess.run(
            [python, "-c", MOONCAKE_IMPORT],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"importing mooncake.store took over {timeout_s:.0f}s"
    if done.returncode == 0:
        return None
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    reason = lines[-1] if lines else f"exit status {done.returncode}"
    return reason[:ERROR_CHARS]


@click.command("probe")
@click.option(
    "--termination-log",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the report here (Kubernetes: /dev/termination-log).",
)
@click.option("--skip-mooncake", is_flag=True, help="Do not try to import the Mooncake store.")
@click.option(
    "--report-only",
    is_flag=True,
    help="Always exit 0: the report is the verdict. For an init container, so an image that "
    "cannot take hints still starts its worker under hints policy Optional, and the operator "
    "(not a crash loop) says why under Required.",
)
def probe_cmd(termination_log: Path | None, skip_mooncake: bool, report_only: bool) -> None:
    """Report whether this image's SGLang can take kv_hints (exit 0 yes, 3 no, 4 no SGLang)."""
    mooncake_error = "not checked (--skip-mooncake)" if skip_mooncake else check_mooncake()
    report = build_report(sglang_root=locate_sglang(), mooncake_error=mooncake_error)
    text = render_report(report)
    click.echo(text)
    if termination_log is not None:
        termination_log.write_text(text, encoding="utf-8")
    sys.exit(0 if report_only else exit_code_of(report))
