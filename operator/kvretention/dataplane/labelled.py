"""A labelled Prometheus metric's children, resolved once per label set.

``metric.labels(...)`` checks its arguments, converts each to ``str`` and takes the metric's lock
on every call: ~3% of the router's CPU per request when it ran for every request's gauges and
counter. :class:`Children` keeps each child it resolved in a dict keyed by the label values, so
a hot path pays one dict lookup. The child is the one ``labels()`` returns (the metric keeps it
too), so the exported series are the same. Valid while nothing calls ``remove()`` or ``clear()``
on the metric: the frontend and the router never do. Use it only for label values from a
bounded set (endpoints, outcomes, roles, worker URLs): each set is kept for the process's life,
as the metric itself keeps its series.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from prometheus_client.metrics import MetricWrapperBase

_M = TypeVar("_M", bound=MetricWrapperBase)


class Children(Generic[_M]):
    """``children(*values)`` is ``metric.labels(*values)``, looked up once per ``values``."""

    __slots__ = ("_children", "_metric")

    def __init__(self, metric: _M) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], _M] = {}

    def __call__(self, *values: str) -> _M:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child
