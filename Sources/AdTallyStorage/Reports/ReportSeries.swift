import AdTallyCore
import Foundation
import Logging
import Metrics
import PostgresKit

/// Writes the report engine's output into `report_series` (Migrations/0007), the
/// table Grafana's PostgreSQL datasource reads: Grafana panels select and filter,
/// the engine computes (DESIGN §3 defines each metric once). Each app is written in
/// its own zone and currency: per day and per hour over the windows late events can
/// still change, and the last 7 and 28 whole days as one row each; every one for
/// all networks together (network `*`) and for the app's top networks.
public struct ReportSeriesWriter: Sendable {
    /// How much is rewritten on each refresh.
    public struct Configuration: Sendable {
        /// Days (today included) rewritten per day; at least the accepted event window + 2.
        public var days = 35
        /// Days (today included) rewritten per hour: the accepted event window + 2,
        /// so no provisional hour is left behind; older hour rows are deleted.
        public var hourDays = 9
        /// The networks written one by one (the app's top by revenue, then requests, over 28 days).
        public var networks = 50
        /// An app written less than this ago (by any server) is skipped.
        public var freshFor: Duration = .seconds(30)
        /// Install days rewritten in `cohort_series` on a full write: every cohort whose
        /// 30th day may still change (30 days, the accepted event window and 2).
        public var cohortDays = 39
        /// An app whose priced rows a card change left stale (`rollup_dirty`) waits this long
        /// at most, from the oldest change still dirty, for the re-pricer before it is
        /// written anyway (its new events and midnight with it).
        public var repricingWait: Duration = .seconds(600)

        /// Windows for an accepted event age of `maxEventAgeDays` (within what one report may span).
        public init(maxEventAgeDays: Int = 7) {
            hourDays = min(maxEventAgeDays + 2, ReportQuery.maxDays)
            days = min(max(35, maxEventAgeDays + 2), ReportQuery.maxDays)
            cohortDays = min(31 + maxEventAgeDays + 1, ReportQuery.maxDays)
        }
    }

    /// A refresh that would have written a report cut at its row limit.
    struct TooManyRows: Error, CustomStringConvertible {
        var description: String
    }

    let engine: ReportEngine
    let pool: PostgresPool
    let configuration: Configuration
    let logger: Logger

    /// A writer over the engine and the database it writes to.
    public init(engine: ReportEngine, pool: PostgresPool, configuration: Configuration = .init(), logger: Logger = Logger(label: "adtally.series")) {
        self.engine = engine
        self.pool = pool
        self.configuration = configuration
        self.logger = logger
    }

    /// The metrics written (the columns of `report_series`).
    static let metrics: [ReportMetric] = [
        .requests, .impressions, .fillRate, .loads, .showRate, .errors, .errorRate, .taps, .ctr, .actionCancels, .cancelRate,
        .expiries, .expiryRate, .wastedFills, .revenue, .reportedRevenue, .estimatedRevenue, .ecpm, .rpm,
        // The audience (Migrations/0014); an hour row has no daily average (NULL there).
        .sessions, .dau, .dav, .engagementRate, .arpdau,
    ]

    /// Rewrites the recent series of every app; returns the rows written. An app
    /// another server is writing, or that was tried less than `freshFor` ago (unless
    /// `force`), is skipped. An app whose refresh fails (a missing FX rate, a timeout)
    /// keeps its rows, `report_series_refresh` says why, and the next apps are still
    /// written; the failures are thrown together at the end.
    @discardableResult
    public func refresh(force: Bool = false, now: Date = Date()) async throws -> Int {
        let started = ContinuousClock.now
        defer { Metrics.Timer(label: "adtally_report_series_refresh_seconds").record(duration: ContinuousClock.now - started) }
        var written = 0
        var failures: [String] = []
        // Only apps with something to write (Migrations/0012): days changed since their last
        // write, a due time passed (midnight, a day turning final), never written, or failed.
        // An idle app costs these two reads (a third, of the dirty ranges, only when some app is due).
        var due: Set<String> = []
        var known: Set<String> = []
        for row in try await pool.query("SELECT app_id, \(Self.isDue(now)) FROM report_series_refresh") {
            known.insert(try row.decode(0, as: String.self))
            if try row.decode(1, as: Bool.self) { due.insert(try row.decode(0, as: String.self)) }
        }
        for row in try await pool.query("SELECT app_id FROM report_series_changes") { due.insert(try row.decode(0, as: String.self)) }
        // An app written before whose priced rows a card change left stale waits for the
        // re-pricer (up to `repricingWait` from the change): until then a report prices those
        // ranges itself, at several times the cost (the bench's series pages took 170-310 ms
        // there against 15-30 ms after, and beside the re-pricer on two cores they doubled its
        // time), and would give the numbers the re-priced rows will. Its marks stay for the
        // pass after the re-pricer's.
        var repricing: Set<String> = []
        if !force && !due.isEmpty {
            let wait = Double(configuration.repricingWait.components.seconds)
            // From the oldest change still dirty: card changes less than the wait apart do not
            // hold an app back for ever.
            for row in try await pool.query("SELECT app_id FROM rollup_dirty GROUP BY app_id HAVING min(marked_at) > now() - make_interval(secs => \(wait))") {
                repricing.insert(try row.decode(0, as: String.self))
            }
        }
        for app in try await engine.readableApps(only: nil)
        where force || !known.contains(app.id) || (due.contains(app.id) && !repricing.contains(app.id)) {
            do {
                written += try await refresh(app, force: force, now: now) ?? 0
            } catch is CancellationError {
                throw CancellationError()
            } catch {
                failures.append("\(app.id): \(error)")
                // Recorded apart from the rolled-back attempt, so every server sees it and waits.
                _ = try? await pool.query("""
                    INSERT INTO report_series_refresh (app_id, attempted_at, error) VALUES (\(app.id), now(), \(String(describing: error)))
                    ON CONFLICT (app_id) DO UPDATE SET attempted_at = excluded.attempted_at, error = excluded.error
                    """)
            }
        }
        if !failures.isEmpty { throw RefreshFailed(description: "report series not refreshed for \(failures.joined(separator: "; "))") }
        return written
    }

    /// Apps whose refresh failed this pass (the others were written).
    struct RefreshFailed: Error, CustomStringConvertible {
        var description: String
    }

    /// Whether a `report_series_refresh` row says its app must be written in full at `now`:
    /// its due time passed (or was never set), or its last refresh failed.
    static func isDue(_ now: Date) -> PostgresQuery { "(due_at IS NULL OR due_at <= \(now) OR error IS NOT NULL)" }

    /// One grain's range of an app, and the rows the engine gave for it.
    struct Part {
        var grain: String
        var from: Int
        var to: Int
        var rows: [UInt8] = []
        var count = 0
    }

    /// What a refresh of one app writes: everything, or the parts the changed local days
    /// `changed` touch (the day and hour rows of those days, a last-N-days row whose
    /// window holds one of them).
    static func parts(today: Int, changed: ClosedRange<Int>?, configuration: Configuration) -> [Part] {
        let all = [
            Part(grain: "day", from: today - configuration.days + 1, to: today),
            Part(grain: "hour", from: today - configuration.hourDays + 1, to: today),
            Part(grain: "last_7_days", from: today - 7, to: today - 1),
            Part(grain: "last_28_days", from: today - 28, to: today - 1),
        ]
        guard let changed else { return all }
        return all.compactMap { part in
            let from = max(part.from, changed.lowerBound), to = min(part.to, changed.upperBound)
            guard from <= to else { return nil }
            // A window's one row covers the whole window.
            return part.grain.hasPrefix("last_") ? part : Part(grain: part.grain, from: from, to: to)
        }
    }

    /// Refreshes one app while holding its lock (a transaction-scoped advisory lock,
    /// taken before the engine is asked, so two servers never compute and write one
    /// app at once, and an older computation never overwrites a newer one); nil when
    /// skipped.
    func refresh(_ app: ReportApp, force: Bool, now: Date) async throws -> Int? {
        try await pool.withLease { lease in
            let freshFor = Double(configuration.freshFor.components.seconds)
            let isMine = try await lease.run { connection -> Bool in
                try connection.execute(unsafeSQL: "BEGIN")
                let locked = try connection.query("SELECT pg_try_advisory_xact_lock(\(Int32(0x4164_5461)), hashtext(\(app.id)))")[0]
                guard try locked.decode(0, as: Bool.self) else { return false }
                // A statement of its own, after the lock: it sees what the last holder committed.
                let fresh = try connection.query("""
                    SELECT EXISTS (SELECT 1 FROM report_series_refresh WHERE app_id = \(app.id) AND attempted_at > now() - make_interval(secs => \(freshFor)))
                    """)[0]
                return try force || !fresh.decode(0, as: Bool.self)
            }
            // Everything (forced, due, never written, failed last time), the changed days only, or nothing.
            let work = !isMine ? nil : try await lease.run { connection -> (full: Bool, changed: ClosedRange<Int>?, version: Int64?)? in
                let state = try connection.query("""
                    SELECT coalesce((SELECT \(Self.isDue(now)) FROM report_series_refresh WHERE app_id = \(app.id)), true)
                    """)[0]
                let changes = try connection.query("""
                    SELECT from_day - DATE '1970-01-01', to_day - DATE '1970-01-01', version FROM report_series_changes WHERE app_id = \(app.id)
                    """).first
                let changed = try changes.map { try $0.decode(0, as: Int.self)...max($0.decode(0, as: Int.self), $0.decode(1, as: Int.self)) }
                let version = try changes?.decode(2, as: Int64.self)
                if try force || state.decode(0, as: Bool.self) { return (true, nil, version) }
                return changed.map { (false, $0, version) }
            }
            guard let work else {
                _ = try await lease.run { try $0.execute(unsafeSQL: "ROLLBACK") }
                return nil
            }
            do {
                let written: Int
                written = try await write(app, now: now, changed: work.full ? nil : work.changed, lease: lease)
                if let version = work.version {
                    // The mark read, unless the compactor or a money change moved it meanwhile.
                    _ = try await lease.run { try $0.query("DELETE FROM report_series_changes WHERE app_id = \(app.id) AND version = \(version)") }
                }
                _ = try await lease.run { try $0.execute(unsafeSQL: "COMMIT") }
                return written
            } catch {
                _ = try? await lease.run { try $0.execute(unsafeSQL: "ROLLBACK") }
                throw error
            }
        }
    }

    /// Computes an app's rows with the engine and replaces them, on the lease's open
    /// transaction: every part, or (`changed`) those of the changed local days.
    func write(_ app: ReportApp, now: Date, changed: ClosedRange<Int>? = nil, lease: PostgresLease) async throws -> Int {
        let today = try ReportQuery.today(in: app.timezone, now: now)
        func page(_ from: Int, _ to: Int, _ dimensions: [ReportDimension], _ metrics: [ReportMetric], extra: [(String, String)] = [], limit: Int = ReportQuery.maxLimit) async throws -> ReportDocument {
            let query = try ReportQuery.parse(
                [
                    ("apps", app.id), ("from", ReportQuery.formatDate(from)), ("to", ReportQuery.formatDate(to)),
                    ("dimensions", dimensions.map(\.rawValue).joined(separator: ",")), ("metrics", metrics.map(\.rawValue).joined(separator: ",")),
                    ("limit", String(limit)),
                ] + extra,
                readable: [app], isAdmin: true
            )
            return try await engine.page(query)
        }
        // Network names come from apps: only the top ones get rows of their own.
        let top = try await page(today - 28, today, [.network], [.revenue, .requests], extra: [("sort", "-revenue,-requests")], limit: configuration.networks)
        let networks = top.rows.compactMap { $0.dimensions.first ?? nil }
        // Hour rows per network are bounded by one report's row limit.
        let hourNetworks = Array(networks.prefix(max(1, ReportQuery.maxLimit / (configuration.hourDays * 25) - 1)))
        var parts = Self.parts(today: today, changed: changed, configuration: configuration)
        // The days still provisional (from the day part of a full write): when the first turns final, the series are due.
        var provisional: [Int] = []
        for index in parts.indices {
            let dimension: [ReportDimension] = switch parts[index].grain {
            case "day": [.date]
            case "hour": [.hour]
            default: []
            }
            for byNetwork in networks.isEmpty ? [false] : [false, true] {
                let names = parts[index].grain == "hour" ? hourNetworks : networks
                let metrics = parts[index].grain == "hour" ? Self.metrics.filter { !$0.isDailyAverage } : Self.metrics
                let document = try await page(
                    parts[index].from, parts[index].to, dimension + (byNetwork ? [.network] : []), metrics,
                    extra: byNetwork ? [("network", names.joined(separator: ","))] : []
                )
                guard document.nextCursor == nil else {
                    throw TooManyRows(description: "the \(parts[index].grain) series of \(app.id) has more than \(ReportQuery.maxLimit) rows; not written")
                }
                if changed == nil && parts[index].grain == "day" && !byNetwork { provisional = document.notes.provisionalDays }
                Self.append(document, grain: parts[index].grain, hasPeriod: !dimension.isEmpty, byNetwork: byNetwork, to: &parts[index])
            }
        }
        // The cohorts (Migrations/0025) on full writes: their cells change as days N pass
        // (midnight) and late events land (a provisional day turning final), both full writes.
        if changed == nil { _ = try await writeCohorts(app, today: today, lease: lease) }
        let count = parts.reduce(0) { $0 + $1.count }
        var json: [UInt8] = [UInt8(ascii: "[")]
        for part in parts where !part.rows.isEmpty {
            if json.count > 1 { json.append(UInt8(ascii: ",")) }
            json += part.rows
        }
        json.append(UInt8(ascii: "]"))
        let text = String(decoding: json, as: UTF8.self)
        let columns = Self.metrics.map { "\($0.rawValue) \(Self.sqlType($0))" }.joined(separator: ", ")
        let names = Self.metrics.map(\.rawValue).joined(separator: ", ")
        let written = parts.filter { !$0.rows.isEmpty || changed != nil }
        let firstDay = ReportQuery.formatDate(parts.first?.from ?? today)
        let days = provisional.map(ReportQuery.formatDate)
        try await lease.run { connection in
            if changed == nil {
                // Day rows before the window stay; hour rows and the last-N rows are all replaced.
                try connection.query("""
                    DELETE FROM report_series WHERE app_id = \(app.id)
                      AND (grain <> 'day' OR period_start >= \(firstDay)::date::timestamp AT TIME ZONE \(app.timezone))
                    """)
            } else {
                // The changed days' day and hour rows, and the windows that hold them.
                for part in written {
                    try connection.query("""
                        DELETE FROM report_series WHERE app_id = \(app.id) AND grain = \(part.grain)
                          AND (grain LIKE 'last_%' OR (period_start >= \(ReportQuery.formatDate(part.from))::date::timestamp AT TIME ZONE \(app.timezone)
                                                       AND period_start < (\(ReportQuery.formatDate(part.to))::date + 1)::timestamp AT TIME ZONE \(app.timezone)))
                        """)
                }
            }
            try connection.query("""
                INSERT INTO report_series (app_id, grain, network, period_start, local_start, period, timezone, currency, provisional, \(unsafeRaw: names))
                SELECT \(app.id), r.grain, r.network, t.start,
                       -- Wall time as UTC; a day's is its date's midnight even where the zone skips midnight.
                       CASE r.grain WHEN 'hour' THEN (t.start AT TIME ZONE \(app.timezone)) AT TIME ZONE 'UTC'
                                    ELSE split_part(r.period, '/', 1)::date::timestamp AT TIME ZONE 'UTC' END,
                       r.period, \(app.timezone), \(app.currency), r.provisional, \(unsafeRaw: names)
                FROM jsonb_to_recordset(\(text)::jsonb) AS r(grain text, network text, period text, provisional boolean, \(unsafeRaw: columns))
                CROSS JOIN LATERAL (
                    SELECT CASE r.grain WHEN 'hour' THEN r.period::timestamptz
                                        ELSE split_part(r.period, '/', 1)::date::timestamp AT TIME ZONE \(app.timezone) END AS start
                ) AS t
                """)
            if changed == nil {
                // Due again at the next local midnight, or when the first provisional day turns final.
                try connection.query("""
                    INSERT INTO report_series_refresh (app_id, attempted_at, refreshed_at, rows, error, due_at)
                    SELECT \(app.id), now(), now(), \(count), NULL,
                           least(((\(now)::timestamptz AT TIME ZONE \(app.timezone))::date + 1)::timestamp AT TIME ZONE \(app.timezone),
                                 (SELECT min((d + 1)::timestamp AT TIME ZONE \(app.timezone) + make_interval(secs => h.max_event_age_seconds::float8))
                                  FROM unnest(\(array: days)::date[]) AS d, id_horizon h))
                    ON CONFLICT (app_id) DO UPDATE SET attempted_at = excluded.attempted_at, refreshed_at = excluded.refreshed_at, rows = excluded.rows,
                        error = NULL, due_at = excluded.due_at
                    """)
            } else {
                try connection.query("""
                    UPDATE report_series_refresh SET attempted_at = now(), refreshed_at = now(), rows = \(count), error = NULL WHERE app_id = \(app.id)
                    """)
            }
        }
        return count
    }

    static func sqlType(_ metric: ReportMetric) -> String {
        switch metric.valueType {
        case .integer: "bigint"
        case .ratio: "double precision"
        default: "numeric"
        }
    }

    /// Appends a page's rows to a part as JSON objects of `jsonb_to_recordset`.
    static func append(_ page: ReportDocument, grain: String, hasPeriod: Bool, byNetwork: Bool, to part: inout Part) {
        let layout = page.layout
        let provisional = Set(page.notes.provisionalDays.map(ReportQuery.formatDate))
        let range = "\(ReportQuery.formatDate(part.from))/\(ReportQuery.formatDate(part.to))"
        for row in page.rows {
            let period = hasPeriod ? (row.dimensions[0] ?? "") : range
            let network = byNetwork ? (row.dimensions.last ?? nil) ?? "" : "*"
            let isProvisional = hasPeriod ? provisional.contains(String(period.prefix(10))) : !provisional.isEmpty
            if !part.rows.isEmpty { part.rows.append(UInt8(ascii: ",")) }
            part.rows += Array("{\"grain\":\"\(grain)\",".utf8)
            ReportText.appendJSONKey("network", to: &part.rows)
            ReportText.appendJSONString(network, to: &part.rows)
            part.rows.append(UInt8(ascii: ","))
            ReportText.appendJSONKey("period", to: &part.rows)
            ReportText.appendJSONString(period, to: &part.rows)
            part.rows += Array(",\"provisional\":\(isProvisional)".utf8)
            let cells = layout.cells(row)
            for (index, metric) in layout.query.metrics.enumerated() {
                part.rows.append(UInt8(ascii: ","))
                ReportText.appendJSONKey(metric.rawValue, to: &part.rows)
                ReportText.appendJSON(cells[layout.query.dimensions.count + index], to: &part.rows)
            }
            part.rows.append(UInt8(ascii: "}"))
            part.count += 1
        }
    }
}
