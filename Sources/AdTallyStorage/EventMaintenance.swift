import Foundation
import Logging
import PostgresKit

/// Keeps the raw event tables in shape: partitions ahead of time, old partitions
/// dropped after retention, dedupe ids pruned once no valid retry can carry them.
public struct EventMaintenance: Sendable {
    let pool: PostgresPool
    let partitions: EventPartitions
    /// Days of raw events kept.
    public let retentionDays: Int
    /// The accepted age of `occurred_at`; ids older than this plus a day can only
    /// come back on events that validation rejects anyway.
    public let maxEventAge: Duration
    let logger: Logger

    /// Maintenance over an event store's tables.
    public init(store: EventStore, retentionDays: Int, maxEventAge: Duration, logger: Logger = Logger(label: "adtally.maintenance")) {
        self.pool = store.pool
        self.partitions = store.partitions
        self.retentionDays = retentionDays
        self.maxEventAge = maxEventAge
        self.logger = logger
    }

    /// What one pass did.
    public struct Report: Sendable, Equatable {
        /// Partitions dropped for retention.
        public var droppedPartitions: [String]
        /// Dedupe ids pruned.
        public var prunedIDs: Int
    }

    /// One pass, relative to `now`.
    @discardableResult
    public func runOnce(now: Date = Date()) async throws -> Report {
        let today = EventPartitions.day(ofMicros: Int64(now.timeIntervalSince1970 * 1_000_000))
        let partitions = self.partitions
        let ageDays = Int(maxEventAge.components.seconds / 86_400) + 1
        let retentionDays = self.retentionDays
        let dropped = try await pool.withConnection { connection in
            try partitions.ensure(days: Set((today - ageDays)...(today + 2)), on: connection)
            return try partitions.drop(before: today - retentionDays + 1, on: connection)
        }
        // Ids live as long as the widest accepted window any process has used, plus a day.
        let horizon = try await EventStore.idHorizon(pool)
        let cutoff = Date(timeIntervalSince1970: now.timeIntervalSince1970 - Double(max(horizon, maxEventAge).components.seconds) - 86_400)
        var pruned = 0
        while true {
            let rows = try await pool.query("""
                DELETE FROM event_ids WHERE ctid = ANY (ARRAY(
                    SELECT ctid FROM event_ids WHERE occurred_at < \(cutoff) LIMIT 50000))
                """)
            pruned += rows.affectedRows
            if rows.affectedRows < 50000 { break }
        }
        if !dropped.isEmpty || pruned > 0 {
            logger.info("event maintenance", metadata: ["dropped": "\(dropped.joined(separator: ","))", "pruned_ids": "\(pruned)"])
        }
        return Report(droppedPartitions: dropped, prunedIDs: pruned)
    }
}
