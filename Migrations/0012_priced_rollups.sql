-- AdTally schema, part 12: priced rollups (issue 25). Revenue summed before a
-- report runs, so a report reads stored money instead of pricing every row.
--
-- Why: with a rate card, the default 30-day report for the bench's largest app went
-- from 9 ms to 54-57 ms. It unioned ~11 k rows (day counts, revenue by UTC date and
-- currency, every rate-card country's adjustment rows), joined them to the card
-- expanded per day, and grouped twice. The prices must be summed before the report.
--
-- What is stored
--
--   rollup_priced_1h    per app, UTC hour, network, format and money currency: reported
--   rollup_priced_day   revenue (in the currency the SDK reported), estimated revenue
--                       (rate-card prices, in the card entry's currency; exact, with the
--                       thousandths of a micro a CPM leaves) and unrated events (no entry
--                       in force: currency ''). The daily grain is in the app's own zone,
--                       split by UTC date, like rollup_revenue_day_compacted.
--   rollup_dirty        per app, network and format, a range of UTC dates whose priced
--                       rows may be stale: a card change writes them in the same
--                       transaction as the card.
--
-- A price is found in rate_cards itself, once per distinct (UTC date, network, format,
-- country) of the rows being priced (RatePricing.swift): the card is never expanded
-- per day, so there is nothing to keep in step with it.
--
-- Invariants
--
-- 1. Prices apply by the event's UTC date, the country's entry over the any-country
--    one (DESIGN §3), and a priced row holds exact sums: FX conversion and half-even
--    rounding to micros stay in the report, once per (group, UTC date, currency) bucket,
--    exactly as before. So a report from priced rows equals the query-time pricing of
--    the same rows to the micro (PricedRollupTests).
-- 2. Outside the dirty ranges, the priced rows equal the revenue and unpriced rollups
--    priced with the card as it is now. The compactor prices each delta as it folds it,
--    at the card in force when it runs (it holds the compaction lock); a card change
--    takes the same lock, so it comes wholly before or after a pass, and it marks
--    dirty every UTC date whose price it may have changed, for every app.
-- 3. Inside a dirty range a report prices at query time from the revenue and unpriced
--    rollups (every country's row at its own rate), and ignores the priced rows. The
--    re-pricer (under the same lock) rewrites a dirty range's priced rows from those
--    rollups and then shrinks the range, in one transaction. So the very next report
--    after a card change shows it, and every report reads one consistent state.
-- 4. Pending deltas and the 15-minute rows of cut hours are priced at query time too.
-- 5. A report reads the dirty ranges and the rollups in one snapshot (REPEATABLE READ).

CREATE TABLE rollup_priced_1h (
    app_id    text COLLATE "C" NOT NULL,
    hour      timestamptz NOT NULL,
    network   text COLLATE "C" NOT NULL,
    format    text COLLATE "C" NOT NULL,
    currency  text COLLATE "C" NOT NULL,  -- '' for unrated events only
    reported  numeric NOT NULL DEFAULT 0,
    estimated numeric NOT NULL DEFAULT 0,
    unrated   bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (app_id, hour, network, format, currency)
);

CREATE TABLE rollup_priced_day (
    app_id    text COLLATE "C" NOT NULL,
    day       date NOT NULL,  -- in the app's own zone
    utc_day   date NOT NULL,
    network   text COLLATE "C" NOT NULL,
    format    text COLLATE "C" NOT NULL,
    currency  text COLLATE "C" NOT NULL,
    reported  numeric NOT NULL DEFAULT 0,
    estimated numeric NOT NULL DEFAULT 0,
    unrated   bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (app_id, day, network, format, utc_day, currency)
);

CREATE TABLE rollup_dirty (
    app_id    text COLLATE "C" NOT NULL,
    network   text COLLATE "C" NOT NULL,
    format    text COLLATE "C" NOT NULL,
    from_day  date NOT NULL,
    to_day    date NOT NULL,
    marked_at timestamptz NOT NULL DEFAULT now(),
    CHECK (from_day <= to_day),
    -- Ranges of one key may overlap (each change marks its own); app_id leads, as Citus needs.
    PRIMARY KEY (app_id, network, format, from_day, marked_at)
);

-- History compacted before this migration: every app's every network and format is
-- dirty, so reports price it at query time (as before) until the re-pricer has
-- written its priced rows.
INSERT INTO rollup_dirty (app_id, network, format, from_day, to_day)
SELECT DISTINCT app_id, network, format, '-infinity'::date, 'infinity'::date FROM rollup_day_compacted WHERE network <> '';

-- The unpriced rows of every country: the re-pricer and the query-time path read them
-- by app and UTC date, not by country first.
CREATE INDEX rollup_unpriced_1h_by_app ON rollup_unpriced_1h_compacted (app_id, hour);
CREATE INDEX rollup_unpriced_day_by_app ON rollup_unpriced_day_compacted (app_id, day);

-- The report series (Migrations/0007) refreshed by change, not every app every minute:
-- the local days (in the app's zone) whose numbers changed since the app's series were
-- last written. The compactor marks the days of the deltas it folds, a card change and
-- an FX change mark the days they re-price; each mark bumps `version`, so a refresh
-- removes only the mark it read (a day marked while it ran stays marked).
CREATE TABLE report_series_changes (
    app_id   text COLLATE "C" PRIMARY KEY REFERENCES apps (app_id),
    from_day date NOT NULL,
    to_day   date NOT NULL,
    version  bigint NOT NULL DEFAULT 1
);

-- When an app's series must be written again although nothing changed: its next local
-- midnight (the windows move, today's hours begin) or the moment its oldest provisional
-- day becomes final, whichever is first. NULL: at the next pass.
ALTER TABLE report_series_refresh ADD COLUMN due_at timestamptz;

-- Servers of an older version, still running while this one migrates, must not write
-- what the priced rollups would miss. Their compaction pass ends with an INSERT into
-- rollup_compaction_passes, and their card changes with one into rate_cards, neither
-- naming these columns: without a default, those fail (and the whole pass or change
-- with them, loudly) until the old servers are replaced. Their deltas wait in
-- rollup_delta for a new server's compactor; nothing is lost or priced wrong.
ALTER TABLE rollup_compaction_passes ADD COLUMN priced boolean NOT NULL DEFAULT true;
ALTER TABLE rollup_compaction_passes ALTER COLUMN priced DROP DEFAULT;
ALTER TABLE rate_cards ADD COLUMN marks_priced boolean NOT NULL DEFAULT true;
ALTER TABLE rate_cards ALTER COLUMN marks_priced DROP DEFAULT;
