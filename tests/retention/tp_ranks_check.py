"""One tensor-parallel rank of SGLang's unified tree with the retention plugin (run two at once).

``python tp_ranks_check.py RANK PORT OUT SCENARIO CORE``: joins a two-rank gloo group on loopback,
builds the tree with that group as its TP group, and runs the same requests as the other rank. The
ranks read their clocks at slightly different moments; rank 1 reads 0.3 s later than rank 0 when
the cache comes under pressure: ``skew``, just as a hold expires between the two readings;
``idle``, a minute after the last checkpoint, long after the hold expired. What each rank still
caches is written to OUT as JSON. CORE: ``python`` (holds rank nodes) or ``rust`` (SGLang's
default core, holds are pins).
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SKEW = 0.3


def main() -> None:
    rank, port, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    pressure_at = {"skew": 9.85, "idle": 60.0}[sys.argv[4]]
    core = sys.argv[5]
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    from support.sglang_radix import RadixTree, TreeSpec, load_sglang, retain

    load_sglang("kvretention")
    from kvretention.retention import pins, radix

    start = 1_000_000.0
    clock = [start]
    radix.clock = lambda: clock[0]
    spec = TreeSpec(kind="unified", page_size=4, tokens=64, tp_group=dist.group.WORLD)
    tree = RadixTree(replace(spec, tree_core=core))
    blocks = [list(range(1000 * (i + 1), 1000 * (i + 1) + 16)) for i in range(5)]
    tree.run(blocks[0], kv_hints=retain(16, duration=10))  # held until rank 0's start + 10
    for block in blocks[1:4]:
        tree.run(block)
    # skew: rank 0 has 0.15 s of the hold left, rank 1's own clock says it expired. idle: no
    # checkpoint since the hold was set, so only the eviction pass can agree on the time.
    clock[0] = start + pressure_at + SKEW * rank
    tree.run(blocks[4])  # evicts one: the pass agrees on the time first
    first_pass = [tree.cached(b) for b in blocks]
    tree.run(list(range(9000, 9032)))  # pressure for two more
    out.write_text(
        json.dumps(
            {
                "first_pass": first_pass,
                "cached": [tree.cached(b) for b in blocks],
                "agreed_now": (
                    getattr(tree.cache.tree_core, pins.ATTR)
                    if core == "rust"
                    else tree.cache.tree_core.eviction_strategy
                ).agreed_now,
            }
        )
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
