#!/usr/bin/env bash
# make bench-mediation: GET /v1/apps/{app}/mediation under keep-alive load, against a
# static file with the same bytes served by the same server (--static-dir), in one run.
#
# 1. start `adtally serve` on the embedded database with /static/ served from a folder;
# 2. load BENCH_EVENTS (default 1 M) events over 35 days for 10 apps (bench/lib.sh);
# 3. set an automatic policy for the largest app through the admin API (it is decided
#    at once: the PUT's time is the decision's cost, a report over the window) and
#    write the answer it serves into the static folder, byte for byte;
# 4. wrk (2 threads, BENCH_CONNECTIONS keep-alive connections, default 32) for
#    BENCH_SECONDS (default 10) against each, in turns, BENCH_ROUNDS times (default 3):
#    the mediation answer (ingest key), the static file, and the mediation answer
#    revalidated with If-None-Match (304), and /healthz (the server's floor: a fixed
#    answer without a key); medians of req/s, p50 and p99;
#    Then, in the same rounds, devices asking placement `home` with their ids (a wrk
#    script draws one of 100,000 ids a request): without an experiment (the placement's
#    pinned policy answers), and with one running on it (each device answered its arm,
#    its first exposure queued and written in batches: DESIGN §14), started before and
#    stopped after each round's run;
# 5. the mediation decisions the server computed meanwhile
#    (adtally_mediation_decisions_total): the answers come from memory, so only the
#    background refresh computes any (one a minute here); and all the reports it ran
#    (adtally_report_reads_total: the Grafana series' refresh runs most);
# 6. one RESULT line.
set -euo pipefail
cd "$(dirname "$0")/.."
events=${BENCH_EVENTS:-1000000}
seconds=${BENCH_SECONDS:-10}
rounds=${BENCH_ROUNDS:-3}
connections=${BENCH_CONNECTIONS:-32}
if ! command -v wrk >/dev/null; then
  echo "installing wrk"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq wrk >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq wrk >/dev/null; }
fi
. bench/lib.sh
mkdir -p "$work/static"
BENCH_SERVE_ARGS="--static-dir $work/static --mediation-refresh 60" start_server
load_events "$events" 10

base="http://127.0.0.1:$port"
ingest=$("$bin/adtally" keys create --app bench-00 --scope ingest --data-dir "$data" | tail -n 1)
echo "== policy: automatic over the app's networks, 24 h window, ≥ 100 requests"
decision_ms=$(curl -fsS -o "$work/policy.json" -w '%{time_total}' -X PUT "$base/v1/apps/bench-00/mediation/policies" \
  -H "Authorization: Bearer $admin" -H 'Content-Type: application/json' \
  -d '{"rule": "automatic", "default": "admob", "window_hours": 24, "min_requests": 100}' | python3 -c 'import sys; print(round(float(sys.stdin.read()) * 1000, 1))')
curl -fsS -D "$work/headers.txt" -o "$work/static/mediation.json" -H "Authorization: Bearer $ingest" "$base/v1/apps/bench-00/mediation"
etag=$(grep -i '^etag:' "$work/headers.txt" | cut -d' ' -f2- | tr -d '\r')
echo "answer: $(wc -c < "$work/static/mediation.json") bytes, ETag $etag, decided in $decision_ms ms (the PUT)"
head -c 300 "$work/static/mediation.json"; echo " …"
curl -fsS "$base/static/mediation.json" | cmp - "$work/static/mediation.json"

# Devices with their ids (one of 100,000 a request), for the experiment's runs.
cat > "$work/devices.lua" <<'LUA'
math.randomseed(2026)
request = function()
  return wrk.format("GET", "/v1/apps/bench-00/mediation?placement=home&device=bench-device-" .. math.random(1, 100000))
end
LUA
curl -fsS -o /dev/null -X PUT "$base/v1/apps/bench-00/mediation/policies" -H "Authorization: Bearer $admin" -H 'Content-Type: application/json' \
  -d '{"placement": "home", "rule": "pinned", "network": "admob"}'

metric() { curl -fsS "$base/metrics" | awk -v name="$1" '$1 ~ "^" name "({|$)" { sum += $NF } END { print sum + 0 }'; }
run() { # run NAME URL [HEADER…]: one wrk run, its numbers appended to $work/NAME.txt
  local name=$1 url=$2; shift 2
  local args=(-t2 -c"$connections" -d"${seconds}s" --latency)
  if [ -n "${WRK_SCRIPT:-}" ]; then args+=(-s "$WRK_SCRIPT"); fi
  for header in "$@"; do args+=(-H "$header"); done
  wrk "${args[@]}" "$url" > "$work/wrk.txt"
  python3 - "$work/wrk.txt" >> "$work/$name.txt" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
def ms(label):
    m = re.search(rf"^\s*{label}\s+([0-9.]+)(us|ms|s)\s*$", text, re.M)
    value = float(m.group(1))
    return value / 1000 if m.group(2) == "us" else value * 1000 if m.group(2) == "s" else value
rps = float(re.search(r"Requests/sec:\s+([0-9.]+)", text).group(1))
errors = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
print(rps, ms("50%"), ms("99%"), int(errors.group(1)) if errors else 0)
PY
  tail -n 1 "$work/$name.txt" | awk -v n="$name" '{ printf "%-14s %9.0f req/s  p50 %6.3f ms  p99 %6.3f ms  non-2xx/3xx %d\n", n, $1, $2, $3, $4 }'
}
decisions_before=$(metric adtally_mediation_decisions_total)
reports_before=$(metric adtally_report_reads_total)
echo "== wrk: $rounds rounds of ${seconds} s each, $connections keep-alive connections, 2 threads"
exposures_before=$(metric adtally_experiment_exposures_total)
for round in $(seq 1 "$rounds"); do
  run mediation "$base/v1/apps/bench-00/mediation" "Authorization: Bearer $ingest"
  run static "$base/static/mediation.json"
  run revalidated "$base/v1/apps/bench-00/mediation" "Authorization: Bearer $ingest" "If-None-Match: $etag"
  run healthz "$base/healthz"
  WRK_SCRIPT="$work/devices.lua" run device "$base/v1/apps/bench-00/mediation" "Authorization: Bearer $ingest"
  curl -fsS -o /dev/null -X POST "$base/v1/apps/bench-00/experiments" -H "Authorization: Bearer $admin" -H 'Content-Type: application/json' \
    -d "{\"name\": \"bench-$round\", \"placement\": \"home\", \"control\": \"pinned:admob\", \"treatment\": \"pinned:unity\", \"treatment_share\": 50}"
  WRK_SCRIPT="$work/devices.lua" run experiment "$base/v1/apps/bench-00/mediation" "Authorization: Bearer $ingest"
  curl -fsS -o /dev/null -X POST "$base/v1/apps/bench-00/experiments/bench-$round/stop" -H "Authorization: Bearer $admin" -H 'Content-Type: application/json' -d '{"keep": "control"}'
done
sleep 2
exposures=$(( $(metric adtally_experiment_exposures_total) - exposures_before ))
deferred=$(metric adtally_experiment_exposures_deferred_total)
echo "exposures written during the experiment runs: $exposures (deferred by a full queue: $deferred)"
# The tag covers the choice, not the numbers: it holds across the refreshes of the run
# unless the network changed (then the revalidated runs counted 200s).
still=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $ingest" -H "If-None-Match: $etag" "$base/v1/apps/bench-00/mediation")
[ "$still" = 304 ] || echo "warning: the served network changed during the run ($still for the first ETag): the revalidated figures include 200s"
decisions=$(( $(metric adtally_mediation_decisions_total) - decisions_before ))
reports=$(( $(metric adtally_report_reads_total) - reports_before ))
echo "during the load: $decisions mediation decisions computed (the background refresh), $reports reports run in all (most by the Grafana series' refresh)"
python3 - "$work" "$decision_ms" "$decisions" "$exposures" <<'PY'
import statistics, sys
work, decision_ms, decisions, exposures = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
def medians(name):
    rows = [list(map(float, line.split())) for line in open(f"{work}/{name}.txt")]
    if any(row[3] for row in rows):
        sys.exit(f"{name}: non-2xx/3xx answers under load")
    return [statistics.median(column) for column in zip(*rows)][:3]
m, s, r, h = medians("mediation"), medians("static"), medians("revalidated"), medians("healthz")
d, x = medians("device"), medians("experiment")
print(f"RESULT mediation_rps={m[0]:.0f} mediation_p50_ms={m[1]:.3f} mediation_p99_ms={m[2]:.3f} "
      f"static_rps={s[0]:.0f} static_p50_ms={s[1]:.3f} static_p99_ms={s[2]:.3f} ratio_rps={m[0] / s[0]:.2f} "
      f"not_modified_rps={r[0]:.0f} healthz_rps={h[0]:.0f} decision_ms={decision_ms} decisions_during_load={decisions} "
      f"device_p50_ms={d[1]:.3f} device_p99_ms={d[2]:.3f} experiment_p50_ms={x[1]:.3f} experiment_p99_ms={x[2]:.3f} "
      f"experiment_ratio_p50={x[1] / d[1]:.2f} experiment_ratio_p99={x[2] / d[2]:.2f} experiment_rps={x[0]:.0f} exposures_written={exposures}")
PY
