import AdTallyCore
import Foundation
import Logging
import Metrics
import PostgresKit

/// Writes the report engine's output into `report_series` (Migrations/0007), the
/// table Grafana's PostgreSQL datasource reads: Grafana panels select and filter,
/// the engine computes (DESIGN §3 defines each metric once). Each app is written in
/// its own zone and currency: per day over the last `days` days, per hour over the
/// last `hourDays`, and the last 7 and 28 whole days as one row each; every one per
/// network and for all networks together (network `*`).
public struct ReportSeriesWriter: Sendable {
    /// How much is rewritten on each refresh.
    public struct Configuration: Sendable {
        /// Days (today included) rewritten per day.
        public var days = 35
        /// Days (today included) rewritten per hour.
        public var hourDays = 2
        /// A refresh of an app that another server wrote less than this ago is skipped.
        public var freshFor: Duration = .seconds(30)

        /// The defaults.
        public init() {}
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
    ]

    /// Rewrites the recent series of every app (skipping apps another server has just
    /// written, unless `force`); returns the rows written. An app whose report fails
    /// (a missing FX rate) is logged and skipped; the others are still written.
    @discardableResult
    public func refresh(force: Bool = false, now: Date = Date()) async throws -> Int {
        let started = ContinuousClock.now
        defer { Metrics.Timer(label: "adtally_report_series_refresh_seconds").record(duration: ContinuousClock.now - started) }
        var written = 0
        for app in try await engine.readableApps(only: nil) {
            if !force {
                let fresh = try await pool.query("""
                    SELECT EXISTS (SELECT 1 FROM report_series WHERE app_id = \(app.id) AND grain = 'day'
                                   AND refreshed_at > now() - make_interval(secs => \(Double(configuration.freshFor.components.seconds))))
                    """)
                if try fresh[0].decode(0, as: Bool.self) { continue }
            }
            do {
                written += try await refresh(app, now: now)
            } catch let error as ReportCurrencyError {
                logger.warning("report series of an app not refreshed", metadata: ["app": "\(app.id)", "error": "\(error)"])
            }
        }
        return written
    }

    /// One grain's range of an app, and the rows the engine gave for it.
    struct Part {
        var grain: String
        var from: Int
        var to: Int
        var rows: [UInt8] = []
        var count = 0
    }

    func refresh(_ app: ReportApp, now: Date) async throws -> Int {
        let today = try ReportQuery.today(in: app.timezone, now: now)
        var parts = [
            Part(grain: "day", from: today - configuration.days + 1, to: today),
            Part(grain: "hour", from: today - configuration.hourDays + 1, to: today),
            Part(grain: "last_7_days", from: today - 7, to: today - 1),
            Part(grain: "last_28_days", from: today - 28, to: today - 1),
        ]
        for index in parts.indices {
            let dimension: [ReportDimension] = switch parts[index].grain {
            case "day": [.date]
            case "hour": [.hour]
            default: []
            }
            for byNetwork in [false, true] {
                let query = try ReportQuery.parse(
                    [
                        ("apps", app.id), ("from", ReportQuery.formatDate(parts[index].from)), ("to", ReportQuery.formatDate(parts[index].to)),
                        ("dimensions", (dimension + (byNetwork ? [.network] : [])).map(\.rawValue).joined(separator: ",")),
                        ("metrics", Self.metrics.map(\.rawValue).joined(separator: ",")), ("limit", String(ReportQuery.maxLimit)),
                    ],
                    readable: [app], isAdmin: true
                )
                let page = try await engine.page(query)
                Self.append(page, grain: parts[index].grain, hasPeriod: !dimension.isEmpty, byNetwork: byNetwork, to: &parts[index])
            }
        }
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
        let windows = parts.map { "\($0.grain)=\(ReportQuery.formatDate($0.from))" }
        try await pool.withTransaction { connection in
            // Two servers refreshing one app take turns (each rewrites what the other wrote).
            try connection.query("SELECT pg_advisory_xact_lock(\(Int32(0x4164_5461)), hashtext(\(app.id)))")
            try connection.query("""
                DELETE FROM report_series s USING (
                    SELECT split_part(w, '=', 1) AS grain, split_part(w, '=', 2)::date AS first FROM unnest(\(array: windows)::text[]) AS w
                ) AS w
                WHERE s.app_id = \(app.id) AND s.grain = w.grain
                  AND (s.grain LIKE 'last%' OR s.period_start >= w.first::timestamp AT TIME ZONE \(app.timezone))
                """)
            try connection.query("""
                INSERT INTO report_series (app_id, grain, network, period_start, period, timezone, currency, provisional, \(unsafeRaw: names))
                SELECT \(app.id), r.grain, r.network,
                       CASE r.grain WHEN 'hour' THEN r.period::timestamptz
                                    ELSE split_part(r.period, '/', 1)::date::timestamp AT TIME ZONE \(app.timezone) END,
                       r.period, \(app.timezone), \(app.currency), r.provisional, \(unsafeRaw: names)
                FROM jsonb_to_recordset(\(text)::jsonb) AS r(grain text, network text, period text, provisional boolean, \(unsafeRaw: columns))
                """)
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
