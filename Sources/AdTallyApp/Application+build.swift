import AdTallyHTTP
import Hummingbird
import Logging

/// Builds the HTTP application; used by `adtally serve` and by the tests.
public func buildApplication(settings: Settings, database: Database, logger: Logger) -> some ApplicationProtocol {
    let router = Router(context: AdTallyRequestContext.self)
    router.add(middleware: ProblemMiddleware())
    HealthRoutes(readiness: DatabaseReadiness(database: database)).register(on: router)
    return Application(
        router: router,
        configuration: .init(address: .hostname(settings.host, port: settings.port), serverName: "adtally"),
        logger: logger
    )
}
