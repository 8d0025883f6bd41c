#!/usr/bin/env bash
# make test-citus (and the last step of make test, with --optional): the checks of
# scripts/test-citus.sh on a throwaway three-node Citus cluster beside a throwaway
# single node. Without the Citus extension installed, make test says plainly that it
# skipped them and goes on; make test-citus fails (DEVELOPERS.md: building Citus).
set -uo pipefail
optional=0
[ "${1:-}" = --optional ] && optional=1
cd "$(dirname "$0")/.."
scripts/with-citus-cluster.sh scripts/with-test-postgres.sh scripts/test-citus.sh
rc=$?
if [ "$rc" = 77 ]; then
  if [ "$optional" = 1 ]; then
    echo "test-citus: SKIPPED — Citus (or hll) is not installed here, as the line above says, so nothing ran on a Citus cluster (DEVELOPERS.md says how to build Citus; then make test-citus)"
    exit 0
  fi
  echo "test-citus: no Citus cluster could be started here, as the line above says (DEVELOPERS.md: building Citus)" >&2
  exit 1
fi
exit "$rc"
