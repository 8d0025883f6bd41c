-- AdTally schema, part 25: cohort series for Grafana (issue 43, DESIGN §13).
--
-- Grafana's PostgreSQL datasource reads what the report engine computed (as
-- report_series, Migrations/0007): per app, its recent install days (the app's zone)
-- with installs, retention and cumulative revenue per install at the usual days N,
-- written from the engine's cohort report by the series refresh on its full writes
-- (at the app's local midnight, when a provisional day turns final; and at once after
-- this migration, which makes every app's series due), so a panel selects and never
-- derives a metric. A value whose day N has not passed is NULL, as the report's null.

CREATE TABLE cohort_series (
    app_id                   text COLLATE "C" NOT NULL REFERENCES apps (app_id),
    cohort                   date NOT NULL,          -- the install day, in the app's zone
    -- The install day's local midnight, stored as if it were UTC (as report_series.local_start).
    local_start              timestamptz NOT NULL,
    timezone                 text NOT NULL,
    currency                 char(3) NOT NULL,
    -- A cohort whose days read may still change (late events, a network's restatements).
    provisional              boolean NOT NULL,
    installs                 bigint NOT NULL,
    retention_d1             double precision,
    retention_d3             double precision,
    retention_d7             double precision,
    retention_d14            double precision,
    retention_d30            double precision,
    revenue_per_install_d0   numeric,
    revenue_per_install_d1   numeric,
    revenue_per_install_d3   numeric,
    revenue_per_install_d7   numeric,
    revenue_per_install_d14  numeric,
    revenue_per_install_d30  numeric,
    impressions_per_install_d7 double precision,
    refreshed_at             timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (app_id, cohort)
);

-- Every app's series are due: the next refresh writes its cohorts too.
UPDATE report_series_refresh SET due_at = NULL;

-- Grafana's own read-only role, where the deployment made one (Migrations/0007).
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'adtally_grafana') THEN
        GRANT SELECT ON cohort_series TO adtally_grafana;
    END IF;
END $$;
