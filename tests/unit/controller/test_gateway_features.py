"""The CLIs' gateway features the spec exposes: ``spec.frontend.codexInstructions`` (a ConfigMap key
mounted into the frontend as ``--codex-instructions-file``, and named in FrontendReady while it is
missing) and ``spec.workers.planningThreads`` (the worker's ``--planning-threads``)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from click.testing import CliRunner
from fake_kube import (
    FakeKube,
    condition_messages,
    controller,
    fake,
    load_example,
    reconcile_rolled_out,
    reconciled_with_frontend,
)

from kvretention.api.models import KvRetentionDeployment, SpecError
from kvretention.api.spec_workers import DEFAULT_PLANNING_THREADS
from kvretention.controller import kinds
from kvretention.controller import kube as k
from kvretention.controller.cache import CR_KIND
from kvretention.controller.conditions import (
    PROBLEM_REASONS,
    Verdict,
    check_codex_instructions,
)
from kvretention.controller.resources import build_children
from kvretention.controller.resources.checks import check_spec
from kvretention.controller.resources.frontend import build_frontend_command
from kvretention.controller.resources.workers import build_worker_command
from kvretention.dataplane.frontend.cli import frontend_cmd
from kvretention.dataplane.worker.planning import DEFAULT_THREADS

__all__ = ["fake"]

Body = dict[str, Any]
CODEX = {"configMapKeyRef": {"name": "codex-prompt", "key": "instructions.md"}}


def body(*, frontend: Body | None = None, workers: Body | None = None) -> Body:
    spec: Body = {"model": {"name": "m", "path": "org/m"}}
    if frontend is not None:
        spec["frontend"] = frontend
    if workers is not None:
        spec["workers"] = workers
    return {
        "apiVersion": "kvretention.io/v1alpha1",
        "kind": "KvRetentionDeployment",
        "metadata": {"name": "f", "namespace": "ns", "uid": "u-1"},
        "spec": spec,
    }


def frontend_pod(cr: KvRetentionDeployment) -> Body:
    (deployment,) = [
        m
        for m in build_children(cr)
        if m["kind"] == "Deployment" and m["metadata"]["name"].endswith("-frontend")
    ]
    pod: Body = deployment["spec"]["template"]["spec"]
    return pod


# ------------------------------------------------------------------ codexInstructions rendered


@pytest.mark.parametrize(
    ("frontend", "args", "volumes", "mounts"),
    [
        pytest.param(None, [], [], [], id="unset"),
        pytest.param(
            {"codexInstructions": CODEX},
            ["--codex-instructions-file=/etc/kvretention/codex/instructions"],
            [
                {
                    "name": "codex-instructions",
                    "configMap": {
                        "name": "codex-prompt",
                        "items": [{"key": "instructions.md", "path": "instructions"}],
                        "defaultMode": 0o444,
                    },
                }
            ],
            [
                {
                    "name": "codex-instructions",
                    "mountPath": "/etc/kvretention/codex",
                    "readOnly": True,
                }
            ],
            id="set",
        ),
        pytest.param(
            {"codexInstructions": CODEX, "auth": {"secretRefs": [{"name": "keys"}]}},
            [
                "--auth-keys-dir=/etc/kvretention/auth/keys",
                "--codex-instructions-file=/etc/kvretention/codex/instructions",
            ],
            ["auth-keys-0", "codex-instructions"],
            ["/etc/kvretention/auth/keys", "/etc/kvretention/codex"],
            id="beside-auth",
        ),
    ],
)
def test_codex_instructions_are_mounted_and_passed(
    frontend: Body | None, args: list[str], volumes: list[Any], mounts: list[Any]
) -> None:
    cr = KvRetentionDeployment.from_k8s(body(frontend=frontend))
    command = build_frontend_command(cr)
    passed = [a for a in command if a.startswith(("--codex-instructions", "--auth-keys-dir"))]
    assert passed == args
    pod = frontend_pod(cr)
    (container,) = pod["containers"]
    # Only the volumes of these two features (other features mount their own beside them).
    ours = ("auth-keys-", "codex-instructions")
    got_volumes = [v for v in pod.get("volumes", []) if v["name"].startswith(ours)]
    got_mounts = [m for m in container.get("volumeMounts", []) if m["name"].startswith(ours)]
    if volumes and isinstance(volumes[0], str):
        assert [v["name"] for v in got_volumes] == volumes
        assert [m["mountPath"] for m in got_mounts] == mounts
    else:
        assert got_volumes == volumes
        assert got_mounts == mounts


def test_the_rendered_frontend_command_runs_the_codex_option(tmp_path: Any) -> None:
    """The CLI takes the rendered flag (``--help`` after it: parsed up to there, nothing served);
    a file that is not there is a usage error, which a pod never meets (the mount fails first)."""
    cr = KvRetentionDeployment.from_k8s(body(frontend={"codexInstructions": CODEX}))
    (flag,) = [a for a in build_frontend_command(cr) if a.startswith("--codex-instructions")]
    text = tmp_path / "instructions"
    text.write_text("You are the fleet's coding agent.")
    runner = CliRunner()
    ok = runner.invoke(
        frontend_cmd, ["--router-url", "http://r", f"{flag.split('=')[0]}={text}", "--help"]
    )
    assert ok.exit_code == 0, ok.output
    missing = runner.invoke(frontend_cmd, ["--router-url", "http://r", flag])
    assert missing.exit_code == 2
    assert "--codex-instructions-file" in missing.output


@pytest.mark.parametrize(
    "ref",
    [
        {"name": "codex-prompt"},
        {"key": "instructions.md"},
        {"name": "codex-prompt", "key": "a/b"},
        {"name": "", "key": "k"},
    ],
    ids=["no-key", "no-name", "slash-in-key", "empty-name"],
)
def test_a_malformed_codex_reference_is_refused(ref: Body) -> None:
    with pytest.raises(SpecError):
        KvRetentionDeployment.from_k8s(
            body(frontend={"codexInstructions": {"configMapKeyRef": ref}})
        )


# ------------------------------------------------------------------ planningThreads rendered


def _planning(command: list[str]) -> list[str]:
    engine = command.index("--")
    return [v for flag, v in itertools.pairwise(command[:engine]) if flag == "--planning-threads"]


@pytest.mark.parametrize(
    ("workers", "expected"),
    [
        pytest.param(None, {"aggregated": []}, id="unset-worker-default"),
        pytest.param({"planningThreads": 8}, {"aggregated": ["8"]}, id="aggregated"),
        pytest.param(
            {"mode": "disaggregated", "prefill": {}, "decode": {}, "planningThreads": 2},
            {"prefill": ["2"], "decode": ["2"]},
            id="every-pool",
        ),
    ],
)
def test_planning_threads_reach_every_worker(
    workers: Body | None, expected: dict[str, list[str]]
) -> None:
    cr = KvRetentionDeployment.from_k8s(body(workers=workers))
    for role, values in expected.items():
        assert _planning(build_worker_command(cr, role)) == values  # type: ignore[arg-type]


@pytest.mark.parametrize("threads", [0, 65, "4"])
def test_planning_threads_out_of_bounds_are_refused(threads: Any) -> None:
    with pytest.raises(SpecError):
        KvRetentionDeployment.from_k8s(body(workers={"planningThreads": threads}))


def test_the_spec_names_the_workers_own_planning_default() -> None:
    assert DEFAULT_PLANNING_THREADS == DEFAULT_THREADS


# ------------------------------------------------------------------ a missing ConfigMap


STARTING = Verdict("False", "PodsStarting", "Deployment f-frontend: 0/1 ready; ContainerCreating")
READY = Verdict("True", "PodsReady", "all pods ready (f-frontend 1/1)")
SCALED = Verdict("False", "ScaledToZero", "Deployment f-frontend is scaled to 0 replicas")


@pytest.mark.parametrize(
    ("frontend", "missing", "reason"),
    [
        (STARTING, None, "PodsStarting"),
        (STARTING, "ConfigMap c not found in namespace ns", "CodexInstructionsMissing"),
        (READY, "ConfigMap c not found in namespace ns", "PodsReady"),
        (SCALED, "ConfigMap c not found in namespace ns", "ScaledToZero"),
    ],
    ids=["nothing-missing", "missing", "ready", "scaled-to-zero"],
)
def test_check_codex_instructions(frontend: Verdict, missing: str | None, reason: str) -> None:
    got = check_codex_instructions(frontend, missing)
    assert got.reason == reason
    if reason == "CodexInstructionsMissing":
        assert got.message.startswith(f"{missing} (spec.frontend.codexInstructions")
        assert "ContainerCreating" in got.message
        assert reason in PROBLEM_REASONS


def _condition(fake: FakeKube, type_: str) -> tuple[str, str, str]:
    return condition_messages(fake.cr())[type_]


async def test_a_missing_codex_configmap_or_key_is_named_until_the_frontend_is_ready(
    fake: FakeKube,
) -> None:
    c = await reconciled_with_frontend(fake, {"codexInstructions": CODEX})
    status, reason, message = _condition(fake, "FrontendReady")
    assert (status, reason) == ("False", "CodexInstructionsMissing")
    assert "ConfigMap codex-prompt not found in namespace ns" in message

    fake.put(kinds.CONFIGMAP, {"metadata": {"name": "codex-prompt", "namespace": "ns"}, "data": {}})
    await c.reconcile(("ns", "qwen"))
    status, reason, message = _condition(fake, "FrontendReady")
    assert reason == "CodexInstructionsMissing"
    assert "ConfigMap codex-prompt in namespace ns has no key instructions.md" in message

    fake.put(
        kinds.CONFIGMAP,
        {"metadata": {"name": "codex-prompt", "namespace": "ns"}, "data": {"instructions.md": "x"}},
    )
    await c.reconcile(("ns", "qwen"))
    assert _condition(fake, "FrontendReady")[1] != "CodexInstructionsMissing"
    await reconcile_rolled_out(fake, c)
    fake.reads.clear()
    await c.reconcile(("ns", "qwen"))
    assert ("GET", "configmaps") not in fake.reads  # a ready frontend: nothing is read


@pytest.mark.parametrize(
    ("pod", "fragment"),
    [
        ({"volumes": [{"name": "codex-instructions", "emptyDir": {}}]}, "the name"),
        ({"volumeMounts": [{"name": "x", "mountPath": "/etc/kvretention/codex"}]}, "would hide"),
        ({"volumeMounts": [{"name": "x", "mountPath": "/etc/kvretention/"}]}, "would hide"),
        ({"volumeMounts": [{"name": "x", "mountPath": "/etc/kvretention/codex/a"}]}, "would hide"),
    ],
    ids=["volume-name", "same-path", "above", "below"],
)
def test_pod_options_may_not_take_the_codex_mount(pod: Body, fragment: str) -> None:
    frontend = {"codexInstructions": CODEX, "pod": pod}
    (problem,) = check_spec(KvRetentionDeployment.from_k8s(body(frontend=frontend)))
    assert problem.startswith("spec.frontend.pod.volume")
    assert fragment in problem
    assert check_spec(KvRetentionDeployment.from_k8s(body(frontend={"pod": pod}))) == []


def test_pod_options_beside_the_codex_mount_are_kept() -> None:
    pod = {"volumeMounts": [{"name": "x", "mountPath": "/etc/kvretention/codex-extra"}]}
    frontend = {"codexInstructions": CODEX, "pod": pod}
    assert check_spec(KvRetentionDeployment.from_k8s(body(frontend=frontend))) == []


async def test_an_unreadable_configmap_leaves_the_frontend_reason_alone(fake: FakeKube) -> None:
    """A read the API server refuses (RBAC, a busy server) says nothing about the ConfigMap."""
    cr = load_example("aggregated")
    cr["spec"].setdefault("frontend", {})["codexInstructions"] = CODEX
    fake.put(CR_KIND, cr)
    real = fake.get_or_none

    async def forbidden(kind: kinds.ResourceKind, ns: str, name: str) -> Any:
        if kind == kinds.CONFIGMAP and name == "codex-prompt":
            raise k.ApiError(403, "configmaps is forbidden", what="GET configmaps")
        return await real(kind, ns, name)

    fake.get_or_none = forbidden  # type: ignore[method-assign]
    c = controller(fake)
    assert await c.reconcile(("ns", "qwen")) == "ok"
    assert _condition(fake, "FrontendReady")[1] != "CodexInstructionsMissing"
