"""Worker specs whose tensor-parallel ranks do not split evenly across their nodes, each with the
message the refusal names: the CRD's CEL rule (the API server, ``tests/integration``) and the
model's own check (``tests/unit``) are tested on the same cases."""

from __future__ import annotations

from typing import Any, Final

UNEVEN_SPLITS: Final[list[tuple[dict[str, Any], str]]] = [
    ({"nodesPerReplica": 2}, "workers.aggregated.tensorParallelSize must be a multiple"),
    (
        {"nodesPerReplica": 3, "aggregated": {"tensorParallelSize": 8}},
        "workers.aggregated.tensorParallelSize must be a multiple",
    ),
    (
        {
            "mode": "disaggregated",
            "prefill": {"tensorParallelSize": 4, "nodesPerReplica": 3},
            "decode": {},
        },
        "workers.prefill.tensorParallelSize must be a multiple",
    ),
    (
        {
            "mode": "disaggregated",
            "nodesPerReplica": 2,
            "prefill": {"tensorParallelSize": 2},
            "decode": {"tensorParallelSize": 1},
        },
        "workers.decode.tensorParallelSize must be a multiple",
    ),
]
