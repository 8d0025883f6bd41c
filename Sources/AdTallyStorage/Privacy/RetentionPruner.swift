import Foundation
import PostgresKit

/// Retention per app (DESIGN §15): beside the servers' `--retention-days`, which drops
/// whole daily partitions of raw events, an app may keep less (`apps.retention_days`);
/// the shorter wins for its raw events and for its device rows (`install_days`,
/// `install_day_revenue`, and an `installs` row once none of its days is left). The
/// cohort grain and the rollups hold no identifier and stay.
///
/// Every delete is bounded: raw events an hour of `occurred_at` at a time (the events'
/// (app, time) index), device rows a cohort at a time (their (app, cohort, day) indexes),
/// each in a transaction of its own.
struct RetentionPruner: Sendable {
    let pool: PostgresPool
    /// The servers' retention, in days.
    let retentionDays: Int
    /// The fewest days any app keeps: the accepted event age and a day. A late event of a
    /// day whose device rows were gone would count its device in that cohort day again.
    let minimumDays: Int

    /// What one pass removed.
    struct Removed: Sendable, Equatable {
        var events = 0
        var deviceRows = 0
    }

    func run(now: Date) async throws -> Removed {
        var removed = Removed()
        let apps = try await pool.query("SELECT app_id, retention_days FROM apps ORDER BY app_id").map {
            (try $0.decode(0, as: String.self), try $0.decode(1, as: Int?.self))
        }
        let today = EventPartitions.day(ofMicros: Int64(now.timeIntervalSince1970 * 1_000_000))
        for (app, own) in apps {
            let days = max(min(own ?? retentionDays, retentionDays), minimumDays)
            if days < retentionDays {
                // The app's raw events before the first UTC day it keeps (the partitions hold
                // the servers' longer retention).
                removed.events += try await pruneEvents(app: app, before: Int64(today - days + 1) * 86_400_000_000)
            }
            removed.deviceRows += try await pruneDeviceRows(app: app, days: days, now: now)
        }
        return removed
    }

    func pruneEvents(app: String, before cutoff: Int64) async throws -> Int {
        guard var lower = try await pool.query("""
            SELECT (extract(epoch FROM min(occurred_at)) * 1000000)::bigint FROM events WHERE app_id = \(app) AND occurred_at < \(PostgresMicros(cutoff))::timestamptz
            """).first?.decode(0, as: Int64?.self) else { return 0 }
        var deleted = 0
        while lower < cutoff {
            let upper = min(cutoff, lower / 3_600_000_000 * 3_600_000_000 + 3_600_000_000)
            deleted += try await pool.query("""
                DELETE FROM events WHERE app_id = \(app) AND occurred_at >= \(PostgresMicros(lower))::timestamptz AND occurred_at < \(PostgresMicros(upper))::timestamptz
                """).affectedRows
            lower = upper
        }
        return deleted
    }

    /// The device rows of local days before the app's first kept day, a cohort at a time
    /// (only the cohorts that have such rows), each under the compaction lock: a pass that
    /// read an install while its last day row goes would fold the device back in otherwise.
    func pruneDeviceRows(app: String, days: Int, now: Date) async throws -> Int {
        // Two statements, not a subquery from apps into install_days (Citus refuses a
        // correlated one from a reference table into a distributed one).
        guard let cutoff = try await pool.query("""
            SELECT (now() AT TIME ZONE timezone)::date - \(days)::int + 1 - DATE '1970-01-01' FROM apps WHERE app_id = \(app)
            """).first?.decode(0, as: Int.self) else { return 0 }
        let cutoffText = Self.date(cutoff)
        let cohorts = try await pool.query("""
            SELECT DISTINCT cohort::text FROM install_days WHERE app_id = \(app) AND cohort < \(cutoffText)::date AND day < \(cutoffText)::date ORDER BY 1
            """).map { try $0.decode(0, as: String.self) }
        var deleted = 0
        // Where the device rows start from now on, for the cohort reports' notes; recorded
        // first (a report may say so a little early, never too late).
        if !cohorts.isEmpty {
            try await pool.query("UPDATE apps SET device_rows_from = GREATEST(device_rows_from, \(cutoffText)::date) WHERE app_id = \(app)")
        }
        for cohort in cohorts {
            deleted += try await pool.withTransaction { connection in
                try connection.query("SET LOCAL lock_timeout = '60s'")
                try RatePricing.lockCompaction(on: connection)
                var count = try connection.query("""
                    DELETE FROM install_days WHERE app_id = \(app) AND cohort = \(cohort)::date AND day < \(cutoffText)::date
                    """).affectedRows
                count += try connection.query("""
                    DELETE FROM install_day_revenue WHERE app_id = \(app) AND cohort = \(cohort)::date AND day < \(cutoffText)::date
                    """).affectedRows
                // A device none of whose days is kept: its install goes too (back after
                // retention, it is a new install).
                count += try connection.query("""
                    DELETE FROM installs i WHERE i.app_id = \(app) AND i.day = \(cohort)::date
                      AND NOT EXISTS (SELECT 1 FROM install_days d WHERE d.app_id = i.app_id AND d.device = i.device)
                    """).affectedRows
                return count
            }
        }
        return deleted
    }

    static func date(_ day: Int) -> String { EventPartitions.dayText(day) }
}
