import AdTallyCore
@testable import AdTallyStorage
import AdTallyTestSupport
import Foundation
import PostgresKit
import Testing

@Suite("Past one machine")
struct ScalingTests {
    static var setupFile: URL {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("deploy/citus-setup.sql")
    }

    /// The names a pattern's first group matches in `text`.
    static func names(_ pattern: String, in text: String) throws -> Set<String> {
        let regex = try NSRegularExpression(pattern: pattern)
        return Set(regex.matches(in: text, range: NSRange(text.startIndex..., in: text)).compactMap { match in
            Range(match.range(at: 1), in: text).map { String(text[$0]) }
        })
    }

    @Test("deploy/citus-setup.sql distributes every per-app table by app_id, co-located, and says where every other table lives")
    func citusSetupCoversTheSchema() async throws {
        let setup = try String(contentsOf: Self.setupFile, encoding: .utf8)
        let distributed = try Self.names(#"pg_temp\.place\('([a-z0-9_]+)', 'distributed'\)"#, in: setup)
        let reference = try Self.names(#"pg_temp\.place\('([a-z0-9_]+)', 'reference'\)"#, in: setup)
        let local = Set(try Self.names(#"-- local: ([a-z0-9_, ]+)"#, in: setup).flatMap { $0.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) } })
        #expect(distributed.isDisjoint(with: reference) && distributed.isDisjoint(with: local) && reference.isDisjoint(with: local))
        try await TestDatabase.withPool { pool in
            _ = try await Migrator(directory: Migrator.defaultDirectory(explicit: nil)).migrate(pool)
            // Every table of the schema (partitions are their parent's), whether it has an
            // app_id, and whether its primary key leads with it.
            let rows = try await pool.query("""
                SELECT c.relname::text,
                       EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'app_id' AND NOT a.attisdropped),
                       coalesce((SELECT a.attname = 'app_id' FROM pg_index i JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = i.indkey[0]
                                 WHERE i.indrelid = c.oid AND i.indisprimary), false),
                       coalesce((SELECT a.attcollation = (SELECT attcollation FROM pg_attribute WHERE attrelid = 'events'::regclass AND attname = 'app_id')
                                 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'app_id'), true)
                FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p') AND NOT c.relispartition
                """)
            var tables = Set<String>()
            for row in rows {
                let (name, hasApp, keyLeads) = (try row.decode(0, as: String.self), try row.decode(1, as: Bool.self), try row.decode(2, as: Bool.self))
                let sameCollation = try row.decode(3, as: Bool.self)
                tables.insert(name)
                if hasApp && name != "api_keys" {
                    #expect(distributed.contains(name) || name == "apps", "\(name) has app_id but is not distributed by it")
                }
                if distributed.contains(name) {
                    #expect(sameCollation, "\(name).app_id must have events.app_id's collation: Citus co-locates only equal collations")
                }
                // (The delta tables have no key: they are appended to and emptied whole.)
                if distributed.contains(name) && !["events", "rollup_delta", "install_delta"].contains(name) {
                    #expect(keyLeads, "\(name): its primary key must lead with app_id (Citus needs the distribution column in every unique key)")
                }
                #expect(distributed.contains(name) || reference.contains(name) || local.contains(name), "\(name) is not placed by deploy/citus-setup.sql")
            }
            let named = distributed.union(reference).union(local)
            #expect(named.subtracting(tables).isEmpty, "deploy/citus-setup.sql names tables the schema does not have: \(named.subtracting(tables).sorted())")
        }
    }

    @Test("only on Citus is a report's rollup UNION joined to apps: on one node that join misleads the planner (a demo report of all apps took 6 s instead of 0.15 s)")
    func appsJoinOnlyOnCitus() throws {
        let readable = [ReportApp(id: "a", timezone: "Asia/Tokyo", currency: "JPY"), ReportApp(id: "b", timezone: "UTC", currency: "USD")]
        let query = try ReportQuery.parse([("days", "30"), ("dimensions", "date,network"), ("metrics", "requests,revenue")], readable: readable, isAdmin: true)
        #expect(!ReportPlan(query).grouped().sql.contains("JOIN apps AS known"))
        #expect(ReportPlan(query, distributed: true).grouped().sql.contains("JOIN apps AS known ON known.app_id = s.app_id"))
    }

    @Test("a duplicate ledger key that Citus reports from a worker's COPY (XX000) is known as one, in any server language")
    func citusDuplicateKeyIsRecognised() {
        // As Citus 12.1 raised it on a three-node cluster (make test-citus's), then as a
        // worker with lc_messages = 'de_DE' words it, then an unrelated internal error.
        let english = PostgresError(kind: .server, sqlState: SQLState(rawValue: "XX000"), message: #"duplicate key value violates unique constraint "event_ids_pkey_102049""#)
        let german = PostgresError(kind: .server, sqlState: SQLState(rawValue: "XX000"), message: #"doppelter Schlüsselwert verletzt Unique-Constraint »event_ids_pkey_102049«"#)
        let other = PostgresError(kind: .server, sqlState: SQLState(rawValue: "XX000"), message: "could not connect to the worker")
        #expect(EventStore.isCitusDuplicateKey(english))
        #expect(EventStore.isCitusDuplicateKey(german))
        #expect(!EventStore.isCitusDuplicateKey(other))
    }

    /// The Citus coordinator `make test-citus` migrated and ran deploy/citus-setup.sql on.
    static let citusDatabase = ProcessInfo.processInfo.environment["ADTALLY_CITUS_DATABASE_URL"]

    @Test(
        "On a real Citus cluster, every table with app_id is hash-distributed by it in events' co-location group on the workers, and every other table is placed as the setup script says",
        .enabled(if: citusDatabase != nil, "runs under make test-citus, on a migrated three-node cluster")
    )
    func citusPlacementIsReal() async throws {
        let setup = try String(contentsOf: Self.setupFile, encoding: .utf8)
        let reference = try Self.names(#"pg_temp\.place\('([a-z0-9_]+)', 'reference'\)"#, in: setup)
        let local = Set(try Self.names(#"-- local: ([a-z0-9_, ]+)"#, in: setup).flatMap { $0.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) } })
        let database = try #require(Self.citusDatabase)
        // Every table of the schema, partitions included, with what Citus made of it:
        // method (h: hash-distributed, n: reference; none: not Citus's), the distribution
        // column, the co-location group, and on how many worker nodes its shards lie.
        let rows = try await runSQL(database, ["""
            SELECT c.relname::text, c.relispartition,
                   EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'app_id' AND NOT a.attisdropped),
                   coalesce(p.partmethod::text, 'none'),
                   coalesce(CASE WHEN p.partmethod = 'h' THEN column_to_column_name(p.logicalrelid, p.partkey) END, ''),
                   coalesce(p.colocationid, -1) = coalesce((SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'events'::regclass), -2),
                   (SELECT count(DISTINCT (n.nodename, n.nodeport)) FROM pg_dist_shard s JOIN pg_dist_placement pl USING (shardid)
                      JOIN pg_dist_node n USING (groupid) WHERE s.logicalrelid = c.oid AND n.groupid <> 0)::int
            FROM pg_class c LEFT JOIN pg_dist_partition p ON p.logicalrelid = c.oid
            WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')
            """])
        let workers = try await runSQL(database, ["SELECT count(*) FROM pg_dist_node WHERE groupid <> 0 AND isactive AND noderole = 'primary'"])
            .first?.first.flatMap { $0.flatMap(Int.init) } ?? 0
        #expect(workers == 2, "the cluster has two workers")
        var seen = Set<String>()
        for row in rows {
            // As text: booleans are t / f.
            let name = row[0] ?? "", isPartition = row[1] == "t", hasApp = row[2] == "t", method = row[3] ?? ""
            let column = row[4] ?? "", withEvents = row[5] == "t", nodes = Int(row[6] ?? "") ?? 0
            seen.insert(name)
            if hasApp && name != "apps" && name != "api_keys" {
                #expect(method == "h" && column == "app_id", "\(name)\(isPartition ? " (a partition)" : ""): has app_id, but Citus holds it as \(method) by '\(column)', not hash-distributed by app_id")
                #expect(withEvents, "\(name): not in events' co-location group, so a single-app report joining it leaves one worker")
                #expect(nodes == workers, "\(name): its shards lie on \(nodes) of the \(workers) workers")
            } else if reference.contains(name) {
                #expect(method == "n", "\(name): the setup script makes it a reference table; Citus holds it as \(method)")
                #expect(nodes == workers, "\(name): a reference table on \(nodes) of the \(workers) workers")
            } else {
                #expect(local.contains(name) && method == "none", "\(name): neither per-app nor reference nor named local by the setup script (Citus: \(method))")
            }
        }
        #expect(seen.contains("events") && seen.count > 20, "the coordinator holds the migrated schema")
        // A single-app read of events is routed to one shard on one worker.
        let plan = try await runSQL(database, ["EXPLAIN SELECT count(*) FROM events WHERE app_id = 'any-app'"]).compactMap { $0.first ?? nil }
        #expect(plan.contains { $0.contains("Task Count: 1") } && plan.contains { $0.contains("Custom Scan (Citus Adaptive)") }, "plan: \(plan)")
    }
}
