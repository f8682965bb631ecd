"""The operator with every child apply after the first N held forever: what makes "killed
mid-reconcile" deterministic in the integration tests, kept out of the product.

``python -m support.held_operator N [operator flags]`` (with ``tests`` on ``PYTHONPATH``) runs
``kvretention operator`` with :meth:`~kvretention.controller.kube.Kube.apply` wrapped in this
process: exactly N applies of children reach the API server and every later one waits forever, so
a test can see N children in the cluster, know the reconcile is stuck half-way, and SIGKILL the
process there instead of racing it. Dry runs and status writes pass untouched.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Mapping
from typing import Any, Final

from kvretention.controller.kinds import ResourceKind
from kvretention.controller.kube import Kube
from kvretention.controller.operator import operator_cmd

HOLD_LOG: Final = "test hook: holding the apply"
"""What the process logs (WARNING) when it holds an apply: the test waits for it."""

log = logging.getLogger("kvretention.held_operator")


def hold_after(applies: int) -> None:
    """Patch :meth:`Kube.apply` in this process: the first ``applies`` applies of children pass,
    every later one waits forever."""
    if applies < 0:
        raise SystemExit(f"hold after {applies} applies: must be >= 0")
    real = Kube.apply
    started = 0

    async def apply(
        self: Kube,
        manifest: Mapping[str, Any],
        *,
        kind: ResourceKind | None = None,
        dry_run: bool = False,
        subresource: str = "",
    ) -> dict[str, Any]:
        nonlocal started
        if not dry_run and not subresource:
            if started >= applies:
                meta = manifest["metadata"]
                log.warning(
                    "%s of %s %s/%s",
                    HOLD_LOG,
                    manifest["kind"],
                    meta.get("namespace"),
                    meta["name"],
                )
                await asyncio.Event().wait()
            started += 1
        return await real(self, manifest, kind=kind, dry_run=dry_run, subresource=subresource)

    Kube.apply = apply  # type: ignore[method-assign]


def main(argv: list[str]) -> None:
    hold_after(int(argv[0]))
    operator_cmd.main(args=argv[1:], prog_name="held-operator")


if __name__ == "__main__":
    main(sys.argv[1:])
