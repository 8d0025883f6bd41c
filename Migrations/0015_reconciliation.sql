-- AdTally schema, part 15: the networks' own reports beside AdTally's counts (DESIGN §11).
--
-- Publishers are paid on each network's figures, which never match the app's counts
-- exactly (a network counts at its own callback, restates recent days, and reports
-- days in its own zone). AdTally imports those reports and compares them, day by day
-- in the network's zone, with its own counts recomputed by the report engine in that
-- zone.

-- 1. Per network: how far apart the two counts may be before a row is flagged
-- (default 10 %, the IAB's; 15 % is common for mobile), and how many days after a day
-- the network's figures for it stop changing (LevelPlay restates D+1 and D+2, then
-- freezes: 3). A network without a row has the defaults.
CREATE TABLE network_settings (
    network          text COLLATE "C" PRIMARY KEY CHECK (network ~ '^[a-z0-9_.-]{1,32}$'),
    tolerance_pct    numeric(5, 2) NOT NULL DEFAULT 10 CHECK (tolerance_pct > 0 AND tolerance_pct <= 100),
    final_after_days integer NOT NULL DEFAULT 3 CHECK (final_after_days BETWEEN 0 AND 60),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- 2. The networks' names for apps (AdMob's "ca-app-pub-…~…", a MAX package name, a
-- LevelPlay app key) and for ad sources ("AdMob Network", "SMAATO_BIDDING"), mapped
-- once to AdTally's app ids and network names. One name maps to one target: mapping
-- it again to another is refused (delete it first), so an import is never ambiguous.
CREATE TABLE network_mappings (
    source     text COLLATE "C" NOT NULL CHECK (source IN ('admob', 'max', 'levelplay', 'csv')),
    kind       text COLLATE "C" NOT NULL CHECK (kind IN ('app', 'network')),
    external   text COLLATE "C" NOT NULL CHECK (length(external) BETWEEN 1 AND 200),
    target     text COLLATE "C" NOT NULL CHECK (target ~ '^[a-z0-9_.-]{1,64}$'),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source, kind, external)
);

-- 3. Every import, kept: which file (its SHA-256), from where, in which zone, the
-- days it covers, and the network's own warnings (AdMob's DATA_DELAYED makes none of
-- its days final).
CREATE TABLE network_imports (
    import_id   bigserial PRIMARY KEY,
    source      text COLLATE "C" NOT NULL CHECK (source IN ('admob', 'max', 'levelplay', 'csv')),
    zone        text NOT NULL,
    file_sha256 text COLLATE "C" NOT NULL CHECK (file_sha256 ~ '^[0-9a-f]{64}$'),
    first_day   date,
    last_day    date,
    lines       integer NOT NULL CHECK (lines >= 0),
    is_delayed  boolean NOT NULL DEFAULT false,
    -- The file states the days it covers (AdMob's header): a day of that range without
    -- a line for an app and network it has is a zero. Other files cover the days they
    -- have lines for.
    has_range   boolean NOT NULL DEFAULT false,
    warnings    text[] NOT NULL DEFAULT '{}',
    via         text COLLATE "C" NOT NULL CHECK (via IN ('api', 'cli', 'pull')),
    imported_at timestamptz NOT NULL DEFAULT now()
);

-- 4. The imported figures, summed by app, network, day (in the import's zone),
-- format, country (ZZ unknown, as in events) and currency. For each app, network and
-- day, the current import of a source is its newest that covers the day (a
-- restatement replaces the earlier one); the earlier rows stay, as history, and the
-- reconciliation names the import each row used. clicks is NULL where the report has
-- none (MAX's).
CREATE TABLE network_report_rows (
    app_id         text COLLATE "C" NOT NULL REFERENCES apps (app_id) ON DELETE CASCADE,
    network        text COLLATE "C" NOT NULL,
    day            date NOT NULL,
    import_id      bigint NOT NULL REFERENCES network_imports (import_id) ON DELETE CASCADE,
    format         text COLLATE "C" NOT NULL CHECK (format IN ('banner', 'interstitial', 'native', 'rewarded')),
    country        text COLLATE "C" NOT NULL CHECK (country ~ '^[A-Z]{2}$'),
    currency       text COLLATE "C" NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    impressions    bigint NOT NULL CHECK (impressions >= 0),
    clicks         bigint CHECK (clicks >= 0),
    revenue_micros bigint NOT NULL CHECK (revenue_micros >= 0),
    -- The rows of an app, network and day, newest import last: the key's order.
    PRIMARY KEY (app_id, network, day, import_id, format, country, currency)
);
CREATE INDEX network_report_rows_import ON network_report_rows (import_id);
