#!/usr/bin/env bash
# make bench-ingest: AdTally's ingest rate against a raw COPY of the same rows, in one run.
#
# 1. generate realistic events (type mix, 20 apps, 6 networks, 14 countries), in
#    batches of 100, and the same rows as CSV;
# 2. start `adtally serve` on the embedded database (a fresh data folder), and
#    wait for its start-up work (the report series' first write, tried for
#    every app);
# 3. drive POST /v1/events from 8 keep-alive connections, every batch once:
#    events/s, acknowledgement latency p50/p99, peak server RSS;
# 4. the same with 32 connections on a second set of events (group commit
#    gathers more per transaction when more requests are in flight);
# 5. psql \copy the first set's rows into a fresh plain table indexed like
#    `events`, three times: before, between and after the AdTally legs (the
#    machine is shared and its speed drifts; the ratio uses the median);
#    each phase waits until the compactor has folded the deltas before it
#    (fold_after_s_N: how long that took after the N-connection leg);
# 6. print the ratios, then one RESULT line.
set -euo pipefail
cd "$(dirname "$0")/.."
batches=${BENCH_BATCHES:-3000}
connections=${BENCH_CONNECTIONS:-8}
more_connections=${BENCH_MORE_CONNECTIONS:-32}
. bench/lib.sh

echo "generating 2 x $((batches * 100)) events in batches of 100"
"$bin/adtally-bench" generate --out "$work" --apps 20 --batches "$batches" --seed 1
mkdir -p "$work/second"
"$bin/adtally-bench" generate --out "$work/second" --apps 20 --batches "$batches" --seed 2

start_server
ingest_keys 20

# An experiment's SQL, run once the server is up (e.g. BENCH_SQL='DROP INDEX x' to price an index).
if [ -n "${BENCH_SQL:-}" ]; then psql "$conn" -v ON_ERROR_STOP=1 -qc "$BENCH_SQL"; fi
columns="app_id, occurred_at, event_id, type, network, format, placement, size, country, platform, os_version, app_version, device, revenue_micros, currency, error_code, will_leave, shown"
: > "$work/copy.txt"
# Every measured phase starts once the server's compactor has folded every delta
# the previous phase left (so no phase, AdTally's or COPY's, runs beside another's
# backlog: the COPY after the 8-connection leg ran beside its fold, at 61 k rows/s
# against 82 k before it), and right after a CHECKPOINT, so none pays for the
# previous phase's dirty pages and full-page writes. How long the fold took after
# a leg is printed: the compactor's throughput behind it (it includes up to one
# compactor interval, 5 s, of the compactor's sleep between passes).
settle() {  # $1: what is waited for (printed, with how long it took; sets settled_s), $2: when it ended (default now)
  local start=${2:-$(date +%s.%N)}
  wait_zero "the compactor to fold the deltas" "$deltas_pending" 1200
  settled_s=$(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')")
  if [ -n "${1:-}" ]; then echo "$1: the deltas were folded $settled_s s after it ended"; fi
}
checkpoint() { settle; psql "$conn" -qc "CHECKPOINT"; }
copy_once() {  # $1: run number; appends "rows seconds" to copy.txt
  psql "$conn" -qc "CREATE TABLE bench_copy_$1 (LIKE events INCLUDING DEFAULTS INCLUDING INDEXES)"
  checkpoint
  local start end
  start=$(date +%s.%N)
  psql "$conn" -qc "\\copy bench_copy_$1 ($columns) FROM '$work/rows.csv' WITH (FORMAT csv)"
  end=$(date +%s.%N)
  echo "$(psql "$conn" -tAc "SELECT count(*) FROM bench_copy_$1") $(python3 -c "print($end - $start)")" >> "$work/copy.txt"
  psql "$conn" -qc "DROP TABLE bench_copy_$1"
}

# The report series' first, full write (15 s after start, every app) is start-up
# work, not ingest's: it ran inside the 8-connection leg (41 report pages, 7.5 s of
# PostgreSQL's time in a 15 s leg). Its later passes, every minute, write only what
# changed, as on any server that has run a while.
# Tried for every app (an app's failure is the series' own, logged by the server).
wait_zero "the report series' first write" "SELECT count(*) FROM apps a WHERE NOT EXISTS (SELECT 1 FROM report_series_refresh r WHERE r.app_id = a.app_id)" 600
echo "== PostgreSQL: psql \\copy of the first set's rows into a plain table indexed like events (1 of 3)"
copy_once 1

drive() {  # $1: batches file, $2: connections, $3: where the results go; sets leg_end
  checkpoint
  "$bin/adtally-bench" drive --url "http://127.0.0.1:$port" --keys "$work/keys.tsv" --batches "$1" \
    --connections "$2" --server-pid "$server" | tee "$3"
  leg_end=$(date +%s.%N)
}

trace_on
echo "== AdTally: POST /v1/events, batches of 100, $connections keep-alive connections"
drive "$work/batches.jsonl" "$connections" "$work/adtally.txt"

trace_summary
settle "the $connections-connection leg" "$leg_end"
backlog_few=$settled_s
echo "== PostgreSQL: the same COPY (2 of 3)"
copy_once 2

echo "== AdTally: the same with $more_connections connections (second set of events)"
drive "$work/second/batches.jsonl" "$more_connections" "$work/adtally-more.txt"

settle "the $more_connections-connection leg" "$leg_end"
backlog_more=$settled_s
echo "== PostgreSQL: the same COPY (3 of 3)"
copy_once 3

python3 - "$work/adtally.txt" "$work/adtally-more.txt" "$work/copy.txt" "$connections" "$more_connections" "$backlog_few" "$backlog_more" <<'PY'
import statistics, sys
def read(path):
    return dict(line.strip().split("=", 1) for line in open(path) if "=" in line)
few, more = read(sys.argv[1]), read(sys.argv[2])
runs = [line.split() for line in open(sys.argv[3]) if line.strip()]
rates = [int(rows) / float(seconds) for rows, seconds in runs]
copy_rate = statistics.median(rates)
print(f"copy_rows={runs[0][0]}")
print("copy_events_per_second_runs=" + ",".join(f"{rate:.0f}" for rate in rates))
print(f"copy_events_per_second_median={copy_rate:.0f}")
print(f"ratio_adtally_to_copy_{sys.argv[4]}_connections={float(few['events_per_second']) / copy_rate:.2f}")
print(f"ratio_adtally_to_copy_{sys.argv[5]}_connections={float(more['events_per_second']) / copy_rate:.2f}")
a, b = sys.argv[4], sys.argv[5]
# Sustained: the leg's events over the leg and the fold after it (what a server
# holds up to when it is sent this much for longer than a leg).
def sustained(leg, fold):
    return f"{int(leg['events_accepted']) / (float(leg['seconds']) + float(fold)):.0f}"
sustained_few, sustained_more = sustained(few, sys.argv[6]), sustained(more, sys.argv[7])
print(f"sustained_events_per_second_{sys.argv[4]}_connections={sustained_few} (the leg and the fold after it)")
print(f"sustained_events_per_second_{sys.argv[5]}_connections={sustained_more}")
print(f"RESULT events_per_s_{a}={few['events_per_second']} events_per_s_{b}={more['events_per_second']} "
      f"ratio_to_copy_{a}={float(few['events_per_second']) / copy_rate:.2f} ratio_to_copy_{b}={float(more['events_per_second']) / copy_rate:.2f} "
      f"ack_p50_ms_{a}={few['ack_latency_p50_ms']} ack_p99_ms_{a}={few['ack_latency_p99_ms']} ack_p99_ms_{b}={more['ack_latency_p99_ms']} "
      f"server_peak_rss_kb={more.get('server_peak_rss_kb', '?')} fold_after_s_{a}={sys.argv[6]} fold_after_s_{b}={sys.argv[7]} "
      f"sustained_events_per_s_{a}={sustained_few} sustained_events_per_s_{b}={sustained_more}")
PY
