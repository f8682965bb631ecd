"""What changed between two runs of the real-clients tier (``make clients-latest``).

usage: python tests/clients/report.py PINNED.json LATEST.json

Each file is what ``KVR_CLIENTS_REPORT`` collected: per client its version, the requests and
their statuses, refusals with the frontend's message, the fields the frontend accepted and
ignored, and the key paths of every body and the header names it sent. Prints, per client, the
version change and every difference; exits 1 when the latest release got a request refused or
did not finish, so a client update is noticed before users notice it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _diff(label: str, before: list[str], after: list[str]) -> list[str]:
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    lines = [f"  {label} new: {item}" for item in added]
    lines += [f"  {label} gone: {item}" for item in removed]
    return lines


def compare(pinned: dict[str, Any], latest: dict[str, Any]) -> tuple[list[str], bool]:
    """Report lines, and whether the latest releases are served as the pinned ones are."""
    lines: list[str] = []
    ok = True
    for name in sorted(set(pinned) | set(latest)):
        old, new = pinned.get(name), latest.get(name)
        if new is None:
            lines.append(f"{name}: no run with the latest release")
            ok = False
            continue
        old = old or {}
        lines.append(f"{name}: {old.get('version', '?')} -> {new['version']}")
        lines += _diff("body field", old.get("body_shape", []), new["body_shape"])
        lines += _diff("header", old.get("headers", []), new["headers"])
        lines += _diff("ignored field", old.get("ignored_fields", []), new["ignored_fields"])
        for path, status, message in new["refused"]:
            lines.append(f"  REFUSED {path} {status}: {message}")
        if new["refused"] or new["exit_code"] != 0:
            ok = False
            lines.append(f"  exit code {new['exit_code']}; requests: {new['requests']}")
    return lines, ok


def main(argv: list[str]) -> int:
    pinned, latest = (json.loads(p.read_text()) if p.exists() else {} for p in map(Path, argv[1:3]))
    lines, ok = compare(pinned, latest)
    print("\n".join(lines))
    print("latest releases: served" if ok else "latest releases: NOT served as the pinned ones")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
