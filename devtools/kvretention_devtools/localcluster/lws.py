"""The LeaderWorkerSet controller (sigs.k8s.io/lws) on the local plane, as a process.

Multinode fleets render LeaderWorkerSets; this runs the real controller against the plane so they
reconcile for real: its CRD from the same release, the controller built by ``scripts/build-lws.sh``,
and its admission webhooks, which it needs (the pod webhook gives each pod of a group its rank,
its leader's address and its group's labels). In a cluster they sit behind a Service; here the
webhook server listens on loopback with a certificate made for 127.0.0.1, and the webhook
configurations call it by URL with that certificate as their CA bundle.

Everything it starts is recorded in ``<state dir>/lws/state.json`` and stopped by pid.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from kvretention.ports import free_port
from kvretention_devtools.localcluster import process
from kvretention_devtools.localcluster.binaries import repo_root
from kvretention_devtools.localcluster.errors import ClusterError
from kvretention_devtools.localcluster.httpjson import request, write

LWS_ENV: Final = "KVR_LWS_DIR"
"""A folder with ``lws-controller-manager`` and ``crds.yaml`` (default: scripts/build-lws.sh's)."""
BINARY: Final = "lws-controller-manager"
FIELD_MANAGER: Final = "kvretention-localcluster"
CRD_NAME: Final = "leaderworkersets.leaderworkerset.x-k8s.io"
MUTATING: Final = "kvretention-localcluster-lws-mutating"
VALIDATING: Final = "kvretention-localcluster-lws-validating"
_LWS_PODS: Final = {
    "matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]
}
_WEBHOOKS: Final = (
    # (configuration kind, webhook name, path, group, resource, operations, object selector)
    (
        "Mutating",
        "mleaderworkerset.kb.io",
        "/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
        "leaderworkerset.x-k8s.io",
        "leaderworkersets",
        ["CREATE", "UPDATE"],
        None,
    ),
    ("Mutating", "mpod.kb.io", "/mutate--v1-pod", "", "pods", ["CREATE"], _LWS_PODS),
    (
        "Validating",
        "vleaderworkerset.kb.io",
        "/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
        "leaderworkerset.x-k8s.io",
        "leaderworkersets",
        ["CREATE", "UPDATE"],
        None,
    ),
    ("Validating", "vpod.kb.io", "/validate--v1-pod", "", "pods", ["CREATE", "UPDATE"], _LWS_PODS),
)
"""LWS's own webhooks (its config/webhook manifests and their patches), called by URL here."""


@dataclass(frozen=True)
class LwsState:
    """What ``start`` recorded: the controller's pid and where it listens."""

    pid: int
    binary: str
    webhook_port: int
    health_port: int
    log: str


def _dir(state_dir: Path) -> Path:
    return state_dir / "lws"


def _state_file(state_dir: Path) -> Path:
    return _dir(state_dir) / "state.json"


def load(state_dir: Path) -> LwsState | None:
    try:
        return LwsState(**json.loads(_state_file(state_dir).read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as err:
        raise ClusterError(f"unreadable {_state_file(state_dir)}: {err}") from err


def resolve_lws_dir(explicit: Path | None = None) -> Path:
    """The built controller and its CRDs: an explicit folder, ``$KVR_LWS_DIR``, or the cache
    entry of this checkout's ``scripts/build-lws.sh`` (built there if missing)."""
    if explicit is None and os.environ.get(LWS_ENV):
        explicit = Path(os.environ[LWS_ENV])
    if explicit is None:
        root = repo_root()
        script = root / "scripts" / "build-lws.sh" if root is not None else None
        if script is None or not script.exists():
            raise ClusterError(
                f"no LWS controller: set {LWS_ENV} to a folder built by build-lws.sh"
            )
        done = subprocess.run([str(script)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ClusterError(f"scripts/build-lws.sh failed:\n{done.stderr.strip()[-2000:]}")
        explicit = Path(done.stdout.strip().splitlines()[-1])
    for name in (BINARY, "crds.yaml"):
        if not (explicit / name).exists():
            raise ClusterError(f"{explicit} has no {name} (run scripts/build-lws.sh)")
    return explicit


def _serving_cert(cert_dir: Path) -> bytes:
    """A self-signed certificate for 127.0.0.1: the webhook server's, and its own CA bundle."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ClusterError("openssl is not installed (apt-get install openssl)")
    cert_dir.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [
            openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            "-keyout", str(cert_dir / "tls.key"), "-out", str(cert_dir / "tls.crt"),
        ],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise ClusterError(f"openssl could not make the webhook certificate: {done.stderr}")
    (cert_dir / "tls.key").chmod(0o600)
    return (cert_dir / "tls.crt").read_bytes()


def build_config(*, webhook_port: int, health_port: int, cert_dir: Path) -> dict[str, Any]:
    """The controller's Configuration: one instance (no election), our certificate, loopback."""
    return {
        "apiVersion": "config.lws.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
    }


def build_webhook_configurations(*, webhook_port: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """LWS's webhook configurations, calling the loopback server by URL."""
    import base64

    bundle = base64.b64encode(ca_pem).decode()
    out: dict[str, dict[str, Any]] = {}
    for kind, name, path, group, resource, operations, selector in _WEBHOOKS:
        config = out.setdefault(
            kind,
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": f"{kind}WebhookConfiguration",
                "metadata": {"name": MUTATING if kind == "Mutating" else VALIDATING},
                "webhooks": [],
            },
        )
        hook: dict[str, Any] = {
            "name": name,
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "clientConfig": {"url": f"https://127.0.0.1:{webhook_port}{path}", "caBundle": bundle},
            "rules": [
                {
                    "apiGroups": [group],
                    "apiVersions": ["v1"],
                    "operations": operations,
                    "resources": [resource],
                }
            ],
        }
        if selector is not None:
            hook["objectSelector"] = selector
        config["webhooks"].append(hook)
    return list(out.values())


def _apply(server: str, token: str, ca_pem: bytes, path: str, body: dict[str, Any]) -> None:
    status, answer = write(
        "PATCH",
        f"{server}{path}?fieldManager={FIELD_MANAGER}&force=true",
        token=token,
        body=body,
        ca_pem=ca_pem,
        timeout_s=30,
        content_type="application/apply-patch+yaml",
    )
    if status not in (200, 201):
        raise ClusterError(f"applying {body['kind']} {body['metadata']['name']}: {status} {answer}")


def _established(server: str, token: str, ca_pem: bytes) -> bool:
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}"
    status, body = request("GET", f"{server}{path}", token=token, ca_pem=ca_pem)
    conditions = (body.get("status") or {}).get("conditions") or [] if status == 200 else []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def install_crds(*, server: str, token: str, ca_pem: bytes, lws_dir: Path) -> None:
    for crd in yaml.safe_load_all((lws_dir / "crds.yaml").read_text()):
        if crd:
            path = (
                f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"
            )
            _apply(server, token, ca_pem, path, crd)


def start(
    state_dir: Path,
    *,
    server: str,
    token: str,
    ca_pem: bytes,
    kubeconfig: Path,
    lws_dir: Path | None = None,
    timeout_s: float = 90.0,
    echo: Any = lambda _: None,
) -> LwsState:
    """Install the CRD, start the controller, and register its webhooks; idempotent."""
    existing = load(state_dir)
    if existing is not None and process.is_alive(existing.pid, existing.binary):
        return existing
    found = resolve_lws_dir(lws_dir)
    install_crds(server=server, token=token, ca_pem=ca_pem, lws_dir=found)
    root = _dir(state_dir)
    cert_dir = root / "certs"
    bundle = _serving_cert(cert_dir)
    webhook_port, health_port = free_port(), free_port()
    config = root / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            build_config(webhook_port=webhook_port, health_port=health_port, cert_dir=cert_dir)
        )
    )
    binary = str(found / BINARY)
    log = root / "lws-controller-manager.log"
    pid = process.spawn(
        [binary, f"--config={config}", "--zap-log-level=info"],
        log=log,
        env={"KUBECONFIG": str(kubeconfig)},
    )
    lws = LwsState(pid, binary, webhook_port, health_port, str(log))
    _state_file(state_dir).write_text(json.dumps(asdict(lws)))
    echo(f"started lws-controller-manager (pid {pid}, log {log})")
    deadline = time.monotonic() + timeout_s

    def wait(what: str, check: Callable[[], bool]) -> None:
        watched = {"lws-controller-manager": process.Watched(pid, binary, log)}
        process.wait_until(what, check, watched=watched, deadline=deadline)

    wait("the LWS CRD", lambda: _established(server, token, ca_pem))
    wait(
        "the LWS controller's /readyz",
        lambda: request("GET", f"http://127.0.0.1:{health_port}/readyz")[0] == 200,
    )
    hook = f"https://127.0.0.1:{webhook_port}/mutate--v1-pod"
    # Registered once the controllers are set up (after the manager started): 404 until then.
    wait(
        "the LWS pod webhook",
        lambda: request("POST", hook, body={}, ca_pem=bundle)[0] not in (0, 404),
    )
    for config_body in build_webhook_configurations(webhook_port=webhook_port, ca_pem=bundle):
        plural = config_body["kind"].lower() + "s"
        path = f"/apis/admissionregistration.k8s.io/v1/{plural}/{config_body['metadata']['name']}"
        _apply(server, token, ca_pem, path, config_body)
    return lws


def stop(
    state_dir: Path,
    *,
    server: str | None = None,
    token: str | None = None,
    ca_pem: bytes | None = None,
) -> bool:
    """Remove the webhook configurations (when the plane is still up) and stop the controller.
    The CRD stays: deleting it would delete every LeaderWorkerSet with it."""
    lws = load(state_dir)
    if lws is None:
        return False
    if server is not None and token is not None:
        for plural, name in (
            ("mutatingwebhookconfigurations", MUTATING),
            ("validatingwebhookconfigurations", VALIDATING),
        ):
            path = f"{server}/apis/admissionregistration.k8s.io/v1/{plural}/{name}"
            request("DELETE", path, token=token, ca_pem=ca_pem)
    stopped = process.stop(lws.pid, lws.binary)
    _state_file(state_dir).unlink(missing_ok=True)
    return stopped
