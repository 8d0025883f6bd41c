#!/usr/bin/env bash
# Runs a command against a throwaway PostgreSQL cluster that this script creates,
# starts on a private unix socket, and stops and deletes on exit (also on failure).
# The command sees ADTALLY_TEST_DATABASE_URL (a conninfo for database "postgres").
set -euo pipefail
. "$(dirname "$0")/test-postgres-lib.sh"
# The cluster trusts whoever reaches its socket, so only its owner may: the folder
# and the socket are mode 0700 (root, running the tests, gets in regardless).
root=$(mktemp -d /tmp/adtally-test-pg.XXXXXX)
chmod 700 "$root"
[ "$(id -u)" -eq 0 ] && chown postgres:postgres "$root"
cleanup() {
  # Replicas, and their primaries, a test started (scripts/test-replica.sh) and left running.
  for server in "$root"/replica-*/data "$root"/replica-*/primary; do
    [ -d "$server" ] && as_server "$bindir/pg_ctl" stop -D "$server" -m immediate -w >/dev/null 2>&1 || true
  done
  as_server "$bindir/pg_ctl" stop -D "$root/data" -m immediate -w >/dev/null 2>&1 || true
  rm -rf "$root"
}
trap cleanup EXIT
# Connections: the suite runs its tests in parallel, each server with pools of its own
# (ingest, reports, keys, the export leader, the report series): 300 ran out once.
start_test_cluster "$root/data" "$root/postgres.log" "$root" 5432 -c full_page_writes=off -c max_connections=1000
export ADTALLY_TEST_DATABASE_URL="host=$root port=5432 user=adtally dbname=postgres"
# Tests that check what PostgreSQL logged read it here.
export ADTALLY_TEST_POSTGRES_LOG="$root/postgres.log"
"$@"
