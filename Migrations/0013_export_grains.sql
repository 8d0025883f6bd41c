-- adtally: outside-transaction
-- AdTally schema, part 13: exports that stream a stored grain (issue 25, item 2).
--
-- Why: an export of every app's hour x app x network x format (or date x app x
-- network x format in the apps' own zone) is the rollups themselves, one row per
-- stored row. It was grouped and sorted anyway: on the bench's 1.1 M rows PostgreSQL
-- spent 12 s (two sorts spilling ~250 MB, a hash grouping per bucket, the FX lookup
-- per bucket) before the first row left, and a 10x range ran into the statement
-- timeout. ReportGrain.swift reads such a report straight from the rollups in the
-- order it is written: the counts and the priced money of each key come from two
-- index scans in key order and are merged key by key as they arrive (no hash, no
-- sort of stored rows), with the few pending rows (deltas not yet compacted).
--
-- The primary keys keep each app's rows together (app, time, ...): that order serves
-- `app,hour,network,format`. The default order of a report is its dimensions'
-- (`hour,app,network,format`), time first: these indexes serve it.
--
-- Invariant: every key with priced money also has a counts row (both are written
-- from the same deltas in the same compaction pass, and money comes only from
-- impressions and taps, which are counted), so the grain's money joins its counts.
-- ReportGrain does not rely on it: it merges the two streams key by key, and a key
-- in either one is a row.

-- Not covering (INCLUDE the summed columns): that made a grain export index-only and
-- cut PostgreSQL's CPU for the bench's 1.1 M-row export from ~3.0 to ~2.0 s, but it
-- made every compaction update write these indexes too (no more HOT updates), and the
-- bench's week-at-a-time backlog pass then ran past the 60 s statement timeout. The
-- compactor's cost weighs more than the export's.
--
-- Built CONCURRENTLY (issue 41; the first line runs the file outside a transaction, a
-- statement at a time, each recorded once done): on a database with months of rollups
-- a plain CREATE INDEX holds a lock that stops every compaction pass (and so the
-- rollups' freshness) for the whole build. A build a crash cut is dropped and built
-- again by the next migrate. The file's earlier text (the same indexes, built plainly)
-- is known to the migrator, so a database that applied it is current.

CREATE INDEX CONCURRENTLY rollup_1h_by_hour ON rollup_1h_compacted (hour, app_id, network, format);
CREATE INDEX CONCURRENTLY rollup_priced_1h_by_hour ON rollup_priced_1h (hour, app_id, network, format, currency);
CREATE INDEX CONCURRENTLY rollup_day_by_day ON rollup_day_compacted (day, app_id, network, format);
CREATE INDEX CONCURRENTLY rollup_priced_day_by_day ON rollup_priced_day (day, app_id, network, format, utc_day, currency);
