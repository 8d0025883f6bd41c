# Shared by the bench scripts: a work folder removed on exit (kept, with its
# database, when BENCH_KEEP=1), and `adtally serve` on a fresh embedded database
# in it. Source it, then call start_server.
bin=$(swift build -c release --show-bin-path)
work=$(mktemp -d /tmp/adtally-bench.XXXXXX)
chmod 755 "$work"
server=
cleanup() {
  if [ -n "$server" ] && kill -0 "$server" 2>/dev/null; then
    kill -TERM "$server"; wait "$server" 2>/dev/null || true
  fi
  if [ "${BENCH_KEEP:-0}" = 1 ]; then echo "kept $work (adtally serve --data-dir $work/data)"; else rm -rf "$work"; fi
}
trap cleanup EXIT

# Starts the server (pool of 8) on a free port and waits until it is ready; sets
# port, data, server, admin (an admin key) and conn (psql to its database).
start_server() {
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  data="$work/data"
  "$bin/adtally" serve --data-dir "$data" --port "$port" --pool-size 8 --log-level warning > "$work/server.log" 2>&1 &
  server=$!
  for _ in $(seq 1 300); do curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 0.2; done
  curl -fs "http://127.0.0.1:$port/readyz" >/dev/null || { cat "$work/server.log"; exit 1; }
  admin=$("$bin/adtally" keys create --admin --data-dir "$data" | tail -n 1)
  local socket="$data/run"
  [ -S "$socket/.s.PGSQL.5432" ] || socket=$(ls -d /tmp/adtally-* 2>/dev/null | while read -r d; do [ -S "$d/.s.PGSQL.5432" ] && echo "$d"; done | head -n 1)
  conn="host=$socket port=5432 user=adtally dbname=adtally passfile=$data/pgpass"
}

# BENCH_TRACE=1: log every statement's duration from now on (trace_on), and print
# PostgreSQL's time per statement kind (trace_summary).
trace_on() {
  [ "${BENCH_TRACE:-0}" = 1 ] || return 0
  psql "$conn" -qAt -c "ALTER SYSTEM SET log_min_duration_statement = 0" -c "SELECT pg_reload_conf()" >/dev/null
}
trace_summary() {
  [ "${BENCH_TRACE:-0}" = 1 ] || return 0
  echo "== PostgreSQL time per statement kind (count, mean ms, total s)"
  python3 - "$data/run/postgres.log" <<'PY'
import re, sys, collections
stats = collections.defaultdict(list)
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r"duration: ([0-9.]+) ms\s+(?:statement|execute [^:]*|parse [^:]*|bind [^:]*): (.*)", line)
    if m:
        stats[(line.split("duration: ")[1].split(":")[0].split()[-1] if "execute" in line or "parse" in line or "bind" in line else "") + " " + m.group(2).strip()[:60]].append(float(m.group(1)))
for key, values in sorted(stats.items(), key=lambda item: -sum(item[1]))[:14]:
    print(f"{len(values):7d} {sum(values) / len(values):8.3f} {sum(values) / 1000:7.2f}  {key}")
PY
  psql "$conn" -qAt -c "ALTER SYSTEM RESET log_min_duration_statement" -c "SELECT pg_reload_conf()" >/dev/null
}
