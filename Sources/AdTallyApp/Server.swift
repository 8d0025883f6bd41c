import Hummingbird
import Logging
import ServiceLifecycle

/// `adtally serve`: database, migrations, then the HTTP server and background
/// services in one service group that shuts down gracefully on SIGTERM/SIGINT.
public enum Server {
    /// Runs until a shutdown signal.
    public static func run(settings: Settings, logger: Logger) async throws {
        let database = try await Database.open(settings, logger: logger)
        do {
            let applied = try await database.migrate()
            if !applied.isEmpty { logger.info("database migrated", metadata: ["applied": "\(applied.joined(separator: ", "))"]) }
            var services = AppServices(settings: settings, database: database, logger: logger)
            services.limits.idsPrunedBeforeMicros = try await services.eventStore.widenIDHorizon(to: settings.maxEventAge)
            let app = buildApplication(settings: settings, services: services, logger: logger)
            let group = ServiceGroup(configuration: .init(
                services: [app],
                gracefulShutdownSignals: [.sigterm, .sigint],
                logger: logger
            ))
            try await group.run()
        } catch {
            await database.close()
            throw error
        }
        await database.close()
    }
}
