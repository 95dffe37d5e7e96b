#!/usr/bin/env bash
# Creates one database and one role per service. The hidden test store is not here: it runs in its own
# container (teststore-db) on the grading network, and only the grader's environment holds its password.
# Runs once, when the postgres volume is first initialised (docker-entrypoint-initdb.d).
set -euo pipefail
create() {  # name password: the password goes through a psql variable, so any character is safe
  psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres -v name="$1" -v pw="$2" <<'SQL'
CREATE ROLE :"name" LOGIN PASSWORD :'pw';
CREATE DATABASE :"name" OWNER :"name";
REVOKE ALL ON DATABASE :"name" FROM PUBLIC;
SQL
}
create gateway "$GATEWAY_DB_PASSWORD"
create ledger "$LEDGER_DB_PASSWORD"
create trainer "$TRAINER_DB_PASSWORD"
create inference "$INFERENCE_DB_PASSWORD"
create grader "$GRADER_DB_PASSWORD"
