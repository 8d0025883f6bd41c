#!/usr/bin/env bash
# A streaming replica for the replica test, of a primary of its own:
#   test-replica.sh start DIR PRIMARY_PORT PORT
#     initdb of a throwaway primary in DIR/primary, started on a unix socket in DIR
#     with port PRIMARY_PORT; pg_basebackup -R of it into DIR/data, started as a hot
#     standby on a unix socket in DIR with port PORT (prints nothing on success);
#   test-replica.sh stop-replica DIR
#     stops the replica only (the primary goes on);
#   test-replica.sh stop DIR
#     stops both and deletes DIR.
# The primary is not the suite's shared cluster: a replica of that one replays every
# test's WAL, and under a loaded CI run it lagged past the test's bound for minutes
# (a 180 s wait ran out). with-test-postgres.sh stops any left under its folder.
set -euo pipefail
. "$(dirname "$0")/test-postgres-lib.sh"
case "${1:-}" in
start)
  dir=$2 primary_port=$3 port=$4
  mkdir -p "$dir"
  chmod 700 "$dir"
  [ "$(id -u)" -eq 0 ] && chown postgres:postgres "$dir"
  # The few connections one test's server opens; the replica needs max_connections
  # at least the primary's. Full-page writes on: a base backup forces them anyway.
  start_test_cluster "$dir/primary" "$dir/primary.log" "$dir" "$primary_port" -c max_connections=200
  # -R writes primary_conninfo, primary_slot_name and standby.signal; WAL is streamed
  # alongside the copy through a replication slot (-C -S), so that the primary keeps
  # every segment the replica still needs.
  as_server "$bindir/pg_basebackup" -h "$dir" -p "$primary_port" -U adtally -D "$dir/data" -R -C -S replica -X stream --checkpoint=fast --no-sync
  # A standby accepts connections only once it is consistent and has seen a snapshot
  # of the primary's running transactions.
  as_server "$bindir/pg_ctl" start -w -t 120 -D "$dir/data" -l "$dir/postgres.log" \
    -o "-c listen_addresses='' -c port=$port -c unix_socket_directories='$dir' -c unix_socket_permissions=0700 -c fsync=off -c max_connections=200 -c hot_standby=on" >/dev/null \
    || start_failed "$dir/data" "$dir/postgres.log"
  ;;
stop-replica)
  as_server "$bindir/pg_ctl" stop -D "$2/data" -m fast -w >/dev/null
  ;;
stop)
  dir=$2
  as_server "$bindir/pg_ctl" stop -D "$dir/data" -m fast -w >/dev/null 2>&1 || true
  as_server "$bindir/pg_ctl" stop -D "$dir/primary" -m fast -w >/dev/null 2>&1 || true
  rm -rf "$dir"
  ;;
*)
  echo "usage: $0 start DIR PRIMARY_PORT PORT | stop-replica DIR | stop DIR" >&2
  exit 2
  ;;
esac
