#!/usr/bin/env bash
# postgres-up.sh — make sure a local PostgreSQL answers on 127.0.0.1 for the store tests, then print its DSN.
#
#   dsn=$(bash scripts/postgres-up.sh)    # progress on stderr, the DSN alone on stdout
#
# Idempotent, and a no-op when everything is already there:
#   - Debian's postgresql is installed when missing (apt-get update once);
#   - the newest installed major version's cluster (created when there is none) listens on 127.0.0.1 only
#     (conf.d/sandkeep.conf; the cluster restarts only when that file changes);
#   - the cluster is started when it is not running, and we wait (bounded) until pg_isready succeeds;
#   - role sandkeep (password sandkeep, CREATEDB) and database sandkeep_test are created when missing.
# Loopback only: the role's password is public, so the server must never listen beyond 127.0.0.1.
set -euo pipefail

ROLE=sandkeep
PASSWORD=sandkeep
DATABASE=sandkeep_test
HOST=127.0.0.1
WAIT_SECONDS=${SANDKEEP_POSTGRES_WAIT:-60}

say() { printf 'postgres-up: %s\n' "$*" >&2; }
die() { printf 'postgres-up: ERROR: %s\n' "$*" >&2; exit 1; }

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
	if command -v sudo >/dev/null 2>&1; then SUDO=(sudo); else SUDO=(false); fi
fi

# as_postgres: run a command as the postgres OS user (peer authentication over the Unix socket).
as_postgres() {
	# From /: the caller's directory (a 0700 temp dir, say) may be closed to the postgres user.
	if [ "$(id -u)" -eq 0 ]; then
		(cd / && runuser -u postgres -- "$@")
	else
		(cd / && sudo -u postgres -- "$@")
	fi
}

apt_updated=0
apt_install() {
	command -v apt-get >/dev/null 2>&1 || die "need to install $*, but apt-get is not available"
	if [ "$apt_updated" -eq 0 ]; then
		say "apt-get update"
		"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || die "apt-get update failed"
		apt_updated=1
	fi
	say "apt-get install $*"
	"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2 \
		|| die "apt-get install $* failed"
}

pkg_installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

# 1. The server.
if ! pkg_installed postgresql || ! command -v pg_ctlcluster >/dev/null 2>&1; then
	apt_install postgresql
fi

# 2. The cluster: the newest installed major version's first cluster; one is created when there is none.
major=$(find /usr/lib/postgresql -mindepth 1 -maxdepth 1 -type d -printf '%f\n' 2>/dev/null | sort -n | tail -n 1)
[ -n "$major" ] || die "postgresql is installed but /usr/lib/postgresql has no version"
cluster=$(pg_lsclusters -h 2>/dev/null | awk -v v="$major" '$1 == v { print $2; exit }')
if [ -z "$cluster" ]; then
	cluster=main
	say "creating cluster $major/$cluster"
	"${SUDO[@]}" pg_createcluster "$major" "$cluster" >&2 || die "pg_createcluster $major $cluster failed"
fi
cluster_field() { pg_lsclusters -h 2>/dev/null | awk -v v="$major" -v c="$cluster" '$1 == v && $2 == c { print $'"$1"' }'; }
port=$(cluster_field 3)
[ -n "$port" ] || die "cannot read the port of cluster $major/$cluster"

# 3. Loopback only.
conf=/etc/postgresql/$major/$cluster/conf.d/sandkeep.conf
want_conf="# Written by sandkeep's scripts/postgres-up.sh: the test role's password is public, listen on loopback only.
listen_addresses = '$HOST'"
conf_changed=0
if [ "$(cat "$conf" 2>/dev/null)" != "$want_conf" ]; then
	say "writing $conf (listen_addresses = '$HOST')"
	"${SUDO[@]}" mkdir -p "$(dirname "$conf")"
	printf '%s\n' "$want_conf" | "${SUDO[@]}" tee "$conf" >/dev/null
	conf_changed=1
fi

# 4. Running.
status=$(cluster_field 4)
if [ "$status" != online ]; then
	say "starting cluster $major/$cluster (log: /var/log/postgresql/postgresql-$major-$cluster.log)"
	"${SUDO[@]}" pg_ctlcluster "$major" "$cluster" start >&2 \
		|| "${SUDO[@]}" service postgresql start >&2 \
		|| die "could not start cluster $major/$cluster; see /var/log/postgresql/postgresql-$major-$cluster.log"
elif [ "$conf_changed" -eq 1 ]; then
	say "restarting cluster $major/$cluster for the new listen address"
	"${SUDO[@]}" pg_ctlcluster "$major" "$cluster" restart >&2 || die "could not restart cluster $major/$cluster"
fi

deadline=$((SECONDS + WAIT_SECONDS))
until pg_isready -q -h "$HOST" -p "$port"; do
	if [ "$SECONDS" -ge "$deadline" ]; then
		tail -n 20 "/var/log/postgresql/postgresql-$major-$cluster.log" >&2 2>/dev/null || true
		die "PostgreSQL on $HOST:$port not ready after ${WAIT_SECONDS}s"
	fi
	sleep 0.5
done

# 5. Role and database.
psql_q() { as_postgres psql -p "$port" -X -q -t -A -v ON_ERROR_STOP=1 -d postgres -c "$1"; }
if [ "$(psql_q "SELECT 1 FROM pg_roles WHERE rolname = '$ROLE'")" != 1 ]; then
	say "creating role $ROLE"
	psql_q "CREATE ROLE $ROLE LOGIN CREATEDB PASSWORD '$PASSWORD'" >&2 || die "could not create role $ROLE"
fi
if [ "$(psql_q "SELECT 1 FROM pg_database WHERE datname = '$DATABASE'")" != 1 ]; then
	say "creating database $DATABASE"
	psql_q "CREATE DATABASE $DATABASE OWNER $ROLE" >&2 || die "could not create database $DATABASE"
fi

say "PostgreSQL $major is up on $HOST:$port"
printf 'postgres://%s:%s@%s:%s/%s?sslmode=disable\n' "$ROLE" "$PASSWORD" "$HOST" "$port" "$DATABASE"
