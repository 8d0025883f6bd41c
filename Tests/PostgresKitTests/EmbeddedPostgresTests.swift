import AdTallyCore
import AdTallyStorage
import AdTallyTestSupport
import Foundation
import PostgresKit
import Testing

@Suite("Embedded PostgreSQL cluster")
struct EmbeddedPostgresTests {
    @Test("starts on first use, is reused when running, survives a pool across a restart, and stops")
    func lifecycle() async throws {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("adtally-embedded-\(UUID().uuidString.prefix(8))")
        defer { try? FileManager.default.removeItem(at: folder) }
        let cluster = try EmbeddedPostgres(dataDirectory: folder)
        // initdb and pg_ctl block for seconds: on threads of their own, not the
        // cooperative ones every other test's server needs.
        #expect(try await onOwnThread { try cluster.start() } == true)
        defer { try? cluster.stop() }
        #expect(try cluster.isRunning())

        // A second user of the same folder (another CLI process, say) reuses it.
        let second = try EmbeddedPostgres(dataDirectory: folder)
        #expect(try await onOwnThread { try second.start() } == false)

        let pool = PostgresPool(configuration: .init(conninfo: cluster.conninfo, maxConnections: 2))
        let before = try await pool.query("SELECT current_database() AS db, pg_backend_pid() AS pid")
        #expect(try before[0].decode("db", as: String.self) == "adtally")
        // No TCP listener unless asked for.
        let listen = try await pool.query("SELECT current_setting('listen_addresses') AS l")
        #expect(try listen[0].decode("l", as: String.self) == "")

        // Restart the server under the pool: the pool notices and reconnects.
        try await onOwnThread { try cluster.stop() }
        #expect(try cluster.isRunning() == false)
        #expect(try await onOwnThread { try cluster.start() } == true)
        let after = try await pool.query("SELECT pg_backend_pid() AS pid")
        #expect(try after[0].decode("pid", as: Int32.self) != before[0].decode("pid", as: Int32.self))
        await pool.shutdown()

        // Whoever started it stops it, but not while another client still uses it.
        var otherClient: PostgresConnection? = try PostgresConnection(connecting: cluster.conninfo)
        #expect(try await onOwnThread { try cluster.stopIfUnused() } == false)
        #expect(try cluster.isRunning())
        _ = otherClient?.backendPID
        otherClient = nil
        #expect(try await onOwnThread { try cluster.stopIfUnused() } == true)
        #expect(try cluster.isRunning() == false)
    }

    @Test("missing server programs give an error naming the Debian package")
    func missingBinaries() throws {
        let error = #expect(throws: EmbeddedPostgresError.self) {
            try EmbeddedPostgres(dataDirectory: URL(fileURLWithPath: "/tmp/unused"), serverRoot: "/nonexistent", binarySearchPaths: ["/nonexistent/bin"])
        }
        #expect(error?.description.contains("apt-get install postgresql") == true)
    }
}

@Suite("Embedded PostgreSQL cluster: nobody else gets in")
struct EmbeddedPostgresSecurityTests {
    @Test("over TCP a password is required; it is generated and kept in a file only its owner reads")
    func passwordOverTCP() async throws {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("adtally-embedded-\(UUID().uuidString.prefix(8))")
        defer { try? FileManager.default.removeItem(at: folder) }
        let port = try freeLoopbackPort()
        let cluster = try EmbeddedPostgres(dataDirectory: folder, tcpPort: port)
        _ = try await onOwnThread { try cluster.start() }
        defer { try? cluster.stop() }
        let attributes = try FileManager.default.attributesOfItem(atPath: cluster.passwordFile.path)
        #expect((attributes[.posixPermissions] as? Int) == 0o600)
        let error = #expect(throws: PostgresError.self) {
            try PostgresConnection(connecting: "host=127.0.0.1 port=\(port) user=adtally dbname=adtally password=guess sslmode=disable")
        }
        #expect(error?.message.contains("password authentication failed") == true)
        #expect(throws: PostgresError.self) {
            try PostgresConnection(connecting: "host=127.0.0.1 port=\(port) user=adtally dbname=adtally passfile=/dev/null sslmode=disable")
        }
        let password = try String(contentsOf: cluster.passwordFile, encoding: .utf8).split(separator: ":").last!
            .trimmingCharacters(in: .whitespacesAndNewlines)
        let connection = try PostgresConnection(connecting: "host=127.0.0.1 port=\(port) user=adtally dbname=adtally password=\(password) sslmode=disable")
        #expect(try connection.query("SELECT 1 AS one")[0].decode("one", as: Int.self) == 1)
        // The usual conninfo (socket and passfile) works too.
        _ = try PostgresConnection(connecting: cluster.conninfo)
    }

    @Test("a cluster made by an earlier version, trusting everyone, gets a password on its next start")
    func trustingClusterUpgraded() async throws {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("adtally-embedded-\(UUID().uuidString.prefix(8))")
        defer { try? FileManager.default.removeItem(at: folder) }
        let port = try freeLoopbackPort()
        let cluster = try EmbeddedPostgres(dataDirectory: folder, tcpPort: port)
        try await onOwnThread {
            try cluster.start()
            try cluster.stop()
        }
        // What an earlier version left: trust everywhere, no password file.
        let hba = folder.appendingPathComponent("pg/pg_hba.conf")
        let text = try String(contentsOf: hba, encoding: .utf8).replacingOccurrences(of: "scram-sha-256", with: "trust")
        try text.write(to: hba, atomically: false, encoding: .utf8)
        try FileManager.default.removeItem(at: cluster.passwordFile)
        _ = try await onOwnThread { try cluster.start() }
        defer { try? cluster.stop() }
        #expect(throws: PostgresError.self) {
            try PostgresConnection(connecting: "host=127.0.0.1 port=\(port) user=adtally dbname=adtally passfile=/dev/null sslmode=disable")
        }
        _ = try PostgresConnection(connecting: cluster.conninfo)
    }

    @Test("a /tmp socket folder someone else made first is refused")
    func foreignSocketFolder() throws {
        // A data folder whose path is too long for a socket address uses /tmp/adtally-<hash>.
        let folder = FileManager.default.temporaryDirectory
            .appendingPathComponent("adtally-embedded-\(UUID().uuidString)-\(String(repeating: "x", count: 60))")
        defer { try? FileManager.default.removeItem(at: folder) }
        let cluster = try EmbeddedPostgres(dataDirectory: folder)
        let fallback = URL(fileURLWithPath: "/tmp/adtally-\(SHA256.hex(folder.appendingPathComponent("run").standardizedFileURL.path).prefix(16))")
        try FileManager.default.createDirectory(at: fallback, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: fallback) }
        chmod(fallback.path, 0o777)
        let error = #expect(throws: EmbeddedPostgresError.self) { try cluster.start() }
        #expect(error?.description.contains("refusing the socket folder \(fallback.path)") == true)
    }

    @Test("as root, a data folder the postgres user cannot reach fails with one clear message")
    func unreachableDataFolder() throws {
        guard geteuid() == 0 else { return }
        let closed = FileManager.default.temporaryDirectory.appendingPathComponent("adtally-closed-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: closed, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: closed) }
        chmod(closed.path, 0o700)
        let cluster = try EmbeddedPostgres(dataDirectory: closed.appendingPathComponent("data"))
        let error = #expect(throws: EmbeddedPostgresError.self) { try cluster.start() }
        #expect(error?.description.contains("'postgres' user, which cannot reach") == true)
    }
}
