#!/usr/bin/env bash
# test.sh — THE test command: Docker up, go vet, gofmt, then the whole test suite against the real engine.
#
#   scripts/test.sh                          # vet + gofmt + go test ./...
#   scripts/test.sh -run TestX ./internal/...  # extra args are passed to go test (and the packages to go vet)
#
# Arguments that are neither flags nor flag values are packages: they replace the default ./... (for go vet
# too). SANDKEEP_REQUIRE_DOCKER=1 is set: a missing daemon fails the run, it never skips.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

phase() { printf '\n==> %s\n' "$*"; }
fail() { printf '\n==> FAIL: %s\n' "$*" >&2; exit 1; }

# go test flags that take a separate value (`-run X`): their value is never a package.
value_flags=" run skip bench benchtime count cpu parallel timeout shuffle list fuzz fuzztime fuzzminimizetime
 coverprofile covermode coverpkg cpuprofile memprofile memprofilerate blockprofile blockprofilerate
 mutexprofile mutexprofilefraction outputdir trace o exec tags ldflags gcflags asmflags p mod modfile vet "
pkgs=()
flags=()
expect_value=0
for a in "$@"; do
	if [ "$expect_value" -eq 1 ]; then
		flags+=("$a")
		expect_value=0
		continue
	fi
	case "$a" in
	-*=*) flags+=("$a") ;;
	-*)
		flags+=("$a")
		name=${a#-}
		name=${name#-}
		case "$value_flags" in *" $name "*) expect_value=1 ;; esac
		;;
	*) pkgs+=("$a") ;;
	esac
done
[ "${#pkgs[@]}" -gt 0 ] || pkgs=(./...)

# --- kubernetes stage, part 1: build the components in the background, niced, so the build overlaps the other
# suites (about 11 minutes on a loaded 2-core machine; nothing when the cache has them). Full runs only; CI
# (CI=true) always runs the stage, a developer may skip it with SANDKEEP_SKIP_K8S=1.
k8s_stage=0
if [ "${pkgs[*]}" = "./..." ] && { [ "${CI:-}" = true ] || [ "${SANDKEEP_SKIP_K8S:-0}" != 1 ]; }; then
	k8s_stage=1
fi
k8s_log_dir="${SANDKEEP_K8S_LOGS:-/var/log/sandkeep-k8s}"
k8s_build_pid=
runsc_cli_pid= # the CLI suite under runsc, in the background beside the kubernetes stage (below)
k8s_cleanup() {
	if [ -n "$k8s_build_pid" ] && kill -0 "$k8s_build_pid" 2>/dev/null; then
		kill -TERM -- "-$k8s_build_pid" 2>/dev/null || true
	fi
	if [ -n "$runsc_cli_pid" ] && kill -0 "$runsc_cli_pid" 2>/dev/null; then
		kill -TERM -- "-$runsc_cli_pid" 2>/dev/null || true
	fi
}
trap k8s_cleanup EXIT
if [ "$k8s_stage" = 1 ]; then
	mkdir -p "$k8s_log_dir"
	phase "kubernetes: scripts/k8s-build.sh in the background (log $k8s_log_dir/build.log)"
	k8s_build_start=$(date +%s)
	setsid nice -n 19 bash scripts/k8s-build.sh >"$k8s_log_dir/build.log" 2>&1 </dev/null &
	k8s_build_pid=$!
fi
# --- end kubernetes part 1 ---


# SANDKEEP_RUNSC=1 (the default here) also installs gVisor's runsc and registers it with the engine, for the
# runsc pass below; SANDKEEP_RUNSC=0 leaves the engine's runtimes alone (and skips that pass).
export SANDKEEP_RUNSC=${SANDKEEP_RUNSC:-1}
phase "docker: scripts/docker-up.sh"
bash scripts/docker-up.sh || fail "Docker engine not available (see above)"

# --- store: PostgreSQL for the store conformance suite (internal/store/postgres) ---
# postgres-up.sh installs/starts a loopback-only PostgreSQL and prints the test DSN; a DSN the caller already set
# in SANDKEEP_TEST_POSTGRES is used as is. REQUIRE=1: a missing PostgreSQL fails the postgres store tests, it
# never skips them.
if [ -z "${SANDKEEP_TEST_POSTGRES:-}" ]; then
	phase "postgres: scripts/postgres-up.sh"
	SANDKEEP_TEST_POSTGRES=$(bash scripts/postgres-up.sh) || fail "PostgreSQL not available (see above)"
fi
export SANDKEEP_TEST_POSTGRES
export SANDKEEP_REQUIRE_POSTGRES=1
# --- end store block ---

# --- ui: Chromium for the dashboard's browser tests (internal/ui) ---
# chromium-up.sh installs Debian's chromium when missing. REQUIRE=1: a missing browser fails the browser tests,
# it never skips them. Their screenshots go to $SANDKEEP_ARTIFACTS/ui (default .artifacts/, gitignored).
phase "chromium: scripts/chromium-up.sh"
bash scripts/chromium-up.sh >/dev/null || fail "chromium not available (see above)"
export SANDKEEP_REQUIRE_CHROMIUM=1
export SANDKEEP_ARTIFACTS="${SANDKEEP_ARTIFACTS:-$PWD/.artifacts}"
# --- end ui block ---

# -race needs cgo and a C compiler.
if ! command -v gcc >/dev/null 2>&1; then
	phase "toolchain: installing gcc (needed by go test -race)"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev \
		|| { DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev; } \
		|| fail "could not install gcc"
fi

# The official TypeScript MCP client (cmd/sandkeep TestMCPTypeScript): node from Debian, the client from npm at
# the versions test/mcp-ts/package-lock.json pins. npm ci runs only when the lock file changed since the last one.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	phase "toolchain: installing nodejs and npm (the TypeScript MCP client test)"
	{ DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm; } \
		|| fail "could not install nodejs and npm"
fi
# The e2b SDK suite (cmd/sandkeep TestE2BTypeScript) is installed the same way, from test/e2b-ts's lock file.
for tsdir in test/mcp-ts test/e2b-ts; do
	if ! cmp -s "$tsdir/package-lock.json" "$tsdir/node_modules/.package-lock.json.ci" 2>/dev/null; then
		phase "npm ci ($tsdir)"
		(cd "$tsdir" && npm ci --no-audit --no-fund --loglevel=error && cp package-lock.json node_modules/.package-lock.json.ci) \
			|| fail "npm ci in $tsdir"
	fi
done

phase "go vet ${pkgs[*]}"
go vet "${pkgs[@]}" || fail "go vet"

phase "gofmt -l ."
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
	printf '%s\n' "$unformatted" >&2
	fail "gofmt: the files above are not formatted (run gofmt -w)"
fi

# Every core guarantee must hold on both transports (the agent channel and Docker exec), so the suites that
# drive whole commands run twice: first everything with the channel forced, then the library and the CLI over
# Docker exec. SANDKEEP_TRANSPORT set by the caller picks a single pass instead.
if [ -n "${SANDKEEP_TRANSPORT:-}" ]; then
	passes=("$SANDKEEP_TRANSPORT")
else
	passes=(agent exec)
fi
for transport in "${passes[@]}"; do
	run_pkgs=("${pkgs[@]}")
	if [ "$transport" = exec ] && [ "${#passes[@]}" -gt 1 ] && [ "${pkgs[*]}" = "./..." ]; then
		run_pkgs=(. ./cmd/sandkeep)
	fi
	phase "go test -race (transport $transport) $(printf "%s " "${flags[@]}")${run_pkgs[*]}"
	SANDKEEP_TRANSPORT=$transport SANDKEEP_REQUIRE_DOCKER=1 CGO_ENABLED=1 \
		go test -race -count=1 -timeout 45m "${flags[@]}" "${run_pkgs[@]}" || fail "go test (transport $transport)"
done

# The CLI suite once more through the local daemon (issue 14): every sandkeep process of cmd/sandkeep's tests runs
# with SANDKEEP_DAEMON=auto, so the first call of each test's home starts that home's daemon and later calls go
# through it (the passes above run in-process, SANDKEEP_DAEMON=off). Full runs, or when cmd/sandkeep is named.
if [ "${pkgs[*]}" = "./..." ] || [[ " ${pkgs[*]} " == *" ./cmd/sandkeep "* ]]; then
	phase "go test -race (through the daemon) ./cmd/sandkeep"
	SANDKEEP_TEST_DAEMON=auto SANDKEEP_REQUIRE_DOCKER=1 CGO_ENABLED=1 \
		go test -race -count=1 -timeout 45m "${flags[@]}" ./cmd/sandkeep || fail "go test (through the daemon)"
fi

# The Docker suites once more with sandboxes under gVisor (an operator's `runtime: runsc`), over the engine's exec
# (runsc has no agent channel): the whole Docker driver package (conformance, hardening probes with gVisor's
# answers, uids, quota, /tmp), the whole lifecycle package (its Docker test: secret files) and the library's whole
# suite. Left out, each for its reason in docs/SECURITY.md, "gVisor": the builds (they never run under the sandbox
# runtime), the egress suite (no network under runsc: TestGVisorRefusesNetwork shows the refusal instead) and the
# daemon restart (it restarts the engine; it runs once, alone, below), and TestPortForwardChannel (forwarding over
# the agent channel, which runsc has not; its exec fallback's open forward is not ended when a runsc container
# stops: a known gap, docs/SECURITY.md "gVisor").
if [ "${pkgs[*]}" = "./..." ] && [ "$SANDKEEP_RUNSC" = 1 ]; then
	phase "go test -race: the Docker suites under gVisor (runsc)"
	SANDKEEP_TEST_RUNTIME=runsc SANDKEEP_TRANSPORT=exec SANDKEEP_REQUIRE_DOCKER=1 CGO_ENABLED=1 \
		go test -race -count=1 -timeout 20m -skip '^TestBuild' ./internal/driver/docker/ || fail "go test (runsc, driver)"
	SANDKEEP_TEST_RUNTIME=runsc SANDKEEP_TRANSPORT=exec SANDKEEP_REQUIRE_DOCKER=1 CGO_ENABLED=1 \
		go test -race -count=1 -timeout 45m -skip '^(TestEgress[A-Z].*|TestDaemonRestart|TestPortForwardChannel)$' ./internal/lifecycle/ . \
		|| fail "go test (runsc, lifecycle and library)"
fi

# Last and alone: a test that restarts the Docker daemon (every container stops), which would disturb any test
# running beside it. Only in a full run.
if [ "${pkgs[*]}" = "./..." ]; then
	phase "go test -race: the daemon restarts under a long-lived manager (alone)"
	SANDKEEP_TEST_DAEMON_RESTART=1 SANDKEEP_REQUIRE_DOCKER=1 CGO_ENABLED=1 \
		go test -race -count=1 -timeout 10m -run '^TestDaemonRestart$' . || fail "go test (daemon restart)"
fi

# The CLI suite under gVisor (runsc), over the engine's exec: every sandkeep process of cmd/sandkeep's tests gets
# SANDKEEP_RUNTIME=runsc (TestExecRuntime checks the engine's view). About 25 minutes under -race on the loaded
# machine, most of it waiting on sandboxes, so it runs in the background beside the kubernetes stage (which waits
# on the node) after the daemon restart above, and CI waits for it at the end. Left out, each for its reason in
# docs/SECURITY.md "What CI runs under runsc": TestBench (it measures the agent channel, which runsc has not) and
# TestDaemonNetwork (the daemon's egress proxy: no network under runsc; TestExecRuntime shows the refusal).
runsc_cli_log="${SANDKEEP_ARTIFACTS}/runsc-cli.log"
if [ "${pkgs[*]}" = "./..." ] && [ "$SANDKEEP_RUNSC" = 1 ]; then
	phase "go test -race: the CLI suite under gVisor (runsc), in the background (log $runsc_cli_log)"
	mkdir -p "$SANDKEEP_ARTIFACTS"
	runsc_cli_start=$(date +%s)
	SANDKEEP_TEST_RUNTIME=runsc SANDKEEP_TRANSPORT=exec SANDKEEP_REQUIRE_DOCKER=1 CGO_ENABLED=1 \
		setsid go test -race -count=1 -timeout 45m -skip '^(TestBench|TestDaemonNetwork)$' ./cmd/sandkeep \
		>"$runsc_cli_log" 2>&1 </dev/null &
	runsc_cli_pid=$!
fi

# --- kubernetes stage, part 2: a real single-node cluster (scripts/k8s-up.sh), the kubernetes driver's suites
# against it, then the node down. ---
if [ "$k8s_stage" = 1 ]; then
	phase "kubernetes: waiting for scripts/k8s-build.sh"
	if ! wait "$k8s_build_pid"; then
		tail -n 40 "$k8s_log_dir/build.log" >&2
		fail "scripts/k8s-build.sh (log $k8s_log_dir/build.log)"
	fi
	k8s_build_pid=
	echo "k8s-build.sh finished $(($(date +%s) - k8s_build_start))s after it started"
	k8s_stage_start=$(date +%s)
	phase "kubernetes: scripts/k8s-up.sh"
	kubeconfig=$(bash scripts/k8s-up.sh) || fail "scripts/k8s-up.sh (logs in $k8s_log_dir)"
	trap 'k8s_cleanup; bash scripts/k8s-down.sh >&2 || true' EXIT
	phase "go test -race (kubernetes) ./internal/driver/kube/..."
	KUBECONFIG=$kubeconfig SANDKEEP_REQUIRE_KUBE=1 CGO_ENABLED=1 \
		go test -race -count=1 -timeout 20m ./internal/driver/kube/... || fail "go test (kubernetes; node logs in $k8s_log_dir)"
	# The library's lifecycle suite (every test of sandkeep_test.go; the few that read Docker itself skip on
	# kubernetes, each saying why) and, through a real `sandkeep serve`, the API suite with its files and the
	# serve restart (adoption, a pod deleted behind its back): SANDKEEP_TEST_DRIVER=kubernetes points them at the
	# node (internal/testutil/kubetest); -p 1: each test
	# binary imports the images into the node's containerd when it starts; one at a time, so no import lands
	# under another binary's running tests.
	lib_tests=$(grep -o '^func Test[A-Za-z0-9_]*' sandkeep_test.go | sed 's/^func //' | grep -vx TestMain | paste -sd'|')
	# Also the library's egress suites (TestEgress* of egress_test.go: allowlist and network_blocked events, no
	# bypass, address classes, silent hosts, TLS inspection with credential injection and the SNI check, presets,
	# the CA bundle, per-command policy and token, the refusal flood) through the pod's forwarded proxy under
	# NetworkPolicy (kube-router), each test in its own namespace with its own enforcement probe; and the library's
	# file API (TestFiles: upload, download, list, tar, the refusals of what a command planted, the limits, a
	# stopped pod started for it), every operation through the pod's agent (sandkeep-agent fs). One binary per
	# package, so the images are imported once each.
	phase "go test -race (kubernetes): the library's lifecycle, egress and file suites, TestServeSDK, TestServeRestartKube, TestE2BTypeScript"
	k8s_suites_start=$(date +%s)
	SANDKEEP_TEST_DRIVER=kubernetes KUBECONFIG=$kubeconfig SANDKEEP_REQUIRE_KUBE=1 CGO_ENABLED=1 \
		go test -race -count=1 -p 1 -timeout 40m -run "^($lib_tests|TestEgress[A-Za-z0-9_]*|TestFiles|TestServeSDK|TestServeRestartKube|TestE2BTypeScript)\$" . ./cmd/sandkeep \
		|| fail "go test (the suites on kubernetes; node logs in $k8s_log_dir)"
	echo "the suites on kubernetes: $(($(date +%s) - k8s_suites_start))s"
	phase "kubernetes: scripts/k8s-down.sh"
	trap k8s_cleanup EXIT
	bash scripts/k8s-down.sh || fail "scripts/k8s-down.sh"
	echo "kubernetes stage (up, tests, down): $(($(date +%s) - k8s_stage_start))s"
fi
# --- end kubernetes part 2 ---

if [ -n "$runsc_cli_pid" ]; then
	phase "go test -race: waiting for the CLI suite under gVisor (runsc)"
	if ! wait "$runsc_cli_pid"; then
		runsc_cli_pid=
		tail -n 200 "$runsc_cli_log" >&2
		fail "go test (runsc, CLI; log $runsc_cli_log)"
	fi
	runsc_cli_pid=
	tail -n 1 "$runsc_cli_log"
	echo "the CLI suite under runsc: $(($(date +%s) - runsc_cli_start))s after it started"
fi

phase "OK"
