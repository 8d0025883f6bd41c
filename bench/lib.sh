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
  # BENCH_SERVE_ARGS: more `serve` options (word-split).
  # shellcheck disable=SC2086
  "$bin/adtally" serve --data-dir "$data" --port "$port" --pool-size 8 --log-level warning ${BENCH_SERVE_ARGS:-} >> "$work/server.log" 2>&1 &
  server=$!
  for _ in $(seq 1 300); do curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 0.2; done
  curl -fs "http://127.0.0.1:$port/readyz" >/dev/null || { cat "$work/server.log"; exit 1; }
  admin=$("$bin/adtally" keys create --admin --data-dir "$data" | tail -n 1)
  local socket="$data/run"
  [ -S "$socket/.s.PGSQL.5432" ] || socket=$(ls -d /tmp/adtally-* 2>/dev/null | while read -r d; do [ -S "$d/.s.PGSQL.5432" ] && echo "$d"; done | head -n 1)
  conn="host=$socket port=5432 user=adtally dbname=adtally passfile=$data/pgpass"
}

# Stops the server (and its embedded PostgreSQL) and waits until it has exited.
stop_server() {
  kill -TERM "$server"; wait "$server" 2>/dev/null || true
  server=
  # Its PostgreSQL must be down too: the data folder is copied or replaced next.
  for _ in $(seq 1 100); do [ -f "$data/pg/postmaster.pid" ] || return 0; sleep 0.2; done
  echo "the embedded PostgreSQL of $data did not stop"; exit 1
}

# psql on the server's database (after start_server): quiet, unaligned, tuples only,
# stopping at the first error.
sql() { psql "$conn" -v ON_ERROR_STOP=1 -qAt "$@"; }

# 1 while the server's compactor has deltas left to fold, else 0 (EXISTS: the delta
# tables have no index, and a count would scan them beside the compactor).
deltas_pending="SELECT (EXISTS (SELECT 1 FROM rollup_delta) OR EXISTS (SELECT 1 FROM install_delta))::int"

# wait_zero WHAT QUERY TRIES: polls QUERY every half second until it answers 0, or
# fails the bench naming WHAT (with the server log's tail) after TRIES polls.
wait_zero() {
  local what=$1 query=$2 tries=$3
  for _ in $(seq 1 "$tries"); do [ "$(sql -c "$query")" = 0 ] && return 0; sleep 0.5; done
  echo "check=timed out waiting for $what"
  tail "$work/server.log" 2>/dev/null || true
  exit 1
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

# load_events EVENTS APPS: EVENTS realistic events over 35 days for APPS apps (40% of
# them for bench-00, America/New_York; the rest spread evenly over apps in five
# zones), straight into `events` with SQL; then their rollup and install deltas,
# appended as the ingest path does and folded into every grain by the running
# server's compactor.
#
# Devices install and come back (DESIGN §13): every app installs devices on every day
# (one per 40 of its events a day: ~2,860 a day, ~100 k in all, for bench-00 at 10 M
# events), and an event of day k is a device's of age n (days since its install) with
# a weight of its retention, 1 on day 0 and 0.35 n^-0.47 after (~35 % D1, ~14 % D7,
# ~7 % D30): the continuous inverse of that weight picks n, then one of the day's
# retained devices (the first cap x retention of its installs). A device keeps its
# country and platform.
# Needs start_server; sets load_started.
load_events() {
  local events=$1 apps=$2
echo "== loading $events events for $apps apps over 35 days"
load_started=$(date +%s)
sql <<SQL
INSERT INTO apps (app_id, name, timezone, currency)
SELECT 'bench-' || lpad(i::text, 2, '0'), 'Bench ' || i,
       CASE WHEN i = 0 THEN 'America/New_York' ELSE (ARRAY['UTC', 'Asia/Kolkata', 'Europe/London', 'Asia/Tokyo', 'America/Los_Angeles'])[1 + i % 5] END,
       'USD'
FROM generate_series(0, $apps - 1) AS i;

DO \$\$
DECLARE d date;
BEGIN
  -- UTC days (the partitions' bounds), from before the first local midnight of any zone.
  FOR d IN SELECT generate_series((now() AT TIME ZONE 'UTC')::date - 37, (now() AT TIME ZONE 'UTC')::date + 1, interval '1 day')::date LOOP
    EXECUTE format('CREATE TABLE IF NOT EXISTS events_%s PARTITION OF events FOR VALUES FROM (%L) TO (%L)',
                   to_char(d, 'YYYYMMDD'), d::text || ' 00:00:00+00', (d + 1)::text || ' 00:00:00+00');
  END LOOP;
END \$\$;

-- Loaded without the index, which is built once afterwards (as a restore would).
DROP INDEX events_app_time;
SQL
# The events in two halves at once, one per core (half of the generate_series each).
local half pids=()
for half in 0 1; do
sql <<SQL &
INSERT INTO events (app_id, occurred_at, event_id, type, network, format, placement, size, country, platform, os_version,
                    app_version, device, revenue_micros, currency, error_code, will_leave, shown)
SELECT app, at, gen_random_uuid(), type, network, format, placement, CASE WHEN format = 'banner' THEN '320x50' END,
       (ARRAY['US', 'US', 'US', 'JP', 'JP', 'DE', 'GB', 'IN', 'IN', 'BR', 'FR', 'KR', 'CA', 'AU', 'NP', 'MX', 'ID', 'ZZ'])[1 + (idx * 7 + installed * 13) % 18],
       CASE WHEN (idx * 3 + installed) % 20 < 11 THEN 'android' ELSE 'ios' END,
       CASE WHEN (idx * 3 + installed) % 20 < 11 THEN 'android' ELSE 'ios' END || '-17', '3.' || (r5 * 4)::int,
       'device-' || installed || '-' || idx,
       CASE WHEN type IN ('impression', 'tap') AND r5 < 0.6 THEN 200 + (r6 * 9000)::int END,
       CASE WHEN type IN ('impression', 'tap') AND r5 < 0.6 THEN 'USD' END,
       CASE WHEN type = 'error' THEN 1 + (r5 * 4)::int END, CASE WHEN type = 'tap' THEN r5 < 0.5 END,
       CASE WHEN type = 'expiry' THEN r5 < 0.7 END
FROM (
 SELECT a.*, a.k - a.n AS installed,
        -- one of the installs of day k - n still active at age n (the first cap x retention)
        floor(r7 * greatest(1, a.cap * CASE WHEN a.n = 0 THEN 1 ELSE 0.35 * power(a.n::float8, -0.47) END))::int AS idx
 FROM (
  SELECT g.*,
         -- age: 0 with weight 1, else (continuous weight 0.35 x^-0.47 over [1, k + 1]) its inverse
         -- (in float8: numeric powers took 45 minutes over 10 M rows)
         CASE WHEN r8 * (1 + 0.35 * (power((k + 1)::float8, 0.53) - 1) / 0.53) < 1 THEN 0
              ELSE least(k, floor(power((power((k + 1)::float8, 0.53) - 1) * r9 + 1, 1 / 0.53::float8)))::int END AS n,
         CASE WHEN i % 10 < 4 THEN $events * 0.4::float8 / 35 / 40 ELSE $events * 0.6::float8 / greatest($apps - 1, 1) / 35 / 40 END AS cap
  FROM (SELECT i, random() AS r1, random() AS r2, random() AS r3, random() AS r4, random() AS r5, random() AS r6,
               random() AS r7, random() AS r8, random() AS r9, floor(random() * 35)::int AS k
        FROM generate_series(1 + $half * ($events / 2), CASE $half WHEN 0 THEN $events / 2 ELSE $events END) AS i) AS g
 ) AS a
) AS b
-- The app's zone, as the apps above are made.
CROSS JOIN LATERAL (
  SELECT CASE WHEN i % 10 < 4 THEN 'America/New_York'
              ELSE (ARRAY['UTC', 'Asia/Kolkata', 'Europe/London', 'Asia/Tokyo', 'America/Los_Angeles'])[1 + (1 + i % ($apps - 1)) % 5] END AS zone
) AS z
CROSS JOIN LATERAL (
  SELECT CASE WHEN i % 10 < 4 THEN 'bench-00' ELSE 'bench-' || lpad((1 + i % ($apps - 1))::text, 2, '0') END AS app,
         -- day k starts at a local midnight of the app's zone (a device's day 0 is one
         -- local day, as its cohort is); a daily rhythm: more traffic late in the day
         -- (the last, today, only up to now)
         ((now() AT TIME ZONE z.zone)::date - 34 + k)::timestamp AT TIME ZONE z.zone + (power(r2, 0.7) * interval '1 day') AS at,
         CASE WHEN r3 < 0.45 THEN 'request' WHEN r3 < 0.75 THEN 'impression' WHEN r3 < 0.83 THEN 'load' WHEN r3 < 0.88 THEN 'tap'
              WHEN r3 < 0.95 THEN 'error' WHEN r3 < 0.98 THEN 'expiry' ELSE 'action_cancel' END AS type,
         (ARRAY['admob', 'admob', 'admob', 'applovin', 'applovin', 'unity', 'meta', 'iad', 'nend'])[1 + (r4 * 9)::int % 9] AS network,
         (ARRAY['banner', 'banner', 'banner', 'interstitial', 'interstitial', 'native', 'rewarded'])[1 + (r2 * 7000)::int % 7] AS format,
         (ARRAY['home', 'feed', 'level_end', 'settings', 'default'])[1 + (r4 * 5000)::int % 5] AS placement
) AS e
WHERE at < now() - interval '5 minutes';
SQL
pids+=($!)
done
local failed=0 pid
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
[ "$failed" = 0 ] || { echo "the events' load failed"; exit 1; }
sql <<SQL
CREATE INDEX events_app_time ON events (app_id, occurred_at);

VACUUM ANALYZE;
CHECKPOINT;
SQL
# The rollups: the deltas the ingest path appends (append_deltas), a day at a time (one
# partition of events each), folded into every grain by the running server's compactor
# beside the next day's append (one core each). A day is appended once the day before
# the last is folded: the delta tables stay small (a pass reads them whole, as they have
# no index; two weeks pending made every pass read 1 GB). One fixed start (now() differs
# from one statement to the next: windows drawn from it would leave gaps between days).
first_event=$(sql -c "SELECT min(occurred_at) FROM events")
local day
for day in $(seq 0 36); do
  for _ in $(seq 1 900); do
    [ "$(sql -c "SELECT count(*) FROM (SELECT 1 FROM rollup_delta WHERE bucket < '$first_event'::timestamptz + ($day - 1) * interval '1 day' LIMIT 1) AS r")" = 0 ] && break; sleep 0.5
  done
  append_deltas "occurred_at >= '$first_event'::timestamptz + $day * interval '1 day' AND occurred_at < '$first_event'::timestamptz + ($day + 1) * interval '1 day'" >/dev/null
done
wait_zero "the compactor to fold the deltas" "$deltas_pending" 3600
# What compaction left behind, before the VACUUM that ends the load: dead rows and the
# updates made in place (HOT) of every rollup grain.
psql "$conn" -q -c "SELECT relname AS table, n_live_tup AS live, n_dead_tup AS dead, n_tup_upd AS updates,
         round(100.0 * n_tup_hot_upd / NULLIF(n_tup_upd, 0), 1) AS hot_pct
  FROM pg_stat_user_tables WHERE relname ~ '^rollup_' AND relname !~ 'delta|dirty|passes' ORDER BY relname" > "$work/rollup-tables-before-vacuum.txt"
sql -c "VACUUM ANALYZE" -c "CHECKPOINT"
}

# append_deltas CONDITION: the rollup and install deltas of the events matching
# CONDITION (SQL on `events`), appended as the ingest path appends them
# (RollupAccumulator's rows: counts without a revenue dimension, impressions and taps
# with country and currency, '' when unpriced, the device and viewer hashes;
# InstallAccumulator's); prints how many rows.
append_deltas() {
  sql <<SQL
WITH appended AS (
INSERT INTO rollup_delta (app_id, bucket, network, format, country, currency, requests, loads, impressions, errors, taps,
                          action_cancels, expiries, wasted_fills, revenue_micros, priced_events, unpriced_impressions, unpriced_taps,
                          device_hashes, viewer_hashes)
SELECT app_id, date_bin('15 minutes', occurred_at, 'epoch'), network, format,
       CASE WHEN type IN ('impression', 'tap') THEN country END, CASE WHEN type IN ('impression', 'tap') THEN coalesce(currency, '') END,
       count(*) FILTER (WHERE type = 'request'), count(*) FILTER (WHERE type = 'load'), count(*) FILTER (WHERE type = 'impression'),
       count(*) FILTER (WHERE type = 'error'), count(*) FILTER (WHERE type = 'tap'), count(*) FILTER (WHERE type = 'action_cancel'),
       count(*) FILTER (WHERE type = 'expiry'), count(*) FILTER (WHERE type = 'expiry' AND NOT shown),
       coalesce(sum(revenue_micros), 0), count(revenue_micros),
       count(*) FILTER (WHERE revenue_micros IS NULL AND type = 'impression'), count(*) FILTER (WHERE revenue_micros IS NULL AND type = 'tap'),
       array_agg(DISTINCT hll_hash_text(device)::text::bigint) FILTER (WHERE device IS NOT NULL),
       array_agg(DISTINCT hll_hash_text(device)::text::bigint) FILTER (WHERE device IS NOT NULL AND type = 'impression')
FROM events
WHERE $1
GROUP BY 1, 2, 3, 4, 5, 6
RETURNING 1), installs_appended AS (
-- The install deltas (InstallAccumulator's rows): per app, device, 15-minute bucket,
-- network, format, country and reported currency ('' for none), with the earliest event.
INSERT INTO install_delta (app_id, bucket, device, network, format, country, currency, first_at, first_platform, first_version,
                           events, requests, impressions, taps, sessions, revenue_micros, priced_events, unpriced_impressions, unpriced_taps)
SELECT app_id, date_bin('15 minutes', occurred_at, 'epoch'), device, network, coalesce(format, ''), country,
       CASE WHEN type IN ('impression', 'tap') THEN coalesce(currency, '') ELSE '' END,
       min(occurred_at), (array_agg(platform ORDER BY occurred_at, platform, app_version))[1],
       (array_agg(app_version ORDER BY occurred_at, platform, app_version))[1],
       count(*), count(*) FILTER (WHERE type = 'request'), count(*) FILTER (WHERE type = 'impression'),
       count(*) FILTER (WHERE type = 'tap'), count(*) FILTER (WHERE type = 'session'),
       coalesce(sum(revenue_micros) FILTER (WHERE type IN ('impression', 'tap')), 0),
       count(revenue_micros) FILTER (WHERE type IN ('impression', 'tap')),
       count(*) FILTER (WHERE revenue_micros IS NULL AND type = 'impression'), count(*) FILTER (WHERE revenue_micros IS NULL AND type = 'tap')
FROM events
WHERE ($1) AND device IS NOT NULL
GROUP BY 1, 2, 3, 4, 5, 6, 7
RETURNING 1)
SELECT (SELECT count(*) FROM appended) + (SELECT count(*) FROM installs_appended);
SQL
}

# ingest_keys N: apps bench-app-0 … bench-app-(N-1) over the API, each with an ingest key,
# written as app<TAB>key lines to $work/keys.tsv (adtally-bench drive --keys).
ingest_keys() {
  : > "$work/keys.tsv"
  for i in $(seq 0 $(( $1 - 1 ))); do
    curl -fs -X POST -H "Authorization: Bearer $admin" -H 'Content-Type: application/json' \
      -d "{\"app\":\"bench-app-$i\"}" "http://127.0.0.1:$port/v1/apps" >/dev/null
    key=$(curl -fs -X POST -H "Authorization: Bearer $admin" -H 'Content-Type: application/json' \
      -d '{"scope":"ingest"}' "http://127.0.0.1:$port/v1/apps/bench-app-$i/keys" | python3 -c 'import json,sys; print(json.load(sys.stdin)["secret"])')
    printf 'bench-app-%s\t%s\n' "$i" "$key" >> "$work/keys.tsv"
  done
}

# Paced ingest beside another measurement (bench/backlog.sh, bench/erase.sh): after
# `adtally-bench generate` into $work and ingest_keys, start_ingest drives POST /v1/events
# in the background at $rate batches of 100 a second from 4 connections, after the
# batches already sent; stop_ingest NAME ends it, prints its figures prefixed NAME_ (and
# keeps them in $work/NAME.txt, read by `value KEY NAME`), and fails when a request failed.
sent=0
start_ingest() {
  rm -f "$work/stop" "$work/ready"
  "$bin/adtally-bench" drive --url "http://127.0.0.1:$port" --keys "$work/keys.tsv" --batches "$work/batches.jsonl" \
    --connections 4 --rate "$rate" --skip "$sent" --stop-file "$work/stop" --ready-file "$work/ready" > "$work/drive.txt" &
  driver=$!
  for _ in $(seq 1 600); do [ -e "$work/ready" ] && return 0; sleep 0.1; done
  echo "check=the ingest driver did not start"; exit 1
}
stop_ingest() {
  touch "$work/stop"; wait "$driver"
  sed "s/^/$1_/" "$work/drive.txt" | tee "$work/$1.txt"
  sent=$(( sent + $(grep '^batches_sent=' "$work/drive.txt" | cut -d= -f2) ))
  [ "$(grep '^failed_requests=' "$work/drive.txt" | cut -d= -f2)" = 0 ] || { echo "check=ingest requests failed during $1"; exit 1; }
}
value() { grep "^$1=" "$work/$2.txt" | cut -d= -f2; }
