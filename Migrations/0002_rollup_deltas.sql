-- AdTally schema, part 2: rollups as compacted totals plus appended deltas.
--
-- Why: upserting the rollups in the ingest transaction cost PostgreSQL nearly as
-- much as COPYing the events themselves (perf under `make bench-ingest` load:
-- ~28% of PostgreSQL's CPU). Apps send events within minutes, so keys repeat
-- little inside one group commit: a group of ~170 events carries ~85 distinct
-- keys (152,000 delta rows for 300,000 events in 1,798 transactions, from
-- pg_stat_statements), and each upsert is a unique-index probe, a row lock that
-- concurrent groups queue behind, and a new row version.
--
-- Now the ingest transaction COPYs its summed rollup rows into rollup_delta
-- (no index, no lock, no update: an append, still in the same transaction as
-- the events, so a committed event is always counted and an aborted one never
-- is). The server's compactor (RollupCompactor) moves deltas into the compacted
-- tables every 5 seconds, in one transaction: DELETE ... RETURNING, summed per key
-- across thousands of groups, upserted. Readers use the views rollup_15m and
-- rollup_revenue_15m, which add the pending deltas to the compacted totals,
-- so every committed event is counted in them at once, compacted or not.
--
-- One delta table serves both rollups: a row keyed without country/currency
-- (NULL) carries the counts of events that have no revenue dimension; an
-- impression or tap's row carries its country and currency ('' when the SDK
-- reported no revenue) and both its count and its money.

ALTER TABLE rollup_15m RENAME TO rollup_15m_compacted;
ALTER TABLE rollup_revenue_15m RENAME TO rollup_revenue_15m_compacted;

CREATE TABLE rollup_delta (
    app_id               text COLLATE "C" NOT NULL,
    bucket               timestamptz NOT NULL,
    network              text COLLATE "C" NOT NULL,
    format               text COLLATE "C" NOT NULL,
    country              char(2) COLLATE "C",  -- NULL: no revenue dimension
    currency             text COLLATE "C",     -- NULL likewise; '' no reported revenue
    requests             integer NOT NULL,
    loads                integer NOT NULL,
    impressions          integer NOT NULL,
    errors               integer NOT NULL,
    taps                 integer NOT NULL,
    action_cancels       integer NOT NULL,
    expiries             integer NOT NULL,
    wasted_fills         integer NOT NULL,
    revenue_micros       bigint NOT NULL,
    priced_events        integer NOT NULL,
    unpriced_impressions integer NOT NULL,
    unpriced_taps        integer NOT NULL,
    CHECK ((country IS NULL) = (currency IS NULL))
)
-- The compactor vacuums this table after every pass. Truncating its emptied tail
-- would take an exclusive lock that every ingest transaction then waits behind.
WITH (vacuum_truncate = false);

CREATE VIEW rollup_15m AS
SELECT app_id, bucket, network, format,
       sum(requests)::bigint AS requests, sum(loads)::bigint AS loads,
       sum(impressions)::bigint AS impressions, sum(errors)::bigint AS errors,
       sum(taps)::bigint AS taps, sum(action_cancels)::bigint AS action_cancels,
       sum(expiries)::bigint AS expiries, sum(wasted_fills)::bigint AS wasted_fills
FROM (
    SELECT app_id, bucket, network, format, requests, loads, impressions, errors, taps, action_cancels, expiries, wasted_fills
    FROM rollup_15m_compacted
    UNION ALL
    SELECT app_id, bucket, network, format, requests, loads, impressions, errors, taps, action_cancels, expiries, wasted_fills
    FROM rollup_delta
) AS parts
GROUP BY app_id, bucket, network, format;

CREATE VIEW rollup_revenue_15m AS
SELECT app_id, bucket, network, format, country, currency,
       sum(revenue_micros)::bigint AS revenue_micros, sum(priced_events)::bigint AS priced_events,
       sum(unpriced_impressions)::bigint AS unpriced_impressions, sum(unpriced_taps)::bigint AS unpriced_taps
FROM (
    SELECT app_id, bucket, network, format, country, currency, revenue_micros, priced_events, unpriced_impressions, unpriced_taps
    FROM rollup_revenue_15m_compacted
    UNION ALL
    SELECT app_id, bucket, network, format, country, currency, revenue_micros, priced_events, unpriced_impressions, unpriced_taps
    FROM rollup_delta WHERE country IS NOT NULL
) AS parts
GROUP BY app_id, bucket, network, format, country, currency;
