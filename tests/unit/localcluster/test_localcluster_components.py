"""The local plane's pure builders: each component's argv, the fake Node, the kubeconfig.

These flags are what keeps the plane private (loopback only, token and RBAC auth) and what makes
ServiceAccount tokens work (``kubectl create token``, the demo's operator identity); a dropped or
misspelt flag here shows up elsewhere only as a hang or a 401.
"""

from __future__ import annotations

import base64
from collections import Counter
from pathlib import Path

import pytest
from kubernetes import config

from kvretention_devtools.localcluster import components as c
from kvretention_devtools.localcluster.components import ORDER, Layout, Ports

BIN = Path("/opt/kvr/bin")
LAYOUT = Layout(Path("/state/plane"))
PORTS = Ports(
    etcd_client=23790,
    etcd_peer=23800,
    apiserver=36443,
    controller_manager=30257,
    scheduler=30259,
    kwok=31000,
)
LOOPBACK = "127.0.0.1"


def argv(component: str) -> list[str]:
    return c.build_argv(component, BIN, LAYOUT, PORTS)


def flags(component: str) -> dict[str, str]:
    """``--name=value`` flags as name -> value (bare flags map to "")."""
    out: dict[str, str] = {}
    for arg in argv(component)[1:]:
        assert arg.startswith("--"), f"{component}: positional argument {arg!r}"
        name, _, value = arg.partition("=")
        out[name] = value
    return out


@pytest.mark.parametrize("component", ORDER)
def test_each_component_runs_its_own_binary_from_the_bin_dir(component: str) -> None:
    assert argv(component)[0] == str(BIN / component)


@pytest.mark.parametrize("component", ORDER)
def test_no_flag_is_given_twice(component: str) -> None:
    names = Counter(a.partition("=")[0] for a in argv(component)[1:])
    assert [n for n, count in names.items() if count > 1] == []


def test_unknown_component_has_no_builder() -> None:
    with pytest.raises(KeyError):
        c.build_argv("kubelet", BIN, LAYOUT, PORTS)


def test_start_order_brings_up_storage_then_api_server_first() -> None:
    assert ORDER[:2] == ("etcd", "kube-apiserver")
    assert set(ORDER) == {
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
    }


# Every address a component listens on or advertises, and what it must be.
LISTEN_TABLE = [
    ("etcd", "--listen-client-urls", f"http://{LOOPBACK}:{PORTS.etcd_client}"),
    ("etcd", "--advertise-client-urls", f"http://{LOOPBACK}:{PORTS.etcd_client}"),
    ("etcd", "--listen-peer-urls", f"http://{LOOPBACK}:{PORTS.etcd_peer}"),
    ("etcd", "--initial-advertise-peer-urls", f"http://{LOOPBACK}:{PORTS.etcd_peer}"),
    ("etcd", "--initial-cluster", f"kvr=http://{LOOPBACK}:{PORTS.etcd_peer}"),
    ("kube-apiserver", "--bind-address", LOOPBACK),
    ("kube-apiserver", "--advertise-address", LOOPBACK),
    ("kube-apiserver", "--secure-port", str(PORTS.apiserver)),
    ("kube-apiserver", "--etcd-servers", f"http://{LOOPBACK}:{PORTS.etcd_client}"),
    ("kube-controller-manager", "--bind-address", LOOPBACK),
    ("kube-controller-manager", "--secure-port", str(PORTS.controller_manager)),
    ("kube-scheduler", "--bind-address", LOOPBACK),
    ("kube-scheduler", "--secure-port", str(PORTS.scheduler)),
    ("kwok", "--server-address", f"{LOOPBACK}:{PORTS.kwok}"),
    ("kwok", "--node-ip", LOOPBACK),
]


@pytest.mark.parametrize(("component", "flag", "value"), LISTEN_TABLE)
def test_every_listener_binds_loopback_on_its_own_port(
    component: str, flag: str, value: str
) -> None:
    assert flags(component)[flag] == value


@pytest.mark.parametrize("component", ORDER)
def test_nothing_listens_on_all_interfaces(component: str) -> None:
    joined = " ".join(argv(component))
    assert "0.0.0.0" not in joined
    assert "[::]" not in joined
    assert "--insecure-bind-address" not in joined


@pytest.mark.parametrize(
    ("component", "port"),
    [
        ("kube-apiserver", PORTS.apiserver),
        ("kube-controller-manager", PORTS.controller_manager),
        ("kube-scheduler", PORTS.scheduler),
        ("kwok", PORTS.kwok),
    ],
)
def test_a_components_port_appears_in_no_other_component(component: str, port: int) -> None:
    for other in ORDER:
        if other != component:
            assert str(port) not in " ".join(argv(other)), other


# Auth and ServiceAccount wiring: the flags that must be there, with the files `up` writes.
PRESENT_TABLE = [
    ("kube-apiserver", "--token-auth-file", str(LAYOUT.token_file)),
    ("kube-apiserver", "--authorization-mode", "Node,RBAC"),
    ("kube-apiserver", "--service-account-issuer", c.SA_ISSUER),
    ("kube-apiserver", "--service-account-key-file", str(LAYOUT.sa_pub)),
    ("kube-apiserver", "--service-account-signing-key-file", str(LAYOUT.sa_key)),
    ("kube-apiserver", "--cert-dir", str(LAYOUT.certs)),
    ("kube-apiserver", "--service-cluster-ip-range", c.SERVICE_CIDR),
    ("kube-controller-manager", "--service-account-private-key-file", str(LAYOUT.sa_key)),
    ("kube-controller-manager", "--root-ca-file", str(LAYOUT.serving_cert)),
    ("kube-controller-manager", "--controllers", "*"),
    ("kube-controller-manager", "--service-cluster-ip-range", c.SERVICE_CIDR),
    ("kube-controller-manager", "--cluster-cidr", c.POD_CIDR),
    ("kube-controller-manager", "--kubeconfig", str(LAYOUT.kubeconfig)),
    ("kube-controller-manager", "--authentication-kubeconfig", str(LAYOUT.kubeconfig)),
    ("kube-controller-manager", "--authorization-kubeconfig", str(LAYOUT.kubeconfig)),
    ("kube-controller-manager", "--leader-elect", "false"),
    ("kube-scheduler", "--kubeconfig", str(LAYOUT.kubeconfig)),
    ("kube-scheduler", "--authentication-kubeconfig", str(LAYOUT.kubeconfig)),
    ("kube-scheduler", "--authorization-kubeconfig", str(LAYOUT.kubeconfig)),
    ("kube-scheduler", "--leader-elect", "false"),
    ("kwok", "--kubeconfig", str(LAYOUT.kubeconfig)),
    ("kwok", "--config", str(BIN / "kwok-stages.yaml")),
    ("kwok", "--manage-all-nodes", "false"),
    ("kwok", "--manage-nodes-with-annotation-selector", f"{c.KWOK_ANNOTATION}=fake"),
    ("kwok", "--cidr", c.POD_CIDR),
    ("etcd", "--data-dir", str(LAYOUT.etcd_data)),
    ("etcd", "--unsafe-no-fsync", ""),
]


@pytest.mark.parametrize(("component", "flag", "value"), PRESENT_TABLE)
def test_auth_and_service_account_flags_are_wired_to_the_layout(
    component: str, flag: str, value: str
) -> None:
    assert flags(component).get(flag) == value


# Flags that would open the plane up or make it depend on something outside it.
ABSENT_TABLE = [
    ("kube-apiserver", "--insecure-port"),
    ("kube-apiserver", "--anonymous-auth"),
    ("kube-apiserver", "--client-ca-file"),
    ("kube-apiserver", "--etcd-cafile"),
    ("kube-controller-manager", "--master"),
    ("kube-scheduler", "--master"),
    ("kube-scheduler", "--service-account-private-key-file"),
    ("kwok", "--manage-all-nodes=true"),
    ("etcd", "--client-cert-auth"),
]


@pytest.mark.parametrize(("component", "flag"), ABSENT_TABLE)
def test_flags_that_must_not_be_set(component: str, flag: str) -> None:
    name, _, value = flag.partition("=")
    if value:
        assert flags(component).get(name) != value
    else:
        assert name not in flags(component)


def test_authorization_never_allows_everything() -> None:
    modes = flags("kube-apiserver")["--authorization-mode"].split(",")
    assert "AlwaysAllow" not in modes
    assert "RBAC" in modes


def test_urls() -> None:
    assert c.server_url(PORTS) == f"https://{LOOPBACK}:{PORTS.apiserver}"
    assert c.etcd_url(PORTS) == f"http://{LOOPBACK}:{PORTS.etcd_client}"


@pytest.mark.parametrize(
    ("path", "relative"),
    [
        (LAYOUT.state_file, "state.json"),
        (LAYOUT.kubeconfig, "kubeconfig"),
        (LAYOUT.etcd_data, "etcd"),
        (LAYOUT.serving_cert, "certs/apiserver.crt"),
        (LAYOUT.sa_key, "certs/sa.key"),
        (LAYOUT.sa_pub, "certs/sa.pub"),
        (LAYOUT.token_file, "certs/tokens.csv"),
        (LAYOUT.kwok_home, "kwok-home"),
        (LAYOUT.log("kwok"), "logs/kwok.log"),
    ],
)
def test_layout_keeps_every_file_under_the_state_dir(path: Path, relative: str) -> None:
    assert path == LAYOUT.root / relative


def test_kube_apiserver_serving_cert_is_in_its_cert_dir() -> None:
    # kube-apiserver writes apiserver.crt into --cert-dir; the kubeconfig's CA is read from there.
    assert LAYOUT.serving_cert.parent == Path(flags("kube-apiserver")["--cert-dir"])


@pytest.mark.parametrize(("gpus", "expected"), [(0, None), (1, "1"), (8, "8")])
def test_fake_node_gpu_capacity(gpus: int, expected: str | None) -> None:
    node = c.build_node("kvr-node-0", gpus=gpus)
    for field in ("capacity", "allocatable"):
        assert node["status"][field].get("nvidia.com/gpu") == expected


def test_fake_node_is_one_kwok_manages() -> None:
    node = c.build_node("kvr-node-3", gpus=0)
    key, _, value = flags("kwok")["--manage-nodes-with-annotation-selector"].partition("=")
    assert node["metadata"]["annotations"][key] == value
    assert node["metadata"]["name"] == "kvr-node-3"
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "kvr-node-3"
    assert "taints" not in node.get("spec", {})


CA_PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_kubeconfig_embeds_the_ca_and_the_token() -> None:
    kc = c.build_kubeconfig(server="https://127.0.0.1:36443", ca_pem=CA_PEM, token="t0k3n")
    ctx = next(x["context"] for x in kc["contexts"] if x["name"] == kc["current-context"])
    cluster = next(x["cluster"] for x in kc["clusters"] if x["name"] == ctx["cluster"])
    user = next(x["user"] for x in kc["users"] if x["name"] == ctx["user"])
    assert cluster["server"] == "https://127.0.0.1:36443"
    assert base64.b64decode(cluster["certificate-authority-data"]) == CA_PEM
    assert "certificate-authority" not in cluster  # no file path: the config is self-contained
    assert "insecure-skip-tls-verify" not in cluster
    assert user == {"token": "t0k3n"}


def test_kubeconfig_is_one_the_kubernetes_client_loads() -> None:
    kc = c.build_kubeconfig(server="https://127.0.0.1:36443", ca_pem=CA_PEM, token="t0k3n")
    api = config.new_client_from_config_dict(kc)
    try:
        cfg = api.configuration
        assert cfg.host == "https://127.0.0.1:36443"
        assert cfg.auth_settings()["BearerToken"]["value"] == "Bearer t0k3n"
        assert cfg.verify_ssl
        assert Path(cfg.ssl_ca_cert).read_bytes() == CA_PEM
    finally:
        api.close()
