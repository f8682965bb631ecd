"""kube.py's pure parts: where kinds live, which failures are retried, how retries end."""

from __future__ import annotations

from typing import Any

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from kvretention.controller import kube as k


@pytest.mark.parametrize(
    ("manifest", "path"),
    [
        (
            {"apiVersion": "apps/v1", "kind": "Deployment"},
            "/apis/apps/v1/namespaces/ns/deployments/x",
        ),
        ({"apiVersion": "v1", "kind": "Service"}, "/api/v1/namespaces/ns/services/x"),
        ({"apiVersion": "v1", "kind": "ConfigMap"}, "/api/v1/namespaces/ns/configmaps/x"),
    ],
)
def test_kind_paths(manifest: dict[str, Any], path: str) -> None:
    assert k.kind_of(manifest).object_path("ns", "x") == path


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="does not manage Secret"):
        k.kind_of({"apiVersion": "v1", "kind": "Secret"})


@pytest.mark.parametrize(
    ("exc", "retry"),
    [
        (ApiException(status=409), True),
        (ApiException(status=429), True),
        (ApiException(status=500), True),
        (ApiException(status=503), True),
        (ApiException(status=0), True),  # no response at all
        (urllib3.exceptions.ProtocolError("reset"), True),
        (ConnectionResetError(), True),
        (ApiException(status=400), False),
        (ApiException(status=403), False),
        (ApiException(status=404), False),
        (ApiException(status=422), False),
        (ValueError("bug"), False),
    ],
)
def test_is_retryable(exc: BaseException, retry: bool) -> None:
    assert k.is_retryable(exc) is retry


async def test_retries_then_succeeds() -> None:
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ApiException(status=503)
        return "ok"

    assert await k.with_retries(flaky, what="x", base_delay=0.001) == "ok"
    assert calls == 3


async def test_gives_up_with_a_temporary_error() -> None:
    async def down() -> None:
        raise ApiException(status=500)

    with pytest.raises(k.RetryLater, match="x:"):
        await k.with_retries(down, what="x", attempts=2, base_delay=0.001)


async def test_hard_errors_are_not_retried() -> None:
    calls = 0

    async def forbidden() -> None:
        nonlocal calls
        calls += 1
        raise ApiException(status=403)

    with pytest.raises(ApiException):
        await k.with_retries(forbidden, what="x", base_delay=0.001)
    assert calls == 1
