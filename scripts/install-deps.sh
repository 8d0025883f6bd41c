#!/usr/bin/env bash
# Installs the Debian packages AdTally builds and runs with, if any is missing.
# Idempotent: when everything is present it installs nothing and does not touch apt.
#
# ADTALLY_DEPS=build installs only what building needs (the Dockerfile's build
# stage); the default adds what running and testing need: PostgreSQL with hll,
# Chromium for the dashboard's browser test, and the tests' Python packages.
set -euo pipefail
packages=(libpq-dev zlib1g-dev pkg-config)
if [ "${ADTALLY_DEPS:-all}" != build ]; then
  # prometheus: promtool checks /metrics (and the alert rules) in the tests;
  # openssl: the alert tests check webhook signatures with it;
  # libcurl4-openssl-dev: AdTallyKit on Linux drives libcurl itself (Clients/AdTallyKit,
  # Transport+Curl.swift), built by make test (the server's image does not build the kit).
  packages+=(postgresql curl chromium prometheus openssl libcurl4-openssl-dev)
fi
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' || missing+=("$package")
done
# Python packages the tests use: openapi-core checks responses against
# /openapi.yaml, schemathesis fuzzes the API against it, websocket-client drives
# Chromium over the DevTools protocol.
python_ok() {
  [ "${ADTALLY_DEPS:-all}" = build ] || python3 -c '
import importlib.metadata as m, sys, openapi_core, openapi_spec_validator, requests, yaml, websocket
sys.exit(int(m.version("schemathesis").split(".")[0]) != 4)' 2>/dev/null
}
if ! python_ok; then
  echo "installing Python packages: openapi-core openapi-spec-validator requests pyyaml websocket-client schemathesis"
  if ! python3 -m pip --version >/dev/null 2>&1; then
    # Debian's own Python comes without pip.
    export DEBIAN_FRONTEND=noninteractive
    $( [ "$(id -u)" -ne 0 ] && echo sudo ) apt-get update -qq
    $( [ "$(id -u)" -ne 0 ] && echo sudo ) apt-get install -y -qq --no-install-recommends python3-pip
  fi
  pip_flags=(-q --disable-pip-version-check)
  # Debian's Python is "externally managed" (PEP 668): say that installing into it is meant.
  if python3 -c 'import sys, sysconfig, os; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["stdlib"], "EXTERNALLY-MANAGED")) else 1)'; then
    pip_flags+=(--break-system-packages)
  fi
  python3 -m pip install "${pip_flags[@]}" openapi-core openapi-spec-validator requests pyyaml websocket-client 'schemathesis>=4,<5'
fi
if [ "$(id -u)" -ne 0 ]; then
  SUDO=sudo
else
  SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  # The Debian package starts a system cluster on port 5432; AdTally does not use it.
fi
[ "${ADTALLY_DEPS:-all}" = build ] && exit 0
# The hll extension (unique-device sketches, Migrations/0005) for the PostgreSQL
# server installed: Debian names it after the server's major version.
major=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 | sed -E 's|.*/postgresql/([0-9]+)/bin|\1|')
if [ -n "$major" ] && [ ! -f "/usr/share/postgresql/$major/extension/hll.control" ]; then
  echo "installing Debian package: postgresql-$major-hll"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "postgresql-$major-hll"
fi
