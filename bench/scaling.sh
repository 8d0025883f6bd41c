#!/usr/bin/env bash
# make bench-scaling: the figures docs/scaling.md is built on, measured here.
#
# 1. start `adtally serve` on the embedded database (a fresh data folder) and load
#    BENCH_EVENTS (default 3 M) events over 35 days for BENCH_APPS (60) apps, 40% for
#    one app, as `make bench-report` does (bench/lib.sh load_events), with their
#    dedupe-ledger rows, and let the server compact their rollups;
# 2. storage: bytes per event of the raw events (heap, indexes, TOAST, all daily
#    partitions) and of the dedupe ledger; per app and 30 days, rows and bytes of
#    every rollup grain and of the HyperLogLog sketches, for the largest app and a
#    median one;
# 3. COPY throughput per core: one backend copies 1 M of those events (CSV, psql
#    \copy) into a plain table with the B-tree index of `events`, then their ids into
#    a table with the ledger's primary key (the BRIN indexes are left out); rows per second of wall time and per CPU second of the
#    backend (from /proc), three times each (the median is printed);
# 4. the same figures extrapolated to 1 B events a month (python, from the above);
# 5. one RESULT line.
set -euo pipefail
cd "$(dirname "$0")/.."
events=${BENCH_EVENTS:-3000000}
apps=${BENCH_APPS:-60}
copy_rows=${BENCH_COPY_ROWS:-1000000}
. bench/lib.sh
start_server
load_events "$events" "$apps"
# The ledger holds one row per stored event while it is inside the accepted window.
sql -c "INSERT INTO event_ids (app_id, event_id, occurred_at) SELECT app_id, event_id, occurred_at FROM events" -c "VACUUM ANALYZE event_ids" -c "CHECKPOINT"
loaded=$(sql -c "SELECT count(*) FROM events")
days=$(sql -c "SELECT count(DISTINCT occurred_at::date) FROM events")
echo "loaded $loaded events over $days UTC days for $apps apps in $(( $(date +%s) - load_started )) s"

echo "== storage"
sql -F ' ' <<'SQL' | tee "$work/storage.txt"
WITH parts AS (
  SELECT c.oid, c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'events'
), sized AS (
  SELECT relname, pg_total_relation_size(oid) AS total, pg_relation_size(oid) AS heap, pg_indexes_size(oid) AS indexes FROM parts
)
SELECT 'events_partitions', count(*), 'events_bytes', sum(total), 'events_heap_bytes', sum(heap), 'events_index_bytes', sum(indexes),
       'events_rows', (SELECT count(*) FROM events), 'largest_partition_bytes', max(total)
FROM sized;
SELECT 'ledger_bytes', pg_total_relation_size('event_ids'), 'ledger_rows', (SELECT count(*) FROM event_ids);
SQL
# Per app and 30 days: the rows of each rollup table in the 30 days before the last
# whole day, and their share of the table's bytes (indexes included).
sql -F ' ' <<'SQL' | tee "$work/rollups.txt"
CREATE TEMP TABLE grains (name text, time_column text);
INSERT INTO grains VALUES
  ('rollup_15m_compacted', 'bucket'), ('rollup_revenue_15m_compacted', 'bucket'), ('rollup_devices_15m_compacted', 'bucket'),
  ('rollup_1h_compacted', 'hour'), ('rollup_revenue_1h_compacted', 'hour'), ('rollup_unpriced_1h_compacted', 'hour'), ('rollup_devices_1h_compacted', 'hour'),
  ('rollup_day_compacted', 'day'), ('rollup_revenue_day_compacted', 'day'), ('rollup_unpriced_day_compacted', 'day'), ('rollup_devices_day_compacted', 'day');
DO $$
DECLARE g record; app text; rows_all bigint; rows_app bigint; sketch bigint;
BEGIN
  CREATE TEMP TABLE rollup_sizes (app text, name text, rows bigint, bytes bigint, sketch_bytes bigint);
  FOR g IN SELECT * FROM grains LOOP
    CONTINUE WHEN to_regclass(g.name) IS NULL;
    EXECUTE format('SELECT count(*) FROM %I', g.name) INTO rows_all;
    FOREACH app IN ARRAY ARRAY['bench-00', 'bench-30'] LOOP
      EXECUTE format('SELECT count(*), %s FROM %I WHERE app_id = $1 AND %I >= (SELECT max(occurred_at) FROM events)::date - 31 AND %I < (SELECT max(occurred_at) FROM events)::date - 1',
                     CASE WHEN g.name LIKE 'rollup_devices%' THEN 'coalesce(sum(pg_column_size(devices)), 0)' ELSE '0' END, g.name, g.time_column, g.time_column)
        INTO rows_app, sketch USING app;
      INSERT INTO rollup_sizes VALUES (app, g.name, rows_app, CASE WHEN rows_all = 0 THEN 0 ELSE pg_total_relation_size(g.name) * rows_app / rows_all END, sketch);
    END LOOP;
  END LOOP;
END $$;
SELECT app, name, rows, bytes, sketch_bytes FROM rollup_sizes ORDER BY app, name;
SELECT 'app_events_30d', app_id, count(*) FROM events
WHERE app_id IN ('bench-00', 'bench-30') AND occurred_at >= (SELECT max(occurred_at) FROM events)::date - 31 AND occurred_at < (SELECT max(occurred_at) FROM events)::date - 1
GROUP BY app_id ORDER BY app_id;
SQL

echo "== COPY per core ($copy_rows rows, one backend, three times)"
sql -c "\\copy (SELECT * FROM events LIMIT $copy_rows) TO '$work/copy.csv' CSV"
sql -c "\\copy (SELECT app_id, event_id, occurred_at FROM events LIMIT $copy_rows) TO '$work/ids.csv' CSV"
ticks=$(getconf CLK_TCK)
copy_once() {  # copy_once TABLE FILE: prints "seconds cpu_seconds"
  local table=$1 file=$2
  sql -c "TRUNCATE $table" -c "CHECKPOINT"
  psql "$conn" -v ON_ERROR_STOP=1 -qAt <<PSQL
SELECT pg_backend_pid() AS backend \gset
\setenv BACKEND :backend
\! awk '{print \$14 + \$15}' /proc/\$BACKEND/stat > $work/cpu.before; date +%s.%N > $work/wall.before
\copy $table FROM '$file' CSV
\! date +%s.%N > $work/wall.after; awk '{print \$14 + \$15}' /proc/\$BACKEND/stat > $work/cpu.after
PSQL
  python3 -c "print(round(float(open('$work/wall.after').read()) - float(open('$work/wall.before').read()), 3), round((int(open('$work/cpu.after').read()) - int(open('$work/cpu.before').read())) / $ticks, 3))"
}
sql <<'SQL'
CREATE TABLE copy_events (LIKE events INCLUDING DEFAULTS);
CREATE INDEX ON copy_events (app_id, occurred_at);
CREATE TABLE copy_ids (LIKE event_ids INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE copy_ids ADD PRIMARY KEY (app_id, event_id);
SQL
: > "$work/copy.txt"
for round in 1 2 3; do
  echo "events $(copy_once copy_events "$work/copy.csv")" | tee -a "$work/copy.txt"
  echo "ids $(copy_once copy_ids "$work/ids.csv")" | tee -a "$work/copy.txt"
done

echo "== extrapolated to 1 B events a month"
python3 - "$work" "$copy_rows" <<'PY'
import statistics, sys
work, copy_rows = sys.argv[1], int(sys.argv[2])
storage = {}
for line in open(f"{work}/storage.txt"):
    parts = line.split()
    for key, value in zip(parts[0::2], parts[1::2]):
        storage[key] = int(value)
rollups, app_events = {}, {}
for line in open(f"{work}/rollups.txt"):
    parts = line.split()
    if parts[0] == "app_events_30d":
        app_events[parts[1]] = int(parts[2])
    elif len(parts) == 5:
        app, name, rows, size, sketch = parts[0], parts[1], int(parts[2]), int(parts[3]), int(parts[4])
        rollups.setdefault(app, {})[name] = (rows, size, sketch)
copies = {"events": [], "ids": []}
for line in open(f"{work}/copy.txt"):
    kind, wall, cpu = line.split()
    copies[kind].append((float(wall), float(cpu)))

per_event = storage["events_bytes"] / storage["events_rows"]
ledger_per_event = storage["ledger_bytes"] / storage["ledger_rows"]
print(f"raw events: {per_event:.0f} bytes/event ({storage['events_heap_bytes'] / storage['events_rows']:.0f} heap, "
      f"{storage['events_index_bytes'] / storage['events_rows']:.0f} index) over {storage['events_partitions']} daily partitions")
print(f"dedupe ledger: {ledger_per_event:.0f} bytes/event")
for app in sorted(rollups):
    total = sum(size for _, size, _ in rollups[app].values())
    sketches = sum(sketch for _, _, sketch in rollups[app].values())
    rows = sum(r for r, _, _ in rollups[app].values())
    events = app_events.get(app, 0)
    print(f"{app}: {events} events in 30 days -> {rows} rollup rows, {total / 1e6:.1f} MB of rollups (indexes included), "
          f"{sketches / 1e6:.1f} MB of HLL sketches ({total / max(events, 1):.1f} rollup bytes per event)")
    for name, (r, size, sketch) in sorted(rollups[app].items()):
        print(f"    {name:32s} {r:9d} rows {size / 1e6:8.2f} MB" + (f"  sketches {sketch / 1e6:.2f} MB" if sketch else ""))
med = {kind: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for kind, v in copies.items()}
for kind, (wall, cpu) in med.items():
    print(f"COPY {kind}: {copy_rows / wall:,.0f} rows/s wall, {copy_rows / cpu if cpu else 0:,.0f} rows per backend CPU second (median of 3)")
# 1 B events a month.
month = 1_000_000_000
second = month / (30 * 86400)
raw_90 = month * 3 * per_event
ledger_window = month / 30 * 8 * ledger_per_event  # ids kept for the accepted 7 days plus a day
big = rollups.get("bench-00", {})
big_total = sum(s for _, s, _ in big.values())
big_events = app_events.get("bench-00", 1)
print(f"1 B/month = {second:,.0f} events/s on average; 90 days of raw events = {raw_90 / 1e12:.2f} TB; the ledger's 8 days = {ledger_window / 1e9:.1f} GB")
print(f"1 B/month from {month / big_events:,.0f} apps like bench-00 ({big_events:,} events/month each): {month / big_events * big_total / 1e9:.1f} GB of rollups a month "
      f"(rows grow with keys — 15-minute buckets x networks x formats x countries — not with events, so fewer, bigger apps need less)")
copy_rate = copy_rows / med["events"][1] if med["events"][1] else 0
print(f"one core of COPY into events-like tables at {copy_rate:,.0f} rows/CPU-s covers {copy_rate / second:,.0f}x the average rate")
print(f"RESULT events_bytes_per_event={per_event:.0f} ledger_bytes_per_event={ledger_per_event:.0f} "
      f"rollup_mb_per_app_month_largest={big_total / 1e6:.1f} largest_app_events_per_month={big_events} "
      f"copy_rows_per_cpu_second={copy_rate:.0f} copy_rows_per_second={copy_rows / med['events'][0]:.0f} raw_tb_90_days_at_1b={raw_90 / 1e12:.2f}")
PY
