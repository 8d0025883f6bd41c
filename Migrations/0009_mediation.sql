-- AdTally schema, part 9: the mediation switch (DESIGN §9).
--
-- A policy says how an app (optionally one placement and/or one country of it)
-- picks the ad network it shows: pinned, a fixed weighted split, or automatic
-- (the highest expected revenue per request over a trailing window). '' in
-- placement or country means "every one": a real placement is 1–64 characters
-- and a country two letters, so '' never names one.
--
-- The row also holds the decision the servers serve (MediationRefresher.swift):
-- the network chosen, since when, and the body of GET /v1/apps/{app}/mediation as
-- last computed. Every server refreshes stale decisions and serves from memory;
-- the chosen network is what hysteresis compares a challenger with, shared here so
-- that every server keeps the same incumbent and a restarted one does not forget it.
CREATE TABLE mediation_policies (
    app_id          text COLLATE "C" NOT NULL REFERENCES apps (app_id) ON DELETE CASCADE,
    -- Checked as events check theirs (MediationPolicy.validated).
    placement       text COLLATE "C" NOT NULL DEFAULT '',
    country         text COLLATE "C" NOT NULL DEFAULT '' CHECK (country = '' OR country ~ '^[A-Z]{2}$'),
    rule            text NOT NULL CHECK (rule IN ('pinned', 'weighted', 'automatic')),
    -- pinned: the network; weighted: network → weight (positive integers);
    -- automatic: the networks it may choose (empty: any the app reports) and the
    -- default when no network has enough data and nothing was chosen before.
    network         text,
    weights         jsonb,
    networks        text[] NOT NULL DEFAULT '{}',
    default_network text,
    window_hours    integer NOT NULL DEFAULT 24 CHECK (window_hours BETWEEN 1 AND 168),
    min_requests    bigint NOT NULL DEFAULT 1000 CHECK (min_requests >= 1),
    -- A challenger must beat the incumbent's expected revenue by this fraction.
    hysteresis      double precision NOT NULL DEFAULT 0.1 CHECK (hysteresis >= 0 AND hysteresis <= 10),
    max_age_seconds integer NOT NULL DEFAULT 300 CHECK (max_age_seconds BETWEEN 0 AND 86400),
    updated_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    chosen          text,
    chosen_since    timestamptz,
    decision        text,
    decided_at      timestamptz,
    PRIMARY KEY (app_id, placement, country)
);

-- Every policy change and every switch of the served network: what, when, from,
-- to and why. Kept for good (a few rows a day per policy at most: hysteresis).
CREATE TABLE mediation_changes (
    app_id      text COLLATE "C" NOT NULL REFERENCES apps (app_id) ON DELETE CASCADE,
    id          bigserial,
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    placement   text COLLATE "C" NOT NULL,
    country     text COLLATE "C" NOT NULL,
    -- policy: set or replaced; deleted: removed; switch: the served network changed.
    kind        text NOT NULL CHECK (kind IN ('policy', 'deleted', 'switch')),
    from_value  text,
    to_value    text,
    reason      text NOT NULL,
    actor       text NOT NULL,
    PRIMARY KEY (app_id, id)
);
CREATE INDEX mediation_changes_at ON mediation_changes (app_id, at DESC);
