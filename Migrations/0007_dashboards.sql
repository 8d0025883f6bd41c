-- AdTally schema, part 7: what the dashboards read (DESIGN §8).
--
-- server_secrets: secrets every server of one database shares. The built-in
-- /dashboard signs its session cookies with 'dashboard_session' (32 random bytes,
-- hex), made by the first server that needs it; a session signed by one server
-- is good on all of them, and deleting the row signs everyone out (the next
-- server to need it makes a new one).
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
--   grain 'day'          one row per local day (period = YYYY-MM-DD),
--   grain 'hour'         one row per local hour (period = the hour with its offset),
--   grain 'last_7_days'  and 'last_28_days': the whole days before today, as one row;
-- each per network, and with network '*' for all networks together.
-- Older rows stay as they were last written: history beyond the refreshed window
-- is kept, not recomputed (a rate card changed for old dates shows here only in
-- the days the window still covers; the report API always reprices).
CREATE TABLE report_series (
    app_id            text NOT NULL REFERENCES apps (app_id),
    grain             text NOT NULL CHECK (grain IN ('day', 'hour', 'last_7_days', 'last_28_days')),
    -- '*' is every network together (no network name can be '*').
    network           text NOT NULL,
    -- The local start of the day or hour (of the range's first day for last_N_days).
    period_start      timestamptz NOT NULL,
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
CREATE INDEX report_series_time ON report_series (app_id, grain, period_start);

-- Grafana reads as its own role when the deployment made one
-- (deploy/postgres/init/10-grafana-role.sh in docker-compose.yml): these two
-- tables only, never events, keys or secrets.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'adtally_grafana') THEN
        GRANT SELECT ON report_series, apps TO adtally_grafana;
    END IF;
END
$$;
