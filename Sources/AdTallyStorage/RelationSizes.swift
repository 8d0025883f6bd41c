import PostgresKit

/// Table sizes that mean the data's size on Citus too: there a distributed table's
/// own relation on the coordinator is an empty shell (704 kB said for 31 MB of events),
/// and its rows live in shards on the workers, which `citus_*_relation_size` sum.
enum RelationSizes {
    /// Whether this database has Citus (its size functions exist).
    static func hasCitus(_ connection: PostgresConnection) throws -> Bool {
        try connection.query("SELECT to_regprocedure('citus_relation_size(regclass)') IS NOT NULL").first?.decode(0, as: Bool.self) ?? false
    }

    /// SQL of a relation's size (`oid` a regclass expression): its own, or with Citus and
    /// the relation distributed or a reference table, its shards'. `total`: with indexes
    /// and TOAST (`pg_total_relation_size`), else the main fork (`pg_relation_size`).
    static func sql(_ oid: String, total: Bool, citus: Bool) -> String {
        let plain = total ? "pg_total_relation_size(\(oid))" : "pg_relation_size(\(oid))"
        guard citus else { return plain }
        let sharded = total ? "citus_total_relation_size(\(oid))" : "citus_relation_size(\(oid))"
        // Every Citus table (distributed, reference, Citus-local) keeps its rows in shards.
        return "CASE WHEN EXISTS (SELECT 1 FROM pg_dist_partition p WHERE p.logicalrelid = \(oid)) THEN \(sharded) ELSE \(plain) END"
    }
}
