"""The LWS controller's local wiring: its Configuration and its webhooks called by URL."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from kvretention_devtools.localcluster import lws
from kvretention_devtools.localcluster.errors import ClusterError


def test_the_controller_runs_alone_with_our_certificate_on_loopback(tmp_path: Path) -> None:
    config = lws.build_config(webhook_port=9443, health_port=9444, cert_dir=tmp_path)
    assert config["leaderElection"] == {"leaderElect": False}
    assert config["internalCertManagement"] == {"enable": False}
    assert config["webhook"] == {"host": "127.0.0.1", "port": 9443, "certDir": str(tmp_path)}
    assert config["health"] == {"healthProbeBindAddress": "127.0.0.1:9444"}
    assert config["metrics"] == {"bindAddress": "0"}


def test_every_lws_webhook_calls_the_loopback_server_with_our_ca() -> None:
    configs = lws.build_webhook_configurations(webhook_port=9443, ca_pem=b"PEM")
    assert [c["kind"] for c in configs] == [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ]
    hooks = {h["name"]: h for c in configs for h in c["webhooks"]}
    assert sorted(hooks) == [
        "mleaderworkerset.kb.io",
        "mpod.kb.io",
        "vleaderworkerset.kb.io",
        "vpod.kb.io",
    ]
    for hook in hooks.values():
        assert hook["clientConfig"]["url"].startswith("https://127.0.0.1:9443/")
        assert base64.b64decode(hook["clientConfig"]["caBundle"]) == b"PEM"
        assert hook["failurePolicy"] == "Fail"
    # Only the LWS controller's own pods go through its pod webhooks.
    for name in ("mpod.kb.io", "vpod.kb.io"):
        (expr,) = hooks[name]["objectSelector"]["matchExpressions"]
        assert expr == {"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}
    assert "objectSelector" not in hooks["mleaderworkerset.kb.io"]
    assert hooks["mpod.kb.io"]["clientConfig"]["url"].endswith("/mutate--v1-pod")


def test_a_folder_without_the_build_is_refused(tmp_path: Path) -> None:
    (tmp_path / lws.BINARY).write_text("")
    with pytest.raises(ClusterError, match=r"crds\.yaml"):
        lws.resolve_lws_dir(tmp_path)


def test_stop_without_a_started_controller_is_a_no_op(tmp_path: Path) -> None:
    assert lws.stop(tmp_path) is False
