-- Run once on the Citus coordinator after the first `adtally serve` (or
-- `adtally migrate`) created the schema: register the workers and distribute
-- every per-app table by app_id. Idempotent.
SELECT citus_set_coordinator_host('citus-coordinator', 5432);
SELECT * FROM citus_add_node('citus-worker-1', 5432) WHERE NOT EXISTS (SELECT 1 FROM pg_dist_node WHERE nodename = 'citus-worker-1');
SELECT * FROM citus_add_node('citus-worker-2', 5432) WHERE NOT EXISTS (SELECT 1 FROM pg_dist_node WHERE nodename = 'citus-worker-2');

-- Small tables every node needs whole.
SELECT create_reference_table('apps') WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'apps'::regclass);
SELECT create_reference_table('api_keys') WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'api_keys'::regclass);

-- Per-app tables, co-located by app_id: every primary key leads with it.
SELECT create_distributed_table('events', 'app_id') WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'events'::regclass);
SELECT create_distributed_table('event_ids', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'event_ids'::regclass);
SELECT create_distributed_table('rollup_15m_compacted', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'rollup_15m_compacted'::regclass);
SELECT create_distributed_table('rollup_revenue_15m_compacted', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'rollup_revenue_15m_compacted'::regclass);
SELECT create_distributed_table('rollup_delta', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'rollup_delta'::regclass);

-- The dashboards' tables (Migrations/0007): the shared secrets whole on every node,
-- the report series co-located with the app's events.
SELECT create_reference_table('server_secrets') WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'server_secrets'::regclass);
SELECT create_distributed_table('report_series', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'report_series'::regclass);
SELECT create_distributed_table('report_series_refresh', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'report_series_refresh'::regclass);

-- The other rollup grains (Migrations/0004, 0005): hourly and daily counts, revenue,
-- unpriced events and the devices' HyperLogLog sketches, co-located with the events,
-- so a report of one app reads one shard group.
SELECT create_distributed_table('rollup_1h_compacted', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'rollup_1h_compacted'::regclass);
SELECT create_distributed_table('rollup_day_compacted', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'rollup_day_compacted'::regclass);
SELECT create_distributed_table('rollup_revenue_1h_compacted', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'rollup_revenue_1h_compacted'::regclass);
SELECT create_distributed_table('rollup_revenue_day_compacted', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'rollup_revenue_day_compacted'::regclass);
SELECT create_distributed_table('rollup_unpriced_1h_compacted', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'rollup_unpriced_1h_compacted'::regclass);
SELECT create_distributed_table('rollup_unpriced_day_compacted', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'rollup_unpriced_day_compacted'::regclass);
SELECT create_distributed_table('rollup_devices_15m_compacted', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'rollup_devices_15m_compacted'::regclass);
SELECT create_distributed_table('rollup_devices_1h_compacted', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'rollup_devices_1h_compacted'::regclass);
SELECT create_distributed_table('rollup_devices_day_compacted', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'rollup_devices_day_compacted'::regclass);

-- The mediation switch (Migrations/0009): each app's policies, decisions and history.
SELECT create_distributed_table('mediation_policies', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'mediation_policies'::regclass);
SELECT create_distributed_table('mediation_changes', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'mediation_changes'::regclass);

-- The networks admitted per app (Migrations/0010), read by ingest with each app's events.
SELECT create_distributed_table('app_networks', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'app_networks'::regclass);
SELECT create_distributed_table('client_drops', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'client_drops'::regclass);

-- Joined into every report on the workers: the rate card, the FX rates, and the
-- accepted event window (id_horizon, read by the notes and locked by the ledger's pruning).
SELECT create_reference_table('rate_cards') WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'rate_cards'::regclass);
SELECT create_reference_table('fx_rates') WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'fx_rates'::regclass);
SELECT create_reference_table('id_horizon') WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'id_horizon'::regclass);

-- Stay local on the coordinator: never joined with a per-app table.
-- local: schema_migrations, export_schedules, export_runs, export_leader, rollup_compaction_passes
