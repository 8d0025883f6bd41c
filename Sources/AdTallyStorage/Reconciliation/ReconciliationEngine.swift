import AdTallyCore
import Foundation
import PostgresKit

/// The discrepancy report (DESIGN §11): per row of the asked dimensions, AdTally's
/// impressions, taps and revenue — from the report engine, in each network's own zone —
/// beside the network's figures from its current imports, converted to the query's
/// currency with the FX table (a missing rate is a 422 naming it, as in reports).
///
/// Both sides are read by app, network and day first (and the asked dimensions), so
/// each side covers the same days: only the app, network and days a network's report
/// covers (its imports' date ranges, zero where it wrote no line) are compared.
public struct ReconciliationEngine: Sendable {
    let reports: ReportEngine

    /// An engine whose own side is `reports`.
    public init(reports: ReportEngine) { self.reports = reports }

    /// Most rows of a reconciliation, on each side, by app, network and day.
    public static let maxRows = ReportQuery.maxLimit

    /// An app, network and day a network's report covers, and the import that is
    /// current for it: the newest of its source whose range holds the day.
    struct Covered: Hashable {
        var app: String
        var network: String
        var day: String
    }

    struct Coverage {
        var source: String
        var zone: String
        var importID: Int64
        /// Days from the day to the import (in the import's zone).
        var margin: Int
        var isDelayed: Bool
    }

    /// The network side of one group of the internal grain.
    struct TheirGroup {
        var key: [String?]
        var importID: Int64
        var side: ReconciliationSide
    }

    /// Runs a reconciliation.
    public func run(_ query: ReconciliationQuery) async throws -> ReconciliationDocument {
        let report = query.report
        let primary = reports.reads.primary
        // The internal grain: the asked dimensions, then date, app and network.
        var grain = report.dimensions
        for dimension in [ReportDimension.date, .app, .network] where !grain.contains(dimension) { grain.append(dimension) }
        let (dateAt, appAt, networkAt) = (grain.firstIndex(of: .date)!, grain.firstIndex(of: .app)!, grain.firstIndex(of: .network)!)

        let coverage = try await Self.coverage(report, on: primary)
        // No network report covers the range (every app's dashboard asks): nothing else to read.
        if coverage.isEmpty { return ReconciliationDocument(query: query, rows: [], networks: [], imports: [], remarks: []) }
        var settings: [String: NetworkReportStore.Settings] = [:]
        for setting in try await NetworkReportStore(pool: primary).settings() { settings[setting.network] = setting }
        func setting(_ network: String) -> NetworkReportStore.Settings { settings[network] ?? .defaults(network) }

        let (chosen, covered) = Self.choose(coverage)
        var remarks: [String] = []
        var leftOut: [Pair: Set<String>] = [:]
        for (key, options) in coverage {
            let pair = Pair(app: key.app, network: key.network)
            for option in options where option.source != chosen[pair]!.source || option.zone != chosen[pair]!.zone {
                leftOut[pair, default: []].insert("\(option.source) (\(option.zone))")
            }
        }
        for (pair, others) in leftOut.sorted(by: { ($0.key.app, $0.key.network) < ($1.key.app, $1.key.network) }) {
            let pick = chosen[pair]!
            remarks.append("\(pair.app) \(pair.network): compared with its \(pick.source) report (\(pick.zone)); imports from \(others.sorted().joined(separator: ", ")) are left out")
        }
        // The zone each network is read in, and its settings' view for the notes.
        var zonesOf: [String: Set<String>] = [:]
        for (pair, pick) in chosen { zonesOf[pair.network, default: []].insert(pick.zone) }

        var rows: [[String?]: ReconciliationRow] = [:]
        for group in try await Self.theirs(report, grain: grain, on: primary) {
            // Only the current import's figures: the newest of the chosen source whose range
            // holds the day (a newer one without a line for it says zero).
            guard let app = group.key[appAt], let network = group.key[networkAt], let day = group.key[dateAt],
                  covered[Covered(app: app, network: network, day: day)]?.importID == group.importID else { continue }
            var row = rows[group.key] ?? ReconciliationRow(dimensions: group.key)
            var theirs = row.theirs ?? ReconciliationSide()
            theirs.add(group.side)
            row.theirs = theirs
            rows[group.key] = row
        }

        // AdTally's side, by the report engine, a query per zone, kept where covered.
        var uncovered = 0
        var byZone: [String: Set<String>] = [:]
        for (pair, pick) in chosen { byZone[pick.zone, default: []].insert(pair.network) }
        for (zone, networks) in byZone.sorted(by: { $0.key < $1.key }).map({ ($0.key, $0.value.sorted()) }) {
            let ours = try query.ours(zone: zone, networks: networks, dimensions: grain)
            guard ours.filters.first(where: { $0.dimension == .network }).map({ !$0.values.isEmpty }) ?? true else { continue }
            let page = try await reports.page(ours)
            guard page.nextCursor == nil else { throw Self.tooLarge() }
            for reported in page.rows {
                let key = reported.dimensions
                // Kept where covered, and in the zone that app's network is compared in.
                guard let app = key[appAt], let network = key[networkAt], let day = key[dateAt],
                      covered[Covered(app: app, network: network, day: day)]?.zone == zone else {
                    uncovered += 1
                    continue
                }
                var row = rows[key] ?? ReconciliationRow(dimensions: key)
                row.ours.add(ReconciliationSide(impressions: reported.counts.impressions, clicks: reported.counts.taps, revenueMicros: reported.counts.revenueMicros))
                rows[key] = row
            }
        }
        if uncovered > 0 {
            remarks.append("AdTally's counts are compared only for the apps, networks and days a network's imported report covers; \(uncovered) groups of them lie outside those")
        }

        // Down to the asked dimensions: a covered day the network wrote no line for is a zero.
        var merged: [[String?]: ReconciliationRow] = [:]
        var order: [[String?]] = []
        for (key, row) in rows {
            let app = key[appAt]!, network = key[networkAt]!, day = key[dateAt]!
            let cover = covered[Covered(app: app, network: network, day: day)]!
            let asked = Array(key.prefix(report.dimensions.count))
            var into = merged[asked] ?? {
                order.append(asked)
                var fresh = ReconciliationRow(dimensions: asked)
                fresh.tolerancePct = .infinity
                return fresh
            }()
            into.ours.add(row.ours)
            var theirs = into.theirs ?? ReconciliationSide()
            // A covered day without a line is a zero (no clicks where the source reports none).
            theirs.add(row.theirs ?? ReconciliationSide(impressions: 0, clicks: cover.source == NetworkReportSource.max.rawValue ? nil : 0, revenueMicros: 0))
            into.theirs = theirs
            into.networks.insert(network)
            into.tolerancePct = min(into.tolerancePct, setting(network).tolerancePct)
            into.isFinal = into.isFinal && !cover.isDelayed && cover.margin >= setting(network).finalAfterDays
            into.imports.insert(cover.importID)
            merged[asked] = into
        }
        guard merged.count <= Self.maxRows else { throw Self.tooLarge() }
        var result = order.map { merged[$0]! }
        for index in result.indices where !result[index].tolerancePct.isFinite { result[index].tolerancePct = ReconciliationRow.defaultTolerancePct }
        result.sort { Self.precedes($0.dimensions, $1.dimensions) }

        let used = Set(result.flatMap(\.imports))
        let imports = try await primary.query("""
            SELECT import_id, source, zone, to_char(imported_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), to_json(warnings)::text
            FROM network_imports WHERE import_id = ANY(\(array: used.sorted())) ORDER BY import_id
            """).map { row in
            (id: try row.decode(0, as: Int64.self), source: try row.decode(1, as: String.self), zone: try row.decode(2, as: String.self),
             importedAt: try row.decode(3, as: String.self), warnings: try NetworkReportStore.strings(row.decode(4)))
        }
        let networks = zonesOf.keys.sorted().map { name in
            (name: name, zone: zonesOf[name]!.sorted().joined(separator: ", "), tolerancePct: setting(name).tolerancePct, finalAfterDays: setting(name).finalAfterDays)
        }
        return ReconciliationDocument(query: query, rows: result, networks: networks, imports: imports, remarks: remarks)
    }

    struct Pair: Hashable { var app, network: String }

    /// Each app's network is compared with the source and zone of its newest import
    /// covering the range (an AdMob account whose zone changed, or AdMob's own report
    /// beside MAX's view of AdMob, are not mixed): that choice, and the import current
    /// for each covered day in it.
    static func choose(_ coverage: [Covered: [Coverage]]) -> (chosen: [Pair: Coverage], covered: [Covered: Coverage]) {
        var chosen: [Pair: Coverage] = [:]
        for (key, options) in coverage {
            let pair = Pair(app: key.app, network: key.network)
            for option in options where option.importID > chosen[pair]?.importID ?? 0 { chosen[pair] = option }
        }
        var covered: [Covered: Coverage] = [:]
        for (key, options) in coverage {
            let pick = chosen[Pair(app: key.app, network: key.network)]!
            if let option = options.first(where: { $0.source == pick.source && $0.zone == pick.zone }) { covered[key] = option }
        }
        return (chosen, covered)
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
        ReportQueryError("dimensions", "the reconciliation has more than \(maxRows) rows by app, network and day; narrow the range, the apps or the dimensions", kind: .tooLarge)
    }

    /// The networks' filters as SQL conditions on `r` (a network_report_rows row).
    static func filters(_ report: ReportQuery) -> (networks: [String]?, formats: [String]?, countries: [String]?, dates: [String]?, apps: [String]) {
        func filter(_ dimension: ReportDimension) -> [String]? { report.filters.first { $0.dimension == dimension }?.values }
        return (filter(.network), filter(.format), filter(.country), filter(.date), filter(.app) ?? report.apps)
    }

    /// Which import is current for each app, network, day and source in the range: the
    /// newest of that source that covers the day (has a line for it, or states a range
    /// that holds it and has lines for the app and network: AdMob writes no line for a
    /// day without figures).
    static func coverage(_ report: ReportQuery, on pool: PostgresPool) async throws -> [Covered: [Coverage]] {
        try decodeCoverage(try await pool.query(coverageSQL(report)))
    }

    /// `coverage`'s statement (also run in a report's own transaction: `RevenueOfRecord`).
    static func coverageSQL(_ report: ReportQuery) -> PostgresQuery {
        let (networks, _, _, dates, apps) = filters(report)
        let (from, to) = (ReportQuery.formatDate(report.from), ReportQuery.formatDate(report.to))
        return """
            WITH ranged AS (
                -- Files that state their range (AdMob's) cover every day of it for the apps and networks they have.
                SELECT DISTINCT r.import_id, r.app_id, r.network FROM network_report_rows r
                WHERE r.app_id = ANY(\(array: apps)) AND (\(networks == nil) OR r.network = ANY(\(array: networks ?? [])))
                  AND r.import_id IN (SELECT import_id FROM network_imports WHERE has_range AND first_day <= \(to)::date AND last_day >= \(from)::date)
            ), days AS (
                SELECT p.import_id, p.app_id, p.network, d.day::date AS day
                FROM ranged p JOIN network_imports i ON i.import_id = p.import_id
                CROSS JOIN LATERAL generate_series(greatest(i.first_day, \(from)::date), least(i.last_day, \(to)::date), interval '1 day') AS d (day)
                UNION
                -- Every file covers the days it has lines for.
                SELECT r.import_id, r.app_id, r.network, r.day FROM network_report_rows r
                WHERE r.app_id = ANY(\(array: apps)) AND r.day BETWEEN \(from)::date AND \(to)::date
                  AND (\(networks == nil) OR r.network = ANY(\(array: networks ?? [])))
            )
            SELECT DISTINCT ON (c.app_id, c.network, c.day, i.source)
                   c.app_id, c.network, c.day::text, i.source, i.zone, c.import_id,
                   ((i.imported_at AT TIME ZONE i.zone)::date - c.day)::int, i.is_delayed
            FROM days c JOIN network_imports i ON i.import_id = c.import_id
            WHERE \(dates == nil) OR c.day::text = ANY(\(array: dates ?? []))
            ORDER BY c.app_id, c.network, c.day, i.source, c.import_id DESC
            LIMIT \(maxRows + 1)
            """
    }

    /// `coverage`'s rows, decoded.
    static func decodeCoverage(_ rows: PostgresRows) throws -> [Covered: [Coverage]] {
        guard rows.count <= maxRows else { throw tooLarge() }
        var coverage: [Covered: [Coverage]] = [:]
        for row in rows {
            let key = Covered(app: try row.decode(0), network: try row.decode(1), day: try row.decode(2))
            coverage[key, default: []].append(
                Coverage(source: try row.decode(3), zone: try row.decode(4), importID: try row.decode(5), margin: try row.decode(6), isDelayed: try row.decode(7))
            )
        }
        return coverage
    }

    /// The network side at the internal grain (the asked dimensions, date, app and
    /// network): the current import's figures per app, network, day and source,
    /// revenue converted on the network's date.
    static func theirs(_ report: ReportQuery, grain: [ReportDimension], on pool: PostgresPool) async throws -> [TheirGroup] {
        let sql = try theirsSQL(report, grain: grain)
        return try decodeTheirs(try await pool.query(sql), width: grain.count, currency: report.currency)
    }

    /// `theirs`' statement (also run in a report's own transaction: `RevenueOfRecord`).
    static func theirsSQL(_ report: ReportQuery, grain: [ReportDimension]) throws -> PostgresQuery {
        let rc = report.currency
        var keys: [String] = []
        for dimension in grain {
            switch dimension {
            case .date: keys.append("r.day::text")
            case .app: keys.append("r.app_id")
            case .network: keys.append("r.network")
            case .format: keys.append("r.format")
            case .country: keys.append("r.country")
            default: throw ReportQueryError("dimensions", "\(dimension.rawValue) is not a dimension both sides have")
            }
        }
        let keyList = keys.enumerated().map { "\($0.element) AS k\($0.offset), " }.joined()
        let groupKeys = (keys.indices.map { "k\($0)" } + ["r.import_id"]).joined(separator: ", ")
        let (networks, formats, countries, dates, apps) = filters(report)
        let (from, to) = (ReportQuery.formatDate(report.from), ReportQuery.formatDate(report.to))
        return """
            WITH cur AS (
                SELECT DISTINCT ON (r.app_id, r.network, r.day, i.source) r.app_id, r.network, r.day, r.import_id
                FROM network_report_rows r JOIN network_imports i ON i.import_id = r.import_id
                WHERE r.app_id = ANY(\(array: apps)) AND r.day BETWEEN \(from)::date AND \(to)::date
                  AND (\(networks == nil) OR r.network = ANY(\(array: networks ?? [])))
                ORDER BY r.app_id, r.network, r.day, i.source, r.import_id DESC
            )
            SELECT \(unsafeRaw: keyList)r.import_id,
                   sum(r.impressions)::bigint, coalesce(sum(r.clicks), 0)::bigint, bool_and(r.clicks IS NOT NULL),
                   coalesce(sum(CASE WHEN r.currency = \(rc) THEN r.revenue_micros ELSE adtally_div_half_even(r.revenue_micros * fx.to_rate, fx.from_rate) END), 0)::text,
                   min(CASE WHEN r.currency <> \(rc) AND fx.to_rate IS NULL AND r.revenue_micros <> 0
                            THEN r.day::text || ' ' || r.currency || ' '
                                 || CASE WHEN NOT EXISTS (SELECT 1 FROM fx_rates x WHERE x.day = r.day) THEN '*'
                                         WHEN EXISTS (SELECT 1 FROM fx_rates x WHERE x.day = r.day AND x.currency = \(rc)) THEN r.currency ELSE \(rc) END END)
            FROM network_report_rows r
            JOIN cur c ON c.app_id = r.app_id AND c.network = r.network AND c.day = r.day AND c.import_id = r.import_id
            LEFT JOIN LATERAL (
                -- Units of the query currency and of the row's per one base, on the network's date.
                SELECT t.rate AS to_rate, f.rate AS from_rate
                FROM fx_rates t JOIN fx_rates f ON f.day = t.day AND f.base = t.base AND f.currency = r.currency
                WHERE r.currency <> \(rc) AND t.day = r.day AND t.currency = \(rc)
                ORDER BY t.base LIMIT 1
            ) AS fx ON true
            WHERE (\(formats == nil) OR r.format = ANY(\(array: formats ?? [])))
              AND (\(countries == nil) OR r.country = ANY(\(array: countries ?? [])))
              AND (\(dates == nil) OR r.day::text = ANY(\(array: dates ?? [])))
            GROUP BY \(unsafeRaw: groupKeys)
            LIMIT \(maxRows + 1)
            """
    }

    /// `theirs`' rows (`width` key columns), decoded; a missing FX rate is a 422.
    static func decodeTheirs(_ rows: PostgresRows, width: Int, currency rc: String) throws -> [TheirGroup] {
        guard rows.count <= maxRows else { throw tooLarge() }
        return try rows.map { row in
            if let missing = try row.decode(width + 5, as: String?.self) { throw ReportCurrencyError(missing: missing, reportCurrency: rc) }
            let hasClicks = try row.decode(width + 3, as: Bool.self)
            return TheirGroup(
                key: try (0..<width).map { try row.decode($0, as: String?.self) }, importID: try row.decode(width),
                side: ReconciliationSide(
                    impressions: try row.decode(width + 1), clicks: hasClicks ? try row.decode(width + 2, as: Int64.self) : nil,
                    revenueMicros: Int128(try row.decode(width + 4, as: String.self)) ?? 0
                )
            )
        }
    }
}
