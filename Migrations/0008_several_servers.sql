-- Every rollup compaction pass that moved rows, by the server that ran it, with
-- the instants it held the compaction lock between (both read inside the pass's
-- transaction, after the lock). One server at a time compacts (a transaction
-- advisory lock, RollupCompactor): the passes' intervals never overlap, which
-- the several-servers test checks, and an operator can see who compacted when
-- and how much. Passes that found nothing to move are not recorded. Kept 7 days
-- (event maintenance deletes older rows). A local table on Citus (coordinator).
CREATE TABLE rollup_compaction_passes (
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL,
    server      text NOT NULL,
    delta_rows  bigint NOT NULL,
    CHECK (finished_at >= started_at)
);
CREATE INDEX rollup_compaction_passes_started ON rollup_compaction_passes (started_at);

-- Citus co-locates tables only when their distribution columns have the same
-- collation: the report series' app_id had the default one, every other per-app
-- table's is "C" (as apps.app_id). ScalingTests checks it for every table.
ALTER TABLE report_series ALTER COLUMN app_id TYPE text COLLATE "C";
ALTER TABLE report_series_refresh ALTER COLUMN app_id TYPE text COLLATE "C";
