import AdTallyApp
import AdTallyTestSupport
import Foundation
import Hummingbird
import HummingbirdTesting
import Logging

/// Runs `body` against a live AdTally server on a fresh test database.
func withTestApp(
    migrate: Bool = true,
    _ body: @escaping @Sendable (Database, any TestClientProtocol) async throws -> Void
) async throws {
    try await TestDatabase.withDatabase { conninfo in
        let settings = try Settings.resolve(flags: .init(databaseURL: conninfo, port: 0, poolSize: 4), environment: [:])
        var logger = Logger(label: "adtally.test")
        logger.logLevel = .warning
        let database = try await Database.open(settings, logger: logger)
        do {
            if migrate { try await database.migrate() }
            let app = buildApplication(settings: settings, database: database, logger: logger)
            try await app.test(.live) { client in
                try await body(database, client)
            }
            await database.close()
        } catch {
            await database.close()
            throw error
        }
    }
}
