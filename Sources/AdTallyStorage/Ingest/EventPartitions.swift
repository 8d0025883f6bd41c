import Foundation
import PostgresKit
import TextFormats
import Synchronization

/// Daily partitions of `events` (UTC days): created ahead of need, dropped after retention.
public final class EventPartitions: Sendable {
    private let known = Mutex(Set<Int>())

    /// Creates a manager; it learns which partitions exist as it goes.
    public init() {}

    /// The UTC day number (days since 1970-01-01) of a timestamp in microseconds.
    public static func day(ofMicros micros: Int64) -> Int {
        Int((micros >= 0 ? micros : micros - 86_399_999_999) / 86_400_000_000)
    }

    /// `events_YYYYMMDD`.
    static func name(ofDay day: Int) -> String {
        let (year, month, dayOfMonth) = CivilTime.date(days: day)
        return "events_" + String(format: "%04d%02d%02d", year, month, dayOfMonth)
    }

    /// `YYYY-MM-DD`, for the partition bounds.
    static func dayText(_ day: Int) -> String {
        let (year, month, dayOfMonth) = CivilTime.date(days: day)
        return String(format: "%04d-%02d-%02d", year, month, dayOfMonth)
    }

    /// Makes sure a partition exists for each day; call outside a transaction.
    public func ensure(days: Set<Int>, on connection: PostgresConnection) throws {
        let missing = known.withLock { days.subtracting($0) }
        guard !missing.isEmpty else { return }
        for day in missing.sorted() {
            try connection.withTransaction { connection in
                // Serializes creators across servers: CREATE TABLE IF NOT EXISTS alone can still
                // collide when two sessions create the same partition at once.
                try connection.query("SELECT pg_advisory_xact_lock(\(Int64(0x4164_5061_7274)))")
                let name = Self.name(ofDay: day)
                let exists = try connection.query("SELECT to_regclass(\(name)) IS NOT NULL AS present")
                if try !exists[0].decode("present", as: Bool.self) {
                    try connection.execute(unsafeSQL: """
                        CREATE TABLE \(name) PARTITION OF events
                        FOR VALUES FROM ('\(Self.dayText(day)) 00:00:00+00') TO ('\(Self.dayText(day + 1)) 00:00:00+00')
                        """)
                }
            }
            known.withLock { _ = $0.insert(day) }
        }
    }

    /// Drops the partitions of days before `oldestKeptDay`, each in one statement;
    /// returns the names dropped.
    public func drop(before oldestKeptDay: Int, on connection: PostgresConnection) throws -> [String] {
        let rows = try connection.query("""
            SELECT c.relname AS name FROM pg_inherits i
            JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
            WHERE p.relname = 'events' ORDER BY c.relname
            """)
        let cutoff = Self.name(ofDay: oldestKeptDay)
        var dropped: [String] = []
        for row in rows {
            let name: String = try row.decode("name")
            // Names are events_YYYYMMDD, so text order is date order.
            guard name.count == cutoff.count, name < cutoff else { continue }
            try connection.execute(unsafeSQL: "DROP TABLE IF EXISTS \(name)")
            dropped.append(name)
        }
        known.withLock { $0 = $0.filter { $0 >= oldestKeptDay } }
        return dropped
    }
}
