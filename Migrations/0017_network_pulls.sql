-- AdTally schema, part 17: the reconciliation as a scheduled export, and pulls of the
-- networks' reports from their APIs (DESIGN §5, §11).

-- 1. A schedule writes a report (the default) or the discrepancy report of
-- GET /v1/reconciliation, with the same parameters.
ALTER TABLE export_schedules
    ADD COLUMN kind text COLLATE "C" NOT NULL DEFAULT 'report' CHECK (kind IN ('report', 'reconciliation'));

-- 2. Pulls: per network account, its reporting API's endpoint and credential (an API
-- key or a bearer token), entered by an admin and never returned by the API. The
-- credential is encrypted (pgcrypto's pgp_sym_encrypt) with the servers' key
-- (ADTALLY_CREDENTIALS_KEY, else a key of server_secrets: then a dump of this database
-- holds both, so set the key outside it).
CREATE EXTENSION IF NOT EXISTS pgcrypto;
CREATE TABLE network_pulls (
    name             text COLLATE "C" PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,63}$'),
    source           text COLLATE "C" NOT NULL CHECK (source IN ('admob', 'max', 'levelplay')),
    endpoint         text NOT NULL CHECK (endpoint ~ '^https?://[^/?#@]+' AND length(endpoint) <= 2000),
    credential       bytea NOT NULL,
    -- Each day's pull asks for yesterday and this many days before it (restated days).
    restatement_days integer NOT NULL DEFAULT 3 CHECK (restatement_days BETWEEN 0 AND 30),
    paused           boolean NOT NULL DEFAULT false,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- 3. The pulls' runs, one a UTC day per pull (and any asked by hand), with the same
-- claim, retries and history as export_runs: the export runner's leader runs them.
CREATE TABLE network_pull_runs (
    pull            text COLLATE "C" NOT NULL REFERENCES network_pulls (name) ON DELETE CASCADE,
    day             date NOT NULL,
    status          text COLLATE "C" NOT NULL CHECK (status IN ('pending', 'running', 'retrying', 'succeeded', 'failed')),
    trigger         text COLLATE "C" NOT NULL CHECK (trigger IN ('schedule', 'manual')),
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    runner          text,
    started_at      timestamptz,
    finished_at     timestamptz,
    duration_ms     bigint,
    first_day       date,
    last_day        date,
    import_id       bigint,  -- network_imports (no foreign key: a reference table on Citus, this one local)
    lines           integer,
    error           text,
    PRIMARY KEY (pull, day)
);
CREATE INDEX network_pull_runs_due ON network_pull_runs (next_attempt_at) WHERE status IN ('pending', 'retrying');

-- 4. Which apps and networks each import has figures for (per app: distributed by
-- app_id on Citus): the revenue of record picks,
-- per app and network, the source whose imports it reads (the network's own, else its
-- newest import's) from these few rows, whatever a report's range.
CREATE TABLE network_import_pairs (
    app_id    text COLLATE "C" NOT NULL,
    network   text COLLATE "C" NOT NULL,
    import_id bigint NOT NULL,
    PRIMARY KEY (app_id, network, import_id)
);
INSERT INTO network_import_pairs (app_id, network, import_id)
SELECT DISTINCT app_id, network, import_id FROM network_report_rows;
