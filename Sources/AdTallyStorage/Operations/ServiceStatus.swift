import Foundation
import PostgresKit

/// What `adtally status` reads from the database: its size and biggest tables,
/// migrations, recent ingest, rollup lag, and the export runner.
public struct ServiceStatus: Sendable, Encodable {
    /// A table with its partitions, indexes and TOAST.
    public struct Table: Sendable, Encodable {
        /// The table (a partitioned table's partitions are summed under its name).
        public var name: String
        /// Partitions counted in it (1 for a plain table).
        public var partitions: Int
        /// Bytes on disk.
        public var bytes: Int64
    }

    /// A recent run.
    public struct RecentRun: Sendable, Encodable {
        public var schedule: String
        public var slot: String
        public var pass: Int
        public var status: String
        public var finishedAt: Date?
        public var error: String?

        enum CodingKeys: String, CodingKey {
            case schedule, slot, pass, status, error, finishedAt = "finished_at"
        }
    }

    /// PostgreSQL's version.
    public var serverVersion: String
    /// The database's size in bytes.
    public var databaseBytes: Int64
    /// The biggest tables, largest first.
    public var biggestTables: [Table]
    /// Migrations applied, and the files not yet applied.
    public var migrationsApplied: Int
    /// Migration files not yet applied (or changed).
    public var migrationsPending: [String]
    /// Whether the figures below were read (false until every migration is applied).
    public var isComplete: Bool
    /// Events stored in the last minute and the last hour (by receipt).
    public var eventsLastMinute: Int64
    /// Events stored in the last hour.
    public var eventsLastHour: Int64
    /// Rollup delta rows waiting for compaction, and the age of the oldest (seconds).
    public var pendingDeltaRows: Int64
    /// Age of the oldest pending delta row, in seconds (nil: none pending).
    public var rollupLagSeconds: Double?
    /// The last compaction pass that moved rows (`rollup_compaction_passes`).
    public var lastCompaction: Compaction?

    /// A compaction pass: which server, when it ended, how many delta rows it moved.
    public struct Compaction: Sendable, Encodable {
        public var server: String
        public var at: Date
        public var rows: Int64

        enum CodingKeys: String, CodingKey {
            case server, at = "finished_at", rows = "delta_rows"
        }
    }
    /// The server leading the export runner (nil: no server runs exports).
    public var exportRunner: String?
    /// Since when it leads.
    public var exportRunnerSince: Date?
    /// Export schedules, and how many are paused.
    public var exportSchedules: Int
    /// Runs that failed for good.
    public var exportRunsFailed: Int
    /// The last runs.
    public var lastRuns: [RecentRun]
    /// The server evaluating the alert rules (nil: none).
    public var alertEvaluator: String?
    /// Alert rules, and how many rule-and-app pairs fire now.
    public var alertRules = 0
    public var alertsFiring = 0
    /// Whether the key secrets are encrypted with is kept in this database
    /// (server_secrets: no ADTALLY_CREDENTIALS_KEY was set when they were stored).
    public var credentialsKeyInDatabase = false
    /// Events apps' queues dropped unsent over the last 7 days (AdTallyKit's reports), per app and reason.
    public var clientDrops: [ClientDrops] = []

    /// One app's dropped events for one reason.
    public struct ClientDrops: Sendable, Encodable {
        public var app: String
        public var reason: String
        public var dropped: Int64
    }

    /// Events per second over the last minute.
    public var ingestEventsPerSecond: Double { Double(eventsLastMinute) / 60 }

    enum CodingKeys: String, CodingKey {
        case serverVersion = "server_version", databaseBytes = "database_bytes", biggestTables = "biggest_tables"
        case migrationsApplied = "migrations_applied", migrationsPending = "migrations_pending", isComplete = "complete"
        case eventsLastMinute = "events_last_minute", eventsLastHour = "events_last_hour", ingestEventsPerSecond = "ingest_events_per_second"
        case pendingDeltaRows = "pending_delta_rows", rollupLagSeconds = "rollup_lag_seconds", lastCompaction = "last_compaction"
        case exportRunner = "export_runner", exportRunnerSince = "export_runner_since", exportSchedules = "export_schedules"
        case exportRunsFailed = "export_runs_failed", lastRuns = "last_runs", clientDrops = "client_drops_7d"
        case alertEvaluator = "alert_evaluator", alertRules = "alert_rules", alertsFiring = "alerts_firing"
        case credentialsKeyInDatabase = "credentials_key_in_database"
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(serverVersion, forKey: .serverVersion)
        try container.encode(databaseBytes, forKey: .databaseBytes)
        try container.encode(biggestTables, forKey: .biggestTables)
        try container.encode(migrationsApplied, forKey: .migrationsApplied)
        try container.encode(migrationsPending, forKey: .migrationsPending)
        try container.encode(isComplete, forKey: .isComplete)
        try container.encode(eventsLastMinute, forKey: .eventsLastMinute)
        try container.encode(eventsLastHour, forKey: .eventsLastHour)
        try container.encode((ingestEventsPerSecond * 10).rounded() / 10, forKey: .ingestEventsPerSecond)
        try container.encode(pendingDeltaRows, forKey: .pendingDeltaRows)
        try container.encode(rollupLagSeconds, forKey: .rollupLagSeconds)
        try container.encode(lastCompaction, forKey: .lastCompaction)
        try container.encode(exportRunner, forKey: .exportRunner)
        try container.encode(exportRunnerSince, forKey: .exportRunnerSince)
        try container.encode(exportSchedules, forKey: .exportSchedules)
        try container.encode(exportRunsFailed, forKey: .exportRunsFailed)
        try container.encode(lastRuns, forKey: .lastRuns)
        try container.encode(clientDrops, forKey: .clientDrops)
        try container.encode(alertEvaluator, forKey: .alertEvaluator)
        try container.encode(alertRules, forKey: .alertRules)
        try container.encode(alertsFiring, forKey: .alertsFiring)
        try container.encode(credentialsKeyInDatabase, forKey: .credentialsKeyInDatabase)
    }

    /// Reads the status in one transaction.
    public static func read(pool: PostgresPool, migrator: Migrator) async throws -> ServiceStatus {
        let migrations = try await migrator.status(pool)
        return try await pool.withTransaction { connection in
            let database = try connection.query("SELECT current_setting('server_version'), pg_database_size(current_database())")[0]
            let size = Citus.sizeSQL("c.oid", total: true, citus: try Citus.isInstalled(connection))
            let tables = try connection.query("""
                SELECT coalesce(parent.relname, c.relname), count(*)::int, sum(\(unsafeRaw: size))::bigint
                FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                LEFT JOIN pg_inherits i ON i.inhrelid = c.oid LEFT JOIN pg_class parent ON parent.oid = i.inhparent
                WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'm')
                GROUP BY 1 ORDER BY 3 DESC, 1 LIMIT 8
                """).map { Table(name: try $0.decode(0), partitions: try $0.decode(1), bytes: try $0.decode(2)) }
            let applied = try connection.query("""
                SELECT CASE WHEN to_regclass('schema_migrations') IS NULL THEN 0 ELSE (SELECT count(*)::int FROM schema_migrations) END
                """)[0].decode(0, as: Int.self)
            var status = ServiceStatus(
                serverVersion: try database.decode(0), databaseBytes: try database.decode(1), biggestTables: tables,
                migrationsApplied: applied, migrationsPending: migrations.pending, isComplete: false,
                eventsLastMinute: 0, eventsLastHour: 0, pendingDeltaRows: 0, rollupLagSeconds: nil,
                exportRunner: nil, exportRunnerSince: nil, exportSchedules: 0, exportRunsFailed: 0, lastRuns: []
            )
            // The rest reads tables of the current schema: not there before `adtally migrate`.
            guard migrations.isCurrent else { return status }
            status.isComplete = true
            let events = try connection.query("""
                SELECT count(*) FILTER (WHERE received_at > now() - interval '1 minute'), count(*)
                FROM events WHERE received_at > now() - interval '1 hour'
                """)[0]
            let deltas = try connection.query("SELECT count(*), extract(epoch FROM now() - min(added_at))::float8 FROM rollup_delta")[0]
            let compaction = try connection.query("SELECT server, finished_at, delta_rows FROM rollup_compaction_passes ORDER BY started_at DESC LIMIT 1").first
            let leader = try Leadership.holder(connection, table: "export_leader", lockKey: ExportRunner.lockKey)
            let exports = try connection.query("""
                SELECT (SELECT count(*)::int FROM export_schedules), (SELECT count(*)::int FROM export_runs WHERE status = 'failed')
                """)[0]
            let runs = try connection.query("""
                SELECT schedule, slot, pass, status, finished_at, error FROM export_runs
                WHERE status <> 'pending' ORDER BY coalesce(finished_at, started_at) DESC NULLS LAST LIMIT 5
                """).map {
                RecentRun(schedule: try $0.decode(0), slot: try $0.decode(1), pass: try $0.decode(2), status: try $0.decode(3), finishedAt: try $0.decode(4), error: try $0.decode(5))
            }
            status.eventsLastMinute = try events.decode(0)
            status.eventsLastHour = try events.decode(1)
            status.pendingDeltaRows = try deltas.decode(0)
            status.rollupLagSeconds = try deltas.decode(1)
            if let compaction {
                status.lastCompaction = Compaction(server: try compaction.decode(0), at: try compaction.decode(1), rows: try compaction.decode(2))
            }
            if let leader {
                status.exportRunner = leader.runner
                status.exportRunnerSince = leader.since
            }
            status.exportSchedules = try exports.decode(0)
            let alerts = try connection.query("""
                SELECT (SELECT count(*)::int FROM alert_rules), (SELECT count(*)::int FROM alert_states WHERE state = 'firing')
                """)[0]
            status.alertEvaluator = try Leadership.holder(connection, table: "alert_leader", lockKey: AlertEvaluator.lockKey)?.runner
            status.alertRules = try alerts.decode(0)
            status.alertsFiring = try alerts.decode(1)
            status.credentialsKeyInDatabase = try connection.query(
                "SELECT EXISTS (SELECT 1 FROM server_secrets WHERE name = 'network_pull_credentials')"
            )[0].decode(0)
            status.exportRunsFailed = try exports.decode(1)
            status.lastRuns = runs
            status.clientDrops = try connection.query("""
                SELECT app_id, reason, sum(dropped)::bigint FROM client_drops WHERE received_at > now() - interval '7 days'
                GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2 LIMIT 20
                """).map { ClientDrops(app: try $0.decode(0), reason: try $0.decode(1), dropped: try $0.decode(2)) }
            return status
        }
    }
}
