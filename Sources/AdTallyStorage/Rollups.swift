import AdTallyCore
import PostgresKit

/// Sums new events into rollup delta rows in memory, then appends them to
/// `rollup_delta` with one COPY (see Migrations/0002_rollup_deltas.sql).
///
/// An event without a revenue dimension adds to the row of its (app, bucket,
/// network, format); an impression or tap adds its count and its money to the row
/// that also carries its country and currency. Nothing is locked or updated, so
/// the rows need no order.
struct RollupAccumulator {
    struct Key: Hashable {
        var app: String
        var bucket: Int64
        var network: String
        var format: String
        /// With `currency`: nil for events that have no revenue dimension.
        var country: String?
        /// "" for an impression or tap without reported revenue.
        var currency: String?
    }

    struct Sums {
        var requests: Int64 = 0, loads: Int64 = 0, impressions: Int64 = 0, errors: Int64 = 0
        var taps: Int64 = 0, actionCancels: Int64 = 0, expiries: Int64 = 0, wastedFills: Int64 = 0
        var revenueMicros: Int64 = 0, pricedEvents: Int64 = 0, unpricedImpressions: Int64 = 0, unpricedTaps: Int64 = 0
    }

    private(set) var rows: [Key: Sums] = [:]

    /// rollup_delta's columns, in the order `write` appends them.
    static let columns = "app_id, bucket, network, format, country, currency, requests, loads, impressions, errors, taps, "
        + "action_cancels, expiries, wasted_fills, revenue_micros, priced_events, unpriced_impressions, unpriced_taps"

    mutating func add(_ item: AppEvent) {
        let event = item.event
        var key = Key(app: item.appID, bucket: event.bucketStartSeconds, network: event.network, format: event.format.rawValue)
        if event.type == .impression || event.type == .tap {
            key.country = event.country
            key.currency = event.currency ?? ""
        }
        var sums = rows[key] ?? Sums()
        switch event.type {
        case .request: sums.requests += 1
        case .load: sums.loads += 1
        case .error: sums.errors += 1
        case .actionCancel: sums.actionCancels += 1
        case .expiry:
            sums.expiries += 1
            if event.shown == false { sums.wastedFills += 1 }
        case .impression, .tap:
            let isImpression = event.type == .impression
            if isImpression { sums.impressions += 1 } else { sums.taps += 1 }
            if let micros = event.revenueMicros {
                sums.revenueMicros += micros
                sums.pricedEvents += 1
            } else if isImpression {
                sums.unpricedImpressions += 1
            } else {
                sums.unpricedTaps += 1
            }
        }
        rows[key] = sums
    }

    /// Appends the rows to `rollup_delta`.
    func write(on connection: PostgresConnection) throws {
        guard !rows.isEmpty else { return }
        var buffer = PostgresCopyBuffer(capacity: rows.count * 96)
        for (key, sums) in rows {
            try buffer.append(key.app)
            buffer.append(PostgresMicros(key.bucket * 1_000_000))
            try buffer.append(key.network)
            try buffer.append(key.format)
            try buffer.append(key.country)
            try buffer.append(key.currency)
            buffer.append(sums.requests)
            buffer.append(sums.loads)
            buffer.append(sums.impressions)
            buffer.append(sums.errors)
            buffer.append(sums.taps)
            buffer.append(sums.actionCancels)
            buffer.append(sums.expiries)
            buffer.append(sums.wastedFills)
            buffer.append(sums.revenueMicros)
            buffer.append(sums.pricedEvents)
            buffer.append(sums.unpricedImpressions)
            buffer.append(sums.unpricedTaps)
            buffer.endRow()
        }
        try connection.copyIn(unsafeSQL: "COPY rollup_delta (\(Self.columns)) FROM STDIN", data: buffer)
    }
}
