"""Every pod a real process: the chart's operator, examples/cpu-tiny.yaml's fleet, the probe
init container, and agent requests through the frontend Service to a worker pod.

One fleet for the tier (``conftest.fleet``: the node starts once, pods take seconds each, the
engines a minute or so): the chart installs the operator from the image built here, the operator reconciles the example
with the images built here (the CPU worker image: SGLang's real engine on CPU serving the
project's tiny model, no GPU on this machine), and the tests read what the real pods did:
container ids from containerd, the probe's termination message, SGLang's own ``cached_tokens``,
the worker's request trace (``kubectl exec``), its ``/metrics``. The tiny model's answers are
noise: the tests assert structure, token counts and cache behaviour, never text.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from pods_fixtures import (
    FLEET_NS,
    READY_S,
    RELEASE_NS,
    REQUEST_S,
    cached_tokens,
    condition,
    fleet_pods,
    fleet_service,
    frontend_url,
    get_json,
    kubectl,
    post,
    traced,
    wait_service_routes,
    worker_env,
    worker_pods,
)

from kvretention.controller.kvstore_metrics import parse_master_metrics
from kvretention.replay.sessions import claude_code_session, codex_session
from support.controlplane import Cluster, wait_until

CGROUP_PIDS = Path("/sys/fs/cgroup/pids")


def test_chart_runs_the_operator_as_a_real_pod(node_cluster: Cluster, fleet: str) -> None:
    (pod,) = get_json(
        node_cluster, "pods", "-n", RELEASE_NS, "-l", "app.kubernetes.io/name=kvretention-operator"
    )["items"]
    assert pod["spec"]["nodeName"] == "kvr-real-node"
    (status,) = pod["status"]["containerStatuses"]
    assert status["ready"] and status["containerID"].startswith("containerd://")
    assert "running" in status["state"]
    # The operator in the pod reconciled the fleet: the kvrd's status carries its conditions.
    assert condition(get_json(node_cluster, "kvrd", "-n", FLEET_NS, fleet), "Ready")


def test_example_fleet_is_ready_with_every_pod_running(node_cluster: Cluster, fleet: str) -> None:
    pods = fleet_pods(node_cluster, fleet)
    components = sorted({p["metadata"]["labels"]["app.kubernetes.io/component"] for p in pods})
    assert {"frontend", "router"} <= set(components), components
    assert sum(1 for p in pods if "worker" in p["metadata"]["name"]) >= 2
    for pod in pods:
        assert pod["status"]["phase"] == "Running", pod["metadata"]["name"]
        for status in pod["status"]["containerStatuses"]:
            assert status["ready"], (pod["metadata"]["name"], status)
            assert status["containerID"].startswith("containerd://")


def test_probe_init_container_report_reaches_kv_hints_supported(
    node_cluster: Cluster, fleet: str
) -> None:
    workers = [p for p in fleet_pods(node_cluster, fleet) if p["spec"].get("initContainers")]
    assert workers
    for pod in workers:
        (probe,) = pod["status"]["initContainerStatuses"]
        terminated = probe["state"]["terminated"]
        assert terminated["exitCode"] == 0
        report = json.loads(terminated["message"])
        assert report["sglang_version"] == "0.5.23"
        assert report["usable_for_hints"] is True
        # SGLang's own plugin loader, in the image, loads the retention plugin.
        assert report["retention_plugin"] == "loaded", report
        assert report["retention_target_problems"] == [], report
        # The image's libcuda stand-in lets the probe import the real Mooncake store client.
        assert report["mooncake_store_importable"] is True, report["mooncake_error"]
    kvrd = get_json(node_cluster, "kvrd", "-n", FLEET_NS, fleet)
    supported = condition(kvrd, "KvHintsSupported")
    assert supported["status"] == "True", supported
    assert "mooncake.store does not import" not in supported["message"], supported
    applied = condition(kvrd, "RetentionApplied")
    assert (applied["status"], applied["reason"]) == ("True", "Applied"), applied


def test_worker_pods_serve_sglangs_real_engine_on_cpu(node_cluster: Cluster, fleet: str) -> None:
    """Each worker pod embeds SGLang's real engine on CPU (the worker chose it: no GPU), serving
    the image's tiny model; the HiCache flags it could not start with are named."""
    for pod in worker_pods(node_cluster, fleet):
        url = f"http://{pod['status']['podIP']}:8002/v1/info"
        with urllib.request.urlopen(url, timeout=10) as resp:
            info = json.load(resp)
        assert info["engine"] == "sglang-0.5.23", info
        assert info["device"] == "cpu", info
        assert info["dialect"] == "versioned", info
        assert "--enable-hierarchical-cache" in info["left_out"]["flags"], info


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
def test_agent_request_through_the_frontend_service_reaches_a_worker_pod(
    node_cluster: Cluster, fleet: str, agent: str
) -> None:
    """Two turns of one agent conversation through the Service get SGLang's answers; the second
    reads its prefix from SGLang's radix cache (the session pins it to the same worker pod), and
    the worker's own trace shows what it passed SGLang."""
    frontend = frontend_url(node_cluster, fleet)
    answers = []
    if agent == "claude-code":
        *_, first, second = claude_code_session(turns=2)
        for headers, body in (first, second):
            answer = post(frontend + "/v1/messages", {**body, "model": "claude-haiku-4-5"}, headers)
            # The tiny model may end its answer at once (its end-of-turn token is likely): no
            # text is an answer too.
            assert answer["type"] == "message", answer
            assert answer["stop_reason"] in ("end_turn", "max_tokens", "tool_use"), answer
            answers.append(answer)
    else:
        *_, first, second = codex_session(turns=2)
        for headers, body in (first, second):
            answer = post(frontend + "/v1/responses", {**body, "model": "gpt-5-codex"}, headers)
            assert answer["status"] in ("completed", "incomplete"), answer
            answers.append(answer)
    cached = [cached_tokens(agent, a) for a in answers]
    # The second turn repeats the first's system prompt, tools and history: SGLang serves that
    # prefix from its radix cache and says so.
    assert cached[1] > 0, cached
    assert cached[1] > cached[0], cached
    rid = answers[1]["id"].partition("_")[2]
    records = wait_until(f"the worker's trace of {rid}", lambda: traced(node_cluster, fleet))
    assert rid in records, sorted(records)
    record = records[rid]
    assert record["outcome"] == "ok", record
    if agent == "claude-code":
        # Claude Code marks cache_control: the hint reached SGLang in the worker pod.
        assert record["kv_hints_passed"] is True, record
        assert record["kv_hints"], record
    else:
        # Codex sends prompt_cache_key, which is not retention intent: no hint.
        assert record["kv_hints_passed"] is False, record


WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
}


def test_a_forced_tool_call_comes_back_parsed_by_sglang(node_cluster: Cluster, fleet: str) -> None:
    """A forced ``tool_choice``: SGLang constrains the tiny model to the tool's schema and its
    qwen25 parser (in the worker pod) turns the output into the provider's tool call object.
    One call is asked for (as Codex does): a forced choice with parallel calls allowed lets a
    random model write several, each a valid call."""
    frontend = frontend_url(node_cluster, fleet)
    message = post(
        frontend + "/v1/messages",
        {
            "model": "claude-haiku-4-5",
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": [{"name": "get_weather", "input_schema": WEATHER}],
            "tool_choice": {
                "type": "tool",
                "name": "get_weather",
                "disable_parallel_tool_use": True,
            },
        },
        {"anthropic-version": "2023-06-01"},
    )
    uses = [b for b in message["content"] if b["type"] == "tool_use"]
    assert [u["name"] for u in uses] == ["get_weather"], message
    assert uses[0]["id"].startswith("toolu_"), uses
    # The constrained arguments of a random model can run past max_tokens: the call is still parsed.
    assert message["stop_reason"] in ("tool_use", "max_tokens"), message
    response = post(
        frontend + "/v1/responses",
        {
            "model": "gpt-5-codex",
            "max_output_tokens": 64,
            "input": "What is the weather in Paris?",
            "tools": [{"type": "function", "name": "get_weather", "parameters": WEATHER}],
            "tool_choice": "required",
            "parallel_tool_calls": False,
        },
        {},
    )
    calls = [o for o in response["output"] if o["type"] == "function_call"]
    assert [c["name"] for c in calls] == ["get_weather"], response
    assert calls[0]["call_id"].startswith("call_"), calls


# Run in a worker container with the image's venv: the real ``MooncakeDistributedStore`` (over the
# image's TEST-ONLY libcuda stand-in), set up from the pod's own rendered Mooncake config (the
# master's Service name: cluster DNS, kube-proxy) and its ``MOONCAKE_LOCAL_HOSTNAME`` (the pod IP,
# which the operator renders), protocol and device, as tests/l3 sets it up. Its segment is 16 MiB
# (the client's minimum), not the rendered 4gb: the test only needs room for one object.
# ``put KEY``: mount the segment, put a 64 KiB value, read it back, print, then hold the segment
# (the object lives in it) until stdin closes. ``get KEY``: read the object (from the other pod's
# segment, over TCP between the pods) and print its digest.
STORE_PYTHON = "/opt/kvretention/bin/python"
STORE = """
import hashlib, json, os, sys
from mooncake.store import MooncakeDistributedStore
mode, key = sys.argv[1], sys.argv[2]
config = json.load(open(os.environ["SGLANG_HICACHE_MOONCAKE_CONFIG_PATH"]))
segment = 16 * 2**20
store = MooncakeDistributedStore()
rc = store.setup(
    os.environ["MOONCAKE_LOCAL_HOSTNAME"], config["metadata_server"], segment, segment,
    config["protocol"], config["device_name"], config["master_server_address"],
    tenant_id=config.get("tenant_id", "default"),
)
out = {"setup": rc, "local_hostname": os.environ["MOONCAKE_LOCAL_HOSTNAME"],
       "master": config["master_server_address"], "metadata": config["metadata_server"]}
digest = lambda b: hashlib.sha256(b).hexdigest()
if rc == 0 and mode == "put":
    value = (key.encode() + b"|") * (65536 // (len(key) + 1) + 1)
    value = value[:65536]
    out.update(put=store.put(key, value), digest=digest(value))
    out["read_back"] = digest(bytes(store.get(key)))
elif rc == 0:
    out["got"] = digest(bytes(store.get(key)))
print(json.dumps(out), flush=True)
if rc == 0 and mode == "put":
    sys.stdin.read()
store.close()
"""


def _report(lines: list[str]) -> dict[str, Any]:
    """The STORE script's JSON line among its output (the client may print its own lines)."""
    for line in lines:
        if line.startswith('{"setup"'):
            report: dict[str, Any] = json.loads(line)
            return report
    return {}


def _master_metrics(pod: dict[str, Any]) -> dict[str, float]:
    """The master pod's own ``/metrics`` (at its pod IP), through the operator's parser."""
    ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    url = f"http://{pod['status']['podIP']}:{ports['metrics']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return parse_master_metrics(resp.read().decode())


def test_worker_pods_round_trip_an_object_through_the_mooncake_master_pod(
    node_cluster: Cluster, fleet: str, tmp_path: Path
) -> None:
    """One worker pod's real store client mounts a segment and puts an object through the managed
    master (named by its Service in the pod's config); the master pod's metrics count the mount,
    the put and the key; a second worker pod's client gets the object back (the master hands it
    the first pod's segment, read over TCP between the pods)."""
    master_svc = fleet_service(node_cluster, fleet, "mooncake-master")
    wait_service_routes(node_cluster, master_svc)
    (master,) = [p for p in fleet_pods(node_cluster, fleet) if "mooncake" in p["metadata"]["name"]]
    writer, reader, *_ = worker_pods(node_cluster, fleet)
    key = f"kvr-pods-tier/{writer['metadata']['name']}"
    before = _master_metrics(master)
    exec_store = [
        str(node_cluster.bin_dir / "kubectl"), f"--kubeconfig={node_cluster.kubeconfig}",
        "-n", FLEET_NS, "exec", "-i", writer["metadata"]["name"], "-c", "worker", "--",
        STORE_PYTHON, "-c", STORE, "put", key,
    ]  # fmt: skip
    put_log = tmp_path / "put.stderr"
    with put_log.open("w") as err:
        put = subprocess.Popen(
            exec_store, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True
        )
    lines: list[str] = []

    def read_lines() -> None:
        for line in put.stdout or []:
            lines.append(line)

    threading.Thread(target=read_lines, daemon=True).start()
    try:
        wait_until(
            f"the store client in {writer['metadata']['name']} put {key}",
            lambda: _report(lines) or put.poll() is not None,
            timeout_s=90,
        )
        wrote = _report(lines)
        assert wrote, f"exit {put.poll()}: {lines} {put_log.read_text()[-3000:]}"
        assert wrote["setup"] == 0, (wrote, put_log.read_text()[-3000:])
        svc_host = f"{master_svc['metadata']['name']}.{FLEET_NS}.svc:"
        assert wrote["master"].startswith(svc_host), wrote
        assert wrote["metadata"].startswith(f"http://{svc_host}"), wrote
        assert wrote["local_hostname"] == writer["status"]["podIP"], wrote
        assert wrote["put"] == 0, wrote
        assert wrote["read_back"] == wrote["digest"], wrote

        # The master's own count of what the writer's client did (one mount, one put, one key).
        expected = {
            "master_mount_segment_requests_total": 1.0,
            "master_put_start_requests_total": 1.0,
            "master_put_end_requests_total": 1.0,
            "master_key_count": 1.0,
        }
        deadline = time.monotonic() + 20  # the gauges are sampled, the counters are not
        while True:
            after_put = _master_metrics(master)
            grew = {name: after_put[name] - before[name] for name in expected}
            if grew == expected or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert grew == expected, grew

        done = node_cluster.kubectl(
            "-n", FLEET_NS, "exec", reader["metadata"]["name"], "-c", "worker", "--",
            STORE_PYTHON, "-c", STORE, "get", key,
            check=False, timeout_s=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        got = _report(done.stdout.splitlines())
        assert got["local_hostname"] == reader["status"]["podIP"], got
        assert got["setup"] == 0, (got, done.stderr[-3000:])
        assert got["got"] == wrote["digest"], (got, done.stderr[-3000:])
        after_get = _master_metrics(master)
        assert (
            after_get["master_get_replica_list_requests_total"]
            > after_put["master_get_replica_list_requests_total"]
        )
    finally:
        if put.stdin:
            put.stdin.close()
        try:
            put.wait(timeout=60)
        except subprocess.TimeoutExpired:
            put.kill()
            put.wait()
    assert put.returncode == 0, put_log.read_text()[-3000:]


def _inflight(pod: dict[str, Any]) -> float:
    """The worker's ``kvretention_worker_inflight``, read from its pod IP (the host is on the
    pods' bridge)."""
    url = f"http://{pod['status']['podIP']}:8002/metrics"
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            text = resp.read().decode()
    except OSError:
        return 0.0
    for line in text.splitlines():
        if line.startswith("kvretention_worker_inflight "):
            return float(line.split()[1])
    return 0.0


def _kill_container(pod: dict[str, Any], container: str) -> int:
    """SIGKILL every process of one container from the host (its cgroup), as an OOM kill would;
    returns how many were killed."""
    (status,) = [s for s in pod["status"]["containerStatuses"] if s["name"] == container]
    cid = status["containerID"].removeprefix("containerd://")
    uid = pod["metadata"]["uid"]
    (procs,) = CGROUP_PIDS.glob(f"kvr-node/kubepods/*/pod{uid}/{cid}/cgroup.procs")
    pids = [int(p) for p in procs.read_text().split()]
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return len(pids)


LONG_ANSWER = {
    "type": "object",
    "properties": {"report": {"type": "string", "minLength": 3000}},
    "required": ["report"],
}
"""A structured answer (Anthropic ``output_config.format``) whose one field is at least 3,000
characters: SGLang's grammar keeps the tiny model writing (hundreds of tokens, many seconds on
CPU) past the end-of-turn it would otherwise sample after a few dozen, so the stream is still in
flight when its worker is killed."""


def _stream_long_answer(url: str, events: list[str], done: threading.Event) -> None:
    headers, _ = claude_code_session(turns=2)[-1]
    body = {
        "model": "claude-haiku-4-5",
        "max_tokens": 8192,
        "stream": True,
        "messages": [{"role": "user", "content": "Write the report."}],
        "output_config": {"format": {"type": "json_schema", "schema": LONG_ANSWER}},
    }
    req = urllib.request.Request(
        url + "/v1/messages",
        data=json.dumps(body).encode(),
        headers={**headers, "content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=REQUEST_S) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if line.startswith("event: "):
                    events.append(line.removeprefix("event: "))
    except OSError as err:
        events.append(f"transport error: {err}")
    finally:
        done.set()


def _claude_code_ok(url: str) -> bool:
    return _claude_code_error(url) is None


CONNECT_TRIES = 5
"""A refused connection is tried again, as the Anthropic and OpenAI SDKs retry connection errors
(two retries by default, here a few more): on two cores, a worker pod loading SGLang's engine
starves the node and a kubelet readiness probe (1 s timeout) can briefly take the last serving
pod out of its Service. A request that reached a worker and failed is never tried again."""


def _claude_code_error(url: str) -> str | None:
    """None when a Claude Code-shaped request through the frontend Service succeeds, else why."""
    headers, body = claude_code_session(turns=2)[-1]
    body["model"] = "claude-haiku-4-5"
    for attempt in range(CONNECT_TRIES):
        try:
            answer = post(url + "/v1/messages", body, headers)
        except urllib.error.HTTPError as err:
            return f"{err.code}: {err.read()[:300]!r}"
        except OSError as err:
            refused = isinstance(getattr(err, "reason", err), ConnectionRefusedError)
            if refused and attempt + 1 < CONNECT_TRIES:
                time.sleep(2.0 * (attempt + 1))
                continue
            return f"transport: {err}"
        # The tiny model may end its answer at once: an empty message is an answer.
        if answer.get("type") == "message":
            return None
        return f"unexpected answer: {answer}"
    return "unreachable"


def _fleet_ready(cluster: Cluster, fleet: str) -> bool:
    obj = get_json(cluster, "kvrd", "-n", FLEET_NS, fleet)
    return (
        condition(obj, "Ready").get("status") == "True"
        and condition(obj, "Progressing").get("reason") == "Converged"
    )


def test_worker_killed_mid_stream_gives_a_clean_error_and_the_fleet_recovers(
    node_cluster: Cluster, fleet: str
) -> None:
    frontend = frontend_url(node_cluster, fleet)
    events: list[str] = []
    done = threading.Event()
    threading.Thread(target=_stream_long_answer, args=(frontend, events, done), daemon=True).start()
    serving = wait_until(
        "a worker pod with the stream in flight",
        lambda: [p for p in worker_pods(node_cluster, fleet) if _inflight(p) >= 1],
        timeout_s=60,
    )
    wait_until(
        "the first content of the stream", lambda: "content_block_delta" in events, timeout_s=120
    )
    assert not done.is_set(), f"the stream ended before its worker could be killed: {events}"
    (victim,) = serving
    restarts = victim["status"]["containerStatuses"][0]["restartCount"]
    assert _kill_container(victim, "worker") >= 1
    assert done.wait(30), "the client's stream did not end after its worker died"
    # The client got what was streamed, then one Anthropic error event: no hang, no cut socket.
    assert "content_block_delta" in events and events[-1] == "error", events
    assert "message_stop" not in events

    # The kubelet restarts the container; the fleet is Ready again and serves.
    name = victim["metadata"]["name"]
    wait_until(
        f"{name} restarted and ready",
        lambda: any(
            s["restartCount"] > restarts and s["ready"]
            for s in get_json(node_cluster, "pod", "-n", FLEET_NS, name)["status"][
                "containerStatuses"
            ]
        ),
        timeout_s=READY_S,
    )
    wait_until(f"{fleet} Ready again", lambda: _fleet_ready(node_cluster, fleet), timeout_s=READY_S)
    wait_service_routes(node_cluster, fleet_service(node_cluster, fleet, "frontend"))
    assert _claude_code_ok(frontend)


def test_rolling_update_drains_workers_without_a_failed_request(
    node_cluster: Cluster, fleet: str
) -> None:
    frontend = frontend_url(node_cluster, fleet)
    before = {p["metadata"]["name"] for p in worker_pods(node_cluster, fleet)}
    patch = {
        "spec": {
            "workers": {
                "pod": {
                    "env": [
                        *worker_env(),
                        {"name": "KVR_ROLL", "value": str(time.time())},
                    ]
                }
            }
        }
    }
    kubectl(
        node_cluster,
        "-n",
        FLEET_NS,
        "patch",
        "kvrd",
        fleet,
        "--type=merge",
        "-p",
        json.dumps(patch),
    )
    results: list[str | None] = []

    def rolled() -> bool:
        results.append(_claude_code_error(frontend))
        now = {p["metadata"]["name"] for p in worker_pods(node_cluster, fleet)}
        return not (now & before) and _fleet_ready(node_cluster, fleet)

    # Each new worker pod starts its engine (a minute or two on CPU) before an old one drains.
    wait_until("the workers rolled to the new template", rolled, timeout_s=2 * READY_S)
    assert len(results) >= 3, results
    failed = [r for r in results if r is not None]
    assert not failed, f"{len(failed)} of {len(results)} requests failed during the roll: {failed}"
