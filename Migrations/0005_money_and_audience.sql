-- AdTally schema, part 5: rate cards, FX rates, revenue rollups that a report can
-- price and convert by UTC date, and unique-device sketches (DESIGN §3).
--
-- 1. Unique devices: HyperLogLog sketches from PostgreSQL's hll extension (the
-- one Citus documents for this; Debian's postgresql-NN-hll). Why in PostgreSQL and
-- not in the server: a report merges sketches over any range and grouping where
-- the rollups already are (hll_union_agg beside sum(), in the same plan, on
-- every Citus shard too), and raw events can be sketched with the same hash
-- (hll_hash_text) by the same code. The ingest path hashes each device the same
-- way (MurmurHash3 x64-128, seed 0, first 64 bits: DeviceHash.swift, checked
-- against hll_hash_text by a test) and appends the hashes to its delta rows; the
-- compactor folds them into sketches at each grain.
--
-- Every sketch is hll(11, 5): 2,048 registers of 5 bits, at most 1,280 bytes
-- (below TOAST's threshold, so updating one rewrites one row), standard error
-- 1.04 / sqrt(2048) = 2.3%. Small sets stay explicit (exact) until they would
-- outgrow the dense form.
CREATE EXTENSION IF NOT EXISTS hll;

-- Hashes of the devices of the events a delta row counts (NULL: none).
ALTER TABLE rollup_delta ADD COLUMN device_hashes bigint[];

CREATE TABLE rollup_devices_15m_compacted (
    app_id  text COLLATE "C" NOT NULL,
    bucket  timestamptz NOT NULL,
    network text COLLATE "C" NOT NULL,
    format  text COLLATE "C" NOT NULL,
    devices hll NOT NULL,
    PRIMARY KEY (app_id, bucket, network, format)
);

CREATE TABLE rollup_devices_1h_compacted (
    app_id  text COLLATE "C" NOT NULL,
    hour    timestamptz NOT NULL,
    network text COLLATE "C" NOT NULL,
    format  text COLLATE "C" NOT NULL,
    devices hll NOT NULL,
    PRIMARY KEY (app_id, hour, network, format)
);

CREATE TABLE rollup_devices_day_compacted (
    app_id  text COLLATE "C" NOT NULL,
    day     date NOT NULL,  -- in the app's own zone, like rollup_day_compacted
    network text COLLATE "C" NOT NULL,
    format  text COLLATE "C" NOT NULL,
    devices hll NOT NULL,
    PRIMARY KEY (app_id, day, network, format)
);

-- The raw events still kept are all the devices there are to sketch.
INSERT INTO rollup_devices_15m_compacted
SELECT app_id, date_bin('15 minutes', occurred_at, TIMESTAMPTZ '1970-01-01 00:00:00+00'), network, format,
       hll_add_agg(hll_hash_text(device), 11, 5)
FROM events WHERE device IS NOT NULL GROUP BY 1, 2, 3, 4;

INSERT INTO rollup_devices_1h_compacted
SELECT app_id, date_trunc('hour', bucket, 'UTC'), network, format, hll_union_agg(devices)
FROM rollup_devices_15m_compacted GROUP BY 1, 2, 3, 4;

INSERT INTO rollup_devices_day_compacted
SELECT r.app_id, (r.bucket AT TIME ZONE a.timezone)::date, r.network, r.format, hll_union_agg(r.devices)
FROM rollup_devices_15m_compacted r JOIN apps a USING (app_id) GROUP BY 1, 2, 3, 4;

-- 2. Rate cards (DESIGN §3): per network, format and country ('*' for any), a
-- CPM and a CPT in micros of a currency, in force from a UTC date until the
-- next effective date of the same (network, format, country). A report prices
-- impressions and taps without reported revenue with these, from the rollups,
-- so a change re-prices history at once.
CREATE TABLE rate_cards (
    network        text COLLATE "C" NOT NULL CHECK (network ~ '^[a-z0-9_.-]{1,32}$'),
    format         text COLLATE "C" NOT NULL CHECK (format IN ('banner', 'interstitial', 'native', 'rewarded')),
    country        text COLLATE "C" NOT NULL CHECK (country = '*' OR country ~ '^[A-Z]{2}$'),
    effective_from date NOT NULL,
    currency       text COLLATE "C" NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    cpm_micros     bigint NOT NULL CHECK (cpm_micros >= 0),
    cpt_micros     bigint NOT NULL CHECK (cpt_micros >= 0),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (network, format, country, effective_from)
);

-- 3. FX: units of `currency` per one unit of `base`, per UTC date. Each import
-- names its base (the ECB's is EUR) and also stores the base itself at 1, so a
-- conversion from A to B on a day is rate(B) / rate(A) within one base.
-- carried_from: the rate was not published for this day (a weekend or holiday)
-- and `adtally fx import --fill-gaps` carried that day's over it.
CREATE TABLE fx_rates (
    day          date NOT NULL,
    base         text COLLATE "C" NOT NULL CHECK (base ~ '^[A-Z]{3}$'),
    currency     text COLLATE "C" NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    rate         numeric NOT NULL CHECK (rate > 0 AND (currency <> base OR rate = 1)),
    carried_from date,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (day, currency, base)
);

-- n / d rounded to an integer, half to even (banker's rounding), exactly: div()
-- and mod() on numeric are exact. d > 0. Inlined by the planner (one SELECT).
CREATE FUNCTION adtally_div_half_even(n numeric, d numeric) RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT div(n, d) + CASE WHEN 2 * abs(mod(n, d)) > d OR (2 * abs(mod(n, d)) = d AND mod(div(n, d), 2) <> 0)
                            THEN sign(n) ELSE 0 END
$$;

-- 4. Revenue rollups a report can price and convert. Rates and FX apply by the
-- event's UTC date; the hourly grain is in UTC already, the daily one is in the
-- app's zone, so its rows are also split by UTC date (at most two per local day).
--
-- Rows with currency '' carry the impressions and taps that had no reported
-- revenue, over all countries: priced at the any-country rate. Per country they
-- are kept apart (rollup_unpriced_*), keyed country first: a report reads them
-- only for the countries a rate card names, and prices each such row at its
-- country's rate less the any-country rate it already got. So a report reads a
-- row per key and hour or day, plus a row per rate-card country, however many
-- countries the traffic came from.
ALTER TABLE rollup_revenue_1h_compacted
    ADD COLUMN unpriced_impressions bigint NOT NULL DEFAULT 0,
    ADD COLUMN unpriced_taps bigint NOT NULL DEFAULT 0;

INSERT INTO rollup_revenue_1h_compacted (app_id, hour, network, format, currency, revenue_micros, unpriced_impressions, unpriced_taps)
SELECT app_id, date_trunc('hour', bucket, 'UTC'), network, format, '', 0, sum(unpriced_impressions), sum(unpriced_taps)
FROM rollup_revenue_15m_compacted WHERE currency = '' GROUP BY 1, 2, 3, 4;

CREATE TABLE rollup_unpriced_1h_compacted (
    app_id      text COLLATE "C" NOT NULL,
    country     text COLLATE "C" NOT NULL,
    hour        timestamptz NOT NULL,
    network     text COLLATE "C" NOT NULL,
    format      text COLLATE "C" NOT NULL,
    impressions bigint NOT NULL DEFAULT 0,
    taps        bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (app_id, country, hour, network, format)
);

INSERT INTO rollup_unpriced_1h_compacted
SELECT app_id, country, date_trunc('hour', bucket, 'UTC'), network, format, sum(unpriced_impressions), sum(unpriced_taps)
FROM rollup_revenue_15m_compacted WHERE currency = '' GROUP BY 1, 2, 3, 4, 5;

DROP TABLE rollup_revenue_day_compacted;
CREATE TABLE rollup_revenue_day_compacted (
    app_id               text COLLATE "C" NOT NULL,
    day                  date NOT NULL,  -- in the app's own zone
    utc_day              date NOT NULL,
    network              text COLLATE "C" NOT NULL,
    format               text COLLATE "C" NOT NULL,
    currency             text COLLATE "C" NOT NULL,  -- '' for the unpriced counts
    revenue_micros       numeric(38, 0) NOT NULL DEFAULT 0,
    unpriced_impressions bigint NOT NULL DEFAULT 0,
    unpriced_taps        bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (app_id, day, utc_day, network, format, currency)
);

INSERT INTO rollup_revenue_day_compacted
SELECT r.app_id, (r.bucket AT TIME ZONE a.timezone)::date, (r.bucket AT TIME ZONE 'UTC')::date, r.network, r.format, r.currency,
       sum(r.revenue_micros), sum(r.unpriced_impressions), sum(r.unpriced_taps)
FROM rollup_revenue_15m_compacted r JOIN apps a USING (app_id) GROUP BY 1, 2, 3, 4, 5, 6;

CREATE TABLE rollup_unpriced_day_compacted (
    app_id      text COLLATE "C" NOT NULL,
    country     text COLLATE "C" NOT NULL,
    day         date NOT NULL,
    utc_day     date NOT NULL,
    network     text COLLATE "C" NOT NULL,
    format      text COLLATE "C" NOT NULL,
    impressions bigint NOT NULL DEFAULT 0,
    taps        bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (app_id, country, day, utc_day, network, format)
);

INSERT INTO rollup_unpriced_day_compacted
SELECT r.app_id, r.country, (r.bucket AT TIME ZONE a.timezone)::date, (r.bucket AT TIME ZONE 'UTC')::date, r.network, r.format,
       sum(r.unpriced_impressions), sum(r.unpriced_taps)
FROM rollup_revenue_15m_compacted r JOIN apps a USING (app_id) WHERE r.currency = '' GROUP BY 1, 2, 3, 4, 5, 6;
