#!/usr/bin/env bash
# Runs a command against a throwaway three-node Citus cluster on loopback: a
# coordinator and two workers, each a PostgreSQL cluster created here, started with
# citus preloaded (and hll created), and stopped and deleted on exit (also on failure).
# Needs the Citus extension installed for the server's major version (DEVELOPERS.md
# says how to build it); exits 77 when it is not, so a caller can say it skipped.
# The nodes listen on 127.0.0.1 (Citus's nodes connect to each other over TCP) and
# take a password there, generated here (scram-sha-256): any local user can reach a
# loopback port, and a superuser can run programs as the server's user. The password
# is in a pgpass file only the server's user (and root) can read; the nodes use it to
# reach each other, the command through PGPASSFILE.
# The command sees ADTALLY_CITUS_COORDINATOR (a conninfo for database "adtally" on the
# coordinator) and ADTALLY_CITUS_SETUP_VARS, the psql arguments that name these nodes to
# deploy/citus-setup.sql, which registers the workers (they are not registered yet):
#   psql "$ADTALLY_CITUS_COORDINATOR" -v ON_ERROR_STOP=1 $ADTALLY_CITUS_SETUP_VARS -f deploy/citus-setup.sql
set -euo pipefail
bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
libdir=$("$bindir/pg_config" --pkglibdir 2>/dev/null || true)
if [ -z "$libdir" ] || [ ! -f "$libdir/citus.so" ]; then
  echo "Citus is not installed for $("$bindir/postgres" --version 2>/dev/null || echo PostgreSQL): skipped (DEVELOPERS.md: building Citus)" >&2
  exit 77
fi
if [ ! -f "$("$bindir/pg_config" --sharedir)/extension/hll.control" ]; then
  echo "the hll extension is not installed (make deps installs it): skipped" >&2
  exit 77
fi
root=$(mktemp -d /tmp/adtally-citus.XXXXXX)
chmod 700 "$root"
as_server() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
[ "$(id -u)" -eq 0 ] && chown postgres:postgres "$root"
ports=()
for _ in 0 1 2; do
  ports+=("$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')")
done
cleanup() {
  for node in 0 1 2; do
    [ -d "$root/node$node" ] && as_server "$bindir/pg_ctl" stop -D "$root/node$node" -m immediate -w >/dev/null 2>&1 || true
  done
  rm -rf "$root"
}
trap cleanup EXIT
password=$(python3 -c 'import secrets; print(secrets.token_hex(24))')
(umask 077; printf '%s\n' "$password" >"$root/password"; printf '127.0.0.1:*:*:adtally:%s\n' "$password" >"$root/pgpass")
[ "$(id -u)" -eq 0 ] && chown postgres:postgres "$root/password" "$root/pgpass"
export PGPASSFILE="$root/pgpass"
for node in 0 1 2; do
  as_server "$bindir/initdb" -D "$root/node$node" -U adtally --auth-local=trust --auth-host=scram-sha-256 \
    --pwfile="$root/password" -E UTF8 --locale=C.UTF-8 --no-instructions >/dev/null
  as_server env PGPASSFILE="$root/pgpass" "$bindir/pg_ctl" start -w -D "$root/node$node" -l "$root/node$node.log" \
    -o "-c listen_addresses=127.0.0.1 -c port=${ports[$node]} -c unix_socket_directories='$root' -c shared_preload_libraries=citus -c fsync=off -c synchronous_commit=off -c max_connections=300 -c max_prepared_transactions=100" >/dev/null
  psql -h 127.0.0.1 -p "${ports[$node]}" -U adtally -d postgres -qAt -v ON_ERROR_STOP=1 \
    -c "CREATE DATABASE adtally" >/dev/null
  psql -h 127.0.0.1 -p "${ports[$node]}" -U adtally -d adtally -qAt -v ON_ERROR_STOP=1 \
    -c "CREATE EXTENSION citus" -c "CREATE EXTENSION IF NOT EXISTS hll" >/dev/null
done
coordinator="host=127.0.0.1 port=${ports[0]} user=adtally dbname=adtally passfile=$root/pgpass"
export ADTALLY_CITUS_COORDINATOR="$coordinator"
export ADTALLY_CITUS_SETUP_VARS="-v coordinator_host=127.0.0.1 -v coordinator_port=${ports[0]} -v worker1_host=127.0.0.1 -v worker1_port=${ports[1]} -v worker2_host=127.0.0.1 -v worker2_port=${ports[2]}"
"$@"
