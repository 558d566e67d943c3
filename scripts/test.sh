#!/usr/bin/env bash
# test.sh — THE test command, in tiers (docs/TESTING.md says what each covers):
#
#   1 short   go vet, gofmt, `go test -short ./...`: no Docker, no network, no services; minutes. A full run
#             adds deadcode -test ./... (any finding not in scripts/deadcode-allow.txt fails).
#   2 docker  the end-to-end suites against the real engine (the packages whose tests use internal/testutil): the
#             library over the agent channel, the CLI once through its daemon (its default path), plus the
#             in-process fallback's own group and the exec transport's group; the daemon restart, alone.
#   3 runsc + kubernetes   the Docker conformance (driver, lifecycle) and the runtime groups under gVisor; a real
#             single-node cluster for the kubernetes driver's suite and the library's and serve's groups on it.
#
#   scripts/test.sh --short                    # tier 1 only: anywhere, no Docker socket needed
#   scripts/test.sh                            # every tier (what CI runs: .ci/run)
#   scripts/test.sh -run TestX ./internal/...  # one Docker pass over those packages, flags passed to go test
#
# Arguments that are neither flags nor flag values are packages: they replace the default ./... (for go vet
# too). Past tier 1, SANDKEEP_REQUIRE_DOCKER=1 is set: a missing daemon fails the run, it never skips.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

short=0
if [ "${1:-}" = --short ]; then
	short=1
	shift
fi

phase() { printf '\n==> %s\n' "$*"; }
fail() { printf '\n==> FAIL: %s\n' "$*" >&2; exit 1; }

# gotestsum (gotest.tools, pinned; installed once from the module proxy into the tools cache by full runs, used by
# any run that finds it there) shows each `go test` as go test would (a line per package, each failed test's
# output) and keeps its events, so every run can say where its minutes went. Without it, plain go test.
gts_version=v1.13.0
tools_dir="${SANDKEEP_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/sandkeep-tools}"
gts="$tools_dir/gotestsum-$gts_version/gotestsum"
tests_dir="${SANDKEEP_ARTIFACTS:-$PWD/.artifacts}/tests"

# gotest NAME [VAR=value | -u VAR]... -- ARGS runs `go test ARGS` in that environment; with gotestsum, its events
# go to $tests_dir/NAME.json and the tests that took over 20 s are listed after it, slowest first.
gotest() {
	local name=$1 vars=() rc=0
	shift
	while [ "$1" != -- ]; do
		vars+=("$1")
		shift
	done
	shift
	if [ ! -x "$gts" ]; then
		env "${vars[@]}" go test "$@"
		return
	fi
	mkdir -p "$tests_dir"
	env "${vars[@]}" "$gts" --format pkgname-and-test-fails --format-icons text --hide-summary=skipped \
		--jsonfile "$tests_dir/$name.json" -- "$@" || rc=$?
	"$gts" tool slowest --jsonfile "$tests_dir/$name.json" --threshold 20s | head -n 15 | sed 's/^/slowest: /' || true
	return "$rc"
}

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

# --- kubernetes stage: build the components (cached by version in /var/cache/sandkeep-k8s/<version>: nothing to
# do on a hit; about 11 minutes of niced CPU on a miss), bring a real single-node cluster up (scripts/k8s-up.sh),
# run the kubernetes driver's suites on it, take it down. Full runs only; CI (CI=true) always runs the stage, a
# developer may skip it with SANDKEEP_SKIP_K8S=1. It runs in the background beside tiers 1-3 (it needs Docker,
# PostgreSQL and the toolchain, so it starts once they are up), its output in $k8s_log_dir/stage.log, printed
# when it ends; SANDKEEP_K8S_SERIAL=1 runs it after them instead, as before.
k8s_stage=0
if [ "$short" = 0 ] && [ "${pkgs[*]}" = "./..." ] && { [ "${CI:-}" = true ] || [ "${SANDKEEP_SKIP_K8S:-0}" != 1 ]; }; then
	k8s_stage=1
fi
k8s_log_dir="${SANDKEEP_K8S_LOGS:-/var/log/sandkeep-k8s}"
k8s_pid=
k8s_up=0
k8s_cleanup() {
	if [ -n "$k8s_pid" ] && kill -0 "$k8s_pid" 2>/dev/null; then
		kill -TERM -- "-$k8s_pid" 2>/dev/null || true
		wait "$k8s_pid" 2>/dev/null || true
	fi
	if [ "$k8s_up" = 1 ]; then
		bash scripts/k8s-down.sh >&2 || true
	fi
}
trap k8s_cleanup EXIT
# --- end kubernetes part 1 ---

# --- kubernetes stage, part 2: a real single-node cluster (scripts/k8s-up.sh), the kubernetes driver's suites
# against it, then the node down (started and waited for below). ---
k8s_stage_run() {
	local t0=$SECONDS kubeconfig
	phase "kubernetes: scripts/k8s-build.sh (log $k8s_log_dir/build.log)"
	nice -n 19 bash scripts/k8s-build.sh >"$k8s_log_dir/build.log" 2>&1 </dev/null ||
		{ tail -n 40 "$k8s_log_dir/build.log"; fail "scripts/k8s-build.sh (log $k8s_log_dir/build.log)"; }
	echo "k8s-build.sh: $((SECONDS - t0))s"
	phase "kubernetes: scripts/k8s-up.sh"
	kubeconfig=$(bash scripts/k8s-up.sh) || fail "scripts/k8s-up.sh (logs in $k8s_log_dir)"
	# The driver's suite includes TestReaperKube (issue 27: the reaper on the node) and TestDeployManifests.
	phase "tier 3: go test -race (kubernetes) ./internal/driver/kube/..."
	gotest kube-driver KUBECONFIG="$kubeconfig" SANDKEEP_REQUIRE_KUBE=1 CGO_ENABLED=1 -- \
		-race -count=1 -timeout 20m ./internal/driver/kube/... || fail "go test (kubernetes; node logs in $k8s_log_dir)"
	# The library's suite on the node (SANDKEEP_TEST_DRIVER=kubernetes points it at it, internal/testutil/kubetest):
	# the lifecycle tests (the few that read Docker itself skip on kubernetes, each saying why), the egress suites
	# (TestEgress*: allowlist and network_blocked events, no bypass, address classes, silent hosts, TLS inspection
	# with credential injection and the SNI check, presets, the CA bundle, per-command policy and token, the
	# refusal flood) through the pod's forwarded proxy under NetworkPolicy (kube-router), each test in its own
	# namespace with its own enforcement probe, and the file API (TestFiles) through the pod's agent. Chosen by
	# package, less a named group that is Docker's only: the devcontainer builds,
	# the run records' Docker test and the degraded path (no kubernetes there). Then, through a real `sandkeep
	# serve`, the API suite with its files, the serve restart (adoption, a pod deleted behind its back), the e2b SDK and
	# the fleet (three serve replicas on the store's PostgreSQL: 200 commands round-robin, a rolling restart, SIGKILL).
	# -p 1 and one binary per package: each test binary imports the images into the node's containerd when it
	# starts; one at a time, so no import lands under another binary's running tests.
	not_on_kube='^(TestDevcontainerAsWritten|TestLibraryRuns|TestDegradedRunProceeds)$'
	kube_env=(SANDKEEP_TEST_DRIVER=kubernetes KUBECONFIG="$kubeconfig" SANDKEEP_REQUIRE_KUBE=1 CGO_ENABLED=1)
	# TestFleetDeployedKube (sandkeep deployed from deploy/kubernetes, 3 replicas) is not in this group yet: a rolling
	# restart under load failed 2 of 375 commands with OWNER_UNAVAILABLE in one of two runs (a forward on an idle
	# connection the draining owner closed; see the closing note). Run it by hand with the same environment.
	phase "go test -race (kubernetes): the library's suite -skip '$not_on_kube'; TestServeSDK, TestServeRestartKube, TestE2BTypeScript, TestE2BProcessesShared, TestServeProcesses, TestServeProcessesMCP, TestFleetKube, TestFleetKubeFollow, TestDoctorCapacityKube"
	k8s_suites_start=$(date +%s)
	gotest kube-library "${kube_env[@]}" -- -race -count=1 -timeout 40m -run '^Test' -skip "$not_on_kube" . \
		|| fail "go test (the library on kubernetes; node logs in $k8s_log_dir)"
	# warm pools on the node (issue 23): members, claims through two replicas, SIGKILL mid-claim, drain
	gotest kube-pools "${kube_env[@]}" -- -race -count=1 -timeout 20m -run '^(TestPoolKube|TestPoolClaimKilledKube)$' ./internal/engine/lifecycle \
		|| fail "go test (warm pools on kubernetes; node logs in $k8s_log_dir)"
	gotest kube-serve "${kube_env[@]}" -- -race -count=1 -timeout 30m -run '^(TestServeSDK|TestServeRestartKube|TestE2BTypeScript|TestE2BProcessesShared|TestServeProcesses|TestServeProcessesMCP|TestFleetKube|TestFleetKubeFollow|TestDoctorCapacityKube)$' ./cmd/sandkeep \
		|| fail "go test (serve on kubernetes; node logs in $k8s_log_dir)"
	echo "the suites on kubernetes: $(($(date +%s) - k8s_suites_start))s"
	phase "kubernetes: scripts/k8s-down.sh"
	bash scripts/k8s-down.sh || fail "scripts/k8s-down.sh"
	echo "kubernetes stage (build, up, tests, down): $((SECONDS - t0))s"
}

# k8s_stage_start runs the stage in the background, in a process group of its own (the cleanup ends it whole).
k8s_stage_start() {
	mkdir -p "$k8s_log_dir"
	phase "kubernetes: the stage in the background (log $k8s_log_dir/stage.log)"
	k8s_up=1 # k8s-down.sh is idempotent: the cleanup takes the node down whatever the stage reached
	setsid bash -c "$(declare -f phase fail gotest k8s_stage_run); $(declare -p k8s_log_dir gts tests_dir); set -euo pipefail; k8s_stage_run" \
		>"$k8s_log_dir/stage.log" 2>&1 </dev/null &
	k8s_pid=$!
	k8s_started=$SECONDS
}

# k8s_stage_wait waits for the stage, prints its log and fails the run when it failed.
k8s_stage_wait() {
	phase "kubernetes: waiting for the stage"
	local rc=0
	wait "$k8s_pid" || rc=$?
	k8s_pid=
	cat "$k8s_log_dir/stage.log"
	[ "$rc" = 0 ] || fail "the kubernetes stage (log above; node logs in $k8s_log_dir)"
	k8s_up=0 # it took the node down itself
	echo "kubernetes stage: ended $((SECONDS - k8s_started))s after it started"
}
# --- end kubernetes part 2 ---


# The packages with end-to-end tests: those whose tests use internal/testutil (the engine, the test image, the
# agent). Chosen by package, from go list's imports: tier 2a runs them whole; the others run in tier 1 only.
module=$(go list -m)
mapfile -t docker_pkgs < <(go list -f '{{.ImportPath}} {{join .TestImports " "}} {{join .XTestImports " "}}' ./... |
	awk -v tu="$module/internal/testutil" '{for (i = 2; i <= NF; i++) if ($i == tu) {print $1; next}}')
[ "${#docker_pkgs[@]}" -gt 0 ] || fail "go list found no package whose tests use internal/testutil"

# --- tier 1 (short): go vet, gofmt, (full runs) deadcode, go test -short. With --short nothing else runs, and nothing here
# needs Docker, the network or a service: testutil.Docker skips every Docker test under -short.
tier1() {
	phase "tier 1: go vet ${pkgs[*]}"
	go vet "${pkgs[@]}" || fail "go vet"

	phase "tier 1: gofmt -l ."
	unformatted=$(gofmt -l .)
	if [ -n "$unformatted" ]; then
		printf '%s\n' "$unformatted" >&2
		fail "gofmt: the files above are not formatted (run gofmt -w)"
	fi

	# deadcode (golang.org/x/tools/cmd/deadcode, pinned, installed once from the module proxy into a cache outside
	# the repository): a function no test and no main can reach fails the run, unless scripts/deadcode-allow.txt
	# names it with its reason. Whole-program and a few minutes of CPU: full runs only, not --short.
	if [ "$short" = 0 ] && [ "${pkgs[*]}" = "./..." ]; then
		local dc_version=v0.52.0
		local dc="$tools_dir/deadcode-$dc_version/deadcode"
		if [ ! -x "$dc" ]; then
			phase "tier 1: installing deadcode $dc_version (golang.org/x/tools) into $(dirname "$dc")"
			mkdir -p "$(dirname "$dc")"
			GOBIN=$(dirname "$dc") GOFLAGS= go install "golang.org/x/tools/cmd/deadcode@$dc_version" || fail "go install deadcode"
		fi
		phase "tier 1: deadcode -test ./..."
		local found dead
		found=$("$dc" -test ./...) || fail "deadcode did not run (see above)"
		# "path:line:col: unreachable func: Name" -> "path: unreachable func: Name", less the allowed ones.
		dead=$(printf '%s\n' "$found" | sed -E 's/^([^:]+):[0-9]+:[0-9]+:/\1:/' | grep -v '^$' |
			grep -vxF -f <(grep -v '^#' scripts/deadcode-allow.txt | grep -v '^$') || true)
		if [ -n "$dead" ]; then
			printf '%s\n' "$found" | grep -F -f <(printf '%s\n' "$dead" | sed -E 's/^([^:]+): .*: ([^:]+)$/\2/') >&2 || true
			fail "deadcode: the $(printf '%s\n' "$dead" | wc -l) function(s) above are reached by no main and no test: delete them or use them (scripts/deadcode-allow.txt lists the accepted ones, each with its reason)"
		fi
		echo "deadcode: nothing new ($(printf '%s\n' "$found" | grep -c . || true) allowed in scripts/deadcode-allow.txt)"
	fi

	local race=() test_pkgs=("${pkgs[@]}")
	if [ "$short" = 0 ]; then
		race=(-race) # CI's tier 1 runs under the race detector (the Docker tiers did before; gcc is installed below)
	fi
	if [ "$short" = 0 ] && [ "${pkgs[*]}" = "./..." ]; then
		# A full run: the packages with end-to-end tests run whole in tier 2a (their short tests too, under -race),
		# so tier 1 runs the others only; each test runs once.
		mapfile -t test_pkgs < <(go list ./... | grep -vxF -f <(printf '%s\n' "${docker_pkgs[@]}"))
	fi
	phase "tier 1: go test -short ${race[*]} $(printf "%s " "${flags[@]}")${test_pkgs[*]/#$module/.}"
	local t0=$SECONDS
	gotest tier1 -u SANDKEEP_REQUIRE_DOCKER -u SANDKEEP_REQUIRE_KUBE CGO_ENABLED=1 -- \
		-short "${race[@]}" -count=1 -timeout 10m "${flags[@]}" "${test_pkgs[@]}" || fail "go test -short"
	echo "tier 1 (go test -short): $((SECONDS - t0))s"
}

if [ "$short" = 1 ]; then
	tier1
	phase "OK (tier 1)"
	exit 0
fi

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

if [ ! -x "$gts" ]; then
	phase "toolchain: installing gotestsum $gts_version (gotest.tools) into $(dirname "$gts")"
	mkdir -p "$(dirname "$gts")"
	GOBIN=$(dirname "$gts") GOFLAGS= go install "gotest.tools/gotestsum@$gts_version" || fail "go install gotestsum"
fi

if [ "$k8s_stage" = 1 ] && [ "${SANDKEEP_K8S_SERIAL:-0}" != 1 ]; then
	k8s_stage_start
fi

tier1

# --- tier 2 (docker): the end-to-end suites against the real engine, each behaviour once at its layer.
docker_env=(SANDKEEP_REQUIRE_DOCKER=1 CGO_ENABLED=1)
if [ "${pkgs[*]}" != "./..." ]; then
	# A developer's packages: one Docker pass over them (SANDKEEP_TRANSPORT / SANDKEEP_TEST_DAEMON as set).
	phase "tier 2: go test -race $(printf "%s " "${flags[@]}")${pkgs[*]}"
	gotest docker "${docker_env[@]}" -- -race -count=1 -timeout 45m "${flags[@]}" "${pkgs[@]}" || fail "go test"
	phase "OK"
	exit 0
fi


# 2a: every end-to-end suite once. The library over the agent channel (SANDKEEP_TRANSPORT=agent: a channel that
# does not come up fails instead of falling back); the CLI suite through the local daemon, the CLI's default
# path (SANDKEEP_TEST_DAEMON=auto: each test home's first call starts its daemon, later calls go through it).
phase "tier 2: go test -race (library over the agent channel, CLI through the daemon) ${docker_pkgs[*]/#$module/.}"
t0=$SECONDS
gotest tier2a "${docker_env[@]}" SANDKEEP_TRANSPORT=agent SANDKEEP_TEST_DAEMON=auto -- \
	-race -count=1 -timeout 45m "${flags[@]}" "${docker_pkgs[@]}" || fail "go test (tier 2)"
echo "tier 2a: $((SECONDS - t0))s"

# 2b: the CLI's in-process fallback (SANDKEEP_DAEMON=off: no daemon, or one that cannot serve the call) has its
# own group: the exec behaviours a user sees (exit status, streams, timeout, failures, JSON, interrupt, closed
# pipe, network, drops), the cross-process gate and ps/stop/rm. exec -t always runs in-process: 2a ran it.
cli_inprocess='^(TestExec[A-Za-z]*|TestGateAcrossProcesses|TestPsStopRm)$'
phase "tier 2: go test -race (the CLI in-process) -run '$cli_inprocess' ./cmd/sandkeep"
gotest tier2b "${docker_env[@]}" -- -race -count=1 -timeout 30m -run "$cli_inprocess" -skip '^TestExecTTY' ./cmd/sandkeep \
	|| fail "go test (the CLI in-process)"

# 2c: the exec transport (Docker exec of the agent, the fallback when the channel is down). The driver's
# conformance (drivertest, in 2a: every exec of the Docker driver is an engine exec) and lifecycle's
# TestSecretFilesDocker run it already; the library's command guarantees run once more over it, as a group, and
# its processes and concurrent commands, which the exec transport carries over a relay (an engine exec of
# `sandkeep-agent relay` that init takes only from uid 0).
exec_group='^(TestExitCodes|TestOutputStreams|TestOutputFloodIsBounded|TestTimeoutKillsWholeTree|TestNoDescendantOutlivesItsCommand|TestCancelledCallerKeepsGate|TestWorkdir|TestPosture|TestFiles|TestProcessBesideCommands|TestProcessEnds|TestProcessTreesApart|TestConcurrentExec|TestProcessUnavailable|TestRelayOnlyFromTheEngine)$'
phase "tier 2: go test -race (the exec transport) -run '$exec_group' ."
gotest tier2c "${docker_env[@]}" SANDKEEP_TRANSPORT=exec -- -race -count=1 -timeout 30m -run "$exec_group" . \
	|| fail "go test (the exec transport)"

# 2e: the unit tests -short leaves out (tier 1 runs -short), in packages without end-to-end tests, which 2a does
# not run: bounded memory while streaming 100 MiB files and resolving 150 MiB features, the file API's suite a
# second time through the agent's wire. A package whose tests use internal/testutil ran them whole in 2a.
long_units='^(TestLargeFileStreamsWithBoundedMemory|TestStreamsWithBoundedMemory|TestViaAgent|TestResolveMemoryBounded)$'
phase "tier 2: go test -race (the unit tests -short leaves out) -run '$long_units'"
gotest tier2e -- -race -count=1 -timeout 15m -run "$long_units" ./internal/api/ ./internal/files/ ./internal/devcontainer/feature/ \
	|| fail "go test (the unit tests -short leaves out)"


# --- tier 3a: gVisor (runsc), over the engine's exec (runsc has no agent channel): the Docker driver's whole
# package (conformance, hardening probes with gVisor's answers, uids, quota, /tmp) and lifecycle's, then the
# library's and the CLI's runtime groups: what a runtime changes (posture, process trees, processes and concurrent
# commands (no subreaper but PID 1: supervisors mark their trees), output, exit status,
# files, devcontainer, the network refusal, the runtime the CLI asks for). Left out, each for its reason in
# docs/SECURITY.md, "gVisor": the builds (they never run under the sandbox runtime), the egress suites (no
# network under runsc: TestGVisorRefusesNetwork shows the refusal instead) and TestPortForwardChannel.
if [ "$SANDKEEP_RUNSC" = 1 ]; then
	runsc_env=("${docker_env[@]}" SANDKEEP_TEST_RUNTIME=runsc SANDKEEP_TRANSPORT=exec)
	t0=$SECONDS
	phase "tier 3: go test -race under gVisor (runsc): ./internal/driver/docker ./internal/engine/lifecycle"
	gotest runsc-conformance "${runsc_env[@]}" -- -race -count=1 -p 1 -timeout 30m -skip '^(TestBuild.*|TestEgress[A-Z].*)$' \
		./internal/driver/docker/ ./internal/engine/lifecycle/ || fail "go test (runsc, driver and lifecycle)"
	runsc_lib='^(TestRelayOnlyFromTheEngine|TestProcessUnavailable|TestProcessBesideCommands|TestProcessEnds|TestProcessTreesApart|TestConcurrentExec|TestGVisorRefusesNetwork|TestPosture|TestExitCodes|TestOutputStreams|TestOutputFloodIsBounded|TestTimeoutKillsWholeTree|TestNoDescendantOutlivesItsCommand|TestStoppedSandboxRestarts|TestRestartAdopts|TestFiles|TestDevcontainerAsWritten)$'
	phase "tier 3: go test -race under gVisor (runsc): the library's runtime group"
	gotest runsc-library "${runsc_env[@]}" -- -race -count=1 -timeout 30m -run "$runsc_lib" . || fail "go test (runsc, library)"
	runsc_cli='^(TestExecRuntime|TestExec|TestExecTimeout)$'
	phase "tier 3: go test -race under gVisor (runsc): the CLI's runtime group"
	gotest runsc-cli "${runsc_env[@]}" -- -race -count=1 -timeout 30m -run "$runsc_cli" ./cmd/sandkeep || fail "go test (runsc, CLI)"
	echo "tier 3a (runsc): $((SECONDS - t0))s"
fi


# The kubernetes stage ends before 2d: its tests build images with the Docker engine that 2d restarts.
if [ "$k8s_stage" = 1 ]; then
	if [ "${SANDKEEP_K8S_SERIAL:-0}" = 1 ]; then
		k8s_stage_start
	fi
	k8s_stage_wait
fi

# 2d, last and alone: a test that restarts the Docker daemon (every container stops), which would disturb any
# test running beside it (the kubernetes stage too: it has ended).
phase "tier 2: go test -race: the daemon restarts under a long-lived manager (alone)"
gotest tier2d "${docker_env[@]}" SANDKEEP_TEST_DAEMON_RESTART=1 -- -race -count=1 -timeout 10m -run '^TestDaemonRestart$' . \
	|| fail "go test (daemon restart)"

phase "OK"
