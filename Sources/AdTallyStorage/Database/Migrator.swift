import AdTallyCore
import Foundation
import Logging
import PostgresKit

/// One schema migration file, `NNNN_name.sql`.
public struct Migration: Sendable, Equatable {
    /// The number before the first underscore; files apply in this order.
    public var version: Int
    /// The file name, e.g. `0001_initial.sql`.
    public var fileName: String
    /// The SQL text.
    public var sql: String
    /// SHA-256 of the file's bytes, recorded when applied.
    public var checksum: String
    /// The file's first line is `-- adtally: outside-transaction`: its statements run one
    /// at a time outside a transaction (`CREATE INDEX CONCURRENTLY` cannot run inside
    /// one), each recorded once done, so a migration a crash cut midway is resumed at
    /// its first statement not done. Each statement ends with `;` at the end of a line.
    public var outsideTransaction: Bool { sql.hasPrefix(Self.outsideTransactionMark) }

    static let outsideTransactionMark = "-- adtally: outside-transaction"

    /// Files rewritten after they were released, with the checksums their earlier text
    /// had: a database that applied the earlier text is current. Only a rewrite that
    /// leaves the schema as the earlier text did belongs here.
    static let rewrites: [String: Set<String>] = [
        // Its four indexes built CONCURRENTLY (issue 41): the same indexes, without
        // holding ingest's compaction and the reports' rollups while they are built.
        "0013_export_grains.sql": ["0145de7390111fdd1952a38f51d97700b9870c0927d2a721ed26d72e0f983b89"],
    ]

    /// The statements of an outside-transaction migration, each without its `;`.
    var statements: [String] {
        var statements: [String] = []
        var current: [Substring] = []
        for line in sql.split(omittingEmptySubsequences: false, whereSeparator: \.isNewline) {
            let trimmed = line.trimmingCharacters(in: .whitespacesAndNewlines)
            if current.isEmpty && (trimmed.isEmpty || trimmed.hasPrefix("--")) { continue }
            current.append(line)
            if trimmed.hasSuffix(";") {
                statements.append(current.joined(separator: "\n").trimmingCharacters(in: .whitespacesAndNewlines).dropLastSemicolon())
                current = []
            }
        }
        let rest = current.joined(separator: "\n").trimmingCharacters(in: .whitespacesAndNewlines)
        if !rest.isEmpty { statements.append(rest) }
        return statements
    }

    /// Creates a migration from its file name and text.
    public init(fileName: String, sql: String) throws {
        let stem = fileName.hasSuffix(".sql") ? String(fileName.dropLast(4)) : fileName
        guard fileName.hasSuffix(".sql"), let underscore = stem.firstIndex(of: "_"),
              let version = Int(stem[..<underscore]), stem[..<underscore].count == 4,
              stem.index(after: underscore) < stem.endIndex
        else {
            throw MigrationError.badFileName(fileName)
        }
        self.version = version
        self.fileName = fileName
        self.sql = sql
        self.checksum = SHA256.hex(sql)
    }
}

/// Why migrations could not be loaded or applied.
public enum MigrationError: Error, CustomStringConvertible, Equatable {
    case badFileName(String)
    case duplicateVersion(Int, String, String)
    case directoryMissing(String)
    case editedAfterApply(fileName: String, recorded: String, current: String)
    case missingFile(version: Int, fileName: String)

    public var description: String {
        switch self {
        case .badFileName(let name):
            "migration file \(name) is not named NNNN_name.sql (four digits, an underscore, a name)"
        case .duplicateVersion(let version, let first, let second):
            "migrations \(first) and \(second) share version \(version)"
        case .directoryMissing(let path):
            "migrations folder \(path) does not exist (set ADTALLY_MIGRATIONS_DIR or --migrations-dir)"
        case .editedAfterApply(let name, let recorded, let current):
            "migration \(name) was edited after it was applied (recorded checksum \(recorded.prefix(12)), file now \(current.prefix(12))); add a new migration instead of changing an applied one"
        case .missingFile(let version, let name):
            "migration \(name) (version \(version)) is recorded as applied but its file is gone"
        }
    }
}

/// What the database holds compared with the migration files.
public struct MigrationStatus: Sendable, Equatable {
    /// Files not yet applied, in order.
    public var pending: [String]
    /// Whether every file is applied and unchanged.
    public var isCurrent: Bool { pending.isEmpty }
}

/// Applies `Migrations/*.sql` in order, each in its own transaction, recording a checksum.
///
/// Two runners at once are serialized by a PostgreSQL advisory lock, so several
/// servers starting together apply each file exactly once.
public struct Migrator: Sendable {
    /// The migrations, sorted by version.
    public let migrations: [Migration]
    private let logger: Logger

    /// Arbitrary but fixed: the advisory lock key all AdTally migrators share.
    static let lockKey: Int64 = 0x4164_5461_6C6C_79  // "AdTally"

    /// Uses the given migrations (sorted here).
    public init(migrations: [Migration], logger: Logger = Logger(label: "adtally.migrate")) throws {
        let sorted = migrations.sorted { $0.version < $1.version }
        for (previous, next) in zip(sorted, sorted.dropFirst()) where previous.version == next.version {
            throw MigrationError.duplicateVersion(next.version, previous.fileName, next.fileName)
        }
        self.migrations = sorted
        self.logger = logger
    }

    /// Loads every `*.sql` file of a folder.
    public init(directory: URL, logger: Logger = Logger(label: "adtally.migrate")) throws {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: directory.path, isDirectory: &isDirectory), isDirectory.boolValue else {
            throw MigrationError.directoryMissing(directory.path)
        }
        let names = try FileManager.default.contentsOfDirectory(atPath: directory.path).filter { $0.hasSuffix(".sql") }
        let migrations = try names.map { name in
            try Migration(fileName: name, sql: String(contentsOf: directory.appendingPathComponent(name), encoding: .utf8))
        }
        try self.init(migrations: migrations, logger: logger)
    }

    /// The folder to read migrations from: the explicit one, else `Migrations` of the
    /// source tree this binary was built from, else `./Migrations`.
    public static func defaultDirectory(explicit: String?) -> URL {
        if let explicit, !explicit.isEmpty { return URL(fileURLWithPath: explicit) }
        // The source tree: the nearest folder above this file with Package.swift (however
        // deep the file sits among the module's folders).
        var folder = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        for _ in 0..<8 {
            let migrations = folder.appendingPathComponent("Migrations")
            if FileManager.default.fileExists(atPath: folder.appendingPathComponent("Package.swift").path),
               FileManager.default.fileExists(atPath: migrations.path) {
                return migrations
            }
            folder = folder.deletingLastPathComponent()
        }
        return URL(fileURLWithPath: FileManager.default.currentDirectoryPath).appendingPathComponent("Migrations")
    }

    /// Applies what is pending and returns the names of the files applied now.
    @discardableResult
    public func migrate(_ pool: PostgresPool) async throws -> [String] {
        let migrations = self.migrations
        let logger = self.logger
        // Nothing pending (every CLI command and server start asks): no lock is taken, so a
        // long migration elsewhere is neither waited for nor disturbed.
        if try await status(pool).isCurrent { return [] }
        return try await pool.withConnection { connection in
            // A migration that rewrites a large table may take longer than the pool's
            // statement timeout.
            let timeout = try connection.query("SELECT current_setting('statement_timeout')")[0].decode(0, as: String.self)
            try connection.query("SELECT set_config('statement_timeout', '0', false)")
            defer { _ = try? connection.query("SELECT set_config('statement_timeout', \(timeout), false)") }
            // Another migrator is waited for by asking again, not in a blocking call: a
            // backend blocked in pg_advisory_lock holds a snapshot, which a CREATE INDEX
            // CONCURRENTLY of the running migrator waits for: a deadlock PostgreSQL ends
            // by cancelling the build.
            while try !connection.query("SELECT pg_try_advisory_lock(\(Self.lockKey))")[0].decode(0, as: Bool.self) {
                usleep(200_000)
            }
            defer { _ = try? connection.query("SELECT pg_advisory_unlock(\(Self.lockKey))") }
            try Self.createLedger(connection)
            let applied = try Self.appliedChecksums(connection)
            try Self.verify(applied: applied, against: migrations)
            var appliedNow: [String] = []
            for migration in migrations where applied[migration.version] == nil {
                if migration.outsideTransaction {
                    try Self.applyOutsideTransaction(migration, on: connection, logger: logger)
                } else {
                    try connection.withTransaction { connection in
                        try connection.execute(unsafeSQL: migration.sql)
                        try connection.query("""
                            INSERT INTO schema_migrations (version, file_name, checksum)
                            VALUES (\(migration.version), \(migration.fileName), \(migration.checksum))
                            """)
                    }
                }
                logger.info("applied migration", metadata: ["file": "\(migration.fileName)"])
                appliedNow.append(migration.fileName)
            }
            return appliedNow
        }
    }

    /// Compares the database with the files without changing anything.
    public func status(_ pool: PostgresPool) async throws -> MigrationStatus {
        let migrations = self.migrations
        return try await pool.withConnection { connection in
            let exists = try connection.query("SELECT to_regclass('schema_migrations') IS NOT NULL AS present")
            guard try exists[0].decode("present", as: Bool.self) else {
                return MigrationStatus(pending: migrations.map(\.fileName))
            }
            let applied = try Self.appliedChecksums(connection)
            try Self.verify(applied: applied, against: migrations)
            return MigrationStatus(pending: migrations.filter { applied[$0.version] == nil }.map(\.fileName))
        }
    }

    private static func createLedger(_ connection: PostgresConnection) throws {
        try connection.execute(unsafeSQL: """
            CREATE TABLE IF NOT EXISTS schema_migrations (
                version    integer PRIMARY KEY,
                file_name  text NOT NULL,
                checksum   text NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now()
            );
            -- The statements of an outside-transaction migration done so far.
            CREATE TABLE IF NOT EXISTS schema_migration_steps (
                version   integer NOT NULL,
                step      integer NOT NULL,
                statement text NOT NULL,
                done_at   timestamptz NOT NULL DEFAULT now(),
                PRIMARY KEY (version, step)
            )
            """)
    }

    /// Runs an outside-transaction migration's statements not yet done, one at a time,
    /// recording each; then records the migration. An index a crash (or a failure) left
    /// half built — `CREATE INDEX CONCURRENTLY` leaves it INVALID — is dropped and built
    /// again; one already built whole is kept.
    static func applyOutsideTransaction(_ migration: Migration, on connection: PostgresConnection, logger: Logger) throws {
        var done = Set<Int>()
        for row in try connection.query("SELECT step FROM schema_migration_steps WHERE version = \(migration.version)") {
            done.insert(try row.decode(0, as: Int.self))
        }
        for (step, statement) in migration.statements.enumerated() where !done.contains(step + 1) {
            if let index = concurrentIndexName(statement) {
                let found = try connection.query("""
                    SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
                    WHERE c.relname = \(index) AND c.relnamespace = current_schema()::regnamespace
                    """)
                if let valid = try found.first?.decode(0, as: Bool.self) {
                    if valid {
                        logger.info("index already built", metadata: ["file": "\(migration.fileName)", "index": "\(index)"])
                    } else {
                        logger.warning("dropping an index a failed or cut migration left half built", metadata: ["file": "\(migration.fileName)", "index": "\(index)"])
                        try connection.execute(unsafeSQL: "DROP INDEX CONCURRENTLY IF EXISTS \"\(index)\"")
                    }
                }
                if try found.first?.decode(0, as: Bool.self) != true {
                    let started = ContinuousClock.now
                    try connection.execute(unsafeSQL: statement)
                    logger.info("index built", metadata: ["file": "\(migration.fileName)", "index": "\(index)", "seconds": "\(ContinuousClock.now - started)"])
                }
                try connection.query("INSERT INTO schema_migration_steps (version, step, statement) VALUES (\(migration.version), \(step + 1), \(statement))")
            } else if Self.refusesTransaction(statement) {
                // CONCURRENTLY (an index without a name, a DROP or REINDEX), VACUUM: run alone, then recorded.
                try connection.execute(unsafeSQL: statement)
                try connection.query("INSERT INTO schema_migration_steps (version, step, statement) VALUES (\(migration.version), \(step + 1), \(statement))")
            } else {
                // Any other statement and its record commit together: a crash between them
                // cannot run it twice.
                try connection.withTransaction { connection in
                    try connection.execute(unsafeSQL: statement)
                    try connection.query("INSERT INTO schema_migration_steps (version, step, statement) VALUES (\(migration.version), \(step + 1), \(statement))")
                }
            }
        }
        try connection.withTransaction { connection in
            try connection.query("""
                INSERT INTO schema_migrations (version, file_name, checksum)
                VALUES (\(migration.version), \(migration.fileName), \(migration.checksum))
                """)
            try connection.query("DELETE FROM schema_migration_steps WHERE version = \(migration.version)")
        }
    }

    /// A statement PostgreSQL runs only outside a transaction block.
    static func refusesTransaction(_ statement: String) -> Bool {
        let upper = statement.uppercased()
        let first = upper.split(whereSeparator: { $0 == " " || $0 == "\n" || $0 == "\t" || $0 == "\r" }).first ?? ""
        return upper.contains("CONCURRENTLY") || first == "VACUUM" || first == "REINDEX"
    }

    /// The index a `CREATE [UNIQUE] INDEX CONCURRENTLY [IF NOT EXISTS] name ON …` builds.
    static func concurrentIndexName(_ statement: String) -> String? {
        let written = statement.split(whereSeparator: { $0 == " " || $0 == "\n" || $0 == "\t" || $0 == "\r" }).map(String.init)
        let words = written.map { $0.lowercased() }
        guard words.first == "create", let index = words.firstIndex(of: "index"), index <= 2,
              words.count > index + 2, words[index + 1] == "concurrently" else { return nil }
        var name = index + 2
        if words.count > name + 3, words[name] == "if", words[name + 1] == "not", words[name + 2] == "exists" { name += 3 }
        guard name < words.count, words[name] != "on" else { return nil }
        // A quoted name keeps its case; an unquoted one is folded to lower case, as PostgreSQL does.
        let name_ = written[name]
        return name_.hasPrefix("\"") ? name_.trimmingCharacters(in: CharacterSet(charactersIn: "\"")) : name_.lowercased()
    }

    private static func appliedChecksums(_ connection: PostgresConnection) throws -> [Int: (name: String, checksum: String)] {
        var applied: [Int: (name: String, checksum: String)] = [:]
        for row in try connection.query("SELECT version, file_name, checksum FROM schema_migrations") {
            applied[try row.decode("version")] = (try row.decode("file_name"), try row.decode("checksum"))
        }
        return applied
    }

    private static func verify(applied: [Int: (name: String, checksum: String)], against migrations: [Migration]) throws {
        let byVersion = Dictionary(uniqueKeysWithValues: migrations.map { ($0.version, $0) })
        for (version, record) in applied.sorted(by: { $0.key < $1.key }) {
            guard let migration = byVersion[version] else {
                throw MigrationError.missingFile(version: version, fileName: record.name)
            }
            if migration.checksum != record.checksum && !(Migration.rewrites[migration.fileName]?.contains(record.checksum) ?? false) {
                throw MigrationError.editedAfterApply(fileName: migration.fileName, recorded: record.checksum, current: migration.checksum)
            }
        }
    }
}

extension String {
    fileprivate func dropLastSemicolon() -> String {
        hasSuffix(";") ? String(dropLast()) : self
    }
}
