"""The ``kvretention`` command line: one entry point, one subcommand per process or tool.

Subcommands are imported lazily so ``kvretention probe`` in a worker image does not import kopf,
and ``kvretention frontend`` does not import the Kubernetes client.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Final

import click

SUBCOMMANDS: Final[dict[str, tuple[str, str]]] = {
    "operator": ("kvretention.controller.operator", "operator_cmd"),
    "render": ("kvretention.controller.render", "render_cmd"),
    "crds": ("kvretention.api.cli", "crds_cmd"),
    "frontend": ("kvretention.dataplane.frontend.cli", "frontend_cmd"),
    "router": ("kvretention.dataplane.router.cli", "router_cmd"),
    "worker": ("kvretention.dataplane.worker.cli", "worker_cmd"),
    "probe": ("kvretention.probe", "probe_cmd"),
    "tiny-model": ("kvretention.dataplane.worker.cpu.tiny_model", "tiny_model_cmd"),
    "replay": ("kvretention.replay.cli", "replay_cmd"),
    "cluster": ("kvretention_devtools.localcluster.cli", "cluster"),
}
"""name -> (module, click command attribute)."""

DEV_ONLY: Final = frozenset({"cluster"})
"""Subcommands from ``devtools/`` (``kvretention-devtools``): a source checkout has them after
``make bootstrap``; the published package and the images do not."""


class LazyGroup(click.Group):
    """A click group whose subcommands are imported only when invoked."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name in SUBCOMMANDS if _available(name))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = SUBCOMMANDS.get(cmd_name)
        if target is None:
            return None
        if not _available(cmd_name):
            raise click.UsageError(
                f"'kvretention {cmd_name}' is a development tool: run `make bootstrap` in a "
                "kvretention source checkout (it installs devtools/)"
            )
        module = importlib.import_module(target[0])
        command = getattr(module, target[1])
        assert isinstance(command, click.Command)
        return command


def _available(name: str) -> bool:
    if name not in DEV_ONLY:
        return True
    return importlib.util.find_spec(SUBCOMMANDS[name][0].partition(".")[0]) is not None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kvretention")
def main() -> None:
    """kvretention: hinted SGLang/Mooncake fleets on Kubernetes."""
