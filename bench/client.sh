#!/usr/bin/env bash
# make bench-client: AdTallyKit's cost in the app's process, against a local server.
#
# 1. start `adtally serve` (release) on a fresh embedded database; an app and its ingest key;
# 2. build the kit's bench (release) and run it (Clients/AdTallyKit/Sources/adtally-kit-bench):
#    record latency p50/p99 with persistence (default durability, while sending), the
#    same with an fsync per record, write(2) of a same-sized record as the floor, the
#    sustained rate from one process to the server (recorded until flush() returned),
#    record latency while a server of the bench's own stalls every batch (p99, max),
#    and the process's peak RSS;
# 3. check that the server stored every event once; the RESULT line.
set -euo pipefail
cd "$(dirname "$0")/.."
events=${BENCH_EVENTS:-100000}
sustained=${BENCH_SUSTAINED:-200000}
. bench/lib.sh
start_server
"$bin/adtally" apps create kitbench --data-dir "$data" >/dev/null
key=$("$bin/adtally" keys create --app kitbench --scope ingest --data-dir "$data" | tail -n 1)
swift build -c release --package-path Clients/AdTallyKit --product adtally-kit-bench
kit=$(swift build -c release --package-path Clients/AdTallyKit --show-bin-path)
"$kit/adtally-kit-bench" --server "http://127.0.0.1:$port" --key "$key" --dir "$work/kit" \
  --events "$events" --sustained "$sustained" | tee "$work/kit.txt"
stored=$(sql -c "SELECT count(*), count(DISTINCT event_id) FROM events WHERE app_id = 'kitbench'")
expected=$((events + (events / 20 > 100 ? events / 20 : 100) + sustained / 4 * 4))
echo "server: stored (events, distinct ids) = $stored; recorded $expected"
[ "$stored" = "$expected|$expected" ] || { echo "stored events differ from recorded ones"; exit 1; }
grep '^RESULT' "$work/kit.txt" | tail -n 1
