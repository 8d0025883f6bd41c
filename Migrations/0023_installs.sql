-- AdTally schema, part 23: installs and their days (issue 43, DESIGN §13).
--
-- The HyperLogLog sketches count devices; they cannot follow one. Cohort reports
-- (installs, retention, revenue and impressions per install by day N) need to know,
-- per device, the day it was first seen and the days it came back. So AdTally keeps:
--
--   installs              one row per app x device: its first-seen instant, its local
--                         day (the cohort, in the app's own fixed zone, like the daily
--                         rollups) and what its earliest event was seen with (country,
--                         platform, app version).
--   install_days          per app x device x local day it was active: its events,
--                         requests, impressions, taps and sessions, and its cohort (the
--                         install's day, kept beside each day so that a cohort report
--                         reads a cohort's days by index without a join).
--   install_day_revenue   per app x device x local day x UTC hour x network x format x
--                         country x currency: its impressions and taps with the money
--                         they carry (reported micros in the SDK's currency, '' when
--                         none) and without it (priced from the rate card at query
--                         time, by their UTC date, as `revenue` is: DESIGN §3). The UTC
--                         hour places a network's final earnings (revenue of record) in
--                         that network's own days, and the UTC date prices and converts.
--                         Its cohort too, as install_days.
--
-- Written as the rollups are (Migrations/0002): the ingest transaction appends each new
-- event's sums per (app, device, 15-minute bucket, network, format, country, currency)
-- to install_delta with one COPY, beside the events, so a committed event is in it and
-- an aborted one never is (exactly once, as the ledger makes the events). The
-- compactor folds install_delta into the three tables in the same transaction as the
-- rollup deltas (RollupCompactor, InstallCompaction): an install moves to an earlier
-- instant when a late event shows one (`first_seen` only ever goes back), and when
-- that changes its day, every day row of the device moves to the new cohort with it.
--
-- A device id is personal data: these tables hold it as the events do; erasure
-- (DESIGN §15, the privacy issue after this one) is to remove a device's rows here too.
--
-- Upgrading: stop every server of the previous version before one of this version
-- migrates. A server of the previous version writes no install deltas: the events it
-- would still store (several servers, a rolling restart) would be in no install.

CREATE TABLE install_delta (
    app_id          text COLLATE "C" NOT NULL,
    bucket          timestamptz NOT NULL,          -- 15-minute bucket (UTC) of the events
    device          text COLLATE "C" NOT NULL,
    network         text COLLATE "C" NOT NULL,
    format          text COLLATE "C" NOT NULL,
    country         char(2) COLLATE "C" NOT NULL,
    currency        text COLLATE "C" NOT NULL,     -- reported revenue's, '' for none
    -- The row's earliest event: when, and what it was seen with (an install's candidate).
    first_at        timestamptz NOT NULL,
    first_platform  text COLLATE "C",
    first_version   text COLLATE "C",
    events          integer NOT NULL,
    requests        integer NOT NULL,
    impressions     integer NOT NULL,
    taps            integer NOT NULL,
    sessions        integer NOT NULL,
    revenue_micros  bigint NOT NULL,
    priced_events   integer NOT NULL,
    unpriced_impressions integer NOT NULL,
    unpriced_taps   integer NOT NULL
)
-- Emptied by every compaction pass, vacuumed after it, never truncated under ingest
-- (as rollup_delta, Migrations/0002).
WITH (vacuum_truncate = false);

CREATE TABLE installs (
    app_id       text COLLATE "C" NOT NULL,
    device       text COLLATE "C" NOT NULL,
    first_seen   timestamptz NOT NULL,
    day          date NOT NULL,                    -- the cohort: first_seen's local day
    country      char(2) COLLATE "C" NOT NULL,
    platform     text COLLATE "C",
    app_version  text COLLATE "C",
    PRIMARY KEY (app_id, device)
) WITH (fillfactor = 90);
CREATE INDEX installs_by_day ON installs (app_id, day);

CREATE TABLE install_days (
    app_id       text COLLATE "C" NOT NULL,
    device       text COLLATE "C" NOT NULL,
    day          date NOT NULL,                    -- local, in the app's zone
    cohort       date NOT NULL,                    -- installs.day of the device
    events       bigint NOT NULL,
    requests     bigint NOT NULL,
    impressions  bigint NOT NULL,
    taps         bigint NOT NULL,
    sessions     bigint NOT NULL,
    PRIMARY KEY (app_id, device, day)
) WITH (fillfactor = 80);
CREATE INDEX install_days_by_cohort ON install_days (app_id, cohort, day);

CREATE TABLE install_day_revenue (
    app_id          text COLLATE "C" NOT NULL,
    device          text COLLATE "C" NOT NULL,
    day             date NOT NULL,                 -- local, in the app's zone
    cohort          date NOT NULL,                 -- installs.day of the device
    hour            timestamptz NOT NULL,          -- UTC hour
    network         text COLLATE "C" NOT NULL,
    format          text COLLATE "C" NOT NULL,
    country         char(2) COLLATE "C" NOT NULL,
    currency        text COLLATE "C" NOT NULL,     -- '' for impressions and taps without reported revenue
    impressions     bigint NOT NULL,
    taps            bigint NOT NULL,
    revenue_micros  bigint NOT NULL,
    priced_events   bigint NOT NULL,
    unpriced_impressions bigint NOT NULL,
    unpriced_taps   bigint NOT NULL,
    PRIMARY KEY (app_id, device, day, hour, network, format, country, currency)
) WITH (fillfactor = 80);
CREATE INDEX install_day_revenue_by_cohort ON install_day_revenue (app_id, cohort, day);

-- History: every device of the raw events still kept (the partitions not yet dropped).
-- An app's install history starts with its earliest install (min(installs.day)): a
-- device first seen in its first days may have been installed before AdTally saw it
-- (older events dropped, or never sent); its cohort is its first-seen day, and a cohort
-- report reaching into the app's first month says so in its notes.
-- Events whose deltas are still pending in rollup_delta are among them; their install
-- deltas were never written (this version had not started), so nothing counts twice.
INSERT INTO installs (app_id, device, first_seen, day, country, platform, app_version)
SELECT DISTINCT ON (e.app_id, e.device) e.app_id, e.device, e.occurred_at, (e.occurred_at AT TIME ZONE a.timezone)::date,
       e.country, e.platform, e.app_version
FROM events e JOIN apps a USING (app_id)
WHERE e.device IS NOT NULL
-- Ties broken in byte order ("C"), as the compactor and the ingest path break them,
-- whatever the database's own collation.
ORDER BY e.app_id, e.device, e.occurred_at, e.country COLLATE "C", coalesce(e.platform, '') COLLATE "C", coalesce(e.app_version, '') COLLATE "C";

INSERT INTO install_days (app_id, device, day, cohort, events, requests, impressions, taps, sessions)
SELECT e.app_id, e.device, (e.occurred_at AT TIME ZONE a.timezone)::date, i.day, count(*),
       count(*) FILTER (WHERE e.type = 'request'), count(*) FILTER (WHERE e.type = 'impression'),
       count(*) FILTER (WHERE e.type = 'tap'), count(*) FILTER (WHERE e.type = 'session')
FROM events e JOIN apps a USING (app_id) JOIN installs i ON i.app_id = e.app_id AND i.device = e.device
GROUP BY 1, 2, 3, 4;

INSERT INTO install_day_revenue (app_id, device, day, cohort, hour, network, format, country, currency, impressions, taps,
                                 revenue_micros, priced_events, unpriced_impressions, unpriced_taps)
SELECT e.app_id, e.device, (e.occurred_at AT TIME ZONE a.timezone)::date, i.day, date_trunc('hour', e.occurred_at, 'UTC'),
       e.network, e.format, e.country, coalesce(e.currency, ''),
       count(*) FILTER (WHERE e.type = 'impression'), count(*) FILTER (WHERE e.type = 'tap'),
       coalesce(sum(e.revenue_micros), 0), count(e.revenue_micros),
       count(*) FILTER (WHERE e.type = 'impression' AND e.revenue_micros IS NULL),
       count(*) FILTER (WHERE e.type = 'tap' AND e.revenue_micros IS NULL)
FROM events e JOIN apps a USING (app_id) JOIN installs i ON i.app_id = e.app_id AND i.device = e.device
WHERE e.type IN ('impression', 'tap')
GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9;
