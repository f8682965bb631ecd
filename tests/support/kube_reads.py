"""Reads of one Kubernetes object that take a 404 as an answer, for tests and benchmarks to wait on."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from kubernetes.client.rest import ApiException

T = TypeVar("T")


def read_or_none(read: Callable[[], T]) -> T | None:
    """``read()``, or None where the object is not there (404); any other error raises."""
    try:
        return read()
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def exists(read: Callable[[], object]) -> bool:
    """Whether ``read()`` finds its object (False on a 404; any other error raises)."""
    return read_or_none(read) is not None
