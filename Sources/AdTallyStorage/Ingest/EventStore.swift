import AdTallyCore
import Foundation
import Logging
import Metrics
import PostgresKit
import Synchronization

/// An event with the app it belongs to.
public struct AppEvent: Sendable {
    /// The app, from the key that sent it.
    public var appID: String
    /// The validated event.
    public var event: AdEvent
    /// Pairs an event with its app.
    public init(appID: String, event: AdEvent) {
        self.appID = appID
        self.event = event
    }
}

/// Writes events durably, exactly once per (app, event id), with their rollups.
///
/// One call is one transaction: the ids go into the dedupe ledger first (COPY, or
/// `ON CONFLICT DO NOTHING` when some are known), only the ids that were new are copied into the
/// partitioned events table with COPY, and only their sums are appended to the
/// rollup deltas (`RollupAccumulator`) and, per device, to the install deltas
/// (`InstallAccumulator`); `RollupCompactor` folds both in later.
/// Ids are written in sorted order so that concurrent writers — in this process or
/// another server — take the ledger's index locks in the same order and cannot
/// deadlock; the other tables are only appended to.
public struct EventStore: Sendable {
    let pool: PostgresPool
    let partitions: EventPartitions
    let logger: Logger
    /// Which networks each app's events may name (the rest count as `other`).
    public let networks: AppNetworks
    /// What erased devices' tombstones are hashed with (`DeviceTombstones`).
    let tombstoneKey: TombstoneKey

    /// Creates a store over a pool. `credentialsKey`: the servers' `ADTALLY_CREDENTIALS_KEY`
    /// (nil: the database's own secret), which the tombstones of erased devices are keyed with.
    public init(pool: PostgresPool, credentialsKey: String?, logger: Logger = Logger(label: "adtally.events")) {
        self.pool = pool
        self.partitions = EventPartitions()
        self.logger = logger
        self.networks = AppNetworks()
        self.tombstoneKey = TombstoneKey(credentialsKey: credentialsKey)
    }

    /// What became of one event of a `write`.
    public enum Outcome: Sendable, Equatable {
        /// Newly stored.
        case stored
        /// Its id was stored before (in this call or an earlier one).
        case duplicate
        /// Its device was erased after it occurred (DESIGN §15): not stored, and delivered
        /// as far as the client is concerned.
        case erased
    }

    /// Stores events; returns, for each input position, whether it was newly stored
    /// (false: a duplicate of an earlier event, in this call or before).
    ///
    /// `expectsNew` (one per event, nil: none): the client that sent that event says it
    /// never sent it before (`AdTally-Attempt: 1`), so its id is claimed by the COPY
    /// without the read-only probe that keeps a retried batch's duplicates out of
    /// PostgreSQL's log; the other events' ids are probed as ever. Only a hint: a client
    /// that says so wrongly (a hostile one, a proxy that replays a POST) costs an ERROR
    /// line in that log and the transaction done again the other way (counted in
    /// `adtally_ingest_claim_redos_total`); every event is still stored once.
    public func store(_ events: [AppEvent], expectsNew: [Bool]? = nil) async throws -> [Bool] {
        try await write(events, expectsNew: expectsNew).map { $0 == .stored }
    }

    /// `store`, saying of each event whether it was stored, a duplicate, or refused as
    /// an erased device's (`DeviceTombstones`).
    public func write(_ events: [AppEvent], expectsNew: [Bool]? = nil) async throws -> [Outcome] {
        if events.isEmpty { return [] }
        let partitions = self.partitions
        let networks = self.networks
        let tombstoneKey = self.tombstoneKey
        return try await pool.withConnection { connection in
            let key = try tombstoneKey.key(on: connection)
            try partitions.ensure(days: Set(events.map { EventPartitions.day(ofMicros: $0.event.occurredAtMicros) }), on: connection)
            // Usually no id is known yet. One read-only probe of the ledger's index says
            // so; then the ids are claimed with COPY (multi-row inserts, one B-tree
            // descent each). If one is known, the ids are claimed with ON CONFLICT DO
            // NOTHING RETURNING instead, which sorts new from old. A COPY that still
            // meets a known id (a retry that raced its original between probe and COPY)
            // fails; that transaction is redone the second way. So PostgreSQL logs an
            // ERROR for a duplicate only in that race, not for every retried batch (the
            // COPY-first claim did). The probe is not free: under `BENCH_TRACE=1 make
            // bench-ingest` it takes about as long as the COPY into the ledger (one index
            // lookup per id), the price of that quiet log on PostgreSQL 15.
            // Which networks may be named: from the cache, or a short transaction of its own
            // before the write's (admitting a network is harmless to keep if the write
            // fails), so the per-app lock it takes is never held while the write waits on the ledger.
            let isAdmitted = try networks.admitted(events, on: connection)
            func attempt() throws -> [Outcome] {
                do {
                    return try connection.withTransaction {
                        try Self.write(events, claimInBulk: true, expectsNew: expectsNew, isAdmitted: isAdmitted, tombstoneKey: key, on: $0)
                    }
                } catch is KnownIDs {
                    Counter(label: "adtally_ingest_claim_redos_total").increment()
                    return try connection.withTransaction { try Self.write(events, claimInBulk: false, isAdmitted: isAdmitted, tombstoneKey: key, on: $0) }
                }
            }
            // A deadlock or serialization failure cannot happen with sorted writes, but
            // another server may not be this version: retry such transient errors once.
            do {
                return try attempt()
            } catch let error as PostgresError where error.sqlState == .deadlockDetected || error.sqlState == .serializationFailure {
                return try attempt()
            }
        }
    }

    /// Records that events up to `maxAge` old may be accepted, so that their ids are
    /// kept at least that long (never narrows what is recorded). Returns the time
    /// before which ids may already have been pruned, in microseconds since the epoch
    /// (nil: none ever were): an event older than that must be refused, whatever the
    /// window, or a retry of it would count twice. The update waits for a pruning
    /// pass in progress (it locks the same row), so the answer covers that pass too.
    @discardableResult
    public func widenIDHorizon(to maxAge: Duration) async throws -> Int64? {
        // Two statements in one transaction, not a RETURNING that computes: Citus refuses
        // a function that is not IMMUTABLE in the RETURNING of a write to its tables. The
        // SELECT runs after the UPDATE took the row's lock, so it sees any pruning pass.
        try await pool.withTransaction { connection in
            _ = try connection.query("""
                UPDATE id_horizon SET max_event_age_seconds = GREATEST(max_event_age_seconds, \(maxAge.components.seconds))
                """)
            return try connection.query("SELECT (extract(epoch FROM pruned_before) * 1000000)::bigint FROM id_horizon")
                .first?.decode(0, as: Int64?.self)
        }
    }

    /// Some id of the group is in the ledger already: the COPY that claims ids failed.
    struct KnownIDs: Error {}

    /// Citus reports a duplicate key met by a COPY on a worker as XX000 (internal error)
    /// with PostgreSQL's own message, not as 23505, and without the constraint's field:
    /// `duplicate key value violates unique constraint "event_ids_pkey_102049"`. The
    /// ledger's key is recognised by its name, which no server language translates (the
    /// English text alone, or its quotes, would miss a worker with another `lc_messages`).
    static func isCitusDuplicateKey(_ error: PostgresError) -> Bool {
        error.sqlState?.rawValue == "XX000"
            && (error.message.contains("event_ids_pkey") || error.message.contains("duplicate key value violates unique constraint"))
    }

    /// One transaction's writes: the erased devices' events set aside first
    /// (`DeviceTombstones`, which locks before it reads), then the others stored.
    static func write(
        _ events: [AppEvent], claimInBulk: Bool, expectsNew: [Bool]? = nil, isAdmitted: (AppEvent) -> Bool, tombstoneKey: [UInt8],
        on connection: PostgresConnection
    ) throws -> [Outcome] {
        let erased = try DeviceTombstones.erased(events, key: tombstoneKey, on: connection)
        guard !erased.isEmpty else {
            return try writeNew(events, claimInBulk: claimInBulk, expectsNew: expectsNew, isAdmitted: isAdmitted, on: connection)
                .map { $0 ? .stored : .duplicate }
        }
        let kept = events.indices.filter { !erased.contains($0) }
        let isNew = try writeNew(
            kept.map { events[$0] }, claimInBulk: claimInBulk, expectsNew: expectsNew.map { flags in kept.map { flags[$0] } },
            isAdmitted: isAdmitted, on: connection
        )
        var outcomes = [Outcome](repeating: .erased, count: events.count)
        for (position, index) in kept.enumerated() { outcomes[index] = isNew[position] ? .stored : .duplicate }
        return outcomes
    }

    static func writeNew(
        _ events: [AppEvent], claimInBulk: Bool, expectsNew: [Bool]? = nil, isAdmitted: (AppEvent) -> Bool, on connection: PostgresConnection
    ) throws -> [Bool] {
        if events.isEmpty { return [] }
        // 1. First occurrence of each (app, id) within the call, in (app, id) order.
        let ordered = LedgerKey.firstOccurrences(of: events)

        // 2. Claim the ids in the ledger: with COPY when the probe finds none of them
        // (in key order, so index locks are taken in the order all writers use), or
        // with INSERT ... ON CONFLICT DO NOTHING RETURNING, which says which were new.
        var isNew = [Bool](repeating: false, count: events.count)
        let apps = ordered.map { events[$0].appID }
        let ids = ordered.map { events[$0].event.id }
        if claimInBulk {
            // One probe per app (a group holds a few), shaped `app_id = $1 AND event_id =
            // ANY($2)`: one index scan each, and on Citus one shard each (a correlated
            // subquery over unnest() is refused there).
            // (Only the ids no client said were new: `expectsNew`.)
            var start = 0
            while start < ordered.count {
                var end = start + 1
                while end < ordered.count && apps[end] == apps[start] { end += 1 }
                let probed = expectsNew.map { flags in (start..<end).filter { !flags[ordered[$0]] }.map { ids[$0] } } ?? Array(ids[start..<end])
                if !probed.isEmpty {
                    let known = try connection.query("""
                        SELECT 1 FROM event_ids WHERE app_id = \(apps[start]) AND event_id = ANY(\(array: probed)::uuid[]) LIMIT 1
                        """)
                    guard known.isEmpty else { throw KnownIDs() }
                }
                start = end
            }
            var ledger = PostgresCopyBuffer(columns: 3, capacity: ordered.count * 60)
            for index in ordered {
                let event = events[index]
                try ledger.append(event.appID)
                ledger.append(event.event.id)
                ledger.append(PostgresMicros(event.event.occurredAtMicros))
                ledger.endRow()
            }
            do {
                try connection.copyIn(unsafeSQL: "COPY event_ids (app_id, event_id, occurred_at) FROM STDIN (FORMAT binary)", data: ledger)
            } catch let error as PostgresError where error.sqlState == .uniqueViolation || Self.isCitusDuplicateKey(error) {
                throw KnownIDs()
            }
            for index in ordered { isNew[index] = true }
        } else {
            let times = ordered.map { PostgresMicros(events[$0].event.occurredAtMicros) }
            let claimed = try connection.query("""
                INSERT INTO event_ids (app_id, event_id, occurred_at)
                SELECT * FROM unnest(\(array: apps)::text[], \(array: ids)::uuid[], \(array: times)::timestamptz[])
                ON CONFLICT DO NOTHING
                RETURNING app_id, event_id
                """)
            var positions: [String: [UUID: Int]] = [:]
            for index in ordered { positions[events[index].appID, default: [:]][events[index].event.id] = index }
            for row in claimed {
                if let index = positions[try row.decode(0, as: String.self)]?[try row.decode(1, as: UUID.self)] { isNew[index] = true }
            }
            if claimed.count == 0 { return isNew }
        }

        // 3. COPY the new events.
        var buffer = PostgresCopyBuffer(columns: EventRow.columnCount, capacity: ordered.count * 260)
        var rollups = RollupAccumulator()
        var installs = InstallAccumulator()
        for (index, original) in events.enumerated() where isNew[index] {
            var item = original
            if !isAdmitted(item) { item.event.network = AppNetworks.other }
            try EventRow.append(item, to: &buffer)
            // The device hashed once: the sketches and the install rows both key by it.
            let deviceHash = item.event.device.map(DeviceHash.hash) ?? 0
            rollups.add(item, deviceHash: deviceHash)
            installs.add(item, deviceHash: deviceHash)
        }
        try connection.copyIn(unsafeSQL: "COPY events (\(EventRow.columns)) FROM STDIN (FORMAT binary)", data: buffer)

        // 4. Rollup and install deltas, for the new events only.
        try rollups.write(on: connection)
        try installs.write(on: connection)
        return isNew
    }
}

/// The events table's COPY row layout.
enum EventRow {
    static let columns = "app_id, occurred_at, event_id, type, network, format, placement, size, country, platform, "
        + "os_version, app_version, device, revenue_micros, currency, revenue_precision, error_code, will_leave, shown"
    static let columnCount = 19

    static func append(_ item: AppEvent, to buffer: inout PostgresCopyBuffer) throws {
        let event = item.event
        try buffer.append(item.appID)
        buffer.append(PostgresMicros(event.occurredAtMicros))
        buffer.append(event.id)
        try buffer.append(event.type.rawValue)
        try buffer.append(event.network)
        try buffer.append(event.format?.rawValue ?? "")
        try buffer.append(event.placement)
        try buffer.append(event.size)
        try buffer.append(event.country)
        try buffer.append(event.platform?.rawValue)
        try buffer.append(event.osVersion)
        try buffer.append(event.appVersion)
        try buffer.append(event.device)
        buffer.append(event.revenueMicros)
        try buffer.append(event.currency)
        try buffer.append(event.revenuePrecision?.rawValue)
        try buffer.appendInt32(event.errorCode.map(Int64.init))
        buffer.append(event.willLeave)
        buffer.append(event.shown)
        buffer.endRow()
    }
}

/// (app, event id) as fixed-width integers: the app as its rank among the call's
/// apps (byte order), the id as its 16 bytes big-endian. Sorting these orders rows
/// by app then id — the one lock order all writers use — without comparing or
/// hashing strings per event.
struct LedgerKey: Comparable {
    var app: UInt32
    var high: UInt64
    var low: UInt64
    /// Position in the call; ties (the same id twice) keep the earliest first.
    var index: Int32

    static func < (lhs: LedgerKey, rhs: LedgerKey) -> Bool {
        if lhs.app != rhs.app { return lhs.app < rhs.app }
        if lhs.high != rhs.high { return lhs.high < rhs.high }
        if lhs.low != rhs.low { return lhs.low < rhs.low }
        return lhs.index < rhs.index
    }

    /// The positions of the first occurrence of every (app, id), in key order.
    static func firstOccurrences(of events: [AppEvent]) -> [Int] {
        // Rank the distinct apps (a group holds a few; consecutive events usually share one).
        var appRank: [String: UInt32] = [:]
        var lastApp = "", lastRank: UInt32 = 0
        var ranks = [UInt32](repeating: 0, count: events.count)
        for (index, event) in events.enumerated() {
            if index == 0 || event.appID != lastApp {
                lastApp = event.appID
                if let rank = appRank[lastApp] {
                    lastRank = rank
                } else {
                    lastRank = UInt32(appRank.count)
                    appRank[lastApp] = lastRank
                }
            }
            ranks[index] = lastRank
        }
        if appRank.count > 1 {
            let sorted = appRank.keys.sorted()
            var byteOrder = [UInt32](repeating: 0, count: sorted.count)
            for (position, app) in sorted.enumerated() { byteOrder[Int(appRank[app]!)] = UInt32(position) }
            for index in ranks.indices { ranks[index] = byteOrder[Int(ranks[index])] }
        }

        var keys = [LedgerKey]()
        keys.reserveCapacity(events.count)
        for (index, event) in events.enumerated() {
            let (high, low) = withUnsafeBytes(of: event.event.id.uuid) { bytes in
                (UInt64(bigEndian: bytes.loadUnaligned(as: UInt64.self)), UInt64(bigEndian: bytes.loadUnaligned(fromByteOffset: 8, as: UInt64.self)))
            }
            keys.append(LedgerKey(app: ranks[index], high: high, low: low, index: Int32(index)))
        }
        keys.sort()
        var result = [Int]()
        result.reserveCapacity(keys.count)
        for (position, key) in keys.enumerated() {
            if position > 0 {
                let previous = keys[position - 1]
                if previous.app == key.app && previous.high == key.high && previous.low == key.low { continue }
            }
            result.append(Int(key.index))
        }
        return result
    }
}
