import AdTallyApp
import ArgumentParser
import Foundation
import Logging

/// The `adtally` command.
@main
struct AdTally: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "adtally",
        abstract: "Self-hosted analytics and reporting for in-app advertising.",
        subcommands: [
            Serve.self, Migrate.self, AppsCommand.self, KeysCommand.self, IngestCommand.self, ReportCommand.self, RatesCommand.self, FXCommand.self,
            ExportsCommand.self, MediationCommand.self, ExperimentsCommand.self, NetworksCommand.self, ReconcileCommand.self, AlertsCommand.self, DevicesCommand.self, StatusCommand.self, DemoCommand.self,
        ]
    )

    /// As the library's `main`, but a `ValidationError` a subcommand throws while it
    /// runs ends with that subcommand's usage, not the root's (the library knows the
    /// subcommand only for errors thrown while parsing).
    static func main() async {
        var parsed: (any ParsableCommand)?
        do {
            var command = try await asyncParseAsRoot(nil)
            parsed = command
            if var asyncCommand = command as? any AsyncParsableCommand {
                try await asyncCommand.run()
            } else {
                try command.run()
            }
        } catch let error as ValidationError {
            guard let parsed, let path = path(to: type(of: parsed)), !path.isEmpty else { exit(withError: error) }
            let usage = usageString(for: type(of: parsed))
            FileHandle.standardError.write(Data("Error: \(error.message)\nUsage: \(usage)\n  See 'adtally \(path.joined(separator: " ")) --help' for more information.\n".utf8))
            Foundation.exit(ExitCode.validationFailure.rawValue)
        } catch {
            exit(withError: error)
        }
    }

    /// The subcommand names from the root to `command`; nil when it is not in the tree.
    static func path(to command: any ParsableCommand.Type, from root: any ParsableCommand.Type = AdTally.self) -> [String]? {
        if root == command { return [] }
        for sub in root.configuration.subcommands {
            if let rest = path(to: command, from: sub) {
                return [sub.configuration.commandName ?? String(describing: sub).lowercased()] + rest
            }
        }
        return nil
    }
}

/// Options every command that touches the database shares.
struct DatabaseOptions: ParsableArguments {
    @Option(name: .customLong("database-url"), help: "PostgreSQL URL or conninfo (env DATABASE_URL; default: the embedded cluster).")
    var databaseURL: String?

    @Option(name: .customLong("database-read-url"), help: "A streaming replica that reports read from while it is close enough behind (env DATABASE_READ_URL; default: none, the primary).")
    var databaseReadURL: String?

    @Option(name: .customLong("read-max-lag"), help: "Seconds of replay lag past which reports skip the replica for the primary (env ADTALLY_READ_MAX_LAG_SECONDS; default 30).")
    var readMaxLag: Int?

    @Option(name: .customLong("data-dir"), help: "Folder of the embedded cluster (env ADTALLY_DATA_DIR; default .adtally).")
    var dataDirectory: String?

    @Option(name: .customLong("exports-root"), help: "The folder every export destination must lie in (env ADTALLY_EXPORTS_ROOT; default DATA_DIR/exports).")
    var exportsRoot: String?

    @Option(name: .customLong("embedded-tcp-port"), help: "Let the embedded cluster also listen on 127.0.0.1:PORT (env ADTALLY_EMBEDDED_TCP_PORT).")
    var embeddedTCPPort: Int?

    @Option(name: .customLong("migrations-dir"), help: "Folder of NNNN_name.sql migrations (env ADTALLY_MIGRATIONS_DIR).")
    var migrationsDirectory: String?

    @Option(name: .customLong("pool-size"), help: "Most PostgreSQL connections (env ADTALLY_POOL_SIZE; default 8).")
    var poolSize: Int?

    @Option(name: .customLong("log-level"), help: "trace, debug, info, notice, warning, error (env LOG_LEVEL; default info).")
    var logLevel: String?

    @Option(name: .customLong("retention-days"), help: "Days of raw events kept (env ADTALLY_RETENTION_DAYS; default 90).")
    var retentionDays: Int?

    @Option(name: .customLong("max-event-age-days"), help: "Oldest accepted occurred_at, in days (env ADTALLY_MAX_EVENT_AGE_DAYS; default 7).")
    var maxEventAgeDays: Int?

    @Option(name: .customLong("max-event-ahead-minutes"), help: "Furthest accepted occurred_at ahead of server time (env ADTALLY_MAX_EVENT_AHEAD_MINUTES; default 60).")
    var maxEventAheadMinutes: Int?

    @Option(name: .customLong("statement-timeout"), help: "PostgreSQL statement_timeout in seconds, 0 for none (env ADTALLY_STATEMENT_TIMEOUT_SECONDS; default 60).")
    var statementTimeout: Int?

    @Option(name: .customLong("connect-timeout"), help: "PostgreSQL connect timeout in seconds (env ADTALLY_CONNECT_TIMEOUT_SECONDS; default 10).")
    var connectTimeout: Int?

    var flags: Settings.Flags {
        var flags = Settings.Flags(
            databaseURL: databaseURL, dataDirectory: dataDirectory, embeddedTCPPort: embeddedTCPPort,
            migrationsDirectory: migrationsDirectory, poolSize: poolSize, logLevel: logLevel, retentionDays: retentionDays,
            maxEventAgeDays: maxEventAgeDays, maxEventAheadMinutes: maxEventAheadMinutes
        )
        flags.dbStatementTimeoutSeconds = statementTimeout
        flags.dbConnectTimeoutSeconds = connectTimeout
        flags.databaseReadURL = databaseReadURL
        flags.readMaxLagSeconds = readMaxLag
        flags.exportsRoot = exportsRoot
        return flags
    }
}

extension AdTally {
    struct Serve: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Run the HTTP server (migrates the database first).")

        @OptionGroup var database: DatabaseOptions

        @Option(help: "Address to listen on (env ADTALLY_HOST; default 127.0.0.1).")
        var host: String?

        @Option(help: "Port to listen on (env ADTALLY_PORT; default 8080).")
        var port: Int?

        @Option(name: .customLong("max-events"), help: "Most events per ingest request (env ADTALLY_MAX_EVENTS; default 1000).")
        var maxEvents: Int?

        @Option(name: .customLong("max-body-bytes"), help: "Most ingest body bytes, after decompression too (env ADTALLY_MAX_BODY_BYTES; default 1048576).")
        var maxBodyBytes: Int?

        @Option(name: .customLong("ingest-flushers"), help: "Ingest transactions in flight at once (env ADTALLY_INGEST_FLUSHERS; default 4).")
        var ingestFlushers: Int?

        @Option(name: .customLong("idle-timeout"), help: "Seconds a connection may wait for a request head, a body chunk or, kept alive, the next request (env ADTALLY_IDLE_TIMEOUT_SECONDS; default 60).")
        var idleTimeout: Int?

        @Option(name: .customLong("body-timeout"), help: "Seconds an ingest body may take to arrive in full (env ADTALLY_BODY_TIMEOUT_SECONDS; default 60).")
        var bodyTimeout: Int?

        @Option(name: .customLong("max-connections"), help: "Most HTTP connections open at once (env ADTALLY_MAX_CONNECTIONS; default 1024).")
        var maxConnections: Int?

        @Option(name: .customLong("export-catch-up-days"), help: "Days back that export slots missed while no server ran are still written (env ADTALLY_EXPORT_CATCH_UP_DAYS; default 7).")
        var exportCatchUpDays: Int?

        @Option(name: .customLong("mediation-refresh"), help: "Seconds after which a mediation decision is computed again (env ADTALLY_MEDIATION_REFRESH_SECONDS; default 60).")
        var mediationRefresh: Int?

        @Option(name: .customLong("static-dir"), help: "Serve this folder's files as they are under /static/ (env ADTALLY_STATIC_DIR; default: none).")
        var staticDir: String?

        @Option(name: .customLong("shutdown-timeout"), help: "Seconds a graceful shutdown waits for requests in progress (env ADTALLY_SHUTDOWN_TIMEOUT_SECONDS; default 15).")
        var shutdownTimeout: Int?

        func run() async throws {
            var flags = database.flags
            flags.host = host
            flags.port = port
            flags.maxEventsPerRequest = maxEvents
            flags.maxBodyBytes = maxBodyBytes
            flags.ingestFlushers = ingestFlushers
            flags.httpIdleTimeoutSeconds = idleTimeout
            flags.httpBodyTimeoutSeconds = bodyTimeout
            flags.maxConnections = maxConnections
            flags.shutdownTimeoutSeconds = shutdownTimeout
            flags.exportCatchUpDays = exportCatchUpDays
            flags.mediationRefreshSeconds = mediationRefresh
            flags.staticDirectory = staticDir
            let settings = try Settings.resolve(flags: flags)
            let logger = LogSetup.bootstrap(level: settings.logLevel)
            try await Server.run(settings: settings, logger: logger)
        }
    }

    struct Migrate: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Apply pending database migrations.")

        @OptionGroup var database: DatabaseOptions

        func run() async throws {
            let settings = try Settings.resolve(flags: database.flags)
            let logger = LogSetup.bootstrap(level: settings.logLevel)
            let db = try await Database.open(settings, logger: logger)
            do {
                let applied = try await db.migrate()
                print(applied.isEmpty ? "database is up to date" : "applied: \(applied.joined(separator: ", "))")
            } catch {
                await db.close()
                throw error
            }
            await db.close()
        }
    }
}
