import AdTallyCore
import Foundation
import Logging
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
/// rollup deltas (`RollupAccumulator`; `RollupCompactor` folds them in later).
/// Ids are written in sorted order so that concurrent writers — in this process or
/// another server — take the ledger's index locks in the same order and cannot
/// deadlock; the other tables are only appended to.
public struct EventStore: Sendable {
    let pool: PostgresPool
    let partitions: EventPartitions
    let logger: Logger

    /// Creates a store over a pool.
    public init(pool: PostgresPool, logger: Logger = Logger(label: "adtally.events")) {
        self.pool = pool
        self.partitions = EventPartitions()
        self.logger = logger
    }

    /// Stores events; returns, for each input position, whether it was newly stored
    /// (false: a duplicate of an earlier event, in this call or before).
    public func store(_ events: [AppEvent]) async throws -> [Bool] {
        if events.isEmpty { return [] }
        let partitions = self.partitions
        return try await pool.withConnection { connection in
            try partitions.ensure(days: Set(events.map { EventPartitions.day(ofMicros: $0.event.occurredAtMicros) }), on: connection)
            // A deadlock or serialization failure cannot happen with sorted writes, but
            // another server may not be this version: retry such transient errors once.
            do {
                return try connection.withTransaction { try Self.write(events, on: $0) }
            } catch let error as PostgresError where error.sqlState == .deadlockDetected || error.sqlState == .serializationFailure {
                return try connection.withTransaction { try Self.write(events, on: $0) }
            }
        }
    }

    /// Records that events up to `maxAge` old may be accepted, so that their ids are
    /// kept at least that long (never narrows what is recorded).
    public func widenIDHorizon(to maxAge: Duration) async throws {
        try await pool.query("UPDATE id_horizon SET max_event_age_seconds = GREATEST(max_event_age_seconds, \(maxAge.components.seconds))")
    }

    /// The widest accepted event age recorded.
    static func idHorizon(_ pool: PostgresPool) async throws -> Duration {
        let rows = try await pool.query("SELECT max_event_age_seconds FROM id_horizon")
        return .seconds(try rows.first?.decode(0, as: Int64.self) ?? 7 * 86_400)
    }

    static func write(_ events: [AppEvent], on connection: PostgresConnection) throws -> [Bool] {
        // 1. First occurrence of each (app, id) within the call, in sorted order.
        var firstIndex: [EventKey: Int] = [:]
        firstIndex.reserveCapacity(events.count)
        for (index, item) in events.enumerated() {
            let key = EventKey(app: item.appID, id: item.event.id)
            if firstIndex[key] == nil { firstIndex[key] = index }
        }
        let ordered = firstIndex.sorted { $0.key < $1.key }

        // 2. Claim the ids in the ledger. Fast path, for the usual group with no
        // duplicate: COPY the ids in (no array parsing, one B-tree descent each). If
        // any id is there already, the unique index stops the COPY: roll back to the
        // savepoint and let INSERT ... ON CONFLICT sort new from old.
        var isNew = [Bool](repeating: false, count: events.count)
        var ledger = PostgresCopyBuffer(capacity: ordered.count * 72)
        for (key, index) in ordered {
            try ledger.append(key.app)
            ledger.append(key.id)
            ledger.append(PostgresMicros(events[index].event.occurredAtMicros))
            ledger.endRow()
        }
        try connection.execute(unsafeSQL: "SAVEPOINT claim_ids")
        do {
            try connection.copyIn(unsafeSQL: "COPY event_ids (app_id, event_id, occurred_at) FROM STDIN", data: ledger)
            // No RELEASE: the savepoint ends with the transaction, one round trip fewer.
            for (_, index) in ordered { isNew[index] = true }
        } catch let error as PostgresError where error.sqlState == .uniqueViolation {
            try connection.execute(unsafeSQL: "ROLLBACK TO SAVEPOINT claim_ids")
            let apps = ordered.map(\.key.app)
            let ids = ordered.map(\.key.id)
            let times = ordered.map { PostgresMicros(events[$0.value].event.occurredAtMicros) }
            let claimed = try connection.query("""
                INSERT INTO event_ids (app_id, event_id, occurred_at)
                SELECT * FROM unnest(\(array: apps)::text[], \(array: ids)::uuid[], \(array: times)::timestamptz[])
                ON CONFLICT DO NOTHING
                RETURNING app_id, event_id
                """)
            var newKeys = Set<EventKey>()
            newKeys.reserveCapacity(claimed.count)
            for row in claimed {
                newKeys.insert(EventKey(app: try row.decode(0), id: try row.decode(1)))
            }
            for (key, index) in ordered where newKeys.contains(key) { isNew[index] = true }
            if newKeys.isEmpty { return isNew }
        }

        // 3. COPY the new events.
        var buffer = PostgresCopyBuffer(capacity: ordered.count * 200)
        var rollups = RollupAccumulator()
        for (index, item) in events.enumerated() where isNew[index] {
            try EventRow.append(item, to: &buffer)
            rollups.add(item)
        }
        try connection.copyIn(unsafeSQL: "COPY events (\(EventRow.columns)) FROM STDIN", data: buffer)

        // 4. Rollup deltas, for the new events only.
        try rollups.write(on: connection)
        return isNew
    }
}

/// The events table's COPY row layout.
enum EventRow {
    static let columns = "app_id, occurred_at, event_id, type, network, format, placement, size, country, platform, "
        + "os_version, app_version, device, revenue_micros, currency, error_code, will_leave, shown"

    static func append(_ item: AppEvent, to buffer: inout PostgresCopyBuffer) throws {
        let event = item.event
        try buffer.append(item.appID)
        buffer.append(PostgresMicros(event.occurredAtMicros))
        buffer.append(event.id)
        try buffer.append(event.type.rawValue)
        try buffer.append(event.network)
        try buffer.append(event.format.rawValue)
        try buffer.append(event.placement)
        try buffer.append(event.size)
        try buffer.append(event.country)
        try buffer.append(event.platform?.rawValue)
        try buffer.append(event.osVersion)
        try buffer.append(event.appVersion)
        try buffer.append(event.device)
        buffer.append(event.revenueMicros)
        try buffer.append(event.currency)
        buffer.append(event.errorCode)
        buffer.append(event.willLeave)
        buffer.append(event.shown)
        buffer.endRow()
    }
}

/// (app, event id), ordered by app then by the id's bytes: the one lock order all writers use.
struct EventKey: Hashable, Comparable {
    var app: String
    var id: UUID
    private var high: UInt64
    private var low: UInt64

    init(app: String, id: UUID) {
        self.app = app
        self.id = id
        let bytes = id.uuid
        high = [bytes.0, bytes.1, bytes.2, bytes.3, bytes.4, bytes.5, bytes.6, bytes.7].reduce(0) { $0 << 8 | UInt64($1) }
        low = [bytes.8, bytes.9, bytes.10, bytes.11, bytes.12, bytes.13, bytes.14, bytes.15].reduce(0) { $0 << 8 | UInt64($1) }
    }

    static func < (lhs: EventKey, rhs: EventKey) -> Bool {
        if lhs.app != rhs.app { return lhs.app < rhs.app }
        return lhs.high != rhs.high ? lhs.high < rhs.high : lhs.low < rhs.low
    }

    static func == (lhs: EventKey, rhs: EventKey) -> Bool {
        lhs.high == rhs.high && lhs.low == rhs.low && lhs.app == rhs.app
    }

    func hash(into hasher: inout Hasher) {
        hasher.combine(high)
        hasher.combine(low)
        hasher.combine(app)
    }
}
