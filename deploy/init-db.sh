#!/usr/bin/env bash
# Creates one database and one role per service. The hidden test store is not here: it runs in its own
# container (teststore-db) on the grading network, and only the grader's environment holds its password.
set -euo pipefail
create() {  # name password
  psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" <<SQL
CREATE ROLE $1 LOGIN PASSWORD '$2';
CREATE DATABASE $1 OWNER $1;
REVOKE ALL ON DATABASE $1 FROM PUBLIC;
SQL
}
create gateway "$GATEWAY_DB_PASSWORD"
create ledger "$LEDGER_DB_PASSWORD"
create trainer "$TRAINER_DB_PASSWORD"
create inference "$INFERENCE_DB_PASSWORD"
create grader "$GRADER_DB_PASSWORD"
