#!/usr/bin/env bash
# A streaming replica of the throwaway test cluster (scripts/with-test-postgres.sh):
#   test-replica.sh start PRIMARY_SOCKET_DIR PRIMARY_PORT REPLICA_DIR PORT
#     pg_basebackup -R of the primary into REPLICA_DIR/data, started as a hot standby
#     on a unix socket in REPLICA_DIR with port PORT (prints nothing on success);
#   test-replica.sh stop REPLICA_DIR [PRIMARY_SOCKET_DIR PRIMARY_PORT]
#     stops it, drops its replication slot on the primary, and deletes REPLICA_DIR.
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
  # -R writes primary_conninfo, primary_slot_name and standby.signal; WAL is streamed
  # alongside the copy through a replication slot (-C -S), so that the busy primary
  # (the whole suite runs on it) keeps every segment the copy and the replica still
  # need. The slot's name is kept beside the data for `stop`.
  slot=$(basename "$dir" | tr -c 'a-z0-9_\n' '_')
  echo "$slot" > "$dir/slot"
  as_server "$bindir/pg_basebackup" -h "$primary" -p "$primary_port" -U adtally -D "$dir/data" -R -C -S "$slot" -X stream --checkpoint=fast --no-sync
  # A hot standby needs max_connections at least the primary's (1000 in the test cluster).
  # No hot_standby_feedback: through the slot it would hold back vacuum in every
  # database of the shared test cluster (another test checks what vacuum gives back).
  # A standby accepts connections only once it is consistent and has seen a snapshot of
  # the primary's running transactions; on a loaded CI machine that took over 60 s once,
  # so it gets 180, and a failure shows why from the replica's own log.
  if ! as_server "$bindir/pg_ctl" start -w -t 180 -D "$dir/data" -l "$dir/postgres.log" \
    -o "-c listen_addresses='' -c port=$port -c unix_socket_directories='$dir' -c unix_socket_permissions=0700 -c fsync=off -c max_connections=1000 -c hot_standby=on" >/dev/null; then
    echo "the replica's log (last 30 lines):" >&2
    tail -n 30 "$dir/postgres.log" >&2 || true
    exit 1
  fi
  ;;
stop)
  dir=$2 primary=${3:-} primary_port=${4:-5432}
  as_server "$bindir/pg_ctl" stop -D "$dir/data" -m fast -w >/dev/null 2>&1 || true
  # The slot would keep WAL on the primary for good.
  if [ -n "$primary" ] && [ -f "$dir/slot" ]; then
    # Its walsender may take a moment to notice the replica is gone.
    dropped=no
    for _ in $(seq 1 50); do
      "$bindir/psql" "host=$primary port=$primary_port user=adtally dbname=postgres" -qAt \
        -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '$(cat "$dir/slot")'" >/dev/null 2>&1 && { dropped=yes; break; }
      sleep 0.1
    done
    [ "$dropped" = yes ] || echo "warning: could not drop replication slot $(cat "$dir/slot") on the primary: it keeps WAL until the cluster goes" >&2
  fi
  rm -rf "$dir"
  ;;
*)
  echo "usage: $0 start PRIMARY_SOCKET_DIR PRIMARY_PORT REPLICA_DIR PORT | stop REPLICA_DIR [PRIMARY_SOCKET_DIR PRIMARY_PORT]" >&2
  exit 2
  ;;
esac
