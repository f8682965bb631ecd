"""What the pure placement planners see of a worker pool: three worker URLs and a short way to
write a worker's view in a table."""

from __future__ import annotations

from kvretention.dataplane.router.placement import WorkerView

A, B, C = "http://a:1", "http://b:1", "http://c:1"


def w(url: str, outstanding: int = 0, served: int = 0, healthy: bool = True) -> WorkerView:
    return WorkerView(url=url, healthy=healthy, outstanding=outstanding, served=served)
