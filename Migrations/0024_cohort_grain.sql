-- AdTally schema, part 24: the cohort grain (issue 43, DESIGN §13): a cohort report
-- for one app over 30 cohorts x D0..D30 in tens of milliseconds.
--
-- Why: a cohort report read its devices' day rows (install_days, install_day_revenue,
-- Migrations/0023) and priced every money row at query time: 46 ms for retention and
-- 274 ms with revenue per install on the demo's 15,918 installs, growing with the
-- devices (the bench's largest app has ~100 k installs and ~0.5 M device-days).
--
-- What is stored: the devices' day rows summed over the devices, per app, cohort and
-- local day (the app's zone):
--
--   cohort_days          devices active that day (every event counts), their impressions.
--                        A cohort's installs are its day-0 devices: a device is active on
--                        its install day by definition.
--   cohort_priced_day    their money, priced as rollup_priced_day is (Migrations/0012):
--                        per UTC date and money currency (over every network and
--                        format: a cohort report names neither), reported revenue (in
--                        the SDK's currency), estimated revenue (the rate card in force
--                        on the UTC date, exact, with the thousandths of a micro a CPM
--                        leaves) and unrated events (currency '').
--
-- Invariants (CohortReportTests/handComputed, scripts/test-citus.sh):
--
-- 1. cohort_days equals install_days summed per (app, cohort, day); cohort_priced_day
--    equals install_day_revenue priced with the card as it is now, outside the UTC
--    dates that rollup_dirty holds for any of the app's networks and formats. The compactor keeps them so in the transaction that folds
--    the install deltas (InstallCompaction): a new device-day adds a device, a device
--    moved to an earlier cohort takes its rows from the old cohort to the new one; the
--    re-pricer rewrites the cohort money of a dirty window's UTC dates with the
--    rollups' (RatePricing).
-- 2. A report reads the grain only where it is exact: grouped by cohort and app (no
--    first-sight attribute), with no revenue of record (a network's final earnings are
--    spread by the UTC hour), the dirty UTC dates priced at query time from the device rows,
--    and the devices with install deltas pending read from theirs (`CohortReport`).
--    Other cohort reports read the device rows, as before.
--
-- Upgrading: stop every server of the previous version before one of this version
-- migrates. A previous server's compactor folds install deltas without the grain, and
-- nothing would add them to it later.

CREATE TABLE cohort_days (
    app_id       text COLLATE "C" NOT NULL,
    cohort       date NOT NULL,
    day          date NOT NULL,                    -- local, in the app's zone
    devices      bigint NOT NULL,
    impressions  bigint NOT NULL,
    PRIMARY KEY (app_id, cohort, day)
) WITH (fillfactor = 70);

CREATE TABLE cohort_priced_day (
    app_id     text COLLATE "C" NOT NULL,
    cohort     date NOT NULL,
    day        date NOT NULL,                      -- local, in the app's zone
    utc_day    date NOT NULL,
    currency   text COLLATE "C" NOT NULL,          -- '' for unrated events only
    reported   numeric NOT NULL,
    estimated  numeric NOT NULL,
    unrated    bigint NOT NULL,
    PRIMARY KEY (app_id, cohort, day, utc_day, currency)
) WITH (fillfactor = 70);

-- From the device rows kept (Migrations/0023), priced with the card as it is now, as
-- RatePricing prices: the entry in force on the UTC date for the network, format and
-- country, over the any-country one.
INSERT INTO cohort_days (app_id, cohort, day, devices, impressions)
SELECT app_id, cohort, day, count(*), sum(impressions) FROM install_days GROUP BY 1, 2, 3;

WITH source AS MATERIALIZED (
    SELECT app_id, cohort, day, (hour AT TIME ZONE 'UTC')::date AS u, network, format, country::text AS country, currency,
           sum(revenue_micros) AS revenue_micros, sum(unpriced_impressions) AS ui, sum(unpriced_taps) AS ut
    FROM install_day_revenue GROUP BY 1, 2, 3, 4, 5, 6, 7, 8
), prices AS MATERIALIZED (
    SELECT k.u, k.network, k.format, k.country,
           (array_agg(c.currency ORDER BY c.country = '*', c.effective_from DESC) FILTER (WHERE c.currency IS NOT NULL))[1] AS currency,
           (array_agg(c.cpm_micros ORDER BY c.country = '*', c.effective_from DESC) FILTER (WHERE c.currency IS NOT NULL))[1] AS cpm_micros,
           (array_agg(c.cpt_micros ORDER BY c.country = '*', c.effective_from DESC) FILTER (WHERE c.currency IS NOT NULL))[1] AS cpt_micros
    FROM (SELECT DISTINCT u, network, format, country FROM source WHERE currency = '') AS k
    LEFT JOIN rate_cards c ON c.network = k.network AND c.format = k.format AND c.country IN (k.country, '*') AND c.effective_from <= k.u
    GROUP BY k.u, k.network, k.format, k.country
)
INSERT INTO cohort_priced_day (app_id, cohort, day, utc_day, currency, reported, estimated, unrated)
SELECT s.app_id, s.cohort, s.day, s.u,
       coalesce(CASE WHEN s.currency = '' THEN rt.currency ELSE s.currency END, ''),
       coalesce(sum(CASE WHEN s.currency <> '' THEN s.revenue_micros END), 0),
       coalesce(sum(s.ui::numeric * rt.cpm_micros * 0.001 + s.ut::numeric * rt.cpt_micros), 0),
       coalesce(sum(CASE WHEN s.currency = '' AND rt.currency IS NULL THEN s.ui + s.ut END), 0)
FROM source s
LEFT JOIN prices rt ON s.currency = '' AND rt.u = s.u AND rt.network = s.network AND rt.format = s.format AND rt.country = s.country
GROUP BY 1, 2, 3, 4, 5;
