import AdTallyTestSupport
import Foundation
import PostgresKit
import Testing

/// A database that stops answering, and a pool used under cancellation (issue 7).
@Suite("PostgreSQL client defences")
struct DefenceTests {
    @Test("a server that accepts and never answers fails the connect after connect_timeout")
    func connectTimeout() async throws {
        let server = try FakePostgres(mode: "silent", port: try freeLoopbackPort())
        defer { server.stop() }
        // Two blocked seconds, on a thread of their own rather than a cooperative one,
        // and timed there: waiting for a cooperative thread afterwards is not the connect's.
        let (outcome, elapsed) = await onOwnThread {
            let started = ContinuousClock.now
            let outcome = Result { try PostgresConnection(connecting: server.conninfo, options: .init(connectTimeout: .seconds(2))) }
            return (outcome, ContinuousClock.now - started)
        }
        #expect(throws: PostgresError.self) { try outcome.get() }
        #expect(elapsed < .seconds(10), "took \(elapsed)")
    }

    /// The session settings used to be finished in a catch and again in deinit: a
    /// double free that crashed the process.
    @Test("a connection whose session set-up fails is finished once, and the error names the server's reason")
    func failedSessionSetUp() async throws {
        let server = try FakePostgres(mode: "reject-sql", port: try freeLoopbackPort())
        defer { server.stop() }
        for _ in 0..<3 {
            let error = #expect(throws: PostgresError.self) { try PostgresConnection(connecting: server.conninfo) }
            #expect(error?.message.contains("refuses every statement") == true)
        }
    }

    @Test("connections carry keepalives and a statement timeout; a conninfo overrides the defaults")
    func timeoutsApplied() async throws {
        try await TestDatabase.withDatabase { conninfo in
            let connection = try PostgresConnection(connecting: conninfo, options: .init(statementTimeout: .milliseconds(300)))
            #expect(connection.option("keepalives_idle") == "30")
            #expect(connection.option("connect_timeout") == "10")
            #expect(connection.option("tcp_user_timeout") == "60000")
            let sleep = await onOwnThread { Result { try connection.query("SELECT pg_sleep(3)") } }
            let error = #expect(throws: PostgresError.self) { try sleep.get() }
            #expect(error?.sqlState == .queryCanceled)
            #expect(error?.isTransient == true)
            let overridden = try PostgresConnection(connecting: conninfo + " keepalives_idle=7")
            #expect(overridden.option("keepalives_idle") == "7")
        }
    }

    @Test("a connection returned inside a transaction is not lent again")
    func releaseChecksTransactionStatus() async throws {
        try await TestDatabase.withPool(maxConnections: 1) { pool in
            let first = try await pool.withConnection { connection in
                try connection.execute(unsafeSQL: "BEGIN; CREATE TEMP TABLE leaked (x int)")
                return connection.backendPID
            }
            let (second, inTransaction) = try await pool.withConnection { connection in
                (connection.backendPID, try connection.query("SELECT count(*)::int FROM pg_class WHERE relname = 'leaked'")[0].decode(0, as: Int.self))
            }
            #expect(first != second)
            #expect(inTransaction == 0)
            #expect(pool.openConnections == 1)
        }
    }

    @Test("a cancelled wait for a connection ends at once and leaks no slot")
    func cancelledWaiter() async throws {
        try await TestDatabase.withPool(maxConnections: 1, acquireTimeout: .seconds(30)) { pool in
            // The only connection is held until the waiter has ended: a cancellation that
            // did not end the wait would end it 30 s later with a pool timeout instead of
            // CancellationError. No clock is read.
            try await whileHoldingAConnection(of: pool) {
                let waiter = Task { try await pool.query("SELECT 1") }
                try #require(try await eventually { pool.waitingTasks == 1 }, "the waiter never queued")
                waiter.cancel()
                await #expect(throws: CancellationError.self) { try await waiter.value }
                #expect(pool.waitingTasks == 0)
            }
            // The slot is still usable, many times over.
            for _ in 0..<20 { try await pool.query("SELECT 1") }
            #expect(pool.openConnections == 1)
        }
    }

    @Test("COPY on a connection the server dropped is a lost connection, not a server error")
    func copyOnDroppedConnection() async throws {
        try await TestDatabase.withDatabase { conninfo in
            let connection = try PostgresConnection(connecting: conninfo)
            try connection.execute(unsafeSQL: "CREATE TABLE t (x int)")
            let killer = try PostgresConnection(connecting: conninfo)
            // Waits (up to 10 s, on a thread of its own) until the backend is gone, not merely signalled.
            let pid = connection.backendPID
            #expect(try await onOwnThread { try killer.query("SELECT pg_terminate_backend(\(pid), 10000)")[0].decode(0, as: Bool.self) })
            var buffer = PostgresCopyBuffer(columns: 1)
            try buffer.appendInt32(1)
            buffer.endRow()
            let error = #expect(throws: PostgresError.self) { try connection.copyIn(unsafeSQL: "COPY t (x) FROM STDIN (FORMAT binary)", data: buffer) }
            #expect(error?.kind == .connectionLost)
            #expect(error?.isTransient == true)
        }
    }
}
