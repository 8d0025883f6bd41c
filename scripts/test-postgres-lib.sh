# Sourced by scripts/with-test-postgres.sh and scripts/test-replica.sh: the
# PostgreSQL server programs, and a throwaway cluster started on a private socket.
bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
if [ -z "$bindir" ] || [ ! -x "$bindir/initdb" ]; then
  echo "PostgreSQL server programs not found; install the Debian package 'postgresql'" >&2
  exit 1
fi

# PostgreSQL refuses to run as root; as root, run it as the postgres user.
as_server() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# start_test_cluster DATA LOG SOCKET_DIR PORT [-c NAME=VALUE …]: initdb of a cluster
# in DATA (superuser adtally, trust: only its owner reaches the socket, mode 0700 in
# SOCKET_DIR), started on that socket with PORT and no TCP, logging to LOG, and the
# given settings. Durability of a throwaway cluster is not under test: no fsync, and
# commits do not wait for their WAL. When it does not start, prints its log's tail
# and exits.
start_test_cluster() {
  local data=$1 log=$2 socket=$3 port=$4
  shift 4
  as_server "$bindir/initdb" -D "$data" -U adtally -A trust -E UTF8 --locale=C.UTF-8 --no-instructions >/dev/null
  as_server "$bindir/pg_ctl" start -w -t 120 -D "$data" -l "$log" \
    -o "-c listen_addresses='' -c port=$port -c unix_socket_directories='$socket' -c unix_socket_permissions=0700 -c fsync=off -c synchronous_commit=off $*" >/dev/null \
    || start_failed "$data" "$log"
}

# start_failed DATA LOG: says the cluster in DATA did not start, with its log's tail, and exits.
start_failed() {
  echo "PostgreSQL in $1 did not start; its log (last 30 lines):" >&2
  tail -n 30 "$2" >&2 || true
  exit 1
}
