import AdTallyCore
import PostgresKit

/// The report engine's cohort reports (DESIGN §13, `CohortReport`): the same API, CLI,
/// export and dashboard paths as every report, read from installs instead of rollups.
extension ReportEngine {
    /// A cohort report's rows, totals and notes, in the transaction of `connection`.
    static func cohortReport(
        _ query: ReportQuery, readFrom: ReportNotes.ReadFrom, on connection: PostgresConnection
    ) throws -> (rows: [ReportRow], totals: ReportCounts, notes: ReportNotes) {
        let prepared = try prepare(query, on: connection)
        let days = query.cohortMetrics.filter { $0.kind != .installs }.map(\.day)
        let money = CohortReport.moneyQuery(query, maxDay: days.max() ?? 0)
        let needsMoney = query.cohortMetrics.contains { $0.kind == .revenuePerInstall }
        let record = needsMoney && prepared.recordWindow != nil ? try ReportPlan.recordDays(money, on: connection) : []
        let report = CohortReport(query: query, record: record, distributed: prepared.distributed, dirty: prepared.dirty)
        let (rows, unrated) = try report.rows(on: connection)
        var totals = ReportCounts()
        for row in rows { totals.add(row.counts) }
        totals.unratedEvents = unrated
        var notes = ReportNotes()
        notes.readFrom = readFrom
        notes.source = report.readsGrain
            ? "installs: the cohort grain, each cohort's active devices and priced money per day (Migrations/0024_cohort_grain.sql), and the install deltas not yet folded"
            : "installs: each device's install and its active days with their money (Migrations/0023_installs.sql), and the install deltas not yet folded"
        notes.cohorts = try report.notes(on: connection)
        // A cohort is provisional until its last day read (day N of the largest N) has
        // passed and the accepted event age (and a network's restatement window) after it:
        // a late event may still move a device into it or add to one of its days.
        let lag = readFrom.server == .replica ? readFrom.replicaLagSeconds ?? 0 : 0
        // A network's restatement window counts only where its earnings may replace revenue here.
        let recordWindow = needsMoney && query.revenueSource == .ofRecord ? prepared.recordWindow : nil
        let last = days.max() ?? 0
        let wait = provisionalWait(lag: lag, recordWindow: recordWindow)
        var provisional: PostgresQuery = "SELECT c - DATE '1970-01-01', extract(epoch FROM e + "
        provisional.append(wait)
        provisional.append("""
            )::bigint
            FROM (SELECT g.c, (g.c + \(last)::int + 1)::timestamp AT TIME ZONE \(query.timezone) AS e
                  FROM (SELECT \(ReportQuery.formatDate(query.from))::date + n AS c
                        FROM generate_series(0, \(ReportQuery.formatDate(query.to))::date - \(ReportQuery.formatDate(query.from))::date) AS n) AS g) AS cohorts
            WHERE e > now() -
            """)
        provisional.append(wait)
        provisional.append(" ORDER BY 1")
        for row in try connection.query(provisional) {
            notes.provisionalDays.append(try row.decode(0, as: Int.self))
            notes.finalAt = try row.decode(1, as: Int64.self)
        }
        if !record.isEmpty, let range = try connection.query("""
            SELECT extract(epoch FROM \(ReportQuery.formatDate(money.from))::date::timestamp AT TIME ZONE \(query.timezone))::bigint,
                   extract(epoch FROM (\(ReportQuery.formatDate(money.to))::date + 1)::timestamp AT TIME ZONE \(query.timezone))::bigint
            """).first {
            let plan = ReportPlan(money, distributed: prepared.distributed, record: record, source: .raw)
            notes.revenueOfRecord = plan.recordNotes(t0: try range.decode(0), t1: try range.decode(1))
        }
        return (rows, totals, notes)
    }

    /// The rows of a cohort report after a cursor's sort key values (all of them, without one).
    static func cohortRows(_ rows: [ReportRow], after keys: [String?]?, query: ReportQuery) -> ArraySlice<ReportRow> {
        guard let keys else { return rows[...] }
        // The rows are in the sort's order (every dimension, byte order of their text): the
        // page starts at the first row past the cursor's.
        func isAfter(_ row: ReportRow) -> Bool {
            for (position, key) in query.sort.enumerated() {
                guard case .dimension(let dimension) = key.field, let index = query.dimensions.firstIndex(of: dimension) else { continue }
                let value = row.dimensions[index], cursor = keys[position]
                if value == cursor { continue }
                // NULLs first, ascending or not (as the statement orders them).
                guard let value else { return false }
                guard let cursor else { return true }
                let less = Array(value.utf8).lexicographicallyPrecedes(Array(cursor.utf8))
                return key.isDescending ? less : !less
            }
            return false
        }
        return rows[(rows.firstIndex(where: isAfter) ?? rows.endIndex)...]
    }

    /// One page of a cohort report.
    static func cohortPage(_ query: ReportQuery, readFrom: ReportNotes.ReadFrom, on connection: PostgresConnection) throws -> ReportDocument {
        let (rows, totals, notes) = try cohortReport(query, readFrom: readFrom, on: connection)
        let limit = query.limit ?? ReportQuery.maxLimit
        let rest = cohortRows(rows, after: query.after, query: query)
        let page = Array(rest.prefix(limit))
        let next = rest.count > limit ? ReportCursor.make(after: sortKeys(page[page.count - 1], query), for: query) : nil
        return ReportDocument(layout: ReportLayout(query: query), rows: page, totals: totals, previousTotals: nil, notes: notes, nextCursor: next)
    }

    /// A row's sort key values, in the sort's order.
    static func sortKeys(_ row: ReportRow, _ query: ReportQuery) -> [String?] {
        query.sort.map { key in
            guard case .dimension(let dimension) = key.field, let index = query.dimensions.firstIndex(of: dimension) else { return nil }
            return row.dimensions[index]
        }
    }
}
