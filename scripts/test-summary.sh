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
  # Swift Testing's issues and their detail lines, XCTest's "error:" lines, and a
  # crash (a trap or a signal), which records no issue. -a: the log may hold NULs.
  failures=$(grep -a -E -A4 'recorded an issue|: error: |Fatal error|error: Exited with|exited with signal|Signal: ' "$log" \
    | grep -a -v -E '^(◇|✔) ' | head -n 200)
  if [ -n "$failures" ]; then
    printf '%s\n' "$failures"
  else
    echo "(no failure line found: the test process may have died; see $log)"
  fi
fi
exit "$status"
