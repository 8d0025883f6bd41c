-- AdTally schema, part 3: sums that cannot overflow, and a dedupe ledger that is
-- pruned without ctid and without letting pruned ids back in.

-- 1. Revenue totals as numeric. One event reports at most 10^15 micros (see
-- EventValidator.maxRevenueMicros), so 9,223 such events already overflow a
-- bigint: the compacted totals, summed over years, and the views' sums are
-- numeric. Delta rows stay bigint: the ingest path starts a new delta row for a
-- key before its 64-bit sum would overflow. Counts stay bigint (2^63 events).
DROP VIEW rollup_revenue_15m;
ALTER TABLE rollup_revenue_15m_compacted ALTER COLUMN revenue_micros TYPE numeric(38, 0);

CREATE VIEW rollup_revenue_15m AS
SELECT app_id, bucket, network, format, country, currency,
       sum(revenue_micros) AS revenue_micros, sum(priced_events)::bigint AS priced_events,
       sum(unpriced_impressions)::bigint AS unpriced_impressions, sum(unpriced_taps)::bigint AS unpriced_taps
FROM (
    SELECT app_id, bucket, network, format, country, currency, revenue_micros, priced_events, unpriced_impressions, unpriced_taps
    FROM rollup_revenue_15m_compacted
    UNION ALL
    SELECT app_id, bucket, network, format, country, currency, revenue_micros::numeric, priced_events, unpriced_impressions, unpriced_taps
    FROM rollup_delta WHERE country IS NOT NULL
) AS parts
GROUP BY app_id, bucket, network, format, country, currency;

-- 2. Pruning the dedupe ledger. It used to pick rows by ctid, which names a row
-- only within one shard on Citus, and scanned the whole ledger for every batch.
-- Now it deletes by ranges of occurred_at, found through a BRIN index: ids
-- arrive roughly in time order, so the index stays a few pages, and an insert
-- at most widens one range summary where a B-tree would add a descent per event
-- (its cost under make bench-ingest was not measured apart from the rest).
CREATE INDEX event_ids_occurred_at ON event_ids USING brin (occurred_at) WITH (pages_per_range = 32);

-- Ids of events that occurred before pruned_before may be gone from the ledger.
-- An event that old is refused by every process, whatever window it was started
-- with: the ledger could not tell a retry of it from a new event, and importing
-- the same file twice must add nothing. Pruning and widening the window lock
-- this row, so no process starts accepting a range that a pass is pruning.
ALTER TABLE id_horizon ADD COLUMN pruned_before timestamptz;
UPDATE id_horizon SET pruned_before = (SELECT min(occurred_at) FROM event_ids);
