import AdTallyCore
import PostgresKit

/// Sums new events into rollup rows in memory, then upserts them in one statement per table.
struct RollupAccumulator {
    struct CountKey: Hashable, Comparable {
        var app: String
        var bucket: Int64
        var network: String
        var format: String

        static func < (lhs: CountKey, rhs: CountKey) -> Bool {
            (lhs.app, lhs.bucket, lhs.network, lhs.format) < (rhs.app, rhs.bucket, rhs.network, rhs.format)
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
            (lhs.app, lhs.bucket, lhs.network, lhs.format, lhs.country, lhs.currency)
                < (rhs.app, rhs.bucket, rhs.network, rhs.format, rhs.country, rhs.currency)
        }
    }

    /// requests, loads, impressions, errors, taps, action_cancels, expiries, wasted_fills.
    var counts: [CountKey: [Int64]] = [:]
    /// revenue_micros, priced_events, unpriced_impressions, unpriced_taps.
    var revenue: [RevenueKey: [Int64]] = [:]

    static let countColumns = ["requests", "loads", "impressions", "errors", "taps", "action_cancels", "expiries", "wasted_fills"]

    mutating func add(_ item: AppEvent) {
        let event = item.event
        let bucket = event.bucketStartSeconds
        let key = CountKey(app: item.appID, bucket: bucket, network: event.network, format: event.format.rawValue)
        var row = counts[key] ?? [Int64](repeating: 0, count: 8)
        switch event.type {
        case .request: row[0] += 1
        case .load: row[1] += 1
        case .impression: row[2] += 1
        case .error: row[3] += 1
        case .tap: row[4] += 1
        case .actionCancel: row[5] += 1
        case .expiry:
            row[6] += 1
            if event.shown == false { row[7] += 1 }
        }
        counts[key] = row

        guard event.type == .impression || event.type == .tap else { return }
        let revenueKey = RevenueKey(
            app: item.appID, bucket: bucket, network: event.network, format: event.format.rawValue,
            country: event.country, currency: event.currency ?? ""
        )
        var money = revenue[revenueKey] ?? [0, 0, 0, 0]
        if let micros = event.revenueMicros {
            money[0] += micros
            money[1] += 1
        } else if event.type == .impression {
            money[2] += 1
        } else {
            money[3] += 1
        }
        revenue[revenueKey] = money
    }

    func write(on connection: PostgresConnection) throws {
        if !counts.isEmpty {
            let rows = counts.sorted { $0.key < $1.key }
            var query: PostgresQuery = """
                INSERT INTO rollup_15m AS r (app_id, bucket, network, format, \(unsafeRaw: Self.countColumns.joined(separator: ", ")))
                SELECT * FROM unnest(\(array: rows.map(\.key.app))::text[], \(array: rows.map { PostgresTimestamp.format(micros: $0.key.bucket * 1_000_000) })::timestamptz[],
                    \(array: rows.map(\.key.network))::text[], \(array: rows.map(\.key.format))::text[]
                """
            for column in 0..<Self.countColumns.count {
                query.append(", \(array: rows.map { $0.value[column] })::bigint[]")
            }
            query.append("""
                ) ON CONFLICT (app_id, bucket, network, format) DO UPDATE SET
                \(unsafeRaw: Self.countColumns.map { "\($0) = r.\($0) + excluded.\($0)" }.joined(separator: ", "))
                """)
            try connection.query(query)
        }
        if !revenue.isEmpty {
            let rows = revenue.sorted { $0.key < $1.key }
            try connection.query("""
                INSERT INTO rollup_revenue_15m AS r
                    (app_id, bucket, network, format, country, currency, revenue_micros, priced_events, unpriced_impressions, unpriced_taps)
                SELECT * FROM unnest(\(array: rows.map(\.key.app))::text[], \(array: rows.map { PostgresTimestamp.format(micros: $0.key.bucket * 1_000_000) })::timestamptz[],
                    \(array: rows.map(\.key.network))::text[], \(array: rows.map(\.key.format))::text[],
                    \(array: rows.map(\.key.country))::text[], \(array: rows.map(\.key.currency))::text[],
                    \(array: rows.map { $0.value[0] })::bigint[], \(array: rows.map { $0.value[1] })::bigint[],
                    \(array: rows.map { $0.value[2] })::bigint[], \(array: rows.map { $0.value[3] })::bigint[])
                ON CONFLICT (app_id, bucket, network, format, country, currency) DO UPDATE SET
                    revenue_micros = r.revenue_micros + excluded.revenue_micros,
                    priced_events = r.priced_events + excluded.priced_events,
                    unpriced_impressions = r.unpriced_impressions + excluded.unpriced_impressions,
                    unpriced_taps = r.unpriced_taps + excluded.unpriced_taps
                """)
        }
    }
}
