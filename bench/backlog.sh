#!/usr/bin/env bash
# make bench-backlog: a big backlog and a migration on a loaded database, with ingest
# running (issue 41, item 5), in one run.
#
# 1. start `adtally serve` on the embedded database and load the bench's data
#    (bench/lib.sh load_events: BENCH_EVENTS, default 10 M, 40 % of them for bench-00);
# 2. ingest at a steady BENCH_RATE batches of 100 a second (default 20: 2,000 events/s)
#    into 20 other apps from 4 connections, for 60 s alone: its ack p50/p99/max, the peer;
# 3. with the same ingest running: migration 0013's four indexes dropped and built
#    again by `adtally migrate` (CONCURRENTLY, Migrations/0013): the build's wall time,
#    and ingest's ack p50/p99/max meanwhile;
# 4. with the same ingest running: a week of bench-00's rollup deltas appended at once
#    (as an import of history or a stopped compactor leaves them) and folded by the
#    server's compactor: the seconds until none of bench-00's is left, the passes, the
#    longest, how many were cut by their own timeout and how many failed, and ingest's
#    ack p50/p99/max meanwhile;
# 5. one RESULT line.
set -euo pipefail
cd "$(dirname "$0")/.."
events=${BENCH_EVENTS:-10000000}
apps=${BENCH_APPS:-60}
rate=${BENCH_RATE:-20}
. bench/lib.sh
start_server
load_events "$events" "$apps"
echo "events_loaded=$(sql -c "SELECT count(*) FROM events") load_seconds=$(( $(date +%s) - load_started ))"

echo "== generating ingest for 20 other apps (batches of 100)"
"$bin/adtally-bench" generate --out "$work" --apps 20 --batches 12000 --seed 7 >/dev/null
ingest_keys 20

metric() { curl -fs "http://127.0.0.1:$port/metrics" | awk -v m="$1" '$1 == m { v += $2 } END { print v + 0 }'; }

echo "== ingest alone, 60 s at $rate batches/s"
start_ingest; sleep 60; stop_ingest alone

echo "== migration 0013's indexes built again (CONCURRENTLY) with ingest running"
sql -c "SELECT pg_size_pretty(pg_total_relation_size('rollup_1h_compacted')) || ' hourly, ' || pg_size_pretty(pg_total_relation_size('rollup_priced_1h')) || ' priced hourly, ' || (SELECT count(*) FROM rollup_1h_compacted) || ' hourly rows'"
sql -c "DROP INDEX rollup_1h_by_hour, rollup_priced_1h_by_hour, rollup_day_by_day, rollup_priced_day_by_day" -c "DELETE FROM schema_migrations WHERE version = 13"
start_ingest; sleep 10
migrate_started=$(date +%s.%N)
"$bin/adtally" migrate --data-dir "$data" > "$work/migrate.txt" 2>&1 || { cat "$work/migrate.txt"; exit 1; }
index_build_s=$(python3 -c "print(round($(date +%s.%N) - $migrate_started, 1))")
sleep 10; stop_ingest index
[ "$(sql -c "SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname IN ('rollup_1h_by_hour', 'rollup_priced_1h_by_hour', 'rollup_day_by_day', 'rollup_priced_day_by_day') AND i.indisvalid")" = 4 ] \
  || { echo "check=the four indexes are not all built and valid"; exit 1; }
echo "index_build_s=$index_build_s"

echo "== a week of bench-00's deltas folded with ingest running"
cut_before=$(metric adtally_rollup_compaction_timeouts_total); failed_before=$(metric adtally_rollup_compaction_failures_total)
first_event=$(sql -c "SELECT min(occurred_at) FROM events WHERE app_id = 'bench-00'")
start_ingest; sleep 10
backlog_started=$(date +%s.%N); backlog_started_at=$(sql -c "SELECT now()")
backlog_rows=$(append_deltas "app_id = 'bench-00' AND occurred_at >= '$first_event'::timestamptz AND occurred_at < '$first_event'::timestamptz + interval '7 days'")
for _ in $(seq 1 1800); do [ "$(sql -c "SELECT count(*) FROM rollup_delta WHERE app_id = 'bench-00'")" = 0 ] && break; sleep 1; done
backlog_fold_s=$(python3 -c "print(round($(date +%s.%N) - $backlog_started, 1))")
[ "$(sql -c "SELECT count(*) FROM rollup_delta WHERE app_id = 'bench-00'")" = 0 ] || { echo "check=the backlog was not folded in 30 minutes"; tail "$work/server.log"; exit 1; }
sleep 10; stop_ingest backlog
passes=$(sql -c "SELECT count(*) || ' ' || round(max(extract(epoch FROM finished_at - started_at))::numeric, 1) || ' ' || sum(delta_rows) FROM rollup_compaction_passes WHERE started_at >= '$backlog_started_at'")
read -r pass_count longest_pass_s pass_rows <<< "$passes"
passes_cut=$(( $(metric adtally_rollup_compaction_timeouts_total) - cut_before ))
passes_failed=$(( $(metric adtally_rollup_compaction_failures_total) - failed_before ))
echo "backlog_rows=$backlog_rows backlog_fold_s=$backlog_fold_s passes=$pass_count longest_pass_s=$longest_pass_s rows_moved=$pass_rows passes_cut=$passes_cut passes_failed=$passes_failed"
echo "passes_cut_whole_run=$(grep -c "cut by its own timeout" "$work/server.log" || true) (the load's week-at-a-time folds included)"

echo "RESULT index_build_s=$index_build_s backlog_rows=$backlog_rows backlog_fold_s=$backlog_fold_s passes=$pass_count longest_pass_s=$longest_pass_s passes_cut=$passes_cut passes_failed=$passes_failed" \
  "ingest_p99_ms_alone=$(value alone_ack_latency_p99_ms alone) ingest_p99_ms_index=$(value index_ack_latency_p99_ms index) ingest_p99_ms_backlog=$(value backlog_ack_latency_p99_ms backlog)" \
  "ingest_max_ms_alone=$(value alone_ack_latency_max_ms alone) ingest_max_ms_index=$(value index_ack_latency_max_ms index) ingest_max_ms_backlog=$(value backlog_ack_latency_max_ms backlog)"
