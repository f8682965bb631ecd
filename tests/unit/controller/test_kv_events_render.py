"""``router.kvEvents``: the rendered worker and router argv carry ``--kv-events`` and
``--kv-residency`` exactly when the option is on, on the pools the router reads; a spec where the
flags cannot work is refused."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kvretention.api.models import KvRetentionDeployment, SpecError
from kvretention.controller.resources import build_children, check_spec

PD = {"mode": "disaggregated", "prefill": {}, "decode": {}}
MULTINODE = {"nodesPerReplica": 2, "aggregated": {"tensorParallelSize": 2}}


def _cr(*, kv_events: bool | None, workers: dict[str, Any] | None = None) -> KvRetentionDeployment:
    spec: dict[str, Any] = {"model": {"name": "m", "path": "p"}, "workers": workers or {}}
    if kv_events is not None:
        spec["router"] = {"kvEvents": kv_events}
    return KvRetentionDeployment.from_k8s(
        {
            "apiVersion": "kvretention.io/v1alpha1",
            "kind": "KvRetentionDeployment",
            "metadata": {"name": "f", "namespace": "ns"},
            "spec": spec,
        }
    )


def _pod_specs(manifest: dict[str, Any]) -> Iterator[dict[str, Any]]:
    spec = manifest.get("spec") or {}
    if "template" in spec:
        yield spec["template"]["spec"]
    for template in (spec.get("leaderWorkerTemplate") or {}).values():
        if isinstance(template, dict) and "spec" in template:
            yield template["spec"]


def _commands(cr: KvRetentionDeployment, container: str) -> list[list[str]]:
    return [
        c["command"]
        for m in build_children(cr)
        for pod in _pod_specs(m)
        for c in pod["containers"]
        if c["name"] == container
    ]


def _worker_flags(cr: KvRetentionDeployment) -> list[tuple[str, bool]]:
    """(role, --kv-events given to our worker, not to SGLang after ``--``) per worker container."""
    found = []
    for command in _commands(cr, "worker"):
        ours = command[: command.index("--")]
        found.append((ours[ours.index("--role") + 1], "--kv-events" in ours))
        assert "--kv-events-config" not in command  # the worker adds it itself
    return sorted(found)


@pytest.mark.parametrize(
    ("kv_events", "workers", "expected_workers", "router_flag"),
    [
        (None, {}, [("aggregated", False)], False),
        (False, {}, [("aggregated", False)], False),
        (True, {}, [("aggregated", True)], True),
        (False, PD, [("decode", False), ("prefill", False)], False),
        # The router reads residency from prefill workers only: decode runs without the events.
        (True, PD, [("decode", False), ("prefill", True)], True),
        # A multinode worker: every rank runs the same worker command (leader and the other rank).
        (True, MULTINODE, [("aggregated", True), ("aggregated", True)], True),
        (False, MULTINODE, [("aggregated", False), ("aggregated", False)], False),
    ],
    ids=[
        "default",
        "off",
        "on",
        "pd-off",
        "pd-on",
        "multinode-on",
        "multinode-off",
    ],
)
def test_flags_are_rendered_only_when_kv_events_is_on(
    kv_events: bool | None,
    workers: dict[str, Any],
    expected_workers: list[tuple[str, bool]],
    router_flag: bool,
) -> None:
    cr = _cr(kv_events=kv_events, workers=workers)
    assert _worker_flags(cr) == expected_workers
    (router,) = _commands(cr, "router")
    assert ("--kv-residency" in router) is router_flag
    assert check_spec(cr) == []


def test_the_router_flag_comes_before_its_worker_discovery() -> None:
    (router,) = _commands(_cr(kv_events=True, workers=PD), "router")
    assert router[router.index("--kv-residency") + 1 :][:1] == ["--prefill-dns"]


@pytest.mark.parametrize(
    ("kv_events", "workers", "expected"),
    [
        (
            True,
            {"aggregated": {"extraArgs": ["--kv-events-config", "{}"]}},
            [
                "spec.workers.aggregated.extraArgs[0]: --kv-events-config is set by the operator "
                "from the spec; change the matching spec field instead"
            ],
        ),
        (
            True,
            {**PD, "prefill": {"extraArgs": ["--kv-events-conf={}"]}},
            [
                "spec.workers.prefill.extraArgs[0]: --kv-events-conf (SGLang reads it as "
                "--kv-events-config) is set by the operator from the spec; change the matching "
                "spec field instead"
            ],
        ),
        # Decode workers run without --kv-events: their own publisher is the user's to configure.
        (True, {**PD, "decode": {"extraArgs": ["--kv-events-config", "{}"]}}, []),
        (False, {"aggregated": {"extraArgs": ["--kv-events-config", "{}"]}}, []),
    ],
    ids=["aggregated", "prefill-abbreviated", "decode", "off"],
)
def test_a_kv_events_config_in_extra_args_is_refused_where_the_worker_sets_it(
    kv_events: bool, workers: dict[str, Any], expected: list[str]
) -> None:
    assert check_spec(_cr(kv_events=kv_events, workers=workers)) == expected


@pytest.mark.parametrize(
    ("session_keys", "refused"),
    [([], True), (["x-session-id"], False)],
    ids=["no-session-keys", "a-session-key"],
)
def test_kv_events_needs_session_keys(session_keys: list[str], refused: bool) -> None:
    body = {
        "apiVersion": "kvretention.io/v1alpha1",
        "kind": "KvRetentionDeployment",
        "metadata": {"name": "f", "namespace": "ns"},
        "spec": {
            "model": {"name": "m", "path": "p"},
            "router": {"kvEvents": True, "sessionKeys": session_keys},
        },
    }
    if refused:
        with pytest.raises(SpecError, match=r"router\.kvEvents places a request by its session"):
            KvRetentionDeployment.from_k8s(body)
    else:
        assert KvRetentionDeployment.from_k8s(body).spec.router.kv_events
