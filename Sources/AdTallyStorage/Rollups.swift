import AdTallyCore
import PostgresKit

/// Sums new events into rollup rows in memory, then upserts them in one statement per table.
struct RollupAccumulator {
    struct CountKey: Hashable, Comparable {
        var app: String
        var bucket: Int64
        var network: String
        var format: String

        // Field by field, not as tuples: tuple comparison instantiates metadata at run time.
        static func < (lhs: CountKey, rhs: CountKey) -> Bool {
            if lhs.app != rhs.app { return lhs.app < rhs.app }
            if lhs.bucket != rhs.bucket { return lhs.bucket < rhs.bucket }
            if lhs.network != rhs.network { return lhs.network < rhs.network }
            return lhs.format < rhs.format
        }
    }

    struct RevenueKey: Hashable, Comparable {
        var app: String
        var bucket: Int64
        var network: String
        var format: String
        var country: String
        var currency: String

        static func < (lhs: RevenueKey, rhs: RevenueKey) -> Bool {
            if lhs.app != rhs.app { return lhs.app < rhs.app }
            if lhs.bucket != rhs.bucket { return lhs.bucket < rhs.bucket }
            if lhs.network != rhs.network { return lhs.network < rhs.network }
            if lhs.format != rhs.format { return lhs.format < rhs.format }
            if lhs.country != rhs.country { return lhs.country < rhs.country }
            return lhs.currency < rhs.currency
        }
    }

    struct Counts {
        var requests: Int64 = 0, loads: Int64 = 0, impressions: Int64 = 0, errors: Int64 = 0
        var taps: Int64 = 0, actionCancels: Int64 = 0, expiries: Int64 = 0, wastedFills: Int64 = 0
    }

    struct Money {
        var revenueMicros: Int64 = 0, pricedEvents: Int64 = 0, unpricedImpressions: Int64 = 0, unpricedTaps: Int64 = 0
    }

    var counts: [CountKey: Counts] = [:]
    var revenue: [RevenueKey: Money] = [:]

    /// rollup_15m's count columns, in the order of `Counts`' key paths in `write`.
    static let countColumns = ["requests", "loads", "impressions", "errors", "taps", "action_cancels", "expiries", "wasted_fills"]

    mutating func add(_ item: AppEvent) {
        let event = item.event
        let bucket = event.bucketStartSeconds
        let key = CountKey(app: item.appID, bucket: bucket, network: event.network, format: event.format.rawValue)
        switch event.type {
        case .request: counts[key, default: Counts()].requests += 1
        case .load: counts[key, default: Counts()].loads += 1
        case .impression: counts[key, default: Counts()].impressions += 1
        case .error: counts[key, default: Counts()].errors += 1
        case .tap: counts[key, default: Counts()].taps += 1
        case .actionCancel: counts[key, default: Counts()].actionCancels += 1
        case .expiry:
            counts[key, default: Counts()].expiries += 1
            if event.shown == false { counts[key, default: Counts()].wastedFills += 1 }
        }

        guard event.type == .impression || event.type == .tap else { return }
        let revenueKey = RevenueKey(
            app: item.appID, bucket: bucket, network: event.network, format: event.format.rawValue,
            country: event.country, currency: event.currency ?? ""
        )
        if let micros = event.revenueMicros {
            revenue[revenueKey, default: Money()].revenueMicros += micros
            revenue[revenueKey, default: Money()].pricedEvents += 1
        } else if event.type == .impression {
            revenue[revenueKey, default: Money()].unpricedImpressions += 1
        } else {
            revenue[revenueKey, default: Money()].unpricedTaps += 1
        }
    }

    /// Upserts both rollups in one statement (one round trip): the counts as a
    /// data-modifying CTE in front of the revenue insert.
    func write(on connection: PostgresConnection) throws {
        switch (countsUpsert(), revenueUpsert()) {
        case (let counts?, let revenue?): try connection.query("WITH counts AS (\(counts)) \(revenue)")
        case (let counts?, nil): try connection.query(counts)
        case (nil, let revenue?): try connection.query(revenue)
        case (nil, nil): break
        }
    }

    func countsUpsert() -> PostgresQuery? {
        guard !counts.isEmpty else { return nil }
        let rows = counts.sorted { $0.key < $1.key }
        var query: PostgresQuery = """
            INSERT INTO rollup_15m AS r (app_id, bucket, network, format, \(unsafeRaw: Self.countColumns.joined(separator: ", ")))
            SELECT * FROM unnest(\(array: rows.map(\.key.app))::text[], \(array: rows.map { PostgresMicros($0.key.bucket * 1_000_000) })::timestamptz[],
                \(array: rows.map(\.key.network))::text[], \(array: rows.map(\.key.format))::text[]
            """
        let columns: [KeyPath<Counts, Int64>] = [
            \.requests, \.loads, \.impressions, \.errors, \.taps, \.actionCancels, \.expiries, \.wastedFills,
        ]
        for column in columns {
            query.append(", \(array: rows.map { $0.value[keyPath: column] })::bigint[]")
        }
        query.append("""
            ) ON CONFLICT (app_id, bucket, network, format) DO UPDATE SET
            \(unsafeRaw: Self.countColumns.map { "\($0) = r.\($0) + excluded.\($0)" }.joined(separator: ", "))
            """)
        return query
    }

    func revenueUpsert() -> PostgresQuery? {
        guard !revenue.isEmpty else { return nil }
        let rows = revenue.sorted { $0.key < $1.key }
        return """
            INSERT INTO rollup_revenue_15m AS r
                (app_id, bucket, network, format, country, currency, revenue_micros, priced_events, unpriced_impressions, unpriced_taps)
            SELECT * FROM unnest(\(array: rows.map(\.key.app))::text[], \(array: rows.map { PostgresMicros($0.key.bucket * 1_000_000) })::timestamptz[],
                \(array: rows.map(\.key.network))::text[], \(array: rows.map(\.key.format))::text[],
                \(array: rows.map(\.key.country))::text[], \(array: rows.map(\.key.currency))::text[],
                \(array: rows.map(\.value.revenueMicros))::bigint[], \(array: rows.map(\.value.pricedEvents))::bigint[],
                \(array: rows.map(\.value.unpricedImpressions))::bigint[], \(array: rows.map(\.value.unpricedTaps))::bigint[])
            ON CONFLICT (app_id, bucket, network, format, country, currency) DO UPDATE SET
                revenue_micros = r.revenue_micros + excluded.revenue_micros,
                priced_events = r.priced_events + excluded.priced_events,
                unpriced_impressions = r.unpriced_impressions + excluded.unpriced_impressions,
                unpriced_taps = r.unpriced_taps + excluded.unpriced_taps
            """
    }
}
