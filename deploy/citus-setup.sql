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

-- Places a table once: a reference table whole on every node, or a table distributed by
-- app_id and co-located with events (the first, events, with none before it). A table
-- already placed as asked is left as it is, so the script can run again. (A function of
-- this session only: nothing of it reaches the workers or outlives the run.)
CREATE OR REPLACE FUNCTION pg_temp.place(tab text, kind text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM citus_tables WHERE table_name = tab::regclass AND citus_table_type = kind) THEN
        RETURN;
    ELSIF kind = 'reference' THEN
        PERFORM create_reference_table(tab);
    ELSIF tab = 'events' THEN
        PERFORM create_distributed_table(tab, 'app_id');
    ELSE
        PERFORM create_distributed_table(tab, 'app_id', colocate_with => 'events');
    END IF;
END $$;

-- Small tables every node needs whole. Placing them makes Citus turn the tables with
-- foreign keys to them into Citus-local ones; each is then distributed below, and the
-- guards check each table's real placement (citus_tables), not only that Citus knows it.
SELECT pg_temp.place('apps', 'reference');
SELECT pg_temp.place('api_keys', 'reference');

-- Per-app tables, co-located by app_id: every primary key leads with it.
SELECT pg_temp.place('events', 'distributed');
SELECT pg_temp.place('event_ids', 'distributed');
SELECT pg_temp.place('rollup_15m_compacted', 'distributed');
SELECT pg_temp.place('rollup_revenue_15m_compacted', 'distributed');
SELECT pg_temp.place('rollup_delta', 'distributed');

-- The dashboards' tables (Migrations/0007): the shared secrets whole on every node,
-- the report series co-located with the app's events.
SELECT pg_temp.place('server_secrets', 'reference');
SELECT pg_temp.place('report_series', 'distributed');
SELECT pg_temp.place('report_series_refresh', 'distributed');

-- The other rollup grains (Migrations/0004, 0005): hourly and daily counts, revenue,
-- unpriced events and the devices' HyperLogLog sketches, co-located with the events,
-- so a report of one app reads one shard group.
SELECT pg_temp.place('rollup_1h_compacted', 'distributed');
SELECT pg_temp.place('rollup_day_compacted', 'distributed');
SELECT pg_temp.place('rollup_revenue_1h_compacted', 'distributed');
SELECT pg_temp.place('rollup_revenue_day_compacted', 'distributed');
SELECT pg_temp.place('rollup_unpriced_1h_compacted', 'distributed');
SELECT pg_temp.place('rollup_unpriced_day_compacted', 'distributed');
SELECT pg_temp.place('rollup_devices_15m_compacted', 'distributed');
SELECT pg_temp.place('rollup_devices_1h_compacted', 'distributed');
SELECT pg_temp.place('rollup_devices_day_compacted', 'distributed');
SELECT pg_temp.place('rollup_devices_app_day', 'distributed');

-- Priced rollups (Migrations/0012): revenue summed as it is compacted, the ranges a card
-- change left to re-price, and the report series' changed days, per app like the rest.
SELECT pg_temp.place('rollup_priced_1h', 'distributed');
SELECT pg_temp.place('rollup_priced_day', 'distributed');
SELECT pg_temp.place('rollup_dirty', 'distributed');
SELECT pg_temp.place('report_series_changes', 'distributed');

-- The mediation switch (Migrations/0009): each app's policies, decisions and history.
SELECT pg_temp.place('mediation_policies', 'distributed');
SELECT pg_temp.place('mediation_changes', 'distributed');

-- The networks admitted per app (Migrations/0010), read by ingest with each app's events.
SELECT pg_temp.place('app_networks', 'distributed');
-- The networks' own reports (Migrations/0015), compared per app with its rollups, and
-- the imports they belong to (joined with them on the workers; referenced first).
SELECT pg_temp.place('network_imports', 'reference');
SELECT pg_temp.place('network_import_pairs', 'distributed');
SELECT pg_temp.place('network_report_rows', 'distributed');
SELECT pg_temp.place('client_drops', 'distributed');

-- Installs (Migrations/0023): each device's install, its active days and their money,
-- and the deltas the ingest path appends for them.
SELECT pg_temp.place('install_delta', 'distributed');
SELECT pg_temp.place('installs', 'distributed');
SELECT pg_temp.place('install_days', 'distributed');
SELECT pg_temp.place('install_day_revenue', 'distributed');
-- The cohort grain (Migrations/0024): the device rows summed per cohort and day.
SELECT pg_temp.place('cohort_days', 'distributed');
SELECT pg_temp.place('cohort_priced_day', 'distributed');
-- Grafana's cohort series (Migrations/0025), written per app as report_series is.
SELECT pg_temp.place('cohort_series', 'distributed');
-- Erased devices' tombstones (Migrations/0027): read by the ingest path per app, beside the events.
SELECT pg_temp.place('device_tombstones', 'distributed');
-- Experiments on the switch (Migrations/0029) and each device's first exposure, joined
-- per app with its install rows by the results (referenced first).
SELECT pg_temp.place('experiments', 'distributed');
SELECT pg_temp.place('experiment_exposures', 'distributed');

-- Joined into every report on the workers: the rate card, the FX rates, and the
-- accepted event window (id_horizon, read by the notes and locked by the ledger's pruning).
SELECT pg_temp.place('rate_cards', 'reference');
SELECT pg_temp.place('fx_rates', 'reference');
SELECT pg_temp.place('id_horizon', 'reference');

-- Stay local on the coordinator: never joined with a per-app table.
-- local: schema_migrations, schema_migration_steps, export_schedules, export_runs, export_leader, rollup_compaction_passes, network_settings, network_mappings, network_pulls, network_pull_runs, alert_rules, alert_states, alert_events, alert_deliveries, alert_leader, erasures, erasure_devices, erasure_leader

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
        ('rollup_devices_day_compacted', 'distributed'), ('rollup_devices_app_day', 'distributed'), ('report_series', 'distributed'),
        ('report_series_refresh', 'distributed'), ('mediation_policies', 'distributed'),
        ('mediation_changes', 'distributed'), ('app_networks', 'distributed'), ('client_drops', 'distributed'),
        ('rollup_priced_1h', 'distributed'), ('rollup_priced_day', 'distributed'), ('rollup_dirty', 'distributed'),
        ('report_series_changes', 'distributed'), ('network_report_rows', 'distributed'), ('network_imports', 'reference'),
        ('network_import_pairs', 'distributed'), ('install_delta', 'distributed'), ('installs', 'distributed'),
        ('install_days', 'distributed'), ('install_day_revenue', 'distributed'), ('cohort_days', 'distributed'),
        ('cohort_priced_day', 'distributed'), ('cohort_series', 'distributed'), ('device_tombstones', 'distributed'),
        ('experiments', 'distributed'), ('experiment_exposures', 'distributed')
    ) AS t (name, want)
    LEFT JOIN citus_tables c ON c.table_name = t.name::regclass
    WHERE c.citus_table_type IS DISTINCT FROM t.want
       OR (t.want = 'distributed' AND c.colocation_id IS DISTINCT FROM (SELECT colocation_id FROM citus_tables WHERE table_name = 'events'::regclass));
    IF wrong IS NOT NULL THEN
        RAISE EXCEPTION 'deploy/citus-setup.sql: tables not placed as they must be: %', wrong;
    END IF;
END $$;
