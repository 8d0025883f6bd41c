-- AdTally schema, part 7: what the dashboards read (DESIGN §8).
--
-- server_secrets: secrets every server of one database shares. The built-in
-- /dashboard signs its session cookies with 'dashboard_session' (32 random bytes,
-- hex), made by the first server that needs it; a session signed by one server
-- is good on all of them. Deleting the row signs everyone out within a minute:
-- each server reads the secret again at least every 60 seconds (and after a
-- cookie fails to verify, at most every 10), and the next to need it makes a new one.
CREATE TABLE server_secrets (
    name       text COLLATE "C" PRIMARY KEY,
    secret     text NOT NULL CHECK (secret ~ '^[0-9a-f]{64}$'),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- report_series: report engine output that Grafana's PostgreSQL datasource reads.
-- The engine is the one place a metric is computed (DESIGN §3): Grafana panels
-- select these columns and filter them, and never divide or price anything
-- themselves. The report-series service (ReportSeries.swift) rewrites the recent
-- rows of every app once a minute, each app in its own zone and currency:
--   grain 'day'          one row per local day (period = YYYY-MM-DD), over the
--                        last 35 days or the accepted event window + 2, if longer;
--   grain 'hour'         one row per local hour (period = the hour with its
--                        offset), over the accepted event window + 2 days only;
--   grain 'last_7_days'  and 'last_28_days': the whole days before today, as one row;
-- each for all networks together (network '*') and per network, for the app's 50
-- networks with the most revenue (then requests) over its last 28 days: network
-- names come from apps, and anyone holding an ingest key can invent thousands.
-- Day rows older than the window stay as they were last written (a rate card
-- changed for old dates shows in GET /v1/reports, not here); hour rows older than
-- theirs are deleted.
CREATE TABLE report_series (
    app_id            text NOT NULL REFERENCES apps (app_id),
    grain             text NOT NULL CHECK (grain IN ('day', 'hour', 'last_7_days', 'last_28_days')),
    -- '*' is every network together (no network name can be '*').
    network           text NOT NULL,
    -- The start of the day or hour (of the range's first day for last_N_days).
    period_start      timestamptz NOT NULL,
    -- The same start as the app's local wall time, stored as if that were UTC: a
    -- Grafana dashboard in UTC shows every app's days and hours at their local
    -- times (a repeated DST hour shows twice at one time).
    local_start       timestamptz NOT NULL,
    period            text NOT NULL,
    timezone          text NOT NULL,
    currency          char(3) NOT NULL,
    -- A day that late events may still change (DESIGN §4's notes).
    provisional       boolean NOT NULL,
    requests          bigint NOT NULL,
    impressions       bigint NOT NULL,
    fill_rate         double precision,
    loads             bigint NOT NULL,
    show_rate         double precision,
    errors            bigint NOT NULL,
    error_rate        double precision,
    taps              bigint NOT NULL,
    ctr               double precision,
    action_cancels    bigint NOT NULL,
    cancel_rate       double precision,
    expiries          bigint NOT NULL,
    expiry_rate       double precision,
    wasted_fills      bigint NOT NULL,
    revenue           numeric NOT NULL,
    reported_revenue  numeric NOT NULL,
    estimated_revenue numeric NOT NULL,
    ecpm              numeric,
    rpm               numeric,
    refreshed_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (app_id, grain, network, period_start)
);

-- Grafana's panels read one app's grain over a time range.
CREATE INDEX report_series_time ON report_series (app_id, grain, local_start);

-- The last refresh of each app's series, and why it failed when it did (a
-- missing FX rate leaves the app's rows as they were; this says so).
CREATE TABLE report_series_refresh (
    app_id       text PRIMARY KEY REFERENCES apps (app_id),
    attempted_at timestamptz NOT NULL,
    refreshed_at timestamptz,
    rows         integer,
    error        text
);

-- Grafana reads as its own role when the deployment made one
-- (deploy/postgres/init/10-grafana-role.sh in docker-compose.yml): these
-- tables only, never events, keys or secrets.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'adtally_grafana') THEN
        GRANT SELECT ON report_series, report_series_refresh, apps TO adtally_grafana;
    END IF;
END
$$;
