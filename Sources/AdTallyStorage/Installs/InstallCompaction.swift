import PostgresKit

/// Folds the install deltas the ingest path appends (`install_delta`, Migrations/0023)
/// into `installs`, `install_days` and `install_day_revenue`, and the cohort grain summed
/// from them (`cohort_days`, `cohort_priced_day`, Migrations/0024). `RollupCompactor` runs it
/// in each pass's transaction, under the compaction lock and the pass's bounds, after the
/// rollups' move: every delta row is folded once, and deleted in the transaction that
/// folds it.
///
/// An install is a device's earliest event: a pass whose rows show an earlier one (a late
/// event, an offline device's queue) moves it there, with its day (the cohort) and what
/// that event was seen with; ties at one instant keep the least (country, platform,
/// version), as the ingest path and the migration do, so that arrival order never
/// decides a cohort.
enum InstallCompaction {
    /// Every install delta the statement sees; returns the rows moved.
    static let moveStatement = statement(bound: nil)
    /// Those of the (bucket, app) groups before `($1, $2)` only (`RollupCompactor`'s bound).
    static let boundedMoveStatement = statement(bound: "<")
    /// Those of the (bucket, app) groups up to `($1, $2)` only.
    static let throughMoveStatement = statement(bound: "<=")

    static func statement(bound: String?) -> String {
        """
        WITH moved AS (
            DELETE FROM install_delta\(bound.map { " WHERE (bucket, app_id) \($0) ($1, $2)" } ?? "") RETURNING *
        ), local AS (
            -- Each app's local day, in its own fixed zone, and the UTC hour.
            SELECT m.*, (m.bucket AT TIME ZONE a.timezone)::date AS day, date_trunc('hour', m.bucket, 'UTC') AS hour, a.timezone
            FROM moved m JOIN apps a USING (app_id)
        ), firsts AS (
            SELECT DISTINCT ON (app_id, device) app_id, device, first_at, (first_at AT TIME ZONE timezone)::date AS day,
                   country, first_platform, first_version
            FROM local
            ORDER BY app_id, device, first_at, country, coalesce(first_platform, ''), coalesce(first_version, '')
        ), cohorts AS MATERIALIZED (
            -- Each device's install after the pass (its earliest event, this pass's or one
            -- before), and whether it left the day its rows were kept under (`moved`).
            -- (Every CTE reads the tables as they were before the statement. Citus runs
            -- the CTEs of a statement over many apps one after another, each seeing the
            -- writes before it: so every CTE that reads a table comes before any write.)
            SELECT f.*, i.day AS old_day,
                   i.first_seen IS NULL OR (f.first_at, f.country, coalesce(f.first_platform, ''), coalesce(f.first_version, ''))
                       < (i.first_seen, i.country, coalesce(i.platform, ''), coalesce(i.app_version, '')) AS earlier
            FROM firsts f LEFT JOIN installs i ON i.app_id = f.app_id AND i.device = f.device
        ), cohort AS MATERIALIZED (
            SELECT app_id, device, CASE WHEN earlier THEN day ELSE old_day END AS cohort, earlier AND old_day IS NOT NULL AND old_day <> day AS moved
            FROM cohorts
        ), day_sums AS MATERIALIZED (
            SELECT l.app_id, l.device, l.day, c.cohort, sum(events) AS events, sum(requests) AS requests, sum(impressions) AS impressions,
                   sum(taps) AS taps, sum(sessions) AS sessions
            FROM local l JOIN cohort c ON c.app_id = l.app_id AND c.device = l.device
            GROUP BY 1, 2, 3, 4
        ), revenue_sums AS MATERIALIZED (
            SELECT l.app_id, l.device, l.day, c.cohort, l.hour, l.network, l.format, l.country, l.currency, sum(impressions) AS impressions,
                   sum(taps) AS taps, sum(revenue_micros) AS revenue_micros, sum(priced_events) AS priced_events,
                   sum(unpriced_impressions) AS unpriced_impressions, sum(unpriced_taps) AS unpriced_taps
            FROM local l JOIN cohort c ON c.app_id = l.app_id AND c.device = l.device
            WHERE l.impressions + l.taps > 0
            GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9
        ), day_changes AS MATERIALIZED (
            -- The cohort grain (Migrations/0024): each day row this pass writes adds a device
            -- to its cohort's day unless the device had that day already (under the same
            -- cohort); a moved install's rows before the pass leave their cohort, and join
            -- the new one (those this pass writes, with what they held, above).
            SELECT s.app_id, s.cohort, s.day, CASE WHEN o.day IS NOT NULL AND NOT c.moved THEN 0 ELSE 1 END AS devices,
                   s.impressions + CASE WHEN c.moved THEN coalesce(o.impressions, 0) ELSE 0 END AS impressions
            FROM day_sums s JOIN cohort c ON c.app_id = s.app_id AND c.device = s.device
            LEFT JOIN install_days o ON o.app_id = s.app_id AND o.device = s.device AND o.day = s.day
            UNION ALL
            SELECT o.app_id, o.cohort, o.day, -1, -o.impressions
            FROM install_days o JOIN cohort c ON c.moved AND o.app_id = c.app_id AND o.device = c.device
            UNION ALL
            SELECT o.app_id, c.cohort, o.day, 1, o.impressions
            FROM install_days o JOIN cohort c ON c.moved AND o.app_id = c.app_id AND o.device = c.device
            WHERE NOT EXISTS (SELECT 1 FROM day_sums s WHERE s.app_id = o.app_id AND s.device = o.device AND s.day = o.day)
        ), money_changes AS MATERIALIZED (
            -- Their money: this pass's, and a moved install's rows before the pass, out of
            -- the old cohort and into the new one; priced at the card in force, as the
            -- rollups' deltas are (the pass holds the compaction lock a card change takes).
            SELECT app_id, cohort, day, (hour AT TIME ZONE 'UTC')::date AS u, network, format, country::text AS country, currency,
                   revenue_micros, unpriced_impressions AS ui, unpriced_taps AS ut
            FROM revenue_sums
            UNION ALL
            SELECT o.app_id, o.cohort, o.day, (o.hour AT TIME ZONE 'UTC')::date, o.network, o.format, o.country::text, o.currency,
                   -o.revenue_micros, -o.unpriced_impressions, -o.unpriced_taps
            FROM install_day_revenue o JOIN cohort c ON c.moved AND o.app_id = c.app_id AND o.device = c.device
            UNION ALL
            SELECT o.app_id, c.cohort, o.day, (o.hour AT TIME ZONE 'UTC')::date, o.network, o.format, o.country::text, o.currency,
                   o.revenue_micros, o.unpriced_impressions, o.unpriced_taps
            FROM install_day_revenue o JOIN cohort c ON c.moved AND o.app_id = c.app_id AND o.device = c.device
        ), \(RatePricing.pricesCTE("cohort_prices", of: "money_changes")), installed AS (
            INSERT INTO installs AS i (app_id, device, first_seen, day, country, platform, app_version)
            SELECT app_id, device, first_at, day, country, first_platform, first_version FROM cohorts WHERE earlier
            ON CONFLICT (app_id, device) DO UPDATE SET
                first_seen = excluded.first_seen, day = excluded.day, country = excluded.country,
                platform = excluded.platform, app_version = excluded.app_version
            RETURNING 1
        ), days AS (
            INSERT INTO install_days AS d (app_id, device, day, cohort, events, requests, impressions, taps, sessions)
            SELECT * FROM day_sums
            ON CONFLICT (app_id, device, day) DO UPDATE SET
                cohort = excluded.cohort, events = d.events + excluded.events, requests = d.requests + excluded.requests,
                impressions = d.impressions + excluded.impressions, taps = d.taps + excluded.taps,
                sessions = d.sessions + excluded.sessions
            RETURNING 1
        ), moved_days AS (
            -- A moved install's other days (those this pass does not write: a row is written
            -- once per statement) follow it to its cohort.
            UPDATE install_days d SET cohort = c.cohort
            FROM cohort c
            WHERE c.moved AND d.app_id = c.app_id AND d.device = c.device
              AND NOT EXISTS (SELECT 1 FROM day_sums s WHERE s.app_id = d.app_id AND s.device = d.device AND s.day = d.day)
            RETURNING 1
        ), revenue AS (
            INSERT INTO install_day_revenue AS r (app_id, device, day, cohort, hour, network, format, country, currency, impressions, taps,
                                                  revenue_micros, priced_events, unpriced_impressions, unpriced_taps)
            SELECT * FROM revenue_sums
            ON CONFLICT (app_id, device, day, hour, network, format, country, currency) DO UPDATE SET
                cohort = excluded.cohort, impressions = r.impressions + excluded.impressions, taps = r.taps + excluded.taps,
                revenue_micros = r.revenue_micros + excluded.revenue_micros, priced_events = r.priced_events + excluded.priced_events,
                unpriced_impressions = r.unpriced_impressions + excluded.unpriced_impressions,
                unpriced_taps = r.unpriced_taps + excluded.unpriced_taps
            RETURNING 1
        ), moved_revenue AS (
            UPDATE install_day_revenue r SET cohort = c.cohort
            FROM cohort c
            WHERE c.moved AND r.app_id = c.app_id AND r.device = c.device
              AND NOT EXISTS (SELECT 1 FROM revenue_sums s WHERE s.app_id = r.app_id AND s.device = r.device AND s.day = r.day AND s.hour = r.hour
                                                             AND s.network = r.network AND s.format = r.format AND s.country = r.country
                                                             AND s.currency = r.currency)
            RETURNING 1
        ), cohort_counts AS (
            INSERT INTO cohort_days AS r (app_id, cohort, day, devices, impressions)
            SELECT app_id, cohort, day, sum(devices), sum(impressions) FROM day_changes GROUP BY 1, 2, 3
            ON CONFLICT (app_id, cohort, day) DO UPDATE SET devices = r.devices + excluded.devices, impressions = r.impressions + excluded.impressions
            RETURNING 1
        ), cohort_money AS (
            INSERT INTO cohort_priced_day AS r (app_id, cohort, day, utc_day, currency, reported, estimated, unrated)
            SELECT s.app_id, s.cohort, s.day, s.u, \(RatePricing.pricedColumns("s"))
            FROM money_changes s \(RatePricing.join("s", prices: "cohort_prices"))
            GROUP BY 1, 2, 3, 4, 5
            ON CONFLICT (app_id, cohort, day, utc_day, currency) DO UPDATE SET \(RollupCompactor.pricedUpdate)
            RETURNING 1
        )
        SELECT count(*)::bigint FROM moved
        """
    }
}
