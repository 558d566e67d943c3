#!/usr/bin/env bash
# k8s-build.sh: build the Kubernetes components the test node runs (kube-apiserver, kubelet, kube-scheduler,
# kube-controller-manager) from k8s.io/kubernetes, and kube-router for NetworkPolicy, into a cache dir outside
# the repository. Idempotent: a binary already built for this version is not rebuilt.
#
#   SANDKEEP_K8S_VERSION   Kubernetes version (default v1.37.2; the staging modules are v0.<minor>.<patch>)
#   SANDKEEP_K8S_CACHE     cache root (default /var/cache/sandkeep-k8s); binaries land in $CACHE/$VERSION/bin
#   SANDKEEP_K8S_ROUTER    1 (default): build kube-router too, the NetworkPolicy enforcer the kube egress tests need; 0: skip it
#   KUBE_ROUTER_VERSION    default v2.1.0
set -euo pipefail

VERSION="${SANDKEEP_K8S_VERSION:-v1.37.2}"
CACHE="${SANDKEEP_K8S_CACHE:-/var/cache/sandkeep-k8s}"
ROUTER="${SANDKEEP_K8S_ROUTER:-1}"
ROUTER_VERSION="${KUBE_ROUTER_VERSION:-v2.1.0}"
BIN="$CACHE/$VERSION/bin"
WORK="$CACHE/$VERSION/build"
COMPONENTS=(kube-apiserver kubelet kube-scheduler kube-controller-manager)

log() { printf '[k8s-build %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

mkdir -p "$BIN" "$WORK"
# One build at a time per cache (CI starts this in the background; a developer may run it by hand too).
exec 9>"$CACHE/$VERSION/.lock"
flock 9

missing=()
for c in "${COMPONENTS[@]}"; do [[ -x "$BIN/$c" ]] || missing+=("$c"); done

if ((${#missing[@]})); then
	staging="v0.${VERSION#v1.}"
	log "building ${missing[*]} from k8s.io/kubernetes $VERSION (staging $staging) in $WORK"
	mod="$WORK/kubernetes"
	mkdir -p "$mod"
	cd "$mod"
	if [[ ! -f go.mod ]] || ! grep -q "k8s.io/kubernetes $VERSION" go.mod; then
		rm -f go.mod go.sum tools.go
		go mod init sandkeep.local/k8s-build >/dev/null 2>&1
		# The staging modules are required at v0.0.0 and replaced by ./staging in the kubernetes tree; outside it
		# they must be replaced with their published versions. Read the list from kubernetes' own go.mod.
		gomod="$(go mod download -json "k8s.io/kubernetes@$VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
		[[ -f "$gomod" ]] || { log "cannot download k8s.io/kubernetes@$VERSION"; exit 1; }
		mapfile -t staged < <(sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$gomod" | sort -u)
		((${#staged[@]})) || { log "no staging replaces found in $gomod"; exit 1; }
		log "${#staged[@]} staging replaces"
		args=(-require="k8s.io/kubernetes@$VERSION")
		for m in "${staged[@]}"; do args+=(-replace="$m=$m@$staging"); done
		go mod edit "${args[@]}"
		{
			echo '//go:build tools'
			echo 'package tools'
			echo 'import ('
			for c in "${COMPONENTS[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$c\""; done
			echo ')'
		} >tools.go
		go mod tidy >/dev/null 2>"$WORK/tidy.log" || { tail -20 "$WORK/tidy.log" >&2; exit 1; }
	fi
	for c in "${missing[@]}"; do
		log "go build $c"
		CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$BIN/$c.tmp" "k8s.io/kubernetes/cmd/$c"
		mv "$BIN/$c.tmp" "$BIN/$c"
	done
fi

if [[ "$ROUTER" == 1 && ! -x "$BIN/kube-router" ]]; then
	log "building kube-router $ROUTER_VERSION"
	mod="$WORK/kube-router"
	mkdir -p "$mod"
	cd "$mod"
	if [[ ! -f go.mod ]] || ! grep -q "kube-router/v2 $ROUTER_VERSION" go.mod; then
		rm -f go.mod go.sum tools.go
		go mod init sandkeep.local/kube-router-build >/dev/null 2>&1
		go mod edit -require="github.com/cloudnativelabs/kube-router/v2@$ROUTER_VERSION"
		printf '//go:build tools\npackage tools\nimport _ "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"\n' >tools.go
		go mod tidy >/dev/null 2>"$WORK/tidy-router.log" || { tail -20 "$WORK/tidy-router.log" >&2; exit 1; }
	fi
	CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$BIN/kube-router.tmp" github.com/cloudnativelabs/kube-router/v2/cmd/kube-router
	mv "$BIN/kube-router.tmp" "$BIN/kube-router"
fi

log "ready: $BIN"
ls -la "$BIN" >&2
