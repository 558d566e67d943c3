#!/usr/bin/env bash
# chromium-up.sh — make sure Debian's chromium is installed, for the dashboard's browser tests (internal/ui).
# Idempotent: does nothing when chromium is already on PATH. Prints the browser's path on stdout.
set -euo pipefail

if ! command -v chromium >/dev/null 2>&1; then
	echo "chromium-up: installing Debian's chromium" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >&2 \
		|| { apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >&2; }
fi
command -v chromium
