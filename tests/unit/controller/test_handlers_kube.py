"""kube.py's pure parts: where kinds live, which failures are retried, how retries end."""

from __future__ import annotations

import json
from typing import Any

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from kvretention.controller import kinds
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
    assert kinds.kind_of(manifest).object_path("ns", "x") == path


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="does not manage Secret"):
        kinds.kind_of({"apiVersion": "v1", "kind": "Secret"})


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


TERMINATING_BODY = {
    "kind": "Status",
    "status": "Failure",
    "message": 'deployments.apps "x" is forbidden: unable to create new content in namespace ns '
    "because it is being terminated",
    "reason": "Forbidden",
    "details": {
        "name": "x",
        "kind": "deployments",
        "causes": [
            {
                "reason": "NamespaceTerminating",
                "message": "namespace ns is being terminated",
                "field": "metadata.namespace",
            }
        ],
    },
    "code": 403,
}


def _refusing(status: int, body: Any) -> k.Kube:
    kube = k.Kube(api=None)  # type: ignore[arg-type]

    def refuse(call: Any) -> Any:
        exc = ApiException(status=status, reason="Reason Phrase")
        exc.body = body if isinstance(body, str) else json.dumps(body)
        raise exc

    kube._request_sync = refuse  # type: ignore[method-assign]
    return kube


@pytest.mark.parametrize(
    ("status", "body", "error", "said", "terminating"),
    [
        (
            403,
            TERMINATING_BODY,
            k.ApiError,
            'PATCH /p: HTTP 403 Forbidden: deployments.apps "x" is forbidden: unable to create '
            "new content in namespace ns because it is being terminated (causes: "
            "NamespaceTerminating)",
            True,
        ),
        (
            404,
            {
                "kind": "Status",
                "message": 'kvretentiondeployments "x" not found',
                "reason": "NotFound",
            },
            k.NotFound,
            'PATCH /p: HTTP 404 NotFound: kvretentiondeployments "x" not found',
            False,
        ),
        (
            422,
            {
                "message": "spec.frontend.image: Invalid value",
                "reason": "Invalid",
                "details": {"causes": [{"reason": "FieldValueInvalid", "field": "spec"}]},
            },
            k.ApiError,
            "PATCH /p: HTTP 422 Invalid: spec.frontend.image: Invalid value (causes: "
            "FieldValueInvalid)",
            False,
        ),
        (403, "not json", k.ApiError, "PATCH /p: HTTP 403 Reason Phrase: not json", False),
    ],
)
async def test_every_error_names_the_request_and_the_servers_reason(
    status: int, body: Any, error: type[Exception], said: str, terminating: bool
) -> None:
    """A log line or status message reads what failed and why, never a bare path."""
    with pytest.raises(error) as raised:
        await _refusing(status, body).request("PATCH", "/p")
    assert str(raised.value) == said
    if isinstance(raised.value, k.ApiError):
        assert raised.value.namespace_terminating is terminating
