-- AdTally schema, part 1: apps, keys, raw events, dedupe ledger, rollups.
-- Every per-app table leads its keys with app_id, so the schema distributes by
-- app on Citus (create_distributed_table(..., 'app_id')) without changes.
-- Identifier columns that are index keys use COLLATE "C": byte order, which is
-- what ids need, and several times cheaper to compare than a linguistic
-- collation on every B-tree descent of the ingest path.

CREATE TABLE apps (
    app_id     text COLLATE "C" PRIMARY KEY CHECK (app_id ~ '^[a-z0-9][a-z0-9_.-]{0,63}$'),
    name       text NOT NULL,
    timezone   text NOT NULL DEFAULT 'UTC',
    currency   char(3) NOT NULL DEFAULT 'USD' CHECK (currency ~ '^[A-Z]{3}$'),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- API keys. Only a SHA-256 of the secret is stored. An admin key has no app.
CREATE TABLE api_keys (
    key_id      text PRIMARY KEY,
    app_id      text COLLATE "C" REFERENCES apps (app_id),
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
    app_id         text COLLATE "C" NOT NULL,
    occurred_at    timestamptz NOT NULL,
    event_id       uuid NOT NULL,
    type           text NOT NULL,
    network        text COLLATE "C" NOT NULL,
    format         text COLLATE "C" NOT NULL,
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
    app_id      text COLLATE "C" NOT NULL,
    event_id    uuid NOT NULL,
    occurred_at timestamptz NOT NULL,
    PRIMARY KEY (app_id, event_id)
);

-- How old an accepted event may be, as the widest window any server or import
-- has used. Ids are kept that long plus a day: an event older than that is
-- refused by validation, so its id can no longer come back as a duplicate.
-- Only ever widened (GREATEST), so no process prunes ids another still needs.
CREATE TABLE id_horizon (
    singleton             boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    max_event_age_seconds bigint NOT NULL
);
INSERT INTO id_horizon (max_event_age_seconds) VALUES (7 * 86400);

-- Rollups, updated in the same transaction as the events they count and only
-- for newly stored events (a duplicate never reaches them).
--
-- Time grain: 15-minute UTC buckets. Every IANA zone's offset is a multiple of
-- 15 minutes (+05:30 Kolkata, +05:45 Kathmandu) and DST shifts move by 30 or 60
-- minutes, so a day in any zone, 23, 24 or 25 hours long, is an exact union of
-- buckets. An hourly grain would cut Kolkata's and Kathmandu's midnights.
--
-- Why these two tables and not one keyed by every dimension: a wide rollup
-- barely compresses ad events (measured: 1.7 M rows for 2 M events) and is only
-- ~3x faster to query than raw events, while a narrow one is ~20x faster. So:
--
--   rollup_15m         (app, bucket, network, format) with a column per event
--                      type. Serves the default report shape of DESIGN §4
--                      (app / date / hour / week / month x network x format:
--                      requests, impressions, fill, taps, ctr, cancels,
--                      expiries, wasted fills) and the mediation switch (§9).
--   rollup_revenue_15m (app, bucket, network, format, country, currency) for
--                      impressions and taps only: reported revenue per currency,
--                      and the counts without reported revenue ('' currency)
--                      that the rate card prices per country. Requests, the
--                      bulk of all events, never touch it.
--
-- Reports by placement, size, platform, os_version, app_version, error_code or
-- country counts, and unique_devices, read the raw events (partition-pruned by
-- day and indexed by app and time).
CREATE TABLE rollup_15m (
    app_id         text COLLATE "C" NOT NULL,
    bucket         timestamptz NOT NULL,
    network        text COLLATE "C" NOT NULL,
    format         text COLLATE "C" NOT NULL,
    requests       bigint NOT NULL DEFAULT 0,
    loads          bigint NOT NULL DEFAULT 0,
    impressions    bigint NOT NULL DEFAULT 0,
    errors         bigint NOT NULL DEFAULT 0,
    taps           bigint NOT NULL DEFAULT 0,
    action_cancels bigint NOT NULL DEFAULT 0,
    expiries       bigint NOT NULL DEFAULT 0,
    wasted_fills   bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (app_id, bucket, network, format)
);

CREATE TABLE rollup_revenue_15m (
    app_id               text COLLATE "C" NOT NULL,
    bucket               timestamptz NOT NULL,
    network              text COLLATE "C" NOT NULL,
    format               text COLLATE "C" NOT NULL,
    country              char(2) COLLATE "C" NOT NULL,
    currency             text COLLATE "C" NOT NULL,  -- '' for events without reported revenue
    revenue_micros       bigint NOT NULL DEFAULT 0,
    priced_events        bigint NOT NULL DEFAULT 0,
    unpriced_impressions bigint NOT NULL DEFAULT 0,
    unpriced_taps        bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (app_id, bucket, network, format, country, currency)
);

