#!/usr/bin/env bash
# make bench-report: the report engine over HTTP against plain PostgreSQL, in one run.
#
# 1. start `adtally serve` on the embedded database (a fresh data folder);
# 2. load BENCH_EVENTS (default 10 M) events over 35 days for BENCH_APPS (60) apps,
#    40% of them for one app (bench-00, America/New_York), the rest spread evenly
#    (apps in five zones), straight into `events` with SQL; then append their rollup
#    deltas as the ingest path does and let the server's compactor fold them into
#    every grain;
# 3. over HTTP, 200 calls of the default report (30 days, date x network) for the
#    largest app before a rate card exists; then a rate card (6 networks x 4 formats,
#    any country and 6 countries) and daily EUR FX rates are added, and 200 calls each
#    for the largest app and a median app: p50, p99;
# 4. the same report as a plain GROUP BY over the raw events in psql (the plain
#    PostgreSQL peer), and a check that both give the same numbers;
#    the same report in EUR (conversion on) and unique_devices by date (30 days): p50;
# 5. one raw-served shape (7 days x country,placement, largest app): p50;
# 6. a CSV export of every app's hour x app x network x format over 35 days,
#    streamed: rows/s and the server's RSS (idle and peak), against psql \copy of
#    the same rows from the same rollups;
# 7. one RESULT line.
set -euo pipefail
cd "$(dirname "$0")/.."
events=${BENCH_EVENTS:-10000000}
apps=${BENCH_APPS:-60}
calls=${BENCH_CALLS:-200}
. bench/lib.sh
start_server
sql() { psql "$conn" -v ON_ERROR_STOP=1 -qAt "$@"; }

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
  FOR d IN SELECT generate_series((now() - interval '36 days')::date, now()::date, interval '1 day')::date LOOP
    EXECUTE format('CREATE TABLE IF NOT EXISTS events_%s PARTITION OF events FOR VALUES FROM (%L) TO (%L)',
                   to_char(d, 'YYYYMMDD'), d::text || ' 00:00:00+00', (d + 1)::text || ' 00:00:00+00');
  END LOOP;
END \$\$;

-- Loaded without the index, which is built once afterwards (as a restore would).
DROP INDEX events_app_time;
INSERT INTO events (app_id, occurred_at, event_id, type, network, format, placement, size, country, platform, os_version,
                    app_version, device, revenue_micros, currency, error_code, will_leave, shown)
SELECT app, at, gen_random_uuid(), type, network, format, placement, CASE WHEN format = 'banner' THEN '320x50' END, country,
       platform, platform || '-17', '3.' || (r5 * 4)::int, 'device-' || (r6 * 200000)::int,
       CASE WHEN type IN ('impression', 'tap') AND r5 < 0.6 THEN 200 + (r6 * 9000)::int END,
       CASE WHEN type IN ('impression', 'tap') AND r5 < 0.6 THEN 'USD' END,
       CASE WHEN type = 'error' THEN 1 + (r5 * 4)::int END, CASE WHEN type = 'tap' THEN r5 < 0.5 END,
       CASE WHEN type = 'expiry' THEN r5 < 0.7 END
FROM (
  SELECT CASE WHEN i % 10 < 4 THEN 'bench-00' ELSE 'bench-' || lpad((1 + i % ($apps - 1))::text, 2, '0') END AS app,
         -- a daily rhythm: more traffic in the (UTC) evening
         now() - interval '35 days' + (floor(r1 * 35) * interval '1 day') + (power(r2, 0.7) * interval '1 day') AS at,
         CASE WHEN r3 < 0.45 THEN 'request' WHEN r3 < 0.75 THEN 'impression' WHEN r3 < 0.83 THEN 'load' WHEN r3 < 0.88 THEN 'tap'
              WHEN r3 < 0.95 THEN 'error' WHEN r3 < 0.98 THEN 'expiry' ELSE 'action_cancel' END AS type,
         (ARRAY['admob', 'admob', 'admob', 'applovin', 'applovin', 'unity', 'meta', 'iad', 'nend'])[1 + (r4 * 9)::int % 9] AS network,
         (ARRAY['banner', 'banner', 'banner', 'interstitial', 'interstitial', 'native', 'rewarded'])[1 + (r2 * 7000)::int % 7] AS format,
         (ARRAY['home', 'feed', 'level_end', 'settings', 'default'])[1 + (r4 * 5000)::int % 5] AS placement,
         (ARRAY['US', 'US', 'US', 'JP', 'JP', 'DE', 'GB', 'IN', 'IN', 'BR', 'FR', 'KR', 'CA', 'AU', 'NP', 'MX', 'ID', 'ZZ'])[1 + (r6 * 18000)::int % 18] AS country,
         CASE WHEN r5 < 0.55 THEN 'android' ELSE 'ios' END AS platform, r5, r6
  FROM (SELECT i, random() AS r1, random() AS r2, random() AS r3, random() AS r4, random() AS r5, random() AS r6
        FROM generate_series(1, $events) AS i) AS g
) AS e
WHERE at < now() - interval '5 minutes';
CREATE INDEX events_app_time ON events (app_id, occurred_at);

VACUUM ANALYZE;
CHECKPOINT;
SQL
# The rollups: the deltas the ingest path appends (RollupAccumulator's rows: counts
# without a revenue dimension, impressions and taps with country and currency, ''
# when unpriced), a week at a time, each folded into every grain by the running
# server's compactor before the next (one pass stays well inside its statement timeout).
# One fixed start (now() differs from one statement to the next: windows drawn
# from it would leave gaps between weeks).
first_event=$(sql -c "SELECT min(occurred_at) FROM events")
for week in 0 1 2 3 4 5; do
  sql <<SQL
INSERT INTO rollup_delta (app_id, bucket, network, format, country, currency, requests, loads, impressions, errors, taps,
                          action_cancels, expiries, wasted_fills, revenue_micros, priced_events, unpriced_impressions, unpriced_taps,
                          device_hashes)
SELECT app_id, date_bin('15 minutes', occurred_at, 'epoch'), network, format,
       CASE WHEN type IN ('impression', 'tap') THEN country END, CASE WHEN type IN ('impression', 'tap') THEN coalesce(currency, '') END,
       count(*) FILTER (WHERE type = 'request'), count(*) FILTER (WHERE type = 'load'), count(*) FILTER (WHERE type = 'impression'),
       count(*) FILTER (WHERE type = 'error'), count(*) FILTER (WHERE type = 'tap'), count(*) FILTER (WHERE type = 'action_cancel'),
       count(*) FILTER (WHERE type = 'expiry'), count(*) FILTER (WHERE type = 'expiry' AND NOT shown),
       coalesce(sum(revenue_micros), 0), count(revenue_micros),
       count(*) FILTER (WHERE revenue_micros IS NULL AND type = 'impression'), count(*) FILTER (WHERE revenue_micros IS NULL AND type = 'tap'),
       array_agg(DISTINCT hll_hash_text(device)::text::bigint) FILTER (WHERE device IS NOT NULL)
FROM events
WHERE occurred_at >= '$first_event'::timestamptz + $week * interval '7 days' AND occurred_at < '$first_event'::timestamptz + ($week + 1) * interval '7 days'
GROUP BY 1, 2, 3, 4, 5, 6;
SQL
  for _ in $(seq 1 600); do [ "$(sql -c "SELECT count(*) FROM rollup_delta")" = 0 ] && break; sleep 1; done
  [ "$(sql -c "SELECT count(*) FROM rollup_delta")" = 0 ] || { echo "the compactor did not fold the deltas"; tail "$work/server.log"; exit 1; }
done
sql -c "VACUUM ANALYZE" -c "CHECKPOINT"

loaded=$(sql -c "SELECT count(*) FROM events")
largest=$(sql -c "SELECT count(*) FROM events WHERE app_id = 'bench-00'")
median_app=bench-30
echo "events_loaded=$loaded largest_app_events=$largest median_app_events=$(sql -c "SELECT count(*) FROM events WHERE app_id = '$median_app'") load_seconds=$(( $(date +%s) - load_started ))"
sql -c "SELECT 'rollup rows: 15m ' || (SELECT count(*) FROM rollup_15m_compacted) || ', 1h ' || (SELECT count(*) FROM rollup_1h_compacted) || ', day ' || (SELECT count(*) FROM rollup_day_compacted)"

trace_on
if [ "${BENCH_TRACE:-0}" = 1 ]; then
  # And the plan of every statement over 300 ms (the export's), from auto_explain.
  sql -c "LOAD 'auto_explain'" -c "ALTER SYSTEM SET session_preload_libraries = 'auto_explain'" \
      -c "ALTER SYSTEM SET auto_explain.log_min_duration = '300ms'" -c "ALTER SYSTEM SET auto_explain.log_analyze = on" \
      -c "SELECT pg_reload_conf()" >/dev/null
  # The server's open connections predate the settings: end them (the pool replaces them).
  sql -c "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()" >/dev/null
fi

url="http://127.0.0.1:$port/v1/reports"
fetch() { "$bin/adtally-bench" fetch --key "$admin" --server-pid "$server" "$@"; }

echo "== HTTP: 30-day date x network before there is a rate card (only reported revenue), $calls calls"
fetch --url "$url?apps=bench-00&days=30&dimensions=date,network" --count "$calls" --name nocard | tee "$work/nocard.txt"
# A rate card (every network and format at an any-country rate, six countries at their
# own) prices the 40% of impressions and taps without reported revenue; daily EUR-based
# FX rates convert the USD amounts for the report in EUR.
sql <<SQL
INSERT INTO rate_cards (network, format, country, currency, cpm_micros, cpt_micros, effective_from)
SELECT n, f, c, 'USD', (1 + length(n) + length(f) + length(c)) * 250000, 20000, (now() - interval '60 days')::date
FROM unnest(ARRAY['admob', 'applovin', 'unity', 'meta', 'iad', 'nend']) AS n,
     unnest(ARRAY['banner', 'interstitial', 'native', 'rewarded']) AS f,
     unnest(ARRAY['*', 'US', 'JP', 'DE', 'GB', 'KR', 'AU']) AS c;
INSERT INTO fx_rates (day, base, currency, rate)
SELECT d::date, 'EUR', c, CASE c WHEN 'EUR' THEN 1 ELSE 1.05 + (extract(doy FROM d)::int % 10) / 100.0 END
FROM generate_series((now() - interval '60 days')::date, now()::date, interval '1 day') AS d, unnest(ARRAY['EUR', 'USD']) AS c;
SQL

echo "== HTTP: 30-day date x network, $calls calls each"
fetch --url "$url?apps=bench-00&days=30&dimensions=date,network" --count "$calls" --name largest | tee "$work/largest.txt"
fetch --url "$url?apps=$median_app&days=30&dimensions=date,network" --count "$calls" --name median | tee "$work/median.txt"

echo "== HTTP: the same report in EUR (every USD amount converted at its day's rate), $calls calls"
fetch --url "$url?apps=bench-00&days=30&dimensions=date,network&currency=EUR" --count "$calls" --name fx | tee "$work/fx.txt"
echo "== HTTP: unique_devices by date, largest app, 30 days, $calls calls"
fetch --url "$url?apps=bench-00&days=30&dimensions=date&metrics=unique_devices" --count "$calls" --name uniques | tee "$work/uniques.txt"

trace_summary

echo "== plain PostgreSQL: the same report as a GROUP BY over raw events (5 runs), and the numbers compared"
range=$(sql -c "SET TimeZone = 'America/New_York'; SELECT ((now()::date - 30)::timestamptz) || '|' || (now()::date::timestamptz)")
from_ts=${range%|*}; to_ts=${range#*|}
peer_sql="SELECT (occurred_at AT TIME ZONE 'America/New_York')::date AS date, network,
  count(*) FILTER (WHERE type = 'request') AS requests, count(*) FILTER (WHERE type = 'impression') AS impressions,
  round(count(*) FILTER (WHERE type = 'impression')::numeric / NULLIF(count(*) FILTER (WHERE type = 'request'), 0), 6) AS fill_rate,
  count(*) FILTER (WHERE type = 'tap') AS taps,
  round(count(*) FILTER (WHERE type = 'tap')::numeric / NULLIF(count(*) FILTER (WHERE type = 'impression'), 0), 6) AS ctr,
  coalesce(sum(revenue_micros) FILTER (WHERE type IN ('impression', 'tap') AND currency = 'USD'), 0) AS revenue_micros
FROM events WHERE app_id = 'bench-00' AND occurred_at >= '$from_ts' AND occurred_at < '$to_ts'
GROUP BY 1, 2 ORDER BY 1, 2"
{ echo '\timing on'; echo '\o /dev/null'; for _ in 1 2 3 4 5; do echo "$peer_sql;"; done; } | psql "$conn" -q 2>&1 | grep '^Time:' | awk '{print $2}' > "$work/peer.txt"
raw_peer_p50=$(sort -n "$work/peer.txt" | sed -n 3p)
echo "raw_peer_runs_ms=$(paste -sd, "$work/peer.txt") raw_peer_p50_ms=$raw_peer_p50"
psql "$conn" -qAt -F, -c "$peer_sql" | awk -F, '{print $1","$2","$3","$4","$6}' > "$work/peer.csv"
curl -fs -H "Authorization: Bearer $admin" "$url?apps=bench-00&days=30&dimensions=date,network&metrics=requests,impressions,taps&format=csv" \
  | tail -n +2 | tr -d '\r' > "$work/engine.csv"
if cmp -s "$work/peer.csv" "$work/engine.csv"; then echo "check=same numbers as the raw GROUP BY ($(wc -l < "$work/engine.csv") rows)"; else
  echo "check=DIFFERENT"; diff "$work/peer.csv" "$work/engine.csv" | head; exit 1; fi

echo "== HTTP: a raw-served shape, 7 days x country,placement (largest app), 20 calls"
fetch --url "$url?apps=bench-00&days=7&dimensions=country,placement" --count 20 --name raw_shape | tee "$work/raw.txt"

echo "== HTTP: CSV export, hour x app x network x format over 35 days, every app"
if [ "${BENCH_PERF:-0}" = 1 ]; then perf record -q -F 499 -g -p "$server" -o "$work/perf.data" 2>/dev/null & perf=$!; sleep 0.5; fi
fetch --url "$url?days=35&tz=UTC&dimensions=hour,app,network,format&format=csv" --count 0 --name export | tee "$work/export.txt"
if [ "${BENCH_TRACE:-0}" = 1 ]; then grep -A60 "Query Text: DECLARE" "$data/run/postgres.log" | head -80; fi
if [ "${BENCH_PERF:-0}" = 1 ]; then
  kill -INT "$perf"; wait "$perf" 2>/dev/null || true
  perf report -q -i "$work/perf.data" --no-children --sort symbol --stdio 2>/dev/null | grep -v '^$' | grep '%' | head -40
fi

echo "== plain PostgreSQL: psql \\copy of the same rows from the same rollups"
copy_sql="SELECT to_char(hour, 'YYYY-MM-DD\"T\"HH24:MI:SSTZH:TZM'), app_id, network, format, sum(requests), sum(impressions),
  round(sum(impressions)::numeric / NULLIF(sum(requests), 0), 6), sum(taps), round(sum(taps)::numeric / NULLIF(sum(impressions), 0), 6),
  round(sum(revenue) / 1000000, 2), round(sum(revenue) * 1000 / NULLIF(sum(impressions), 0) / 1000000, 2)
FROM (SELECT hour, app_id, network, format, requests, impressions, taps, 0::numeric AS revenue FROM rollup_1h_compacted
      WHERE hour >= (now()::date - 35)::timestamptz AND hour < now()::date::timestamptz
      UNION ALL
      SELECT hour, app_id, network, format, 0, 0, 0, revenue_micros FROM rollup_revenue_1h_compacted
      WHERE currency = 'USD' AND hour >= (now()::date - 35)::timestamptz AND hour < now()::date::timestamptz) AS s
GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4"
copy_sql=$(echo "$copy_sql" | tr '\n' ' ')
start=$(date +%s.%N)
psql "$conn" -qc "SET TimeZone = 'UTC'" -c "\\copy ($copy_sql) TO '$work/copy.csv' WITH (FORMAT csv, HEADER)"
end=$(date +%s.%N)
copy_rows=$(( $(wc -l < "$work/copy.csv") - 1 ))
copy_rate=$(python3 -c "print(round($copy_rows / ($end - $start)))")
echo "copy_rows=$copy_rows copy_rows_per_s=$copy_rate"

python3 - "$work" "$copy_rate" "$raw_peer_p50" <<'PY'
import sys
work, copy_rate, raw_peer = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
def read(name):
    return dict(line.strip().split("=", 1) for line in open(f"{work}/{name}.txt") if "=" in line)
largest, median, raw, export = read("largest"), read("median"), read("raw"), read("export")
fx, uniques, nocard = read("fx"), read("uniques"), read("nocard")
export_rate = float(export["export_lines_per_s"])
print(f"ratio_raw_peer_to_report_p50={raw_peer / float(largest['largest_p50_ms']):.0f}")
print(f"ratio_export_to_copy={export_rate / copy_rate:.2f}")
print(f"ratio_fx_report_to_report_p50={float(fx['fx_p50_ms']) / float(largest['largest_p50_ms']):.2f}")
print(f"export_rss_growth_mb={float(export['export_server_peak_rss_mb']) - float(export['export_server_idle_rss_mb']):.1f}")
print("RESULT "
      f"report_p50_ms={largest['largest_p50_ms']} report_p99_ms={largest['largest_p99_ms']} "
      f"median_app_p50_ms={median['median_p50_ms']} median_app_p99_ms={median['median_p99_ms']} "
      f"raw_peer_p50_ms={raw_peer:.1f} raw_shape_p50_ms={raw['raw_shape_p50_ms']} "
      f"export_rows_per_s={export_rate:.0f} export_peak_rss_mb={export['export_server_peak_rss_mb']} "
      f"export_idle_rss_mb={export['export_server_idle_rss_mb']} copy_rows_per_s={copy_rate:.0f} "
      f"fx_report_p50_ms={fx['fx_p50_ms']} uniques_p50_ms={uniques['uniques_p50_ms']} no_card_report_p50_ms={nocard['nocard_p50_ms']}")
PY
