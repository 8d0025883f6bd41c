#!/usr/bin/env bash
# Runs the test command, keeping its whole output in .build/test.log, and when it
# fails prints every failed expectation again at the end: the suite runs its tests
# in parallel, so a failure is otherwise buried among thousands of lines, and a CI
# log that keeps only its tail would not show it at all.
set -uo pipefail
log=.build/test.log
mkdir -p .build
"$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
if [ "$status" -ne 0 ]; then
  echo
  echo "=== the failures again (whole output in $log) ==="
  # Swift Testing's issues and their indented detail lines; XCTest's "error:" lines.
  grep -E -A4 'recorded an issue|: error: ' "$log" | grep -v -E '^(◇|✔) ' | head -n 200
fi
exit "$status"
