import Foundation
import Logging
import PostgresKit

/// Keeps the raw event tables in shape: partitions ahead of time, old partitions
/// dropped after retention, dedupe ids pruned once no valid retry can carry them, and
/// each app's retention kept (`RetentionPruner`: its own, shorter one; its device rows).
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
        /// Raw events deleted for an app's own, shorter retention.
        public var appEvents = 0
        /// Device rows (installs and their days) past retention.
        public var deviceRows = 0
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
            // The compaction history is for looking back a few days (Migrations/0008).
            try connection.query("DELETE FROM rollup_compaction_passes WHERE started_at < now() - interval '7 days'")
            return try partitions.drop(before: today - retentionDays + 1, on: connection)
        }
        let pruned = try await pruneIDs(now: now)
        let tombstones = try await pruneTombstones()
        let removed = try await RetentionPruner(pool: pool, retentionDays: retentionDays, minimumDays: Int(maxEventAge.components.seconds / 86_400) + 2).run(now: now)
        if !dropped.isEmpty || pruned > 0 || removed.events > 0 || removed.deviceRows > 0 || tombstones > 0 {
            logger.info("event maintenance", metadata: [
                "dropped": "\(dropped.joined(separator: ","))", "pruned_ids": "\(pruned)", "app_events": "\(removed.events)", "device_rows": "\(removed.deviceRows)",
                "tombstones": "\(tombstones)",
            ])
        }
        return Report(droppedPartitions: dropped, prunedIDs: pruned, appEvents: removed.events, deviceRows: removed.deviceRows)
    }

    /// Deletes the tombstones no event can match any more: an event that occurred before
    /// an erasure older than the widest accepted age any process has used (`id_horizon`),
    /// plus a day, is refused by validation anyway. A tombstone is a keyed hash of an
    /// id: kept no longer than it protects anything.
    func pruneTombstones() async throws -> Int {
        let horizon = try await pool.query("SELECT max_event_age_seconds FROM id_horizon")[0].decode(0, as: Int64.self)
        let seconds = Double(max(horizon, maxEventAge.components.seconds) + 86_400)
        return try await pool.query("DELETE FROM device_tombstones WHERE erased_at < now() - make_interval(secs => \(seconds))").affectedRows
    }

    /// Deletes the ledger ids that no accepted event can carry any more: older than
    /// the widest window any process has used (`id_horizon`), plus a day.
    ///
    /// By ranges of `occurred_at` (an hour each, one transaction each), found through
    /// the ledger's BRIN index: no `ctid`, which on Citus names a row only within one
    /// shard, and no scan of the whole ledger per batch. Each range first locks the
    /// horizon row, recomputes the cutoff under that lock and records how far ids are
    /// gone (`pruned_before`), so a process that widens its window at the same time
    /// either waits and learns the new bound or is seen by this pass.
    func pruneIDs(now: Date) async throws -> Int {
        let ownAge = maxEventAge.components.seconds
        let nowMicros = Int64(now.timeIntervalSince1970 * 1_000_000)
        /// Ids older than this (microseconds) may go: the widest window recorded or ours, plus a day.
        @Sendable func cutoff(horizonSeconds: Int64) -> Int64 { nowMicros - (max(horizonSeconds, ownAge) + 86_400) * 1_000_000 }
        @Sendable func timestamp(_ micros: Int64) -> Double { Double(micros) / 1_000_000 }

        // The oldest id below the cutoff; the BRIN index reads only the ranges below it.
        let recorded = try await pool.query("SELECT max_event_age_seconds FROM id_horizon")[0].decode(0, as: Int64.self)
        let firstCutoff = cutoff(horizonSeconds: recorded)
        let oldest = try await pool.query("""
            SELECT (extract(epoch FROM min(occurred_at)) * 1000000)::bigint FROM event_ids
            WHERE occurred_at < to_timestamp(\(timestamp(firstCutoff)))
            """).first?.decode(0, as: Int64?.self)
        guard var lower = oldest else { return 0 }
        var pruned = 0
        while true {
            let upper = lower / 3_600_000_000 * 3_600_000_000 + 3_600_000_000
            let (deleted, done) = try await pool.withTransaction { [lower] connection -> (Int, Bool) in
                let horizon = try connection.query("SELECT max_event_age_seconds FROM id_horizon FOR UPDATE")[0].decode(0, as: Int64.self)
                let end = min(upper, cutoff(horizonSeconds: horizon))
                guard end > lower else { return (0, true) }
                try connection.query("""
                    UPDATE id_horizon SET pruned_before = GREATEST(coalesce(pruned_before, '-infinity'), to_timestamp(\(timestamp(end))))
                    """)
                let rows = try connection.query("""
                    DELETE FROM event_ids WHERE occurred_at >= to_timestamp(\(timestamp(lower))) AND occurred_at < to_timestamp(\(timestamp(end)))
                    """)
                return (rows.affectedRows, end < upper)
            }
            pruned += deleted
            if done { break }
            lower = upper
        }
        return pruned
    }
}
