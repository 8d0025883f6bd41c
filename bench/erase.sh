#!/usr/bin/env bash
# make bench-erase: erasing 1,000 devices of the bench's largest app with ingest
# running (issue 44, DESIGN §15), in one run.
#
# 1. start `adtally serve` on the embedded database and load the bench's data
#    (bench/lib.sh load_events: BENCH_EVENTS, default 10 M, 40 % of them for bench-00);
#    BENCH_LOADED=DIR starts from a copy of a data folder an earlier run kept loaded
#    (BENCH_KEEP=1 keeps it: WORK/data) instead, migrated first (`adtally migrate`, timed);
# 2. ingest at a steady BENCH_RATE batches of 100 a second (default 20: 2,000 events/s)
#    into 20 other apps from 4 connections, for 60 s alone: its ack p50/p99/max, the peer;
# 3. with the same ingest running: BENCH_ERASE (default 1,000) devices of bench-00, picked
#    at random among its installs, erased by one POST /v1/apps/bench-00/devices/erase;
#    the job polled until done: its wall time, the rows it removed per table, and
#    ingest's ack p50/p99/max meanwhile; then every row of those devices counted (none
#    may be left) and the cohort grain checked against the device rows left;
# 4. one RESULT line.
set -euo pipefail
cd "$(dirname "$0")/.."
events=${BENCH_EVENTS:-10000000}
apps=${BENCH_APPS:-60}
rate=${BENCH_RATE:-20}
devices=${BENCH_ERASE:-1000}
. bench/lib.sh
if [ -n "${BENCH_LOADED:-}" ]; then
  echo "== copying the loaded data folder $BENCH_LOADED"
  cp -a "$BENCH_LOADED" "$work/data"
  # Its pending migrations first (they may rewrite big tables: longer than start_server waits).
  migrate_started=$(date +%s.%N)
  "$bin/adtally" migrate --data-dir "$work/data" > "$work/migrate.txt" 2>&1 || { cat "$work/migrate.txt"; exit 1; }
  echo "migrations_s=$(python3 -c "print(round($(date +%s.%N) - $migrate_started, 1))") ($(grep -c 'applied migration' "$work/migrate.txt" || true) applied)"
  start_server
else
  start_server
  load_events "$events" "$apps"
fi
echo "events_loaded=$(sql -c "SELECT count(*) FROM events") bench00_events=$(sql -c "SELECT count(*) FROM events WHERE app_id = 'bench-00'") bench00_installs=$(sql -c "SELECT count(*) FROM installs WHERE app_id = 'bench-00'")"

echo "== generating ingest for 20 other apps (batches of 100)"
"$bin/adtally-bench" generate --out "$work" --apps 20 --batches 12000 --seed 7 >/dev/null
ingest_keys 20

echo "== ingest alone, 60 s at $rate batches/s"
start_ingest; sleep 60; stop_ingest alone

echo "== $devices devices of bench-00 erased with ingest running"
sql -c "SELECT device FROM installs WHERE app_id = 'bench-00' ORDER BY md5(device) LIMIT $devices" > "$work/devices.txt"
sql -c "CREATE TABLE bench_erased AS SELECT device FROM installs WHERE app_id = 'bench-00' ORDER BY md5(device) LIMIT $devices"
before=$(sql -c "SELECT (SELECT count(*) FROM events e JOIN bench_erased b USING (device) WHERE e.app_id = 'bench-00') || ' ' ||
                        (SELECT count(*) FROM install_days d JOIN bench_erased b USING (device) WHERE d.app_id = 'bench-00')")
read -r events_before days_before <<< "$before"
echo "their_events=$events_before their_days=$days_before"
body=$(python3 -c 'import json,sys; print(json.dumps({"devices": [l.strip() for l in open(sys.argv[1]) if l.strip()]}))' "$work/devices.txt")
# 2 s of ingest either side of the job: its ack percentiles are the job's, not the quiet around it.
start_ingest; sleep 2
erase_started=$(date +%s.%N)
id=$(curl -fs -X POST -H "Authorization: Bearer $admin" -H 'Content-Type: application/json' -d "$body" \
  "http://127.0.0.1:$port/v1/apps/bench-00/devices/erase" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
status=queued
for _ in $(seq 1 36000); do
  status=$(curl -fs -H "Authorization: Bearer $admin" "http://127.0.0.1:$port/v1/erasures/$id" | tee "$work/erasure.json" | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])')
  [ "$status" = done ] || [ "$status" = failed ] && break
  sleep 0.2
done
erase_s=$(python3 -c "print(round($(date +%s.%N) - $erase_started, 1))")
sleep 2; stop_ingest erase
[ "$status" = done ] || { echo "check=the erasure ended $status: $(cat "$work/erasure.json")"; exit 1; }
rows=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["rows"]; print(" ".join(f"rows_{k}={v}" for k, v in sorted(r.items())))' "$work/erasure.json")
echo "erase_s=$erase_s $rows"
left=$(sql -c "SELECT (SELECT count(*) FROM events e JOIN bench_erased b USING (device) WHERE e.app_id = 'bench-00')
                    + (SELECT count(*) FROM installs i JOIN bench_erased b USING (device) WHERE i.app_id = 'bench-00')
                    + (SELECT count(*) FROM install_days d JOIN bench_erased b USING (device) WHERE d.app_id = 'bench-00')
                    + (SELECT count(*) FROM install_day_revenue r JOIN bench_erased b USING (device) WHERE r.app_id = 'bench-00')")
[ "$left" = 0 ] || { echo "check=$left rows of the erased devices are left"; exit 1; }
grain=$(sql -c "SELECT count(*) FROM (SELECT app_id, cohort, day, devices FROM cohort_days WHERE app_id = 'bench-00' AND devices <> 0
                                      EXCEPT SELECT app_id, cohort, day, count(*) FROM install_days WHERE app_id = 'bench-00' GROUP BY 1, 2, 3) AS d")
[ "$grain" = 0 ] || { echo "check=$grain cohort days of bench-00 differ from its device rows"; exit 1; }
echo "check=no row of the erased devices is left; bench-00's cohort days equal its device rows"

echo "RESULT erase_devices=$devices erase_s=$erase_s events_removed=$events_before ingest_p99_ms_alone=$(value alone_ack_latency_p99_ms alone)" \
  "ingest_p99_ms_erasing=$(value erase_ack_latency_p99_ms erase) ingest_max_ms_alone=$(value alone_ack_latency_max_ms alone) ingest_max_ms_erasing=$(value erase_ack_latency_max_ms erase)"
