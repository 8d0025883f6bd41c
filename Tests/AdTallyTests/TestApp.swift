import AdTallyApp
import AdTallyStorage
import AdTallyTestSupport
import AsyncHTTPClient
import Foundation
import Hummingbird
import HummingbirdTesting
import Logging
import Testing

/// Runs `body` against a live AdTally server on a fresh test database. The client
/// (`.live`) sends every request down one connection, which the server answers in
/// order; `.ahc()` opens a connection per request in flight, for requests that must
/// really run at once.
func withTestApp(
    cluster: String? = nil,
    migrate: Bool = true,
    flags: Settings.Flags = .init(),
    batcher: IngestBatcher.Configuration? = nil,
    readURL: (String) -> String? = { _ in nil },
    client setup: TestingSetup = .live,
    _ body: @escaping @Sendable (AppServices, any TestClientProtocol) async throws -> Void
) async throws {
    try await withServices(cluster: cluster, migrate: migrate, flags: flags, batcher: batcher, readURL: readURL) { services, settings, logger in
        let app = buildApplication(settings: settings, services: services, logger: logger)
        try await app.test(setup) { client in
            try await body(services, client)
        }
    }
}

/// The stores and services over a fresh, migrated test database, with no server
/// and no background service running (for tests that drive those by hand).
func withServices(
    flags: Settings.Flags = .init(),
    _ body: @escaping @Sendable (AppServices) async throws -> Void
) async throws {
    try await withServices(cluster: nil, migrate: true, flags: flags, batcher: nil, readURL: { _ in nil }) { services, _, _ in try await body(services) }
}

/// Opens a fresh test database (migrated unless told not to) in `cluster` (the suite's
/// when nil), wires the services over it, runs `body`, and closes the database
/// whatever happens.
private func withServices(
    cluster: String?, migrate: Bool, flags: Settings.Flags, batcher: IngestBatcher.Configuration?, readURL: (String) -> String?,
    _ body: (AppServices, Settings, Logger) async throws -> Void
) async throws {
    // The suite's cluster: a copy of its migrated template (the migrations below then find
    // everything applied); another cluster (a replica test's own primary) migrates here.
    let template = migrate && cluster == nil ? try await migratedTemplate.name() : nil
    try await TestDatabase.withDatabase(cluster: cluster, template: template) { conninfo in
        var flags = flags
        flags.databaseURL = conninfo
        flags.databaseReadURL = readURL(conninfo)
        flags.port = 0
        flags.poolSize = flags.poolSize ?? 4
        // A live test client opens its connection first and may leave it idle while a
        // test loads its fixture; under CI's load that took past the server's 60 s idle
        // timeout (AudienceTests' sketches: "I/O on closed channel"). Tests of the timeout
        // set their own.
        flags.httpIdleTimeoutSeconds = flags.httpIdleTimeoutSeconds ?? 3600
        // The tests' export folders are temporary ones.
        flags.exportsRoot = flags.exportsRoot ?? FileManager.default.temporaryDirectory.path
        let settings = try Settings.resolve(flags: flags, environment: [:])
        var logger = Logger(label: "adtally.test")
        logger.logLevel = .warning
        let database = try await Database.open(settings, logger: logger)
        do {
            if migrate { try await database.migrate() }
            try await body(AppServices(settings: settings, database: database, logger: logger, batcher: batcher), settings, logger)
            await database.close()
        } catch {
            await database.close()
            throw error
        }
    }
}

/// The suite cluster's database with every migration applied, made by the first test
/// that asks (`TemplateDatabase`): tests copy it rather than migrate a database of their own.
let migratedTemplate = TemplateDatabase { conninfo in
    let settings = try Settings.resolve(flags: .init(databaseURL: conninfo), environment: [:])
    var logger = Logger(label: "adtally.test")
    logger.logLevel = .warning
    let database = try await Database.open(settings, logger: logger)
    do {
        try await database.migrate()
        await database.close()
    } catch {
        await database.close()
        throw error
    }
}

/// A fresh database of the suite's cluster with every migration applied: a copy of
/// `migratedTemplate`, dropped afterwards.
func withMigratedDatabase<T>(_ body: (String) async throws -> T) async throws -> T {
    try await TestDatabase.withDatabase(template: try await migratedTemplate.name(), body)
}

/// Polls `condition` until it holds (`eventually`); when `seconds` pass first,
/// records an issue saying what did not happen and throws, ending the test.
func waitUntil(
    _ what: String = "the condition held", within seconds: Double = 60, sourceLocation: SourceLocation = #_sourceLocation,
    _ condition: () async throws -> Bool
) async throws {
    guard try await eventually(within: seconds, condition) else {
        Issue.record("timed out waiting until \(what) (\(seconds) s)", sourceLocation: sourceLocation)
        throw TestSetupError(description: "timed out waiting until \(what)")
    }
}

/// Runs a command (found on PATH) to its end, with `environment` added to this
/// process's, on a thread of its own; its exit status and everything it printed.
func runProcess(_ arguments: [String], environment: [String: String] = [:]) async throws -> (status: Int32, output: String) {
    try await onOwnThread {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = arguments
        process.environment = ProcessInfo.processInfo.environment.merging(environment) { _, added in added }
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return (process.terminationStatus, text)
    }
}

/// Runs `body` with an HTTP client, shut down afterwards whatever happens: a client's
/// deinit without it is a fatal error, which takes the whole test process down.
func withHTTPClient<T>(_ body: (HTTPClient) async throws -> T) async throws -> T {
    let client = HTTPClient(eventLoopGroupProvider: .singleton)
    do {
        let result = try await body(client)
        try await client.shutdown()
        return result
    } catch {
        try? await client.shutdown()
        throw error
    }
}

/// Runs `adtally serve` on a database until it is ready, runs `body` with it and its
/// log file, then stops it and removes the log, whatever happens.
func withReadyServer<T>(_ conninfo: String, _ body: (ServerProcess, URL) async throws -> T) async throws -> T {
    let log = FileManager.default.temporaryDirectory.appendingPathComponent("adtally-serve-\(UUID().uuidString).log")
    defer { try? FileManager.default.removeItem(at: log) }
    let server = try ServerProcess(databaseURL: conninfo, port: try freePort(), log: log)
    defer { server.terminate() }
    try await withHTTPClient { try await server.waitUntilReady($0) }
    // The graceful shutdown is waited for off the cooperative threads (the defer's
    // terminate then finds the process stopped).
    do {
        let result = try await body(server, log)
        await server.stop()
        return result
    } catch {
        await server.stop()
        throw error
    }
}
