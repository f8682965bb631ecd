"""Tensor-parallel ranks evict in step: they expire holds by the time they agreed on, whether
the holds rank nodes (Python core) or are pins (SGLang's default Rust core)."""

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


@pytest.mark.parametrize(
    ("scenario", "agreed", "first_pass", "cached"),
    [
        # Rank 1's own reading says the hold expired; the agreed (earliest) one says 0.15 s remain.
        ("skew", 9.85, [16, 0, 16, 16, 16], [16, 0, 0, 0, 16]),
        # A minute idle: the pass agrees on the time before it ranks, so the expired hold goes
        # first (LRU); by the time agreed at the last checkpoint it would still rank as live.
        ("idle", 60.0, [0, 16, 16, 16, 16], [0, 0, 0, 16, 16]),
    ],
)
@pytest.mark.parametrize("core", ["python", "rust"])
def test_two_ranks_reading_their_clocks_apart_keep_and_evict_the_same_prefixes(
    tmp_path: Path,
    scenario: str,
    agreed: float,
    first_pass: list[int],
    cached: list[int],
    core: str,
) -> None:
    port = free_port()
    outs = [tmp_path / f"rank{r}.json" for r in (0, 1)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-W",
                "ignore",
                str(CHECK),
                str(r),
                str(port),
                str(outs[r]),
                scenario,
                core,
            ],
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
    assert rank0["agreed_now"] == rank1["agreed_now"] == 1_000_000.0 + agreed
    assert rank0["first_pass"] == rank1["first_pass"] == first_pass
    assert rank0["cached"] == rank1["cached"] == cached
