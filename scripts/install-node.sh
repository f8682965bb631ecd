#!/usr/bin/env bash
# Install the Debian packages a real local node needs (`kvretention cluster up --real-node`, the
# pods tier, scripts/build-images.sh), only those missing: runc and containerd (1.6) run the pods,
# containernetworking-plugins gives them the bridge/host-local/loopback CNI, iptables serves
# kube-proxy and the kubelet, buildah builds the images and debootstrap their Debian base.
#
# Usage: scripts/install-node.sh           # install what is missing (root or sudo)
#        scripts/install-node.sh --check   # list what is missing, exit 3 if anything is
set -euo pipefail

log() { printf '[install-node] %s\n' "$*" >&2; }

need_apt=()
command -v runc >/dev/null || need_apt+=(runc)
command -v containerd >/dev/null || need_apt+=(containerd)
[ -x /usr/lib/cni/bridge ] || [ -x /opt/cni/bin/bridge ] || need_apt+=(containernetworking-plugins)
command -v iptables >/dev/null || need_apt+=(iptables)
command -v buildah >/dev/null || need_apt+=(buildah)
command -v debootstrap >/dev/null || need_apt+=(debootstrap)

if [ ${#need_apt[@]} -eq 0 ]; then
  exit 0
fi
if [ "${1:-}" = --check ]; then
  log "missing Debian packages: ${need_apt[*]} (run scripts/install-node.sh)"
  exit 3
fi
log "installing Debian packages: ${need_apt[*]}"
sudo=()
[ "$(id -u)" = 0 ] || sudo=(sudo)
"${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
