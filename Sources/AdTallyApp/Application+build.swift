import Foundation
import AdTallyHTTP
import AdTallyStorage
import Hummingbird
import Logging
import ServiceLifecycle

/// Everything the HTTP application and its background services share.
public struct AppServices: Sendable {
    /// The database and its pool.
    public let database: Database
    /// Apps and keys.
    public let appStore: AppStore
    /// Durable, deduplicated event storage.
    public let eventStore: EventStore
    /// Group commit for ingest requests.
    public let batcher: IngestBatcher
    /// Partition upkeep, retention and id pruning.
    public let maintenance: EventMaintenance
    /// Folds rollup deltas into the compacted rollups.
    public let compactor: RollupCompactor
    /// Limits of one ingest request.
    public var limits: IngestLimits
    /// The report engine every reading surface calls.
    public let reports: ReportEngine
    /// Export schedules and runs.
    public let exports: ExportStore
    /// The folder every export destination lies in.
    public let exportsRoot: String
    /// The key the networks' API credentials are encrypted with (nil: the database's own).
    public let credentialsKey: String?
    /// Where the server's own requests may go (ADTALLY_OUTBOUND_ALLOW).
    public let outbound: OutboundGate
    /// Runs due export slots while this server leads.
    public let exportRunner: ExportRunner
    /// Writes the report engine's recent numbers where Grafana reads them.
    public let reportSeries: ReportSeriesWriter
    /// Mediation policies, decisions and history.
    public let mediation: MediationStore
    /// Keeps the mediation decisions fresh and in memory.
    public let mediationRefresher: MediationRefresher
    /// Alert rules, states and history.
    public let alerts: AlertStore
    /// Evaluates the alert rules and sends their webhooks while this server leads.
    public let alertEvaluator: AlertEvaluator
    /// Erasure requests and their log (DESIGN §15).
    public let erasures: ErasureStore
    /// Runs queued erasures while this server leads.
    public let erasureRunner: ErasureRunner

    /// Wires the stores and the ingest batcher over a database.
    public init(
        settings: Settings, database: Database, logger: Logger, batcher configuration: IngestBatcher.Configuration? = nil,
        exportRunner: ExportRunner.Configuration? = nil, alertEvaluator: AlertEvaluator.Configuration? = nil,
        erasureRunner: ErasureRunner.Configuration? = nil
    ) {
        // Before the batcher and compactor create their metrics.
        MetricsRoutes.bootstrapOnce()
        self.database = database
        self.appStore = AppStore(pool: database.pool)
        self.eventStore = EventStore(pool: database.pool, credentialsKey: settings.credentialsKey, logger: logger)
        self.limits = IngestLimits(
            maxEvents: settings.maxEventsPerRequest, maxBytes: settings.maxBodyBytes,
            maxAge: settings.maxEventAge, maxAhead: settings.maxEventAhead
        )
        limits.bodyTimeout = .seconds(settings.httpBodyTimeoutSeconds)
        var configuration = configuration ?? IngestBatcher.Configuration(flushers: settings.ingestFlushers)
        // Each flusher holds a connection; leave at least one for everything else.
        configuration.flushers = max(1, min(configuration.flushers, settings.poolSize - 1))
        self.batcher = IngestBatcher(store: eventStore, configuration: configuration, logger: logger)
        self.maintenance = EventMaintenance(store: eventStore, retentionDays: settings.retentionDays, maxEventAge: limits.maxAge, logger: logger)
        self.compactor = RollupCompactor(store: eventStore, identity: Self.identity(settings), logger: logger)
        self.reports = database.reportEngine(logger: logger)
        self.exports = ExportStore(pool: database.pool)
        self.exportsRoot = settings.exportsRoot
        self.credentialsKey = settings.credentialsKey
        let outbound = OutboundGate(policy: settings.outboundAllow)
        self.outbound = outbound
        var runner = ExportRunner.Configuration(identity: Self.identity(settings))
        runner.catchUp = .seconds(settings.exportCatchUpDays * 86_400)
        runner.exportsRoot = settings.exportsRoot
        runner.pulls = NetworkPulls(pool: database.pool, key: settings.credentialsKey, fetch: NetworkPullClient(gate: outbound).fetch)
        // The server's own reports run on pools HTTP readers never take (Database.backgroundReads).
        let background = database.backgroundReportEngine(logger: logger)
        self.exportRunner = ExportRunner(configuration: exportRunner ?? runner, leaderPool: database.leaderPool, engine: background, logger: Logger(label: "adtally.exports"))
        // The series are rewritten by whichever server refreshes an app first, newest
        // last: read on the primary, so a lagging replica cannot write older numbers
        // over newer ones.
        self.reportSeries = ReportSeriesWriter(
            engine: ReportEngine(pool: database.backgroundReads.primary, logger: logger), pool: database.pool, configuration: .init(maxEventAgeDays: settings.maxEventAgeDays)
        )
        self.mediation = MediationStore(pool: database.pool)
        self.alerts = AlertStore(pool: database.adminPool, key: settings.credentialsKey)
        var evaluator = AlertEvaluator.Configuration(identity: Self.identity(settings))
        evaluator.dashboardBase = settings.publicURL
        evaluator.credentialsKey = settings.credentialsKey
        evaluator.send = WebhookClient(gate: outbound).send
        self.alertEvaluator = AlertEvaluator(
            configuration: alertEvaluator ?? evaluator, leaderPool: database.alertLeaderPool, engine: background, logger: Logger(label: "adtally.alerts")
        )
        self.erasures = ErasureStore(pool: database.pool)
        var erasing = ErasureRunner.Configuration(identity: Self.identity(settings), credentialsKey: settings.credentialsKey)
        erasing.targetStatement = .milliseconds(settings.erasureStatementMilliseconds)
        self.erasureRunner = ErasureRunner(
            configuration: erasureRunner ?? erasing,
            leaderPool: database.erasureLeaderPool, pool: database.erasurePool, logger: Logger(label: "adtally.erasures")
        )
        self.mediationRefresher = MediationRefresher(
            store: mediation, engine: background,
            configuration: .init(interval: .seconds(settings.mediationRefreshSeconds), identity: Self.identity(settings))
        )
    }

    /// This server as export runs name it: host, port and process id.
    static func identity(_ settings: Settings) -> String {
        "\(ProcessInfo.processInfo.hostName):\(settings.port) pid \(getpid())"
    }

    /// The background services, in start order (they stop in reverse).
    public var backgroundServices: [any Service] {
        [
            MaintenanceService(maintenance: maintenance), CompactorService(compactor: compactor), IngestService(batcher: batcher),
            ExportService(runner: exportRunner), AlertService(evaluator: alertEvaluator), ErasureService(runner: erasureRunner), ReportSeriesService(writer: reportSeries), MediationService(refresher: mediationRefresher),
            MemoryTrimService(),
        ]
    }
}

/// Builds the HTTP application with its background services; used by `adtally serve` and by the tests.
public func buildApplication(settings: Settings, services: AppServices, logger: Logger) -> some ApplicationProtocol {
    let routes = Routes()
    let router = routes.router
    // Metrics outermost: they record the status actually sent, problem responses included.
    router.add(middleware: MetricsMiddleware())
    // --log-level debug: a line per request, with the status sent (problems included).
    router.add(middleware: AccessLogMiddleware())
    router.add(middleware: ProblemMiddleware(routes: routes.table))
    if let folder = settings.staticDirectory {
        // Files answer GET and HEAD under /static/ where no route does (with their own
        // ETag and Last-Modified); `..` is refused.
        router.add(middleware: FileMiddleware(folder, urlBasePath: "/static", logger: logger))
    }
    HealthRoutes(readiness: DatabaseReadiness(database: services.database, compaction: services.compactor.health)).register(on: routes)
    MetricsRoutes.register(on: routes)
    let authenticator = KeyAuthenticator(store: AppStore(pool: services.database.authPool))
    // Reports (and the FX list) on the report pool: one key runs at most half its
    // connections at once, one client address all but one.
    let shares = ReportShares(poolConnections: Database.reportConnections)
    IngestRoutes(authenticator: authenticator, batcher: services.batcher, limits: services.limits).register(on: routes)
    AdminRoutes(store: services.appStore, authenticator: authenticator, networks: services.eventStore.networks).register(on: routes)
    // Access streams on the admin pool: a device's history never takes a connection ingest commits with.
    PrivacyRoutes(
        store: services.erasures, access: DeviceAccess(pool: services.database.adminPool), authenticator: authenticator, retentionDays: settings.retentionDays
    ).register(on: routes)
    ReportRoutes(engine: services.reports, authenticator: authenticator, shares: shares, streamLimits: settings.reportStreamLimits).register(on: routes)
    MoneyRoutes(
        store: MoneyStore(pool: services.database.pool), reads: MoneyStore(pool: services.database.reportPool),
        imports: MoneyStore(pool: services.database.adminPool), authenticator: authenticator, shares: shares
    ).register(on: routes)
    ExportRoutes(store: services.exports, engine: services.reports, authenticator: authenticator, exportsRoot: services.exportsRoot).register(on: routes)
    ClientDropRoutes(store: ClientDropStore(pool: services.database.pool), authenticator: authenticator).register(on: routes)
    MediationRoutes(store: services.mediation, refresher: services.mediationRefresher, authenticator: authenticator).register(on: routes)
    ExperimentRoutes(store: ExperimentStore(pool: services.database.pool), engine: services.reports, refresher: services.mediationRefresher, authenticator: authenticator).register(on: routes)
    DashboardRoutes(engine: services.reports, authenticator: authenticator, store: services.appStore, shares: shares, streamLimits: settings.reportStreamLimits).register(on: routes)
    // Network report imports on the admin pool (off ingest's connections); the
    // discrepancy report's own side through the report engine.
    ReconciliationRoutes(
        engine: ReconciliationEngine(reports: services.reports), reports: services.reports,
        store: NetworkReportStore(pool: services.database.adminPool),
        pulls: NetworkPulls(pool: services.database.adminPool, key: services.credentialsKey), authenticator: authenticator, shares: shares
    ).register(on: routes)
    // A test notification is sent even where a test server's evaluator sends nothing.
    var alerting = services.alertEvaluator.configuration
    if alerting.send == nil { alerting.send = WebhookClient(gate: services.outbound).send }
    AlertRoutes(store: services.alerts, engine: services.reports, authenticator: authenticator, alerting: alerting).register(on: routes)
    OpenAPIDocument.register(on: routes)
    return Application(
        router: router,
        // The idle timeout closes a connection that sends no complete request head, no
        // body chunk or (kept alive) no new request for that long: slow-header clients
        // included, as the head only counts once it is whole.
        server: .http1(configuration: .init(
            // A response that makes no progress for the same time (the client stopped reading) loses its connection too.
            additionalChannelHandlers: [makeParserErrorHandler(), makeWriteStallHandler(timeout: .seconds(Int64(settings.httpIdleTimeoutSeconds)))],
            idleTimeout: .seconds(Int64(settings.httpIdleTimeoutSeconds))
        )),
        configuration: .init(
            address: .hostname(settings.host, port: settings.port), serverName: "adtally",
            availableConnectionsDelegate: .maximum(settings.maxConnections, logger: logger)
        ),
        services: services.backgroundServices,
        logger: logger
    )
}

/// Runs the ingest flushers; on graceful shutdown, stops taking events and drains the queue.
struct IngestService: Service {
    let batcher: IngestBatcher

    func run() async throws {
        // Graceful shutdown drains the queue; cancellation (the server failed to
        // start, or the shutdown deadline passed) stops taking events too, or the
        // flushers would wait for work forever and the process would never exit.
        await withTaskCancellationHandler {
            await withGracefulShutdownHandler {
                await batcher.run()
            } onGracefulShutdown: {
                batcher.finish()
            }
        } onCancel: {
            batcher.finish()
        }
    }
}

/// The export runner: leads when it holds the runner lock, else waits for it.
struct ExportService: Service {
    let runner: ExportRunner

    func run() async throws {
        await cancelWhenGracefulShutdown {
            await runner.run()
        }
    }
}

/// The erasure runner: leads when it holds its lock, else waits for it.
struct ErasureService: Service {
    let runner: ErasureRunner

    func run() async throws {
        await cancelWhenGracefulShutdown {
            await runner.run()
        }
    }
}

/// The alert evaluator: leads when it holds its lock, else waits for it.
struct AlertService: Service {
    let evaluator: AlertEvaluator

    func run() async throws {
        await cancelWhenGracefulShutdown {
            await evaluator.run()
        }
    }
}

/// Runs `pass` at start and then every `interval` until graceful shutdown, which ends
/// the loop quietly between passes. A failure is logged once, and again only after a
/// pass succeeded in between ("… recovered"); `failed` and `succeeded` see every pass.
func repeatEvery(
    _ interval: Duration, _ what: String, logger: Logger, failed: @escaping @Sendable (any Error) -> Void = { _ in },
    succeeded: @escaping @Sendable () -> Void = {}, _ pass: @escaping @Sendable () async throws -> Void
) async {
    try? await cancelWhenGracefulShutdown {
        var failing = false
        while !Task.isCancelled {
            do {
                try await pass()
                succeeded()
                if failing { logger.info("\(what) recovered") }
                failing = false
            } catch where Task.isCancelled {
                break
            } catch {
                failed(error)
                if !failing { logger.error("\(what) failed", metadata: ["error": "\(error)"]) }
                failing = true
            }
            try await Task.sleep(for: interval)
        }
    }
}

/// The report series Grafana reads, rewritten every minute from 15 seconds after
/// start: a server that has just started first compacts the rollups it found
/// pending (the first refresh right at start took 4.8 s on the demo, later ones 0.2 s).
struct ReportSeriesService: Service {
    let writer: ReportSeriesWriter
    var interval: Duration = .seconds(60)
    var firstAfter: Duration = .seconds(15)

    func run() async throws {
        try? await cancelWhenGracefulShutdown { try await Task.sleep(for: firstAfter) }
        guard !Task.isCancelled, !Task.isShuttingDownGracefully else { return }
        await repeatEvery(interval, "report series refresh", logger: Logger(label: "adtally.series")) {
            try await writer.refresh()
        }
    }
}

/// Mediation decisions: loaded at start, then a pass every quarter of the interval,
/// which recomputes only the decisions older than nine tenths of it (so several
/// servers share the work and a decision is at most about one interval old).
struct MediationService: Service {
    let refresher: MediationRefresher

    func run() async throws {
        let pass = max(1, refresher.configuration.interval.components.seconds / 4)
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                await repeatEvery(.seconds(pass), "mediation refresh", logger: refresher.logger) {
                    try await refresher.refresh()
                }
            }
            // Experiments' first exposures, queued by the switch, written once a second.
            group.addTask {
                await repeatEvery(.seconds(1), "experiment exposure writes", logger: refresher.logger) {
                    try await refresher.exposures.flush()
                }
            }
        }
        // What the last second queued, before the pools close.
        do {
            try await refresher.exposures.flush()
        } catch {
            refresher.logger.warning("experiment exposures not written at shutdown", metadata: ["count": "\(refresher.exposures.pendingCount)", "error": "\(error)"])
        }
    }
}

/// Partition upkeep and retention, at start and then every hour.
struct MaintenanceService: Service {
    let maintenance: EventMaintenance

    func run() async throws {
        await repeatEvery(.seconds(3600), "event maintenance", logger: Logger(label: "adtally.maintenance")) {
            try await maintenance.runOnce()
        }
    }
}

/// Rollup compaction, every 5 seconds: the pending deltas stay a small table (a few
/// seconds of traffic) however long the server runs. Each pass upserts one row per
/// key it saw and the current quarter hour's keys recur in every pass, so fewer
/// passes cost less: every second, compaction took ~15% of PostgreSQL's statement
/// time under `make bench-ingest`. A failure is logged once, and again only after a
/// pass succeeded in between, but counted every time (adtally_rollup_compaction_failures_total,
/// and the lag in adtally_rollup_lag_seconds), and `/readyz` reports a failure that
/// lasts a minute (`CompactionHealth`).
struct CompactorService: Service {
    let compactor: RollupCompactor
    var interval: Duration = .seconds(5)

    func run() async throws {
        await repeatEvery(
            interval, "rollup compaction", logger: Logger(label: "adtally.rollups"),
            failed: { compactor.health.failed($0) }, succeeded: { compactor.health.succeeded() }
        ) {
            // Then what a card change left to re-price, a few seconds at a time with a compaction
            // between, until nothing is left: reports price those ranges at query time meanwhile,
            // so this only makes them fast again. (Sleeping the interval after each few seconds
            // left the re-pricer asleep half the time: 232 s for the bench's 10 M events where its
            // statements took 111 s.) Its failures are its own (logged and counted), not the
            // compaction's health.
            // Each compaction that succeeds is reported at once: the loop may run for minutes.
            var more = true
            while more && !Task.isCancelled {
                try await compactor.compactOnce()
                compactor.health.succeeded()
                do {
                    more = try await compactor.reprice(for: .seconds(3))
                } catch where !Task.isCancelled {
                    Logger(label: "adtally.rollups").error("re-pricing failed", metadata: ["error": "\(error)"])
                    more = false
                }
            }
        }
    }
}
