"""A directory laid out as the kubelet mounts a Secret, and rewritten as the kubelet updates it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def write_secret(root: Path, files: Mapping[str, str]) -> None:
    """Write ``files`` (key -> value) as a mounted Secret: a new timestamped directory, the
    ``..data`` link swapped to it atomically, and one link per key; keys no longer in the Secret
    lose their link."""
    root.mkdir(parents=True, exist_ok=True)
    stamp = f"..2026_{len(list(root.glob('..2026_*')))}"
    data_dir = root / stamp
    data_dir.mkdir()
    for name, text in files.items():
        (data_dir / name).write_text(text)
    tmp = root / "..data_tmp"
    tmp.symlink_to(stamp)
    tmp.replace(root / "..data")
    for name in files:
        link = root / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")
    for stale in root.iterdir():
        if stale.is_symlink() and not stale.name.startswith(".") and stale.name not in files:
            stale.unlink()
