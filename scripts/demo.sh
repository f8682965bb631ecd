#!/usr/bin/env bash
# The README's demo (`make demo` / `make demo-down`): a real local control plane, the Helm chart
# installed, a sample fleet applied, and the operator reconciling it.
#
#   scripts/demo.sh up       start (or refresh) everything; safe to run again
#   scripts/demo.sh down     stop the operator process and the control plane
#   scripts/demo.sh status   show what is running
#
# How the operator runs here: these machines have no container runtime, so the chart's operator
# Deployment gets a kwok pod (Running and Ready, but no process). The demo runs the REAL operator
# as a local process that authenticates as the chart's ServiceAccount (a token from
# `kubectl create token`), so it can do exactly what the chart's RBAC grants and nothing more.
# The chart keeps its defaults (one replica, leader election on): the local process holds the
# `kvretention-operator` Lease in kvretention-system, exactly as the in-cluster pod would on a real
# cluster, and there is never a second actor.
#
# The probe report: on a real node each worker pod's `probe` init container runs
# `kvretention probe --report-only` and the kubelet keeps its output as the container's termination
# message, which the operator reads for KvHintsSupported, RetentionApplied and status.engine. kwok
# nodes run no container, so the demo runs that same command here and writes its output into the
# worker pods' status (scripts/inject_probe_report.py), saying so in its output. Without that stand-in the fleet
# would stay at HINTS Unknown / Ready ReadyWithoutKvHints (or not Ready under policy Required).
#
# Env: KVR_CLUSTER_DIR (default .kvr-cluster), KVR_DEMO_EXAMPLE (default examples/aggregated.yaml),
#      KVR_DEMO_TIMEOUT seconds to wait for Ready (default 180).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

KVR="$root/.venv/bin/kvretention"
PY="$root/.venv/bin/python"
state_dir="${KVR_CLUSTER_DIR:-$root/.kvr-cluster}"
demo_dir="$state_dir/demo"
example="${KVR_DEMO_EXAMPLE:-examples/aggregated.yaml}"
timeout_s="${KVR_DEMO_TIMEOUT:-180}"
system_ns=kvretention-system
demo_ns=demo
release=kvretention
sa=kvretention-operator

step() { printf '\n\033[1m==> %s\033[0m\n' "$*" >&2; }
note() { printf '    %s\n' "$*" >&2; }
die() { printf 'demo: %s\n' "$*" >&2; exit 1; }

[[ -x "$KVR" ]] || die "no $KVR: run scripts/bootstrap.sh (or make demo) first"

bin_dir() {
  # The first build compiles Kubernetes from source: build-kube.sh logs each step on stderr, and a
  # heartbeat here shows it is still going between steps.
  local out pid started=$SECONDS
  if out="$("$root/scripts/build-kube.sh" --check 2>/dev/null)"; then
    tail -n 1 <<<"$out"
    return
  fi
  note "first run: compiling etcd, kwok, helm and Kubernetes into ~/.cache/kvretention (once per machine)"
  out="$(mktemp)"
  "$root/scripts/build-kube.sh" >"$out" &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null && sleep 1; done
    kill -0 "$pid" 2>/dev/null && note "still building ($((SECONDS - started))s so far)"
  done
  wait "$pid" || { rm -f "$out"; die "scripts/build-kube.sh failed"; }
  tail -n 1 "$out"
  rm -f "$out"
}

kubeconfig() { "$KVR" cluster kubeconfig --state-dir "$state_dir"; }

operator_pid() {
  local pid
  pid="$(cat "$demo_dir/operator.pid" 2>/dev/null)" || return 1
  # Only our own process: the pid must still run `kvretention operator`.
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null &&
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "kvretention operator" || return 1
  echo "$pid"
}

free_port() {
  "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

write_sa_kubeconfig() { # write_sa_kubeconfig <admin kubeconfig> <token> <out>
  "$PY" - "$1" "$2" "$3" <<'PY'
import os, sys, yaml
admin, token, out = sys.argv[1], sys.argv[2], sys.argv[3]
config = yaml.safe_load(open(admin))
ctx = next(c for c in config["contexts"] if c["name"] == config["current-context"])
cluster = next(c for c in config["clusters"] if c["name"] == ctx["context"]["cluster"])
sa = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [cluster],
    "users": [{"name": "kvretention-operator", "user": {"token": token}}],
    "contexts": [{"name": "kvretention-operator",
                  "context": {"cluster": cluster["name"], "user": "kvretention-operator"}}],
    "current-context": "kvretention-operator",
}
fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
with os.fdopen(fd, "w") as f:
    yaml.safe_dump(sa, f, sort_keys=False)
PY
}

wait_for() { # wait_for <what> <seconds> <command...>
  local what="$1" seconds="$2" deadline
  shift 2
  deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    sleep 1
  done
}

start_operator() { # start_operator <sa kubeconfig>
  local pid health metrics
  if pid="$(operator_pid)"; then
    note "operator already running (pid $pid, log $demo_dir/operator.log)"
    return 0
  fi
  health="$(free_port)"
  metrics="$(free_port)"
  # setsid: the operator outlives this script (and make) until `scripts/demo.sh down`.
  POD_NAMESPACE="$system_ns" KUBECONFIG="$1" PYTHONUNBUFFERED=1 setsid "$KVR" operator \
    --namespace "$demo_ns" --leader-elect --health-port "$health" --metrics-port "$metrics" \
    --resync-seconds 30 >"$demo_dir/operator.log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$demo_dir/operator.pid"
  printf 'health=%s\nmetrics=%s\n' "$health" "$metrics" >"$demo_dir/operator.ports"
  note "started kvretention operator (pid $pid) as system:serviceaccount:$system_ns:$sa"
  note "log: $demo_dir/operator.log   metrics: http://127.0.0.1:$metrics/metrics"
  if ! wait_for "operator health" 60 "$PY" -c 'import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=2)' "http://127.0.0.1:$health/healthz"; then
    tail -n 30 "$demo_dir/operator.log" >&2 || true
    die "the operator did not become healthy"
  fi
}

up() {
  mkdir -p "$demo_dir"
  step "Kubernetes binaries (the first run builds them from source: several minutes on 2 cores)"
  local bin
  bin="$(bin_dir)"
  note "using $bin"
  local kubectl="$bin/kubectl" helm="$bin/helm"

  step "Local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok)"
  "$KVR" cluster up --state-dir "$state_dir" --bin-dir "$bin" >&2
  local kc
  kc="$(kubeconfig)"
  k() { "$kubectl" --kubeconfig "$kc" "$@"; }
  export HELM_CACHE_HOME="$demo_dir/helm/cache" HELM_CONFIG_HOME="$demo_dir/helm/config" \
    HELM_DATA_HOME="$demo_dir/helm/data"

  step "Helm chart charts/kvretention -> namespace $system_ns (watching namespace $demo_ns)"
  k create namespace "$demo_ns" --dry-run=client -o yaml | k apply -f - >/dev/null
  # A CRD left by another install (kept on uninstall, or from deploy/install.yaml): adopt it into
  # this release, as docs/install.md describes, so `helm install` can manage it.
  if k get crd kvretentiondeployments.kvretention.io >/dev/null 2>&1; then
    k annotate --overwrite crd kvretentiondeployments.kvretention.io \
      "meta.helm.sh/release-name=$release" "meta.helm.sh/release-namespace=$system_ns" >/dev/null
    k label --overwrite crd kvretentiondeployments.kvretention.io \
      app.kubernetes.io/managed-by=Helm >/dev/null
  fi
  "$helm" upgrade --install "$release" charts/kvretention --kubeconfig "$kc" \
    --namespace "$system_ns" --create-namespace \
    --set "watch.namespaces={$demo_ns}" --wait --timeout 3m >/dev/null
  "$helm" list --kubeconfig "$kc" -n "$system_ns" >&2
  k -n "$system_ns" get deploy,pods >&2 || true
  k get role,rolebinding -A -l "app.kubernetes.io/instance=$release" >&2 || true

  step "The real operator, authenticated as the chart's ServiceAccount"
  local token sa_kc="$demo_dir/operator.kubeconfig"
  token="$(k -n "$system_ns" create token "$sa" --duration=24h)"
  write_sa_kubeconfig "$kc" "$token" "$sa_kc"
  local subject="system:serviceaccount:$system_ns:$sa"
  note "RBAC for $subject:"
  for check in "get kvretentiondeployments.kvretention.io -n $demo_ns" \
    "create deployments.apps -n $demo_ns" "list pods -n $demo_ns" \
    "update leases.coordination.k8s.io/kvretention-operator -n $system_ns" \
    "create deployments.apps -n default" "list secrets -n $demo_ns"; do
    # shellcheck disable=SC2086
    note "  can-i $check: $(k auth can-i $check --as "$subject" 2>/dev/null || true)"
  done
  start_operator "$sa_kc"
  wait_for "Lease" 60 bash -c "'$kubectl' --kubeconfig '$kc' -n $system_ns get lease kvretention-operator \
    -o jsonpath='{.spec.holderIdentity}' | grep -q ." ||
    die "the operator did not take the Lease; see $demo_dir/operator.log"
  note "Lease $system_ns/kvretention-operator held by $(k -n "$system_ns" get lease kvretention-operator -o jsonpath='{.spec.holderIdentity}')"

  step "Sample fleet: $example -> namespace $demo_ns"
  k apply --server-side -n "$demo_ns" -f "$example" >&2
  local name
  name="$("$PY" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["metadata"]["name"])' "$example")"
  # Workers first: the probe report comes from worker pods, and under hints policy Required the
  # fleet is not Ready until it has arrived.
  note "waiting up to ${timeout_s}s for KvRetentionDeployment $demo_ns/$name's workers to be ready"
  if ! k -n "$demo_ns" wait "kvrd/$name" --for=condition=WorkersReady --timeout="${timeout_s}s" >/dev/null; then
    k -n "$demo_ns" get kvrd "$name" -o yaml >&2 || true
    tail -n 40 "$demo_dir/operator.log" >&2 || true
    die "the fleet's workers did not become ready in ${timeout_s}s"
  fi
  note "now: $(k -n "$demo_ns" get kvrd "$name" -o go-template='{{range .status.conditions}}{{if or (eq .type "Ready") (eq .type "KvHintsSupported") (eq .type "RetentionApplied")}}{{.type}}={{.status}} ({{.reason}})  {{end}}{{end}}')"

  step "Capability probe: standing in for the worker pods' probe init container"
  note "kwok nodes have no kubelet and run no container, so the 'probe' init container never runs"
  note "here. STAND-IN: this script runs the init container's own command on this machine,"
  note "  kvretention probe --report-only --termination-log $demo_dir/probe-report.json"
  note "and writes that file into each worker pod's status.initContainerStatuses[probe]"
  note "(terminated, exit 0, message = the report), where the kubelet would put it."
  local report="$demo_dir/probe-report.json"
  rm -f "$report"
  "$KVR" probe --report-only --termination-log "$report" >/dev/null 2>"$demo_dir/probe.stderr" ||
    die "kvretention probe failed: $(cat "$demo_dir/probe.stderr")"
  "$PY" -c 'import json, sys; r = json.load(open(sys.argv[1])); print("\n".join(f"    {k}: {r.get(k)}" for k in ("sglang_version", "kv_hints_parameter", "dialect", "mooncake_store_importable", "mooncake_error", "usable_for_hints", "retention_plugin", "retention_error", "retention_target_problems")))' "$report" >&2
  "$PY" "$root/scripts/inject_probe_report.py" --kubeconfig "$kc" --namespace "$demo_ns" \
    --name "$name" --report-file "$report" --timeout 60 >&2 ||
    die "could not write the probe report into the worker pods"
  note "waiting for the operator to read it (KvHintsSupported=True, then Ready=True reason Ready)"
  if ! k -n "$demo_ns" wait "kvrd/$name" --timeout=60s \
    --for=jsonpath='{.status.conditions[?(@.type=="KvHintsSupported")].status}'=True >/dev/null ||
    ! k -n "$demo_ns" wait "kvrd/$name" --timeout=60s --for=condition=Ready >/dev/null ||
    ! k -n "$demo_ns" wait "kvrd/$name" --timeout=60s \
      --for=jsonpath='{.status.conditions[?(@.type=="Ready")].reason}'=Ready >/dev/null; then
    k -n "$demo_ns" get kvrd "$name" -o yaml >&2 || true
    tail -n 40 "$demo_dir/operator.log" >&2 || true
    die "the operator did not take up the probe report"
  fi

  step "Reconciled: kubectl get kvrd -A"
  k get kvrd -A
  step "Conditions"
  k -n "$demo_ns" get kvrd "$name" -o go-template='{{range .status.conditions}}{{printf "%-18s %-8s %-22s %s\n" .type .status .reason .message}}{{end}}'
  printf 'endpoint: %s\n' "$(k -n "$demo_ns" get kvrd "$name" -o jsonpath='{.status.endpoint}')"
  step "Engine (status.engine, from the probe report)"
  k -n "$demo_ns" get kvrd "$name" -o jsonpath='{.status.engine}' |
    "$PY" -c 'import json, sys; print(json.dumps(json.load(sys.stdin), indent=2))'
  step "Children (kwok pods: Running with no kubelet)"
  k -n "$demo_ns" get deploy,svc,configmap,pods -l "app.kubernetes.io/instance=$name"
  step "Rendered worker command (what each worker pod runs)"
  local worker
  worker="$(k -n "$demo_ns" get deploy -l "app.kubernetes.io/instance=$name" \
    -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}' | grep -E -- '-(worker|decode)$' | head -n 1)"
  k -n "$demo_ns" get deploy "$worker" -o jsonpath='{range .spec.template.spec.containers[0].command[*]}{@}{"\n"}{end}' |
    "$PY" -c '
import sys
args = [a for a in sys.stdin.read().split("\n") if a]
lines, i = [], 0
while i < len(args):  # one "--flag value" per line
    if args[i].startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--"):
        lines.append(f"{args[i]} {args[i + 1]}")
        i += 2
    else:
        lines.append(args[i])
        i += 1
print("  " + " \\\n    ".join(lines))'

  step "An agent request through the fleet's data plane (the engine is a STAND-IN: no GPU here)"
  note "kwok pods run no process, so the frontend, router and worker commands rendered above run"
  note "here on loopback; the worker's --engine sglang becomes the stand-in, which has"
  note "sglang.Engine.async_generate's signature and records what it is called with"
  k -n "$demo_ns" get deploy -l "app.kubernetes.io/instance=$name" -o json >"$demo_dir/deployments.json"
  "$PY" "$root/scripts/demo_agent_request.py" --deployments "$demo_dir/deployments.json" \
    --out-dir "$demo_dir/dataplane" ||
    die "the agent request did not go through; logs in $demo_dir/dataplane/"

  step "Done"
  cat >&2 <<MSG
    export KUBECONFIG=$kc
    $kubectl get kvrd -A
    $KVR render -f $example        # the same manifests, with no cluster
    tail -f $demo_dir/operator.log
    scripts/demo.sh down                  # stop the operator and the control plane
MSG
}

down() {
  local pid
  if pid="$(operator_pid)"; then
    kill -TERM "$pid"
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
    echo "[demo] stopped the operator (pid $pid)" >&2
  else
    echo "[demo] no operator process running" >&2
  fi
  rm -f "$demo_dir/operator.pid"
  "$KVR" cluster down --state-dir "$state_dir"
}

status() {
  local pid
  if pid="$(operator_pid)"; then echo "operator: pid $pid ($demo_dir/operator.log)"; else echo "operator: not running"; fi
  "$KVR" cluster status --state-dir "$state_dir" || true
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
