import AdTallyCore
import PostgresKit

/// Time zones as PostgreSQL knows them: it computes every local day, so a zone that
/// Foundation knows and PostgreSQL does not (`US/Pacific-New`, dropped from the tz
/// database) must be refused when it is given, not fail every report or export later.
public enum DatabaseTimeZones {
    /// Whether `zone` is one of `pg_timezone_names` (IANA names, not abbreviations
    /// or POSIX strings).
    public static func isKnown(_ zone: String, pool: PostgresPool) async throws -> Bool {
        guard zone.utf8.count <= 64, !zone.utf8.contains(0) else { return false }
        let rows = try await pool.query("SELECT EXISTS (SELECT 1 FROM pg_timezone_names WHERE name = \(zone))")
        return try rows.first?.decode(0, as: Bool.self) ?? false
    }

    /// Throws a `FieldError` for `field` unless PostgreSQL knows `zone`.
    public static func check(_ zone: String, field: String, pool: PostgresPool) async throws {
        guard try await isKnown(zone, pool: pool) else {
            throw FieldError(field, "\"\(zone)\" is not a time zone this database knows (pg_timezone_names), e.g. Europe/Berlin, America/New_York, UTC")
        }
    }
}
