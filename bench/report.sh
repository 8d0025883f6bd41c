#!/usr/bin/env bash
# make bench-report: the report engine over HTTP against plain PostgreSQL, in one run
# that measures every latency twice on the same data (its reproducibility).
#
# 1. start `adtally serve` on the embedded database (a fresh data folder);
# 2. load BENCH_EVENTS (default 10 M) events over 35 days for BENCH_APPS (60) apps,
#    40% of them for one app (bench-00, America/New_York), the rest spread evenly
#    (apps in five zones), straight into `events` with SQL, from devices that install
#    on every day and come back with a retention decay (~100 k installs for bench-00,
#    lib.sh); then append their rollup and install deltas as the ingest path does and
#    let the server's compactor fold them into every grain (the install and cohort
#    grains included); then the rollup tables' dead tuples, bloat and HOT updates, and the
#    compaction passes cut or failed during the load (none, or the bench says so);
#    the loaded data folder is copied aside (`loaded`);
# 3. run 1, over HTTP: 200 calls of the default report (30 days, date x network) for the
#    largest app before a rate card exists; then a rate card (6 networks x 4 formats,
#    any country and 6 countries) is posted (the time until the re-pricer has folded
#    every event: repriced_s) and daily EUR FX rates are added, and 200 calls each
#    for the largest app and a median app: p50, p99;
#    the same report in EUR (conversion on) and unique_devices by date (30 days): p50;
#    the audience (dau, dav, arpdau, impressions_per_dau by date, 30 days) and its peer,
#    the plain date report: p50 (audience_p50_ms, date_report_p50_ms);
#    the largest app's cohort report, 30 install days x D0…D30 of retention and
#    revenue per install: p50, its rows (cohort_p50_ms, cohort_rows; its peer
#    report_p50_ms);
#    the date x network report again with AdMob's imported earnings as its revenue of
#    record (record_report_p50_ms; its peer report_p50_ms);
#    `adtally report` with the server up (wall time, 5 runs);
#    the same report as a plain GROUP BY over the raw events in psql (the plain
#    PostgreSQL peer, which also says how fast the machine is), and a check that both
#    give the same numbers;
#    five card changes, each timed from its POST until the next report shows it;
#    940 more apps (1,000), 100 of them given events each minute for two minutes:
#    the report series refresh's seconds per minute (run 1 only);
# 4. run 2: the server stopped, the loaded data folder put back, the server started on
#    it, and run 1 again but the series; then each figure of the two runs compared
#    (within 20 %, or the bench names the figure as noisy);
# 5. one raw-served shape (7 days x country,placement, largest app): p50;
# 6. a CSV export of every app's hour x app x network x format over 35 days,
#    streamed: rows/s and the server's RSS (idle and peak), against psql \copy of
#    the same rows from the unpriced rollups and (the fair peer) from the priced ones;
#    then 315 more days of hourly history copied into the rollups and the same export
#    over 350 days (~11 M rows): it must finish, rows/s and RSS;
# 7. one RESULT line (run 1's figures, run 2's as run2_*).
#
# BENCH_KEEP=1 keeps the work folder (its `loaded` copy included); BENCH_REUSE=FOLDER
# starts from such a folder's `loaded` copy instead of loading (a run in minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
events=${BENCH_EVENTS:-10000000}
apps=${BENCH_APPS:-60}
calls=${BENCH_CALLS:-200}
. bench/lib.sh
bench_started=$(date +%s)
median_app=bench-30

if [ -n "${BENCH_REUSE:-}" ]; then
  echo "== reusing the data loaded in $BENCH_REUSE"
  cp -a "$BENCH_REUSE/loaded" "$work/loaded"
  cp -a "$work/loaded" "$work/data"
  # The copies written out before anything is timed (their writeback ran under run 1).
  sync
  start_server
else
  start_server
  load_events "$events" "$apps"
  load_seconds=$(( $(date +%s) - load_started ))
  echo "load_seconds=$load_seconds"
fi
loaded=$(sql -c "SELECT count(*) FROM events")
echo "events_loaded=$loaded largest_app_events=$(sql -c "SELECT count(*) FROM events WHERE app_id = 'bench-00'") median_app_events=$(sql -c "SELECT count(*) FROM events WHERE app_id = '$median_app'")"
echo "largest_app_installs=$(sql -c "SELECT count(*) FROM installs WHERE app_id = 'bench-00'") largest_app_device_days=$(sql -c "SELECT count(*) FROM install_days WHERE app_id = 'bench-00'") installs=$(sql -c "SELECT count(*) FROM installs")"
echo "== the install and cohort grains: rows and size (tables and their indexes)"
sql -c "SELECT relname || ' rows=' || n_live_tup || ' mb=' || round(pg_total_relation_size(relid) / 1048576.0, 1) FROM pg_stat_user_tables
        WHERE relname IN ('installs', 'install_days', 'install_day_revenue', 'cohort_days', 'cohort_priced_day') ORDER BY relname"
sql -c "SELECT 'rollup rows: 15m ' || (SELECT count(*) FROM rollup_15m_compacted) || ', 1h ' || (SELECT count(*) FROM rollup_1h_compacted) || ', day ' || (SELECT count(*) FROM rollup_day_compacted)"

[ -f "$work/rollup-tables-before-vacuum.txt" ] && cat "$work/rollup-tables-before-vacuum.txt"
echo "== the rollup tables after the load and its VACUUM: pgstattuple's free space (70 % fill is meant: 30 % kept for updates in place) and dead tuples, sizes"
sql -c "CREATE EXTENSION IF NOT EXISTS pgstattuple" >/dev/null
psql "$conn" -q -c "SELECT s.relname AS table, s.n_live_tup AS live,
         pg_size_pretty(pg_relation_size(s.relid)) AS heap, pg_size_pretty(pg_indexes_size(s.relid)) AS indexes,
         t.free_percent AS heap_free_pct, t.dead_tuple_percent AS heap_dead_pct
  FROM pg_stat_user_tables s, LATERAL pgstattuple(s.relid) t
  WHERE s.relname ~ '^rollup_' AND s.relname !~ '15m|delta|dirty|passes' ORDER BY s.relname"
# Passes cut by their own timeout (each retried smaller) and failed ones, from the server's metrics.
metric() { curl -fs "http://127.0.0.1:$port/metrics" | awk -v name="$1" '$1 == name {print $2; found = 1} END {if (!found) print 0}'; }
cut_passes=$(metric adtally_rollup_compaction_timeouts_total); failed_passes=$(metric adtally_rollup_compaction_failures_total)
if [ -n "${BENCH_REUSE:-}" ]; then echo "compaction during the load: not seen (reused data)"
elif [ "$cut_passes" = 0 ] && [ "$failed_passes" = 0 ]; then echo "compaction during the load: no pass cut by its timeout or failed"
else echo "compaction during the load: $cut_passes passes cut by their own timeout (retried smaller), $failed_passes failed"; fi
echo "compaction_passes_cut=$cut_passes compaction_passes_failed=$failed_passes"

# The loaded state, kept aside so that run 2 starts from exactly what run 1 did.
if [ -z "${BENCH_REUSE:-}" ]; then
  stop_server
  cp -a "$data" "$work/loaded"
  sync
  start_server
fi

# BENCH_TRACE=1: every statement's duration, and the plan of every statement over 300 ms
# (the export's) from auto_explain; set after each start (run 2's folder is the copy).
trace_settings() {
  trace_on
  [ "${BENCH_TRACE:-0}" = 1 ] || return 0
  sql -c "LOAD 'auto_explain'" -c "ALTER SYSTEM SET session_preload_libraries = 'auto_explain'" \
      -c "ALTER SYSTEM SET auto_explain.log_min_duration = '300ms'" -c "ALTER SYSTEM SET auto_explain.log_analyze = on" \
      -c "SELECT pg_reload_conf()" >/dev/null
  # The server's open connections predate the settings: end them (the pool replaces them).
  sql -c "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()" >/dev/null
}
trace_settings

fetch() { "$bin/adtally-bench" fetch --key "$admin" --server-pid "$server" "$@"; }

# One run of every latency on the loaded data; its figures go to $work/runN/.
measure() {
local run=$1 out="$work/run$1"
mkdir -p "$out"
local url="http://127.0.0.1:$port/v1/reports" url_rates="http://127.0.0.1:$port/v1/rates"
# Nothing else runs while a latency is measured: the series of every app (due after the
# load or the restart) are written first (the no-card report measured beside that work
# was slower than the carded one measured after it, in every earlier run).
wait_zero "the report series refresh after the load" "SELECT count(*) FROM apps a WHERE NOT EXISTS (SELECT 1 FROM report_series_refresh r WHERE r.app_id = a.app_id AND r.error IS NULL AND r.due_at > now()) OR EXISTS (SELECT 1 FROM report_series_changes c WHERE c.app_id = a.app_id)" 1200
echo "== run $run: HTTP: 30-day date x network before there is a rate card (only reported revenue), $calls calls"
fetch --url "$url?apps=bench-00&days=30&dimensions=date,network" --count "$calls" --name nocard | tee "$out/nocard.txt"
# A rate card (every network and format at an any-country rate, six countries at their
# own) prices the 40% of impressions and taps without reported revenue; daily EUR-based
# FX rates convert the USD amounts for the report in EUR.
# The card goes through the API, as a user's would: it marks every app's priced rollups
# dirty, reports price those ranges at query time, and the re-pricer folds them back.
sql -c "COPY (SELECT n || ',' || f || ',' || c || ',USD,' || ((1 + length(n) + length(f) + length(c)) * 0.25)::text || ',0.02,' || (now() - interval '60 days')::date
             FROM unnest(ARRAY['admob', 'applovin', 'unity', 'meta', 'iad', 'nend']) AS n,
                  unnest(ARRAY['banner', 'interstitial', 'native', 'rewarded']) AS f,
                  unnest(ARRAY['*', 'US', 'JP', 'DE', 'GB', 'KR', 'AU']) AS c) TO STDOUT" \
  | { echo "network,format,country,currency,cpm,cpt,effective_from"; cat; } > "$work/card.csv"
local card_started repriced_s
card_started=$(date +%s.%N)
curl -fs -X POST -H "Authorization: Bearer $admin" -H 'Content-Type: text/csv' --data-binary "@$work/card.csv" "$url_rates" >/dev/null
wait_zero "the re-pricer" "SELECT count(*) FROM rollup_dirty" 2400
repriced_s=$(python3 -c "print(round($(date +%s.%N) - $card_started, 1))")
# The card marked every app's Grafana series: let their refresh pass before anything is timed.
wait_zero "the report series refresh after the card" "SELECT count(*) FROM report_series_changes" 600
echo "repriced_s=$repriced_s (the card over every one of the $loaded events, folded into the priced rollups)" | tee "$out/repriced.txt"
sql <<SQL
INSERT INTO fx_rates (day, base, currency, rate)
SELECT d::date, 'EUR', c, CASE c WHEN 'EUR' THEN 1 ELSE 1.05 + (extract(doy FROM d)::int % 10) / 100.0 END
FROM generate_series((now() - interval '60 days')::date, now()::date, interval '1 day') AS d, unnest(ARRAY['EUR', 'USD']) AS c;
SQL

echo "== run $run: HTTP: 30-day date x network, $calls calls each"
fetch --url "$url?apps=bench-00&days=30&dimensions=date,network" --count "$calls" --name largest | tee "$out/largest.txt"
fetch --url "$url?apps=$median_app&days=30&dimensions=date,network" --count "$calls" --name median | tee "$out/median.txt"

echo "== run $run: HTTP: the same report in EUR (every USD amount converted at its day's rate), $calls calls"
fetch --url "$url?apps=bench-00&days=30&dimensions=date,network&currency=EUR" --count "$calls" --name fx | tee "$out/fx.txt"
echo "== run $run: HTTP: unique_devices by date, largest app, 30 days, $calls calls"
fetch --url "$url?apps=bench-00&days=30&dimensions=date&metrics=unique_devices" --count "$calls" --name uniques | tee "$out/uniques.txt"
echo "== run $run: HTTP: the audience (dau, dav, arpdau, impressions per DAU) by date for the largest app, and its peer: the plain date report"
fetch --url "$url?apps=bench-00&days=30&dimensions=date&metrics=dau,dav,arpdau,impressions_per_dau" --count "$calls" --name audience | tee "$out/audience.txt"
fetch --url "$url?apps=bench-00&days=30&dimensions=date" --count "$calls" --name date_report | tee "$out/date_report.txt"
# The 30 oldest whole install days after the first (the loaded history's first local
# day holds the devices of every day before it): the triangle with the most mature cells.
echo "== run $run: HTTP: the largest app's cohorts, 30 install days x D0…D30 of retention and revenue per install (America/New_York), $calls calls"
local cohort_from cohort_query
cohort_from=$(sql -c "SELECT (now() AT TIME ZONE 'America/New_York')::date - 33")
cohort_query="apps=bench-00&dimensions=cohort&from=$cohort_from&to=$(sql -c "SELECT '$cohort_from'::date + 29")&tz=America/New_York&metrics=installs,$(python3 -c 'print(",".join([f"retention_d{n}" for n in range(31)] + [f"revenue_per_install_d{n}" for n in range(31)]))')"
fetch --url "$url?$cohort_query" --count "$calls" --name cohort | tee "$out/cohort.txt"
curl -fsS -H "Authorization: Bearer $admin" "$url?$cohort_query" | python3 -c '
import json, sys
d = json.load(sys.stdin)
t = d["totals"]
print("cohort_rows=%d" % len(d["rows"]), *["cohort_%s=%s" % (k, t[k]) for k in ("installs", "retention_d1", "retention_d7", "retention_d30", "revenue_per_install_d30")])
print("cohort_source=" + d["notes"]["source"].split(":")[1].split(",")[0].strip().replace(" ", "_"))' | tee -a "$out/cohort.txt"

echo "== run $run: HTTP: the same 30-day date x network with AdMob's earnings as the revenue of record, $calls calls"
# AdMob's own report of its Los Angeles days for the largest app (a generic CSV in its
# zone, through the API), every day final: each admob row's revenue is AdMob's, spread
# over the day's impressions by the UTC hour. The peer: the same report (largest_p50_ms).
# Its days start after the app's first event (an import refuses a day before it).
sql -c "COPY (SELECT d::date || ',bench-00,admob,' || f || ',US,' || (1000 + extract(doy FROM d)::int) || ',10,' || (12.5 + extract(doy FROM d)::int % 7) || ',USD,America/Los_Angeles'
             FROM generate_series((now() - interval '34 days')::date, (now() - interval '1 day')::date, interval '1 day') AS d,
                  unnest(ARRAY['banner', 'interstitial', 'native', 'rewarded']) AS f) TO STDOUT" \
  | { echo "date,app,network,format,country,impressions,clicks,revenue,currency,timezone"; cat; } > "$work/admob.csv"
curl -fsS -X POST -H "Authorization: Bearer $admin" -H 'Content-Type: text/csv' --data-binary "@$work/admob.csv" "http://127.0.0.1:$port/v1/network-reports?source=csv" >/dev/null
curl -fsS -X PUT -H "Authorization: Bearer $admin" -H 'Content-Type: application/json' -d '{"revenue_source": "network_when_final", "final_after_days": 0}' \
  "http://127.0.0.1:$port/v1/network-settings/admob" >/dev/null
fetch --url "$url?apps=bench-00&days=30&dimensions=date,network" --count "$calls" --name record | tee "$out/record.txt"
curl -fsS -X PUT -H "Authorization: Bearer $admin" -H 'Content-Type: application/json' -d '{"revenue_source": "sdk"}' "http://127.0.0.1:$port/v1/network-settings/admob" >/dev/null

trace_summary

echo "== run $run: adtally report (the default report, JSON) with the server up: wall time, 5 runs"
: > "$out/cli_runs.txt"
local start
for _ in 1 2 3 4 5; do
  start=$(date +%s%N)
  "$bin/adtally" report --data-dir "$data" --apps bench-00 --days 30 --dimensions date,network --format json > /dev/null
  echo $(( ($(date +%s%N) - start) / 1000000 )) >> "$out/cli_runs.txt"
done
echo "cli_report_runs_ms=$(paste -sd, "$out/cli_runs.txt") cli_report_ms=$(sort -n "$out/cli_runs.txt" | sed -n 3p)" | tee "$out/cli.txt"

echo "== run $run: plain PostgreSQL: the same report as a GROUP BY over raw events (5 runs), and the numbers compared"
local range from_ts to_ts peer_sql
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
{ echo '\timing on'; echo '\o /dev/null'; for _ in 1 2 3 4 5; do echo "$peer_sql;"; done; } | psql "$conn" -q 2>&1 | grep '^Time:' | awk '{print $2}' > "$out/peer_runs.txt"
echo "raw_peer_runs_ms=$(paste -sd, "$out/peer_runs.txt") raw_peer_p50_ms=$(sort -n "$out/peer_runs.txt" | sed -n 3p)" | tee "$out/peer.txt"
psql "$conn" -qAt -F, -c "$peer_sql" | awk -F, '{print $1","$2","$3","$4","$6}' > "$work/peer.csv"
curl -fs -H "Authorization: Bearer $admin" "$url?apps=bench-00&days=30&dimensions=date,network&metrics=requests,impressions,taps&format=csv" \
  | tail -n +2 | tr -d '\r' > "$work/engine.csv"
if cmp -s "$work/peer.csv" "$work/engine.csv"; then echo "check=same numbers as the raw GROUP BY ($(wc -l < "$work/engine.csv") rows)"; else
  echo "check=DIFFERENT"; diff "$work/peer.csv" "$work/engine.csv" | head; exit 1; fi

echo "== run $run: a card change: wall time from its POST until the next report shows it (5 changes)"
: > "$out/visible_runs.txt"
local cpm before
for cpm in 3.10 3.20 3.30 3.40 3.50; do
  before=$(curl -fs -H "Authorization: Bearer $admin" "$url?apps=bench-00&days=30&metrics=estimated_revenue" | python3 -c 'import json,sys; print(json.load(sys.stdin)["totals"]["estimated_revenue"])')
  python3 - "$url_rates" "$url" "$admin" "$cpm" "$before" >> "$out/visible_runs.txt" <<'PY'
import json, sys, time, urllib.request
rates, report, key, cpm, before = sys.argv[1:]
headers = {"Authorization": f"Bearer {key}"}
day = time.strftime("%Y-%m-%d", time.gmtime(time.time() - 20 * 86400))
body = json.dumps({"rates": [{"network": "admob", "format": "banner", "country": "US", "currency": "USD", "cpm": cpm, "cpt": "0.02", "effective_from": day}]}).encode()
start = time.monotonic()
urllib.request.urlopen(urllib.request.Request(rates, data=body, headers={**headers, "Content-Type": "application/json"}, method="POST")).read()
query = f"{report}?apps=bench-00&days=30&metrics=estimated_revenue"
after = json.load(urllib.request.urlopen(urllib.request.Request(query, headers=headers)))["totals"]["estimated_revenue"]
elapsed = (time.monotonic() - start) * 1000
print(f"{elapsed:.1f} {'visible' if after != before else 'NOT VISIBLE'}")
PY
  # The next change waits for the re-pricer, not for the series refresh the change
  # started (at most a minute away): that runs beside it, as after any change.
  wait_zero "the re-pricer after a card change" "SELECT count(*) FROM rollup_dirty" 600
done
cat "$out/visible_runs.txt"
if grep -q "NOT VISIBLE" "$out/visible_runs.txt"; then echo "check=a card change was not visible in the next report"; exit 1; fi
echo "card_change_visible_ms=$(sort -n "$out/visible_runs.txt" | sed -n 3p | cut -d' ' -f1) (median of 5; the report prices the dirty range at query time)" | tee "$out/visible.txt"

# The series of 1,000 apps: run 1 only (four minutes of waiting and sampling; not a latency).
[ "$run" = 1 ] || return 0
echo "== run $run: the report series of 1,000 apps, 10% of them receiving events each minute: refresh seconds per minute"
sql -c "INSERT INTO apps (app_id, name, timezone, currency)
        SELECT 'series-' || lpad(i::text, 4, '0'), 'Series ' || i, (ARRAY['UTC', 'Asia/Kolkata', 'Europe/London', 'America/New_York'])[1 + i % 4], 'USD'
        FROM generate_series($apps, 999) AS i" >/dev/null
# Every app written once (the first pass for the new apps) and what the card changes
# marked written, then two minutes measured.
wait_zero "the first refresh of 1,000 apps" "SELECT count(*) FROM apps a WHERE NOT EXISTS (SELECT 1 FROM report_series_refresh r WHERE r.app_id = a.app_id)" 600
wait_zero "the report series refresh after the card changes" "SELECT count(*) FROM report_series_changes" 600
refresh_sum() { curl -fs "http://127.0.0.1:$port/metrics" | awk '/^adtally_report_series_refresh_seconds_sum/ {print $2}'; }
local series_before series_started series_after
series_before=$(refresh_sum); series_started=$(date +%s.%N)
for _ in 1 2; do
  # 100 of the 1,000 apps get a quarter hour of events (as deltas, the ingest path's rows).
  sql -c "INSERT INTO rollup_delta (app_id, bucket, network, format, country, currency, requests, loads, impressions, errors, taps,
                                    action_cancels, expiries, wasted_fills, revenue_micros, priced_events, unpriced_impressions, unpriced_taps)
          SELECT app_id, date_bin('15 minutes', now(), 'epoch'), 'admob', 'banner', 'US', '', 10, 0, 8, 0, 1, 0, 0, 0, 0, 0, 8, 1
          FROM (SELECT app_id FROM apps ORDER BY random() LIMIT 100) AS a" >/dev/null
  sleep 60
done
series_after=$(refresh_sum)
echo "series_cpu_s_per_min_1000_apps=$(python3 -c "print(round(($series_after - $series_before) / (($(date +%s.%N) - $series_started) / 60), 2))") (the refresh passes' wall seconds per minute, an upper bound of their CPU; 100 apps changed each minute)" | tee "$out/series.txt"
}

measure 1
echo "== run 2: the loaded data put back, the server restarted on it"
stop_server
rm -rf "$data"
# (Moved back when the work folder is not kept: the copy takes a minute.)
if [ "${BENCH_KEEP:-0}" = 1 ]; then cp -a "$work/loaded" "$data"; else mv "$work/loaded" "$data"; fi
sync
start_server
trace_settings
measure 2
url="http://127.0.0.1:$port/v1/reports"
# The series step's refresh and deltas settle before anything else is timed.
wait_zero "the series refresh after run 2" "SELECT (SELECT count(*) FROM report_series_changes) + (SELECT count(*) FROM rollup_delta)" 600

echo "== HTTP: a raw-served shape, 7 days x country,placement (largest app), 20 calls"
fetch --url "$url?apps=bench-00&days=7&dimensions=country,placement" --count 20 --name raw_shape | tee "$work/raw.txt"

echo "== HTTP: CSV export, hour x app x network x format over 35 days, every app"
if [ "${BENCH_PERF:-0}" = 1 ]; then perf record -q -F 499 -g -p "$server" -o "$work/perf.data" 2>/dev/null & perf=$!; sleep 0.5; fi
fetch --url "$url?days=35&tz=UTC&dimensions=hour,app,network,format&format=csv" --count 0 --name export | tee "$work/export.txt"
if [ "${BENCH_TRACE:-0}" = 1 ]; then grep -A60 "Query Text: DECLARE" "$data/run/postgres.log" | head -80 || true; fi
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
# copy_peer NAME SQL: psql \copy of SQL's rows to NAME.csv; sets peer_rows and peer_rate.
copy_peer() {
  local sql_text
  sql_text=$(echo "$2" | tr '\n' ' ')
  local start end
  start=$(date +%s.%N)
  psql "$conn" -qc "SET TimeZone = 'UTC'" -c "\\copy ($sql_text) TO '$work/$1.csv' WITH (FORMAT csv, HEADER)"
  end=$(date +%s.%N)
  peer_rows=$(( $(wc -l < "$work/$1.csv") - 1 ))
  peer_rate=$(python3 -c "print(round($peer_rows / ($end - $start)))")
}
copy_peer copy "$copy_sql"
copy_rows=$peer_rows copy_rate=$peer_rate
echo "copy_rows=$copy_rows copy_rows_per_s=$copy_rate"

echo "== plain PostgreSQL: psql \\copy of the same rows from the priced rollups (the rows the engine reads, revenue priced)"
fair_sql="SELECT to_char(hour, 'YYYY-MM-DD\"T\"HH24:MI:SSTZH:TZM'), app_id, network, format, sum(requests), sum(impressions),
  round(sum(impressions)::numeric / NULLIF(sum(requests), 0), 6), sum(taps), round(sum(taps)::numeric / NULLIF(sum(impressions), 0), 6),
  round(sum(revenue) / 1000000, 2), round(sum(revenue) * 1000 / NULLIF(sum(impressions), 0) / 1000000, 2)
FROM (SELECT hour, app_id, network, format, requests, impressions, taps, 0::numeric AS revenue FROM rollup_1h_compacted
      WHERE network <> '' AND hour >= (now()::date - 35)::timestamptz AND hour < now()::date::timestamptz
      UNION ALL
      SELECT hour, app_id, network, format, 0, 0, 0, round(reported + estimated) FROM rollup_priced_1h
      WHERE currency = 'USD' AND hour >= (now()::date - 35)::timestamptz AND hour < now()::date::timestamptz) AS s
GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4"
copy_peer fair "$fair_sql"
fair_rate=$peer_rate
echo "fair_copy_rows=$peer_rows export_fair_copy_rows_per_s=$fair_rate"

echo "== HTTP: a 10x range: 315 more days of hourly history copied into the rollups (as a restore would write them), then every app's hour x app x network x format over 350 days"
# The copies are of the loaded 35 days' hours from the first one (not from today's date:
# a run that crossed midnight copied the newest hour onto the oldest loaded one).
first_hour=$(sql -c "SELECT min(hour) FROM rollup_1h_compacted")
history="FROM %s, generate_series(1, 9) AS k WHERE hour >= '$first_hour'::timestamptz AND hour < '$first_hour'::timestamptz + interval '840 hours'"
# shellcheck disable=SC2059
sql -c "INSERT INTO rollup_1h_compacted (app_id, hour, network, format, requests, loads, impressions, errors, taps, action_cancels, expiries, wasted_fills, sessions)
        SELECT app_id, hour - k * interval '840 hours', network, format, requests, loads, impressions, errors, taps, action_cancels, expiries, wasted_fills, sessions
        $(printf "$history" rollup_1h_compacted)" \
    -c "INSERT INTO rollup_priced_1h (app_id, hour, network, format, currency, reported, estimated, unrated)
        SELECT app_id, hour - k * interval '840 hours', network, format, currency, reported, estimated, unrated $(printf "$history" rollup_priced_1h)" \
    -c "VACUUM ANALYZE rollup_1h_compacted" -c "VACUUM ANALYZE rollup_priced_1h" >/dev/null
fetch --url "$url?days=350&tz=UTC&dimensions=hour,app,network,format&format=csv" --count 0 --name big_export | tee "$work/big_export.txt"


BENCH_SECONDS=$(( $(date +%s) - bench_started ))
echo "bench_seconds=$BENCH_SECONDS"
BENCH_SECONDS=$BENCH_SECONDS BENCH_LOAD_SECONDS=${load_seconds:-} python3 - "$work" "$copy_rate" "$fair_rate" <<'PY'
import os, sys
work, copy_rate, fair_rate = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
import re
def read(name, run=None):
    path = f"{work}/run{run}/{name}.txt" if run else f"{work}/{name}.txt"
    return dict(re.findall(r"(\w+)=([^\s,]+)", open(path).read()))
def figures(run):
    f = {}
    for name in ["nocard", "largest", "median", "fx", "uniques", "audience", "date_report", "cohort", "record"]:
        got = read(name, run)
        f[f"{name}_p50_ms"] = float(got[f"{name}_p50_ms"])
        f[f"{name}_p99_ms"] = float(got[f"{name}_p99_ms"])
    f["card_change_visible_ms"] = float(read("visible", run)["card_change_visible_ms"])
    f["cli_report_ms"] = float(read("cli", run)["cli_report_ms"])
    f["raw_peer_p50_ms"] = float(read("peer", run)["raw_peer_p50_ms"])
    f["repriced_s"] = float(read("repriced", run)["repriced_s"])
    if run == 1: f["series_cpu_s_per_min_1000_apps"] = float(read("series", run)["series_cpu_s_per_min_1000_apps"])
    return f
one, two = figures(1), figures(2)
raw, export, big = read("raw"), read("export"), read("big_export")
# Reproducibility: every figure of run 2 against run 1's.
noisy = []
print("== run 1 against run 2")
for key in two:
    spread = abs(two[key] - one[key]) / max(min(one[key], two[key]), 1e-9) * 100
    flag = "" if spread <= 20 else "  NOISY (over 20 %)"
    if flag: noisy.append(key)
    print(f"{key:40s} {one[key]:10.2f} {two[key]:10.2f}  {spread:5.1f} %{flag}")
print("reproducible=" + ("yes: every figure of run 2 within 20 % of run 1's" if not noisy else "no: " + ", ".join(noisy) + " differ by more than 20 %"))
for run, f in (("", one), ("run2_", two)):
    print(f"{run}ratio_report_to_no_card_report_p50={f['largest_p50_ms'] / f['nocard_p50_ms']:.2f} "
          f"{run}ratio_record_report_to_report_p50={f['record_p50_ms'] / f['largest_p50_ms']:.2f} "
          f"{run}ratio_audience_to_report_p50={f['audience_p50_ms'] / f['largest_p50_ms']:.2f} "
          f"{run}ratio_audience_to_date_report_p50={f['audience_p50_ms'] / f['date_report_p50_ms']:.2f} "
          f"{run}ratio_fx_report_to_report_p50={f['fx_p50_ms'] / f['largest_p50_ms']:.2f} "
          f"{run}ratio_cohort_to_report_p50={f['cohort_p50_ms'] / f['largest_p50_ms']:.2f} "
          f"{run}ratio_raw_peer_to_report_p50={f['raw_peer_p50_ms'] / f['largest_p50_ms']:.0f}")
export_rate = float(export["export_lines_per_s"])
print(f"ratio_export_to_copy={export_rate / copy_rate:.2f}")
print(f"ratio_export_to_fair_copy={export_rate / fair_rate:.2f}")
print(f"export_rss_growth_mb={float(export['export_server_peak_rss_mb']) - float(export['export_server_idle_rss_mb']):.1f}")
print(f"big_export_rows={big['big_export_lines']} big_export_rss_growth_mb={float(big['big_export_server_peak_rss_mb']) - float(big['big_export_server_idle_rss_mb']):.1f}")
print("RESULT "
      f"report_p50_ms={one['largest_p50_ms']} report_p99_ms={one['largest_p99_ms']} "
      f"median_app_p50_ms={one['median_p50_ms']} median_app_p99_ms={one['median_p99_ms']} "
      f"raw_peer_p50_ms={one['raw_peer_p50_ms']:.1f} raw_shape_p50_ms={raw['raw_shape_p50_ms']} "
      f"export_rows_per_s={export_rate:.0f} export_peak_rss_mb={export['export_server_peak_rss_mb']} "
      f"export_idle_rss_mb={export['export_server_idle_rss_mb']} copy_rows_per_s={copy_rate:.0f} "
      f"fx_report_p50_ms={one['fx_p50_ms']} uniques_p50_ms={one['uniques_p50_ms']} no_card_report_p50_ms={one['nocard_p50_ms']} "
      f"export_fair_copy_rows_per_s={fair_rate:.0f} series_cpu_s_per_min_1000_apps={one['series_cpu_s_per_min_1000_apps']} "
      f"card_change_visible_ms={one['card_change_visible_ms']:.1f} repriced_s={one['repriced_s']} cli_report_ms={one['cli_report_ms']:.0f} "
      f"big_export_rows_per_s={float(big['big_export_lines_per_s']):.0f} "
      f"audience_p50_ms={one['audience_p50_ms']} date_report_p50_ms={one['date_report_p50_ms']} "
      f"cohort_p50_ms={one['cohort_p50_ms']} cohort_p99_ms={one['cohort_p99_ms']} cohort_rows={read('cohort', 1)['cohort_rows']} "
      f"ratio_cohort_to_report_p50={one['cohort_p50_ms'] / one['largest_p50_ms']:.2f} run2_cohort_p50_ms={two['cohort_p50_ms']} "
      f"record_report_p50_ms={one['record_p50_ms']} record_revenue_report_p50_ms={one['record_p50_ms']} "
      f"run2_report_p50_ms={two['largest_p50_ms']} run2_report_p99_ms={two['largest_p99_ms']} run2_no_card_report_p50_ms={two['nocard_p50_ms']} "
      f"run2_audience_p50_ms={two['audience_p50_ms']} run2_record_revenue_report_p50_ms={two['record_p50_ms']} "
      f"run2_repriced_s={two['repriced_s']} "
      f"load_seconds={os.environ.get('BENCH_LOAD_SECONDS') or 'reused'} bench_seconds={os.environ['BENCH_SECONDS']} "
      f"reproducible={'yes' if not noisy else 'no'}")
PY
