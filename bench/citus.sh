#!/usr/bin/env bash
# make bench-citus: the figures of docs/scaling.md's Citus section, measured on a
# throwaway three-node Citus cluster (a coordinator and two workers on loopback) against
# one plain PostgreSQL node in the same run, on the same machine. Needs Citus installed
# (DEVELOPERS.md); run by the Makefile as
#   scripts/with-citus-cluster.sh scripts/with-test-postgres.sh bench/citus.sh
#
# 1. migrate both; run deploy/citus-setup.sql on the cluster;
# 2. generate BENCH_BATCHES (default 2000) batches of 100 realistic events for 20 apps;
# 3. one `adtally serve` per database (pool of 8), 20 apps and ingest keys each;
# 4. POST every batch once to each, 8 keep-alive connections (one node first, then
#    Citus, then one node again on a second set: the machine drifts): events/s, p50/p99;
# 5. the compactor's passes during the ingest (rollup_compaction_passes): delta rows
#    folded per second of pass, and the longest pass;
# 6. ANALYZE on both (BENCH_ANALYZE=0 skips it), then BENCH_CALLS (default 200) calls
#    of the default report (30 days, date x network) for one app (bench-app-0), and the
#    same for every app together: p50, p99;
# 7. one RESULT line.
# All three Citus nodes, both servers and the load driver share this machine's cores:
# the figures compare the work Citus adds, not what more machines would add.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${ADTALLY_CITUS_COORDINATOR:?run under scripts/with-citus-cluster.sh}" "${ADTALLY_TEST_DATABASE_URL:?run under scripts/with-test-postgres.sh}"
batches=${BENCH_BATCHES:-2000}
calls=${BENCH_CALLS:-200}
bin=$("${SWIFT:-swift}" build -c release --show-bin-path)
work=$(mktemp -d /tmp/adtally-bench-citus.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
citus=$ADTALLY_CITUS_COORDINATOR
psql "$ADTALLY_TEST_DATABASE_URL" -qAt -v ON_ERROR_STOP=1 -c "CREATE DATABASE adtally_single" >/dev/null
single=${ADTALLY_TEST_DATABASE_URL/dbname=postgres/dbname=adtally_single}
declare -A db=([citus]=$citus [single]=$single) port key admin

"$bin/adtally" migrate --database-url "$citus" >"$work/migrate.log" 2>&1 || { cat "$work/migrate.log"; exit 1; }
"$bin/adtally" migrate --database-url "$single" >"$work/migrate.log" 2>&1 || { cat "$work/migrate.log"; exit 1; }
# shellcheck disable=SC2086
PGOPTIONS='-c client_min_messages=warning' psql "$citus" -qAt -v ON_ERROR_STOP=1 $ADTALLY_CITUS_SETUP_VARS -f deploy/citus-setup.sql >/dev/null

echo "generating 2 x $((batches * 100)) events in batches of 100 for 20 apps"
"$bin/adtally-bench" generate --out "$work" --apps 20 --batches "$batches" --seed 1 >/dev/null
mkdir -p "$work/second"
"$bin/adtally-bench" generate --out "$work/second" --apps 20 --batches "$batches" --seed 2 >/dev/null

for node in single citus; do
  port[$node]=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  mkdir -p "$work/exports-$node"
  "$bin/adtally" serve --database-url "${db[$node]}" --port "${port[$node]}" --pool-size 8 --log-level warning \
    --exports-root "$work/exports-$node" >"$work/serve-$node.log" 2>&1 &
  pids+=($!)
  eval "pid_$node=$!"
  for _ in $(seq 1 300); do curl -fs "http://127.0.0.1:${port[$node]}/readyz" >/dev/null 2>&1 && break; sleep 0.2; done
  curl -fs "http://127.0.0.1:${port[$node]}/readyz" >/dev/null || { cat "$work/serve-$node.log"; exit 1; }
  admin[$node]=$("$bin/adtally" keys create --admin --database-url "${db[$node]}" | tail -n 1)
  : >"$work/keys-$node.tsv"
  for i in $(seq 0 19); do
    "$bin/adtally" apps create "bench-app-$i" --database-url "${db[$node]}" >/dev/null
    printf 'bench-app-%s\t%s\n' "$i" "$("$bin/adtally" keys create --app "bench-app-$i" --scope ingest --database-url "${db[$node]}" | tail -n 1)" >>"$work/keys-$node.tsv"
  done
done

drive() {  # node, batches file, result file
  local pid_var="pid_$1"
  "$bin/adtally-bench" drive --url "http://127.0.0.1:${port[$1]}" --keys "$work/keys-$1.tsv" --batches "$2" \
    --connections 8 --server-pid "${!pid_var}" >"$3"
  echo "  $1: $(grep -E '^(events_per_second|ack_latency_p50_ms|ack_latency_p99_ms|failed_requests)=' "$3" | tr '\n' ' ')"
}
# BENCH_TRACE=1: the coordinator logs every statement's duration during the first Citus
# ingest leg and the Citus report calls; printed per statement kind (count, mean ms, total s).
coordinator_log="$(dirname "$(psql "$citus" -qAt -c 'SHOW data_directory')")/node0.log"
trace_on() {
  [ "${BENCH_TRACE:-0}" = 1 ] || return 0
  psql "$citus" -qAt -c "ALTER SYSTEM SET log_min_duration_statement = 0" -c "SELECT pg_reload_conf()" >/dev/null
  trace_from=$(wc -l <"$coordinator_log")
}
trace_off() {
  [ "${BENCH_TRACE:-0}" = 1 ] || return 0
  psql "$citus" -qAt -c "ALTER SYSTEM RESET log_min_duration_statement" -c "SELECT pg_reload_conf()" >/dev/null
  tail -n +"$trace_from" "$coordinator_log" | python3 -c '
import re, sys, collections
stats = collections.defaultdict(list)
for line in sys.stdin:
    m = re.search(r"duration: ([0-9.]+) ms\s+(statement|execute|parse|bind)[^:]*: (.*)", line)
    if m: stats[m.group(2) + " " + m.group(3).strip()[:70]].append(float(m.group(1)))
for key, values in sorted(stats.items(), key=lambda item: -sum(item[1]))[:12]:
    print(f"{len(values):7d} {sum(values) / len(values):8.3f} {sum(values) / 1000:7.2f}  {key}")'
}
echo "== ingest: POST /v1/events, 8 connections (one node, Citus, one node again on the second set)"
drive single "$work/batches.jsonl" "$work/ingest-single-1.txt"
trace_on
drive citus "$work/batches.jsonl" "$work/ingest-citus.txt"
trace_off
drive single "$work/second/batches.jsonl" "$work/ingest-single-2.txt"
drive citus "$work/second/batches.jsonl" "$work/ingest-citus-2.txt"

# Let the compactors fold what is left, then read their passes.
for node in single citus; do
  for _ in $(seq 1 60); do
    [ "$(psql "${db[$node]}" -qAt -c "SELECT count(*) FROM rollup_delta")" -lt 100 ] && break; sleep 1
  done
  psql "${db[$node]}" -qAt -F' ' -c "
    SELECT coalesce(round(sum(delta_rows) / nullif(extract(epoch FROM sum(finished_at - started_at)), 0)), 0),
           coalesce(round(max(extract(epoch FROM finished_at - started_at)) * 1000), 0), count(*), coalesce(sum(delta_rows), 0)
    FROM rollup_compaction_passes WHERE delta_rows > 0" >"$work/compaction-$node.txt"
  echo "  compaction $node: $(awk '{print $1 " delta rows/s, longest pass " $2 " ms, " $3 " passes, " $4 " rows"}' "$work/compaction-$node.txt")"
done
[ "$(psql "$citus" -qAt -c "SELECT count(*) FROM events")" = "$(psql "$single" -qAt -c "SELECT count(*) FROM events")" ] \
  || { echo "the two databases hold different event counts" >&2; exit 1; }

# Statistics for the planner on both, as autovacuum would gather a minute later (Citus
# runs ANALYZE on every shard): reports planned over the freshly loaded tables before
# autovacuum reached the 32 shards of each were ~15 times slower on Citus.
if [ "${BENCH_ANALYZE:-1}" = 1 ]; then for node in single citus; do psql "${db[$node]}" -qAt -c "ANALYZE"; done; fi

# Daily EUR-based FX rates for the generated currencies, so that reports in USD convert.
for node in single citus; do
  psql "${db[$node]}" -qAt -v ON_ERROR_STOP=1 -c "
    INSERT INTO fx_rates (day, base, currency, rate)
    SELECT d::date, 'EUR', c.currency, c.rate
    FROM generate_series(now()::date - 40, now()::date + 1, interval '1 day') AS d,
         (VALUES ('EUR', 1), ('USD', 1.08), ('JPY', 162.5), ('GBP', 0.85), ('KRW', 1450), ('CAD', 1.47), ('BRL', 5.9), ('INR', 90.1)) AS c (currency, rate)"
done

fetch() {  # node, name, query
  local pid_var="pid_$1"
  "$bin/adtally-bench" fetch --key "${admin[$1]}" --server-pid "${!pid_var}" --url "http://127.0.0.1:${port[$1]}/v1/reports?$3" \
    --count "$calls" --name "$2" >"$work/$2-$1.txt"
  echo "  $1: $(grep -E "^$2_(p50|p99)_ms=" "$work/$2-$1.txt" | tr '\n' ' ')"
}
echo "== the default report (30 days, date x network), $calls calls"
for node in single citus single citus; do
  if [ "$node" = citus ]; then trace_on; fi
  fetch "$node" one "apps=bench-app-0&days=30&dimensions=date,network"
  if [ "$node" = citus ]; then trace_off; fi
done
echo "== the same for all 20 apps together (the admin's view), $calls calls"
for node in single citus; do fetch "$node" all "days=30&dimensions=date,network"; done
curl -fs -H "Authorization: Bearer ${admin[citus]}" "http://127.0.0.1:${port[citus]}/v1/reports?apps=bench-app-0&days=30&dimensions=date,network&format=csv" >"$work/r-citus.csv"
curl -fs -H "Authorization: Bearer ${admin[single]}" "http://127.0.0.1:${port[single]}/v1/reports?apps=bench-app-0&days=30&dimensions=date,network&format=csv" >"$work/r-single.csv"
cmp -s "$work/r-citus.csv" "$work/r-single.csv" || { echo "the report differs between the nodes" >&2; exit 1; }
echo "  the report is the same on both ($(wc -l <"$work/r-citus.csv") lines)"

python3 - "$work" <<'PY'
import statistics, sys
work = sys.argv[1]
def read(path):
    return dict(line.strip().split("=", 1) for line in open(f"{work}/{path}") if "=" in line)
def rate(path): return float(read(path)["events_per_second"])
single = statistics.mean([rate("ingest-single-1.txt"), rate("ingest-single-2.txt")])
citus = statistics.mean([rate("ingest-citus.txt"), rate("ingest-citus-2.txt")])
def p50(name, node): return float(read(f"{name}-{node}.txt")[f"{name}_p50_ms"])
cs, cc = (open(f"{work}/compaction-{n}.txt").read().split() for n in ("single", "citus"))
print(f"RESULT citus_ingest_events_per_s={citus:.0f} single_ingest_events_per_s={single:.0f} ingest_ratio={citus / single:.2f} "
      f"citus_report_p50_ms={p50('one', 'citus'):.2f} single_report_p50_ms={p50('one', 'single'):.2f} report_ratio={p50('one', 'citus') / p50('one', 'single'):.2f} "
      f"citus_all_apps_p50_ms={p50('all', 'citus'):.2f} single_all_apps_p50_ms={p50('all', 'single'):.2f} "
      f"citus_compaction_rows_per_s={cc[0]} single_compaction_rows_per_s={cs[0]} citus_longest_pass_ms={cc[1]} single_longest_pass_ms={cs[1]}")
PY
