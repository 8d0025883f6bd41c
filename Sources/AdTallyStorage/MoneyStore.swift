import AdTallyCore
import Foundation
import PostgresKit

/// Rate cards and FX rates in PostgreSQL (Migrations/0005). Reports read them at
/// query time, so every change here re-prices or re-converts history at once.
public struct MoneyStore: Sendable {
    let pool: PostgresPool

    /// Rows per statement of a bulk write.
    static let chunk = 5_000
    /// Longest gap (in days without a rate) that `fillGaps` carries a rate over: a
    /// weekend, or a long holiday such as Easter at the ECB; a longer one stays missing.
    public static let maxCarriedDays = 7

    /// A store over a pool.
    public init(pool: PostgresPool) { self.pool = pool }

    // MARK: - Rate cards

    /// Adds or replaces entries (by network, format, country and effective date), all
    /// or none; returns how many.
    @discardableResult
    public func setRates(_ entries: [RateCardEntry]) async throws -> Int {
        try RateCardEntry.checkUnique(entries)
        return try await pool.withTransaction { connection in
            var start = 0
            while start < entries.count {
                let part = entries[start..<min(start + Self.chunk, entries.count)]
                try connection.query("""
                    INSERT INTO rate_cards AS r (network, format, country, currency, cpm_micros, cpt_micros, effective_from)
                    SELECT * FROM unnest(\(array: part.map(\.network))::text[], \(array: part.map(\.format))::text[],
                                         \(array: part.map(\.country))::text[], \(array: part.map(\.currency))::text[],
                                         \(array: part.map(\.cpmMicros))::bigint[], \(array: part.map(\.cptMicros))::bigint[],
                                         \(array: part.map(\.effectiveFrom))::date[])
                    ON CONFLICT (network, format, country, effective_from) DO UPDATE SET
                        currency = excluded.currency, cpm_micros = excluded.cpm_micros, cpt_micros = excluded.cpt_micros, updated_at = now()
                    """)
                start += Self.chunk
            }
            return entries.count
        }
    }

    /// The rate card, by network, format, country and date; only `network` when given.
    public func rates(network: String? = nil) async throws -> [RateCardEntry] {
        try await pool.query("""
            SELECT network, format, country, currency, cpm_micros, cpt_micros, effective_from::text FROM rate_cards
            WHERE \(network)::text IS NULL OR network = \(network)::text
            ORDER BY network, format, country = '*' DESC, country, effective_from
            """).map { row in
            RateCardEntry(
                network: try row.decode(0), format: try row.decode(1), country: try row.decode(2), currency: try row.decode(3),
                cpmMicros: try row.decode(4), cptMicros: try row.decode(5), effectiveFrom: try row.decode(6)
            )
        }
    }

    /// Deletes one entry; false when there was none. From its date on, the key's
    /// earlier entry (or the any-country one) prices again.
    public func deleteRate(network: String, format: String, country: String, effectiveFrom: String) async throws -> Bool {
        guard let day = ReportQuery.parseDate(effectiveFrom) else { throw MoneyTableError("effective_from", "must be a date, YYYY-MM-DD") }
        let rows = try await pool.query("""
            DELETE FROM rate_cards WHERE network = \(network)::text AND format = \(format)::text AND country = \(country)::text
              AND effective_from = \(ReportQuery.formatDate(day))::date RETURNING 1
            """)
        return !rows.isEmpty
    }

    // MARK: - FX

    /// What an FX import did.
    public struct FXImport: Sendable, Equatable, Codable {
        /// Rates stored as given (new or replacing one).
        public var stored: Int
        /// Days filled by carrying the last earlier rate over a gap.
        public var carried: Int
    }

    /// Stores rates (each base also at 1 for its days, so conversions through it work);
    /// with `fillGaps`, days between two rates of a currency that have none (up to
    /// `maxCarriedDays` in a row) get the earlier day's, marked as carried. A rate given
    /// for a day replaces a carried one.
    public func importFX(_ rates: [FXRate], fillGaps: Bool = false) async throws -> FXImport {
        try FXRate.checkUnique(rates)
        // The same rate twice (a file imported with an overlap) is one row.
        var seen = Set<String>()
        let rates = rates.filter { seen.insert("\($0.date) \($0.base) \($0.currency)").inserted }
        return try await pool.withTransaction { connection in
            var start = 0
            while start < rates.count {
                let part = rates[start..<min(start + Self.chunk, rates.count)]
                try connection.query("""
                    INSERT INTO fx_rates AS r (day, base, currency, rate)
                    SELECT day, base, currency, rate FROM unnest(\(array: part.map(\.date))::date[], \(array: part.map(\.base))::text[],
                                                                 \(array: part.map(\.currency))::text[], \(array: part.map(\.rate))::numeric[]) AS u (day, base, currency, rate)
                    UNION
                    SELECT DISTINCT day, base, base, 1::numeric FROM unnest(\(array: part.map(\.date))::date[], \(array: part.map(\.base))::text[]) AS b (day, base)
                    ON CONFLICT (day, currency, base) DO UPDATE SET rate = excluded.rate, carried_from = NULL, updated_at = now()
                    """)
                start += Self.chunk
            }
            var carried = 0
            if fillGaps, !rates.isEmpty {
                let bases = Array(Set(rates.map(\.base)))
                carried = try connection.query("""
                    WITH published AS (
                        SELECT day, base, currency, rate, lead(day) OVER (PARTITION BY base, currency ORDER BY day) AS next
                        FROM fx_rates WHERE carried_from IS NULL AND base = ANY(\(array: bases)::text[])
                    )
                    INSERT INTO fx_rates AS r (day, base, currency, rate, carried_from)
                    SELECT g::date, p.base, p.currency, p.rate, p.day
                    FROM published p, generate_series(p.day + 1, p.next - 1, interval '1 day') AS g
                    WHERE p.next - p.day BETWEEN 2 AND \(Self.maxCarriedDays + 1)
                    ON CONFLICT (day, currency, base) DO UPDATE SET rate = excluded.rate, carried_from = excluded.carried_from, updated_at = now()
                    WHERE r.carried_from IS NOT NULL
                    RETURNING 1
                    """).count
            }
            return FXImport(stored: rates.count, carried: carried)
        }
    }

    /// FX rates (not the bases' own 1s), by date and currency, within the filters.
    public func fxRates(currency: String? = nil, base: String? = nil, from: String? = nil, to: String? = nil) async throws -> [FXRate] {
        try await pool.query("""
            SELECT day::text, base, currency, rate::text, carried_from::text FROM fx_rates
            WHERE currency <> base AND (\(currency)::text IS NULL OR currency = \(currency)::text)
              AND (\(base)::text IS NULL OR base = \(base)::text)
              AND (\(from)::date IS NULL OR day >= \(from)::date) AND (\(to)::date IS NULL OR day <= \(to)::date)
            ORDER BY day, base, currency
            """).map { row in
            FXRate(date: try row.decode(0), base: try row.decode(1), currency: try row.decode(2), rate: try row.decode(3), carriedFrom: try row.decode(4))
        }
    }

    /// Deletes one day's rate of a currency; false when there was none.
    public func deleteFX(date: String, currency: String, base: String) async throws -> Bool {
        guard let day = ReportQuery.parseDate(date) else { throw MoneyTableError("date", "must be a date, YYYY-MM-DD") }
        return try await pool.query("""
            DELETE FROM fx_rates WHERE day = \(ReportQuery.formatDate(day))::date AND currency = \(currency)::text AND base = \(base)::text
              AND currency <> base RETURNING 1
            """).count > 0
    }
}
