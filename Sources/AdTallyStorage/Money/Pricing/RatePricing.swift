import AdTallyCore
import PostgresKit

/// Prices rollup rows by the rate card (DESIGN §3, Migrations/0012): the one place the
/// SQL that finds a row's price is written. The compactor prices each delta with it as
/// it folds it, the re-pricer rewrites dirty ranges with it, and a report prices the
/// rows nobody has priced yet (pending deltas, cut hours, dirty ranges, raw events) with it.
///
/// A price is the entry in force on the row's UTC date for its network, format and
/// country (the latest `effective_from` on or before that date), else the any-country
/// entry in force; none: the row's impressions and taps are unrated. Each distinct
/// (date, network, format, country) is priced once, from rate_cards itself: no
/// expansion of the card per day, nothing to keep in step with it.
enum RatePricing {
    /// A CTE named `name`: the price of every distinct (u, network, format, country) of
    /// the unpriced rows (`currency = ''`) of `rows`, a relation with those columns. The
    /// keys are joined to their (network, format)'s entries by hash, and each keeps the
    /// first entry in the order: the country's own before any country's, the latest
    /// effective date first. No per-key lookup: thousands of keys (a dirty month) cost
    /// milliseconds.
    static func pricesCTE(_ name: String, of rows: String) -> String {
        func first(_ column: String) -> String {
            "(array_agg(c.\(column) ORDER BY c.country = '*', c.effective_from DESC) FILTER (WHERE c.currency IS NOT NULL))[1] AS \(column)"
        }
        return """
            \(name) AS MATERIALIZED (
                SELECT k.u, k.network, k.format, k.country, \(first("currency")), \(first("cpm_micros")), \(first("cpt_micros"))
                FROM (SELECT DISTINCT u, network, format, country FROM \(rows) WHERE currency = '') AS k
                LEFT JOIN rate_cards c ON c.network = k.network AND c.format = k.format AND c.country IN (k.country, '*') AND c.effective_from <= k.u
                GROUP BY k.u, k.network, k.format, k.country
            )
            """
    }

    /// Joins a row `s` (u, network, format, country, currency) to its price `rt` in the
    /// CTE `prices` (only rows without reported revenue have one).
    static func join(_ s: String, prices: String) -> String {
        "LEFT JOIN \(prices) AS rt ON \(s).currency = '' AND rt.u = \(s).u AND rt.network = \(s).network AND rt.format = \(s).format AND rt.country = \(s).country"
    }

    /// The currency of a priced row's money: the reported one, else the price's (NULL:
    /// unrated, or no money at all).
    static func currency(_ s: String) -> String { "CASE WHEN \(s).currency = '' THEN rt.currency ELSE \(s).currency END" }
    /// Reported revenue (micros of `currency`), exact.
    static func reported(_ s: String, _ micros: String) -> String { "CASE WHEN \(s).currency <> '' THEN \(micros) END" }
    /// Estimated revenue (micros of `currency`, with the thousandths a CPM leaves), exact.
    static func estimated(_ impressions: String, _ taps: String) -> String {
        "(\(impressions)::numeric * rt.cpm_micros * 0.001 + \(taps)::numeric * rt.cpt_micros)"
    }
    /// Impressions and taps no entry prices.
    static func unrated(_ s: String, _ impressions: String, _ taps: String) -> String {
        "CASE WHEN \(s).currency = '' AND rt.currency IS NULL THEN \(impressions) + \(taps) END"
    }

    // MARK: - Card changes

    /// Marks every app's priced rows of these (network, format) keys dirty from the given
    /// UTC date on: called in the transaction that changes the card, after it took the
    /// compaction lock (`lockCompaction`), so that no pass prices with the card half changed.
    static func markDirty(_ changes: [(network: String, format: String, from: String)], on connection: PostgresConnection) throws {
        var earliest: [String: (network: String, format: String, from: String)] = [:]
        for change in changes {
            let key = change.network + " " + change.format
            if let known = earliest[key], known.from <= change.from { continue }
            earliest[key] = change
        }
        let keys = Array(earliest.values)
        guard let first = keys.map(\.from).min() else { return }
        try markSeriesChanged(from: first, to: "infinity", on: connection)
        try connection.query("""
            INSERT INTO rollup_dirty (app_id, network, format, from_day, to_day)
            SELECT a.app_id, k.network, k.format, k.from_day, 'infinity'::date
            FROM apps a, unnest(\(array: keys.map(\.network))::text[], \(array: keys.map(\.format))::text[], \(array: keys.map(\.from))::date[])
                 AS k (network, format, from_day)
            ON CONFLICT DO NOTHING
            """)
    }

    /// Marks every app's report series changed over the UTC days `from`...`to` (a day
    /// either side: an app's local days straddle them), so the next refresh writes them again.
    static func markSeriesChanged(from: String, to: String, on connection: PostgresConnection) throws {
        try connection.query("""
            INSERT INTO report_series_changes AS c (app_id, from_day, to_day)
            SELECT app_id, \(from)::date - 1, least(\(to)::date, DATE '9999-12-30') + 1 FROM apps ORDER BY app_id
            ON CONFLICT (app_id) DO UPDATE SET
                from_day = least(c.from_day, excluded.from_day), to_day = greatest(c.to_day, excluded.to_day), version = c.version + 1
            """)
    }

    /// Waits for the compaction lock (`RollupCompactor.lockKey`) for the rest of the transaction.
    static func lockCompaction(on connection: PostgresConnection) throws {
        try connection.query("SELECT pg_advisory_xact_lock(\(RollupCompactor.lockKey))")
    }

    // MARK: - Re-pricing

    /// UTC days one re-pricing transaction covers for one app.
    static let chunkDays = 31

    /// Rewrites the priced rows of one dirty window of one app (up to `chunkDays` UTC
    /// days of its dirty ranges) from the revenue and unpriced rollups, and shrinks its
    /// dirty ranges by that window, under the compaction lock. Returns false when no
    /// range was dirty, nil when another process holds the lock.
    /// A chunk of one app that failed (a timeout on a huge app-month, say): the re-pricer
    /// passes over the app for a while, so the others are not held up behind it.
    struct ChunkFailed: Error, CustomStringConvertible {
        var app: String
        var error: any Error
        var description: String { "re-pricing \(app) failed: \(error)" }
    }

    static func repriceChunk(skipping skipped: [String] = [], on connection: PostgresConnection) throws -> Bool? {
        var current: String?
        do {
            return try repriceChunk(skipping: skipped, current: &current, on: connection)
        } catch {
            guard let app = current else { throw error }
            throw ChunkFailed(app: app, error: error)
        }
    }

    private static func repriceChunk(skipping skipped: [String], current: inout String?, on connection: PostgresConnection) throws -> Bool? {
        try connection.withTransaction { connection -> Bool? in
            // Hash joins only: the planner expects a handful of rows from the joins with the
            // dirty days (four equalities, one on an expression) and, on that estimate, chose
            // nested loops that rescanned thousands of rows per row (12 s for one app-month).
            // No JIT: the cost a disabled nested loop adds made PostgreSQL compile every
            // statement (0.8 s each, on a handful of rows).
            let locked = try connection.query("""
                SELECT pg_try_advisory_xact_lock(\(RollupCompactor.lockKey)), set_config('enable_nestloop', 'off', true), set_config('jit', 'off', true)
                """)
            guard try locked.first?.decode(0, as: Bool.self) == true else { return nil }
            // The app whose dirty range starts first, then the UTC days it has rows on (two
            // statements: on Citus each is one shard's, together they were a join it refuses).
            guard let next = try connection.query("""
                SELECT app_id, min(from_day)::text FROM rollup_dirty WHERE app_id <> ALL(\(array: skipped)::text[])
                GROUP BY app_id ORDER BY min(from_day), app_id LIMIT 1
                """).first else { return false }
            let app = try next.decode(0, as: String.self)
            current = app
            let row = try connection.query("""
                SELECT greatest(\(try next.decode(1, as: String.self))::date, span.first)::text, span.last::text, span.first IS NULL OR \(try next.decode(1, as: String.self))::date > span.last
                FROM (SELECT (SELECT (hour AT TIME ZONE 'UTC')::date FROM rollup_1h_compacted WHERE app_id = \(app) ORDER BY hour LIMIT 1) AS first,
                             (SELECT (hour AT TIME ZONE 'UTC')::date FROM rollup_1h_compacted WHERE app_id = \(app) ORDER BY hour DESC LIMIT 1) AS last) AS span
                """)[0]
            if try row.decode(2, as: Bool.self) {
                // Nothing stored from there on: what arrives later is priced as it is compacted.
                try connection.query("DELETE FROM rollup_dirty WHERE app_id = \(app)")
                return true
            }
            let first = try row.decode(0, as: String.self)
            let last = try row.decode(1, as: String.self)
            let w0: PostgresQuery = "\(first)::date"
            let w1: PostgresQuery = "least(\(first)::date + \(Int32(chunkDays - 1))::int, \(last)::date)"
            // The (network, format, UTC day)s of the window that are dirty.
            let targets: PostgresQuery = """
                targets AS MATERIALIZED (
                    SELECT DISTINCT d.network, d.format, u::date AS u
                    FROM rollup_dirty d, generate_series(greatest(d.from_day, \(w0))::timestamp, least(d.to_day, \(w1))::timestamp, interval '1 day') AS u
                    WHERE d.app_id = \(app) AND d.from_day <= \(w1) AND d.to_day >= \(w0)
                )
                """
            let hours: PostgresQuery = "r.hour >= \(w0)::timestamp AT TIME ZONE 'UTC' AND r.hour < (\(w1) + 1)::timestamp AT TIME ZONE 'UTC'"
            let days: PostgresQuery = "r.day BETWEEN \(w0) - 1 AND \(w1) + 1"
            try connection.query("""
                WITH \(targets)
                DELETE FROM rollup_priced_1h r USING targets t
                WHERE r.app_id = \(app) AND \(hours) AND r.network = t.network AND r.format = t.format AND (r.hour AT TIME ZONE 'UTC')::date = t.u
                """)
            try connection.query("""
                WITH \(targets)
                DELETE FROM rollup_priced_day r USING targets t
                WHERE r.app_id = \(app) AND \(days) AND r.network = t.network AND r.format = t.format AND r.utc_day = t.u
                """)
            try connection.query("""
                WITH \(targets), source AS MATERIALIZED (
                    SELECT r.hour, (r.hour AT TIME ZONE 'UTC')::date AS u, r.network, r.format, NULL::text AS country, r.currency,
                           r.revenue_micros, 0::bigint AS ui, 0::bigint AS ut
                    FROM rollup_revenue_1h_compacted r JOIN targets t ON t.network = r.network AND t.format = r.format AND t.u = (r.hour AT TIME ZONE 'UTC')::date
                    WHERE r.app_id = \(app) AND \(hours) AND r.currency <> ''
                    UNION ALL
                    SELECT r.hour, (r.hour AT TIME ZONE 'UTC')::date, r.network, r.format, r.country, '', 0, r.impressions, r.taps
                    FROM rollup_unpriced_1h_compacted r JOIN targets t ON t.network = r.network AND t.format = r.format AND t.u = (r.hour AT TIME ZONE 'UTC')::date
                    WHERE r.app_id = \(app) AND \(hours)
                ), \(unsafeRaw: pricesCTE("prices", of: "source"))
                INSERT INTO rollup_priced_1h (app_id, hour, network, format, currency, reported, estimated, unrated)
                SELECT \(app), s.hour, s.network, s.format, \(unsafeRaw: pricedColumns("s"))
                FROM source s \(unsafeRaw: join("s", prices: "prices"))
                GROUP BY 2, 3, 4, 5
                """)
            try connection.query("""
                WITH \(targets), source AS MATERIALIZED (
                    SELECT r.day, r.utc_day AS u, r.network, r.format, NULL::text AS country, r.currency, r.revenue_micros, 0::bigint AS ui, 0::bigint AS ut
                    FROM rollup_revenue_day_compacted r JOIN targets t ON t.network = r.network AND t.format = r.format AND t.u = r.utc_day
                    WHERE r.app_id = \(app) AND \(days) AND r.currency <> ''
                    UNION ALL
                    SELECT r.day, r.utc_day, r.network, r.format, r.country, '', 0, r.impressions, r.taps
                    FROM rollup_unpriced_day_compacted r JOIN targets t ON t.network = r.network AND t.format = r.format AND t.u = r.utc_day
                    WHERE r.app_id = \(app) AND \(days)
                ), \(unsafeRaw: pricesCTE("prices", of: "source"))
                INSERT INTO rollup_priced_day (app_id, day, utc_day, network, format, currency, reported, estimated, unrated)
                SELECT \(app), s.day, s.u, s.network, s.format, \(unsafeRaw: pricedColumns("s"))
                FROM source s \(unsafeRaw: join("s", prices: "prices"))
                GROUP BY 2, 3, 4, 5, 6
                """)
            // The cohort grain's money (Migrations/0024), kept per UTC date over every network
            // and format: each UTC date with a dirty key is priced again whole, from the device
            // rows; but only from the app's first day with device rows kept (apps.device_rows_from,
            // which RetentionPruner sets before it deletes older ones): their grain keeps the
            // card it was priced at.
            let kept = try connection.query("SELECT coalesce(device_rows_from, '-infinity')::text FROM apps WHERE app_id = \(app)").first?.decode(0, as: String.self) ?? "-infinity"
            try connection.query("""
                WITH \(targets)
                DELETE FROM cohort_priced_day r
                WHERE r.app_id = \(app) AND \(days) AND r.utc_day IN (SELECT u FROM targets) AND r.day >= \(kept)::date
                """)
            try connection.query("""
                WITH \(targets), source AS MATERIALIZED (
                    SELECT r.cohort, r.day, (r.hour AT TIME ZONE 'UTC')::date AS u, r.network, r.format, r.country::text AS country, r.currency,
                           r.revenue_micros, r.unpriced_impressions AS ui, r.unpriced_taps AS ut
                    FROM install_day_revenue r
                    WHERE r.app_id = \(app) AND \(days) AND \(hours) AND (r.hour AT TIME ZONE 'UTC')::date IN (SELECT u FROM targets)
                      AND r.day >= \(kept)::date
                ), \(unsafeRaw: pricesCTE("prices", of: "source"))
                INSERT INTO cohort_priced_day (app_id, cohort, day, utc_day, currency, reported, estimated, unrated)
                SELECT \(app), s.cohort, s.day, s.u, \(unsafeRaw: pricedColumns("s"))
                FROM source s \(unsafeRaw: join("s", prices: "prices"))
                GROUP BY 2, 3, 4, 5
                """)
            // The window is priced; past the app's last stored day nothing is left to price.
            try connection.query("""
                DELETE FROM rollup_dirty WHERE app_id = \(app) AND from_day <= \(w1) AND (to_day <= \(w1) OR \(w1) >= \(last)::date)
                """)
            try connection.query("UPDATE rollup_dirty SET from_day = \(w1) + 1 WHERE app_id = \(app) AND from_day <= \(w1)")
            return true
        }
    }

    /// The money columns of a priced row, summed over a group of `s` rows joined to `rt`:
    /// currency ('' when unrated), reported, estimated, unrated.
    static func pricedColumns(_ s: String) -> String {
        """
        coalesce(\(currency(s)), '') AS currency, coalesce(sum(\(reported(s, "\(s).revenue_micros"))), 0),
        coalesce(sum(\(estimated("\(s).ui", "\(s).ut"))), 0), coalesce(sum(\(unrated(s, "\(s).ui", "\(s).ut"))), 0)
        """
    }
}
