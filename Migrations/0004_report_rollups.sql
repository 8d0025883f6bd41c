-- AdTally schema, part 4: coarser rollups, so that common reports read a few
-- hundred rows instead of every quarter hour.
--
-- Why: the 15-minute grain (app, bucket, network, format) holds up to ~70 k rows
-- per app-month (96 buckets a day x 6 networks x 4 formats x 30 days). The
-- default report (DESIGN §4: one app, 30 days, date x network, in the app's own
-- zone) would aggregate all of them on every call. Two coarser grains, kept
-- exact, serve it instead:
--
--   rollup_day_compacted / rollup_revenue_day_compacted
--       (app, day, network, format[, currency]) where day is the local date in
--       the app's own zone (apps.timezone, fixed when the app is created). A
--       report in that zone grouped by date, week, month or not by time reads
--       one row per day and key: ~720 rows for the default shape at most.
--   rollup_1h_compacted / rollup_revenue_1h_compacted
--       (app, hour in UTC, network, format[, currency]). Every other zone:
--       an hour whose four quarters fall in one group (one local day, or one
--       local hour) is read as one row; only the hours a group boundary cuts
--       (local midnight at :30 in Asia/Kolkata, :45 in Asia/Kathmandu, the range
--       ends) are read from the 15-minute rows. Exact in every zone, because
--       every boundary is a multiple of 15 minutes.
--
-- Revenue at these grains is the reported revenue per currency only (rows with
-- currency '' are not kept): the counts of unpriced impressions and taps that a
-- rate card prices per country stay at the 15-minute grain.
--
-- The compactor writes all grains from the same deltas in one transaction, and a
-- report adds the pending deltas (15-minute rows) itself, so every grain agrees
-- with the others and with the events at every moment.

CREATE TABLE rollup_1h_compacted (
    app_id         text COLLATE "C" NOT NULL,
    hour           timestamptz NOT NULL,
    network        text COLLATE "C" NOT NULL,
    format         text COLLATE "C" NOT NULL,
    requests       bigint NOT NULL DEFAULT 0,
    loads          bigint NOT NULL DEFAULT 0,
    impressions    bigint NOT NULL DEFAULT 0,
    errors         bigint NOT NULL DEFAULT 0,
    taps           bigint NOT NULL DEFAULT 0,
    action_cancels bigint NOT NULL DEFAULT 0,
    expiries       bigint NOT NULL DEFAULT 0,
    wasted_fills   bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (app_id, hour, network, format)
);

CREATE TABLE rollup_revenue_1h_compacted (
    app_id         text COLLATE "C" NOT NULL,
    hour           timestamptz NOT NULL,
    network        text COLLATE "C" NOT NULL,
    format         text COLLATE "C" NOT NULL,
    currency       text COLLATE "C" NOT NULL,
    revenue_micros numeric(38, 0) NOT NULL DEFAULT 0,
    PRIMARY KEY (app_id, hour, network, format, currency)
);

CREATE TABLE rollup_day_compacted (
    app_id         text COLLATE "C" NOT NULL,
    day            date NOT NULL,
    network        text COLLATE "C" NOT NULL,
    format         text COLLATE "C" NOT NULL,
    requests       bigint NOT NULL DEFAULT 0,
    loads          bigint NOT NULL DEFAULT 0,
    impressions    bigint NOT NULL DEFAULT 0,
    errors         bigint NOT NULL DEFAULT 0,
    taps           bigint NOT NULL DEFAULT 0,
    action_cancels bigint NOT NULL DEFAULT 0,
    expiries       bigint NOT NULL DEFAULT 0,
    wasted_fills   bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (app_id, day, network, format)
);

CREATE TABLE rollup_revenue_day_compacted (
    app_id         text COLLATE "C" NOT NULL,
    day            date NOT NULL,
    network        text COLLATE "C" NOT NULL,
    format         text COLLATE "C" NOT NULL,
    currency       text COLLATE "C" NOT NULL,
    revenue_micros numeric(38, 0) NOT NULL DEFAULT 0,
    PRIMARY KEY (app_id, day, network, format, currency)
);

-- What is already compacted, at the new grains.
INSERT INTO rollup_1h_compacted
SELECT app_id, date_trunc('hour', bucket, 'UTC'), network, format, sum(requests), sum(loads), sum(impressions),
       sum(errors), sum(taps), sum(action_cancels), sum(expiries), sum(wasted_fills)
FROM rollup_15m_compacted GROUP BY 1, 2, 3, 4;

INSERT INTO rollup_revenue_1h_compacted
SELECT app_id, date_trunc('hour', bucket, 'UTC'), network, format, currency, sum(revenue_micros)
FROM rollup_revenue_15m_compacted WHERE currency <> '' GROUP BY 1, 2, 3, 4, 5;

INSERT INTO rollup_day_compacted
SELECT r.app_id, (r.bucket AT TIME ZONE a.timezone)::date, r.network, r.format, sum(r.requests), sum(loads), sum(impressions),
       sum(errors), sum(taps), sum(action_cancels), sum(expiries), sum(wasted_fills)
FROM rollup_15m_compacted r JOIN apps a USING (app_id) GROUP BY 1, 2, 3, 4;

INSERT INTO rollup_revenue_day_compacted
SELECT r.app_id, (r.bucket AT TIME ZONE a.timezone)::date, r.network, r.format, r.currency, sum(revenue_micros)
FROM rollup_revenue_15m_compacted r JOIN apps a USING (app_id) WHERE r.currency <> '' GROUP BY 1, 2, 3, 4, 5;

-- The app's zone decides its daily rows; it may not change under them.
CREATE FUNCTION apps_timezone_is_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.timezone IS DISTINCT FROM OLD.timezone THEN
        RAISE EXCEPTION 'the time zone of app % cannot change: its daily rollups are kept in it', OLD.app_id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER apps_timezone_is_fixed BEFORE UPDATE OF timezone ON apps FOR EACH ROW EXECUTE FUNCTION apps_timezone_is_fixed();
