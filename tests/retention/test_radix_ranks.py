"""Tensor-parallel ranks evict in step: they expire holds by the time they agreed on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvretention.ports import free_port

pytestmark = pytest.mark.retention

CHECK = Path(__file__).with_name("tp_ranks_check.py")


def test_two_ranks_reading_their_clocks_apart_keep_and_evict_the_same_prefixes(
    tmp_path: Path,
) -> None:
    port = free_port()
    outs = [tmp_path / f"rank{r}.json" for r in (0, 1)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-W", "ignore", str(CHECK), str(r), str(port), str(outs[r])],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "GLOO_SOCKET_IFNAME": "lo"},
        )
        for r in (0, 1)
    ]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(log[-3000:] for log in logs)
    rank0, rank1 = (json.loads(o.read_text()) for o in outs)
    # Rank 1's own reading says the hold expired; the agreed (earliest) one says 0.15 s remain.
    assert rank0["agreed_now"] == rank1["agreed_now"] == 1_000_000.0 + 9.85
    assert rank0["cached"] == rank1["cached"] == [16, 0, 0, 0, 16]
