"""``kvretention crds``: print the generated CRD, or write it into a folder such as ``crds/``."""

from __future__ import annotations

from pathlib import Path

import click

from kvretention.api.crd import CRD_FILENAME, render_crd_yaml


@click.command("crds")
@click.option(
    "--write",
    "write_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help=f"Write {CRD_FILENAME} into this folder instead of printing it.",
)
def crds_cmd(write_dir: Path | None) -> None:
    """Print the KvRetentionDeployment CRD YAML (generated from the API models)."""
    text = render_crd_yaml()
    if write_dir is None:
        click.echo(text, nl=False)
        return
    write_dir.mkdir(parents=True, exist_ok=True)
    target = write_dir / CRD_FILENAME
    target.write_text(text)
    click.echo(f"wrote {target}", err=True)
