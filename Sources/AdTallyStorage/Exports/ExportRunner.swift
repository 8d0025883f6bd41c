import AdTallyCore
import Foundation
import Logging
import Metrics
import NIOPosix
import PostgresKit
import Synchronization

/// Runs due export slots (DESIGN §5): one runner across every server on a database.
///
/// Election: a runner leads while it holds a session advisory lock on a connection of
/// its own (`leaderPool`, one connection). Every claim and every finish goes through
/// that connection, so a runner whose connection died — and with it the lock, which
/// another server then takes — cannot record anything more.
///
/// Exactly once: the leader plans each due slot as a row of `export_runs` (primary
/// key schedule, slot, pass — inserting it again does nothing), claims rows one at a
/// time, writes the file under a temporary name, and in one transaction on the leader
/// connection checks its claim still stands (`FOR UPDATE`), renames the file and its
/// manifest into place and marks the row succeeded. A leader that dies mid-file leaves
/// its row `running`; the next leader marks such rows for retry before anything else.
///
/// Slots missed while no server ran are caught up when a leader starts, up to
/// `catchUp` back; older ones are counted on the schedule as skipped and logged.
/// A failed attempt is retried after 30 s, 1, 2, 4 … minutes (at most an hour), up
/// to `maxAttempts`, then the run is `failed` until `adtally exports run-now --slot`.
/// A file whose days were provisional gets pass 2 once they are final: written again
/// as `NAME-SLOT.final.csv`, the first file untouched.
public final class ExportRunner: Sendable {
    /// How the runner behaves.
    public struct Configuration: Sendable {
        /// This server, as runs and `adtally status` name it.
        public var identity: String
        /// How far back missed slots are still written.
        public var catchUp: Duration = .seconds(7 * 86_400)
        /// How often the leader looks for due slots, and a follower for the lock.
        public var tick: Duration = .seconds(5)
        /// Attempts before a run is `failed`.
        public var maxAttempts = 8
        /// Wait after the first failure; doubles each time, to `retryCap`.
        public var retryBase: Duration = .seconds(30)
        /// Longest wait between attempts.
        public var retryCap: Duration = .seconds(3600)
        /// Most slots one schedule plans in one pass (a per-minute schedule after a week down).
        public var maxSlotsPerPass = 10_000
        /// The folder every destination must resolve inside (`Settings.exportsRoot`); nil
        /// refuses every run.
        public var exportsRoot: String?
        /// The time (tests run a faster clock).
        public var now: @Sendable () -> Date = { Date() }
        /// Test hook: awaited after each chunk of rows is written (to stop a run mid-file).
        public var afterChunk: (@Sendable (_ file: String) async throws -> Void)?
        /// The networks' report pulls (DESIGN §11), run by the same leader with the same
        /// retries and run history; nil: none.
        public var pulls: NetworkPulls?

        /// Defaults for a server.
        public init(identity: String) { self.identity = identity }
    }

    /// The advisory lock key ("AdTally export runner").
    public static let lockKey: Int64 = 0x4164_5461_6C6C_7905

    let configuration: Configuration
    let leaderPool: PostgresPool
    let engine: ReportEngine
    let logger: Logger
    private let leading = Mutex(false)
    private let leaderGauge = Gauge(label: "adtally_export_runner_leader")
    private let runsCounter = Counter(label: "adtally_export_runs_total", dimensions: [("outcome", "succeeded")])
    private let failuresCounter = Counter(label: "adtally_export_runs_total", dimensions: [("outcome", "failed")])

    /// A runner; `leaderPool` should be a pool of one connection of its own.
    public init(configuration: Configuration, leaderPool: PostgresPool, engine: ReportEngine, logger: Logger = Logger(label: "adtally.exports")) {
        self.configuration = configuration
        self.leaderPool = leaderPool
        self.engine = engine
        self.logger = logger
    }

    /// Whether this runner leads now.
    public var isLeader: Bool { leading.withLock { $0 } }

    /// Runs until cancelled: waits for leadership, then runs slots while it leads.
    public func run() async {
        let configuration = configuration
        await Leadership(lockKey: Self.lockKey, role: "export runner", table: "export_leader", identity: configuration.identity, tick: configuration.tick, logger: logger).run(
            pool: leaderPool, leading: { self.setLeading($0) }, take: { try Self.takeLead($0, configuration) }, lead: { try await self.lead($0) }
        )
    }

    private func setLeading(_ value: Bool) {
        leading.withLock { $0 = value }
        leaderGauge.record(value ? 1 : 0)
    }

    /// What a new leader does first, on the lock's connection.
    static func takeLead(_ connection: PostgresConnection, _ configuration: Configuration) throws {
        // Rows left running belong to a runner that is gone (its lock was free). They count
        // as failed attempts, with the same backoff and limit: a run that kills the server
        // must not be run again at once by every server that takes over.
        _ = try connection.query("""
            UPDATE export_runs SET status = CASE WHEN attempts >= \(configuration.maxAttempts) THEN 'failed' ELSE 'retrying' END,
                   next_attempt_at = now() + least(
                       make_interval(secs => \(Self.seconds(configuration.retryBase)) * power(2, least(greatest(attempts, 1) - 1, 20))),
                       make_interval(secs => \(Self.seconds(configuration.retryCap)))),
                   finished_at = now(), error = 'the runner (' || coalesce(runner, '?') || ') stopped during this attempt'
            WHERE status = 'running'
            """)
        if configuration.pulls != nil { try NetworkPulls.recover(connection, maxAttempts: configuration.maxAttempts) }
    }

    static func seconds(_ duration: Duration) -> Double {
        Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
    }

    /// While leading: plan, run what is due, wait a tick; until cancelled or the lease's connection fails.
    func lead(_ lease: PostgresLease) async throws {
        while !Task.isCancelled {
            do {
                try await pass(lease)
            } catch where Task.isCancelled {
                break
            }
            try? await Task.sleep(for: configuration.tick)
        }
    }

    /// One pass of a leader: plans due slots and runs every runnable one.
    func pass(_ lease: PostgresLease) async throws {
        let now = configuration.now()
        let configuration = configuration
        let skipped = try await lease.run { connection in try Self.plan(connection, now: now, configuration: configuration) }
        for (schedule, count, last) in skipped {
            logger.warning("export slots missed by more than the catch-up limit are skipped", metadata: [
                "schedule": "\(schedule)", "skipped": "\(count)", "last": "\(last)", "catch_up_seconds": "\(configuration.catchUp.components.seconds)",
            ])
        }
        while !Task.isCancelled, let claim = try await lease.run({ try Self.claim($0, now: configuration.now(), runner: configuration.identity) }) {
            try await execute(claim, lease: lease)
        }
        // The networks' reports: today's pull of each (UTC), then whatever is due.
        if let pulls = configuration.pulls {
            try await lease.run { connection in try NetworkPulls.plan(connection, now: now) }
            while !Task.isCancelled, let claim = try await lease.run({ try NetworkPulls.claim($0, now: configuration.now(), runner: configuration.identity) }) {
                try await pulls.execute(
                    claim, lease: lease, runner: configuration.identity, maxAttempts: configuration.maxAttempts,
                    backoff: { Self.backoff(attempt: $0, configuration) }, logger: logger
                )
            }
        }
    }

    /// Plans every due slot as a run row; returns the schedules that skipped slots.
    static func plan(_ connection: PostgresConnection, now: Date, configuration: Configuration) throws -> [(String, Int, String)] {
        try connection.withTransaction { connection in
            var skipped: [(String, Int, String)] = []
            let schedules = try connection.query("""
                SELECT name, cron, timezone, paused, planned_through FROM export_schedules ORDER BY name FOR UPDATE
                """)
            let nowSeconds = Int64(now.timeIntervalSince1970.rounded(.down))
            let oldest = nowSeconds - configuration.catchUp.components.seconds
            for row in schedules {
                let name = try row.decode(0, as: String.self)
                let planned = Int64(try row.decode(4, as: Date.self).timeIntervalSince1970.rounded(.down))
                guard planned < nowSeconds else { continue }
                var through = nowSeconds
                if try !row.decode(3, as: Bool.self), let cron = try? CronSchedule(try row.decode(1)), let zone = TimeZone(identifier: try row.decode(2)) {
                    var slots = cron.slots(after: planned, through: nowSeconds, in: zone, limit: configuration.maxSlotsPerPass)
                    if slots.count == configuration.maxSlotsPerPass, let last = slots.last {
                        // Cut before the last instant: the wall times a spring-forward skips share
                        // it, and the next pass starts after it, so none of them may be left behind.
                        slots.removeAll { $0.due == last.due }
                        through = last.due - 1
                    }
                    var missed = 0
                    for slot in slots {
                        if slot.due < oldest {
                            missed += 1
                            continue
                        }
                        try connection.query("""
                            INSERT INTO export_runs (schedule, slot, pass, due_at, status, trigger, next_attempt_at)
                            VALUES (\(name), \(slot.name), 1, \(slot.dueDate), 'pending', 'schedule', \(slot.dueDate))
                            ON CONFLICT DO NOTHING
                            """)
                    }
                    if missed > 0, let last = slots.filter({ $0.due < oldest }).last {
                        try connection.query("""
                            UPDATE export_schedules SET skipped_slots = skipped_slots + \(missed), last_skipped = \(last.name) WHERE name = \(name)
                            """)
                        skipped.append((name, missed, last.name))
                    }
                }
                try connection.query("UPDATE export_schedules SET planned_through = \(Date(timeIntervalSince1970: TimeInterval(through))) WHERE name = \(name)")
            }
            // Provisional files whose days are final now: their second pass (the same
            // slot, so the same report days; due when they turned final).
            // Clearing final_due_at marks a pass 1 done with, so this reads only new ones.
            try connection.query("""
                WITH due AS (
                    UPDATE export_runs SET final_due_at = NULL
                    WHERE pass = 1 AND status = 'succeeded' AND file_status = 'provisional' AND final_due_at <= \(now)
                    RETURNING schedule, slot, due_at
                )
                INSERT INTO export_runs (schedule, slot, pass, due_at, status, trigger, next_attempt_at)
                SELECT schedule, slot, 2, due_at, 'pending', 'final', \(now) FROM due
                ON CONFLICT DO NOTHING
                """)
            return skipped
        }
    }

    /// A claimed run and its schedule.
    struct Claim: Sendable {
        var schedule: ExportSchedule
        var slot: String
        var pass: Int
        var dueAt: Date
        var attempt: Int
    }

    /// Claims the next runnable run, oldest first.
    static func claim(_ connection: PostgresConnection, now: Date, runner: String) throws -> Claim? {
        let rows = try connection.query("""
            WITH next AS (
                SELECT schedule, slot, pass FROM export_runs r
                WHERE status IN ('pending', 'retrying') AND next_attempt_at <= \(now)
                  AND NOT EXISTS (SELECT 1 FROM export_schedules s WHERE s.name = r.schedule AND s.paused)
                ORDER BY next_attempt_at, schedule, slot, pass LIMIT 1 FOR UPDATE SKIP LOCKED
            )
            UPDATE export_runs r SET status = 'running', attempts = attempts + 1, runner = \(runner), started_at = now(),
                   finished_at = NULL, duration_ms = NULL
            FROM next WHERE (r.schedule, r.slot, r.pass) = (next.schedule, next.slot, next.pass)
            RETURNING r.schedule, r.slot, r.pass, r.due_at, r.attempts
            """)
        guard let row = rows.first else { return nil }
        let name = try row.decode(0, as: String.self)
        guard let schedule = try connection.query("SELECT \(unsafeRaw: ExportStore.scheduleColumns) FROM export_schedules WHERE name = \(name)").first else {
            return nil
        }
        return Claim(
            schedule: try ExportStore.schedule(schedule), slot: try row.decode(1), pass: try row.decode(2), dueAt: try row.decode(3), attempt: try row.decode(4)
        )
    }

    /// Writes one claimed run's file and records the outcome.
    func execute(_ claim: Claim, lease: PostgresLease) async throws {
        let started = ContinuousClock.now
        let schedule = claim.schedule
        let relative = schedule.fileName(slot: claim.slot, isFinalRewrite: claim.pass == 2)
        var rows: Int64 = 0
        do {
            // File work (open, write, fsync) blocks: it runs on NIO's blocking pool, never on
            // the cooperative threads HTTP and ingest run on.
            guard let root = configuration.exportsRoot else { throw ExportScheduleError("dir", "this server has no exports root, and writes no export") }
            let directory = schedule.directory
            let file = try await NIOThreadPool.singleton.runIfActive {
                try ExportFile(path: try ExportFile.resolve(directory: directory, root: root) + "/" + relative)
            }
            let written = schedule.kind == .reconciliation
                ? try await writeReconciliation(claim, relative: relative, to: file)
                : try await writeReport(claim, relative: relative, to: file)
            rows = written.rows
            let (sha256, isFinal, finalDue, manifestJSON) = (written.sha256, written.isFinal, written.finalDue, written.manifest)
            let bytes = file.bytes, rowCount = rows
            let durationMs = Self.milliseconds(ContinuousClock.now - started)
            let runner = configuration.identity
            let committed = try await lease.run { connection in
                try connection.withTransaction { connection -> Bool in
                    // The claim must still be ours: the row lock keeps a new leader's
                    // recovery waiting until the files are in place and the row says so.
                    guard try !connection.query("""
                        SELECT 1 FROM export_runs WHERE schedule = \(schedule.name) AND slot = \(claim.slot) AND pass = \(claim.pass)
                               AND status = 'running' AND attempts = \(claim.attempt) AND runner = \(runner) FOR UPDATE
                        """).isEmpty else { return false }
                    try file.commit(manifest: manifestJSON)
                    try connection.query("""
                        UPDATE export_runs SET status = 'succeeded', finished_at = now(), duration_ms = \(durationMs), rows = \(rowCount),
                               bytes = \(bytes), sha256 = \(sha256), file = \(relative), file_status = \(isFinal ? "final" : "provisional"),
                               final_due_at = \(claim.pass == 1 ? finalDue : nil), error = NULL
                        WHERE schedule = \(schedule.name) AND slot = \(claim.slot) AND pass = \(claim.pass)
                        """)
                    return true
                }
            }
            if committed {
                runsCounter.increment()
                logger.info("export written", metadata: [
                    "schedule": "\(schedule.name)", "slot": "\(claim.slot)", "file": "\(relative)", "rows": "\(rows)", "bytes": "\(bytes)",
                    "status": "\(isFinal ? "final" : "provisional")",
                ])
            } else {
                logger.warning("export claim lost before its file was committed; not written", metadata: ["schedule": "\(schedule.name)", "slot": "\(claim.slot)"])
            }
        } catch let wait as StillProvisional {
            // Never sooner than a tick by this runner's clock: the database's clock named
            // `until`, and a runner ahead of it would claim the row again at once.
            let until = max(wait.until ?? Date().addingTimeInterval(3600), configuration.now().addingTimeInterval(Self.seconds(configuration.tick)))
            let runner = configuration.identity
            logger.info("final export waits: its days are still provisional", metadata: ["schedule": "\(schedule.name)", "slot": "\(claim.slot)", "until": "\(until)"])
            try await lease.run { connection in
                _ = try connection.query("""
                    UPDATE export_runs SET status = 'pending', attempts = attempts - 1, next_attempt_at = \(until), finished_at = now(),
                           error = 'waiting: days still provisional until ' || \(until)::text
                    WHERE schedule = \(schedule.name) AND slot = \(claim.slot) AND pass = 2 AND attempts = \(claim.attempt)
                          AND runner = \(runner) AND status = 'running'
                    """)
            }
        } catch {
            failuresCounter.increment()
            let interrupted = Task.isCancelled
            let message = interrupted ? "interrupted: the server was shutting down" : "\(error)"
            logger.error("export run failed", metadata: [
                "schedule": "\(schedule.name)", "slot": "\(claim.slot)", "attempt": "\(claim.attempt)", "error": "\(message)",
            ])
            let retry = interrupted ? Duration.zero : Self.backoff(attempt: claim.attempt, configuration)
            let gaveUp = !interrupted && claim.attempt >= configuration.maxAttempts
            let durationMs = Self.milliseconds(ContinuousClock.now - started)
            let runner = configuration.identity
            try await lease.run { connection in
                _ = try connection.query("""
                    UPDATE export_runs SET status = \(gaveUp ? "failed" : "retrying"), finished_at = now(), duration_ms = \(durationMs),
                           next_attempt_at = now() + make_interval(secs => \(Double(retry.components.seconds))), error = \(message)
                    WHERE schedule = \(schedule.name) AND slot = \(claim.slot) AND pass = \(claim.pass) AND attempts = \(claim.attempt)
                          AND runner = \(runner) AND status = 'running'
                    """)
            }
            if interrupted { throw CancellationError() }
        }
    }

    /// What a run wrote: its rows, the file's hash, whether it is final (and when a
    /// final rewrite is due otherwise), and its manifest.
    struct Written {
        var rows: Int64
        var sha256: String
        var isFinal: Bool
        var finalDue: Date?
        var manifest: [UInt8]
    }

    /// Streams a report slot's rows into `file`.
    func writeReport(_ claim: Claim, relative: String, to file: ExportFile) async throws -> Written {
        let schedule = claim.schedule
        var rows: Int64 = 0
        let query = try schedule.reportQuery(at: claim.dueAt, readable: try await engine.readableApps(only: nil))
        @Sendable func write(_ bytes: [UInt8]) async throws { try await NIOThreadPool.singleton.runIfActive { try file.write(bytes) } }
        let layout = ReportLayout(query: query)
        var summary: ReportSummary?
        var buffer: [UInt8] = []
        buffer.reserveCapacity(1 << 16)
        let afterChunk = configuration.afterChunk
        let totals = try await engine.stream(query, withSummary: true, withTotals: schedule.format == .json) { head in
            summary = head
            // The final rewrite waits while any day may still change (the database's
            // clock decides, as in every report's notes).
            if claim.pass == 2, let head, !head.notes.provisionalDays.isEmpty {
                throw StillProvisional(until: head.notes.finalAt.map { Date(timeIntervalSince1970: TimeInterval($0)) })
            }
            switch schedule.format {
            case .csv: ReportText.appendCSVRecord(layout.columns.map { .text($0.name) }, to: &buffer)
            case .json: buffer = ReportDocument.jsonHead(layout)
            }
            try await write(buffer)
        } rows: { chunk in
            buffer.removeAll(keepingCapacity: true)
            for row in chunk {
                switch schedule.format {
                case .csv: layout.appendCSV(row, to: &buffer)
                case .json: ReportDocument.appendJSONRow(row, layout: layout, isFirst: rows == 0, to: &buffer)
                }
                rows += 1
            }
            try await write(buffer)
            try await afterChunk?(relative)
        }
        guard let summary else { throw ExportFileError(relative, "the report returned no summary") }
        if schedule.format == .json {
            buffer.removeAll(keepingCapacity: true)
            ReportDocument(layout: layout, rows: [], totals: totals ?? ReportCounts(), previousTotals: summary.previousTotals, notes: summary.notes, nextCursor: nil)
                .appendJSONTail(to: &buffer)
            buffer.append(0x0A)
            try await write(buffer)
        }
        let sha256 = try await NIOThreadPool.singleton.runIfActive { try file.finish() }
        let isFinal = summary.notes.provisionalDays.isEmpty
        var manifest = ExportManifest(
            schedule: schedule.name, slot: claim.slot, rows: rows, bytes: file.bytes, sha256: sha256, isFinal: isFinal,
            file: String(relative.split(separator: "/").last!), provisionalDays: summary.notes.provisionalDays, generatedAt: Date()
        )
        manifest.readFrom = summary.notes.readFrom
        let manifestJSON = manifest.json(query: query)
        let finalDue = isFinal ? nil : summary.notes.finalAt.map { Date(timeIntervalSince1970: TimeInterval($0)) }
        return Written(rows: rows, sha256: sha256, isFinal: isFinal, finalDue: finalDue, manifest: manifestJSON)
    }

    /// Writes a reconciliation slot (`kind` reconciliation): the discrepancy report of
    /// `GET /v1/reconciliation` for the slot's days, whole (at most
    /// `ReconciliationEngine.maxRows` rows). Final when every row's network days are
    /// final; a later import changes it, so there is no final rewrite to wait for.
    func writeReconciliation(_ claim: Claim, relative: String, to file: ExportFile) async throws -> Written {
        let schedule = claim.schedule
        let query = try schedule.reconciliationQuery(at: claim.dueAt, readable: try await engine.readableApps(only: nil))
        let document = try await ReconciliationEngine(reports: engine).run(query)
        let bytes = schedule.format == .json ? document.json() + [0x0A] : document.csv()
        try await NIOThreadPool.singleton.runIfActive { try file.write(bytes) }
        try await configuration.afterChunk?(relative)
        let sha256 = try await NIOThreadPool.singleton.runIfActive { try file.finish() }
        // Nothing compared yet is not final: the networks' reports may still come.
        let isFinal = !document.rows.isEmpty && document.rows.allSatisfy(\.isFinal)
        let manifest = ExportManifest(
            schedule: schedule.name, slot: claim.slot, rows: Int64(document.rows.count), bytes: file.bytes, sha256: sha256, isFinal: isFinal,
            file: String(relative.split(separator: "/").last!), provisionalDays: [], generatedAt: Date()
        )
        return Written(rows: Int64(document.rows.count), sha256: sha256, isFinal: isFinal, finalDue: nil, manifest: manifest.json(query: query.report))
    }

    /// A final rewrite whose days are not final yet (the horizon widened, or clocks differ).
    struct StillProvisional: Error {
        var until: Date?
    }

    static func backoff(attempt: Int, _ configuration: Configuration) -> Duration {
        retryDelay(attempt: attempt, base: configuration.retryBase, cap: configuration.retryCap)
    }

    static func milliseconds(_ duration: Duration) -> Int64 {
        duration.components.seconds * 1000 + duration.components.attoseconds / 1_000_000_000_000_000
    }
}
