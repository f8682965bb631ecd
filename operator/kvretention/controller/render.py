"""``kvretention render -f cr.yaml``: print every manifest the operator would apply, with no cluster.

The review and GitOps path: the same validation (:meth:`KvRetentionDeployment.from_k8s`), the same
semantic checks (``check_spec``) and the same builders (``build_children``) as the operator.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import click
import yaml

from kvretention.api.models import API_VERSION, KIND, KvRetentionDeployment, SpecError
from kvretention.controller.resources import build_children, check_spec


class RenderError(Exception):
    """A CR file that cannot be rendered; the message is for people (no traceback)."""


def load_documents(path: Path) -> list[dict[str, Any]]:
    """The non-empty YAML documents of a file."""
    try:
        docs = list(yaml.safe_load_all(path.read_text()))
    except OSError as exc:
        raise RenderError(f"{path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise RenderError(f"{path}: not valid YAML: {exc}") from None
    out = []
    for index, doc in enumerate(docs):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise RenderError(f"{path}: document {index + 1} is not a mapping")
        out.append(doc)
    return out


def parse_cr(doc: dict[str, Any], *, source: str, namespace: str) -> KvRetentionDeployment:
    """Validate one document as a KvRetentionDeployment, then run the semantic checks."""
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
        raise RenderError(
            f"{source}: expected apiVersion {API_VERSION} kind {KIND}, "
            f"got {doc.get('apiVersion')} {doc.get('kind')}"
        )
    raw_metadata = doc.get("metadata") or {}
    if not isinstance(raw_metadata, dict):
        raise RenderError(f"{source}: {KIND} metadata must be a mapping")
    metadata = dict(raw_metadata)
    metadata.setdefault("namespace", namespace)
    label = f"{source}: {KIND} {metadata.get('name', '<unnamed>')}"
    try:
        cr = KvRetentionDeployment.from_k8s({**doc, "metadata": metadata})
    except SpecError as exc:
        raise RenderError(_bullets(f"{label} is invalid:", exc.problems)) from None
    problems = check_spec(cr)
    if problems:
        raise RenderError(_bullets(f"{label} can never work (InvalidSpec):", problems))
    return cr


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the Mooncake config JSON) as readable ``|`` blocks; no anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def dump_manifests(manifests: Sequence[dict[str, Any]]) -> str:
    """Multi-document YAML, keys in builder order (deterministic)."""
    return yaml.dump_all(manifests, Dumper=_Dumper, sort_keys=False, width=100)


def render_manifests(crs: Iterable[KvRetentionDeployment]) -> str:
    """Multi-document YAML of every child of every CR, in the order the operator applies them."""
    return dump_manifests([m for cr in crs for m in build_children(cr)])


def render_files(paths: Sequence[Path], *, namespace: str) -> str:
    crs = []
    for path in paths:
        for index, doc in enumerate(load_documents(path)):
            crs.append(parse_cr(doc, source=f"{path}#{index + 1}", namespace=namespace))
    if not crs:
        raise RenderError("no KvRetentionDeployment found in " + ", ".join(map(str, paths)))
    return render_manifests(crs)


def _bullets(head: str, lines: Sequence[str]) -> str:
    return "\n".join([head, *(f"  - {line}" for line in lines)])


@click.command("render")
@click.option(
    "-f",
    "--filename",
    "paths",
    multiple=True,
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A YAML file with KvRetentionDeployment objects (repeatable).",
)
@click.option(
    "-n",
    "--namespace",
    default="default",
    show_default=True,
    help="Namespace for objects whose metadata has none.",
)
def render_cmd(paths: tuple[Path, ...], namespace: str) -> None:
    """Print every manifest the operator would apply for these objects (no cluster needed)."""
    try:
        text = render_files(paths, namespace=namespace)
    except RenderError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(2) from None
    click.echo(text, nl=False)
