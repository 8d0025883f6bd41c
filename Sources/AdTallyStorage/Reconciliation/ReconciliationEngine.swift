import AdTallyCore
import Foundation
import PostgresKit

/// The discrepancy report (DESIGN §11): per row of the asked dimensions, AdTally's
/// impressions, taps and revenue — from the report engine, in each network's own zone —
/// beside the network's figures from its current imports, converted to the query's
/// currency with the FX table (a missing rate is a 422 naming it, as in reports).
public struct ReconciliationEngine: Sendable {
    let reports: ReportEngine

    /// An engine whose own side is `reports`.
    public init(reports: ReportEngine) { self.reports = reports }

    /// Most rows of a reconciliation (each side's, before they are joined).
    public static let maxRows = ReportQuery.maxLimit

    /// The network side of one group: its sums, the zone and imports it came from, and
    /// how close to final it is.
    struct TheirGroup {
        var key: [String?]
        var network: String
        var zone: String
        var side: ReconciliationSide
        /// Fewest days between a day and the import that reported it (in the import's zone).
        var margin: Int
        var isDelayed: Bool
        var imports: Set<Int64>
        var newestImport: Int64
    }

    /// Runs a reconciliation.
    public func run(_ query: ReconciliationQuery) async throws -> ReconciliationDocument {
        let report = query.report
        let primary = reports.reads.primary
        let groups = try await Self.theirs(report, on: primary)
        var settings: [String: NetworkReportStore.Settings] = [:]
        for setting in try await NetworkReportStore(pool: primary).settings() { settings[setting.network] = setting }
        func setting(_ network: String) -> NetworkReportStore.Settings { settings[network] ?? .defaults(network) }

        // Each network's days are in the zone of its newest import; a network whose
        // imports in the range are in two zones (an AdMob account whose zone changed) is
        // compared in the newest one, and the rest is said.
        var zoneOf: [String: (zone: String, newest: Int64)] = [:]
        for group in groups where group.newestImport > zoneOf[group.network]?.newest ?? 0 {
            zoneOf[group.network] = (group.zone, group.newestImport)
        }
        var remarks: [String] = []
        var leftOut: [String: Set<String>] = [:]
        for group in groups where group.zone != zoneOf[group.network]?.zone { leftOut[group.network, default: []].insert(group.zone) }
        for (network, zones) in leftOut.sorted(by: { $0.key < $1.key }) {
            remarks.append("\(network): imports in \(zones.sorted().joined(separator: ", ")) are left out; the newest import's zone, \(zoneOf[network]!.zone), is the one compared")
        }

        var rows: [[String?]: ReconciliationRow] = [:]
        var order: [[String?]] = []
        func row(_ key: [String?]) -> ReconciliationRow {
            if let existing = rows[key] { return existing }
            order.append(key)
            // The smallest of its networks' tolerances: none seen yet.
            var new = ReconciliationRow(dimensions: key)
            new.tolerancePct = .infinity
            return new
        }
        for group in groups where group.zone == zoneOf[group.network]?.zone {
            var current = row(group.key)
            var theirs = current.theirs ?? ReconciliationSide()
            theirs.add(group.side)
            current.theirs = theirs
            current.networks.insert(group.network)
            current.tolerancePct = min(current.tolerancePct, setting(group.network).tolerancePct)
            current.isFinal = current.isFinal && !group.isDelayed && group.margin >= setting(group.network).finalAfterDays
            current.imports.formUnion(group.imports)
            rows[group.key] = current
        }

        // AdTally's side, by the report engine, a query per zone.
        let byZone = Dictionary(grouping: zoneOf.keys.sorted(), by: { zoneOf[$0]!.zone })
        for (zone, networks) in byZone.sorted(by: { $0.key < $1.key }) {
            let ours: ReportQuery
            do { ours = try query.ours(zone: zone, networks: networks) } catch { throw error }
            guard ours.filters.first(where: { $0.dimension == .network }).map({ !$0.values.isEmpty }) ?? true else { continue }
            let page = try await reports.page(ours)
            guard page.nextCursor == nil else { throw Self.tooLarge() }
            let networkColumn = ours.dimensions.firstIndex(of: .network)!
            for reported in page.rows {
                let key = Array(reported.dimensions.prefix(report.dimensions.count))
                var current = row(key)
                current.ours.add(ReconciliationSide(impressions: reported.counts.impressions, clicks: reported.counts.taps, revenueMicros: reported.counts.revenueMicros))
                if let network = reported.dimensions[networkColumn] {
                    current.networks.insert(network)
                    current.tolerancePct = min(current.tolerancePct, setting(network).tolerancePct)
                }
                rows[key] = current
            }
        }
        guard rows.count <= Self.maxRows else { throw Self.tooLarge() }
        var result = order.map { rows[$0]! }
        for index in result.indices {
            if result[index].theirs == nil { result[index].isFinal = false }
            if !result[index].tolerancePct.isFinite { result[index].tolerancePct = ReconciliationRow.defaultTolerancePct }
        }
        result.sort { Self.precedes($0.dimensions, $1.dimensions) }

        let used = Set(result.flatMap(\.imports))
        let imports = try await primary.query("""
            SELECT import_id, source, zone, to_char(imported_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), to_json(warnings)::text
            FROM network_imports WHERE import_id = ANY(\(array: used.sorted())) ORDER BY import_id
            """).map { row in
            (id: try row.decode(0, as: Int64.self), source: try row.decode(1, as: String.self), zone: try row.decode(2, as: String.self),
             importedAt: try row.decode(3, as: String.self), warnings: try NetworkReportStore.strings(row.decode(4)))
        }
        let networks = zoneOf.keys.sorted().map { name in
            (name: name, zone: zoneOf[name]!.zone, tolerancePct: setting(name).tolerancePct, finalAfterDays: setting(name).finalAfterDays)
        }
        return ReconciliationDocument(query: query, rows: result, networks: networks, imports: imports, remarks: remarks)
    }

    /// Rows in the order of their dimension values (nulls last), as a report's default sort.
    static func precedes(_ left: [String?], _ right: [String?]) -> Bool {
        for (a, b) in zip(left, right) where a != b {
            guard let a else { return false }
            guard let b else { return true }
            return a < b
        }
        return false
    }

    static func tooLarge() -> ReportQueryError {
        ReportQueryError("dimensions", "the reconciliation has more than \(maxRows) rows; narrow the range, the apps or the dimensions", kind: .tooLarge)
    }

    /// The network side: the current import's figures per app, network and day (the
    /// newest import with figures for it), grouped by the asked dimensions, the network
    /// and the import's zone, revenue converted on the network's date.
    static func theirs(_ report: ReportQuery, on pool: PostgresPool) async throws -> [TheirGroup] {
        let rc = report.currency
        func filter(_ dimension: ReportDimension) -> [String]? { report.filters.first { $0.dimension == dimension }?.values }
        var keys: [String] = []
        for dimension in report.dimensions {
            switch dimension {
            case .date: keys.append("r.day::text")
            case .app: keys.append("r.app_id")
            case .network: keys.append("r.network")
            case .format: keys.append("r.format")
            case .country: keys.append("nullif(r.country, '')")
            default: throw ReportQueryError("dimensions", "\(dimension.rawValue) is not a dimension both sides have")
            }
        }
        let keyList = keys.enumerated().map { "\($0.element) AS k\($0.offset), " }.joined()
        let groupKeys = (keys.indices.map { "k\($0)" } + ["r.network", "i.zone"]).joined(separator: ", ")
        let networks = filter(.network), formats = filter(.format), countries = filter(.country), dates = filter(.date), apps = filter(.app)
        let rows = try await pool.query("""
            WITH cur AS (
                SELECT DISTINCT ON (app_id, network, day) app_id, network, day, import_id
                FROM network_report_rows
                WHERE app_id = ANY(\(array: report.apps)) AND day BETWEEN \(ReportQuery.formatDate(report.from))::date AND \(ReportQuery.formatDate(report.to))::date
                  AND (\(networks == nil) OR network = ANY(\(array: networks ?? [])))
                ORDER BY app_id, network, day, import_id DESC
            )
            SELECT \(unsafeRaw: keyList)r.network, i.zone,
                   sum(r.impressions)::bigint, coalesce(sum(r.clicks), 0)::bigint, bool_and(r.clicks IS NOT NULL),
                   sum(CASE WHEN r.currency = \(rc) THEN r.revenue_micros ELSE adtally_div_half_even(r.revenue_micros * fx.to_rate, fx.from_rate) END)::text,
                   min(CASE WHEN r.currency <> \(rc) AND fx.to_rate IS NULL AND r.revenue_micros <> 0
                            THEN r.day::text || ' ' || r.currency || ' '
                                 || CASE WHEN NOT EXISTS (SELECT 1 FROM fx_rates x WHERE x.day = r.day) THEN '*'
                                         WHEN EXISTS (SELECT 1 FROM fx_rates x WHERE x.day = r.day AND x.currency = \(rc)) THEN r.currency ELSE \(rc) END END),
                   min((i.imported_at AT TIME ZONE i.zone)::date - r.day)::int, bool_or(i.is_delayed),
                   string_agg(DISTINCT r.import_id::text, ' '), max(r.import_id)
            FROM network_report_rows r
            JOIN cur c ON c.app_id = r.app_id AND c.network = r.network AND c.day = r.day AND c.import_id = r.import_id
            JOIN network_imports i ON i.import_id = r.import_id
            LEFT JOIN LATERAL (
                -- Units of the query currency and of the row's per one base, on the network's date.
                SELECT t.rate AS to_rate, f.rate AS from_rate
                FROM fx_rates t JOIN fx_rates f ON f.day = t.day AND f.base = t.base AND f.currency = r.currency
                WHERE r.currency <> \(rc) AND t.day = r.day AND t.currency = \(rc)
                ORDER BY t.base LIMIT 1
            ) AS fx ON true
            WHERE r.app_id = ANY(\(array: apps ?? report.apps))
              AND (\(formats == nil) OR r.format = ANY(\(array: formats ?? [])))
              AND (\(countries == nil) OR r.country = ANY(\(array: countries ?? [])))
              AND (\(dates == nil) OR r.day::text = ANY(\(array: dates ?? [])))
            GROUP BY \(unsafeRaw: groupKeys)
            LIMIT \(maxRows + 1)
            """)
        guard rows.count <= maxRows else { throw tooLarge() }
        let width = keys.count
        return try rows.map { row in
            if let missing = try row.decode(width + 6, as: String?.self) { throw ReportCurrencyError(missing: missing, reportCurrency: rc) }
            let hasClicks = try row.decode(width + 4, as: Bool.self)
            return TheirGroup(
                key: try (0..<width).map { try row.decode($0, as: String?.self) }, network: try row.decode(width), zone: try row.decode(width + 1),
                side: ReconciliationSide(
                    impressions: try row.decode(width + 2), clicks: hasClicks ? try row.decode(width + 3, as: Int64.self) : nil,
                    revenueMicros: Int128(try row.decode(width + 5, as: String.self)) ?? 0
                ),
                margin: try row.decode(width + 7), isDelayed: try row.decode(width + 8),
                imports: Set(try row.decode(width + 9, as: String.self).split(separator: " ").compactMap { Int64($0) }),
                newestImport: try row.decode(width + 10)
            )
        }
    }
}
