import Foundation
import PostgresKit
import Synchronization

/// A fresh database in the throwaway cluster that `make test` starts, dropped afterwards.
public enum TestDatabase {
    /// The conninfo of the cluster's maintenance database, from `ADTALLY_TEST_DATABASE_URL`.
    public static var clusterURL: String {
        get throws {
            guard let url = ProcessInfo.processInfo.environment["ADTALLY_TEST_DATABASE_URL"], !url.isEmpty else {
                throw TestSetupError(description: "ADTALLY_TEST_DATABASE_URL is not set: run the suite with `make test`, which starts a throwaway PostgreSQL")
            }
            return url
        }
    }

    /// Two at a time: a CREATE DATABASE copies the template through the WAL and
    /// checkpoints, and a hundred at once (every test at the suite's start) on a loaded
    /// machine once held up the streaming replica's test, when its replica was of this
    /// cluster (paced, they did not).
    static let creating = AsyncGate(limit: 2)

    /// Creates an empty database in `cluster` (a conninfo for its database "postgres";
    /// the suite's cluster when nil), or a copy of the database `template` there, runs
    /// `body` with its conninfo, then drops it.
    public static func withDatabase<T>(cluster: String? = nil, template: String? = nil, _ body: (String) async throws -> T) async throws -> T {
        let database = try await create(in: try cluster ?? clusterURL, template: template)
        do {
            let value = try await body(database.conninfo)
            await database.drop()
            return value
        } catch {
            await database.drop()
            throw error
        }
    }

    /// A database made by `create`: its name, its conninfo, and the maintenance
    /// database's connection that made it and drops it.
    struct Created: Sendable {
        let name: String
        let conninfo: String
        let admin: PostgresConnection

        /// Drops it (whoever is still connected), paced by `creating`.
        func drop() async {
            await creating.run {
                _ = await onOwnThread { [admin, name] in _ = try? admin.execute(unsafeSQL: "DROP DATABASE IF EXISTS \(name) WITH (FORCE)") }
            }
        }
    }

    /// Creates a database named `prefix` and a UUID in the cluster `admin` names (empty, or
    /// a copy of `template`). Creating and dropping block for a while, so they run on
    /// threads of their own, not on the two cooperative ones every test's server needs,
    /// and are paced by `creating`.
    static func create(in admin: String, template: String? = nil, prefix: String = "t_") async throws -> Created {
        let name = prefix + UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "")
        let connection = try await creating.run {
            try await onOwnThread { () throws -> PostgresConnection in
                let connection = try PostgresConnection(connecting: admin)
                _ = try connection.execute(unsafeSQL: "CREATE DATABASE \(name)" + (template.map { " TEMPLATE \($0)" } ?? ""))
                return connection
            }
        }
        return Created(name: name, conninfo: admin.replacingOccurrences(of: "dbname=postgres", with: "dbname=\(name)"), admin: connection)
    }

    /// Creates an empty database and a pool over it; shuts the pool down afterwards.
    public static func withPool<T>(
        maxConnections: Int = 4, acquireTimeout: Duration = .seconds(10), _ body: (PostgresPool) async throws -> T
    ) async throws -> T {
        try await withDatabase { conninfo in
            let pool = PostgresPool(configuration: .init(conninfo: conninfo, maxConnections: maxConnections, acquireTimeout: acquireTimeout))
            do {
                let value = try await body(pool)
                await pool.shutdown()
                return value
            } catch {
                await pool.shutdown()
                throw error
            }
        }
    }
}

/// A database of the suite's cluster made once per test run by `make` (given its
/// conninfo) and never written again, for `withDatabase(template:)` to copy: what every
/// test would otherwise build again for itself (a migrated schema: 29 migrations, 0.5 s
/// alone and past 30 s under the whole suite on a loaded machine, against 0.1 s a copy).
/// No connection to it may stay open (a copy needs its template unused), so `make`
/// closes every connection it opened.
public final class TemplateDatabase: Sendable {
    private let made = Locked<Task<String, any Error>?>(nil)
    private let make: @Sendable (String) async throws -> Void

    public init(make: @escaping @Sendable (String) async throws -> Void) { self.make = make }

    /// Its name, made by the first caller (the others wait for it). A failed attempt is
    /// dropped and forgotten: its waiters fail with it, and a caller after them tries again.
    public func name() async throws -> String {
        let task = made.withLock { made in
            if let made { return made }
            let task = Task { [make] in
                let database = try await TestDatabase.create(in: try TestDatabase.clusterURL, prefix: "t_template_")
                do {
                    try await make(database.conninfo)
                } catch {
                    await database.drop()
                    throw error
                }
                return database.name
            }
            made = task
            return task
        }
        do {
            return try await task.value
        } catch {
            made.withLock { if $0 == task { $0 = nil } }
            throw error
        }
    }
}

/// The test environment is not set up.
public struct TestSetupError: Error, CustomStringConvertible {
    public var description: String
    public init(description: String) { self.description = description }
}

/// A value shared between test tasks behind a lock.
public final class Locked<Value: Sendable>: Sendable {
    private let mutex: Mutex<Value>
    public init(_ value: Value) { mutex = Mutex(value) }
    public func withLock<T: Sendable>(_ body: (inout Value) -> T) -> T { mutex.withLock { body(&$0) } }
}

/// `Tests/Support/fake_postgres.py` running on a free loopback port: a server that
/// never answers (`silent`) or that refuses every statement (`reject-sql`).
public final class FakePostgres: @unchecked Sendable {
    public let port: Int
    private let process = Process()
    private let input = Pipe()

    public init(mode: String, port: Int) throws {
        self.port = port
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("fake_postgres.py")
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", script.path, "\(port)", mode]
        let output = Pipe()
        process.standardOutput = output
        process.standardInput = input
        try process.run()
        let ready = output.fileHandleForReading.availableData
        guard String(decoding: ready, as: UTF8.self).hasPrefix("ready") else {
            throw TestSetupError(description: "fake_postgres.py did not start")
        }
    }

    /// A conninfo for it.
    public var conninfo: String { "host=127.0.0.1 port=\(port) user=fake dbname=fake sslmode=disable gssencmode=disable" }

    public func stop() {
        try? input.fileHandleForWriting.close()
        process.terminate()
        process.waitUntilExit()
    }

    deinit { stop() }
}

/// A TCP socket bound to a free port on 127.0.0.1 (listening when asked): its
/// descriptor, which the caller closes, and the port.
public func loopbackSocket(listening: Bool = false) throws -> (fd: Int32, port: Int) {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    try withUnsafeMutablePointer(to: &address) { pointer in
        try pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            guard bind(fd, $0, length) == 0, getsockname(fd, $0, &length) == 0 else {
                close(fd)
                throw TestSetupError(description: "no free port")
            }
        }
    }
    if listening { listen(fd, 1) }
    return (fd, Int(UInt16(bigEndian: address.sin_port)))
}

/// A free TCP port on 127.0.0.1, from the kernel.
public func freeLoopbackPort() throws -> Int {
    let (fd, port) = try loopbackSocket()
    close(fd)
    return port
}
