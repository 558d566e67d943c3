#!/usr/bin/env bash
# k8s-up.sh: start a real single-node Kubernetes (etcd, containerd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, and kube-router for NetworkPolicy when built) for sandkeep's kubernetes driver tests.
# The node runs in its own network namespace (veth: host 10.213.0.1/30, node 10.213.0.2) and its own mount
# namespace, so neither the host's sysctls, iptables and /run nor Docker's containerd are touched. See
# docs/KUBERNETES.md and /work/shared/KUBERNETES.md for why each setting is there.
#
# Idempotent: when the node is up and Ready it only prints the kubeconfig. Needs the binaries from
# scripts/k8s-build.sh. Prints the kubeconfig path on stdout; logs are in $SANDKEEP_K8S_LOGS
# (default /var/log/sandkeep-k8s).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
. "$ROOT/scripts/k8s/env.sh"
S="$K8S_STATE"
L="$K8S_LOGS"
TIMEOUT="${SANDKEEP_K8S_UP_TIMEOUT:-180}"

log() { printf '[k8s-up %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() {
	log "FAILED: $*"
	for f in "$L"/*.log; do
		[[ -f "$f" ]] || continue
		echo "----- tail $f" >&2
		tail -n 25 "$f" >&2
	done
	exit 1
}

admin_token() { cut -d, -f1 <"$S/pki/tokens.csv" | head -1; }
api() { # api PATH: GET from the API server as admin
	curl -fsS --max-time 5 --cacert "$S/pki/ca.crt" -H "Authorization: Bearer $(admin_token)" "$K8S_API$1"
}
node_ready() {
	api "/api/v1/nodes/$K8S_NODE_NAME" 2>/dev/null |
		jq -e '.status.conditions[] | select(.type=="Ready") | .status=="True"' >/dev/null 2>&1
}
node_pid() { [[ -f "$S/run/node.pid" ]] && kill -0 "$(cat "$S/run/node.pid")" 2>/dev/null && cat "$S/run/node.pid"; }

if node_pid >/dev/null && node_ready; then
	log "node $K8S_NODE_NAME is up and Ready"
	echo "$K8S_KUBECONFIG"
	exit 0
fi
if node_pid >/dev/null; then
	log "a node is running but not Ready: restarting it"
	"$ROOT/scripts/k8s-down.sh" --keep-cache
fi

for c in kube-apiserver kubelet kube-scheduler kube-controller-manager; do
	[[ -x "$K8S_BIN/$c" ]] || die "$K8S_BIN/$c is missing: run scripts/k8s-build.sh first"
done

# Debian packages (idempotent). The node's etcd and containerd are our own instances, not the packages' services.
need=()
for p in etcd-server containerd runc containernetworking-plugins ipset openssl jq curl iptables; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || need+=("$p")
done
if ((${#need[@]})); then
	log "installing ${need[*]}"
	apt-get update -qq >/dev/null
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

start=$(date +%s.%N)
mkdir -p "$S"/{pki,run,cni/net.d,containerd,kubelet/root,pv,bin} "$L"
rm -f "$S/run/"*
: >"$L/node.log"

# ---- certificates from a CA of our own, and static tokens ----
P="$S/pki"
if [[ ! -f "$P/ca.crt" ]]; then
	log "making certificates in $P"
	openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj /CN=sandkeep-test-ca \
		-keyout "$P/ca.key" -out "$P/ca.crt" 2>/dev/null
	sign() { # sign NAME SUBJ SAN
		openssl req -newkey rsa:2048 -nodes -subj "$2" -keyout "$P/$1.key" -out "$P/$1.csr" 2>/dev/null
		printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n%s\n' "$3" >"$P/$1.ext"
		openssl x509 -req -in "$P/$1.csr" -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial -days 3650 \
			-extfile "$P/$1.ext" -out "$P/$1.crt" 2>/dev/null
		rm -f "$P/$1.csr" "$P/$1.ext"
	}
	sign apiserver /CN=kube-apiserver \
		"subjectAltName=IP:$K8S_NODE_IP,IP:$K8S_SERVICE_IP,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
	sign kubelet "/CN=system:node:$K8S_NODE_NAME/O=system:nodes" "subjectAltName=IP:$K8S_NODE_IP,DNS:$K8S_NODE_NAME"
	sign apiserver-kubelet "/CN=kube-apiserver-kubelet-client/O=system:masters" "subjectAltName=DNS:kube-apiserver-kubelet-client"
	openssl genrsa -out "$P/sa.key" 2048 2>/dev/null
	openssl rsa -in "$P/sa.key" -pubout -out "$P/sa.pub" 2>/dev/null
	tok() { openssl rand -hex 16; }
	{
		echo "$(tok),admin,admin,\"system:masters\""
		echo "$(tok),system:node:$K8S_NODE_NAME,kubelet,\"system:nodes\""
		echo "$(tok),system:kube-scheduler,kube-scheduler"
		echo "$(tok),system:kube-controller-manager,kube-controller-manager"
	} >"$P/tokens.csv"
	chmod 600 "$P"/*.key "$P/tokens.csv"
fi
kubeconfig() { # kubeconfig FILE USER-IN-TOKENS
	local token
	token="$(awk -F, -v u="$2" '$2==u {print $1}' "$P/tokens.csv")"
	cat >"$1" <<KC
apiVersion: v1
kind: Config
clusters:
- name: sandkeep-test
  cluster: {server: "$K8S_API", certificate-authority: "$P/ca.crt"}
users:
- name: $2
  user: {token: "$token"}
contexts:
- name: sandkeep-test
  context: {cluster: sandkeep-test, user: "$2"}
current-context: sandkeep-test
KC
	chmod 600 "$1"
}
kubeconfig "$S/admin.kubeconfig" admin
kubeconfig "$S/kubelet.kubeconfig" "system:node:$K8S_NODE_NAME"
kubeconfig "$S/scheduler.kubeconfig" system:kube-scheduler
kubeconfig "$S/controller-manager.kubeconfig" system:kube-controller-manager

# ---- containerd (a second instance: own root, state, socket, config) ----
cat >"$S/containerd/config.toml" <<TOML
version = 2
root = "$S/containerd/root"
state = "/run/containerd"
oom_score = 0
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "$K8S_CONTAINERD_SOCK"
[ttrpc]
  address = "$K8S_CONTAINERD_SOCK.ttrpc"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$S/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$K8S_AGENT_IMAGE"
  # The machines' init drops CAP_SYS_RESOURCE: nobody may lower oom_score_adj, so clamp it instead of failing.
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$S/cni/net.d"
TOML
cat >"$S/cni/net.d/10-sandkeep.conflist" <<CNI
{"cniVersion": "0.4.0", "name": "sandkeep-pods", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$K8S_POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}
]}
CNI

# ---- kubelet ----
cat >"$S/kubelet/config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $K8S_NODE_IP
readOnlyPort: 0
tlsCertFile: $P/kubelet.crt
tlsPrivateKeyFile: $P/kubelet.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $P/ca.crt}
authorization: {mode: AlwaysAllow}
containerRuntimeEndpoint: unix://$K8S_CONTAINERD_SOCK
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
oomScoreAdj: 0
protectKernelDefaults: false
resolvConf: ""
podPidsLimit: 1024
maxPods: 60
serializeImagePulls: false
nodeStatusUpdateFrequency: 4s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
YAML

# ---- the network namespace and its veth ----
if [[ ! -e "/run/netns/$K8S_NETNS" ]]; then
	ip netns add "$K8S_NETNS"
fi
if ! ip link show "$K8S_HOST_IF" >/dev/null 2>&1; then
	ip link add "$K8S_HOST_IF" type veth peer name "$K8S_NODE_IF"
	ip link set "$K8S_NODE_IF" netns "$K8S_NETNS"
fi
ip addr replace "$K8S_HOST_IP/30" dev "$K8S_HOST_IF"
ip link set "$K8S_HOST_IF" up
ip -n "$K8S_NETNS" addr replace "$K8S_NODE_IP/30" dev "$K8S_NODE_IF"
ip -n "$K8S_NETNS" link set "$K8S_NODE_IF" up
ip -n "$K8S_NETNS" link set lo up
ip -n "$K8S_NETNS" route replace default via "$K8S_HOST_IP"
# The host reaches the pods (the kubernetes driver's agent channel and egress endpoint answer them) through the
# node: only the pod CIDR this script's node hands out, on the veth this script made.
ip route replace "$K8S_POD_CIDR" via "$K8S_NODE_IP" dev "$K8S_HOST_IF"

# ---- start the node: setsid, so a CI step's signal does not take it down ----
log "starting the node (logs in $L)"
# Inherited descriptors are closed first: a caller's `flock LOCK scripts/k8s-up.sh` would otherwise leave its lock
# held by the node for as long as the node runs, and every later caller would wait on it forever.
(
	for fd in $(ls "/proc/$BASHPID/fd"); do
		if [ "$fd" -gt 2 ]; then eval "exec $fd>&-"; fi
	done
	exec setsid nsenter --net="/run/netns/$K8S_NETNS" unshare --mount --propagation private -- \
		"$ROOT/scripts/k8s/node.sh" >>"$L/node.log" 2>&1 </dev/null
) &
echo $! >"$S/run/node.pid"

deadline=$(($(date +%s) + TIMEOUT))
wait_for() { # wait_for WHAT CMD...
	until "${@:2}"; do
		node_pid >/dev/null || die "the node exited while waiting for $1"
		(($(date +%s) < deadline)) || die "timed out after ${TIMEOUT}s waiting for $1"
		sleep 0.3
	done
}
wait_for "containerd" test -S "$K8S_CONTAINERD_SOCK"
wait_for "containerd to answer" ctr -a "$K8S_CONTAINERD_SOCK" version >/dev/null 2>&1

# The pod sandbox ("pause") image and the driver's agent image are one: sandkeep's agent, FROM scratch, whose
# init reaps children and exits on TERM.
log "building the agent image"
(
	cd "$ROOT"
	CGO_ENABLED=0 go build -trimpath -o "$S/bin/sandkeep-agent" ./cmd/sandkeep-agent
	go build -o "$S/bin/sandkeep" ./cmd/sandkeep
) >>"$L/node.log" 2>&1 || die "go build of the agent and the CLI"
"$S/bin/sandkeep" agent image --agent "$S/bin/sandkeep-agent" --tag "$K8S_AGENT_IMAGE" --out "$S/agent-image.tar" \
	>>"$L/node.log" 2>&1 || die "sandkeep agent image"
ctr -a "$K8S_CONTAINERD_SOCK" -n k8s.io images import --digests --base-name "${K8S_AGENT_IMAGE%:*}" "$S/agent-image.tar" >>"$L/node.log" 2>&1 ||
	die "importing the agent image"

wait_for "the API server" eval "api /readyz >/dev/null 2>&1"
wait_for "node $K8S_NODE_NAME to register" api "/api/v1/nodes/$K8S_NODE_NAME" >/dev/null 2>&1
echo yes >"$S/run/node-registered"
wait_for "node $K8S_NODE_NAME to be Ready" node_ready
log "node $K8S_NODE_NAME Ready in $(echo "$(date +%s.%N) - $start" | bc 2>/dev/null || echo '?')s; kubeconfig:"
echo "$K8S_KUBECONFIG"
