"""The tier's install step: a machine without npm fails with what to do, never a skip."""

from __future__ import annotations

import subprocess
from pathlib import Path

from support.real_clients import INSTALL


def test_missing_npm_is_a_clear_failure(tmp_path: Path) -> None:
    done = subprocess.run(
        ["/bin/bash", str(INSTALL)],
        env={"PATH": str(tmp_path), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 1
    assert "npm not found" in done.stderr and "apt-get install npm" in done.stderr
    assert done.stdout == ""
