import AdTallyStorage
import Foundation
import Hummingbird
import Logging
import NIOCore
import ServiceLifecycle

/// `adtally serve`: database, migrations, then the HTTP server and background
/// services in one service group that shuts down gracefully on SIGTERM/SIGINT.
public enum Server {
    /// Runs until a shutdown signal.
    ///
    /// A graceful shutdown waits `shutdownTimeoutSeconds` for requests in progress,
    /// then cancels them (a client holding a request open cannot keep the process
    /// up). Whatever ends the run — a signal, a port already taken — the pool closes
    /// and an embedded cluster this process started is stopped before it returns.
    public static func run(settings: Settings, logger: Logger) async throws {
        // The exports root: made when missing (the default's parents too, a named root's
        // parent must exist), so a fresh install can take schedules. One that exists is
        // used as it is (creating it again without its parents fails "File exists").
        var isDirectory: ObjCBool = false
        if !(FileManager.default.fileExists(atPath: settings.exportsRoot, isDirectory: &isDirectory) && isDirectory.boolValue) {
            do {
                try FileManager.default.createDirectory(atPath: settings.exportsRoot, withIntermediateDirectories: settings.exportsRoot.hasPrefix(
                    URL(fileURLWithPath: settings.dataDirectory).standardizedFileURL.path
                ))
            } catch {
                logger.error("the exports root cannot be made; scheduled exports will fail until it exists", metadata: ["root": "\(settings.exportsRoot)", "error": "\(error)"])
            }
        }
        let database = try await Database.open(settings, logger: logger)
        do {
            let applied = try await database.migrate()
            if !applied.isEmpty { logger.info("database migrated", metadata: ["applied": "\(applied.joined(separator: ", "))"]) }
            var services = AppServices(settings: settings, database: database, logger: logger)
            await warnOfSchedulesOutsideTheRoot(services, logger: logger)
            // Webhook URLs stored before they were encrypted (Migrations/0020).
            let sealed = try await services.alerts.sealPlainWebhooks()
            if sealed > 0 { logger.notice("webhook URLs encrypted", metadata: ["count": "\(sealed)"]) }
            if settings.credentialsKey == nil {
                logger.warning(
                    "ADTALLY_CREDENTIALS_KEY is not set: the networks' credentials, the webhooks' URLs and secrets are encrypted with a key kept in the database (server_secrets), so a dump of the database holds both the secrets and their key; set it in every server's environment"
                )
            }
            services.limits.idsPrunedBeforeMicros = try await services.eventStore.widenIDHorizon(to: settings.maxEventAge)
            let app = buildApplication(settings: settings, services: services, logger: logger)
            var configuration = ServiceGroupConfiguration(services: [app], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
            configuration.maximumGracefulShutdownDuration = .seconds(settings.shutdownTimeoutSeconds)
            do {
                try await ServiceGroup(configuration: configuration).run()
            } catch let error as IOError where error.errnoCode == EADDRINUSE {
                throw ServeError.portInUse(host: settings.host, port: settings.port)
            } catch let error as IOError where error.errnoCode == EACCES || error.errnoCode == EADDRNOTAVAIL {
                throw ServeError.cannotListen(host: settings.host, port: settings.port, reason: "\(error)")
            }
        } catch {
            await database.close()
            throw error
        }
        await database.close()
    }
}

/// Says at start where exports may be written, and names each schedule whose folder
/// lies outside (one made before the root existed): its runs fail until it is moved.
func warnOfSchedulesOutsideTheRoot(_ services: AppServices, logger: Logger) async {
    logger.info("exports are written only inside the exports root", metadata: ["root": "\(services.exportsRoot)"])
    guard let schedules = try? await services.exports.list() else { return }
    for schedule in schedules {
        do {
            _ = try ExportFile.resolve(directory: schedule.directory, root: services.exportsRoot)
        } catch {
            logger.warning("an export schedule's folder cannot be used; its runs fail until it is moved inside the exports root (adtally exports create … --dir)", metadata: [
                "schedule": "\(schedule.name)", "error": "\(error)",
            ])
        }
    }
}

/// Why `adtally serve` could not serve.
public enum ServeError: Error, CustomStringConvertible {
    case portInUse(host: String, port: Int)
    case cannotListen(host: String, port: Int, reason: String)

    public var description: String {
        switch self {
        case .portInUse(let host, let port):
            "cannot listen on \(host):\(port): the port is already in use (choose another with --port or ADTALLY_PORT)"
        case .cannotListen(let host, let port, let reason):
            "cannot listen on \(host):\(port): \(reason)"
        }
    }
}
