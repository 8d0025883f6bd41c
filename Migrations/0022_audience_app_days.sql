-- AdTally schema, part 22: each app's devices per local day in one sketch (issue 42).
--
-- The audience report (DAU, DAV, ARPDAU, impressions per DAU by date, 30 days, the
-- bench's largest app) took 20 ms against the default report's 9-11: it unioned the
-- day's device and viewer sketches of every network and format (720 rows of two
-- hll(11, 5) sketches, ~1.4 KB a row, decompressed and merged one by one: 9.5 ms of its
-- 16.4 ms execution in EXPLAIN ANALYZE on the bench's data), while the date report beside
-- it reads no sketch. Active devices are the app's whatever network or format (a
-- session names neither), and so are the viewers when nothing groups or filters by
-- network or format: one sketch per app and local day answers both.
--
-- rollup_devices_app_day: per app and local day (the app's own zone, as
-- rollup_devices_day_compacted), the union of that day's sketches over every network and
-- format (sessions' '' included): `devices` (any event: DAU) and `viewers` (the
-- impressions': DAV; NULL when none had a device). The compactor unions each pass's
-- sketches into it beside the per-network day rows; a report in the apps' own zone reads
-- it for active devices, and for viewers when no network or format is named.
--
-- Upgrading: stop every server of the previous version before one of this version
-- migrates: a compactor of the previous version would fold deltas without adding their
-- devices here, and those days' active devices and viewers would read too few.

CREATE TABLE rollup_devices_app_day (
    app_id  text COLLATE "C" NOT NULL,
    day     date NOT NULL,
    devices hll NOT NULL,
    viewers hll,
    PRIMARY KEY (app_id, day)
) WITH (fillfactor = 70);

INSERT INTO rollup_devices_app_day (app_id, day, devices, viewers)
SELECT app_id, day, hll_union_agg(devices), hll_union_agg(viewers)
FROM rollup_devices_day_compacted
GROUP BY app_id, day;
