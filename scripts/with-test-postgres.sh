#!/usr/bin/env bash
# Runs a command against a throwaway PostgreSQL cluster that this script creates,
# starts on a private unix socket, and stops and deletes on exit (also on failure).
# The command sees ADTALLY_TEST_DATABASE_URL (a conninfo for database "postgres").
set -euo pipefail
bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
if [ -z "$bindir" ] || [ ! -x "$bindir/initdb" ]; then
  echo "PostgreSQL server programs not found; install the Debian package 'postgresql'" >&2
  exit 1
fi
# The cluster trusts whoever reaches its socket, so only its owner may: the folder
# and the socket are mode 0700 (root, running the tests, gets in regardless).
root=$(mktemp -d /tmp/adtally-test-pg.XXXXXX)
chmod 700 "$root"
as_server() {
  # PostgreSQL refuses to run as root; as root, run it as the postgres user.
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
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
as_server "$bindir/initdb" -D "$root/data" -U adtally -A trust -E UTF8 --locale=C.UTF-8 --no-instructions >/dev/null
# Durability of the throwaway cluster itself is not under test: skip fsync for speed.
# Connections: the suite runs its tests in parallel, each server with pools of its own
# (ingest, reports, keys, the export leader, the report series): 300 ran out once.
as_server "$bindir/pg_ctl" start -w -D "$root/data" -l "$root/postgres.log" \
  -o "-c listen_addresses='' -c unix_socket_directories='$root' -c unix_socket_permissions=0700 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=1000" >/dev/null
export ADTALLY_TEST_DATABASE_URL="host=$root port=5432 user=adtally dbname=postgres"
# Tests that check what PostgreSQL logged read it here.
export ADTALLY_TEST_POSTGRES_LOG="$root/postgres.log"
"$@"
