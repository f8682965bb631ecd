#!/usr/bin/env bash
# The README's demo (`make demo` / `make demo-down`): a real local control plane, the Helm chart
# installed, a sample fleet applied and reconciled by the operator, and two agent requests through
# the fleet's data plane.
#
#   scripts/demo.sh up       start (or refresh) everything; safe to run again
#   scripts/demo.sh down     stop the fleet, the operator and the control plane (and restore the host)
#   scripts/demo.sh status   show what is running
#
# Where the pods run (KVR_DEMO_NODE=auto|real|kwok, default auto):
#
# real: a real node on this machine (`kvretention cluster up --real-node`: containerd, the kubelet,
#   kube-proxy, CoreDNS, a CNI bridge; docs/real-node.md), with the images scripts/build-images.sh
#   builds here and the node binaries of scripts/build-node.sh (both cached in ~/.cache/kvretention).
#   Every pod is a real process: the chart's operator pod reconciles the fleet, the worker pods'
#   `probe` init container runs `kvretention probe --report-only` and the kubelet keeps its report
#   as the container's termination message (KvHintsSupported comes from it), and the agent
#   requests go to the frontend Service's ClusterIP, which kube-proxy routes from this machine; the
#   hint is read back from the worker pod that served it (its request trace). The worker image runs
#   SGLang's real engine on CPU (no GPU here) serving the project's tiny model: the agents get
#   SGLang's answers, SGLang's cached_tokens on a second turn, tool calls parsed by SGLang, and the
#   fleet shows RetentionApplied=True. It needs root, writable cgroups, bridge netfilter and CAP_NET_ADMIN;
#   `down` restores every sysctl, iptables rule, mount and link the node changed, and checks.
#
# kwok (the fallback, or chosen): these pods run no process. The chart's operator Deployment gets
#   a kwok pod (Running and Ready, but no process), so the demo runs the REAL operator as a local
#   process that authenticates as the chart's ServiceAccount (a token from `kubectl create token`),
#   holding the chart's `kvretention-operator` Lease exactly as the in-cluster pod would. No init
#   container runs either, so the demo runs the probe's own command here and writes its output
#   into the worker pods' status, where the kubelet would (scripts/inject_probe_report.py), saying
#   so; and it runs the rendered frontend, router and worker commands on loopback for the agent
#   requests (scripts/demo_agent_request.py), the worker with SGLang's real engine on CPU and the
#   tiny model built here (cached in ~/.cache/kvretention/tiny-model).
#
# auto takes real where the machine allows it and says exactly why not otherwise (not root, a
# read-only cgroup fs, no bridge netfilter, no CAP_NET_ADMIN, missing Debian packages with no apt,
# another real node up, a failed build or node start), then runs kwok. KVR_DEMO_NODE=real fails
# instead of falling back.
#
# Env: KVR_DEMO_NODE (auto), KVR_CLUSTER_DIR (default .kvr-cluster), KVR_DEMO_EXAMPLE (default
#      examples/cpu-tiny.yaml: the tiny model the CPU worker image carries), KVR_DEMO_TIMEOUT
#      seconds to wait for Ready (default 180 on kwok, 600 on a real node: SGLang's engines start),
#      KVR_DEMO_RETENTION_TIMEOUT seconds to wait for RetentionApplied=True (default 120; the demo
#      fails, with the condition's reason and message, if the fleet does not report it).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

KVR="$root/.venv/bin/kvretention"
PY="$root/.venv/bin/python"
state_dir="$(realpath -m "${KVR_CLUSTER_DIR:-$root/.kvr-cluster}")"
demo_dir="$state_dir/demo"
example="${KVR_DEMO_EXAMPLE:-examples/cpu-tiny.yaml}"
node_choice="${KVR_DEMO_NODE:-auto}"
system_ns=kvretention-system
demo_ns=demo
release=kvretention
sa=kvretention-operator
# The worker pods' request trace (KVR_REQUEST_TRACE: what each worker passed SGLang), read back with
# kubectl exec.
pod_trace=/tmp/kvr-request-trace.jsonl
real_node_marker=/run/kvretention-real-node

step() { printf '\n\033[1m==> %s\033[0m\n' "$*" >&2; }
note() { printf '    %s\n' "$*" >&2; }
die() { printf 'demo: %s\n' "$*" >&2; exit 1; }

[[ -x "$KVR" ]] || die "no $KVR: run scripts/bootstrap.sh (or make demo) first"

cached_build() { # cached_build <script> <what>: its cache dir (the last stdout line), built if needed
  # A first build compiles from source: the script logs each step on stderr, and a heartbeat here
  # shows it is still going between steps. Its stderr is also kept in $demo_dir/<script>.log.
  local script="$root/scripts/$1" what="$2" out pid started=$SECONDS
  if out="$("$script" --check 2>/dev/null)"; then
    tail -n 1 <<<"$out"
    return
  fi
  note "building $what into ~/.cache/kvretention (cached: once per machine, or after a source edit)"
  out="$(mktemp)"
  "$script" >"$out" 2> >(tee "$demo_dir/$1.log" >&2) &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null && sleep 1; done
    kill -0 "$pid" 2>/dev/null && note "still building $what ($((SECONDS - started))s so far)"
  done
  if ! wait "$pid"; then
    rm -f "$out"
    return 1
  fi
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

# -- real node or kwok ----------------------------------------------------------------------

real_node_blockers() { # prints one line per reason this machine cannot run a real node now
  if ((EUID != 0)); then
    echo "not root: the real node runs containerd and the kubelet, mounts, iptables and a bridge (run as root, e.g. sudo make demo)"
    return
  fi
  local cg=/sys/fs/cgroup/pids
  [[ -f /sys/fs/cgroup/cgroup.controllers ]] && cg=/sys/fs/cgroup
  if mkdir "$cg/kvr-demo-check.$$" 2>/dev/null; then
    rmdir "$cg/kvr-demo-check.$$"
  else
    echo "cannot create a cgroup in $cg (a read-only cgroup fs: an unprivileged container?)"
  fi
  if [[ ! -d /proc/sys/net/bridge ]] && ! modprobe br_netfilter 2>/dev/null; then
    echo "the kernel has no bridge netfilter (/proc/sys/net/bridge is missing and modprobe br_netfilter failed)"
  fi
  local err
  if err="$(ip link add kvr-demo-chk type bridge 2>&1)"; then
    ip link delete kvr-demo-chk
  else
    echo "cannot create a network bridge (no CAP_NET_ADMIN?): ${err:-ip not found}"
  fi
  if ! "$root/scripts/install-node.sh" --check >/dev/null 2>&1 && ! command -v apt-get >/dev/null; then
    echo "missing Debian packages ($("$root/scripts/install-node.sh" --check 2>&1 | sed 's/.*: //')) and no apt-get to install them"
  fi
  # One real node per machine: never take over another's (a pods-tier run, another checkout).
  local other
  other="$(cat "$real_node_marker" 2>/dev/null || true)"
  if [[ -n "$other" && "$other" != "$state_dir" ]] &&
    "$KVR" cluster status --state-dir "$other" >/dev/null 2>&1; then
    echo "another real node runs on this machine (state in $other; one per machine): stop it with kvretention cluster down --state-dir $other"
  elif [[ -z "$other" && -e /sys/class/net/kvr0 ]]; then
    echo "the bridge kvr0 exists with no real node recorded (ip link delete kvr0 if nothing uses it)"
  fi
}

running_mode() { # the mode of a demo plane running in $state_dir, if any
  "$KVR" cluster status --state-dir "$state_dir" >/dev/null 2>&1 || return 1
  cat "$demo_dir/mode" 2>/dev/null || echo kwok
}

# -- the fleet, shown the same way on both -------------------------------------------------

helm_env() {
  export HELM_CACHE_HOME="$demo_dir/helm/cache" HELM_CONFIG_HOME="$demo_dir/helm/config" \
    HELM_DATA_HOME="$demo_dir/helm/data"
}

adopt_crd() {
  # A CRD left by another install (kept on uninstall, or from deploy/install.yaml): adopt it into
  # this release, as docs/install.md describes, so `helm install` can manage it.
  if k get crd kvretentiondeployments.kvretention.io >/dev/null 2>&1; then
    k annotate --overwrite crd kvretentiondeployments.kvretention.io \
      "meta.helm.sh/release-name=$release" "meta.helm.sh/release-namespace=$system_ns" >/dev/null
    k label --overwrite crd kvretentiondeployments.kvretention.io \
      app.kubernetes.io/managed-by=Helm >/dev/null
  fi
}

fleet_name() {
  "$PY" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["metadata"]["name"])' "$example"
}

conditions_line() {
  k -n "$demo_ns" get kvrd "$1" -o go-template='{{range .status.conditions}}{{if or (eq .type "Ready") (eq .type "KvHintsSupported") (eq .type "RetentionApplied")}}{{.type}}={{.status}} ({{.reason}})  {{end}}{{end}}'
}

print_probe_report() { # print_probe_report <file>
  "$PY" -c 'import json, sys; r = json.load(open(sys.argv[1])); print("\n".join(f"    {k}: {r.get(k)}" for k in ("sglang_version", "kv_hints_parameter", "dialect", "mooncake_store_importable", "mooncake_error", "usable_for_hints", "retention_plugin", "retention_error", "retention_target_problems")))' "$1" >&2
}

diagnose() { # what a stuck fleet or operator pod usually comes down to, on stderr
  k get pods -A -o wide >&2 || true
  # A node under pressure (disk, memory) taints itself and evicts pods: say so.
  k get nodes -o go-template='{{range .items}}{{$n := .metadata.name}}{{range .status.conditions}}{{if and (ne .type "Ready") (eq .status "True")}}    node {{$n}}: {{.type}}: {{.message}}{{"\n"}}{{end}}{{end}}{{range .spec.taints}}    node {{$n}} taint: {{.key}}:{{.effect}}{{"\n"}}{{end}}{{end}}' >&2 || true
  k get events -A --field-selector type=Warning --sort-by=.lastTimestamp 2>/dev/null | tail -n 8 >&2 || true
}

wait_hints_ready() { # wait_hints_ready <fleet> <what the operator reads>
  note "waiting for the operator to read $2 (KvHintsSupported=True, then Ready=True reason Ready)"
  if ! k -n "$demo_ns" wait "kvrd/$1" --timeout=120s \
    --for=jsonpath='{.status.conditions[?(@.type=="KvHintsSupported")].status}'=True >/dev/null ||
    ! k -n "$demo_ns" wait "kvrd/$1" --timeout=120s --for=condition=Ready >/dev/null ||
    ! k -n "$demo_ns" wait "kvrd/$1" --timeout=120s \
      --for=jsonpath='{.status.conditions[?(@.type=="Ready")].reason}'=Ready >/dev/null; then
    k -n "$demo_ns" get kvrd "$1" -o yaml >&2 || true
    operator_logs >&2 || true
    die "the operator did not take up $2"
  fi
}

retention_line() { # retention_line <fleet>: RetentionApplied=<status> <reason>: <message>, if set
  k -n "$demo_ns" get kvrd "$1" -o go-template='{{range .status.conditions}}{{if eq .type "RetentionApplied"}}RetentionApplied={{.status}} {{.reason}}: {{.message}}{{end}}{{end}}'
}

wait_retention_applied() { # wait_retention_applied <fleet> <whose probe reports> <their logs>
  # Both paths expect True: real pods run SGLang's real engine with the plugin in the CPU worker
  # image; kwok's reports come from this machine's probe, on the venv that runs the loopback worker
  # (SGLang, torch and orjson: the plugin framework loads). False here is a regression, not a
  # limitation of either path, so the demo fails on it.
  local fleet="$1" timeout="${KVR_DEMO_RETENTION_TIMEOUT:-120}" line
  note "waiting up to ${timeout}s for RetentionApplied=True (from $2)"
  if ! k -n "$demo_ns" wait "kvrd/$fleet" --for=condition=RetentionApplied=True \
    --timeout="${timeout}s" >/dev/null; then
    line="$(retention_line "$fleet" 2>/dev/null || true)"
    k -n "$demo_ns" get kvrd "$fleet" -o yaml >&2 || true
    operator_logs >&2 || true
    note "the probe reports the operator read: $3"
    note "the operator's logs: $(if [[ "$(cat "$demo_dir/mode" 2>/dev/null)" == real ]]; then
      echo "$kubectl --kubeconfig $kc -n $system_ns logs deploy/kvretention-operator"
    else echo "$demo_dir/operator.log"; fi)"
    die "the fleet does not report RetentionApplied=True after ${timeout}s: ${line:-no RetentionApplied condition in its status} (SGLang did not load the retention plugin, or its hook targets moved: see the probe report's retention_plugin, retention_error and retention_target_problems above)"
  fi
  note "$(retention_line "$fleet")"
}

wait_workers_ready() { # wait_workers_ready <fleet> <seconds>
  note "waiting up to ${2}s for KvRetentionDeployment $demo_ns/$1's workers to be ready"
  if ! k -n "$demo_ns" wait "kvrd/$1" --for=condition=WorkersReady --timeout="${2}s" >/dev/null; then
    k -n "$demo_ns" get kvrd "$1" -o yaml >&2 || true
    operator_logs >&2 || true
    diagnose
    die "the fleet's workers did not become ready in ${2}s"
  fi
  note "now: $(conditions_line "$1")"
}

show_fleet() { # show_fleet <fleet> <children title>
  local name="$1"
  step "Reconciled: kubectl get kvrd -A"
  k get kvrd -A
  step "Conditions"
  k -n "$demo_ns" get kvrd "$name" -o go-template='{{range .status.conditions}}{{printf "%-18s %-8s %-22s %s\n" .type .status .reason .message}}{{end}}'
  printf 'endpoint: %s\n' "$(k -n "$demo_ns" get kvrd "$name" -o jsonpath='{.status.endpoint}')"
  step "Engine (status.engine, from the probe report)"
  k -n "$demo_ns" get kvrd "$name" -o jsonpath='{.status.engine}' |
    "$PY" -c 'import json, sys; print(json.dumps(json.load(sys.stdin), indent=2))'
  step "$2"
  k -n "$demo_ns" get deploy,svc,configmap -l "app.kubernetes.io/instance=$name"
  k -n "$demo_ns" get pods -o wide -l "app.kubernetes.io/instance=$name"
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
  k -n "$demo_ns" get deploy -l "app.kubernetes.io/instance=$name" -o json >"$demo_dir/deployments.json"
}

# -- kwok -------------------------------------------------------------------------------------

operator_logs() {
  if [[ "$(cat "$demo_dir/mode" 2>/dev/null)" == real ]]; then
    k -n "$system_ns" logs deploy/kvretention-operator --tail 40
  else
    tail -n 40 "$demo_dir/operator.log"
  fi
}

up_kwok() { # up_kwok <bin dir>
  local bin="$1"
  step "Local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok)"
  "$KVR" cluster up --state-dir "$state_dir" --bin-dir "$bin" >&2
  echo kwok >"$demo_dir/mode"
  kc="$(kubeconfig)"
  helm_env

  step "Helm chart charts/kvretention -> namespace $system_ns (watching namespace $demo_ns)"
  k create namespace "$demo_ns" --dry-run=client -o yaml | k apply -f - >/dev/null
  adopt_crd
  "$helm" upgrade --install "$release" charts/kvretention --kubeconfig "$kc" \
    --namespace "$system_ns" --create-namespace \
    --set "watch.namespaces={$demo_ns}" --wait --timeout 3m >/dev/null
  "$helm" list --kubeconfig "$kc" -n "$system_ns" >&2
  k -n "$system_ns" get deploy,pods >&2 || true
  k get role,rolebinding -A -l "app.kubernetes.io/instance=$release" >&2 || true

  step "The real operator, authenticated as the chart's ServiceAccount (kwok pods run no process)"
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
  name="$(fleet_name)"
  # Workers first: the probe report comes from worker pods, and under hints policy Required the
  # fleet is not Ready until it has arrived.
  wait_workers_ready "$name" "${KVR_DEMO_TIMEOUT:-180}"

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
  print_probe_report "$report"
  "$PY" "$root/scripts/inject_probe_report.py" --kubeconfig "$kc" --namespace "$demo_ns" \
    --name "$name" --report-file "$report" --timeout 60 >&2 ||
    die "could not write the probe report into the worker pods"
  wait_hints_ready "$name" "the injected probe report"

  show_fleet "$name" "Children (kwok pods: Running with no kubelet, no process)"

  step "Agent requests through the fleet's data plane (SGLang's real engine on CPU: no GPU here)"
  note "kwok pods run no process, so the frontend, router and worker commands rendered above run"
  note "here on loopback; the worker runs SGLang's real engine on CPU (--device cpu) with the tiny"
  note "model built here, and keeps a request trace of what it passed SGLang"
  "$PY" "$root/scripts/demo_agent_request.py" --deployments "$demo_dir/deployments.json" \
    --out-dir "$demo_dir/dataplane" ||
    die "the agent request did not go through; logs in $demo_dir/dataplane/"
  step "Retention: SGLang here (the probe's report) loads the retention plugin"
  wait_retention_applied "$name" "the injected probe report" \
    "$demo_dir/probe-report.json (its stderr: $demo_dir/probe.stderr)"

  step "Done (kwok: the fleet's pods run no process${fallback_reason:+; real pods were not used: see above})"
  cat >&2 <<MSG
    export KUBECONFIG=$kc
    $kubectl get kvrd -A
    $KVR render -f $example        # the same manifests, with no cluster
    tail -f $demo_dir/operator.log
    make demo-down                        # stop the operator and the control plane
MSG
}

# -- real node --------------------------------------------------------------------------------

fall_back() { # fall_back <reason...>: kwok next under auto (sets fallback_reason), an error under real
  if [[ "$node_choice" == real ]]; then
    die "KVR_DEMO_NODE=real, but: $*"
  fi
  fallback_reason="$*"
  step "Falling back to kwok pods (no process runs in them)"
  note "why not real pods: $*"
  note "(KVR_DEMO_NODE=kwok skips this check; docs/real-node.md says what a real node needs)"
}

up_real() { # up_real <bin dir>; sets fallback_reason (see fall_back) when the node could not come up
  local bin="$1" node_bin images_dir listing
  step "A real node: Debian packages, kubelet/kube-proxy/CoreDNS, images (all cached)"
  if ! "$root/scripts/install-node.sh" --check >/dev/null 2>&1; then
    "$root/scripts/install-node.sh" 2> >(tee "$demo_dir/install-node.sh.log" >&2) ||
      { fall_back "installing the Debian packages failed: $(tail -n 3 "$demo_dir/install-node.sh.log")"; return; }
  fi
  node_bin="$(cached_build build-node.sh "the kubelet, kube-proxy and CoreDNS (cold: about 17 min on 2 cores)")" ||
    { fall_back "scripts/build-node.sh failed: $(tail -n 3 "$demo_dir/build-node.sh.log")"; return; }
  images_dir="$(cached_build build-images.sh "the images: pause, operator, runtime, CPU worker (cold: about 20 min)")" ||
    { fall_back "scripts/build-images.sh failed: $(tail -n 3 "$demo_dir/build-images.sh.log")"; return; }
  listing="$images_dir/images.json"
  note "node binaries: $node_bin"
  "$PY" -c 'import json, sys; [print("    image", k + ":", v["ref"]) for k, v in json.load(open(sys.argv[1])).items()]' "$listing" >&2

  step "Local control plane and a real node (containerd, kubelet, kube-proxy, CoreDNS, CNI bridge)"
  echo real >"$demo_dir/mode"
  set +e
  KVR_NODE_IMAGES="$listing" "$KVR" cluster up --real-node --state-dir "$state_dir" \
    --bin-dir "$bin" --node-bin-dir "$node_bin" --timeout 300 2>&1 | tee "$demo_dir/cluster-up.log" >&2
  local rc=${PIPESTATUS[0]}
  set -e
  if ((rc != 0)); then
    "$KVR" cluster down --state-dir "$state_dir" >&2 || true
    rm -f "$demo_dir/mode"
    fall_back "kvretention cluster up --real-node failed: $(grep -v '^\[cluster\]' "$demo_dir/cluster-up.log" | tail -n 4 | tr '\n' ' ')"
    return
  fi
  kc="$(kubeconfig)"
  helm_env
  k get nodes -o wide >&2

  local operator_image
  operator_image="$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["operator"]["ref"])' "$listing")"
  step "Helm chart charts/kvretention -> namespace $system_ns: the operator as a real pod ($operator_image)"
  k create namespace "$demo_ns" --dry-run=client -o yaml | k apply -f - >/dev/null
  adopt_crd
  "$helm" upgrade --install "$release" charts/kvretention --kubeconfig "$kc" \
    --namespace "$system_ns" --create-namespace \
    --set "image.repository=${operator_image%:*}" --set "image.tag=${operator_image##*:}" \
    --set image.pullPolicy=Never --set "watch.namespaces={$demo_ns}" --wait --timeout 5m >/dev/null ||
    { diagnose; die "helm install did not get the operator pod ready"; }
  "$helm" list --kubeconfig "$kc" -n "$system_ns" >&2
  k -n "$system_ns" get pods -o wide >&2
  k -n "$system_ns" get pods -l app.kubernetes.io/name=kvretention-operator \
    -o go-template='{{range .items}}{{range .status.containerStatuses}}    container {{.name}}: {{.containerID}} (ready {{.ready}}){{"\n"}}{{end}}{{end}}' >&2
  wait_for "Lease" 90 bash -c "'$kubectl' --kubeconfig '$kc' -n $system_ns get lease kvretention-operator \
    -o jsonpath='{.spec.holderIdentity}' | grep -q ." ||
    { operator_logs >&2; die "the operator pod did not take the Lease"; }
  note "Lease $system_ns/kvretention-operator held by $(k -n "$system_ns" get lease kvretention-operator -o jsonpath='{.spec.holderIdentity}') (the pod)"

  local name
  name="$(fleet_name)"
  step "Sample fleet: $example -> namespace $demo_ns, with the images built here"
  note "frontend/router: the runtime image; workers and the Mooncake master: the CPU worker image"
  note "(no GPU here: SGLang's real engine on CPU serving the tiny model built into the image);"
  note "workers.pod.env KVR_REQUEST_TRACE=$pod_trace: each worker traces what it passed SGLang"
  "$PY" - "$example" "$listing" "$pod_trace" >"$demo_dir/fleet.yaml" <<'PY'
import json, sys, yaml
doc = yaml.safe_load(open(sys.argv[1]))
images = {k: v["ref"] for k, v in json.load(open(sys.argv[2])).items()}
spec = doc["spec"]
spec.setdefault("frontend", {})["image"] = images["runtime"]
spec.setdefault("router", {})["image"] = images["runtime"]
spec["workers"]["image"] = images["worker"]
env = spec["workers"].setdefault("pod", {}).setdefault("env", [])
env.append({"name": "KVR_REQUEST_TRACE", "value": sys.argv[3]})
spec.setdefault("kvStore", {}).setdefault("mooncake", {}).setdefault("master", {})["image"] = images["worker"]
yaml.safe_dump(doc, sys.stdout, sort_keys=False)
PY
  k apply --server-side -n "$demo_ns" -f "$demo_dir/fleet.yaml" >&2
  wait_workers_ready "$name" "${KVR_DEMO_TIMEOUT:-600}"

  step "Capability probe: the worker pods' probe init container ran (the kubelet kept its report)"
  local pod
  for pod in $(k -n "$demo_ns" get pods -l "app.kubernetes.io/instance=$name,app.kubernetes.io/component=worker" \
    -o jsonpath='{.items[*].metadata.name}'); do
    k -n "$demo_ns" get pod "$pod" -o go-template='{{range .status.initContainerStatuses}}{{if eq .name "probe"}}    {{$.metadata.name}}: init container probe terminated, exit {{.state.terminated.exitCode}} ({{.state.terminated.reason}}), {{.containerID}}{{"\n"}}{{end}}{{end}}' >&2
    k -n "$demo_ns" get pod "$pod" \
      -o jsonpath='{.status.initContainerStatuses[?(@.name=="probe")].state.terminated.message}' >"$demo_dir/probe-report.json"
  done
  note "its report (the termination message the operator reads), from the last pod:"
  print_probe_report "$demo_dir/probe-report.json"
  wait_hints_ready "$name" "the probe init containers' reports"

  show_fleet "$name" "Children (every pod a real process on node kvr-real-node; containerd ids below)"
  k -n "$demo_ns" get pods -l "app.kubernetes.io/instance=$name" \
    -o go-template='{{range .items}}{{$p := .metadata.name}}{{range .status.containerStatuses}}{{printf "%-36s %-8s %s\n" $p .name .containerID}}{{end}}{{end}}'

  local svc url
  svc="$(k -n "$demo_ns" get svc -l "app.kubernetes.io/instance=$name,app.kubernetes.io/component=frontend" \
    -o jsonpath='{.items[0].metadata.name}')"
  url="http://$(k -n "$demo_ns" get svc "$svc" -o jsonpath='{.spec.clusterIP}:{.spec.ports[0].port}')"
  step "Agent requests through the frontend Service $demo_ns/$svc ($url, routed by kube-proxy)"
  note "every hop is a pod: Service -> frontend pod -> router Service/pod -> worker pod, which embeds"
  note "SGLang's real engine on CPU (tiny model: its answers are noise, their shape and SGLang's"
  note "token counts are the point); the hint is read back from the worker pod's request trace"
  wait_for "the frontend Service" 60 "$PY" -c 'import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=2)' "$url/readyz" ||
    die "the frontend Service $url does not answer /readyz"
  "$PY" "$root/scripts/demo_agent_request.py" --deployments "$demo_dir/deployments.json" \
    --service "$url" --kubectl "$kubectl" --kubeconfig "$kc" --namespace "$demo_ns" \
    --fleet "$name" --trace "$pod_trace" ||
    die "the agent request did not go through the Service"
  step "Retention: SGLang in every worker pod loads the retention plugin"
  wait_retention_applied "$name" "the worker pods' probe init containers" \
    "$demo_dir/probe-report.json (the last worker pod's termination message); each pod's probe log: $kubectl --kubeconfig $kc -n $demo_ns logs <pod> -c probe"

  step "Done: every pod is a real process (make demo-down stops them and restores the host)"
  cat >&2 <<MSG
    export KUBECONFIG=$kc
    $kubectl get kvrd,pods -A -o wide
    $kubectl -n $system_ns logs deploy/kvretention-operator     # the operator pod
    $kubectl -n $demo_ns port-forward svc/$svc 8000:8000   # the fleet for Claude Code / Codex (README)
    make demo-down                        # stop everything, restore the host
MSG
}

up() {
  mkdir -p "$demo_dir"
  case "$node_choice" in auto | real | kwok) ;; *) die "KVR_DEMO_NODE=$node_choice: use auto, real or kwok" ;; esac
  step "Kubernetes binaries (the first run builds them from source: several minutes on 2 cores)"
  bin="$(cached_build build-kube.sh "etcd, kwok, helm and Kubernetes")" || die "scripts/build-kube.sh failed"
  note "using $bin"
  kubectl="$bin/kubectl" helm="$bin/helm"
  k() { "$kubectl" --kubeconfig "$kc" "$@"; }

  local mode=kwok blockers="" running
  fallback_reason=""
  if [[ "$node_choice" != kwok ]]; then
    step "Where the pods run (KVR_DEMO_NODE=$node_choice): checking this machine for a real node"
    if running="$(running_mode)" && [[ "$running" == real ]]; then
      mode=real # our own node is up: reuse it
    else
      blockers="$(real_node_blockers)"
      if [[ -z "$blockers" ]]; then
        mode=real
      else
        fall_back "$(paste -sd';' <<<"$blockers" | sed 's/;/; /g')"
      fi
    fi
    [[ "$mode" == real ]] && note "real pods: root, writable cgroups, bridge netfilter, CAP_NET_ADMIN"
  fi
  if running="$(running_mode)" && [[ "$running" != "$mode" ]]; then
    step "A $running demo runs in $state_dir; stopping it first"
    down
  fi
  if [[ "$mode" == real ]]; then
    up_real "$bin" # not in a condition: set -e holds inside
    [[ -n "$fallback_reason" ]] || return 0
  fi
  up_kwok "$bin"
}

down() {
  local pid
  if pid="$(operator_pid)"; then
    kill -TERM "$pid"
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
    echo "[demo] stopped the operator (pid $pid)" >&2
  fi
  rm -f "$demo_dir/operator.pid"
  # A real node: this stops every pod and node process, restores the host as recorded and fails,
  # listing what differs, if anything is left (docs/real-node.md).
  "$KVR" cluster down --state-dir "$state_dir"
  rm -f "$demo_dir/mode"
}

status() {
  local pid
  echo "pods: $(running_mode || echo 'not running')"
  if pid="$(operator_pid)"; then echo "operator: local pid $pid ($demo_dir/operator.log)"; fi
  "$KVR" cluster status --state-dir "$state_dir" || true
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
