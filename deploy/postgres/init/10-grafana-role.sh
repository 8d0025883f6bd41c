#!/bin/sh
# Runs once, when the database volume is first initialised (before AdTally
# migrates it): the read-only role Grafana connects as. Migrations/0007 and 0025
# grant it SELECT on report_series, report_series_refresh, cohort_series and apps,
# and nothing else.
set -eu
psql -v ON_ERROR_STOP=1 -v password="$ADTALLY_GRAFANA_DB_PASSWORD" --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" <<'SQL'
CREATE ROLE adtally_grafana LOGIN PASSWORD :'password';
SQL
