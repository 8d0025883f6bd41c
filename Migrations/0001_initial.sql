-- AdTally schema, part 1: apps, keys, raw events, dedupe ledger, rollups.
-- Every per-app table leads its keys with app_id, so the schema distributes by
-- app on Citus (create_distributed_table(..., 'app_id')) without changes.

CREATE TABLE apps (
    app_id     text PRIMARY KEY CHECK (app_id ~ '^[a-z0-9][a-z0-9_.-]{0,63}$'),
    name       text NOT NULL,
    timezone   text NOT NULL DEFAULT 'UTC',
    currency   char(3) NOT NULL DEFAULT 'USD' CHECK (currency ~ '^[A-Z]{3}$'),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- API keys. Only a SHA-256 of the secret is stored. An admin key has no app.
CREATE TABLE api_keys (
    key_id      text PRIMARY KEY,
    app_id      text REFERENCES apps (app_id),
    scope       text NOT NULL CHECK (scope IN ('ingest', 'read', 'admin')),
    secret_hash text NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz,
    CHECK ((scope = 'admin') = (app_id IS NULL))
);
CREATE INDEX api_keys_app ON api_keys (app_id, key_id);

-- Raw events, range-partitioned by day of occurred_at (UTC) so that retention
-- drops whole partitions instead of running a long DELETE. Partitions are
-- created ahead by the server (see EventPartitions).
CREATE TABLE events (
    app_id         text NOT NULL,
    occurred_at    timestamptz NOT NULL,
    event_id       uuid NOT NULL,
    type           text NOT NULL,
    network        text NOT NULL,
    format         text NOT NULL,
    placement      text NOT NULL DEFAULT 'default',
    size           text,
    country        char(2) NOT NULL DEFAULT 'ZZ',
    platform       text,
    os_version     text,
    app_version    text,
    device         text,
    revenue_micros bigint,
    currency       char(3),
    error_code     integer,
    will_leave     boolean,
    shown          boolean,
    received_at    timestamptz NOT NULL DEFAULT now()
) PARTITION BY RANGE (occurred_at);
CREATE INDEX events_app_time ON events (app_id, occurred_at);

-- Dedupe ledger: one row per (app, event id) ever stored. A unique index on the
-- partitioned events table would have to include occurred_at, which would let a
-- retry with another timestamp count twice; this table does not.
CREATE TABLE event_ids (
    app_id      text NOT NULL,
    event_id    uuid NOT NULL,
    occurred_at timestamptz NOT NULL,
    PRIMARY KEY (app_id, event_id)
);
