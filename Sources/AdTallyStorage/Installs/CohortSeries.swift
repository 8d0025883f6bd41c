import AdTallyCore
import Foundation
import PostgresKit

/// The cohort series Grafana reads (`cohort_series`, Migrations/0025): an app's recent
/// install days with the engine's cohort metrics at the usual days N, written by the
/// series refresh on its full writes, in its transaction. Grafana selects; the engine
/// computes (DESIGN §3, §13).
extension ReportSeriesWriter {
    /// The metrics written (the columns of `cohort_series` after `installs`).
    public static let cohortMetrics = ["installs"] + [1, 3, 7, 14, 30].map { "retention_d\($0)" }
        + [0, 1, 3, 7, 14, 30].map { "revenue_per_install_d\($0)" } + ["impressions_per_install_d7"]

    /// Replaces the app's cohort rows of the last `configuration.cohortDays` whole install
    /// days (up to yesterday: today's installs are null until the day ends) from one
    /// cohort report; returns the rows written.
    func writeCohorts(_ app: ReportApp, today: Int, lease: PostgresLease) async throws -> Int {
        let from = today - configuration.cohortDays
        let query = try ReportQuery.parse(
            [("apps", app.id), ("from", ReportQuery.formatDate(from)), ("to", ReportQuery.formatDate(today - 1)), ("dimensions", "cohort"),
             ("metrics", Self.cohortMetrics.joined(separator: ",")), ("limit", String(ReportQuery.maxLimit))],
            readable: [app], isAdmin: true
        )
        // A cohort report that cannot be answered (a missing FX rate on the days around
        // the window) keeps the app's cohort rows as they were and fails nothing else.
        let document: ReportDocument
        do {
            document = try await engine.page(query)
        } catch let error as ReportCurrencyError {
            logger.warning("cohort series of \(app.id) not written: \(error)")
            return 0
        } catch let error as ReportQueryError {
            logger.warning("cohort series of \(app.id) not written: \(error)")
            return 0
        }
        let provisional = Set(document.notes.provisionalDays.map(ReportQuery.formatDate))
        // Rows as JSON objects of jsonb_to_recordset: the engine's cells, null for null.
        var json = "["
        for row in document.rows {
            // A cohort the engine has no installs of yet (its day not over by the database's clock).
            guard let cohort = row.dimensions.first ?? nil, row.counts.cohort.installs > 0 else { continue }
            if json.count > 1 { json += "," }
            json += "{\"cohort\":\"\(cohort)\",\"provisional\":\(provisional.contains(cohort))"
            for (name, cell) in zip(Self.cohortMetrics, document.layout.cells(row).dropFirst()) {
                let value: String = switch cell {
                case .null, .text: "null"
                case .integer(let number): "\(number)"
                // As the API writes them (ratios to 6 decimals, money to the currency's and 4 more).
                case .ratio(let number): number.isFinite ? ReportText.plain(cell) : "null"
                case .money: ReportText.plain(cell)
                }
                json += ",\"\(name)\":\(value)"
            }
            json += "}"
        }
        json += "]"
        let rows = json
        let columns = Self.cohortMetrics.map { name in
            "\(name) \(name == "installs" ? "bigint" : name.hasPrefix("revenue") ? "numeric" : "double precision")"
        }.joined(separator: ", ")
        let names = Self.cohortMetrics.joined(separator: ", ")
        try await lease.run { connection in
            try connection.query("DELETE FROM cohort_series WHERE app_id = \(app.id) AND cohort >= \(ReportQuery.formatDate(from))::date")
            try connection.query("""
                INSERT INTO cohort_series (app_id, cohort, local_start, timezone, currency, provisional, \(unsafeRaw: names))
                SELECT \(app.id), r.cohort, r.cohort::timestamp AT TIME ZONE 'UTC', \(app.timezone), \(app.currency), r.provisional, \(unsafeRaw: names)
                FROM jsonb_to_recordset(\(rows)::jsonb) AS r(cohort date, provisional boolean, \(unsafeRaw: columns))
                """)
        }
        return document.rows.count
    }
}
