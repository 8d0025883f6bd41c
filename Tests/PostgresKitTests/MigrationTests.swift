@testable import AdTallyStorage
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

    @Test("an outside-transaction migration builds its index CONCURRENTLY; one cut midway is resumed: its done statements are not run again, a half-built index is dropped and built again")
    func outsideTransactionResumes() async throws {
        try await TestDatabase.withPool { pool in
            let base = [("0001_table.sql", "CREATE TABLE t (v int); CREATE TABLE runs (n int); INSERT INTO t VALUES (1), (1), (2);")]
            let concurrent = ("0002_index.sql", """
                -- adtally: outside-transaction
                -- A statement that must run once, then an index that fails while t holds a duplicate.
                INSERT INTO runs VALUES (1);
                CREATE UNIQUE INDEX CONCURRENTLY t_v
                    ON t (v);
                CREATE INDEX CONCURRENTLY IF NOT EXISTS runs_n ON runs (n);
                CREATE INDEX CONCURRENTLY ON t (v);
                """)
            #expect(try Migration(fileName: concurrent.0, sql: concurrent.1).statements.count == 4)
            try await migrator(base).migrate(pool)
            // The build fails as a crash midway would leave it: an INVALID index, the first
            // statement done, the migration not recorded.
            await #expect(throws: PostgresError.self) { try await migrator(base + [concurrent]).migrate(pool) }
            let half = try await pool.query("SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = 't_v'")
            #expect(try half.first?.decode(0, as: Bool.self) == false)
            #expect(try await migrator(base + [concurrent]).status(pool).pending == ["0002_index.sql"])

            try await pool.query("DELETE FROM t WHERE v = 1")
            #expect(try await migrator(base + [concurrent]).migrate(pool) == ["0002_index.sql"])
            let rows = try await pool.query("""
                SELECT (SELECT count(*)::int FROM runs), (SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = 't_v'),
                       to_regclass('runs_n') IS NOT NULL, (SELECT count(*)::int FROM schema_migration_steps)
                """)
            #expect(try rows[0].decode(0, as: Int.self) == 1)
            #expect(try rows[0].decode(1, as: Bool.self) == true)
            #expect(try rows[0].decode(2, as: Bool.self))
            #expect(try rows[0].decode(3, as: Int.self) == 0)
            #expect(try await migrator(base + [concurrent]).migrate(pool) == [])
        }
    }

    @Test("a second migrator started while the first builds an index CONCURRENTLY waits without holding a snapshot: both finish, the index valid (a blocked pg_advisory_lock was a deadlock that cancelled the build)")
    func secondMigratorDuringConcurrentBuild() async throws {
        try await TestDatabase.withDatabase { conninfo in
            let files = [
                ("0001_table.sql", "CREATE TABLE t (v int); INSERT INTO t SELECT generate_series(1, 100000);"),
                ("0002_index.sql", "-- adtally: outside-transaction\nSELECT pg_sleep(1.5);\nCREATE INDEX CONCURRENTLY t_v ON t (v);\n"),
            ]
            let setup = PostgresPool(configuration: .init(conninfo: conninfo, maxConnections: 1))
            try await migrator(Array(files.prefix(1))).migrate(setup)
            let migrator = try migrator(files)
            let applied = try await withThrowingTaskGroup(of: [String].self) { group in
                for delay in [0, 500] {
                    group.addTask {
                        try await Task.sleep(for: .milliseconds(delay))
                        let pool = PostgresPool(configuration: .init(conninfo: conninfo, maxConnections: 1))
                        defer { Task { await pool.shutdown() } }
                        return try await migrator.migrate(pool)
                    }
                }
                return try await group.reduce([], +)
            }
            #expect(applied == ["0002_index.sql"])
            let valid = try await setup.query("SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = 't_v'")
            #expect(try valid.first?.decode(0, as: Bool.self) == true)
            await setup.shutdown()
        }
    }

    @Test("a file rewritten on purpose (0013's indexes built CONCURRENTLY) is current where its earlier text was applied; any other edit is still refused")
    func knownRewriteAccepted() async throws {
        try await TestDatabase.withPool { pool in
            let folder = Migrator.defaultDirectory(explicit: nil)
            let current = try Migrator(directory: folder)
            try await current.migrate(pool)
            // As a database that applied 0013 before it was rewritten records it.
            let earlier = try #require(Migration.rewrites["0013_export_grains.sql"]?.first)
            try await pool.query("UPDATE schema_migrations SET checksum = \(earlier) WHERE version = 13")
            #expect(try await current.status(pool).isCurrent)
            try await pool.query("UPDATE schema_migrations SET checksum = 'something else' WHERE version = 13")
            await #expect(throws: MigrationError.self) { try await current.status(pool) }
        }
    }

    @Test("the statements of an outside-transaction file and the index each builds")
    func statementsSplit() throws {
        #expect(Migrator.concurrentIndexName("CREATE INDEX CONCURRENTLY a_b ON t (x)") == "a_b")
        #expect(Migrator.concurrentIndexName("create unique index concurrently if not exists \"q\" on t (x)") == "q")
        #expect(Migrator.concurrentIndexName("CREATE INDEX a_b ON t (x)") == nil)
        #expect(Migrator.concurrentIndexName("CREATE INDEX CONCURRENTLY ON t (x)") == nil)
        #expect(Migrator.concurrentIndexName("INSERT INTO t VALUES (1)") == nil)
        #expect(Migrator.concurrentIndexName("CREATE INDEX CONCURRENTLY \"MixedCase\" ON t (x)") == "MixedCase")
        #expect(Migrator.concurrentIndexName("CREATE INDEX CONCURRENTLY Folded ON t (x)") == "folded")
        #expect(try Migration(fileName: "0009_x.sql", sql: "-- adtally: outside-transaction\r\nSELECT 1;\r\nSELECT 2;\r\n").statements == ["SELECT 1", "SELECT 2"])
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
