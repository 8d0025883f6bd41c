import AdTallyHTTP
import AdTallyStorage
import Foundation
import Logging
import NIOPosix
import PostgresKit

/// The database a process uses: a pool over `DATABASE_URL`, or over the embedded
/// cluster, which this process stops on close if it started it.
public final class Database: Sendable {
    /// The connection pool.
    public let pool: PostgresPool
    /// A small pool of its own for API key lookups, so that a flood of unknown keys
    /// (each a lookup) never takes the connections ingest writes with.
    public let authPool: PostgresPool
    /// A pool of its own for reports, so that long exports and many readers never
    /// take the connections ingest commits with (nor ingest theirs).
    public let reportPool: PostgresPool
    /// Connections of the report pool: reports at once; more wait (10 s) for one.
    public static let reportConnections = 4
    /// The same, on the streaming replica (`DATABASE_READ_URL`), when one is configured.
    public let readPool: PostgresPool?
    /// Where reports read: the replica while close enough behind, else `reportPool`.
    public let reads: ReportReads
    /// Where the server's own reports read (scheduled exports, mediation decisions, the
    /// Grafana series): pools of their own, so that HTTP readers, however many or slow,
    /// never leave them waiting for a connection.
    public let backgroundReads: ReportReads
    /// Connections of each background report pool.
    public static let backgroundReportConnections = 2
    /// One connection for an admin's bulk loads (FX imports): they hold a transaction for
    /// seconds, and must not take the connections ingest commits with.
    public let adminPool: PostgresPool
    /// One connection of its own for the export runner: it holds the runner lock while
    /// this process leads, and every claim and finish goes through it.
    public let leaderPool: PostgresPool
    /// The alert evaluator's lock and writes: one connection of its own.
    public let alertLeaderPool: PostgresPool
    /// The erasure runner's lock and job records: one connection of its own.
    public let erasureLeaderPool: PostgresPool
    /// The erasure runner's deletes: one connection of its own, so a job never takes one
    /// that ingest commits with.
    public let erasurePool: PostgresPool
    /// The schema migrations.
    public let migrator: Migrator
    /// The servers' `ADTALLY_CREDENTIALS_KEY` as this process was given it (nil: the
    /// database's own secret): what every EventStore and erasure runner on this
    /// database keys tombstones with.
    public let credentialsKey: String?
    /// The embedded cluster, when no URL was given.
    public let embedded: EmbeddedPostgres?
    private let startedEmbedded: Bool
    private let logger: Logger

    private init(
        pool: PostgresPool, authPool: PostgresPool, reportPool: PostgresPool, readPool: PostgresPool?, reads: ReportReads, backgroundReads: ReportReads,
        adminPool: PostgresPool, leaderPool: PostgresPool, alertLeaderPool: PostgresPool, erasureLeaderPool: PostgresPool, erasurePool: PostgresPool, migrator: Migrator, credentialsKey: String?, embedded: EmbeddedPostgres?, startedEmbedded: Bool, logger: Logger
    ) {
        self.pool = pool
        self.authPool = authPool
        self.reportPool = reportPool
        self.readPool = readPool
        self.reads = reads
        self.backgroundReads = backgroundReads
        self.adminPool = adminPool
        self.leaderPool = leaderPool
        self.alertLeaderPool = alertLeaderPool
        self.erasureLeaderPool = erasureLeaderPool
        self.erasurePool = erasurePool
        self.migrator = migrator
        self.credentialsKey = credentialsKey
        self.embedded = embedded
        self.startedEmbedded = startedEmbedded
        self.logger = logger
    }

    /// Opens the database the settings name, starting the embedded cluster if needed.
    public static func open(_ settings: Settings, logger: Logger) async throws -> Database {
        // The pools and report reads make their metrics as they are built: a metric made
        // before the Prometheus backend is bootstrapped stays a no-op for good.
        MetricsRoutes.bootstrapOnce()
        let migrator = try Migrator(directory: Migrator.defaultDirectory(explicit: settings.migrationsDirectory), logger: logger)
        var embedded: EmbeddedPostgres?
        var started = false
        let conninfo: String
        if let url = settings.databaseURL {
            conninfo = url
        } else {
            let cluster = try EmbeddedPostgres(
                dataDirectory: URL(fileURLWithPath: settings.dataDirectory), tcpPort: settings.embeddedTCPPort, logger: logger
            )
            // initdb and pg_ctl block for seconds: keep them off the cooperative pool.
            started = try await NIOThreadPool.singleton.runIfActive { try cluster.start() }
            embedded = cluster
            conninfo = cluster.conninfo
        }
        let pool = PostgresPool(
            configuration: .init(conninfo: conninfo, maxConnections: settings.poolSize, options: settings.databaseOptions),
            logger: logger
        )
        // Key lookups are one indexed row each: two connections, and a short wait.
        let authPool = PostgresPool(
            configuration: .init(conninfo: conninfo, maxConnections: 2, acquireTimeout: .seconds(2), options: settings.databaseOptions),
            logger: logger
        )
        let reportPool = PostgresPool(
            configuration: .init(conninfo: conninfo, maxConnections: reportConnections, options: settings.databaseOptions),
            logger: logger
        )
        let leaderPool = PostgresPool(configuration: .init(conninfo: conninfo, maxConnections: 1, options: settings.databaseOptions), logger: logger)
        let alertLeaderPool = PostgresPool(configuration: .init(conninfo: conninfo, maxConnections: 1, options: settings.databaseOptions), logger: logger)
        let erasureLeaderPool = PostgresPool(configuration: .init(conninfo: conninfo, maxConnections: 1, options: settings.databaseOptions), logger: logger)
        let erasurePool = PostgresPool(configuration: .init(conninfo: conninfo, maxConnections: 1, options: settings.databaseOptions), logger: logger)
        // Reports only: nothing that writes is ever given this pool. A replica whose lag
        // probe has not answered within 2 s is skipped for the primary meanwhile.
        let readPool = settings.databaseReadURL.map { url in
            PostgresPool(
                configuration: .init(conninfo: url, maxConnections: reportConnections, acquireTimeout: .seconds(5), options: settings.databaseOptions),
                logger: logger
            )
        }
        let reads = ReportReads(
            primary: reportPool, replica: readPool, maxLag: .seconds(settings.readMaxLagSeconds), primaryProbe: pool, logger: Logger(label: "adtally.reports")
        )
        let backgroundPool = PostgresPool(
            configuration: .init(conninfo: conninfo, maxConnections: backgroundReportConnections, acquireTimeout: .seconds(60), options: settings.databaseOptions),
            logger: logger
        )
        let backgroundReadPool = settings.databaseReadURL.map { url in
            PostgresPool(
                configuration: .init(conninfo: url, maxConnections: backgroundReportConnections, acquireTimeout: .seconds(5), options: settings.databaseOptions),
                logger: logger
            )
        }
        let backgroundReads = ReportReads(
            primary: backgroundPool, replica: backgroundReadPool, maxLag: .seconds(settings.readMaxLagSeconds), primaryProbe: pool,
            logger: Logger(label: "adtally.reports")
        )
        let adminPool = PostgresPool(
            configuration: .init(conninfo: conninfo, maxConnections: 1, acquireTimeout: .seconds(30), options: settings.databaseOptions), logger: logger
        )
        return Database(
            pool: pool, authPool: authPool, reportPool: reportPool, readPool: readPool, reads: reads, backgroundReads: backgroundReads,
            adminPool: adminPool, leaderPool: leaderPool, alertLeaderPool: alertLeaderPool, erasureLeaderPool: erasureLeaderPool, erasurePool: erasurePool,
            migrator: migrator, credentialsKey: settings.credentialsKey, embedded: embedded, startedEmbedded: started, logger: logger
        )
    }

    /// The report engine over this database's report reads (replica or primary).
    public func reportEngine(logger: Logger = Logger(label: "adtally.reports")) -> ReportEngine {
        ReportEngine(reads: reads, logger: logger)
    }

    /// The report engine of the server's own work (exports, mediation, series), on pools
    /// HTTP readers never take.
    public func backgroundReportEngine(logger: Logger = Logger(label: "adtally.reports")) -> ReportEngine {
        ReportEngine(reads: backgroundReads, logger: logger)
    }

    /// Applies pending migrations.
    @discardableResult
    public func migrate() async throws -> [String] {
        try await migrator.migrate(pool)
    }

    /// Closes the pool and stops the embedded cluster if this process started it
    /// and no other process still uses it.
    public func close() async {
        await authPool.shutdown()
        await reportPool.shutdown()
        await readPool?.shutdown()
        await backgroundReads.primary.shutdown()
        await backgroundReads.replica?.shutdown()
        await adminPool.shutdown()
        await leaderPool.shutdown()
        await alertLeaderPool.shutdown()
        await erasureLeaderPool.shutdown()
        await erasurePool.shutdown()
        await pool.shutdown()
        guard startedEmbedded, let embedded else { return }
        do {
            _ = try await NIOThreadPool.singleton.runIfActive { try embedded.stopIfUnused() }
        } catch {
            logger.error("could not stop the embedded PostgreSQL", metadata: ["error": "\(error)"])
        }
    }
}

/// Ready when the database answers, every migration is applied unchanged, rollup
/// compaction has not been failing for over a minute, and reports can be served: not
/// when a report waited in vain for a connection within `reportGrace` and none was
/// given one for all that time (a burst that some reports get through is no outage;
/// a pool held by readers that never finish is).
struct DatabaseReadiness: ReadinessProbe {
    let database: Database
    let compaction: CompactionHealth
    var compactionGrace: Duration = .seconds(60)
    var reportGrace: Duration = .seconds(30)

    func notReadyReason() async -> String? {
        do {
            let status = try await database.migrator.status(database.pool)
            guard status.isCurrent else { return "migrations pending: \(status.pending.joined(separator: ", "))" }
            if let problem = compaction.problem(grace: compactionGrace) { return problem }
            return reportProblem()
        } catch let error as PostgresError {
            return "database unreachable: \(error.message)"
        } catch {
            return "database not ready: \(error)"
        }
    }

    /// Why reports cannot be served now: on every report pool (the replica's too, when
    /// one is configured) a report waited in vain within `reportGrace`, and no report
    /// got a connection for that long.
    func reportProblem() -> String? {
        let pools = [database.reportPool] + (database.readPool.map { [$0] } ?? [])
        let stuck = pools.allSatisfy { pool in
            (pool.sinceLastTimeout.map { $0 < reportGrace } ?? false) && (pool.sinceLastGrant.map { $0 >= reportGrace } ?? true)
        }
        guard stuck, let granted = database.reportPool.sinceLastGrant else { return nil }
        return "reports cannot be served: no report has got one of the \(database.reportPool.configuration.maxConnections) report connections for "
            + "\(granted.components.seconds) s, and reports waited \(database.reportPool.configuration.acquireTimeout) in vain for one (all held by other reports)"
    }
}
