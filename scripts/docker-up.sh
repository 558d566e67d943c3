#!/usr/bin/env bash
# docker-up.sh — make sure a Docker engine answers and busybox-static is installed.
#
# Idempotent and fast when everything is already there:
#   - busybox-static is installed when missing (tests build FROM scratch images around /bin/busybox);
#   - if `docker info` works, nothing else happens;
#   - otherwise docker.io is installed when missing, dockerd is started detached (log:
#     /var/log/sandkeep-dockerd.log) and we wait up to 60 s for `docker info` to succeed;
#   - with SANDKEEP_RUNSC=1, Debian's runsc (gVisor) is installed when missing and registered as the Docker
#     runtime "runsc" in /etc/docker/daemon.json (runtimeArgs --network=host, --oci-seccomp: gVisor's own netstack
#     cannot serve network mode none, and sandkeep's seccomp profile applies inside gVisor too). dockerd is
#     reloaded (SIGHUP: running containers are not touched) only when the file changed.
# Fails loudly, with the tail of the daemon log, when the engine does not come up.
set -euo pipefail

DOCKERD_LOG=${SANDKEEP_DOCKERD_LOG:-/var/log/sandkeep-dockerd.log}
WAIT_SECONDS=${SANDKEEP_DOCKERD_WAIT:-60}

say() { printf 'docker-up: %s\n' "$*"; }
die() { printf 'docker-up: ERROR: %s\n' "$*" >&2; exit 1; }

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
	if command -v sudo >/dev/null 2>&1; then SUDO=(sudo); else SUDO=(false); fi
fi

apt_updated=0
apt_install() {
	command -v apt-get >/dev/null 2>&1 || die "need to install $*, but apt-get is not available"
	if [ "$apt_updated" -eq 0 ]; then
		say "apt-get update"
		"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq || die "apt-get update failed"
		apt_updated=1
	fi
	say "apt-get install $*"
	"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" \
		|| die "apt-get install $* failed"
}

pkg_installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

docker_ok() { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; }

# dockerd_running: is a process named dockerd alive? (/proc scan: procps may not be installed.)
dockerd_running() {
	local f
	for f in /proc/[0-9]*/comm; do
		[ "$(cat "$f" 2>/dev/null)" = dockerd ] && return 0
	done
	return 1
}

# 1. busybox-static: always needed by the tests, whether or not Docker already runs.
if ! pkg_installed busybox-static; then
	apt_install busybox-static
fi
[ -x /bin/busybox ] || die "busybox-static is installed but /bin/busybox is missing"

# runsc_registered: does the running engine list the runsc runtime?
runsc_registered() { docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; }

# ensure_runsc: with SANDKEEP_RUNSC=1, install runsc and register it with the running engine, idempotently.
ensure_runsc() {
	[ "${SANDKEEP_RUNSC:-}" = 1 ] || return 0
	pkg_installed runsc || apt_install runsc
	local runsc daemon_json=/etc/docker/daemon.json
	runsc=$(command -v runsc) || die "runsc is installed but not on PATH"
	if runsc_registered; then
		say "runsc runtime registered ($runsc)"
		return 0
	fi
	command -v python3 >/dev/null 2>&1 || die "need python3 to edit $daemon_json"
	"${SUDO[@]}" mkdir -p "$(dirname "$daemon_json")"
	# Merge, keeping whatever else the file says; write only when the runsc entry differs.
	changed=$("${SUDO[@]}" python3 - "$daemon_json" "$runsc" <<'PY'
import json, os, sys
path, runsc = sys.argv[1], sys.argv[2]
try:
    with open(path) as f:
        cfg = json.load(f)
except FileNotFoundError:
    cfg = {}
want = {"path": runsc, "runtimeArgs": ["--network=host", "--oci-seccomp"]}
if cfg.get("runtimes", {}).get("runsc") == want:
    print("no")
    sys.exit(0)
cfg.setdefault("runtimes", {})["runsc"] = want
tmp = path + ".sandkeep-tmp"
with open(tmp, "w") as f:
    json.dump(cfg, f, indent=2)
    f.write("\n")
os.replace(tmp, path)
print("yes")
PY
) || die "could not update $daemon_json"
	if [ "$changed" = yes ] || ! runsc_registered; then
		local pid f
		for f in /proc/[0-9]*/comm; do
			if [ "$(cat "$f" 2>/dev/null)" = dockerd ]; then
				pid=${f#/proc/}
				pid=${pid%/comm}
			fi
		done
		[ -n "${pid:-}" ] || die "dockerd is not running; cannot reload it to register runsc"
		say "reloading dockerd (SIGHUP, pid $pid) to register runsc"
		"${SUDO[@]}" kill -HUP "$pid"
		for ((i = 0; i < 20; i++)); do
			runsc_registered && break
			sleep 0.5
		done
	fi
	runsc_registered || die "dockerd did not pick up the runsc runtime from $daemon_json"
	say "runsc runtime registered ($runsc)"
}

# 2. Docker engine.
if docker_ok; then
	say "Docker engine is up ($(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?'))"
	ensure_runsc
	exit 0
fi

if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
	apt_install docker.io
	# On hosts with an init system, the package may have started the daemon itself.
	if docker_ok; then
		say "Docker engine is up (started by the package)"
		ensure_runsc
		exit 0
	fi
fi

started_pid=
if dockerd_running; then
	say "dockerd is already running but not answering yet; waiting"
else
	say "starting dockerd (log: $DOCKERD_LOG)"
	"${SUDO[@]}" mkdir -p "$(dirname "$DOCKERD_LOG")"
	# setsid + nohup + no inherited stdio: the daemon outlives this script and its session.
	"${SUDO[@]}" setsid nohup dockerd >>"$DOCKERD_LOG" 2>&1 </dev/null &
	started_pid=$!
	disown || true
fi

for ((i = 0; i < WAIT_SECONDS; i++)); do
	if docker_ok; then
		say "Docker engine is up after ${i}s ($(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?'))"
		ensure_runsc
		exit 0
	fi
	if [ -n "$started_pid" ] && ! kill -0 "$started_pid" 2>/dev/null; then
		printf 'docker-up: ERROR: dockerd exited. Last lines of %s:\n' "$DOCKERD_LOG" >&2
		tail -n 40 "$DOCKERD_LOG" >&2 2>/dev/null || true
		exit 1
	fi
	sleep 1
done

printf 'docker-up: ERROR: Docker engine did not answer within %ss. Last lines of %s:\n' "$WAIT_SECONDS" "$DOCKERD_LOG" >&2
tail -n 40 "$DOCKERD_LOG" >&2 2>/dev/null || true
printf -- '--- docker info:\n' >&2
docker info >&2 2>&1 || true
exit 1
