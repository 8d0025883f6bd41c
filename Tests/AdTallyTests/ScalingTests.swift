import AdTallyStorage
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
        let distributed = try Self.names(#"create_distributed_table\('([a-z0-9_]+)', 'app_id'"#, in: setup)
        let reference = try Self.names(#"create_reference_table\('([a-z0-9_]+)'\)"#, in: setup)
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
                if distributed.contains(name) && name != "events" && name != "rollup_delta" {
                    #expect(keyLeads, "\(name): its primary key must lead with app_id (Citus needs the distribution column in every unique key)")
                }
                #expect(distributed.contains(name) || reference.contains(name) || local.contains(name), "\(name) is not placed by deploy/citus-setup.sql")
            }
            let named = distributed.union(reference).union(local)
            #expect(named.subtracting(tables).isEmpty, "deploy/citus-setup.sql names tables the schema does not have: \(named.subtracting(tables).sorted())")
        }
    }
}
