import AdTallyApp
import AdTallyStorage
import AdTallyTestSupport
import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import PostgresKit
import Testing

/// The `adtally` binary built next to the tests.
func adtallyBinary() -> String {
    if let path = ProcessInfo.processInfo.environment["ADTALLY_BIN"], !path.isEmpty { return path }
    return URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent(".build/debug/adtally").path
}

/// A free TCP port on 127.0.0.1, from the kernel.
func freePort() throws -> Int { try freeLoopbackPort() }

/// A real `adtally serve` process on a test database.
///
/// `@unchecked Sendable`: the test kills it from one task while no other task touches it.
final class ServerProcess: @unchecked Sendable {
    let process = Process()
    let port: Int

    init(databaseURL: String, port: Int, log: URL, arguments: [String] = [], environment: [String: String] = [:]) throws {
        self.port = port
        process.executableURL = URL(fileURLWithPath: adtallyBinary())
        if !environment.isEmpty { process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 } }
        // The tests' export folders are temporary ones: the exports root is the temporary folder.
        process.arguments = ["serve", "--database-url", databaseURL, "--port", "\(port)", "--pool-size", "4",
                             "--exports-root", FileManager.default.temporaryDirectory.path] + arguments
        _ = FileManager.default.createFile(atPath: log.path, contents: nil)
        let handle = try FileHandle(forWritingTo: log)
        handle.seekToEndOfFile()
        process.standardOutput = handle
        process.standardError = handle
        try process.run()
    }

    /// Up to two minutes: a server given an empty database migrates before it listens, and
    /// a loaded clean-clone run saw that take past 30 s. A server that has exited fails it at once.
    func waitUntilReady(_ client: HTTPClient) async throws {
        let started = ContinuousClock.now
        while ContinuousClock.now - started < .seconds(120) {
            guard process.isRunning else {
                throw TestSetupError(description: "adtally serve exited (status \(process.terminationStatus)) before it was ready on port \(port)")
            }
            if let response = try? await client.execute(HTTPClientRequest(url: "http://127.0.0.1:\(port)/readyz"), timeout: .seconds(2)),
               response.status == .ok {
                return
            }
            try await Task.sleep(for: .milliseconds(100))
        }
        throw TestSetupError(description: "adtally serve did not become ready on port \(port)")
    }

    /// Peak resident memory so far (VmHWM), in bytes.
    func peakRSS() throws -> Int { try memory("VmHWM:") }

    /// Resident memory now (VmRSS), in bytes.
    func rss() throws -> Int { try memory("VmRSS:") }

    private func memory(_ field: String) throws -> Int {
        let status = try String(contentsOfFile: "/proc/\(process.processIdentifier)/status", encoding: .utf8)
        guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix(field) }),
              let kib = Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") else {
            throw TestSetupError(description: "no \(field) in /proc/\(process.processIdentifier)/status")
        }
        return kib * 1024
    }

    func kill() {
        Foundation.kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }

    func terminate() {
        if process.isRunning {
            process.terminate()
            process.waitUntilExit()
        }
    }

    /// `terminate` with the wait for its graceful shutdown (seconds) on a thread of its
    /// own, not on one of the few cooperative threads the other tests' servers need.
    func stop() async {
        await onOwnThread { self.terminate() }
    }
}

/// Runs `adtally serve` (with extra `arguments`) on a fresh test database that
/// holds one app with an ingest key, waits until it is ready, and runs `body`
/// with the process, the key's secret and an HTTP client.
func withServeProcess(
    app: String, arguments: [String] = [],
    _ body: (ServerProcess, _ secret: String, HTTPClient) async throws -> Void
) async throws {
    try await withMigratedDatabase { conninfo in
        let (database, secret) = try await openWithApp(conninfo, app: app)
        await database.close()
        let log = FileManager.default.temporaryDirectory.appendingPathComponent("adtally-\(app)-\(UUID().uuidString).log")
        defer { try? FileManager.default.removeItem(at: log) }
        let server = try ServerProcess(databaseURL: conninfo, port: try freePort(), log: log, arguments: arguments)
        defer { server.terminate() }
        let client = HTTPClient(eventLoopGroupProvider: .singleton)
        do {
            try await server.waitUntilReady(client)
            try await body(server, secret, client)
        } catch {
            try? await client.shutdown()
            await server.stop()
            throw error
        }
        try? await client.shutdown()  // the body may have shut it down already
        // Its graceful shutdown waited for off the cooperative threads (the defer's
        // terminate then finds it stopped).
        await server.stop()
    }
}

/// Opens and migrates a test database and creates an app with an ingest key, as an
/// operator would before starting `adtally serve`; the caller closes the database.
func openWithApp(_ conninfo: String, app: String) async throws -> (database: Database, secret: String) {
    let settings = try Settings.resolve(flags: .init(databaseURL: conninfo), environment: [:])
    let database = try await Database.open(settings, logger: Logger(label: "test"))
    try await database.migrate()
    _ = try await AppStore(pool: database.pool).createApp(id: app, name: nil)
    let secret = try await AppStore(pool: database.pool).createKey(app: app, scope: .ingest).secret
    return (database, secret)
}

struct Counts: Sendable {
    var accepted: Int
    var duplicates: Int
}

@Suite("Crash recovery")
struct CrashRecoveryTests {
    @Test("after SIGKILL under load and a restart, retrying everything unacknowledged stores every event exactly once")
    func killUnderLoad() async throws {
        try await withMigratedDatabase { conninfo in
            let (database, secret) = try await openWithApp(conninfo, app: "crash")

            let batchCount = 60
            // Each batch from one of 37 devices, as a kit sends its own: the install grain
            // (Migrations/0023) must count each event once too.
            let batches: [String] = (0..<batchCount).map { index in
                #"{"events":[\#((0..<100).map { _ in Ingest.event(type: "impression", extra: #","device":"crash-device-\#(index % 37)""#) }.joined(separator: ","))]}"#
            }
            let log = FileManager.default.temporaryDirectory.appendingPathComponent("adtally-crash-\(UUID().uuidString).log")
            let port = try freePort()
            let acked = Locked([Int: Counts]())

            func send(_ index: Int, _ client: HTTPClient) async -> Bool {
                var request = HTTPClientRequest(url: "http://127.0.0.1:\(port)/v1/events")
                request.method = .POST
                request.headers.add(name: "Authorization", value: "Bearer \(secret)")
                request.headers.add(name: "Content-Type", value: "application/json")
                request.body = .bytes(ByteBuffer(string: batches[index]))
                guard let response = try? await client.execute(request, timeout: .seconds(5)), response.status == .ok,
                      let body = try? await response.body.collect(upTo: 1 << 20),
                      let receipt = try? JSONDecoder().decode(Ingest.Receipt.self, from: Data(body.readableBytesView))
                else { return false }
                acked.withLock { $0[index] = Counts(accepted: receipt.accepted, duplicates: receipt.duplicates) }
                return true
            }

            try await withHTTPClient { client in
                let first = try ServerProcess(databaseURL: conninfo, port: port, log: log)
                defer { first.terminate() }
                try await first.waitUntilReady(client)

                // Four clients send every batch once; the server is killed mid-way.
                let next = Locked(0)
                let killed = Locked(false)
                await withTaskGroup(of: Void.self) { group in
                    for _ in 0..<4 {
                        group.addTask {
                            // After the kill, stop: requests to a dead port only wait out their deadline.
                            while !killed.withLock({ $0 }), let index = next.withLock({ value -> Int? in
                                guard value < batchCount else { return nil }
                                defer { value += 1 }
                                return value
                            }) {
                                _ = await send(index, client)
                            }
                        }
                    }
                    group.addTask {
                        while acked.withLock({ $0.count }) < 10 { try? await Task.sleep(for: .milliseconds(5)) }
                        first.kill()
                        killed.withLock { $0 = true }
                    }
                }
                let ackedBeforeKill = acked.withLock { $0.count }
                #expect(ackedBeforeKill >= 10)
                #expect(ackedBeforeKill < batchCount, "the kill should have cut some batches off")

                // Restart and retry whatever was not acknowledged, until it is.
                let second = try ServerProcess(databaseURL: conninfo, port: port, log: log)
                defer { second.terminate() }
                try await second.waitUntilReady(client)
                for _ in 0..<20 {
                    let missing = (0..<batchCount).filter { index in acked.withLock { $0[index] == nil } }
                    if missing.isEmpty { break }
                    for index in missing { _ = await send(index, client) }
                }

                let receipts = acked.withLock { $0 }
                #expect(receipts.count == batchCount)
                #expect(receipts.values.map { $0.accepted + $0.duplicates }.reduce(0, +) == batchCount * 100)
                let rows = try await database.pool.query("""
                    SELECT (SELECT count(*) FROM events)::int AS events, (SELECT count(*) FROM event_ids)::int AS ids,
                           (SELECT sum(impressions) FROM rollup_15m)::int AS rolled,
                           (SELECT sum(unpriced_impressions) FROM rollup_revenue_15m)::int AS unpriced
                    """)
                #expect(try rows[0].decode("events", as: Int.self) == batchCount * 100)
                #expect(try rows[0].decode("ids", as: Int.self) == batchCount * 100)
                #expect(try rows[0].decode("rolled", as: Int.self) == batchCount * 100)
                #expect(try rows[0].decode("unpriced", as: Int.self) == batchCount * 100)
                // Installs and their days, folded or pending: every impression once, every device once.
                let installs = try await database.pool.query("""
                    SELECT ((SELECT coalesce(sum(impressions), 0) FROM install_days) + (SELECT coalesce(sum(impressions), 0) FROM install_delta))::int,
                           (SELECT count(*) FROM (SELECT device FROM installs UNION SELECT device FROM install_delta) AS d)::int,
                           (SELECT count(*) FROM installs)::int
                    """)
                #expect(try installs[0].decode(0, as: Int.self) == batchCount * 100)
                #expect(try installs[0].decode(1, as: Int.self) == 37)
                #expect(try installs[0].decode(2, as: Int.self) <= 37)
            }
            await database.close()
            try? FileManager.default.removeItem(at: log)
        }
    }
}
