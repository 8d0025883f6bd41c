import Foundation

/// A reconciliation query (DESIGN §11): AdTally's counts beside the networks' own, on
/// the dimensions both sides have, each network's days in its own report's zone.
/// Parsed by the report parser (apps, range, filters, currency and format mean what
/// they mean in a report), with fewer dimensions and no metrics to choose.
public struct ReconciliationQuery: Sendable {
    /// The range, apps, dimensions, filters, currency and output format, as a report of
    /// impressions, taps and revenue; its zone is only where `days` was counted from.
    public var report: ReportQuery
    /// The apps the caller may read, for the per-zone queries.
    let readable: [ReportApp]
    let isAdmin: Bool

    /// What both sides have.
    public static let dimensions: [ReportDimension] = [.date, .app, .network, .format, .country]
    public static let defaultDimensions: [ReportDimension] = [.date, .app, .network, .format]
    /// The parameters it takes (besides `app`, `network`, `format` and `country` filters).
    public static let parameterNames = ["apps", "from", "to", "days", "dimensions", "currency", "format"]

    /// Parses the parameters of `GET /v1/reconciliation` and `adtally reconcile`. Days
    /// (`days`, the default last 7) are counted back from today in UTC.
    public static func parse(
        _ parameters: [(String, String)], readable: [ReportApp], isAdmin: Bool, acceptsCSV: Bool = false, output: ReportFormat? = nil, now: Date = Date()
    ) throws(ReportQueryError) -> ReconciliationQuery {
        var given: [(String, String)] = []
        var sawDimensions = false
        for (name, value) in parameters {
            switch name {
            case "tz":
                throw ReportQueryError("tz", "a reconciliation compares each network's days in its own report's zone (AdMob's America/Los_Angeles, MAX's and LevelPlay's UTC); there is no zone to choose")
            case "metrics", "sort", "cursor", "compare":
                throw ReportQueryError(name, "a reconciliation has fixed columns (ours_*, network_*, *_discrepancy_pct, flagged); \(name) is not one of its parameters")
            case "dimensions":
                sawDimensions = true
                for item in value.split(separator: ",", omittingEmptySubsequences: false) {
                    guard let dimension = ReportDimension(rawValue: String(item)), Self.dimensions.contains(dimension) else {
                        throw ReportQueryError("dimensions", "\"\(item)\" is not a dimension both sides have; allowed: \(Self.dimensions.map(\.rawValue).joined(separator: ", "))")
                    }
                }
            case "app", "network", "format", "country", "date":
                break
            default:
                guard Self.parameterNames.contains(name) else {
                    throw ReportQueryError(name, "unknown parameter; allowed: \(Self.parameterNames.joined(separator: ", ")) and the filters app, network, format, country, date")
                }
            }
            given.append((name, value))
        }
        if !sawDimensions { given.append(("dimensions", Self.defaultDimensions.map(\.rawValue).joined(separator: ","))) }
        given.append(("metrics", "impressions,taps,revenue"))
        given.append(("tz", "UTC"))
        let report = try ReportQuery.parse(given, readable: readable, isAdmin: isAdmin, acceptsCSV: acceptsCSV, output: output, now: now)
        return ReconciliationQuery(report: report, readable: readable, isAdmin: isAdmin)
    }

    /// AdTally's side for the networks whose reports are in `zone`: the same days,
    /// apps, filters and currency in that zone, grouped by `dimensions` (the engine's
    /// internal grain: the query's, then date, app and network), every row.
    public func ours(zone: String, networks: [String], dimensions: [ReportDimension]) throws(ReportQueryError) -> ReportQuery {
        var parameters: [(String, String)] = [
            ("apps", report.apps.joined(separator: ",")), ("from", ReportQuery.formatDate(report.from)), ("to", ReportQuery.formatDate(report.to)),
            ("tz", zone), ("dimensions", dimensions.map(\.rawValue).joined(separator: ",")), ("metrics", "impressions,taps,revenue"),
            ("currency", report.currency), ("limit", String(ReportQuery.maxLimit)),
            // AdTally's own figures, whatever a network's revenue policy: the network's are beside them.
            ("revenue_source", "sdk"),
        ]
        for filter in report.filters where filter.dimension != .network {
            parameters.append((filter.dimension.rawValue, filter.values.joined(separator: ",")))
        }
        let asked = report.filters.first { $0.dimension == .network }.map { Set($0.values) }
        parameters.append(("network", networks.filter { asked?.contains($0) ?? true }.joined(separator: ",")))
        return try ReportQuery.parse(parameters, readable: readable, isAdmin: isAdmin, output: .json)
    }
}

/// Sums of one side of a reconciliation row.
public struct ReconciliationSide: Sendable, Equatable {
    public var impressions: Int64 = 0
    /// Nil where the network's report has no clicks (MAX's).
    public var clicks: Int64? = 0
    /// Micros of the query currency.
    public var revenueMicros: Int128 = 0

    public init(impressions: Int64 = 0, clicks: Int64? = 0, revenueMicros: Int128 = 0) {
        self.impressions = impressions
        self.clicks = clicks
        self.revenueMicros = revenueMicros
    }

    /// Adds another group's sums (clicks stay unknown once one part lacks them).
    public mutating func add(_ other: ReconciliationSide) {
        impressions += other.impressions
        clicks = clicks.flatMap { mine in other.clicks.map { mine + $0 } }
        revenueMicros += other.revenueMicros
    }
}

/// One row of a reconciliation: the dimension values, both sides, and what decides its flag.
public struct ReconciliationRow: Sendable, Equatable {
    /// In the order of the query's dimensions.
    public var dimensions: [String?]
    /// AdTally's counts: impressions, taps, revenue (reported + estimated), from the report engine.
    public var ours = ReconciliationSide()
    /// The network's, from its current imports; nil where it reported nothing for the row.
    public var theirs: ReconciliationSide?
    /// The networks in the row (one unless the query does not group by network).
    public var networks: Set<String> = []
    /// The smallest tolerance of those networks, in percent.
    public var tolerancePct: Double = ReconciliationRow.defaultTolerancePct
    /// Every day of the network's side is final (its restatement window has passed, no delay warning).
    public var isFinal = true
    /// The imports the network's side was read from.
    public var imports: Set<Int64> = []

    /// The IAB's.
    public static let defaultTolerancePct = 10.0

    public init(dimensions: [String?]) { self.dimensions = dimensions }

    /// The discrepancy (DESIGN §11), Xandr's formula: `(1 − ours / theirs) × 100`, in
    /// percent, to 2 decimals; nil when the network counted none (nothing to divide by).
    public static func discrepancyPct(ours: Double, theirs: Double) -> Double? {
        guard theirs != 0 else { return nil }
        return ((1 - ours / theirs) * 100 * 100).rounded() / 100
    }

    public var impressionsPct: Double? {
        theirs.flatMap { Self.discrepancyPct(ours: Double(ours.impressions), theirs: Double($0.impressions)) }
    }
    public var clicksPct: Double? {
        theirs?.clicks.flatMap { Self.discrepancyPct(ours: Double(ours.clicks ?? 0), theirs: Double($0)) }
    }
    public var revenuePct: Double? {
        theirs.flatMap { Self.discrepancyPct(ours: Double(ours.revenueMicros), theirs: Double($0.revenueMicros)) }
    }

    /// Flagged: a discrepancy beyond the tolerance, or impressions the network counted
    /// none of. A row the network has not reported (yet) has nothing to compare: its
    /// network columns are null and it is not final, but it is not flagged.
    public var isFlagged: Bool {
        guard let theirs else { return false }
        if theirs.impressions == 0 && ours.impressions > 0 { return true }
        return [impressionsPct, clicksPct, revenuePct].contains { $0.map { abs($0) > tolerancePct } ?? false }
    }
}

/// A reconciliation's rows and notes, written as JSON or CSV.
public struct ReconciliationDocument: Sendable {
    public var query: ReconciliationQuery
    public var rows: [ReconciliationRow]
    /// Per network: the zone its days are in, its tolerance, its final-after days.
    public var networks: [(name: String, zone: String, tolerancePct: Double, finalAfterDays: Int)]
    /// The imports used: id, source, zone, when, and the network's warnings.
    public var imports: [(id: Int64, source: String, zone: String, importedAt: String, warnings: [String])]
    /// Lines of other notes (a network with imports in two zones, rows left out).
    public var remarks: [String]

    public init(
        query: ReconciliationQuery, rows: [ReconciliationRow], networks: [(name: String, zone: String, tolerancePct: Double, finalAfterDays: Int)],
        imports: [(id: Int64, source: String, zone: String, importedAt: String, warnings: [String])], remarks: [String]
    ) {
        self.query = query
        self.rows = rows
        self.networks = networks
        self.imports = imports
        self.remarks = remarks
    }

    /// The columns after the dimensions, with their types.
    public static let metricColumns: [(name: String, type: String)] = [
        ("ours_impressions", "integer"), ("network_impressions", "integer"), ("impressions_discrepancy_pct", "number"),
        ("ours_clicks", "integer"), ("network_clicks", "integer"), ("clicks_discrepancy_pct", "number"),
        ("ours_revenue", "money"), ("network_revenue", "money"), ("revenue_discrepancy_pct", "number"),
        ("flagged", "boolean"), ("is_final", "boolean"), ("imports", "string"),
    ]

    /// A row's cells, dimensions first (booleans as text "true"/"false" in CSV, JSON booleans in JSON).
    public func cells(_ row: ReconciliationRow) -> [ReportCell] {
        let digits = Money.digits(query.report.currency)
        var cells: [ReportCell] = row.dimensions.map { $0.map(ReportCell.text) ?? .null }
        func integer(_ value: Int64?) -> ReportCell { value.map { .integer(Int128($0)) } ?? .null }
        func pct(_ value: Double?) -> ReportCell { value.map(ReportCell.ratio) ?? .null }
        func money(_ value: Int128?) -> ReportCell { value.map { .money(micros: $0, per: 1, digits: digits) } ?? .null }
        cells += [
            integer(row.ours.impressions), integer(row.theirs?.impressions), pct(row.impressionsPct),
            integer(row.ours.clicks), integer(row.theirs?.clicks), pct(row.clicksPct),
            money(row.ours.revenueMicros), money(row.theirs?.revenueMicros), pct(row.revenuePct),
            .text(row.isFlagged ? "true" : "false"), .text(row.isFinal ? "true" : "false"),
            .text(row.imports.sorted().map(String.init).joined(separator: " ")),
        ]
        return cells
    }

    /// CSV: a header, then a record per row (RFC 4180, CRLF).
    public func csv() -> [UInt8] {
        var out: [UInt8] = []
        ReportText.appendCSVRecord(query.report.dimensions.map { .text($0.rawValue) } + Self.metricColumns.map { .text($0.name) }, to: &out)
        for row in rows { ReportText.appendCSVRecord(cells(row), to: &out) }
        return out
    }

    /// JSON: `query`, `columns`, `rows` (arrays in column order), `notes`.
    public func json() -> [UInt8] {
        var out: [UInt8] = []
        func key(_ name: String) { ReportText.appendJSONKey(name, to: &out) }
        func string(_ text: String) { ReportText.appendJSONString(text, to: &out) }
        func strings(_ items: [String]) { ReportText.appendJSONStrings(items, to: &out) }
        func raw(_ text: String) { out.append(contentsOf: text.utf8) }
        let report = query.report
        raw("{")
        key("query"); raw("{")
        key("apps"); strings(report.apps); raw(",")
        key("from"); string(ReportQuery.formatDate(report.from)); raw(",")
        key("to"); string(ReportQuery.formatDate(report.to)); raw(",")
        key("dimensions"); strings(report.dimensions.map(\.rawValue)); raw(",")
        key("filters"); raw("{")
        for (index, filter) in report.filters.enumerated() {
            if index > 0 { raw(",") }
            key(filter.dimension.rawValue); strings(filter.values)
        }
        raw("},")
        key("currency"); string(report.currency)
        raw("},")
        key("columns"); raw("[")
        let columns = report.dimensions.map { ($0.rawValue, $0.valueType.rawValue) } + Self.metricColumns.map { ($0.name, $0.type) }
        for (index, column) in columns.enumerated() {
            if index > 0 { raw(",") }
            raw("{"); key("name"); string(column.0); raw(","); key("type"); string(column.1); raw("}")
        }
        raw("],")
        key("rows"); raw("[")
        let booleans = Set(Self.metricColumns.indices.filter { Self.metricColumns[$0].type == "boolean" }.map { report.dimensions.count + $0 })
        for (index, row) in rows.enumerated() {
            if index > 0 { raw(",") }
            raw("[")
            for (position, cell) in cells(row).enumerated() {
                if position > 0 { raw(",") }
                if booleans.contains(position), case .text(let text) = cell { raw(text) } else { ReportText.appendJSON(cell, to: &out) }
            }
            raw("]")
        }
        raw("],")
        key("notes"); raw("{")
        key("formula"); string("discrepancy_pct = (1 - ours / network) x 100, to 2 decimals; null where the network counted none"); raw(",")
        key("networks"); raw("[")
        for (index, network) in networks.enumerated() {
            if index > 0 { raw(",") }
            raw("{"); key("network"); string(network.name); raw(",")
            key("timezone"); string(network.zone); raw(",")
            key("tolerance_pct"); raw(ReportText.ratio(network.tolerancePct)); raw(",")
            key("final_after_days"); raw(String(network.finalAfterDays)); raw("}")
        }
        raw("],")
        key("imports"); raw("[")
        for (index, used) in imports.enumerated() {
            if index > 0 { raw(",") }
            raw("{"); key("id"); raw(String(used.id)); raw(",")
            key("source"); string(used.source); raw(",")
            key("timezone"); string(used.zone); raw(",")
            key("imported_at"); string(used.importedAt); raw(",")
            key("warnings"); strings(used.warnings); raw("}")
        }
        raw("],")
        let pending = Set(rows.filter { !$0.isFinal }.compactMap { row in report.dimensions.firstIndex(of: .date).flatMap { row.dimensions[$0] } })
        key("days_not_final"); strings(pending.sorted()); raw(",")
        key("remarks"); strings(remarks)
        raw("}}")
        return out
    }
}
