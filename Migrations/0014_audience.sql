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
-- What it costs, measured on `adtally demo` data (3 apps, 30 days, 894 k events: about
-- 300 k events and 3,000 devices per app-month), per app-month, table and index bytes
-- (pg_total_relation_size) with the sketches' own bytes (pg_column_size) in brackets:
--   15 minutes: 5.8 MB (devices 1.3 MB, viewers 0.76 MB)
--   hour:       2.9 MB (devices 1.2 MB, viewers 0.71 MB)
--   day:        0.55 MB (devices 0.24 MB, viewers 0.20 MB)
-- about 9.3 MB per app-month in all, of which the viewer sketches added here are 1.7 MB.
-- A row with two dense sketches (~2.6 KB) is over TOAST's 2 KB threshold: one of them is
-- compressed or stored out of line (issue 26's note: a suspect in the bench's slower
-- unique_devices report, to be measured).
--
-- History: the viewers of impressions still kept as raw events are sketched below (into
-- rows compacted already, and into new rows for deltas still pending: their devices
-- join when the compactor folds them); impressions older than the raw events kept have
-- no viewer sketch, so ad_viewers and DAV read 0 there, and a report whose range starts
-- before `id_horizon.viewers_from` says so in its notes (`incomplete`). Deltas written
-- by a server of the previous version during a rolling upgrade carry no viewer hashes:
-- their impressions' devices count as active, not as viewers.

ALTER TABLE rollup_delta ADD COLUMN viewer_hashes bigint[];

ALTER TABLE rollup_devices_15m_compacted ADD COLUMN viewers hll;
ALTER TABLE rollup_devices_1h_compacted ADD COLUMN viewers hll;
ALTER TABLE rollup_devices_day_compacted ADD COLUMN viewers hll;

-- A new row (its deltas pending) gets the viewers as its devices too: a subset of them,
-- and the rest join when the compactor folds the deltas.
INSERT INTO rollup_devices_15m_compacted AS r (app_id, bucket, network, format, devices, viewers)
SELECT app_id, date_bin('15 minutes', occurred_at, TIMESTAMPTZ '1970-01-01 00:00:00+00'), network, format,
       hll_add_agg(hll_hash_text(device), 11, 5), hll_add_agg(hll_hash_text(device), 11, 5)
FROM events WHERE type = 'impression' AND device IS NOT NULL GROUP BY 1, 2, 3, 4
ON CONFLICT (app_id, bucket, network, format) DO UPDATE SET viewers = excluded.viewers;

INSERT INTO rollup_devices_1h_compacted AS r (app_id, hour, network, format, devices, viewers)
SELECT app_id, date_trunc('hour', bucket, 'UTC'), network, format, hll_union_agg(viewers), hll_union_agg(viewers)
FROM rollup_devices_15m_compacted WHERE viewers IS NOT NULL GROUP BY 1, 2, 3, 4
ON CONFLICT (app_id, hour, network, format) DO UPDATE SET viewers = excluded.viewers;

INSERT INTO rollup_devices_day_compacted AS r (app_id, day, network, format, devices, viewers)
SELECT q.app_id, (q.bucket AT TIME ZONE a.timezone)::date, q.network, q.format, hll_union_agg(q.viewers), hll_union_agg(q.viewers)
FROM rollup_devices_15m_compacted q JOIN apps a USING (app_id) WHERE q.viewers IS NOT NULL GROUP BY 1, 2, 3, 4
ON CONFLICT (app_id, day, network, format) DO UPDATE SET viewers = excluded.viewers;

-- From when ad viewers are whole: the UTC day of the oldest raw event kept, when there
-- was history (NULL: none, every day is whole).
ALTER TABLE id_horizon ADD COLUMN viewers_from timestamptz;
UPDATE id_horizon SET viewers_from = CASE
    WHEN EXISTS (SELECT 1 FROM rollup_devices_15m_compacted) OR EXISTS (SELECT 1 FROM rollup_delta)
    THEN date_trunc('day', coalesce((SELECT min(occurred_at) FROM events), now()), 'UTC') END;

-- The Grafana series (Migrations/0007) carry the audience too: written by the report
-- engine like every other column (ReportSeries.swift); NULL in hour rows (an hour is
-- no day) and in rows written before this migration until they are written again.
ALTER TABLE report_series ADD COLUMN sessions bigint, ADD COLUMN dau numeric, ADD COLUMN dav numeric,
    ADD COLUMN engagement_rate double precision, ADD COLUMN arpdau numeric;
-- Every app's series are due again, so the new columns fill at the next refresh.
UPDATE report_series_refresh SET due_at = NULL;

-- An automatic mediation policy may rank networks by ARPDAV, revenue per daily viewer of
-- each network's ads (over whole UTC days), as well as by expected revenue per request
-- (DESIGN §9). Not by ARPDAU: by network, DAU is the app's, so it would rank by revenue.
ALTER TABLE mediation_policies ADD COLUMN rank_by text NOT NULL DEFAULT 'rpm' CHECK (rank_by IN ('rpm', 'arpdav'));
