import AdTallyCore
import Logging
import PostgresKit

/// A report needs an FX rate that the table does not have: a 422 that names the
/// currency and the first UTC date it is missing for.
public struct ReportCurrencyError: Error, Sendable, CustomStringConvertible {
    /// The currency without a rate on `date`.
    public var currency: String
    /// The first UTC date without a rate.
    public var date: String
    /// The currency of the amounts to convert.
    public var from: String
    /// The report currency.
    public var reportCurrency: String

    /// From the engine's "YYYY-MM-DD FROM MISSING" key.
    init(missing: String, reportCurrency: String) {
        let parts = missing.split(separator: " ").map(String.init)
        date = parts.first ?? missing
        from = parts.count > 1 ? parts[1] : ""
        currency = parts.count > 2 ? parts[2] : from
        self.reportCurrency = reportCurrency
    }

    public var description: String {
        let missing = currency == "*"
            ? "there are no FX rates at all for that date (a weekend or holiday? adtally fx import --fill-gaps carries the last rate over it)"
            : "there is no \(currency) rate for that date"
        return "no FX rate converts \(from) to \(reportCurrency) on \(date) (UTC): \(missing), and the report has \(from) amounts on it; "
            + "import it (adtally fx import, POST /v1/fx)"
            // The other way round only helps a report whose amounts are all in `from`: any
            // other currency in it would need a `from` rate for that date too.
            + ", or ask for currency=\(from) if every amount of the report is in \(from)"
    }
}

/// What a stream knows before its first row (`ReportEngine.stream(withSummary:)`).
public struct ReportSummary: Sendable {
    /// The notes of the report.
    public var notes: ReportNotes
    /// The compared period's totals, when the query compares.
    public var previousTotals: ReportCounts?
}

/// The one reporting engine: plans a `ReportQuery` onto the cheapest source that
/// answers it exactly, runs it, and returns typed rows — to the API, the CLI and
/// everything later built on them. No other code computes a metric: they get
/// `ReportCounts` from here and values from `ReportMetric.value` through `ReportLayout`.
///
/// Sources (Migrations/0004 explains the tables):
/// - daily rollups in each app's own zone, when the report is in that zone and has
///   no hour: one row per day and key;
/// - otherwise hourly rollups for every UTC hour that lies in one group, and the
///   15-minute rollups for the hours a group boundary cuts (local midnight at :30 in
///   Asia/Kolkata), so a day is exactly its local midnights in every zone;
/// - plus the pending rollup deltas (15-minute rows) either way;
/// - raw events (pruned to the range's partitions) for the dimensions no rollup
///   keeps (placement, size, country, platform, versions, error code) and for
///   unique devices.
///
/// Day, hour, week and month are computed by PostgreSQL in the report's zone, named in
/// the SQL at every conversion (`AT TIME ZONE`, date_trunc's zone), so PostgreSQL's
/// zone data decides every local midnight, DST day and repeated hour, on one node and
/// on Citus workers alike (the session's TimeZone is not used: Citus does not pass it on).
public struct ReportEngine: Sendable {
    /// Where reports read: the primary, or a streaming replica close enough behind.
    public let reads: ReportReads
    let logger: Logger

    /// Rows per FETCH when streaming.
    public static let fetchSize = 10_000

    /// An engine over a database.
    public init(pool: PostgresPool, logger: Logger = Logger(label: "adtally.reports")) {
        self.init(reads: ReportReads(primary: pool, logger: logger), logger: logger)
    }

    /// An engine reading where `reads` says (a replica, when one is configured and close enough).
    public init(reads: ReportReads, logger: Logger = Logger(label: "adtally.reports")) {
        self.reads = reads
        self.logger = logger
    }

    /// The apps a key may read (`app` nil: every app), as report parsing needs them.
    public func readableApps(only app: String?) async throws -> [ReportApp] {
        // Every path that parses a query comes here first: cursors are signed with the
        // key all servers share from then on.
        if !ReportCursor.hasKey { ReportCursor.useKey(try await AppStore(pool: reads.primary).sharedSecret(named: "report_cursor")) }
        // From the primary: an app created a moment ago must not be unknown to its reports.
        let rows = try await reads.primary.query("""
            SELECT app_id, timezone, currency::text FROM apps WHERE \(app)::text IS NULL OR app_id = \(app)::text ORDER BY app_id
            """)
        return try rows.map { ReportApp(id: try $0.decode(0), timezone: try $0.decode(1), currency: try $0.decode(2)) }
    }

    /// The first day, in `app`'s zone, that holds any of its counts (compacted or not);
    /// nil when it has none. What a comparison with earlier days needs to know: days
    /// before it are not "zero", they are before the app's data.
    public func firstDataDay(of app: ReportApp) async throws -> Int? {
        try await reads.run { pool, _, _ in
            try await pool.withTransaction(begin: Self.snapshot) { connection in try Self.firstDataDay(of: app.id, in: app.timezone, on: connection) }
        }
    }

    /// The same for `app` in `zone`, on a connection the caller holds (an import's).
    static func firstDataDay(of app: String, in zone: String, on connection: PostgresConnection) throws -> Int? {
        try connection.query("""
            SELECT (least((SELECT min(hour) FROM rollup_1h_compacted WHERE app_id = \(app)),
                          (SELECT min(bucket) FROM rollup_delta WHERE app_id = \(app))) AT TIME ZONE \(zone))::date - DATE '1970-01-01'
            """).first?.decode(0, as: Int?.self)
    }

    /// A page's rows, by its statement prepared on the connection and planned for any
    /// parameters (a generic plan, kept by the connection for the next report of that
    /// shape until a table's statistics change: a compaction pass's VACUUM replans it).
    /// Planning the default report's statement for its own parameters took 1 ms of its 7
    /// in PostgreSQL, and the generic plans ran as fast or faster on every rollup-served
    /// shape tried on the bench's data (10 M events, psql, 25 EXECUTEs each, custom →
    /// generic): the default report 6.6 → 5.7 ms, the median app 5.2 → 4.1, audience
    /// 8.7 → 6.7, 2 days by the hour 9.8 → 7.5, a year by day 5.3 → 4.1, one day by network
    /// and country 10.8 → 8.3. (An earlier engine's generic plan was the slower one, 8 ms
    /// against 4: `make bench-report` measures it.) Only the page: every other statement of
    /// the report is sent once and planned for its parameters. Not for raw events: a
    /// generic plan cannot drop the `events` partitions while planning, and each run would
    /// lock every partition kept (90 days by default) before pruning them. Not on Citus,
    /// which cannot plan a statement over many shards without its parameters' values.
    static func pageRows(_ plan: ReportPlan, limit: Int, on connection: PostgresConnection) throws -> PostgresRows {
        guard !plan.distributed, plan.source != .raw else { return try connection.queryPrepared(plan.page(limit: limit)) }
        _ = try connection.execute(unsafeSQL: "SET LOCAL plan_cache_mode = force_generic_plan")
        let rows = try connection.queryPrepared(plan.page(limit: limit))
        _ = try connection.execute(unsafeSQL: "SET LOCAL plan_cache_mode = force_custom_plan")
        return rows
    }

    /// How a report's transaction starts: every statement of it (the dirty ranges that
    /// `prepare` reads, the rows, the totals) sees one snapshot (Migrations/0012, invariant 5).
    static let snapshot = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"

    /// One page of a report with totals over every matching row (JSON).
    public func page(_ query: ReportQuery) async throws -> ReportDocument {
        try await reads.run { pool, readFrom, _ in
            try await pool.withTransaction(begin: Self.snapshot) { connection in
            if query.isCohortReport { return try Self.cohortPage(query, readFrom: readFrom, on: connection) }
            let plan = try self.plan(query, on: connection)
            let notes = try Self.notes(plan, readFrom: readFrom, on: connection)
            let limit = query.limit ?? ReportQuery.maxLimit
            let fetched = try Self.pageRows(plan, limit: limit, on: connection)
            let rows = fetched.prefix(limit)
            var page = try rows.map { try plan.decodeRow($0) }
            var totals = ReportCounts()
            if let first = rows.first {
                if let missing = try first.decode(plan.unratedColumn + 2, as: String?.self) {
                    throw ReportCurrencyError(missing: missing, reportCurrency: query.currency)
                }
                totals = try plan.decodeCounts(first, at: plan.totalsColumn)
                totals.unratedEvents = try first.decode(plan.unratedColumn, as: Int64.self)
            } else if query.after != nil {
                totals = try Self.totals(plan, on: connection)
            }
            // The extra row fetched says there is more; the cursor holds the last row's sort key.
            let next = try fetched.count > limit
                ? ReportCursor.make(after: (0..<plan.sortKeys.count).map { try rows[rows.endIndex - 1].decode(plan.keyColumn + $0, as: String?.self) }, for: query)
                : nil
            var previousTotals: ReportCounts?
            if let compared = query.comparedQuery {
                let earlier = try Self.compared(compared, plan: plan, on: connection)
                Self.attach(earlier.rows, to: &page, query.dimensions)
                previousTotals = earlier.totals
            }
            return ReportDocument(layout: ReportLayout(query: query), rows: page, totals: totals, previousTotals: previousTotals, notes: notes, nextCursor: next)
            }
        }
    }

    /// Streams every row of a report (the first `limit` when given), in chunks fetched
    /// from a server-side cursor: memory does not grow with rows. A report that is a
    /// stored grain (`ReportGrain`) is read from the rollups in its order, without
    /// grouping or sorting them; any other is grouped and sorted by PostgreSQL first.
    /// `start` runs before the first row, with the notes read in the stream's own
    /// snapshot when `withSummary` (an export's manifest and JSON need them to agree with
    /// its rows). Every refusal (an unknown zone, a compared period over the bound, a
    /// missing FX rate of the compared period, and with `refusingFirst` of this period)
    /// is thrown before `start`, so a caller that
    /// must refuse before its first byte sends nothing until `start`: the refusal, the
    /// comparison and the rows all come from one snapshot. Every streamed row carries its
    /// own FX check, and a row with an amount whose rate is missing fails the stream
    /// instead of leaving the amount out.
    ///
    /// Returns the totals when `withTotals`: summed from the rows as they pass (the rows
    /// add up to the totals, DESIGN §3), so the report is evaluated once; only unique
    /// devices and the audience (sketches do not add) and a stream cut by `limit` have
    /// them computed apart.
    @discardableResult
    public func stream(
        _ query: ReportQuery, withSummary: Bool = false, withTotals: Bool = false, refusingFirst: Bool = false, idleInTransaction: Duration = .seconds(60),
        start: (ReportSummary?) async throws -> Void, rows: ([ReportRow]) async throws -> Void
    ) async throws -> ReportCounts? {
        if query.isCohortReport {
            // A cohort report's rows are few (cohorts x what devices were first seen with):
            // read whole, then handed on, every refusal before `start`.
            return try await reads.run { pool, readFrom, started in
                try await pool.withLease { lease in
                    let report = try await lease.run { connection in
                        try connection.execute(unsafeSQL: "\(Self.snapshot); SET LOCAL idle_in_transaction_session_timeout = '\(max(1, idleInTransaction.components.seconds))s'")
                        return try Self.cohortReport(query, readFrom: readFrom, on: connection)
                    }
                    try await lease.run { connection in _ = try connection.execute(unsafeSQL: "COMMIT") }
                    started()
                    try await start(withSummary ? ReportSummary(notes: report.notes, previousTotals: nil) : nil)
                    var page = Array(Self.cohortRows(report.rows, after: query.after, query: query))
                    if let limit = query.limit { page = Array(page.prefix(limit)) }
                    var start = 0
                    while start < page.count {
                        try await rows(Array(page[start..<min(page.count, start + Self.fetchSize)]))
                        start += Self.fetchSize
                    }
                    return withTotals ? report.totals : nil
                }
            }
        }
        return try await reads.run { pool, readFrom, started in
          try await pool.withLease { lease in
            let (plan, compared, summary, grain) = try await lease.run { connection -> (ReportPlan, [String: ReportCounts]?, ReportSummary?, GrainReader?) in
                // Every row will be read: plan the cursor for the whole result, not for
                // its first rows (PostgreSQL's default for cursors, cursor_tuple_fraction 0.1).
                // A client that reads nothing for `idleInTransaction` (a minute, unless the
                // caller cuts slow readers itself) loses its transaction, its snapshot and
                // its connection, which other reports and vacuum need.
                try connection.execute(unsafeSQL: "\(Self.snapshot); SET LOCAL cursor_tuple_fraction = 1; SET LOCAL idle_in_transaction_session_timeout = '\(max(1, idleInTransaction.components.seconds))s'")
                let plan = try self.plan(query, on: connection)
                // A caller that cannot take back what it sent (a 200, a CSV header) asks for
                // a missing FX rate to be refused here, before `start`, not at its row.
                if refusingFirst { try Self.checkFX(plan, on: connection) }
                let compared = try query.comparedQuery.map { try Self.compared($0, plan: plan, on: connection) }
                var summary: ReportSummary?
                if withSummary {
                    summary = ReportSummary(notes: try Self.notes(plan, readFrom: readFrom, on: connection), previousTotals: compared?.totals)
                }
                // A stored grain is read in its order (each FETCH costs its own rows, so a
                // stream that is making progress is never cut by the statement timeout).
                if let grain = plan.grain, let reader = try GrainReader(plan, grain, on: connection) {
                    return (plan, compared?.rows, summary, reader)
                }
                try connection.query(plan.declareCursor(limit: query.limit))
                return (plan, compared?.rows, summary, nil)
            }
            // From here the caller may have sent something: no second try on the primary.
            started()
            try await start(summary)
            let summing = withTotals && query.limit == nil && query.after == nil && !plan.needsDevices && !plan.needsAudience
            let totals: ReportCounts? = withTotals && !summing
                ? try await lease.run { connection in try Self.totals(plan, on: connection) } : nil
            // The next chunk is fetched (and decoded, on a pool thread) while this one is
            // written to the socket: PostgreSQL and the writer work at the same time.
            // A chunk's rows and the unrated events under them (for the totals; a row shows none).
            let unratedColumn = plan.missingFXColumn + 1
            let fetch: @Sendable (PostgresConnection) throws -> (rows: [ReportRow], unrated: Int64) = { connection in
                if let grain { return try grain.next(Self.fetchSize, on: connection) }
                var unrated: Int64 = 0
                let rows = try connection.execute(unsafeSQL: "FETCH \(Self.fetchSize) FROM report_rows").map { row in
                    if let missing = try row.decode(plan.missingFXColumn, as: String?.self) {
                        throw ReportCurrencyError(missing: missing, reportCurrency: query.currency)
                    }
                    unrated += try GrainReader.integer(row, unratedColumn)
                    return try plan.decodeRow(row)
                }
                return (rows, unrated)
            }
            var sums = ReportCounts()
            var chunk = try await lease.run(fetch)
            while !chunk.rows.isEmpty {
                let isLast = chunk.rows.count < Self.fetchSize
                async let following = isLast ? ([], 0) : lease.run(fetch)
                if summing {
                    for row in chunk.rows { sums.add(row.counts) }
                    sums.unratedEvents += chunk.unrated
                }
                if let compared { Self.attach(compared, to: &chunk.rows, query.dimensions) }
                try await rows(chunk.rows)
                chunk = try await following
            }
            try await lease.run { connection in
                try grain?.finish(on: connection)
                _ = try connection.execute(unsafeSQL: "COMMIT")
            }
            return summing ? sums : totals
          }
        }
    }

    /// The plan of a report on this connection's database, its transaction prepared.
    func plan(_ query: ReportQuery, on connection: PostgresConnection) throws -> ReportPlan {
        let prepared = try Self.prepare(query, on: connection)
        // The networks' final earnings over this range and the compared one, in this snapshot.
        var span = query
        if let compared = query.comparedQuery {
            span.from = min(query.from, compared.query.from)
            span.to = max(query.to, compared.query.to)
        }
        let record = prepared.recordWindow != nil ? try ReportPlan.recordDays(span, on: connection) : []
        var plan = ReportPlan(query, distributed: prepared.distributed, dirty: prepared.dirty, record: record)
        if plan.needsMoney && query.revenueSource == .ofRecord { plan.recordWindow = prepared.recordWindow }

        logger.debug("report plan", metadata: ["source": "\(plan.sourceDescription)", "sql": "\(plan.grouped().sql)"])
        return plan
    }

    /// Checks the report's zone and sets planner settings for the transaction.
    /// Returns whether the database is a Citus coordinator (`Citus.installedSQL`), the
    /// dirty ranges of the query's apps (`ReportPlan.DirtyRange`), and the longest
    /// restatement window of a network whose policy takes its final earnings (nil: none;
    /// `RevenueOfRecord`; asked in the same round trip, so a report pays nothing for the
    /// policy where no network has it).
    static func prepare(_ query: ReportQuery, on connection: PostgresConnection) throws -> (distributed: Bool, dirty: [ReportPlan.DirtyRange], recordWindow: Int?) {
        do {
            // No JIT: a report's row estimates run high, which made PostgreSQL spend
            // ~0.5 s compiling a query that runs in milliseconds. More work_mem than the
            // default 4 MB, so an export's grouping and sort stay in memory longer. No merge
            // joins: the rate card's rows per day are estimated far off, and the merge joins
            // chosen on them sorted every priced row (44 ms against 11 ms hashed, per 8 k rows).
            // Every statement is planned for its own parameters (the page's own plan is
            // `pageRows`'s concern).
            // The zone is not a session setting (Citus does not send it to its workers):
            // the plan's SQL names it at every conversion, as a literal, so its name may
            // hold only what zone names hold. Checked here, so that a zone PostgreSQL does
            // not know is the parameter's error, before any report SQL.
            guard query.timezone.utf8.allSatisfy({ byte in
                (0x30...0x39).contains(byte) || (0x41...0x5A).contains(byte) || (0x61...0x7A).contains(byte) || "/_+-".utf8.contains(byte)
            }) else {
                throw ReportQueryError("tz", "\"\(query.timezone)\" is not a time zone PostgreSQL knows")
            }
            let rows = try connection.query("""
                SELECT now() AT TIME ZONE \(query.timezone), set_config('jit', 'off', true), set_config('work_mem', '64MB', true),
                       set_config('enable_mergejoin', 'off', true), \(unsafeRaw: Citus.installedSQL), set_config('plan_cache_mode', 'force_custom_plan', true),
                       (SELECT max(final_after_days) FROM network_settings WHERE revenue_source = 'network_when_final')
                """)
            let distributed = try rows.first?.decode(4, as: Bool.self) ?? false
            let recordWindow = try rows.first?.decode(6, as: Int?.self)
            let dirty = try connection.query("""
                SELECT app_id, network, format, from_day::text, to_day::text FROM rollup_dirty WHERE app_id = ANY(\(array: query.apps)::text[])
                """).map { row in
                ReportPlan.DirtyRange(app: try row.decode(0), network: try row.decode(1), format: try row.decode(2), from: try row.decode(3), to: try row.decode(4))
            }
            return (distributed, dirty, recordWindow)
        } catch let error as PostgresError where error.sqlState == .invalidParameterValue {
            throw ReportQueryError("tz", "\"\(query.timezone)\" is not a time zone PostgreSQL knows")
        }
    }

    /// Refuses a report that needs an FX rate the table lacks, before a stream starts.
    static func checkFX(_ plan: ReportPlan, on connection: PostgresConnection) throws {
        guard plan.needsMoney else { return }
        if let missing = try connection.query(plan.missingFX()).first?.decode(0, as: String?.self) {
            throw ReportCurrencyError(missing: missing, reportCurrency: plan.query.currency)
        }
    }

    /// The totals row of a plan (and a 422 when an FX rate is missing).
    static func totals(_ plan: ReportPlan, on connection: PostgresConnection) throws -> ReportCounts {
        let row = try connection.query(plan.totals()).first!
        if let missing = try row.decode(ReportPlan.countColumns + 1, as: String?.self) {
            throw ReportCurrencyError(missing: missing, reportCurrency: plan.query.currency)
        }
        var totals = try plan.decodeCounts(row, at: 0)
        totals.unratedEvents = try row.decode(ReportPlan.countColumns, as: Int64.self)
        return totals
    }

    /// The notes of a JSON page. A day is
    /// provisional until the accepted event age has passed since its end — measured
    /// on a replica from what it holds (now minus its replay lag), so that a lagging
    /// replica never calls a day final before every event of it has reached it.
    static func notes(_ plan: ReportPlan, readFrom: ReportNotes.ReadFrom = .init(server: .primary), on connection: PostgresConnection) throws -> ReportNotes {
        let query = plan.query
        var notes = ReportNotes()
        notes.readFrom = readFrom
        let lag = readFrom.server == .replica ? readFrom.replicaLagSeconds ?? 0 : 0
        notes.source = plan.sourceDescription
        if plan.source == .raw {
            // Partitions are named events_YYYYMMDD (UTC days); the oldest holds the first raw events kept.
            let oldest = try connection.query("""
                SELECT first - DATE '1970-01-01', \(plan.t0) < first::timestamp AT TIME ZONE 'UTC'
                FROM (SELECT min(to_date(substr(c.relname, 8), 'YYYYMMDD')) AS first FROM pg_inherits i
                      JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'events') AS o
                WHERE first IS NOT NULL
                """)
            if let row = oldest.first, try row.decode(1, as: Bool.self) { notes.rawEventsFrom = try row.decode(0, as: Int.self) }
            // An app that keeps fewer days than the servers (`apps.retention_days`, DESIGN §15):
            // its raw events start later, at the latest such start among the report's apps.
            let own = try connection.query("""
                SELECT max((now() AT TIME ZONE 'UTC')::date - retention_days + 1) - DATE '1970-01-01',
                       \(plan.t0) < max((now() AT TIME ZONE 'UTC')::date - retention_days + 1)::timestamp AT TIME ZONE 'UTC'
                FROM apps WHERE app_id = ANY(\(array: query.apps)::text[]) AND retention_days IS NOT NULL
                """)
            if let row = own.first, let day = try row.decode(0, as: Int?.self), try row.decode(1, as: Bool?.self) == true {
                notes.rawEventsFrom = max(notes.rawEventsFrom ?? day, day)
            }
        } else if plan.needsViewers {
            // Impressions compacted before 0014 have no viewer sketch.
            let since = try connection.query("""
                SELECT (viewers_from AT TIME ZONE 'UTC')::date - DATE '1970-01-01' FROM id_horizon WHERE viewers_from > \(plan.t0)
                """)
            if let row = since.first { notes.viewersFrom = try row.decode(0, as: Int.self) }
        }
        // A day is provisional while late events may still come, and, where a network's
        // revenue of record may still replace its SDK revenue, until its restatement
        // window (and the day its report is imported) has passed.
        let wait = Self.provisionalWait(lag: lag, recordWindow: plan.recordWindow)
        var daysSQL: PostgresQuery = "SELECT d - DATE '1970-01-01', extract(epoch FROM e - s)::bigint, e > now() - "
        daysSQL.append(wait)
        daysSQL.append(", extract(epoch FROM e + ")
        daysSQL.append(wait)
        daysSQL.append("""
            )::bigint
            FROM (SELECT g.d, g.d::timestamp AT TIME ZONE \(unsafeRaw: plan.zone) AS s, (g.d + 1)::timestamp AT TIME ZONE \(unsafeRaw: plan.zone) AS e
                  FROM (SELECT \(ReportQuery.formatDate(query.from))::date + n AS d
                        FROM generate_series(0, \(ReportQuery.formatDate(query.to))::date - \(ReportQuery.formatDate(query.from))::date) AS n) AS g) AS days
            """)
        let days = try connection.query(daysSQL)
        if plan.hasRecord, let range = try connection.query("SELECT extract(epoch FROM \(plan.t0))::bigint, extract(epoch FROM \(plan.t1))::bigint").first {
            notes.revenueOfRecord = plan.recordNotes(t0: try range.decode(0), t1: try range.decode(1))
        }
        for row in days {
            let day = try row.decode(0, as: Int.self)
            let seconds = try row.decode(1, as: Int.self)
            if seconds != 86_400 { notes.dayLengths.append(.init(day: day, hours: Double(seconds) / 3600)) }
            if try row.decode(2, as: Bool.self) {
                notes.provisionalDays.append(day)
                notes.finalAt = try row.decode(3, as: Int64.self)
            }
        }
        return notes
    }

    /// How long after a day's end it may still change (SQL, an interval): the accepted
    /// event age (measured on a replica from what it holds: plus its lag) and, where a
    /// network's final earnings may still replace revenue, its restatement window and a day.
    static func provisionalWait(lag: Double, recordWindow: Int?) -> PostgresQuery {
        """
        greatest(make_interval(secs => \(lag)::float8 + (SELECT max_event_age_seconds FROM id_horizon)), make_interval(days => \(recordWindow.map { $0 + 1 } ?? 0)::int))
        """
    }

    /// Gives each row the compared period's sums for its dimensions (zero when it had none).
    static func attach(_ earlier: [String: ReportCounts], to rows: inout [ReportRow], _ dimensions: [ReportDimension]) {
        for index in rows.indices {
            rows[index].previous = earlier[ReportPlan.comparisonKey(rows[index].dimensions, dimensions, shift: nil)] ?? ReportCounts()
        }
    }

    /// The most rows of the compared period a comparison holds: they are kept in memory
    /// (keyed by their shifted dimensions) while this period's rows stream past them,
    /// a few hundred bytes each, so at most ~10 MB a report.
    public static let maxComparedRows = 20_000

    static func comparisonTooLarge(_ query: ReportQuery) -> ReportQueryError {
        ReportQueryError(
            "compare",
            "the compared period has more than \(maxComparedRows) rows for these dimensions, more than a comparison holds; "
                + "compare with fewer dimensions, a filter or a shorter range",
            kind: .tooLarge
        )
    }

    /// Every row and the totals of the compared period, keyed by their dimensions
    /// shifted onto this period's; more than `maxComparedRows` rows are refused (422).
    static func compared(
        _ compared: (query: ReportQuery, shiftDays: Int, shiftMonths: Int), plan later: ReportPlan, on connection: PostgresConnection
    ) throws -> (rows: [String: ReportCounts], totals: ReportCounts) {
        let plan = later.compared(compared.query)
        var rows: [String: ReportCounts] = [:]
        let grouped = try connection.query("SELECT * FROM (\n\(plan.grouped())\n) AS g LIMIT \(Self.maxComparedRows + 1)")
        guard grouped.count <= Self.maxComparedRows else { throw comparisonTooLarge(compared.query) }
        // The rows add up to the totals (DESIGN §3), so the period is aggregated once;
        // only sketches (devices, the audience) do not add.
        let summing = !plan.needsDevices && !plan.needsAudience
        var totals = ReportCounts()
        let unratedColumn = compared.query.dimensions.count + ReportPlan.countColumns
        for row in grouped {
            let decoded = try plan.decodeRow(row)
            if summing {
                if let missing = try row.decode(unratedColumn + 1, as: String?.self) {
                    throw ReportCurrencyError(missing: missing, reportCurrency: plan.query.currency)
                }
                totals.add(decoded.counts)
                totals.unratedEvents += try row.decode(unratedColumn, as: Int64.self)
            }
            rows[ReportPlan.comparisonKey(decoded.dimensions, compared.query.dimensions, shift: compared), default: ReportCounts()].add(decoded.counts)
        }
        return (rows, summing ? totals : try Self.totals(plan, on: connection))
    }
}
