#!/usr/bin/env bash
# make fuzz: builds the libFuzzer harnesses in Fuzz/ with AddressSanitizer and runs
# each for FUZZ_SECONDS (default 600) from the seed corpus in Fuzz/corpus/. A crash
# leaves its input as Fuzz/findings/<harness>/crash-* and fails the run.
set -euo pipefail
cd "$(dirname "$0")/../Fuzz"
seconds=${FUZZ_SECONDS:-600}
swift build -c debug -Xswiftc -sanitize=fuzzer,address --scratch-path ../.build-fuzz
bin=$(swift build -c debug -Xswiftc -sanitize=fuzzer,address --scratch-path ../.build-fuzz --show-bin-path)
status=0
for pair in "FuzzIngestBody ingest" "FuzzCSV csv" "FuzzMoneyCSV money" "FuzzNetworkReport network" "FuzzKitAnswers kit"; do
  set -- $pair
  mkdir -p "findings/$1" "work/$2"
  echo "== $1 for ${seconds}s"
  "$bin/$1" -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="findings/$1/" "work/$2" "corpus/$2" || status=1
done
exit $status
