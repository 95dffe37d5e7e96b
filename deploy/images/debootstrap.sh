#!/bin/sh
# Images built from Debian packages with no container registry: `debootstrap --variant=minbase` of bookworm from the
# Debian mirror this machine's apt uses, trimmed (no apt caches, lists, docs, man pages or translations), then
# `docker import`ed. Needs root and a running daemon (deploy/images/ensure-dockerd.sh).
#
#   deploy/images/debootstrap.sh [--force] NAME...
#
# NAME:
#   sandbox   crucible-sandbox:bookworm   the Docker sandbox backend's image (grader/sandboxes/docker.py): bash,
#             coreutils, findutils, grep, sed, gawk, diffutils, tar, gzip, python3 (3.11), git, ca-certificates, procps
#   python    crucible-python:3.11-bookworm   deploy/Dockerfile's base where no registry is reachable
#             (`--build-arg BASE_IMAGE=crucible-python:3.11-bookworm`): python3 (3.11) with venv, ca-certificates and
#             this host's locally trusted CAs (/usr/local/share/ca-certificates, e.g. a TLS-intercepting proxy's, so
#             pip and apt in a build reach the registries the host reaches)
#   postgres  crucible-postgres:15-bookworm   PostgreSQL 15 with the official image's entrypoint contract
#             (POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB, /docker-entrypoint-initdb.d/*.sh; postgres-entrypoint.sh)
#   redis     crucible-redis:7-bookworm   redis-server 7 (and redis-cli)
#
# Idempotent: an image that exists is kept, unless --force (or FORCE=1). Downloaded packages are cached in
# $CACHE_DIR between builds.
set -eu

FORCE=${FORCE:-0}
[ "${1:-}" = "--force" ] && { FORCE=1; shift; }
[ $# -gt 0 ] || { echo "usage: $0 [--force] sandbox|python|postgres|redis..." >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
SUITE=bookworm
CACHE_DIR=${CACHE_DIR:-/var/cache/crucible-debootstrap}

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

# build IMAGE PACKAGES TOOLS CHANGES...: debootstrap with PACKAGES, run customize_$NAME on the tree, check that every
# command of TOOLS runs, import with the Dockerfile CHANGES.
build() {
	name=$1 image=$2 packages=$3 tools=$4
	shift 4
	if [ "$FORCE" != 1 ] && docker image inspect "$image" >/dev/null 2>&1; then
		echo "$image: exists (--force rebuilds it)"
		return 0
	fi
	root=$(mktemp -d /var/tmp/crucible-rootfs.XXXXXX)
	trap 'rm -rf "$root" "$root.log"' EXIT INT TERM
	started=$(date +%s)
	mkdir -p "$CACHE_DIR"
	echo "$image: debootstrap $SUITE (+ $packages) from $MIRROR"
	debootstrap --variant=minbase --cache-dir="$CACHE_DIR" --include="$packages" "$SUITE" "$root" "$MIRROR" >"$root.log" 2>&1 || {
		tail -n 30 "$root.log" >&2
		exit 1
	}
	"customize_$name" "$root"
	# Trim: nothing a container needs, nothing that ages (package lists), no logs of the build.
	rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/var/cache/debconf/*-old "$root"/var/log/* \
		"$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* \
		"$root"/usr/share/lintian "$root"/usr/share/common-licenses "$root"/tmp/* "$root"/var/tmp/*
	find "$root"/usr/lib/python3* -name __pycache__ -type d -prune -exec rm -rf {} + 2>/dev/null || true
	for tool in $tools; do
		chroot "$root" /usr/bin/env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/lib/postgresql/15/bin sh -c "command -v $tool >/dev/null" \
			|| { echo "$image: $tool missing" >&2; exit 1; }
	done
	set -- --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' --change 'ENV LANG=C.UTF-8' "$@"
	tar --numeric-owner -C "$root" -c . | docker import "$@" --message "crucible $name: debootstrap --variant=minbase $SUITE + $packages" - "$image" >/dev/null
	rm -rf "$root" "$root.log"
	trap - EXIT INT TERM
	echo "$image: built in $(( $(date +%s) - started ))s, $(docker image inspect -f '{{.Size}}' "$image" | awk '{ printf "%.0f MB", $1 / 1e6 }')"
}

customize_sandbox() {
	mkdir -p "$1"/run/crucible "$1"/app  # mount points sandboxes get (the engine would create them)
	chroot "$1" /usr/bin/python3 -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version'
}

customize_python() {
	# The host's locally trusted CAs, trusted inside too (update-ca-certificates rebuilds the bundle pip and apt read).
	if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
		cp /usr/local/share/ca-certificates/*.crt "$1"/usr/local/share/ca-certificates/
		chroot "$1" update-ca-certificates >/dev/null 2>&1
	fi
	cp /etc/apt/sources.list.d/*.sources "$1"/etc/apt/sources.list.d/ 2>/dev/null || true
	chroot "$1" /usr/bin/python3 -c 'import sys, venv; assert sys.version_info[:2] == (3, 11), sys.version'
}

customize_postgres() {
	install -m 0755 "$HERE/postgres-entrypoint.sh" "$1"/usr/local/bin/docker-entrypoint.sh
	mkdir -p "$1"/docker-entrypoint-initdb.d "$1"/var/lib/postgresql/data "$1"/var/run/postgresql
	chroot "$1" chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql
	# Debian's package made a cluster of its own in /var/lib/postgresql/15/main: the entrypoint makes the real one.
	rm -rf "$1"/var/lib/postgresql/15 "$1"/etc/postgresql/15
}

customize_redis() { mkdir -p "$1"/data && chroot "$1" chown redis:redis /data; }

for name in "$@"; do
	case "$name" in
	sandbox) build sandbox crucible-sandbox:bookworm python3,git,ca-certificates,gawk,diffutils,findutils,procps \
		"bash ls find grep sed gawk diff tar gzip python3 git" --change 'WORKDIR /' ;;
	python) build python crucible-python:3.11-bookworm python3,python3-venv,ca-certificates,passwd,procps "bash python3 useradd" --change 'WORKDIR /' ;;
	postgres) build postgres crucible-postgres:15-bookworm postgresql-15,procps "bash initdb postgres psql pg_isready pg_dump pg_restore" \
		--change 'ENV PGDATA=/var/lib/postgresql/data' --change 'ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
		--change 'EXPOSE 5432' --change 'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]' \
		--change 'CMD ["postgres"]' ;;
	redis) build redis crucible-redis:7-bookworm redis-server "redis-server redis-cli" --change 'WORKDIR /data' --change 'EXPOSE 6379' \
		--change 'USER redis' --change 'CMD ["redis-server", "--protected-mode", "no"]' ;;
	*) echo "$0: unknown image $name" >&2; exit 2 ;;
	esac
done
