import Foundation

/// The file format of a scheduled export.
public enum ExportFormat: String, Sendable, Codable, CaseIterable {
    case csv, json
}

/// What a scheduled export writes.
public enum ExportKind: String, Sendable, Codable, CaseIterable {
    /// A report (`GET /v1/reports`).
    case report
    /// The discrepancy report with the networks (`GET /v1/reconciliation`, DESIGN §11).
    case reconciliation
}

/// A schedule that cannot be saved: the field (`name`, `cron`, `tz`, `format`, `dir`,
/// or `query.PARAMETER`) and the rule (a 400 / a CLI error).
public typealias ExportScheduleError = FieldError

/// A saved report query, written as a file in a directory at the times of a cron
/// expression in a zone (DESIGN §5).
public struct ExportSchedule: Sendable, Equatable {
    /// The name: `[a-z0-9][a-z0-9_-]{0,63}`, also the files' folder and prefix.
    public var name: String
    /// The report parameters, as `GET /v1/reports` takes them; `days` counts back from the slot's day.
    public var query: [String: String]
    /// CSV or JSON.
    public var format: ExportFormat
    /// A report, or the reconciliation with the networks' reports.
    public var kind: ExportKind = .report
    /// The cron expression.
    public var cron: String
    /// The IANA zone the cron expression and slot names are in.
    public var timezone: String
    /// The folder the schedule's folder is made in.
    public var directory: String
    /// A paused schedule plans no slots (the ones due while paused are not caught up).
    public var isPaused = false
    /// When it was made.
    public var createdAt: Date?
    /// Slots missed by more than the catch-up limit (never written), and the last of them.
    public var skippedSlots: Int64 = 0
    /// The last skipped slot's name.
    public var lastSkipped: String?

    /// Report parameters a schedule may not hold: the file's format is the schedule's, and
    /// a cursor belongs to one page of one query.
    public static let forbiddenParameters = ["cursor"]

    /// A schedule; `validate` checks it.
    public init(name: String, query: [String: String], format: ExportFormat, cron: String, timezone: String, directory: String) {
        self.name = name
        self.query = query
        self.format = format
        self.cron = cron
        self.timezone = timezone
        self.directory = directory
    }

    /// The parsed cron expression.
    public var cronSchedule: CronSchedule {
        get throws(ExportScheduleError) {
            do { return try CronSchedule(cron) } catch { throw ExportScheduleError("cron", error.message) }
        }
    }

    /// The zone.
    public var zone: TimeZone {
        get throws(ExportScheduleError) {
            guard ReportQuery.isZone(timezone), let zone = TimeZone(identifier: timezone) else {
                throw ExportScheduleError("tz", "\"\(timezone)\" is not an IANA time zone (e.g. Europe/Berlin, America/New_York, UTC)")
            }
            return zone
        }
    }

    /// Checks everything but the directory and the apps: name, cron, zone, and that the
    /// query parses (against `readable`, every app) for a slot at `now`.
    public func validate(readable: [ReportApp], now: Date = Date()) throws(ExportScheduleError) {
        guard FieldError.isName(name) else { throw ExportScheduleError("name", FieldError.nameRule + " (it names the files)") }
        // `runs` is the path of every schedule's run history in the API.
        guard name != "runs" else { throw ExportScheduleError("name", "\"runs\" is taken by the API's run history; choose another") }
        _ = try cronSchedule
        _ = try zone
        guard directory.hasPrefix("/") else { throw ExportScheduleError("dir", "must be an absolute path, got \"\(directory)\"") }
        switch kind {
        case .report: _ = try reportQuery(at: now, readable: readable)
        case .reconciliation: _ = try reconciliationQuery(at: now, readable: readable)
        }
    }

    /// The reconciliation a slot due at `due` writes (`kind` reconciliation): `days` are
    /// the whole UTC days before the slot.
    public func reconciliationQuery(at due: Date, readable: [ReportApp]) throws(ExportScheduleError) -> ReconciliationQuery {
        if let name = query.keys.first(where: { Self.forbiddenParameters.contains($0) }) {
            throw ExportScheduleError("query.\(name)", "a schedule cannot hold a \(name)")
        }
        // `format` is an ad-format filter here; the file's format is the schedule's own.
        if query["format"].flatMap(ReportFormat.init(rawValue:)) != nil {
            throw ExportScheduleError("query.format", "the file format is the schedule's own (--format csv|json), not a parameter")
        }
        do {
            return try ReconciliationQuery.parse(query.sorted { $0.key < $1.key }, readable: readable, isAdmin: true, output: format == .json ? .json : .csv, now: due)
        } catch {
            throw ExportScheduleError("query.\(error.parameter)", error.message)
        }
    }

    /// The next `count` slots due after `instant` (none when the cron or zone is invalid).
    public func nextSlots(after instant: Date, count: Int) -> [CronSlot] {
        guard let cron = try? cronSchedule, let zone = try? zone else { return [] }
        return cron.slots(after: Int64(instant.timeIntervalSince1970.rounded(.down)), through: .max, in: zone, limit: count)
    }

    /// The report a slot due at `due` writes: `days` are the whole days before the slot's
    /// day in the query's zone. Every row is written (JSON too) unless `limit` is given.
    public func reportQuery(at due: Date, readable: [ReportApp]) throws(ExportScheduleError) -> ReportQuery {
        if let name = query.keys.first(where: { Self.forbiddenParameters.contains($0) }) {
            throw ExportScheduleError("query.\(name)", "a schedule cannot hold a \(name)")
        }
        if query["format"].flatMap(ReportFormat.init(rawValue:)) != nil {
            throw ExportScheduleError("query.format", "the file format is the schedule's own (--format csv|json), not a report parameter")
        }
        var parsed: ReportQuery
        do {
            parsed = try ReportQuery.parse(query.sorted { $0.key < $1.key }, readable: readable, isAdmin: true, output: .csv, now: due)
        } catch {
            throw ExportScheduleError("query.\(error.parameter)", error.message)
        }
        if format == .json { parsed.format = .json }
        return parsed
    }

    /// The file of a slot, relative to `directory`: `NAME/NAME-SLOT.csv`; the final
    /// rewrite of a provisional file is `NAME/NAME-SLOT.final.csv`.
    public func fileName(slot: String, isFinalRewrite: Bool) -> String {
        "\(name)/\(name)-\(slot)\(isFinalRewrite ? ".final" : "").\(format.rawValue)"
    }
}

/// The manifest written beside an export file (`FILE.manifest.json`, DESIGN §5).
public struct ExportManifest: Sendable, Equatable {
    /// The schedule.
    public var schedule: String
    /// The slot, `YYYYMMDDTHHMM` in the schedule's zone.
    public var slot: String
    /// Data rows (the CSV header not counted).
    public var rows: Int64
    /// Bytes of the file.
    public var bytes: Int64
    /// SHA-256 of the file, lowercase hex.
    public var sha256: String
    /// Whether late events may still change the numbers.
    public var isFinal: Bool
    /// The file's name (without folder).
    public var file: String
    /// The days still provisional when it was written.
    public var provisionalDays: [Int]
    /// When it was written.
    public var generatedAt: Date
    /// The database server the report was read from (a replica, and its lag, or the primary).
    public var readFrom = ReportNotes.ReadFrom(server: .primary)

    /// A manifest.
    public init(schedule: String, slot: String, rows: Int64, bytes: Int64, sha256: String, isFinal: Bool, file: String, provisionalDays: [Int], generatedAt: Date) {
        self.schedule = schedule
        self.slot = slot
        self.rows = rows
        self.bytes = bytes
        self.sha256 = sha256
        self.isFinal = isFinal
        self.file = file
        self.provisionalDays = provisionalDays
        self.generatedAt = generatedAt
    }

    /// The manifest's JSON: `query` (the query as understood, as a report's JSON has
    /// it), `slot`, `rows`, `bytes`, `sha256`, `status`, and what else a consumer wants.
    public func json(query: ReportQuery) -> [UInt8] {
        var out: [UInt8] = []
        func key(_ name: String) { ReportText.appendJSONKey(name, to: &out) }
        func string(_ text: String) { ReportText.appendJSONString(text, to: &out) }
        func raw(_ text: String) { out.append(contentsOf: text.utf8) }
        raw("{\n  "); key("schedule"); string(schedule)
        raw(",\n  "); key("file"); string(file)
        raw(",\n  "); key("slot"); string(slot)
        raw(",\n  "); key("status"); string(isFinal ? "final" : "provisional")
        raw(",\n  "); key("rows"); raw(String(rows))
        raw(",\n  "); key("bytes"); raw(String(bytes))
        raw(",\n  "); key("sha256"); string(sha256)
        raw(",\n  "); key("provisional_days"); raw("[")
        for (index, day) in provisionalDays.enumerated() {
            if index > 0 { raw(",") }
            string(ReportQuery.formatDate(day))
        }
        raw("]")
        raw(",\n  "); key("generated_at"); string(generatedAt.formatted(.iso8601))
        raw(",\n  "); key("read_from"); string(readFrom.server.rawValue)
        raw(",\n  "); key("replica_lag_seconds"); raw(readFrom.replicaLagSeconds.map { String(format: "%.3f", $0) } ?? "null")
        raw(",\n  "); key("query"); ReportDocument.appendQueryJSON(query, to: &out)
        raw("\n}\n")
        return out
    }
}

extension ExportSchedule: Encodable {
    enum CodingKeys: String, CodingKey {
        case name, kind, query, format, cron, tz, dir, paused
        case createdAt = "created_at", skippedSlots = "skipped_slots", lastSkipped = "last_skipped", nextSlots = "next_slots"
    }

    struct Due: Encodable {
        var slot: String
        var dueAt: Date

        enum CodingKeys: String, CodingKey {
            case slot, dueAt = "due_at"
        }
    }

    /// The schedule as the API and `--format json` show it, with its next three slots.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(name, forKey: .name)
        try container.encode(kind, forKey: .kind)
        try container.encode(query, forKey: .query)
        try container.encode(format, forKey: .format)
        try container.encode(cron, forKey: .cron)
        try container.encode(timezone, forKey: .tz)
        try container.encode(directory, forKey: .dir)
        try container.encode(isPaused, forKey: .paused)
        try container.encodeIfPresent(createdAt, forKey: .createdAt)
        try container.encode(skippedSlots, forKey: .skippedSlots)
        try container.encode(lastSkipped, forKey: .lastSkipped)
        try container.encode(isPaused ? [] : nextSlots(after: Date(), count: 3).map { Due(slot: $0.name, dueAt: $0.dueDate) }, forKey: .nextSlots)
    }
}
