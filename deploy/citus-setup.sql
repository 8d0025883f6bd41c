-- Run once on the Citus coordinator after the first `adtally serve` (or
-- `adtally migrate`) created the schema: register the workers and distribute
-- every per-app table by app_id. Idempotent; run it with psql -v ON_ERROR_STOP=1.
-- The nodes are compose's unless given: psql -v coordinator_host=H -v coordinator_port=P
-- -v worker1_host=H -v worker1_port=P -v worker2_host=H -v worker2_port=P.
\if :{?coordinator_host} \else \set coordinator_host citus-coordinator \endif
\if :{?coordinator_port} \else \set coordinator_port 5432 \endif
\if :{?worker1_host} \else \set worker1_host citus-worker-1 \endif
\if :{?worker1_port} \else \set worker1_port 5432 \endif
\if :{?worker2_host} \else \set worker2_host citus-worker-2 \endif
\if :{?worker2_port} \else \set worker2_port 5432 \endif
SELECT citus_set_coordinator_host(:'coordinator_host', :coordinator_port);
SELECT * FROM citus_add_node(:'worker1_host', :worker1_port) WHERE NOT EXISTS (SELECT 1 FROM pg_dist_node WHERE nodename = :'worker1_host' AND nodeport = :worker1_port);
SELECT * FROM citus_add_node(:'worker2_host', :worker2_port) WHERE NOT EXISTS (SELECT 1 FROM pg_dist_node WHERE nodename = :'worker2_host' AND nodeport = :worker2_port);

-- Citus distributes no table that has triggers. apps has one (Migrations/0004:
-- an app's zone is fixed, as its daily rollups are kept in it); on Citus that rule is
-- AdTally's alone: no command or route changes a zone.
-- (Only while it is there: Citus refuses even DROP TRIGGER IF EXISTS on a reference table.)
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'apps_timezone_is_fixed' AND tgrelid = 'apps'::regclass) THEN
        DROP TRIGGER apps_timezone_is_fixed ON apps;
    END IF;
END $$;

-- Small tables every node needs whole. Placing them makes Citus turn the tables with
-- foreign keys to them into Citus-local ones; each is then distributed below, and the
-- guards check each table's real placement (citus_tables), not only that Citus knows it.
SELECT create_reference_table('apps') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'apps'::regclass AND citus_table_type = 'reference');
SELECT create_reference_table('api_keys') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'api_keys'::regclass AND citus_table_type = 'reference');

-- Per-app tables, co-located by app_id: every primary key leads with it.
SELECT create_distributed_table('events', 'app_id') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'events'::regclass AND citus_table_type = 'distributed');
SELECT create_distributed_table('event_ids', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'event_ids'::regclass AND citus_table_type = 'distributed');
SELECT create_distributed_table('rollup_15m_compacted', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'rollup_15m_compacted'::regclass AND citus_table_type = 'distributed');
SELECT create_distributed_table('rollup_revenue_15m_compacted', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'rollup_revenue_15m_compacted'::regclass AND citus_table_type = 'distributed');
SELECT create_distributed_table('rollup_delta', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'rollup_delta'::regclass AND citus_table_type = 'distributed');

-- The dashboards' tables (Migrations/0007): the shared secrets whole on every node,
-- the report series co-located with the app's events.
SELECT create_reference_table('server_secrets') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'server_secrets'::regclass AND citus_table_type = 'reference');
SELECT create_distributed_table('report_series', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'report_series'::regclass AND citus_table_type = 'distributed');
SELECT create_distributed_table('report_series_refresh', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'report_series_refresh'::regclass AND citus_table_type = 'distributed');

-- The other rollup grains (Migrations/0004, 0005): hourly and daily counts, revenue,
-- unpriced events and the devices' HyperLogLog sketches, co-located with the events,
-- so a report of one app reads one shard group.
SELECT create_distributed_table('rollup_1h_compacted', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'rollup_1h_compacted'::regclass AND citus_table_type = 'distributed');
SELECT create_distributed_table('rollup_day_compacted', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'rollup_day_compacted'::regclass AND citus_table_type = 'distributed');
SELECT create_distributed_table('rollup_revenue_1h_compacted', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'rollup_revenue_1h_compacted'::regclass AND citus_table_type = 'distributed');
SELECT create_distributed_table('rollup_revenue_day_compacted', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'rollup_revenue_day_compacted'::regclass AND citus_table_type = 'distributed');
SELECT create_distributed_table('rollup_unpriced_1h_compacted', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'rollup_unpriced_1h_compacted'::regclass AND citus_table_type = 'distributed');
SELECT create_distributed_table('rollup_unpriced_day_compacted', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'rollup_unpriced_day_compacted'::regclass AND citus_table_type = 'distributed');
SELECT create_distributed_table('rollup_devices_15m_compacted', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'rollup_devices_15m_compacted'::regclass AND citus_table_type = 'distributed');
SELECT create_distributed_table('rollup_devices_1h_compacted', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'rollup_devices_1h_compacted'::regclass AND citus_table_type = 'distributed');
SELECT create_distributed_table('rollup_devices_day_compacted', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'rollup_devices_day_compacted'::regclass AND citus_table_type = 'distributed');

-- Priced rollups (Migrations/0012): revenue summed as it is compacted, the ranges a card
-- change left to re-price, and the report series' changed days, per app like the rest.
SELECT create_distributed_table('rollup_priced_1h', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'rollup_priced_1h'::regclass AND citus_table_type = 'distributed');
SELECT create_distributed_table('rollup_priced_day', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'rollup_priced_day'::regclass AND citus_table_type = 'distributed');
SELECT create_distributed_table('rollup_dirty', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'rollup_dirty'::regclass AND citus_table_type = 'distributed');
SELECT create_distributed_table('report_series_changes', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'report_series_changes'::regclass AND citus_table_type = 'distributed');

-- The mediation switch (Migrations/0009): each app's policies, decisions and history.
SELECT create_distributed_table('mediation_policies', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'mediation_policies'::regclass AND citus_table_type = 'distributed');
SELECT create_distributed_table('mediation_changes', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'mediation_changes'::regclass AND citus_table_type = 'distributed');

-- The networks admitted per app (Migrations/0010), read by ingest with each app's events.
SELECT create_distributed_table('app_networks', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'app_networks'::regclass AND citus_table_type = 'distributed');
-- The networks' own reports (Migrations/0015), compared per app with its rollups, and
-- the imports they belong to (joined with them on the workers; referenced first).
SELECT create_reference_table('network_imports') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'network_imports'::regclass AND citus_table_type = 'reference');
SELECT create_distributed_table('network_import_pairs', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'network_import_pairs'::regclass AND citus_table_type = 'distributed');
SELECT create_distributed_table('network_report_rows', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'network_report_rows'::regclass AND citus_table_type = 'distributed');
SELECT create_distributed_table('client_drops', 'app_id', colocate_with => 'events') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'client_drops'::regclass AND citus_table_type = 'distributed');

-- Joined into every report on the workers: the rate card, the FX rates, and the
-- accepted event window (id_horizon, read by the notes and locked by the ledger's pruning).
SELECT create_reference_table('rate_cards') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'rate_cards'::regclass AND citus_table_type = 'reference');
SELECT create_reference_table('fx_rates') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'fx_rates'::regclass AND citus_table_type = 'reference');
SELECT create_reference_table('id_horizon') WHERE NOT EXISTS (SELECT 1 FROM citus_tables WHERE table_name = 'id_horizon'::regclass AND citus_table_type = 'reference');

-- Stay local on the coordinator: never joined with a per-app table.
-- local: schema_migrations, export_schedules, export_runs, export_leader, rollup_compaction_passes, network_settings, network_mappings, network_pulls, network_pull_runs, alert_rules, alert_states, alert_events, alert_deliveries, alert_leader

-- Fail loudly when a table is not where this script puts it.
DO $$
DECLARE
    wrong text;
BEGIN
    SELECT string_agg(format('%s is %s, not %s', t.name, coalesce(c.citus_table_type, 'a plain local table'), t.want), '; ' ORDER BY t.name)
    INTO wrong
    FROM (VALUES
        ('apps', 'reference'), ('api_keys', 'reference'), ('server_secrets', 'reference'),
        ('rate_cards', 'reference'), ('fx_rates', 'reference'), ('id_horizon', 'reference'),
        ('events', 'distributed'), ('event_ids', 'distributed'), ('rollup_delta', 'distributed'),
        ('rollup_15m_compacted', 'distributed'), ('rollup_revenue_15m_compacted', 'distributed'),
        ('rollup_1h_compacted', 'distributed'), ('rollup_day_compacted', 'distributed'),
        ('rollup_revenue_1h_compacted', 'distributed'), ('rollup_revenue_day_compacted', 'distributed'),
        ('rollup_unpriced_1h_compacted', 'distributed'), ('rollup_unpriced_day_compacted', 'distributed'),
        ('rollup_devices_15m_compacted', 'distributed'), ('rollup_devices_1h_compacted', 'distributed'),
        ('rollup_devices_day_compacted', 'distributed'), ('report_series', 'distributed'),
        ('report_series_refresh', 'distributed'), ('mediation_policies', 'distributed'),
        ('mediation_changes', 'distributed'), ('app_networks', 'distributed'), ('client_drops', 'distributed'),
        ('rollup_priced_1h', 'distributed'), ('rollup_priced_day', 'distributed'), ('rollup_dirty', 'distributed'),
        ('report_series_changes', 'distributed'), ('network_report_rows', 'distributed'), ('network_imports', 'reference'),
        ('network_import_pairs', 'distributed')
    ) AS t (name, want)
    LEFT JOIN citus_tables c ON c.table_name = t.name::regclass
    WHERE c.citus_table_type IS DISTINCT FROM t.want
       OR (t.want = 'distributed' AND c.colocation_id IS DISTINCT FROM (SELECT colocation_id FROM citus_tables WHERE table_name = 'events'::regclass));
    IF wrong IS NOT NULL THEN
        RAISE EXCEPTION 'deploy/citus-setup.sql: tables not placed as they must be: %', wrong;
    END IF;
END $$;
