import AdTallyStorage
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
        #expect(try cluster.start() == true)
        defer { try? cluster.stop() }
        #expect(try cluster.isRunning())

        // A second user of the same folder (another CLI process, say) reuses it.
        let second = try EmbeddedPostgres(dataDirectory: folder)
        #expect(try second.start() == false)

        let pool = PostgresPool(configuration: .init(conninfo: cluster.conninfo, maxConnections: 2))
        let before = try await pool.query("SELECT current_database() AS db, pg_backend_pid() AS pid")
        #expect(try before[0].decode("db", as: String.self) == "adtally")
        // No TCP listener unless asked for.
        let listen = try await pool.query("SELECT current_setting('listen_addresses') AS l")
        #expect(try listen[0].decode("l", as: String.self) == "")

        // Restart the server under the pool: the pool notices and reconnects.
        try cluster.stop()
        #expect(try cluster.isRunning() == false)
        #expect(try cluster.start() == true)
        let after = try await pool.query("SELECT pg_backend_pid() AS pid")
        #expect(try after[0].decode("pid", as: Int32.self) != before[0].decode("pid", as: Int32.self))
        await pool.shutdown()

        // Whoever started it stops it, but not while another client still uses it.
        var otherClient: PostgresConnection? = try PostgresConnection(connecting: cluster.conninfo)
        #expect(try cluster.stopIfUnused() == false)
        #expect(try cluster.isRunning())
        _ = otherClient?.backendPID
        otherClient = nil
        #expect(try cluster.stopIfUnused() == true)
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
