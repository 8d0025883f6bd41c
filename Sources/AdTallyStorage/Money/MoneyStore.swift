import AdTallyCore
import Foundation
import PostgresKit

/// Rate cards and FX rates in PostgreSQL (Migrations/0005). Reports convert at query
/// time; a card change marks the priced rollups it changes dirty in its own
/// transaction (Migrations/0012), so it too re-prices history from the next report on.
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
            // Under the compaction lock: no pass prices with the card half changed, and the
            // priced rollups these entries re-price are marked dirty with them (Migrations/0012).
            try RatePricing.lockCompaction(on: connection)
            try RatePricing.markDirty(entries.map { ($0.network, $0.format, $0.effectiveFrom) }, on: connection)
            var start = 0
            while start < entries.count {
                let part = entries[start..<min(start + Self.chunk, entries.count)]
                try connection.query("""
                    INSERT INTO rate_cards AS r (network, format, country, currency, cpm_micros, cpt_micros, effective_from, marks_priced)
                    SELECT *, true FROM unnest(\(array: part.map(\.network))::text[], \(array: part.map(\.format))::text[],
                                         \(array: part.map(\.country))::text[], \(array: part.map(\.currency))::text[],
                                         \(array: part.map(\.cpmMicros))::bigint[], \(array: part.map(\.cptMicros))::bigint[],
                                         \(array: part.map(\.effectiveFrom))::date[])
                    -- excluded.updated_at is the column's default, now(): Citus refuses a
                    -- function that is not IMMUTABLE in DO UPDATE SET.
                    ON CONFLICT (network, format, country, effective_from) DO UPDATE SET
                        currency = excluded.currency, cpm_micros = excluded.cpm_micros, cpt_micros = excluded.cpt_micros, updated_at = excluded.updated_at
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
        return try await pool.withTransaction { connection in
            try RatePricing.lockCompaction(on: connection)
            let rows = try connection.query("""
                DELETE FROM rate_cards WHERE network = \(network)::text AND format = \(format)::text AND country = \(country)::text
                  AND effective_from = \(ReportQuery.formatDate(day))::date RETURNING 1
                """)
            if !rows.isEmpty { try RatePricing.markDirty([(network, format, ReportQuery.formatDate(day))], on: connection) }
            return !rows.isEmpty
        }
    }

    // MARK: - FX

    /// What an FX import did.
    public struct FXImport: Sendable, Equatable, Codable {
        /// Rates stored as given (new or replacing one).
        public var stored: Int
        /// Days filled by carrying the last earlier rate over a gap.
        public var carried: Int
        /// The first and last day of the rates given (nil for none).
        public var firstDay: String?
        public var lastDay: String?

        /// What an import did.
        public init(stored: Int, carried: Int, firstDay: String? = nil, lastDay: String? = nil) {
            self.stored = stored
            self.carried = carried
            self.firstDay = firstDay
            self.lastDay = lastDay
        }

        enum CodingKeys: String, CodingKey {
            case stored, carried
            case firstDay = "first_day"
            case lastDay = "last_day"
        }
    }

    /// Stores rates (each base also at 1 for its days, so conversions through it work);
    /// with `fillGaps`, days between two rates of a currency that have none (up to
    /// `maxCarriedDays` in a row) get the earlier day's, marked as carried. A rate given
    /// for a day replaces a carried one.
    public func importFX(_ rates: [FXRate], fillGaps: Bool = false) async throws -> FXImport {
        try await pool.withTransaction { connection in
            try Self.createStaging(connection)
            var start = 0
            while start < rates.count {
                let part = rates[start..<min(start + Self.chunk, rates.count)]
                try Self.stage(part.enumerated().map { (line: start + $0.offset + 1, rate: $0.element) }, on: connection)
                start += Self.chunk
            }
            return try Self.merge(fillGaps: fillGaps, isFile: false, on: connection)
        }
    }

    /// Imports an FX CSV (`FXCSVReader`'s shapes) as it is read: parsed a slice at a time
    /// on a pool thread and copied into a staging table in batches, then merged in one
    /// statement, so memory holds the file's bytes and one batch, never every rate
    /// parsed (years of ECB rates are a few MB of text and millions of rates). Also
    /// returns the columns of retired currencies left out.
    public func importFX(csv bytes: [UInt8], base: String, fillGaps: Bool = false) async throws -> (FXImport, skipped: Set<String>) {
        let fresh = try FXCSVReader(base: base)
        return try await pool.withTransaction { connection in
            var reader = fresh
            try Self.createStaging(connection)
            var pending: [(line: Int, rate: FXRate)] = []
            var start = 0
            while start < bytes.count {
                pending += try reader.feed(bytes[start..<min(start + (1 << 16), bytes.count)])
                if pending.count >= Self.chunk {
                    try Self.stage(pending, on: connection)
                    pending.removeAll(keepingCapacity: true)
                }
                start += 1 << 16
            }
            pending += try reader.finish()
            try Self.stage(pending, on: connection)
            return (try Self.merge(fillGaps: fillGaps, isFile: true, on: connection), reader.skipped)
        }
    }

    /// A staging table for one import's rates, dropped with its transaction.
    static func createStaging(_ connection: PostgresConnection) throws {
        try connection.execute(unsafeSQL: """
            CREATE TEMPORARY TABLE fx_staging (line bigint, day text, base text, currency text, rate text) ON COMMIT DROP
            """)
    }

    /// Copies rates into the staging table.
    static func stage(_ rates: [(line: Int, rate: FXRate)], on connection: PostgresConnection) throws {
        guard !rates.isEmpty else { return }
        var buffer = PostgresCopyBuffer(columns: 5, capacity: rates.count * 48)
        for (line, rate) in rates {
            buffer.append(Int64(line))
            try buffer.append(rate.date)
            try buffer.append(rate.base)
            try buffer.append(rate.currency)
            try buffer.append(rate.rate)
            buffer.endRow()
        }
        try connection.copyIn(unsafeSQL: "COPY fx_staging (line, day, base, currency, rate) FROM STDIN (FORMAT binary)", data: buffer)
    }

    /// Moves the staged rates into `fx_rates`: refused whole when a day, base and currency
    /// has two different rates (named by their file lines, or `rates[]` indexes); the same rate twice (a file imported with an overlap) is one row.
    static func merge(fillGaps: Bool, isFile: Bool, on connection: PostgresConnection) throws -> FXImport {
        if let twice = try connection.query("""
            SELECT day, base, currency, min(line), max(line), min(rate::numeric)::text, max(rate::numeric)::text FROM fx_staging
            GROUP BY day, base, currency HAVING count(DISTINCT rate::numeric) > 1 ORDER BY min(line) LIMIT 1
            """).first {
            let (day, base, currency): (String, String, String) = (try twice.decode(0), try twice.decode(1), try twice.decode(2))
            throw MoneyTableError(
                "rates", "\(currency) per \(base) on \(day) is given twice (\(try twice.decode(5, as: String.self)) and \(try twice.decode(6, as: String.self)); "
                    + "\(isFile ? "lines" : "rates[]") \(try twice.decode(3, as: Int.self) - (isFile ? 0 : 1)) and \(try twice.decode(4, as: Int.self) - (isFile ? 0 : 1)))"
            )
        }
        let stored = try connection.query("""
            INSERT INTO fx_rates AS r (day, base, currency, rate)
            SELECT DISTINCT day::date, base, currency, rate::numeric FROM fx_staging
            UNION
            SELECT DISTINCT day::date, base, base, 1::numeric FROM fx_staging
            ON CONFLICT (day, currency, base) DO UPDATE SET rate = excluded.rate, carried_from = NULL, updated_at = excluded.updated_at
            RETURNING r.currency <> r.base
            """).filter { (try? $0.decode(0, as: Bool.self)) == true }.count
        var carried = 0
        if fillGaps {
            // Only around the imported days, and only rows that change: a carried day is
            // counted once, when it is made or its rate moves, not on every later import.
            // The bases' own 1s are carried too (conversions go through them), not counted.
            carried = try connection.query("""
                WITH span AS (
                    SELECT base, min(day::date) - \(Self.maxCarriedDays + 1)::int AS first, max(day::date) + \(Self.maxCarriedDays + 1)::int AS last
                    FROM fx_staging GROUP BY base
                ), published AS (
                    SELECT f.day, f.base, f.currency, f.rate, lead(f.day) OVER (PARTITION BY f.base, f.currency ORDER BY f.day) AS next
                    FROM fx_rates f JOIN span s ON s.base = f.base AND f.day BETWEEN s.first AND s.last
                    WHERE f.carried_from IS NULL
                )
                INSERT INTO fx_rates AS r (day, base, currency, rate, carried_from)
                SELECT g::date, p.base, p.currency, p.rate, p.day
                FROM published p, generate_series(p.day + 1, p.next - 1, interval '1 day') AS g
                WHERE p.next - p.day BETWEEN 2 AND \(Self.maxCarriedDays + 1)
                ON CONFLICT (day, currency, base) DO UPDATE SET rate = excluded.rate, carried_from = excluded.carried_from, updated_at = excluded.updated_at
                WHERE r.carried_from IS NOT NULL AND (r.rate, r.carried_from) IS DISTINCT FROM (excluded.rate, excluded.carried_from)
                RETURNING r.currency <> r.base
                """).filter { (try? $0.decode(0, as: Bool.self)) == true }.count
        }
        let span = try connection.query("SELECT min(day::date)::text, max(day::date)::text FROM fx_staging").first
        let (firstDay, lastDay): (String?, String?) = (try span?.decode(0), try span?.decode(1))
        if let firstDay, let lastDay {
            // Under the compaction lock, as a card change: the compactor marks the same rows,
            // and two writers marking many apps' rows in different orders could deadlock.
            try RatePricing.lockCompaction(on: connection)
            // Carried rates reach up to maxCarriedDays past the last day given.
            try RatePricing.markSeriesChanged(from: firstDay, to: ReportQuery.formatDate((ReportQuery.parseDate(lastDay) ?? 0) + Self.maxCarriedDays), on: connection)
        }
        return FXImport(stored: stored, carried: carried, firstDay: firstDay, lastDay: lastDay)
    }

    /// One page of FX rates (not the bases' own 1s), in the order of their key (day,
    /// currency, base), after `after` (the key of the previous page's last rate).
    public func fxRates(
        currency: String?, base: String?, from: String, to: String, limit: Int, after: (day: String, currency: String, base: String)?
    ) async throws -> (rates: [FXRate], next: FXRate?) {
        let rows = try await pool.query("""
            SELECT day::text, base, currency, rate::text, carried_from::text FROM fx_rates
            WHERE currency <> base AND (\(currency)::text IS NULL OR currency = \(currency)::text)
              AND (\(base)::text IS NULL OR base = \(base)::text)
              AND day BETWEEN \(from)::date AND \(to)::date
              AND (\(after?.day)::date IS NULL OR (day, currency, base) > (\(after?.day)::date, \(after?.currency)::text, \(after?.base)::text))
            ORDER BY day, currency, base
            LIMIT \(limit + 1)
            """)
        var rates = try rows.map { row in
            FXRate(date: try row.decode(0), base: try row.decode(1), currency: try row.decode(2), rate: try row.decode(3), carriedFrom: try row.decode(4))
        }
        guard rates.count > limit else { return (rates, nil) }
        rates.removeLast()
        return (rates, rates.last)
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
        return try await pool.withTransaction { connection in
            let deleted = try connection.query("""
                DELETE FROM fx_rates WHERE day = \(ReportQuery.formatDate(day))::date AND currency = \(currency)::text AND base = \(base)::text
                  AND currency <> base RETURNING 1
                """).count > 0
            if deleted {
                try RatePricing.lockCompaction(on: connection)
                try RatePricing.markSeriesChanged(from: ReportQuery.formatDate(day), to: ReportQuery.formatDate(day), on: connection)
            }
            return deleted
        }
    }
}
