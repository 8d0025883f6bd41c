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
    /// A delta row's key, without strings: the (app, network) pair as its index in
    /// `sources`, and country and currency packed into one integer.
    struct Key: Hashable {
        var source: UInt32
        var bucket: Int64
        /// nil on a session.
        var format: AdFormat?
        /// has revenue dimension << 48 | country bytes << 24 | currency bytes.
        var dimensions: UInt64

        /// nil for events that have no revenue dimension.
        var country: String? { hasRevenueDimension ? Self.text(UInt32(truncatingIfNeeded: dimensions >> 24) & 0xFFFF) : nil }
        /// nil likewise; "" for an impression or tap without reported revenue.
        var currency: String? { hasRevenueDimension ? Self.text(UInt32(truncatingIfNeeded: dimensions) & 0xFF_FFFF) : nil }
        var hasRevenueDimension: Bool { dimensions >> 48 & 1 == 1 }

        /// Up to 3 ASCII bytes as an integer (country and currency codes are validated ASCII).
        static func code(_ text: String) -> UInt64 {
            var value: UInt64 = 0
            for byte in text.utf8.prefix(3) { value = value << 8 | UInt64(byte) }
            return value
        }

        static func text(_ code: UInt32) -> String {
            var bytes: [UInt8] = []
            var rest = code
            while rest != 0 {
                bytes.insert(UInt8(truncatingIfNeeded: rest), at: 0)
                rest >>= 8
            }
            return String(decoding: bytes, as: UTF8.self)
        }
    }

    struct Sums {
        var requests: Int64 = 0, loads: Int64 = 0, impressions: Int64 = 0, errors: Int64 = 0
        var taps: Int64 = 0, actionCancels: Int64 = 0, expiries: Int64 = 0, wastedFills: Int64 = 0, sessions: Int64 = 0
        var revenueMicros: Int64 = 0, pricedEvents: Int64 = 0, unpricedImpressions: Int64 = 0, unpricedTaps: Int64 = 0
        /// Hashes of the events' devices (`DeviceHash`), repeats included until written.
        var devices: [Int64] = []
        /// Hashes of the impressions' devices: the ad viewers (Migrations/0014).
        var viewers: [Int64] = []
    }

    private var rows: [Key: Sums] = [:]
    /// Rows of a key whose revenue would no longer fit in 64 bits with the next
    /// event's added: written as they are, and the key starts a new row. The delta
    /// table has no unique key, and the compactor sums into numeric columns.
    private var fullRows: [(Key, Sums)] = []
    /// The (app, network) pairs seen, by index.
    private var sources: [(app: String, network: String)] = []
    private var sourceIndexes: [SourcePair: UInt32] = [:]

    private struct SourcePair: Hashable {
        var app: String
        var network: String
    }

    /// The index of an (app, network) pair. A group holds a few apps and networks,
    /// so a scan comparing short strings beats hashing them for every event.
    private mutating func sourceIndex(app: String, network: String) -> UInt32 {
        if sources.count <= 16 {
            for index in sources.indices where sources[index].network == network && sources[index].app == app { return UInt32(index) }
        } else if let index = sourceIndexes[SourcePair(app: app, network: network)] {
            return index
        }
        let index = UInt32(sources.count)
        sources.append((app, network))
        sourceIndexes[SourcePair(app: app, network: network)] = index
        return index
    }

    /// rollup_delta's columns, in the order `write` appends them.
    static let columns = "app_id, bucket, network, format, country, currency, requests, loads, impressions, errors, taps, "
        + "action_cancels, expiries, wasted_fills, sessions, revenue_micros, priced_events, unpriced_impressions, unpriced_taps, device_hashes, viewer_hashes"

    /// Adds a new event; `deviceHash`: `DeviceHash.hash` of its device, when it has one.
    mutating func add(_ item: AppEvent, deviceHash: Int64? = nil) {
        let event = item.event
        var dimensions: UInt64 = 0
        if event.type == .impression || event.type == .tap {
            dimensions = 1 << 48 | Key.code(event.country) << 24 | Key.code(event.currency ?? "")
        }
        let key = Key(
            source: sourceIndex(app: item.appID, network: event.network), bucket: event.bucketStartSeconds,
            format: event.format, dimensions: dimensions
        )
        if !Self.count(event, into: &rows[key, default: Sums()]) {
            fullRows.append((key, rows[key]!))
            rows[key] = Sums()
            _ = Self.count(event, into: &rows[key]!)
        }
        if let device = event.device {
            let hash = deviceHash ?? DeviceHash.hash(device)
            rows[key]!.devices.append(hash)
            if event.type == .impression { rows[key]!.viewers.append(hash) }
        }
    }

    /// Adds the event; false, changing nothing, when its revenue would overflow the row's sum.
    private static func count(_ event: AdEvent, into sums: inout Sums) -> Bool {
        switch event.type {
        case .request: sums.requests += 1
        case .load: sums.loads += 1
        case .error: sums.errors += 1
        case .actionCancel: sums.actionCancels += 1
        case .session: sums.sessions += 1
        case .expiry:
            sums.expiries += 1
            if event.shown == false { sums.wastedFills += 1 }
        case .impression, .tap:
            let isImpression = event.type == .impression
            if isImpression { sums.impressions += 1 } else { sums.taps += 1 }
            if let micros = event.revenueMicros {
                let (total, overflow) = sums.revenueMicros.addingReportingOverflow(micros)
                if overflow { return false }
                sums.revenueMicros = total
                sums.pricedEvents += 1
            } else if isImpression {
                sums.unpricedImpressions += 1
            } else {
                sums.unpricedTaps += 1
            }
        }
        return true
    }

    /// Appends the rows to `rollup_delta`.
    func write(on connection: PostgresConnection) throws {
        guard !rows.isEmpty else { return }
        var buffer = PostgresCopyBuffer(columns: 21, capacity: (rows.count + fullRows.count) * 200)
        func appendRow(_ key: Key, _ sums: Sums) throws {
            let source = sources[Int(key.source)]
            try buffer.append(source.app)
            buffer.append(PostgresMicros(key.bucket * 1_000_000))
            try buffer.append(source.network)
            try buffer.append(key.format?.rawValue ?? "")
            try buffer.append(key.country)
            try buffer.append(key.currency)
            try buffer.appendInt32(sums.requests)
            try buffer.appendInt32(sums.loads)
            try buffer.appendInt32(sums.impressions)
            try buffer.appendInt32(sums.errors)
            try buffer.appendInt32(sums.taps)
            try buffer.appendInt32(sums.actionCancels)
            try buffer.appendInt32(sums.expiries)
            try buffer.appendInt32(sums.wastedFills)
            try buffer.appendInt32(sums.sessions)
            buffer.append(sums.revenueMicros)
            try buffer.appendInt32(sums.pricedEvents)
            try buffer.appendInt32(sums.unpricedImpressions)
            try buffer.appendInt32(sums.unpricedTaps)
            // A device seen twice in a group adds nothing to a sketch: send it once.
            buffer.append(int64Array: sums.devices.count > 1 ? Array(Set(sums.devices)) : sums.devices)
            buffer.append(int64Array: sums.viewers.count > 1 ? Array(Set(sums.viewers)) : sums.viewers)
            buffer.endRow()
        }
        for (key, sums) in rows { try appendRow(key, sums) }
        for (key, sums) in fullRows { try appendRow(key, sums) }
        try connection.copyIn(unsafeSQL: "COPY rollup_delta (\(Self.columns)) FROM STDIN (FORMAT binary)", data: buffer)
    }
}
