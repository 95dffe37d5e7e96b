#!/bin/sh
# The Docker sandbox backend's base image (grader/sandboxes/docker.py), built from Debian packages with no container
# registry: `debootstrap --variant=minbase` of bookworm from the Debian mirror this machine's apt uses, trimmed (no
# apt caches, lists, docs, man pages or translations), then `docker import`ed as $IMAGE.
#
#   deploy/sandbox-image/build.sh [--force]
#
# Idempotent: does nothing when $IMAGE exists, unless --force (or FORCE=1). Needs root and a running daemon
# (deploy/sandbox-image/ensure-dockerd.sh). The image holds what sandboxed commands expect: bash, coreutils,
# findutils, grep, sed, gawk, diffutils, tar, gzip, python3 (3.11, /usr/bin/python3), git, ca-certificates, procps.
set -eu

IMAGE=${IMAGE:-crucible-sandbox:bookworm}
SUITE=bookworm
PACKAGES=python3,git,ca-certificates,gawk,diffutils,findutils,procps
FORCE=${FORCE:-0}
[ "${1:-}" = "--force" ] && FORCE=1

if [ "$FORCE" != 1 ] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
	echo "$IMAGE: exists (--force rebuilds it)"
	exit 0
fi

# The mirror apt uses for the suite: deb822 sources (URIs:/Suites:) or one-line sources.list entries.
mirror() {
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -f "$f" ] || continue
		awk -v suite="$SUITE" '
			function flush() { if (uri != "" && suites ~ ("(^| )" suite "( |$)") && enabled != "no") { print uri; found = 1; exit } uri = ""; suites = ""; enabled = "" }
			/^[ \t]*$/ { flush(); next }
			/^URIs:/ { uri = $2 }
			/^Suites:/ { suites = $0; sub(/^Suites:[ \t]*/, "", suites) }
			/^Enabled:/ { enabled = $2 }
			END { if (!found) flush() }' "$f"
	done
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[ -f "$f" ] || continue
		awk -v suite="$SUITE" '$1 == "deb" { i = 2; if ($i ~ /^\[/) while ($i !~ /\]$/) i++; if ($i ~ /^\[/ || $i ~ /\]$/) i++; if ($(i + 1) == suite) { print $i; exit } }' "$f"
	done
}
MIRROR=${MIRROR:-$(mirror | head -n 1)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}

if ! command -v debootstrap >/dev/null 2>&1; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y -qq debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null; }
fi

ROOT=$(mktemp -d /var/tmp/crucible-sandbox-rootfs.XXXXXX)
trap 'rm -rf "$ROOT"' EXIT INT TERM
started=$(date +%s)
echo "$IMAGE: debootstrap $SUITE from $MIRROR"
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOT" "$MIRROR" >"$ROOT.log" 2>&1 || {
	tail -n 30 "$ROOT.log" >&2
	rm -f "$ROOT.log"
	exit 1
}
rm -f "$ROOT.log"

# Trim: nothing a sandboxed command needs, nothing that ages (package lists), no logs of the build.
rm -rf "$ROOT"/var/cache/apt/* "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/debconf/*-old "$ROOT"/var/log/* \
	"$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* "$ROOT"/usr/share/info/* "$ROOT"/usr/share/locale/* \
	"$ROOT"/usr/share/lintian "$ROOT"/usr/share/common-licenses "$ROOT"/tmp/* "$ROOT"/var/tmp/*
find "$ROOT"/usr/lib/python3* -name __pycache__ -type d -prune -exec rm -rf {} +
mkdir -p "$ROOT"/run/crucible
# Mount points sandboxes commonly get (targets that do not exist are created by the engine; these save it the work).
mkdir -p "$ROOT"/app

for tool in bash ls find grep sed gawk diff tar gzip python3 git; do
	chroot "$ROOT" /usr/bin/env PATH=/usr/local/bin:/usr/bin:/bin sh -c "command -v $tool >/dev/null" || { echo "$IMAGE: $tool missing" >&2; exit 1; }
done
chroot "$ROOT" /usr/bin/python3 -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version'

tar --numeric-owner -C "$ROOT" -c . | docker import \
	--change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' --change 'ENV LANG=C.UTF-8' --change 'WORKDIR /' \
	--message "crucible sandbox: debootstrap --variant=minbase $SUITE + $PACKAGES" - "$IMAGE" >/dev/null
echo "$IMAGE: built in $(( $(date +%s) - started ))s, $(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{ printf "%.0f MB", $1 / 1e6 }')"
