"""A real node beside the local control plane: containerd, the kubelet, kube-proxy, CoreDNS and a
CNI bridge on this machine, so pods run as real processes (``kvretention cluster up --real-node``).

``config`` builds every file and argv (pure); ``host`` records the machine's state the node changes
(sysctls, iptables, mounts, cgroups, fixed paths) and restores it; ``node`` starts and stops it.
"""
