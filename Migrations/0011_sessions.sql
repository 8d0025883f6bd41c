-- AdTally schema, part 11: sessions and revenue precision (DESIGN §2, issue 23).
--
-- A `session` event (the app came to the foreground) names no network or format.
-- It is stored with network '', format '' and placement '': no network name is empty (the
-- validator's [a-z0-9_.-]{1,32}), so no filter, admission place or mediation
-- policy can name it, and reports leave these rows out unless they ask for
-- `sessions`. Sessions are counted in the same rollups as every other type (a
-- column of their own beside requests .. wasted_fills), so the count stays
-- answerable after raw events age out, in every zone. Their devices go into the
-- sketches' '' rows, which unique_devices (devices of ad events) does not read.
--
-- `revenue_precision` (precise, estimated, publisher_provided, unknown) is kept
-- on the raw event beside the revenue it qualifies; NULL when the SDK did not say.

ALTER TABLE events ADD COLUMN revenue_precision text;

ALTER TABLE rollup_delta ADD COLUMN sessions integer NOT NULL DEFAULT 0;
ALTER TABLE rollup_15m_compacted ADD COLUMN sessions bigint NOT NULL DEFAULT 0;
ALTER TABLE rollup_1h_compacted ADD COLUMN sessions bigint NOT NULL DEFAULT 0;
ALTER TABLE rollup_day_compacted ADD COLUMN sessions bigint NOT NULL DEFAULT 0;

DROP VIEW rollup_15m;
CREATE VIEW rollup_15m AS
SELECT app_id, bucket, network, format,
       sum(requests)::bigint AS requests, sum(loads)::bigint AS loads,
       sum(impressions)::bigint AS impressions, sum(errors)::bigint AS errors,
       sum(taps)::bigint AS taps, sum(action_cancels)::bigint AS action_cancels,
       sum(expiries)::bigint AS expiries, sum(wasted_fills)::bigint AS wasted_fills,
       sum(sessions)::bigint AS sessions
FROM (
    SELECT app_id, bucket, network, format, requests, loads, impressions, errors, taps, action_cancels, expiries, wasted_fills, sessions
    FROM rollup_15m_compacted
    UNION ALL
    SELECT app_id, bucket, network, format, requests, loads, impressions, errors, taps, action_cancels, expiries, wasted_fills, sessions
    FROM rollup_delta
) AS parts
GROUP BY app_id, bucket, network, format;

-- Events an app's queue dropped before it could send them (AdTallyKit, DESIGN §10):
-- the queue at its byte bound (oldest first), events older than the server's window,
-- damaged records. Reported as counts, each report once by the id the kit made for
-- it (a retried report counts once), so that a loss is never silent.
CREATE TABLE client_drops (
    app_id      text COLLATE "C" NOT NULL REFERENCES apps (app_id),
    report_id   uuid NOT NULL,
    reason      text NOT NULL CHECK (reason IN ('queue_full', 'expired', 'damaged')),
    dropped     bigint NOT NULL CHECK (dropped > 0),
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (app_id, report_id)
);
