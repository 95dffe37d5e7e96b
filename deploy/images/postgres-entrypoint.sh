#!/bin/bash
# PostgreSQL's container entrypoint for crucible-postgres (deploy/images/debootstrap.sh postgres), keeping the
# official image's contract that docker-compose.yml relies on: on an empty $PGDATA, initdb with the superuser
# $POSTGRES_USER (default postgres) and password $POSTGRES_PASSWORD (required), create $POSTGRES_DB, run every
# /docker-entrypoint-initdb.d/*.sh (sourced environment: POSTGRES_USER, PGPASSWORD unset; a local socket server)
# and *.sql once; then run `postgres` as the postgres user, listening on every address, scram-sha-256 passwords
# required from the network. A data directory that is already initialised is used as it is.
set -euo pipefail

if [ "${1:-postgres}" != postgres ]; then
	exec "$@"
fi
shift || true
: "${PGDATA:=/var/lib/postgresql/data}"
: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
export PGDATA POSTGRES_USER POSTGRES_DB

as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"; }

if [ "$(id -u)" = 0 ]; then
	mkdir -p "$PGDATA" /var/run/postgresql
	chown -R postgres:postgres "$PGDATA" /var/run/postgresql
	chmod 0700 "$PGDATA"
fi

if [ ! -s "$PGDATA/PG_VERSION" ]; then
	if [ -z "${POSTGRES_PASSWORD:-}" ]; then
		echo "postgres: POSTGRES_PASSWORD is required to initialise the database" >&2
		exit 1
	fi
	pwfile=$(mktemp)
	printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
	chown postgres "$pwfile"
	as_postgres initdb --username="$POSTGRES_USER" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
		--encoding=UTF8 --locale=C.UTF-8 >/dev/null
	rm -f "$pwfile"
	printf "listen_addresses = '*'\n" >>"$PGDATA/postgresql.conf"
	printf 'host all all all scram-sha-256\n' >>"$PGDATA/pg_hba.conf"
	# A server on the local socket only, for the initialisation scripts.
	as_postgres pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
	if [ "$POSTGRES_DB" != postgres ]; then
		as_postgres psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres -v db="$POSTGRES_DB" <<<'CREATE DATABASE :"db";'
	fi
	for f in /docker-entrypoint-initdb.d/*; do
		case "$f" in
		*.sh) echo "postgres: running $f"; (cd /tmp && as_postgres env POSTGRES_USER="$POSTGRES_USER" bash "$f") ;;
		*.sql) echo "postgres: running $f"; as_postgres psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" -f "$f" ;;
		esac
	done
	as_postgres pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
	echo "postgres: initialised $PGDATA"
fi

if [ "$(id -u)" = 0 ]; then
	exec setpriv --reuid=postgres --regid=postgres --init-groups -- postgres "$@"
fi
exec postgres "$@"
