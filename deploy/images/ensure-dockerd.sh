#!/bin/sh
# A Docker daemon answering on this machine, for the grader's Docker sandbox backend (grader/sandboxes/docker.py):
# installs Debian's docker.io when dockerd is missing, starts dockerd in the background when it is not running (as
# root; log in /var/log/dockerd.log), and waits until `docker info` answers. Idempotent: does nothing when the
# daemon already answers.
set -eu

WAIT_S=${DOCKERD_WAIT_S:-60}
LOG=${DOCKERD_LOG:-/var/log/dockerd.log}

answers() { docker info >/dev/null 2>&1; }

if answers; then
	echo "dockerd: running"
	exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
	echo "dockerd: installing Debian's docker.io"
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y -qq docker.io >/dev/null || { apt-get update -qq && apt-get install -y -qq docker.io >/dev/null; }
fi

if ! pgrep -x dockerd >/dev/null 2>&1; then
	echo "dockerd: starting (log: $LOG)"
	mkdir -p "$(dirname "$LOG")"
	# setsid: the daemon outlives this script and the shell that ran it
	setsid dockerd >>"$LOG" 2>&1 </dev/null &
fi

i=0
while ! answers; do
	i=$((i + 1))
	if [ "$i" -gt "$WAIT_S" ]; then
		echo "dockerd: not answering after ${WAIT_S}s; see $LOG" >&2
		tail -n 20 "$LOG" >&2 || true
		exit 1
	fi
	sleep 1
done
echo "dockerd: running"
