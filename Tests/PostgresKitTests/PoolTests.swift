import AdTallyTestSupport
import Foundation
import PostgresKit
import Testing

@Suite("Connection pool")
struct PoolTests {
    @Test("200 concurrent tasks on a 4-connection pool all complete, never over 4 connections")
    func manyTasksShareFewConnections() async throws {
        try await TestDatabase.withPool(maxConnections: 4, acquireTimeout: .seconds(60)) { pool in
            let results = try await withThrowingTaskGroup(of: (Int, Int32).self) { group in
                for index in 0..<200 {
                    group.addTask {
                        try await pool.withConnection { connection in
                            let rows = try connection.query("SELECT \(index)::int AS n, pg_sleep(0.002)::text AS slept")
                            return (try rows[0].decode("n", as: Int.self), connection.backendPID)
                        }
                    }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(results.map(\.0).sorted() == Array(0..<200))
            #expect(Set(results.map(\.1)).count <= 4)
            #expect(pool.openConnections <= 4)
        }
    }

    @Test("waiting for a connection times out with a clear error")
    func acquireTimesOut() async throws {
        try await TestDatabase.withPool(maxConnections: 1, acquireTimeout: .milliseconds(200)) { pool in
            // The only connection is held until the waiter has given up.
            try await whileHoldingAConnection(of: pool) {
                let error = await #expect(throws: PostgresError.self) {
                    try await pool.query("SELECT 1")
                }
                #expect(error?.kind == .poolTimeout)
                #expect(error?.description.contains("no PostgreSQL connection became free") == true)
            }
        }
    }

    @Test("a connection killed by the server is detected and replaced")
    func brokenConnectionIsReplaced() async throws {
        try await TestDatabase.withPool(maxConnections: 1) { pool in
            let first = try await pool.withConnection { $0.backendPID }
            // Kill the pooled connection's backend from outside the pool.
            let killer = try PostgresConnection(connecting: pool.configuration.conninfo)
            // Waits (up to 10 s, on a thread of its own) until the backend is gone, not merely signalled.
            #expect(try await onOwnThread { try killer.query("SELECT pg_terminate_backend(\(first), 10000)")[0].decode(0, as: Bool.self) })
            let rows = try await pool.query("SELECT pg_backend_pid() AS pid")
            #expect(try rows[0].decode("pid", as: Int32.self) != first)
            #expect(pool.openConnections == 1)
        }
    }

    @Test("a failed connect names host and database but never the password, and the pool frees the slot")
    func failedConnectNamesTarget() async throws {
        let pool = PostgresPool(configuration: .init(
            conninfo: "postgresql://auditor:sup3r-s3cret@127.0.0.1:1/ledger_db?connect_timeout=2", maxConnections: 1
        ))
        let error = await #expect(throws: PostgresError.self) { try await pool.query("SELECT 1") }
        #expect(error?.kind == .connectionFailed)
        #expect(error?.description.contains("127.0.0.1") == true)
        #expect(error?.description.contains("ledger_db") == true)
        #expect(error?.description.contains("sup3r-s3cret") == false)
        #expect(pool.openConnections == 0)
        await pool.shutdown()
    }
}
