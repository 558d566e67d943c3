#!/usr/bin/env bash
# k8s-down.sh: stop the test node k8s-up.sh started and remove its network namespace and state (the built
# binaries in the cache stay). Idempotent. --keep-cache is accepted for symmetry: the cache is always kept.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
. "$ROOT/scripts/k8s/env.sh"
S="$K8S_STATE"
log() { printf '[k8s-down %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

if [[ -f "$S/run/node.pid" ]]; then
	pid="$(cat "$S/run/node.pid")"
	if kill -0 "$pid" 2>/dev/null; then
		# node.sh is the session leader; TERM makes it stop its components, their pods and shims.
		log "stopping node (pid $pid)"
		kill -TERM "$pid" 2>/dev/null || true
		for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
		kill -KILL -- "-$pid" 2>/dev/null || true
	fi
fi
# Anything still in the node's network namespace (a shim, a pod process) belongs to the node.
if [[ -e "/run/netns/$K8S_NETNS" ]]; then
	for p in $(ip netns pids "$K8S_NETNS" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
	ip netns del "$K8S_NETNS" || true
fi
ip link del "$K8S_HOST_IF" 2>/dev/null || true
# Pod cgroups the kubelet made (cgroup v1, cgroupfs driver): remove them once empty.
for d in /sys/fs/cgroup/*/kubepods; do
	[[ -d "$d" ]] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
done
if [[ "${1:-}" != --keep-state ]]; then
	# The pod volume mounts lived in the node's mount namespace, gone with it; nothing here is mounted.
	rm -rf "$S/containerd" "$S/kubelet" "$S/run" "$S/pv" "$S/cni" "$S/sysctl"
fi
log "down"
