import AdTallyStorage
import AdTallyTestSupport
import Foundation
import PostgresKit
import Testing

@Suite("Migrations")
struct MigrationTests {
    static let files = [
        ("0001_first.sql", "CREATE TABLE first (id int PRIMARY KEY);"),
        ("0002_second.sql", "CREATE TABLE second (id int PRIMARY KEY); INSERT INTO second VALUES (1), (2);"),
    ]

    func migrator(_ files: [(String, String)]) throws -> Migrator {
        try Migrator(migrations: files.map { try Migration(fileName: $0.0, sql: $0.1) })
    }

    @Test("migrations apply in order once; running again applies nothing")
    func idempotent() async throws {
        try await TestDatabase.withPool { pool in
            let migrator = try migrator(Self.files)
            #expect(try await migrator.status(pool).pending == ["0001_first.sql", "0002_second.sql"])
            #expect(try await migrator.migrate(pool) == ["0001_first.sql", "0002_second.sql"])
            #expect(try await migrator.migrate(pool) == [])
            #expect(try await migrator.status(pool).isCurrent)
            let rows = try await pool.query("SELECT count(*)::int AS n FROM second")
            #expect(try rows[0].decode("n", as: Int.self) == 2)
        }
    }

    @Test("an applied file that was edited is refused, naming it")
    func editedFileRefused() async throws {
        try await TestDatabase.withPool { pool in
            try await migrator(Self.files).migrate(pool)
            var edited = Self.files
            edited[1].1 += "\n-- an innocent-looking edit"
            let error = await #expect(throws: MigrationError.self) { try await migrator(edited).migrate(pool) }
            #expect(error?.description.contains("0002_second.sql") == true)
            #expect(error?.description.contains("edited") == true)
        }
    }

    @Test("a failing migration rolls back alone and is not recorded")
    func failingMigrationRollsBack() async throws {
        try await TestDatabase.withPool { pool in
            let broken = Self.files + [("0003_broken.sql", "CREATE TABLE third (id int); SELECT no_such_function();")]
            await #expect(throws: PostgresError.self) { try await migrator(broken).migrate(pool) }
            let rows = try await pool.query("""
                SELECT to_regclass('third') IS NULL AS third_absent, (SELECT count(*)::int FROM schema_migrations) AS applied
                """)
            #expect(try rows[0].decode("third_absent", as: Bool.self))
            #expect(try rows[0].decode("applied", as: Int.self) == 2)
        }
    }

    @Test("concurrent runners are serialized: each file applies exactly once")
    func concurrentRunners() async throws {
        try await TestDatabase.withDatabase { conninfo in
            let migrator = try migrator(Self.files)
            let applied = try await withThrowingTaskGroup(of: [String].self) { group in
                for _ in 0..<6 {
                    group.addTask {
                        let pool = PostgresPool(configuration: .init(conninfo: conninfo, maxConnections: 1))
                        let applied = try await migrator.migrate(pool)
                        await pool.shutdown()
                        return applied
                    }
                }
                return try await group.reduce([], +)
            }
            #expect(applied.sorted() == ["0001_first.sql", "0002_second.sql"])
        }
    }

    @Test("file names must be NNNN_name.sql and versions unique")
    func fileNamesChecked() throws {
        #expect(throws: MigrationError.self) { try Migration(fileName: "1_short.sql", sql: "") }
        #expect(throws: MigrationError.self) { try Migration(fileName: "0001.sql", sql: "") }
        #expect(throws: MigrationError.self) {
            try Migrator(migrations: [try Migration(fileName: "0001_a.sql", sql: ""), try Migration(fileName: "0001_b.sql", sql: "")])
        }
    }

    @Test("the project's own migrations apply cleanly and leave app_id leading every per-app key")
    func projectMigrationsApply() async throws {
        try await TestDatabase.withPool { pool in
            let migrator = try Migrator(directory: Migrator.defaultDirectory(explicit: nil))
            #expect(!migrator.migrations.isEmpty)
            try await migrator.migrate(pool)
            #expect(try await migrator.status(pool).isCurrent)
            // Every primary key and unique index on a table with an app_id column starts with app_id.
            let rows = try await pool.query("""
                SELECT c.relname AS index_name, a.attname AS first_column
                FROM pg_index i
                JOIN pg_class c ON c.oid = i.indexrelid
                JOIN pg_class t ON t.oid = i.indrelid
                JOIN pg_namespace n ON n.oid = t.relnamespace AND n.nspname = 'public'
                JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = i.indkey[0]
                WHERE EXISTS (SELECT 1 FROM pg_attribute x WHERE x.attrelid = t.oid AND x.attname = 'app_id')
                  AND t.relname NOT IN ('apps', 'api_keys') AND NOT t.relispartition
                  AND (i.indisunique OR i.indisprimary)
                """)
            #expect(!rows.isEmpty)
            for row in rows {
                let index = try row.decode("index_name", as: String.self)
                #expect(try row.decode("first_column", as: String.self) == "app_id", "index \(index)")
            }
        }
    }
}
