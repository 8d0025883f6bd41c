import Foundation
import Logging
import Metrics
import PostgresKit
import Synchronization

/// How rollup compaction is doing, for `/readyz` and `/metrics`: a pass that fails
/// again and again leaves the deltas growing while every request still succeeds.
public final class CompactionHealth: Sendable {
    private struct State {
        var lastSuccess: ContinuousClock.Instant = .now
        /// The last pass's error; nil while passes succeed.
        var lastError: String?
    }

    private let state = Mutex(State())
    private let failures = Counter(label: "adtally_rollup_compaction_failures_total")
    private let lag = Gauge(label: "adtally_rollup_lag_seconds")

    /// A tracker that counts from now.
    public init() {}

    /// Records a pass that worked (or found another server compacting).
    public func succeeded() {
        state.withLock { state in
            state.lastSuccess = .now
            state.lastError = nil
        }
        lag.record(0)
    }

    /// Records a failed pass.
    public func failed(_ error: any Error) {
        failures.increment()
        let since = state.withLock { state -> ContinuousClock.Instant in
            state.lastError = "\(error)"
            return state.lastSuccess
        }
        lag.record(Self.seconds(.now - since))
    }

    /// Why rollups are unhealthy: the last pass failed and none has succeeded for longer than `grace`.
    public func problem(grace: Duration) -> String? {
        state.withLock { state in
            let behind = ContinuousClock.now - state.lastSuccess
            guard let error = state.lastError, behind > grace else { return nil }
            return "rollup compaction has failed for \(Int(Self.seconds(behind))) s (pending deltas grow): \(error)"
        }
    }

    static func seconds(_ duration: Duration) -> Double {
        Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
    }
}

/// Moves the rollup deltas the ingest path appends (`rollup_delta`) into the
/// compacted rollup tables: summed per key, upserted, and deleted from the delta
/// table, in one transaction, so the `rollup_15m` / `rollup_revenue_15m` views read
/// the same totals before, during and after a pass.
///
/// One compactor at a time across all servers (a transaction-scoped advisory lock;
/// a process that finds it taken skips the pass), so the upserts never contend.
public struct RollupCompactor: Sendable {
    let pool: PostgresPool
    let logger: Logger
    /// Who compacts, as `rollup_compaction_passes.server` records it.
    let identity: String
    private let passTimer = Metrics.Timer(label: "adtally_rollup_compaction_seconds")
    private let movedCounter = Counter(label: "adtally_rollup_delta_rows_compacted_total")
    private let repriceTimer = Metrics.Timer(label: "adtally_rollup_reprice_chunk_seconds")
    private let repriceFailures = Counter(label: "adtally_rollup_reprice_failures_total")
    /// Apps whose last re-pricing chunk failed, and until when they are passed over.
    private let failedApps = FailedApps()

    final class FailedApps: Sendable {
        private let until = Mutex<[String: ContinuousClock.Instant]>([:])
        func withLock<T>(_ body: (inout [String: ContinuousClock.Instant]) -> T) -> T { until.withLock { body(&$0) } }
    }
    /// Successes and failures of the passes `CompactorService` runs.
    public let health = CompactionHealth()

    /// Above this size (MB) the emptied delta table is truncated after a pass: every
    /// report scans it (no index), 16 MB cost each report ~6 ms on the bench.
    public static let shrinkDeltaTableAboveMB = 2

    /// "AdRoll" in ASCII; arbitrary but fixed across versions.
    static let lockKey = Int64(0x4164_526F_6C6C)

    /// A compactor over a store's database; `identity` names it in `rollup_compaction_passes`.
    public init(
        store: EventStore, identity: String = "adtally pid \(getpid())", limits: PassLimits? = nil,
        logger: Logger = Logger(label: "adtally.rollups")
    ) {
        self.pool = store.pool
        self.identity = identity
        self.logger = logger
        // By default under the pool's own statement timeout (the server's, the CLI's).
        let limits = limits ?? PassLimits(statementTimeout: store.pool.configuration.options.statementTimeout)
        self.limits = limits
        self.budget = PassBudget(rows: max(1, min(limits.start, limits.rows)))
    }

    /// The most delta rows one pass folds (`pass`): a backlog (an import of history,
    /// compaction stopped for a while) is folded a span of buckets at a time, each a
    /// statement of its own well inside the statement timeout; the bench's week-long
    /// backlog in one statement ran past it.
    public static let passRows = 100_000

    /// How much one pass may do: rows, and time. Rows alone did not bound a pass: in a
    /// checkpoint storm (the bench's load) 100,000 rows took past the pool's 60 s
    /// statement timeout, and the pass was cancelled and tried again whole, over and over.
    public struct PassLimits: Sendable {
        /// The most delta rows of one pass.
        public var rows: Int
        /// The time a pass aims at: one that takes longer makes the next one smaller in
        /// proportion, one that takes under half of it lets the next grow back (to `rows`).
        public var target: Duration
        /// The own statement timeout of a pass of several app x bucket groups, under the
        /// pool's: a pass cut by it is tried again at once with a quarter of its rows. A
        /// pass of one group (it cannot be split) runs under the pool's timeout, as any
        /// statement does, and one cut fails (tried again at the next tick).
        public var timeout: Duration

        /// The rows of the first pass: a backlog is met with passes this small, each twice
        /// the last while they take under half the target (up to `rows`). The bench's load
        /// started with 100,000 rows at once beside its own writes, and its first passes
        /// were cut by their timeout (and retried smaller) before the time bound had a say.
        public var start: Int

        /// The statement timeout of a pass of one group (which cannot be split): the
        /// pool's, or 5 minutes where the pool has none, so that a group held by a long
        /// transaction fails (and is seen failing) rather than holding compaction for good.
        public var singleGroupTimeout: Duration

        public init(
            rows: Int = RollupCompactor.passRows, target: Duration = .seconds(10), timeout: Duration = .seconds(30),
            singleGroupTimeout: Duration = .seconds(300), start: Int = 10_000
        ) {
            self.rows = max(1, rows)
            self.start = max(1, min(start, self.rows))
            self.target = target
            self.timeout = timeout
            self.singleGroupTimeout = singleGroupTimeout
        }

        /// The defaults under a pool's statement timeout (nil: none): 30 s, or half the
        /// pool's where that is shorter; one group, the pool's (5 minutes where none).
        public init(statementTimeout: Duration?) {
            self.init(timeout: statementTimeout.map { min(.seconds(30), $0 / 2) } ?? .seconds(30), singleGroupTimeout: statementTimeout ?? .seconds(300))
        }
    }

    let limits: PassLimits
    /// The rows the next pass may take (between 1 and `limits.rows`), as the last passes' times set it.
    let budget: PassBudget

    /// What a running pass took, and whether its transaction is running.
    final class PassProgress: Sendable {
        struct State {
            var rows = 0, groups = 0
            var inTransaction = false
            /// When the pass's own timeout started counting.
            var timedFrom: ContinuousClock.Instant?
        }
        private let state = Mutex(State())
        func withLock<T>(_ body: (inout State) -> T) -> T { state.withLock { body(&$0) } }
    }

    final class PassBudget: Sendable {
        private let rows: Mutex<Int>
        init(rows: Int) { self.rows = Mutex(rows) }
        var current: Int { rows.withLock { $0 } }
        func set(_ value: Int) { rows.withLock { $0 = value } }
    }

    /// A pass cut by its own timeout (`PassLimits.timeout`).
    public struct PassTimedOut: Error, CustomStringConvertible {
        /// The delta rows it tried to move, and in how many app x bucket groups.
        public var rows: Int
        public var groups: Int
        public var timeout: Duration
        public var description: String {
            "a compaction pass of \(rows) delta rows (\(groups) app x 15-minute groups) ran past its own timeout of \(timeout) and was cancelled; it is tried again smaller"
        }
    }
    private let timeouts = Counter(label: "adtally_rollup_compaction_timeouts_total")

    /// Moves every delta row committed before the call, a span of buckets per pass
    /// (at most `passRows` rows unless one bucket holds more, each pass its own transaction); returns how many it moved
    /// (0 when another process is compacting right now).
    @discardableResult
    public func compactOnce() async throws -> Int {
        var total = 0
        while true {
            do {
                let (moved, more) = try await pass()
                total += moved
                if !more { return total }
            } catch let cut as PassTimedOut {
                // Cut by its own timeout: try again at once with a quarter of the rows; a
                // pass of one group that is cut is a failure (the next tick tries again).
                timeouts.increment()
                let next = max(1, cut.rows / 4)
                budget.set(next)
                logger.warning("rollup compaction pass cut by its own timeout; trying again smaller", metadata: [
                    "delta_rows": "\(cut.rows)", "next_pass_rows": "\(next)", "timeout": "\(limits.timeout)",
                ])
            }
        }
    }

    /// One pass: the oldest app x bucket groups up to the budget's rows (at least one group;
    /// every group counted when they all fit); `more` when others were left.
    func pass() async throws -> (moved: Int, more: Bool) {
        let started = ContinuousClock.now
        let identity = self.identity
        let rowBudget = budget.current, timeout = limits.timeout
        let timeoutMS = Self.milliseconds(timeout)
        // What the pass took, for its timeout's error.
        let taken = PassProgress()
        let result: (moved: Int, more: Bool)
        do {
            result = try await passOnConnection(rowBudget: rowBudget, timeoutMS: timeoutMS, identity: identity, taken: taken)
        } catch let error as PostgresError where error.sqlState == .queryCanceled && taken.withLock({ progress in
            // Cut by the own timeout: cancelled once it had run that long. (An operator's
            // pg_cancel_backend is the same SQLSTATE, earlier: a failure. The message is
            // not read: the server translates it.)
            progress.inTransaction && progress.timedFrom.map { ContinuousClock.now - $0 >= timeout - .milliseconds(50) } == true
        }) {
            let (rows, groups) = taken.withLock { ($0.rows, $0.groups) }
            throw PassTimedOut(rows: rows, groups: groups, timeout: timeout)
        }
        if result.moved > 0 {
            let elapsed = ContinuousClock.now - started
            passTimer.record(duration: elapsed)
            movedCounter.increment(by: result.moved)
            logger.debug("rollups compacted", metadata: ["delta_rows": "\(result.moved)", "seconds": "\(elapsed)"])
            budget.set(Self.nextBudget(rows: rowBudget, moved: result.moved, more: result.more, elapsed: elapsed, limits: limits))
        }
        return result
    }

    /// `pass`'s work on one connection: the transaction that moves the deltas, then the
    /// vacuums. `taken` says what the transaction took and whether it was running.
    private func passOnConnection(
        rowBudget: Int, timeoutMS: Int, identity: String, taken: PassProgress
    ) async throws -> (moved: Int, more: Bool) {
        let singleGroupTimeout = limits.singleGroupTimeout
        return try await pool.withConnection { connection -> (moved: Int, more: Bool) in
            // nil: another process holds the compaction lock.
            let result: (moved: Int, more: Bool)? = try connection.withTransaction { connection in
                let locked = try connection.query("SELECT pg_try_advisory_xact_lock(\(Self.lockKey)), clock_timestamp()::text, \(unsafeRaw: Citus.installedSQL)")
                guard let lock = locked.first, try lock.decode(0, as: Bool.self) else { return nil }
                let lockedAt = try lock.decode(1, as: String.self)
                let distributed = try lock.decode(2, as: Bool.self)
                // The rows per app and bucket (a few hundred buckets a week), oldest first: the
                // pass ends at the group where its budget is reached (rows are far from even
                // over a day, and one app may hold most of a bucket).
                // Computed apart: on Citus a DELETE's condition may not read the table it deletes from.
                var seen = 0, groups = 0
                var end: (bucket: String, app: String)?, last: (bucket: String, app: String)?
                for row in try connection.query("SELECT bucket::text, app_id, count(*) FROM rollup_delta GROUP BY bucket, app_id ORDER BY bucket, app_id") {
                    let rows = try row.decode(2, as: Int.self)
                    let group = (bucket: try row.decode(0, as: String.self), app: try row.decode(1, as: String.self))
                    if seen > 0 && seen + rows > rowBudget {
                        end = group
                        break
                    }
                    last = group
                    seen += rows
                    groups += 1
                }
                taken.withLock { $0.rows = seen; $0.groups = groups }
                // For this transaction only:
                // - The pass's own timeout, under the pool's, when it can be split; one group,
                //   the single-group timeout (not a cut: a failure).
                // - No JIT, and room to sort and hash in memory (as a report has): the move
                //   statements' estimates run past JIT's thresholds on every pass of a busy
                //   server, and the install move's sorts and hashes of a pass of 190,000 install
                //   deltas spilled to disk at the default 4 MB (EXPLAIN ANALYZE on
                //   `make bench-ingest`'s data). work_mem is per sort or hash (a hash may take
                //   twice it): each holds a pass's rows at most, so memory grows with the pass
                //   (its budget, or one larger group) up to 64 MB per such node.
                // - Generic plans, for the bound: PostgreSQL estimates `(bucket, app_id) < ($1, $2)`
                //   by its first column alone, and after a burst every pending delta is of the
                //   current quarter hour, which a pass's budget cuts between apps: `bucket <` it
                //   was estimated at one row where the pass moved thousands, and the plan's
                //   nested loops rescanned one CTE per row of another (passes of 2,400–9,700
                //   rows ran 30 s and more after `make bench-ingest`'s 32-connection leg, whose
                //   fold took 440 s; docs/ingest.md). A generic plan estimates the bound as a
                //   third of the table as it stands. Not on Citus: there these settings reach
                //   the coordinator only (Citus does not pass SET LOCAL on by default), and
                //   the workers plan their shards with the bound's values, so this misestimate
                //   is not mended there.
                let passTimeout = groups > 1 ? timeoutMS : Self.milliseconds(singleGroupTimeout)
                let generic = distributed ? "" : ", set_config('plan_cache_mode', 'force_generic_plan', true)"
                try connection.query("""
                    SELECT set_config('statement_timeout', \(String(passTimeout)), true), set_config('jit', 'off', true),
                           set_config('work_mem', '64MB', true)\(unsafeRaw: generic)
                    """)
                if groups > 1 { taken.withLock { $0.inTransaction = true; $0.timedFrom = .now } }
                let more = end != nil
                if !distributed { try Self.analyzeDeltasIfStale(connection, rows: seen) }
                // The groups counted, and no more: the groups before the first left out, or up
                // to the last one counted (rows committed since the count, of a backlog's next
                // append, wait for the next pass instead of swelling this one past its budget).
                let bound = end.map { (bucket: $0.bucket, app: $0.app, before: true) } ?? last.map { (bucket: $0.bucket, app: $0.app, before: false) }
                func bounded(_ before: String, _ through: String, _ unbounded: String) -> PostgresQuery {
                    guard let bound else { return PostgresQuery(unsafeSQL: unbounded) }
                    return PostgresQuery(unsafeSQL: bound.before ? before : through, binds: [PostgresBind(text: bound.bucket, type: 1184), PostgresBind(text: bound.app, type: 25)])
                }
                let moved = try connection.query(bounded(Self.boundedMoveStatement, Self.throughMoveStatement, Self.moveStatement)).first?.decode(0, as: Int.self) ?? 0
                // The install deltas of the same groups (Migrations/0023): every event with a
                // device wrote both kinds in one transaction, so these bounds hold its rows too.
                try connection.query(bounded(InstallCompaction.boundedMoveStatement, InstallCompaction.throughMoveStatement, InstallCompaction.moveStatement))
                if moved > 0 {
                    try connection.query("""
                        INSERT INTO rollup_compaction_passes (started_at, finished_at, server, delta_rows, priced)
                        VALUES (\(lockedAt)::timestamptz, clock_timestamp(), \(identity), \(moved), true)
                        """)
                }
                return (moved, more)
            }
            taken.withLock { $0.inTransaction = false }
            guard let result else { return (0, false) }
            if result.moved > 0 && !result.more {
                // Deleted deltas are dead rows; reclaim them now rather than at autovacuum's pace
                // (the table takes tens of thousands of rows a second under load); once a
                // backlog is folded, not after each of its passes.
                _ = try connection.execute(unsafeSQL: "VACUUM (SKIP_LOCKED) rollup_delta, install_delta")
            }
            // The table keeps its emptied pages (vacuum_truncate = false, so that ingest
            // never waits on the lock a truncation takes). After a burst — an import of
            // history, compaction stopped for a while — that is many empty pages that
            // every report reads (the deltas have no index). Give them back then: the
            // lock is taken only if free, and is rare. Checked on every pass, not only one
            // that moved rows: a pass whose vacuums were skipped (an autovacuum held the
            // table) is made good by the next one even when no event comes meanwhile.
            if !result.more {
                for table in ["rollup_delta", "install_delta"]
                where try Citus.mainForkBytes(table, on: connection) > Int64(Self.shrinkDeltaTableAboveMB) * 1_048_576 {
                    _ = try connection.execute(unsafeSQL: "VACUUM (SKIP_LOCKED, TRUNCATE) \(table)")
                }
            }
            return result
        }
    }

    /// Passes of at least this many rollup delta rows plan on fresh statistics of the
    /// delta tables (`analyzeDeltasIfStale`).
    static let analyzeDeltasFromRows = 100

    /// The columns `analyzeDeltasIfStale` gathers statistics of, beside the row count
    /// (what the plans needed): those a pass bounds and keys the deltas by (the hash
    /// arrays' statistics would cost the most).
    static let analyzedDeltaColumns = ["rollup_delta": "app_id, bucket, network, format, country, currency", "install_delta": "app_id, bucket, device"]

    /// Refreshes the delta tables' statistics when they say fewer rows than a pass of
    /// `rows` rollup delta rows moves (an install delta table holds about four times as
    /// many). Every pass empties the tables and the VACUUM after it records them empty
    /// (they keep their pages: `vacuum_truncate = false`), so the next pass's statement
    /// was planned for one row: nested loops that rescan one CTE for every row of
    /// another, quadratic in the pass (155 s for one day of the bench's largest app,
    /// 114,243 install deltas, against 1.8 s on fresh statistics). An ANALYZE of those
    /// columns samples at most 30,000 rows; on a pass of a hundred rows it reads a few
    /// pages. It runs in the pass's transaction (ingest's inserts do not wait on its
    /// lock) and skips a table an autovacuum or an operator's VACUUM holds (the pass never
    /// waits for one). Not on Citus (the pass does not call it there): the shards are
    /// planned on the workers by their own statistics.
    static func analyzeDeltasIfStale(_ connection: PostgresConnection, rows: Int) throws {
        guard rows >= analyzeDeltasFromRows else { return }
        let stale = try connection.query("""
            SELECT c.relname FROM pg_class c
            WHERE c.oid IN ('rollup_delta'::regclass, 'install_delta'::regclass) AND c.reltuples < \(rows)
            ORDER BY c.relname
            """).map { try $0.decode(0, as: String.self) }
        guard !stale.isEmpty else { return }
        let tables = stale.map { "\($0) (\(analyzedDeltaColumns[$0]!))" }.joined(separator: ", ")
        _ = try connection.execute(unsafeSQL: "ANALYZE (SKIP_LOCKED) " + tables)
    }

    /// A duration as whole milliseconds (at least 1), as `statement_timeout` takes it.
    static func milliseconds(_ duration: Duration) -> Int {
        max(1, Int(duration.components.seconds * 1000 + duration.components.attoseconds / 1_000_000_000_000_000))
    }

    /// The next pass's rows after one that moved `moved` of a budget of `rows` in `elapsed`:
    /// smaller in proportion when it took longer than the target, twice as many (up to
    /// the most) when a backlog pass took under half of it.
    /// A pass that emptied the deltas ends a backlog: the next one starts again at `start`.
    static func nextBudget(rows: Int, moved: Int, more: Bool, elapsed: Duration, limits: PassLimits) -> Int {
        let start = min(limits.start, limits.rows)
        if elapsed > limits.target {
            let scaled = Double(moved) * (limits.target / elapsed)
            return max(1, min(rows, more ? Int(scaled) : min(Int(scaled), start)))
        }
        if !more { return min(rows, start) }
        if elapsed < limits.target / 2 { return min(limits.rows, rows * 2) }
        return rows
    }

    /// Re-prices one chunk of the ranges a card change left dirty (`RatePricing.repriceChunk`):
    /// true when it did (more may be left), false when nothing is dirty or another
    /// process holds the compaction lock.
    public func repriceOnce() async throws -> Bool {
        let started = ContinuousClock.now
        let now = ContinuousClock.now
        let skipped = failedApps.withLock { failed in
            failed = failed.filter { $0.value > now }
            return Array(failed.keys)
        }
        do {
            let done = try await pool.withConnection { try RatePricing.repriceChunk(skipping: skipped, on: $0) }
            if done == true { repriceTimer.record(duration: ContinuousClock.now - started) }
            return done == true
        } catch let failure as RatePricing.ChunkFailed {
            // Its reports stay right (priced at query time); the other apps go on meanwhile.
            failedApps.withLock { $0[failure.app] = ContinuousClock.now + Self.repriceRetryAfter }
            repriceFailures.increment()
            throw failure
        }
    }

    /// How long an app whose re-pricing failed is passed over.
    static let repriceRetryAfter: Duration = .seconds(300)

    /// Re-prices chunks until nothing is dirty or `budget` has passed; true when it stopped
    /// on the budget (more is dirty).
    @discardableResult
    public func reprice(for budget: Duration = .seconds(3)) async throws -> Bool {
        let deadline = ContinuousClock.now + budget
        while try await repriceOnce() {
            if ContinuousClock.now >= deadline { return true }
        }
        return false
    }

    /// Deletes every delta row the statement sees (rows committed later stay for the
    /// next pass; `boundedMoveStatement`: those of the (bucket, app) groups before `($1, $2)`) and adds their sums to every compacted table (15-minute, hourly and
    /// daily grains, Migrations/0004; priced, Migrations/0012); returns the number of
    /// rows moved. Whole-table, not by ctid: on Citus a ctid names a row only within
    /// one shard. No ORDER BY: only one compactor writes the compacted tables at a
    /// time, so row lock order cannot deadlock, and hashing the groups is cheaper than
    /// sorting the deltas twice.
    /// `moveStatement` for the (bucket, app) groups before `($1, $2)` only.
    static let boundedMoveStatement = moveStatement.replacingOccurrences(
        of: "DELETE FROM rollup_delta RETURNING *", with: "DELETE FROM rollup_delta WHERE (bucket, app_id) < ($1, $2) RETURNING *"
    )
    /// `moveStatement` for the (bucket, app) groups up to `($1, $2)` only.
    static let throughMoveStatement = moveStatement.replacingOccurrences(
        of: "DELETE FROM rollup_delta RETURNING *", with: "DELETE FROM rollup_delta WHERE (bucket, app_id) <= ($1, $2) RETURNING *"
    )

    static let moveStatement = """
        WITH moved AS (
            DELETE FROM rollup_delta RETURNING *
        ), keyed AS (
            -- The deltas summed per 15-minute key once (a pass moves many groups' rows per
            -- key); every grain below sums these fewer rows.
            SELECT app_id, bucket, network, format, country, currency, sum(requests) AS requests, sum(loads) AS loads,
                   sum(impressions) AS impressions, sum(errors) AS errors, sum(taps) AS taps,
                   sum(action_cancels) AS action_cancels, sum(expiries) AS expiries, sum(wasted_fills) AS wasted_fills, sum(sessions) AS sessions,
                   sum(revenue_micros) AS revenue_micros, sum(priced_events) AS priced_events,
                   sum(unpriced_impressions) AS unpriced_impressions, sum(unpriced_taps) AS unpriced_taps
            FROM moved GROUP BY 1, 2, 3, 4, 5, 6
        ), counts AS (
            INSERT INTO rollup_15m_compacted AS r
                (app_id, bucket, network, format, requests, loads, impressions, errors, taps, action_cancels, expiries, wasted_fills, sessions)
            SELECT app_id, bucket, network, format, sum(requests), sum(loads), sum(impressions), sum(errors),
                   sum(taps), sum(action_cancels), sum(expiries), sum(wasted_fills), sum(sessions)
            FROM keyed GROUP BY app_id, bucket, network, format
            ON CONFLICT (app_id, bucket, network, format) DO UPDATE SET \(countsUpdate)
            RETURNING 1
        ), revenue AS (
            INSERT INTO rollup_revenue_15m_compacted AS r
                (app_id, bucket, network, format, country, currency, revenue_micros, priced_events, unpriced_impressions, unpriced_taps)
            SELECT app_id, bucket, network, format, country, currency, revenue_micros, priced_events, unpriced_impressions, unpriced_taps
            FROM keyed WHERE country IS NOT NULL
            ON CONFLICT (app_id, bucket, network, format, country, currency) DO UPDATE SET
                revenue_micros = r.revenue_micros + excluded.revenue_micros,
                priced_events = r.priced_events + excluded.priced_events,
                unpriced_impressions = r.unpriced_impressions + excluded.unpriced_impressions,
                unpriced_taps = r.unpriced_taps + excluded.unpriced_taps
            RETURNING 1
        ), hourly AS (
            INSERT INTO rollup_1h_compacted AS r
                (app_id, hour, network, format, requests, loads, impressions, errors, taps, action_cancels, expiries, wasted_fills, sessions)
            SELECT app_id, date_trunc('hour', bucket, 'UTC'), network, format, sum(requests), sum(loads), sum(impressions),
                   sum(errors), sum(taps), sum(action_cancels), sum(expiries), sum(wasted_fills), sum(sessions)
            FROM keyed GROUP BY 1, 2, 3, 4
            ON CONFLICT (app_id, hour, network, format) DO UPDATE SET \(countsUpdate)
            RETURNING 1
        ), hourly_revenue AS (
            -- Reported revenue per currency, and ('' currency) the impressions and taps without
            -- it over all countries; per country apart, for rate cards (Migrations/0005).
            INSERT INTO rollup_revenue_1h_compacted AS r (app_id, hour, network, format, currency, revenue_micros, unpriced_impressions, unpriced_taps)
            SELECT app_id, date_trunc('hour', bucket, 'UTC'), network, format, currency, sum(revenue_micros), sum(unpriced_impressions), sum(unpriced_taps)
            FROM keyed WHERE country IS NOT NULL GROUP BY 1, 2, 3, 4, 5
            ON CONFLICT (app_id, hour, network, format, currency) DO UPDATE SET \(revenueUpdate)
            RETURNING 1
        ), hourly_unpriced AS (
            INSERT INTO rollup_unpriced_1h_compacted AS r (app_id, country, hour, network, format, impressions, taps)
            SELECT app_id, country, date_trunc('hour', bucket, 'UTC'), network, format, sum(unpriced_impressions), sum(unpriced_taps)
            FROM keyed WHERE currency = '' GROUP BY 1, 2, 3, 4, 5
            ON CONFLICT (app_id, country, hour, network, format) DO UPDATE SET \(unpricedUpdate)
            RETURNING 1
        ), local AS (
            -- Each app's local date, in its own (fixed) zone: one conversion per key, not per delta row.
            SELECT k.*, (k.bucket AT TIME ZONE a.timezone)::date AS day, (k.bucket AT TIME ZONE 'UTC')::date AS utc_day
            FROM keyed k JOIN apps a USING (app_id)
        ), daily AS (
            INSERT INTO rollup_day_compacted AS r
                (app_id, day, network, format, requests, loads, impressions, errors, taps, action_cancels, expiries, wasted_fills, sessions)
            SELECT app_id, day, network, format, sum(requests), sum(loads), sum(impressions),
                   sum(errors), sum(taps), sum(action_cancels), sum(expiries), sum(wasted_fills), sum(sessions)
            FROM local GROUP BY 1, 2, 3, 4
            ON CONFLICT (app_id, day, network, format) DO UPDATE SET \(countsUpdate)
            RETURNING 1
        ), daily_revenue AS (
            INSERT INTO rollup_revenue_day_compacted AS r
                (app_id, day, utc_day, network, format, currency, revenue_micros, unpriced_impressions, unpriced_taps)
            SELECT app_id, day, utc_day, network, format, currency, sum(revenue_micros), sum(unpriced_impressions), sum(unpriced_taps)
            FROM local WHERE country IS NOT NULL GROUP BY 1, 2, 3, 4, 5, 6
            ON CONFLICT (app_id, day, utc_day, network, format, currency) DO UPDATE SET \(revenueUpdate)
            RETURNING 1
        ), daily_unpriced AS (
            INSERT INTO rollup_unpriced_day_compacted AS r (app_id, country, day, utc_day, network, format, impressions, taps)
            SELECT app_id, country, day, utc_day, network, format, sum(unpriced_impressions), sum(unpriced_taps)
            FROM local WHERE currency = '' GROUP BY 1, 2, 3, 4, 5, 6
            ON CONFLICT (app_id, country, day, utc_day, network, format) DO UPDATE SET \(unpricedUpdate)
            RETURNING 1
        ), priceable AS MATERIALIZED (
            -- Money priced as it is folded (Migrations/0012): reported revenue as it is,
            -- impressions and taps without it at the card in force on their UTC date.
            SELECT app_id, bucket, day, utc_day AS u, network, format, country, currency, revenue_micros,
                   unpriced_impressions AS ui, unpriced_taps AS ut
            FROM local WHERE country IS NOT NULL
        ), \(RatePricing.pricesCTE("prices", of: "priceable")), priced_hourly AS (
            INSERT INTO rollup_priced_1h AS r (app_id, hour, network, format, currency, reported, estimated, unrated)
            SELECT s.app_id, date_trunc('hour', s.bucket, 'UTC'), s.network, s.format, \(RatePricing.pricedColumns("s"))
            FROM priceable s \(RatePricing.join("s", prices: "prices"))
            GROUP BY 1, 2, 3, 4, 5
            ON CONFLICT (app_id, hour, network, format, currency) DO UPDATE SET \(pricedUpdate)
            RETURNING 1
        ), priced_daily AS (
            INSERT INTO rollup_priced_day AS r (app_id, day, utc_day, network, format, currency, reported, estimated, unrated)
            SELECT s.app_id, s.day, s.u, s.network, s.format, \(RatePricing.pricedColumns("s"))
            FROM priceable s \(RatePricing.join("s", prices: "prices"))
            GROUP BY 1, 2, 3, 4, 5, 6
            ON CONFLICT (app_id, day, network, format, utc_day, currency) DO UPDATE SET \(pricedUpdate)
            RETURNING 1
        ), series_changes AS (
            -- The local days whose report series must be written again (Migrations/0012).
            INSERT INTO report_series_changes AS c (app_id, from_day, to_day)
            SELECT app_id, min(day), max(day) FROM local GROUP BY app_id
            ON CONFLICT (app_id) DO UPDATE SET
                from_day = least(c.from_day, excluded.from_day), to_day = greatest(c.to_day, excluded.to_day), version = c.version + 1
            RETURNING 1
        ), devices AS (
            -- Unique-device sketches (hll(11, 5, 0): no explicit list of hashes, Migrations/0028) of the hashes the deltas
            -- carry, and of the impressions' devices (the ad viewers, Migrations/0014):
            -- a viewer is a device of the same row, so every viewers row has a devices row.
            -- One aggregate over both kinds of hash, not two joined: the delta table's
            -- statistics say it is empty (it is emptied every pass), and on that estimate
            -- PostgreSQL joined the two by a nested loop that aggregated the viewers again
            -- for every row: 14 of a 15 s pass on the bench's data (auto_explain).
            SELECT app_id, bucket, network, format,
                   hll_add_agg(h::hll_hashval, 11, 5, 0) FILTER (WHERE NOT viewer) AS devices,
                   CASE WHEN bool_or(viewer) THEN hll_add_agg(h::hll_hashval, 11, 5, 0) FILTER (WHERE viewer) END AS viewers
            FROM (SELECT app_id, bucket, network, format, h, false AS viewer FROM moved, unnest(moved.device_hashes) AS h
                  UNION ALL
                  SELECT app_id, bucket, network, format, h, true FROM moved, unnest(moved.viewer_hashes) AS h) AS x
            GROUP BY 1, 2, 3, 4
            HAVING bool_or(NOT viewer)
        ), devices_15m AS (
            INSERT INTO rollup_devices_15m_compacted AS r (app_id, bucket, network, format, devices, viewers)
            SELECT app_id, bucket, network, format, devices, viewers FROM devices
            ON CONFLICT (app_id, bucket, network, format) DO UPDATE SET \(devicesUpdate)
            RETURNING 1
        ), devices_1h AS (
            INSERT INTO rollup_devices_1h_compacted AS r (app_id, hour, network, format, devices, viewers)
            SELECT app_id, date_trunc('hour', bucket, 'UTC'), network, format, hll_union_agg(devices), hll_union_agg(viewers) FROM devices GROUP BY 1, 2, 3, 4
            ON CONFLICT (app_id, hour, network, format) DO UPDATE SET \(devicesUpdate)
            RETURNING 1
        ), devices_day AS (
            INSERT INTO rollup_devices_day_compacted AS r (app_id, day, network, format, devices, viewers)
            SELECT d.app_id, (d.bucket AT TIME ZONE a.timezone)::date, d.network, d.format, hll_union_agg(d.devices), hll_union_agg(d.viewers)
            FROM devices d JOIN apps a USING (app_id) GROUP BY 1, 2, 3, 4
            ON CONFLICT (app_id, day, network, format) DO UPDATE SET \(devicesUpdate)
            RETURNING 1
        ), devices_app_day AS (
            -- The app's devices of the day over every network and format (Migrations/0022).
            INSERT INTO rollup_devices_app_day AS r (app_id, day, devices, viewers)
            SELECT d.app_id, (d.bucket AT TIME ZONE a.timezone)::date, hll_union_agg(d.devices), hll_union_agg(d.viewers)
            FROM devices d JOIN apps a USING (app_id) GROUP BY 1, 2
            ON CONFLICT (app_id, day) DO UPDATE SET \(devicesUpdate)
            RETURNING 1
        )
        SELECT count(*)::bigint FROM moved
        """

    static let revenueUpdate = """
        revenue_micros = r.revenue_micros + excluded.revenue_micros, \
        unpriced_impressions = r.unpriced_impressions + excluded.unpriced_impressions, unpriced_taps = r.unpriced_taps + excluded.unpriced_taps
        """

    static let pricedUpdate = "reported = r.reported + excluded.reported, estimated = r.estimated + excluded.estimated, unrated = r.unrated + excluded.unrated"

    /// Sketches merged; a side without viewers (NULL) keeps the other's.
    static let devicesUpdate = """
        devices = hll_union(r.devices, excluded.devices), \
        viewers = CASE WHEN r.viewers IS NULL THEN excluded.viewers WHEN excluded.viewers IS NULL THEN r.viewers \
        ELSE hll_union(r.viewers, excluded.viewers) END
        """

    static let unpricedUpdate = "impressions = r.impressions + excluded.impressions, taps = r.taps + excluded.taps"

    static let countsUpdate = """
        requests = r.requests + excluded.requests, loads = r.loads + excluded.loads, \
        impressions = r.impressions + excluded.impressions, errors = r.errors + excluded.errors, \
        taps = r.taps + excluded.taps, action_cancels = r.action_cancels + excluded.action_cancels, \
        expiries = r.expiries + excluded.expiries, wasted_fills = r.wasted_fills + excluded.wasted_fills, \
        sessions = r.sessions + excluded.sessions
        """
}
