#!/usr/bin/env bash
# node.sh: PID 1 of the sandkeep test node, started by k8s-up.sh inside the node's own network namespace and a
# private mount namespace. It hides the host's /run, the CNI state, pod logs and the sysctls the kubelet writes
# behind mounts of this namespace only, then runs etcd, containerd, the API server, controller-manager,
# scheduler and kubelet as its children and waits. TERM stops them all.
set -euo pipefail
. "$(dirname "$0")/env.sh"
S="$K8S_STATE"
L="$K8S_LOGS"

# Mounts of this namespace only: the host's /run (Docker's containerd, its shims) and /var/lib/cni stay untouched.
mount --make-rprivate /
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -p /var/lib/cni /var/log/pods /var/log/containers
mount -t tmpfs tmpfs /var/lib/cni
mount -t tmpfs tmpfs /var/log/pods
mount -t tmpfs tmpfs /var/log/containers
mkdir -p /run/etcd && mount -t tmpfs tmpfs /run/etcd
# The kubelet sets these host-wide sysctls; here it writes files of our own instead.
mkdir -p "$S/sysctl"
for kv in vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1 \
	kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000; do
	k="${kv%%=*}" v="${kv#*=}" f="$S/sysctl/${k//\//.}"
	[[ -e "/proc/sys/$k" ]] || continue
	echo "$v" >"$f"
	mount --bind "$f" "/proc/sys/$k"
done
ip link set lo up

pids=()
stop() {
	trap - TERM INT
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill -TERM "${pids[i]}" 2>/dev/null || true; done
	sleep 2
	for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
	# Pod processes are children of containerd's shims, which outlive containerd: kill what is left in our cgroups.
	for f in /sys/fs/cgroup/*/kubepods/cgroup.procs /sys/fs/cgroup/*/kubepods/*/cgroup.procs \
		/sys/fs/cgroup/*/kubepods/*/*/cgroup.procs /sys/fs/cgroup/*/kubepods/*/*/*/cgroup.procs; do
		[[ -f "$f" ]] && xargs -r kill -KILL <"$f" 2>/dev/null || true
	done
	pkill_shims
	exit 0
}
pkill_shims() {
	local p
	for p in /proc/[0-9]*; do
		[[ "$(readlink "$p/exe" 2>/dev/null)" == */containerd-shim-runc-v2 ]] || continue
		grep -q -- "$K8S_CONTAINERD_SOCK" "$p/cmdline" 2>/dev/null && kill -KILL "${p#/proc/}" 2>/dev/null || true
	done
}
trap stop TERM INT

run() { # run NAME CMD...: start a component in the background, logging to $L/NAME.log
	local name="$1"
	shift
	"$@" >>"$L/$name.log" 2>&1 &
	pids+=($!)
	echo "$!" >"$S/run/$name.pid"
}

run etcd etcd --name node --data-dir /run/etcd/data \
	--listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
	--listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
	--initial-cluster node=http://127.0.0.1:2380 --log-level warn
run containerd containerd --config "$S/containerd/config.toml"
run kube-apiserver "$K8S_BIN/kube-apiserver" \
	--etcd-servers=http://127.0.0.1:2379 \
	--bind-address=0.0.0.0 --secure-port=6443 --advertise-address="$K8S_NODE_IP" \
	--tls-cert-file="$S/pki/apiserver.crt" --tls-private-key-file="$S/pki/apiserver.key" \
	--client-ca-file="$S/pki/ca.crt" --token-auth-file="$S/pki/tokens.csv" \
	--authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
	--service-account-issuer=https://kubernetes.default.svc \
	--service-account-key-file="$S/pki/sa.pub" --service-account-signing-key-file="$S/pki/sa.key" \
	--service-cluster-ip-range="$K8S_SERVICE_CIDR" --endpoint-reconciler-type=none \
	--kubelet-client-certificate="$S/pki/apiserver-kubelet.crt" --kubelet-client-key="$S/pki/apiserver-kubelet.key" \
	--kubelet-certificate-authority="$S/pki/ca.crt" --kubelet-preferred-address-types=InternalIP \
	--allow-privileged=false --profiling=false --v=1
run kube-controller-manager "$K8S_BIN/kube-controller-manager" \
	--kubeconfig="$S/controller-manager.kubeconfig" --leader-elect=false \
	--use-service-account-credentials=true --service-account-private-key-file="$S/pki/sa.key" \
	--root-ca-file="$S/pki/ca.crt" --controllers='*' --node-monitor-grace-period=20s \
	--pvclaimbinder-sync-period=2s --profiling=false --v=1
run kube-scheduler "$K8S_BIN/kube-scheduler" --kubeconfig="$S/scheduler.kubeconfig" --leader-elect=false --profiling=false --v=1
run kubelet "$K8S_BIN/kubelet" --config="$S/kubelet/config.yaml" --kubeconfig="$S/kubelet.kubeconfig" \
	--hostname-override="$K8S_NODE_NAME" --node-ip="$K8S_NODE_IP" --root-dir="$S/kubelet/root" --v=1
if [[ -x "$K8S_BIN/kube-router" && "${SANDKEEP_K8S_ROUTER:-1}" == 1 ]]; then
	# NetworkPolicy enforcement only; it needs the Node object, so it retries until the kubelet registered.
	(
		until "$K8S_BIN/kube-router" --help >/dev/null 2>&1 && [[ -s "$S/run/node-registered" ]]; do sleep 1; done
		exec "$K8S_BIN/kube-router" --kubeconfig="$S/admin.kubeconfig" --hostname-override="$K8S_NODE_NAME" \
			--run-firewall=true --run-router=false --run-service-proxy=false --enable-cni=false \
			--enable-ipv6=false --metrics-port=0 --health-port=0 -v=1
	) >>"$L/kube-router.log" 2>&1 &
	pids+=($!)
	echo "$!" >"$S/run/kube-router.pid"
fi
echo ready >"$S/run/node.started"
wait
