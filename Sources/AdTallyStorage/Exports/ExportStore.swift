import AdTallyCore
import Foundation
import NIOPosix
import PostgresKit

/// One run of a schedule's slot (a row of `export_runs`): the claim, then the proof.
public struct ExportRun: Sendable, Equatable, Encodable {
    /// The schedule.
    public var schedule: String
    /// The slot, `YYYYMMDDTHHMM` in the schedule's zone.
    public var slot: String
    /// 1: the slot's file; 2: its rewrite once its days are final.
    public var pass: Int
    /// When the slot was due.
    public var dueAt: Date
    /// pending, running, retrying, succeeded or failed.
    public var status: String
    /// schedule, manual (run-now) or final (pass 2).
    public var trigger: String
    /// Attempts so far.
    public var attempts: Int
    /// When a pending or retrying run may next start.
    public var nextAttemptAt: Date
    /// The server that ran (or runs) the last attempt.
    public var runner: String?
    /// When the last attempt started and finished.
    public var startedAt: Date?
    /// When the last attempt finished.
    public var finishedAt: Date?
    /// How long the last attempt took.
    public var durationMs: Int64?
    /// Data rows written.
    public var rows: Int64?
    /// Bytes written.
    public var bytes: Int64?
    /// SHA-256 of the file.
    public var sha256: String?
    /// The file, relative to the schedule's directory.
    public var file: String?
    /// provisional or final.
    public var fileStatus: String?
    /// For a provisional file: when its final rewrite is due.
    public var finalDueAt: Date?
    /// The last attempt's error.
    public var error: String?

    enum CodingKeys: String, CodingKey {
        case schedule, slot, pass, status, trigger, attempts, runner, rows, bytes, sha256, file, error
        case dueAt = "due_at", nextAttemptAt = "next_attempt_at", startedAt = "started_at", finishedAt = "finished_at"
        case durationMs = "duration_ms", fileStatus = "file_status", finalDueAt = "final_due_at"
    }

    static let columns = """
        schedule, slot, pass, due_at, status, trigger, attempts, next_attempt_at, runner, started_at, finished_at,
        duration_ms, rows, bytes, sha256, file, file_status, final_due_at, error
        """

    init(_ row: PostgresRow) throws {
        schedule = try row.decode(0)
        slot = try row.decode(1)
        pass = try row.decode(2)
        dueAt = try row.decode(3)
        status = try row.decode(4)
        trigger = try row.decode(5)
        attempts = try row.decode(6)
        nextAttemptAt = try row.decode(7)
        runner = try row.decode(8)
        startedAt = try row.decode(9)
        finishedAt = try row.decode(10)
        durationMs = try row.decode(11)
        rows = try row.decode(12)
        bytes = try row.decode(13)
        sha256 = try row.decode(14)
        file = try row.decode(15)
        fileStatus = try row.decode(16)
        finalDueAt = try row.decode(17)
        error = try row.decode(18)
    }
}

/// Why a schedule operation was refused.
public enum ExportStoreError: Error, Sendable, Equatable, CustomStringConvertible {
    case exists(String)
    case unknown(String)
    case slotTaken(schedule: String, slot: String, status: String)
    case unknownRun(schedule: String, slot: String)
    case paused(String)

    public var description: String {
        switch self {
        case .exists(let name): "an export schedule named \(name) exists already (delete it first, or choose another name)"
        case .unknown(let name): "there is no export schedule named \(name) (adtally exports list shows them)"
        case .slotTaken(let schedule, let slot, let status):
            "slot \(slot) of \(schedule) has a run already (\(status)); only a failed run can be started again"
        case .paused(let name): "\(name) is paused: resume it first (adtally exports resume \(name))"
        case .unknownRun(let schedule, let slot): "\(schedule) has no run for slot \(slot) to start again (adtally exports runs \(schedule) lists them)"
        }
    }
}

/// Export schedules and their runs (Migrations/0006).
public struct ExportStore: Sendable {
    let pool: PostgresPool

    /// A store over a pool.
    public init(pool: PostgresPool) { self.pool = pool }

    static let scheduleColumns = "name, query::text, format, cron, timezone, directory, paused, created_at, skipped_slots, last_skipped, kind"

    static func schedule(_ row: PostgresRow) throws -> ExportSchedule {
        let query = try JSONDecoder().decode([String: String].self, from: Data(try row.decode(1, as: String.self).utf8))
        var schedule = ExportSchedule(
            name: try row.decode(0), query: query, format: ExportFormat(rawValue: try row.decode(2)) ?? .csv,
            cron: try row.decode(3), timezone: try row.decode(4), directory: try row.decode(5)
        )
        schedule.isPaused = try row.decode(6)
        schedule.createdAt = try row.decode(7)
        schedule.skippedSlots = try row.decode(8)
        schedule.lastSkipped = try row.decode(9)
        schedule.kind = ExportKind(rawValue: try row.decode(10)) ?? .report
        return schedule
    }

    /// Checks a new schedule — name, cron, zone, the query against every app (`readable`),
    /// and that its folder can be written here — then saves it. Its first slot is the
    /// first one due after now.
    public func create(_ schedule: ExportSchedule, readable: [ReportApp], exportsRoot: String, now: Date = Date()) async throws -> ExportSchedule {
        try schedule.validate(readable: readable, now: now)
        let directory = schedule.directory
        _ = try await NIOThreadPool.singleton.runIfActive { try ExportFile.resolve(directory: directory, root: exportsRoot) }
        // The zones PostgreSQL will compute the slots' report days in must be its own.
        try await DatabaseTimeZones.check(schedule.timezone, field: "tz", pool: pool)
        if let zone = schedule.query["tz"] { try await DatabaseTimeZones.check(zone, field: "query.tz", pool: pool) }
        // Blocking file calls (and an fsync) off the cooperative threads.
        try await NIOThreadPool.singleton.runIfActive { try ExportFile.checkWritable(directory: schedule.directory, schedule: schedule.name) }
        return try await insert(schedule)
    }

    private func insert(_ schedule: ExportSchedule) async throws -> ExportSchedule {
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        let query = String(decoding: try encoder.encode(schedule.query), as: UTF8.self)
        do {
            let rows = try await pool.query("""
                INSERT INTO export_schedules (name, query, format, cron, timezone, directory, kind)
                VALUES (\(schedule.name), \(query)::jsonb, \(schedule.format.rawValue), \(schedule.cron), \(schedule.timezone), \(schedule.directory), \(schedule.kind.rawValue))
                RETURNING \(unsafeRaw: Self.scheduleColumns)
                """)
            return try Self.schedule(rows[0])
        } catch let error as PostgresError where error.sqlState == .uniqueViolation {
            throw ExportStoreError.exists(schedule.name)
        }
    }

    /// Every schedule, by name.
    public func list() async throws -> [ExportSchedule] {
        try await pool.query("SELECT \(unsafeRaw: Self.scheduleColumns) FROM export_schedules ORDER BY name").map(Self.schedule)
    }

    /// One schedule.
    public func schedule(_ name: String) async throws -> ExportSchedule {
        guard let row = try await pool.query("SELECT \(unsafeRaw: Self.scheduleColumns) FROM export_schedules WHERE name = \(name)").first else {
            throw ExportStoreError.unknown(name)
        }
        return try Self.schedule(row)
    }

    /// Pauses or resumes a schedule. Resuming plans from now on: the slots due while
    /// it was paused are not written.
    public func setPaused(_ name: String, _ paused: Bool) async throws -> ExportSchedule {
        guard let row = try await pool.query("""
            UPDATE export_schedules SET paused = \(paused),
                   planned_through = CASE WHEN paused AND NOT \(paused) THEN now() ELSE planned_through END
            WHERE name = \(name) RETURNING \(unsafeRaw: Self.scheduleColumns)
            """).first else { throw ExportStoreError.unknown(name) }
        return try Self.schedule(row)
    }

    /// Deletes a schedule and its run history (its files stay).
    public func delete(_ name: String) async throws {
        guard try await pool.query("DELETE FROM export_schedules WHERE name = \(name)").affectedRows == 1 else {
            throw ExportStoreError.unknown(name)
        }
    }

    /// Runs, newest slot first: of one schedule, or of all.
    public func runs(_ name: String?, limit: Int = 50) async throws -> [ExportRun] {
        if let name { _ = try await schedule(name) }
        return try await pool.query("""
            SELECT \(unsafeRaw: ExportRun.columns) FROM export_runs
            WHERE \(name)::text IS NULL OR schedule = \(name)::text ORDER BY due_at DESC, pass DESC LIMIT \(limit)
            """).map(ExportRun.init)
    }

    /// Each schedule's newest run (by slot), keyed by schedule.
    public func lastRuns() async throws -> [String: ExportRun] {
        let runs = try await pool.query("""
            SELECT DISTINCT ON (schedule) \(unsafeRaw: ExportRun.columns) FROM export_runs ORDER BY schedule, due_at DESC, pass DESC
            """).map(ExportRun.init)
        return Dictionary(runs.map { ($0.schedule, $0) }, uniquingKeysWith: { first, _ in first })
    }

    /// One run.
    public func run(_ name: String, slot: String, pass: Int = 1) async throws -> ExportRun? {
        try await pool.query("""
            SELECT \(unsafeRaw: ExportRun.columns) FROM export_runs WHERE schedule = \(name) AND slot = \(slot) AND pass = \(pass)
            """).first.map(ExportRun.init)
    }

    /// Asks the runner to write a slot now: the current minute's slot (in the schedule's
    /// zone) when `slot` is nil, else a failed run of an earlier slot is started again.
    public func requestRun(_ name: String, slot: String?, now: Date = Date()) async throws -> ExportRun {
        let schedule = try await schedule(name)
        guard !schedule.isPaused else { throw ExportStoreError.paused(name) }
        if let slot {
            guard let row = try await pool.query("""
                UPDATE export_runs SET status = 'pending', next_attempt_at = now(), attempts = 0, error = NULL, trigger = 'manual'
                WHERE schedule = \(name) AND slot = \(slot) AND pass = 1 AND status = 'failed'
                RETURNING \(unsafeRaw: ExportRun.columns)
                """).first else {
                let existing = try await run(name, slot: slot)
                throw existing.map { ExportStoreError.slotTaken(schedule: name, slot: slot, status: $0.status) }
                    ?? ExportStoreError.unknownRun(schedule: name, slot: slot)
            }
            return try ExportRun(row)
        }
        let zone = try schedule.zone
        let slot = CronSlot.minute(containing: Int64(now.timeIntervalSince1970.rounded(.down)), in: zone)
        let rows: PostgresRows
        do {
            rows = try await pool.query("""
                INSERT INTO export_runs (schedule, slot, pass, due_at, status, trigger, next_attempt_at)
                VALUES (\(name), \(slot.name), 1, \(now), 'pending', 'manual', now())
                ON CONFLICT DO NOTHING RETURNING \(unsafeRaw: ExportRun.columns)
                """)
        } catch let error as PostgresError where error.sqlState == .foreignKeyViolation {
            // Deleted between the read above and this insert.
            throw ExportStoreError.unknown(name)
        }
        guard let row = rows.first else {
            let existing = try await run(name, slot: slot.name)
            throw ExportStoreError.slotTaken(schedule: name, slot: slot.name, status: existing?.status ?? "unknown")
        }
        return try ExportRun(row)
    }
}
