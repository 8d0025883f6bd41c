#!/usr/bin/env bash
# A streaming replica of the throwaway test cluster (scripts/with-test-postgres.sh):
#   test-replica.sh start PRIMARY_SOCKET_DIR PRIMARY_PORT REPLICA_DIR PORT
#     pg_basebackup -R of the primary into REPLICA_DIR/data, started as a hot standby
#     on a unix socket in REPLICA_DIR with port PORT (prints nothing on success);
#   test-replica.sh stop REPLICA_DIR
#     stops it and deletes REPLICA_DIR.
# with-test-postgres.sh stops any replica left under its folder when it exits.
set -euo pipefail
bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
as_server() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
case "${1:-}" in
start)
  primary=$2 primary_port=$3 dir=$4 port=$5
  mkdir -p "$dir"
  chmod 700 "$dir"
  [ "$(id -u)" -eq 0 ] && chown postgres:postgres "$dir"
  # -R writes primary_conninfo and standby.signal; WAL streamed alongside the copy.
  as_server "$bindir/pg_basebackup" -h "$primary" -p "$primary_port" -U adtally -D "$dir/data" -R -X stream --checkpoint=fast --no-sync
  # A hot standby needs max_connections at least the primary's (1000 in the test cluster).
  as_server "$bindir/pg_ctl" start -w -t 60 -D "$dir/data" -l "$dir/postgres.log" \
    -o "-c listen_addresses='' -c port=$port -c unix_socket_directories='$dir' -c unix_socket_permissions=0700 -c fsync=off -c max_connections=1000 -c hot_standby=on -c hot_standby_feedback=on" >/dev/null
  ;;
stop)
  dir=$2
  as_server "$bindir/pg_ctl" stop -D "$dir/data" -m fast -w >/dev/null 2>&1 || true
  rm -rf "$dir"
  ;;
*)
  echo "usage: $0 start PRIMARY_SOCKET_DIR PRIMARY_PORT REPLICA_DIR PORT | stop REPLICA_DIR" >&2
  exit 2
  ;;
esac
