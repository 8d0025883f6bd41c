import AdTallyCore
import PostgresKit

/// Sums new events per device into install delta rows in memory, then appends them to
/// `install_delta` with one COPY (Migrations/0023_installs.sql), in the ingest
/// transaction beside the events and the rollup deltas.
///
/// A row is keyed by (app, device, 15-minute bucket, network, format, country,
/// currency): the key a cohort's money is priced by (the UTC date, the card's network,
/// format and country, the SDK's currency; '' when the event reported none). It also
/// carries its earliest event's instant, platform and app version: the install's
/// candidate, which the compactor keeps when it is the device's earliest. Events
/// without a device are not anyone's install and add nothing here.
struct InstallAccumulator {
    struct Key: Hashable {
        /// Index into `pairs` (app, network).
        var pair: UInt32
        var device: String
        /// `DeviceHash` of `device`: what the key hashes by, so that a lookup hashes no
        /// string (equal keys still compare their devices, so no two devices share a row).
        var deviceHash: Int64
        var bucket: Int64
        var format: AdFormat?
        /// country bytes << 24 | currency bytes (validated ASCII codes, as RollupAccumulator packs them).
        var codes: UInt64

        func hash(into hasher: inout Hasher) {
            hasher.combine(pair)
            hasher.combine(deviceHash)
            hasher.combine(bucket)
            hasher.combine(codes)
            hasher.combine(format)
        }

        static func == (a: Key, b: Key) -> Bool {
            a.deviceHash == b.deviceHash && a.pair == b.pair && a.bucket == b.bucket && a.codes == b.codes && a.format == b.format && a.device == b.device
        }
    }

    struct Sums {
        var firstAt: Int64 = .max
        var firstPlatform: String?
        var firstVersion: String?
        var events: Int64 = 0, requests: Int64 = 0, impressions: Int64 = 0, taps: Int64 = 0, sessions: Int64 = 0
        var revenueMicros: Int64 = 0, pricedEvents: Int64 = 0, unpricedImpressions: Int64 = 0, unpricedTaps: Int64 = 0
    }

    private var rows: [Key: Sums] = [:]
    /// Rows whose revenue would overflow 64 bits with the next event's: written as they
    /// are (the delta table has no unique key; the compactor sums).
    private var fullRows: [(Key, Sums)] = []
    private var pairs: [(app: String, network: String)] = []
    private var pairIndexes: [String: UInt32] = [:]

    var isEmpty: Bool { rows.isEmpty && fullRows.isEmpty }

    /// install_delta's columns, in the order `write` appends them.
    static let columns = "app_id, bucket, device, network, format, country, currency, first_at, first_platform, first_version, "
        + "events, requests, impressions, taps, sessions, revenue_micros, priced_events, unpriced_impressions, unpriced_taps"

    private mutating func pairIndex(app: String, network: String) -> UInt32 {
        // Most groups hold a few apps and networks: a scan of short strings beats hashing
        // them per event; past 16 pairs (a group of many apps), a dictionary.
        if pairs.count <= 16 {
            for index in pairs.indices where pairs[index].network == network && pairs[index].app == app { return UInt32(index) }
        } else if let index = pairIndexes[app + "\u{1}" + network] {
            return index
        }
        pairs.append((app, network))
        pairIndexes[app + "\u{1}" + network] = UInt32(pairs.count - 1)
        return UInt32(pairs.count - 1)
    }

    /// Adds a new event; `deviceHash` is `DeviceHash.hash` of its device (computed once
    /// per event for both accumulators).
    mutating func add(_ item: AppEvent, deviceHash: Int64) {
        let event = item.event
        guard let device = event.device else { return }
        let currency = event.type == .impression || event.type == .tap ? event.currency ?? "" : ""
        let key = Key(
            pair: pairIndex(app: item.appID, network: event.network), device: device, deviceHash: deviceHash, bucket: event.bucketStartSeconds,
            format: event.format, codes: RollupAccumulator.Key.code(event.country) << 24 | RollupAccumulator.Key.code(currency)
        )
        if !Self.count(event, into: &rows[key, default: Sums()]) {
            fullRows.append((key, rows[key]!))
            rows[key] = Sums()
            _ = Self.count(event, into: &rows[key]!)
        }
    }

    /// Adds the event; false, changing nothing, when its revenue would overflow the row's sum.
    private static func count(_ event: AdEvent, into sums: inout Sums) -> Bool {
        if let micros = event.revenueMicros, event.type == .impression || event.type == .tap {
            let (total, overflow) = sums.revenueMicros.addingReportingOverflow(micros)
            if overflow { return false }
            sums.revenueMicros = total
            sums.pricedEvents += 1
        } else if event.type == .impression {
            sums.unpricedImpressions += 1
        } else if event.type == .tap {
            sums.unpricedTaps += 1
        }
        sums.events += 1
        switch event.type {
        case .request: sums.requests += 1
        case .impression: sums.impressions += 1
        case .tap: sums.taps += 1
        case .session: sums.sessions += 1
        case .load, .error, .actionCancel, .expiry: break
        }
        // The earliest event, ties broken by what it was seen with (as the compactor and
        // the migration break them), so that the install does not depend on arrival order.
        if event.occurredAtMicros < sums.firstAt
            || (event.occurredAtMicros == sums.firstAt
                && (event.platform?.rawValue ?? "", event.appVersion ?? "") < (sums.firstPlatform ?? "", sums.firstVersion ?? ""))
        {
            sums.firstAt = event.occurredAtMicros
            sums.firstPlatform = event.platform?.rawValue
            sums.firstVersion = event.appVersion
        }
        return true
    }

    /// Appends the rows to `install_delta`.
    func write(on connection: PostgresConnection) throws {
        guard !isEmpty else { return }
        var buffer = PostgresCopyBuffer(columns: 19, capacity: (rows.count + fullRows.count) * 160)
        func appendRow(_ key: Key, _ sums: Sums) throws {
            let pair = pairs[Int(key.pair)]
            try buffer.append(pair.app)
            buffer.append(PostgresMicros(key.bucket * 1_000_000))
            try buffer.append(key.device)
            try buffer.append(pair.network)
            try buffer.append(key.format?.rawValue ?? "")
            try buffer.append(RollupAccumulator.Key.text(UInt32(truncatingIfNeeded: key.codes >> 24) & 0xFFFF))
            try buffer.append(RollupAccumulator.Key.text(UInt32(truncatingIfNeeded: key.codes) & 0xFF_FFFF))
            buffer.append(PostgresMicros(sums.firstAt))
            try buffer.append(sums.firstPlatform)
            try buffer.append(sums.firstVersion)
            try buffer.appendInt32(sums.events)
            try buffer.appendInt32(sums.requests)
            try buffer.appendInt32(sums.impressions)
            try buffer.appendInt32(sums.taps)
            try buffer.appendInt32(sums.sessions)
            buffer.append(sums.revenueMicros)
            try buffer.appendInt32(sums.pricedEvents)
            try buffer.appendInt32(sums.unpricedImpressions)
            try buffer.appendInt32(sums.unpricedTaps)
            buffer.endRow()
        }
        for (key, sums) in rows { try appendRow(key, sums) }
        for (key, sums) in fullRows { try appendRow(key, sums) }
        try connection.copyIn(unsafeSQL: "COPY install_delta (\(Self.columns)) FROM STDIN (FORMAT binary)", data: buffer)
    }
}
