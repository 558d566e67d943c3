#!/usr/bin/env bash
# build-image.sh [TAG] — build the default runnable sandbox image (sandkeep-busybox:latest) without pulling.
#
# FROM scratch: static busybox at /bin/busybox, a symlink in /bin for every applet, /etc/passwd and /etc/group
# with root and `sandbox` (uid/gid 1000, home /home/sandbox), empty /tmp (1777) and /workspace (owned by sandbox).
# Idempotent: the image carries a label with a hash of its inputs; when an image with that tag and hash already
# exists nothing is built.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

TAG=${1:-sandkeep-busybox:latest}
say() { printf 'build-image: %s\n' "$*"; }
die() { printf 'build-image: ERROR: %s\n' "$*" >&2; exit 1; }

docker info >/dev/null 2>&1 || die "Docker engine not reachable; run scripts/docker-up.sh"

BUSYBOX=${BUSYBOX:-/bin/busybox}
[ -x "$BUSYBOX" ] || BUSYBOX=$(command -v busybox || true)
[ -n "$BUSYBOX" ] && [ -x "$BUSYBOX" ] || die "busybox not found; install busybox-static (scripts/docker-up.sh does)"
# A FROM scratch image has no dynamic loader: the binary must be static (no PT_INTERP / INTERP segment).
if command -v readelf >/dev/null 2>&1; then
	readelf -lW "$BUSYBOX" | grep -q 'INTERP' && die "$BUSYBOX is dynamically linked; install busybox-static"
elif command -v file >/dev/null 2>&1; then
	file -L "$BUSYBOX" | grep -q 'dynamically linked' && die "$BUSYBOX is dynamically linked; install busybox-static"
fi

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
root=$ctx/rootfs
mkdir -p "$root/bin" "$root/etc" "$root/root" "$root/tmp" "$root/usr/bin" "$ctx/home-sandbox" "$ctx/workspace"
cp "$BUSYBOX" "$root/bin/busybox"
chmod 0755 "$root/bin/busybox"
chmod 0700 "$root/root"
chmod 1777 "$root/tmp"
"$BUSYBOX" --list | while IFS= read -r applet; do
	case "$applet" in '' | busybox | */*) continue ;; esac
	ln -s /bin/busybox "$root/bin/$applet"
done
ln -s /bin/busybox "$root/usr/bin/env"
cat >"$root/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/bin/sh
sandbox:x:1000:1000:sandbox:/home/sandbox:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
PASSWD
cat >"$root/etc/group" <<'GROUP'
root:x:0:
sandbox:x:1000:
nogroup:x:65534:
GROUP
cat >"$ctx/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY rootfs/ /
COPY --chown=1000:1000 home-sandbox/ /home/sandbox/
COPY --chown=1000:1000 workspace/ /workspace/
CMD ["/bin/sh"]
DOCKERFILE

# The hash of everything that goes into the image (busybox, Dockerfile, /etc files, applet list).
inputs=$( { sha256sum "$BUSYBOX" | cut -d' ' -f1; cat "$ctx/Dockerfile" "$root/etc/passwd" "$root/etc/group"; ls "$root/bin"; } | sha256sum | cut -d' ' -f1)
have=$(docker image inspect --format '{{ index .Config.Labels "io.sandkeep.image.inputs" }}' "$TAG" 2>/dev/null || true)
if [ "$have" = "$inputs" ]; then
	say "$TAG is up to date ($(docker image inspect --format '{{.Id}}' "$TAG"))"
	exit 0
fi

say "building $TAG"
# DOCKER_BUILDKIT=0: the classic builder, present in every engine; a newer CLI without buildx would otherwise refuse.
DOCKER_BUILDKIT=0 docker build --pull=false -q --label "io.sandkeep.image.inputs=$inputs" -t "$TAG" "$ctx" >/dev/null \
	|| die "docker build of $TAG failed"
say "built $TAG ($(docker image inspect --format '{{.Id}}' "$TAG"))"
