import AdTallyCore
import Foundation
import Logging
import Metrics
import PostgresKit
import Synchronization

/// Runs erasure jobs (DESIGN §15): one runner across every server on a database, elected
/// as the export runner is (`Leadership`), so a job left running by a server that was
/// killed is resumed by the next leader, where it was.
///
/// A job, for one app and up to 1,000 devices:
///
/// 1. **Tombstones**: a keyed hash of each id with the erasure's instant, under the app's
///    erasure lock held exclusively (`DeviceTombstones`): from its commit on, ingest
///    refuses those devices' events that occurred before the erasure.
/// 2. **Raw events**: deleted by ranges of `occurred_at`, oldest first, through the
///    events' (app, time) index; each range one short transaction that also records how
///    far the job got (`events_before`). A range's size adapts so a statement takes about
///    `targetStatement`: deleting rows takes no lock that ingest (which only inserts new
///    rows) or compaction (which never reads events) waits on, but a partition drop
///    waits for the statement, and ingest then waits behind the drop.
/// 3. **Device grain**: `installs`, `install_days`, `install_day_revenue` and the pending
///    `install_delta` rows of up to `grainRows` rows' worth of devices per transaction, which takes their
///    rows out of the cohort grain (`cohort_days`, `cohort_priced_day`) in the same
///    statement, under the compaction lock (the compactor, which only tries that lock,
///    skips a pass meanwhile; one such transaction takes milliseconds).
/// 4. **Done**: the counts and the cohorts touched recorded, the ids deleted
///    (`erasure_devices`), in one transaction.
///
/// Every step is idempotent, so a resumed job redoes at most the step it was in.
public final class ErasureRunner: Sendable {
    /// How the runner behaves.
    public struct Configuration: Sendable {
        /// This server, as `adtally status` names it.
        public var identity: String
        /// The servers' credentials key (nil: the database's own secret), which tombstones are keyed with.
        public var credentialsKey: String?
        /// How often the leader looks for queued jobs, and a follower for the lock.
        public var tick: Duration = .seconds(2)
        /// About how long one statement that deletes raw events should take.
        public var targetStatement: Duration = .milliseconds(250)
        /// Most device rows (day and money rows) one grain transaction deletes: a batch of
        /// devices is cut where their rows reach it (a device with more goes alone).
        public var grainRows = 20_000
        /// Only this job (`adtally devices forget` runs its own while no server runs
        /// erasures: it must not take another app's jobs and be stopped midway).
        public var only: UUID?
        /// Attempts before a job is `failed`.
        public var maxAttempts = 6

        /// Defaults for a server.
        public init(identity: String, credentialsKey: String? = nil) {
            self.identity = identity
            self.credentialsKey = credentialsKey
        }
    }

    /// The advisory lock key ("AdTally erasure runner").
    public static let lockKey: Int64 = 0x4164_5461_6C6C_7907

    public let configuration: Configuration
    let leaderPool: PostgresPool
    let pool: PostgresPool
    let logger: Logger
    let tombstoneKey: TombstoneKey
    private let leading = Mutex(false)
    private let doneCounter = Counter(label: "adtally_erasures_total", dimensions: [("outcome", "done")])
    private let failedCounter = Counter(label: "adtally_erasures_total", dimensions: [("outcome", "failed")])
    private let erasedRows = Counter(label: "adtally_erased_rows_total")

    /// A runner: `leaderPool` a pool of one connection of its own (the election), `pool`
    /// the one its deletes run on.
    public init(configuration: Configuration, leaderPool: PostgresPool, pool: PostgresPool, logger: Logger = Logger(label: "adtally.erasures")) {
        self.configuration = configuration
        self.leaderPool = leaderPool
        self.pool = pool
        self.logger = logger
        self.tombstoneKey = TombstoneKey(credentialsKey: configuration.credentialsKey)
    }

    /// Whether this runner leads now.
    public var isLeader: Bool { leading.withLock { $0 } }

    /// Runs until cancelled: waits for leadership, then runs queued jobs while it leads.
    public func run() async {
        let configuration = configuration
        await Leadership(lockKey: Self.lockKey, role: "erasure runner", table: "erasure_leader", identity: configuration.identity, tick: configuration.tick, logger: logger).run(
            pool: leaderPool, leading: { value in self.leading.withLock { $0 = value } },
            take: { connection in
                // A job left running belongs to a runner that is gone: it goes on from where it was.
                try connection.query("UPDATE erasures SET status = 'queued' WHERE status = 'running'")
            },
            lead: { lease in
                while !Task.isCancelled {
                    do {
                        while !Task.isCancelled, let job = try await lease.run({ try Self.claim($0, only: configuration.only) }) {
                            await self.execute(job, lease: lease)
                        }
                    } catch where Task.isCancelled {
                        break
                    }
                    try? await Task.sleep(for: configuration.tick)
                }
            }
        )
    }

    struct Job: Sendable {
        var id: UUID
        var app: String
        var requestedAtMicros: Int64
        var eventsBeforeMicros: Int64?
        var attempts: Int
    }

    /// The oldest queued job that is due, marked running.
    static func claim(_ connection: PostgresConnection, only: UUID? = nil) throws -> Job? {
        guard let row = try connection.query("""
            UPDATE erasures SET status = 'running', attempts = attempts + 1, started_at = now(), error = NULL
            WHERE id = (SELECT id FROM erasures WHERE status = 'queued' AND next_attempt_at <= now() AND (\(only)::uuid IS NULL OR id = \(only))
                        ORDER BY requested_at LIMIT 1)
            RETURNING id, app, (extract(epoch FROM requested_at) * 1000000)::bigint, (extract(epoch FROM events_before) * 1000000)::bigint, attempts
            """).first else { return nil }
        return Job(
            id: try row.decode(0), app: try row.decode(1), requestedAtMicros: try row.decode(2), eventsBeforeMicros: try row.decode(3),
            attempts: Int(try row.decode(4, as: Int32.self))
        )
    }

    /// Runs one job to its end or to a failure (recorded, retried later up to `maxAttempts`).
    func execute(_ job: Job, lease: PostgresLease) async {
        let started = ContinuousClock.now
        do {
            try await erase(job)
            let finished = try await lease.run { connection in
                try connection.withTransaction { connection -> Erasure? in
                    try connection.query("UPDATE erasures SET status = 'done', finished_at = now() WHERE id = \(job.id) AND status = 'running'")
                    try connection.query("DELETE FROM erasure_devices WHERE erasure_id = \(job.id)")
                    // Grafana's cohort series are written again at the next refresh, without the devices.
                    try connection.query("UPDATE report_series_refresh SET due_at = NULL WHERE app_id = \(job.app)")
                    return try ErasureStore.read(job.id, on: connection)
                }
            }
            doneCounter.increment()
            logger.info("erasure done", metadata: [
                "erasure": "\(job.id)", "app": "\(job.app)", "seconds": "\(ContinuousClock.now - started)",
                "events": "\(finished?.rows.events ?? 0)", "installs": "\(finished?.rows.installs ?? 0)",
            ])
        } catch {
            if Task.isCancelled { return }
            let message = String(describing: error)
            let maxAttempts = configuration.maxAttempts
            logger.error("erasure failed", metadata: ["erasure": "\(job.id)", "app": "\(job.app)", "attempt": "\(job.attempts)", "error": "\(message)"])
            let failed = job.attempts >= maxAttempts
            if failed { failedCounter.increment() }
            _ = try? await lease.run { connection in
                try connection.withTransaction { connection in
                    // Retried after 10 s, 20 s, 40 s … (attempts counts this one); a job that failed
                    // for good keeps no ids (ask again).
                    try connection.query("""
                        UPDATE erasures SET status = \(failed ? "failed" : "queued"), error = \(message),
                               finished_at = CASE WHEN \(failed) THEN now() END,
                               next_attempt_at = now() + make_interval(secs => 10 * power(2, least(attempts - 1, 10)))
                        WHERE id = \(job.id)
                        """)
                    if failed { try connection.query("DELETE FROM erasure_devices WHERE erasure_id = \(job.id)") }
                }
            }
        }
    }

    /// Steps 1-3 of a job.
    func erase(_ job: Job) async throws {
        let devices = try await pool.query("SELECT device FROM erasure_devices WHERE erasure_id = \(job.id) ORDER BY device").map { try $0.decode(0, as: String.self) }
        guard !devices.isEmpty else { return }
        try await recordTombstones(job, devices: devices)
        try await deleteEvents(job, devices: devices)
        for batch in try await grainBatches(job, devices: devices) {
            try await deleteGrain(job, devices: batch)
        }
    }

    /// The devices cut into batches of at most `grainRows` device rows each (their day and
    /// money rows, counted through the tables' (app, device) keys), so that one grain
    /// transaction, which holds the compaction lock, stays short however long a device's history.
    func grainBatches(_ job: Job, devices: [String]) async throws -> [[String]] {
        let counted = try await pool.query("""
            SELECT device, sum(n)::bigint FROM (
                SELECT device, count(*) AS n FROM install_days WHERE app_id = \(job.app) AND device = ANY(\(array: devices)::text[]) GROUP BY device
                UNION ALL
                SELECT device, count(*) FROM install_day_revenue WHERE app_id = \(job.app) AND device = ANY(\(array: devices)::text[]) GROUP BY device
            ) AS r GROUP BY device
            """)
        var rows: [String: Int64] = [:]
        for row in counted { rows[try row.decode(0, as: String.self)] = try row.decode(1, as: Int64.self) }
        var batches: [[String]] = []
        var batch: [String] = []
        var size: Int64 = 0
        for device in devices {
            let count = rows[device] ?? 0
            if !batch.isEmpty && size + count > Int64(configuration.grainRows) {
                batches.append(batch)
                (batch, size) = ([], 0)
            }
            batch.append(device)
            size += count
        }
        if !batch.isEmpty { batches.append(batch) }
        return batches
    }

    /// Step 1, retried while ingest holds the app's lock for longer than a second.
    func recordTombstones(_ job: Job, devices: [String]) async throws {
        let tombstoneKey = self.tombstoneKey
        for attempt in 1...20 {
            do {
                try await pool.withConnection { connection in
                    let key = try tombstoneKey.key(on: connection)
                    let hashes = devices.map { PostgresBytes(DeviceErasure.tombstone(key: key, app: job.app, device: $0)) }
                    try connection.withTransaction { connection in
                        try connection.query("SET LOCAL lock_timeout = '1s'")
                        try connection.query("SELECT pg_advisory_xact_lock(\(DeviceTombstones.lockKey(app: job.app)))")
                        try connection.query("""
                            INSERT INTO device_tombstones (app_id, device_hash, erased_at)
                            SELECT \(job.app), h, \(PostgresMicros(job.requestedAtMicros))::timestamptz FROM unnest(\(array: hashes)::bytea[]) AS h
                            ON CONFLICT (app_id, device_hash) DO UPDATE SET erased_at = GREATEST(device_tombstones.erased_at, excluded.erased_at)
                            """)
                    }
                }
                return
            } catch let error as PostgresError where error.sqlState == .lockNotAvailable && attempt < 20 {
                try await Task.sleep(for: .milliseconds(200))
            }
        }
    }

    /// Step 2: the raw events that occurred before the erasure, by ranges of time.
    func deleteEvents(_ job: Job, devices: [String]) async throws {
        let end = job.requestedAtMicros
        var lower: Int64
        if let from = job.eventsBeforeMicros {
            lower = from
        } else {
            guard let oldest = try await pool.query("""
                SELECT (extract(epoch FROM min(occurred_at)) * 1000000)::bigint FROM events WHERE app_id = \(job.app)
                """).first?.decode(0, as: Int64?.self) else { return }
            lower = oldest
        }
        let target = ExportRunner.seconds(configuration.targetStatement)
        var width: Int64 = 3_600_000_000
        while lower < end {
            let upper = min(end, lower + width)
            let began = ContinuousClock.now
            let deleted = try await pool.withTransaction { [lower] connection -> Int in
                try connection.query("SET LOCAL lock_timeout = '1s'")
                let rows = try connection.query("""
                    DELETE FROM events WHERE app_id = \(job.app) AND occurred_at >= \(PostgresMicros(lower))::timestamptz
                      AND occurred_at < \(PostgresMicros(upper))::timestamptz AND device = ANY(\(array: devices)::text[])
                    """).affectedRows
                try connection.query("""
                    UPDATE erasures SET events_before = \(PostgresMicros(upper))::timestamptz, events_rows = events_rows + \(rows) WHERE id = \(job.id)
                    """)
                return rows
            }
            erasedRows.increment(by: deleted)
            lower = upper
            // The next range: about `targetStatement` at this one's rate, at most 4x wider
            // or narrower, between a minute and a week.
            let took = max(ContinuousClock.now - began, .milliseconds(1))
            let factor = min(4, max(0.25, target / ExportRunner.seconds(took)))
            width = min(7 * 86_400_000_000, max(60_000_000, Int64(Double(width) * factor)))
        }
    }

    /// Step 3: the device grain of `devices`, and their rows out of the cohort grain.
    func deleteGrain(_ job: Job, devices: [String]) async throws {
        let deleted = try await pool.withTransaction { connection -> Int64 in
            // The compactor folds install deltas under this lock, and a card change takes it:
            // wait for a pass to end (it only tries the lock, so it never waits on us).
            try connection.query("SET LOCAL lock_timeout = '60s'")
            try RatePricing.lockCompaction(on: connection)
            try connection.query("SET LOCAL lock_timeout = '1s'")
            let row = try connection.query(Self.grainStatement(app: job.app, devices: devices))[0]
            let delta: Int64 = try row.decode(0), installs: Int64 = try row.decode(1), days: Int64 = try row.decode(2), revenue: Int64 = try row.decode(3)
            let first: String? = try row.decode(4), last: String? = try row.decode(5), exposures: Int64 = try row.decode(6)
            try connection.query("""
                UPDATE erasures SET install_delta_rows = install_delta_rows + \(delta), installs_rows = installs_rows + \(installs),
                       experiment_exposures_rows = experiment_exposures_rows + \(exposures),
                       install_days_rows = install_days_rows + \(days), install_day_revenue_rows = install_day_revenue_rows + \(revenue),
                       first_cohort = LEAST(first_cohort, \(first)::date), last_cohort = GREATEST(last_cohort, \(last)::date)
                WHERE id = \(job.id)
                """)
            return delta + installs + days + revenue + exposures
        }
        erasedRows.increment(by: Int(deleted))
    }

    /// Deletes the devices' rows of the device grain and subtracts them from the cohort
    /// grain, as the compactor adds them (`InstallCompaction`): a device-day is one device
    /// of its cohort's day, its money priced at the card as it is now (a dirty range is
    /// rewritten from the device rows by the re-pricer). Every CTE that reads a table
    /// comes before the writes that add (Citus runs them in order).
    static func grainStatement(app: String, devices: [String]) -> PostgresQuery {
        """
        WITH gone_delta AS (
            DELETE FROM install_delta WHERE app_id = \(app) AND device = ANY(\(array: devices)::text[]) RETURNING 1
        ), gone_exposures AS (
            DELETE FROM experiment_exposures WHERE app_id = \(app) AND device = ANY(\(array: devices)::text[]) RETURNING 1
        ), gone_installs AS (
            DELETE FROM installs WHERE app_id = \(app) AND device = ANY(\(array: devices)::text[]) RETURNING day
        ), gone_days AS (
            DELETE FROM install_days WHERE app_id = \(app) AND device = ANY(\(array: devices)::text[]) RETURNING cohort, day, impressions
        ), gone_revenue AS (
            DELETE FROM install_day_revenue WHERE app_id = \(app) AND device = ANY(\(array: devices)::text[])
            RETURNING cohort, day, hour, network, format, country, currency, revenue_micros, unpriced_impressions, unpriced_taps
        ), money_changes AS MATERIALIZED (
            SELECT cohort, day, (hour AT TIME ZONE 'UTC')::date AS u, network, format, country::text AS country, currency,
                   -revenue_micros AS revenue_micros, -unpriced_impressions AS ui, -unpriced_taps AS ut
            FROM gone_revenue
        ), \(unsafeRaw: RatePricing.pricesCTE("erase_prices", of: "money_changes")), counted AS MATERIALIZED (
            SELECT (SELECT count(*) FROM gone_delta) AS delta, (SELECT count(*) FROM gone_installs) AS installs,
                   (SELECT count(*) FROM gone_days) AS days, (SELECT count(*) FROM gone_revenue) AS revenue,
                   (SELECT min(day)::text FROM gone_installs) AS first_cohort, (SELECT max(day)::text FROM gone_installs) AS last_cohort,
                   (SELECT count(*) FROM gone_exposures) AS exposures
        ), cohort_counts AS (
            INSERT INTO cohort_days AS r (app_id, cohort, day, devices, impressions)
            SELECT \(app), cohort, day, -count(*), -sum(impressions) FROM gone_days GROUP BY cohort, day
            ON CONFLICT (app_id, cohort, day) DO UPDATE SET devices = r.devices + excluded.devices, impressions = r.impressions + excluded.impressions
            RETURNING 1
        ), cohort_money AS (
            INSERT INTO cohort_priced_day AS r (app_id, cohort, day, utc_day, currency, reported, estimated, unrated)
            SELECT \(app), s.cohort, s.day, s.u, \(unsafeRaw: RatePricing.pricedColumns("s"))
            FROM money_changes s \(unsafeRaw: RatePricing.join("s", prices: "erase_prices"))
            GROUP BY 2, 3, 4, 5
            ON CONFLICT (app_id, cohort, day, utc_day, currency) DO UPDATE SET \(unsafeRaw: RollupCompactor.pricedUpdate)
            RETURNING 1
        )
        SELECT delta, installs, days, revenue, first_cohort, last_cohort, exposures FROM counted
        """
    }
}
