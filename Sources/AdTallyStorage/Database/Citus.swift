import PostgresKit

/// What differs when the database is a Citus coordinator, asked in one way everywhere:
/// reports (ReportEngine.prepare), table sizes (adtally status) and the compactor.
enum Citus {
    /// SQL that is true when Citus is installed in this database (its catalog exists).
    static let installedSQL = "to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL"

    /// Whether Citus is installed in this database.
    static func isInstalled(_ connection: PostgresConnection) throws -> Bool {
        try connection.query("SELECT \(unsafeRaw: installedSQL)").first?.decode(0, as: Bool.self) ?? false
    }

    /// SQL of a relation's size (`oid` a regclass expression) that means the data's size
    /// on Citus too: there a distributed table's own relation on the coordinator is an
    /// empty shell (704 kB said for 31 MB of events) and its rows live in shards, which
    /// `citus_*_relation_size` sum. `total`: with indexes and TOAST
    /// (`pg_total_relation_size`), else the main fork (`pg_relation_size`).
    static func sizeSQL(_ oid: String, total: Bool, citus: Bool) -> String {
        let plain = total ? "pg_total_relation_size(\(oid))" : "pg_relation_size(\(oid))"
        guard citus else { return plain }
        let sharded = total ? "citus_total_relation_size(\(oid))" : "citus_relation_size(\(oid))"
        // Every Citus table (distributed, reference, Citus-local) keeps its rows in shards.
        return "CASE WHEN EXISTS (SELECT 1 FROM pg_dist_partition p WHERE p.logicalrelid = \(oid)) THEN \(sharded) ELSE \(plain) END"
    }

    /// A table's main fork in bytes: one statement on one node (the question rides along
    /// with the plain size), a second for the shards' size only on Citus.
    static func mainForkBytes(_ table: String, on connection: PostgresConnection) throws -> Int64 {
        let oid = "'\(table)'::regclass"
        let row = try connection.query("SELECT \(unsafeRaw: installedSQL), \(unsafeRaw: sizeSQL(oid, total: false, citus: false))")[0]
        guard try row.decode(0, as: Bool.self) else { return try row.decode(1, as: Int64.self) }
        return try connection.query("SELECT (\(unsafeRaw: sizeSQL(oid, total: false, citus: true)))::bigint")[0].decode(0, as: Int64.self)
    }
}
