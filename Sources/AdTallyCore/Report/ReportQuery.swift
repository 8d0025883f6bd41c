import Foundation
import Synchronization
import TextFormats

/// A report parameter that is malformed, unknown or not allowed: a 400 (or 403)
/// that names the parameter and says what is allowed.
public struct ReportQueryError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Why the query cannot run.
    public enum Kind: Sendable, Equatable {
        /// Malformed or unknown: 400.
        case invalid
        /// Data the key may not read: 403.
        case forbidden
        /// Well formed, but more than the server holds for it (a comparison of too many rows): 422.
        case tooLarge
    }

    /// The parameter, as the API names it.
    public var parameter: String
    /// What is wrong and what is allowed.
    public var message: String
    /// 400, 403 or 422.
    public var kind: Kind

    /// An error about one parameter.
    public init(_ parameter: String, _ message: String, kind: Kind = .invalid) {
        self.parameter = parameter
        self.message = message
        self.kind = kind
    }

    public var description: String { "\(parameter): \(message)" }
}

/// What a report compares its period with.
public enum ReportComparison: String, Sendable {
    /// The same number of days just before `from`.
    case previousPeriod = "previous_period"
    /// The same dates one year earlier.
    case yearOverYear = "year_over_year"
}

/// The output format.
public enum ReportFormat: String, Sendable {
    case json, csv
}

/// A sort key: a dimension or metric of the query, ascending or descending.
public struct ReportSortKey: Sendable, Equatable {
    /// A dimension or a metric.
    public enum Field: Sendable, Equatable {
        case dimension(ReportDimension)
        case metric(ReportMetric)

        var name: String {
            switch self {
            case .dimension(let dimension): dimension.rawValue
            case .metric(let metric): metric.rawValue
            }
        }
    }

    /// What is sorted on.
    public var field: Field
    /// Largest first.
    public var isDescending: Bool
}

/// Whose revenue a report shows (DESIGN §11).
public enum ReportRevenueSource: String, Sendable {
    /// Each network's policy: its final earnings for its final days where the policy is `network_when_final`.
    case ofRecord = "of_record"
    /// The SDKs' reported amounts and the rate card's estimates, whatever the policy.
    case sdk
}

/// An app as a report needs it: what its data is, in which zone and currency.
public struct ReportApp: Sendable, Equatable {
    /// The app id.
    public var id: String
    /// Its IANA zone.
    public var timezone: String
    /// Its currency.
    public var currency: String

    /// An app's report settings.
    public init(id: String, timezone: String, currency: String) {
        self.id = id
        self.timezone = timezone
        self.currency = currency
    }
}

/// A report query as understood: parsed and validated once, every default filled
/// in. The API, the CLI and (later) exports and the dashboard all build one of these
/// with `ReportQuery.parse` and hand it to the report engine.
public struct ReportQuery: Sendable {
    /// The apps, sorted.
    public var apps: [String]
    /// First day, inclusive, in `timezone` (days since 1970-01-01).
    public var from: Int
    /// Last day, inclusive.
    public var to: Int
    /// IANA zone the days, hours, weeks and months are in.
    public var timezone: String
    /// Why that zone (a note for the reader).
    public var timezoneReason: String
    /// Grouping, in the order asked.
    public var dimensions: [ReportDimension]
    /// Columns, in the order asked.
    public var metrics: [ReportMetric]
    /// A cohort report's columns (DESIGN §13), in the order asked; then `metrics` is empty.
    public var cohortMetrics: [CohortMetric] = []
    /// Only rows whose dimension value is one of these, by dimension (sorted by name).
    public var filters: [(dimension: ReportDimension, values: [String])]
    /// Money is shown in this currency.
    public var currency: String
    /// Order of the rows; the dimensions not named follow, ascending, so the order is total.
    public var sort: [ReportSortKey]
    /// Rows per page; nil: every row (CSV without a limit).
    public var limit: Int?
    /// The sort key values of the last row already returned (from the cursor), one per
    /// `sort` key, as PostgreSQL writes them (nil: NULL); the page starts after it.
    public var after: [String?]?
    /// The period compared with, if any.
    public var comparison: ReportComparison?
    /// JSON or CSV.
    public var format: ReportFormat
    /// Every app of the report keeps its daily rollups in `timezone` (its own zone).
    public var isInAppsOwnZone: Bool
    /// Whose revenue the report shows (DESIGN §11): `of_record` follows each network's
    /// policy (its final earnings where it is `network_when_final`); `sdk` always the
    /// SDKs' reported and the rate card's estimated amounts (what a reconciliation compares).
    public var revenueSource: ReportRevenueSource = .ofRecord

    /// JSON's default page size and the largest page.
    public static let defaultLimit = 1000, maxLimit = 100_000
    /// Longest range, in days (ten years and a bit).
    public static let maxDays = 3700
    /// Most values in one filter.
    public static let maxFilterValues = 1000

    /// The parameters a report takes besides the dimension filters.
    public static let parameterNames = ["apps", "from", "to", "days", "tz", "dimensions", "metrics", "currency", "sort", "limit", "cursor", "compare", "format", "revenue_source"]

    /// Every dimension whose values are needed: grouped on or filtered by.
    public var usedDimensions: Set<ReportDimension> { Set(dimensions).union(filters.map(\.dimension)) }

    /// Whether the rollups answer it exactly (else raw events are read).
    public var isServedByRollups: Bool {
        usedDimensions.allSatisfy(\.isInRollups) && !metrics.contains { $0.counts.contains(.preciseMicros) }
    }

    /// Number of days in the range.
    public var dayCount: Int { to - from + 1 }

    /// Whether it is a cohort report (DESIGN §13): cohort metrics over installs, whose
    /// range (`from`, `to`) chooses the cohorts.
    public var isCohortReport: Bool { !cohortMetrics.isEmpty }

    /// The same query for the period it is compared with (nil without `compare`),
    /// and the number of days its dates are shifted forward to line up with this one.
    public var comparedQuery: (query: ReportQuery, shiftDays: Int, shiftMonths: Int)? {
        guard let comparison else { return nil }
        var earlier = self
        earlier.comparison = nil
        earlier.limit = nil
        earlier.after = nil
        switch comparison {
        case .previousPeriod:
            earlier.from = from - dayCount
            earlier.to = to - dayCount
            return (earlier, dayCount, max(1, Int((Double(dayCount) / 30.436875).rounded())))
        case .yearOverYear:
            earlier.from = Self.shiftYears(from, by: -1)
            earlier.to = Self.shiftYears(to, by: -1)
            return (earlier, 0, 12)
        }
    }

    /// The same month and day `years` later (29 February becomes the 28th in other years).
    public static func shiftYears(_ day: Int, by years: Int) -> Int {
        let date = CivilTime.date(days: day)
        let year = date.year + years
        let isLeap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
        let dayOfMonth = date.month == 2 && date.day == 29 && !isLeap ? 28 : date.day
        return CivilTime.days(year: year, month: date.month, day: dayOfMonth)
    }

    // MARK: - Parsing

    /// Parses report parameters (API query string or CLI options under the same names).
    ///
    /// - Parameters:
    ///   - parameters: name and value pairs; a name given twice has its values joined with commas.
    ///   - readable: the apps the caller may read, with their zones and currencies.
    ///   - isAdmin: whether the caller may read every app (then asking for an unknown one is a 400, not a 403).
    ///   - acceptsCSV: the request's `Accept` asks for CSV (used when `format` is absent).
    ///   - output: the output format chosen apart from the parameters (the CLI's `--format`);
    ///     then a `format` parameter can only be the ad-format filter.
    ///   - now: the current time, for default dates and `days`.
    public static func parse(
        _ parameters: [(String, String)], readable: [ReportApp], isAdmin: Bool, acceptsCSV: Bool = false, output: ReportFormat? = nil, now: Date = Date()
    ) throws(ReportQueryError) -> ReportQuery {
        var values: [String: String] = [:]
        var order: [String] = []
        for (name, value) in parameters {
            if let existing = values[name] {
                values[name] = existing + "," + value
            } else {
                values[name] = value
                order.append(name)
            }
        }
        // `format` names both the output (json, csv) and a dimension (banner, …): the
        // values tell them apart, as the two sets share no word.
        var outputFormat = output?.rawValue
        if output == nil, let text = values["format"], ReportFormat(rawValue: text) != nil {
            outputFormat = text
            values["format"] = nil
        } else if let text = values["format"], text.split(separator: ",").contains(where: { ReportFormat(rawValue: String($0)) != nil }) {
            throw ReportQueryError("format", "either the output format (json or csv) or a filter on the ad format (\(AdFormat.allCases.map(\.rawValue).joined(separator: ", "))), not both")
        }
        for name in order where !parameterNames.contains(name) && ReportDimension(rawValue: name) == nil {
            throw ReportQueryError(name, "unknown parameter; allowed: \(parameterNames.joined(separator: ", ")) and a filter on a dimension (\(ReportDimension.allCases.map(\.rawValue).joined(separator: ", ")))")
        }

        // Apps.
        let readableByID = Dictionary(readable.map { ($0.id, $0) }, uniquingKeysWith: { first, _ in first })
        var apps: [ReportApp]
        if let text = values["apps"] {
            let ids = try list(text, "apps")
            apps = []
            for id in Set(ids).sorted() {
                guard let app = readableByID[id] else {
                    if isAdmin { throw ReportQueryError("apps", "no app \"\(id)\"") }
                    throw ReportQueryError("apps", "this key may not read app \"\(id)\"", kind: .forbidden)
                }
                apps.append(app)
            }
        } else {
            apps = readable.sorted { $0.id < $1.id }
            if apps.isEmpty { throw ReportQueryError("apps", "there is no app to report on yet") }
        }

        // Zone: given, or the apps' own, or UTC when they differ.
        let timezone: String
        let timezoneReason: String
        if let text = values["tz"] {
            guard isZone(text) else {
                throw ReportQueryError("tz", "\"\(text)\" is not an IANA time zone (e.g. UTC, America/New_York, Asia/Kolkata)")
            }
            timezone = text
            timezoneReason = "as asked"
        } else if Set(apps.map(\.timezone)).count == 1, let zone = apps.first?.timezone {
            timezone = zone
            timezoneReason = apps.count == 1 ? "the app's own zone" : "the apps' own zone"
        } else {
            timezone = "UTC"
            timezoneReason = "the apps are in different zones, so UTC"
        }

        // Range: from/to, or days (the N whole days before today), default the 7 days before today.
        let today = try Self.today(in: timezone, now: now)
        var from = today - 7, to = today - 1
        if let text = values["days"] {
            guard values["from"] == nil, values["to"] == nil else { throw ReportQueryError("days", "give either days or from/to, not both") }
            guard let days = Int(text), (1...maxDays).contains(days) else { throw ReportQueryError("days", "must be a whole number of days from 1 to \(maxDays)") }
            from = today - days
            to = today - 1
        }
        if let text = values["from"] {
            guard let day = parseDate(text) else { throw ReportQueryError("from", "must be a date YYYY-MM-DD, from 1900 on") }
            from = day
            if values["to"] == nil { to = max(to, from) }
        }
        if let text = values["to"] {
            guard let day = parseDate(text) else { throw ReportQueryError("to", "must be a date YYYY-MM-DD, from 1900 on") }
            to = day
            if values["from"] == nil { from = min(from, to) }
        }
        guard from <= to else { throw ReportQueryError("to", "must not be before from (\(formatDate(from)))") }
        guard to - from < maxDays else { throw ReportQueryError("from", "the range may span at most \(maxDays) days") }

        // Dimensions and metrics.
        var dimensions: [ReportDimension] = []
        if let text = values["dimensions"], !text.isEmpty {
            for name in try list(text, "dimensions") {
                guard let dimension = ReportDimension(rawValue: name) else {
                    throw ReportQueryError("dimensions", "unknown dimension \"\(name)\"; allowed: \(ReportDimension.allCases.map(\.rawValue).joined(separator: ", "))")
                }
                guard !dimensions.contains(dimension) else { throw ReportQueryError("dimensions", "\"\(name)\" is given twice") }
                dimensions.append(dimension)
            }
        }
        var metrics: [ReportMetric] = []
        var cohortMetrics: [CohortMetric] = []
        if let text = values["metrics"] {
            for name in try list(text, "metrics") {
                if let metric = ReportMetric(rawValue: name) {
                    guard !metrics.contains(metric) else { throw ReportQueryError("metrics", "\"\(name)\" is given twice") }
                    metrics.append(metric)
                } else if let metric = CohortMetric(name: name) {
                    guard !cohortMetrics.contains(metric) else { throw ReportQueryError("metrics", "\"\(name)\" is given twice") }
                    cohortMetrics.append(metric)
                } else {
                    throw ReportQueryError(
                        "metrics", "unknown metric \"\(name)\"; allowed: \(ReportMetric.allCases.map(\.rawValue).joined(separator: ", ")), and with the cohort dimension \(CohortMetric.namesText)"
                    )
                }
            }
        } else if dimensions.contains(.cohort) {
            cohortMetrics = CohortMetric.defaults
        } else {
            metrics = ReportMetric.defaults
        }
        if !cohortMetrics.isEmpty && !metrics.isEmpty {
            throw ReportQueryError(
                "metrics", "cohort metrics (\(cohortMetrics[0].name)) and event metrics (\(metrics[0].rawValue)) are separate reports: a cohort report counts installs by their first day, an event report events by theirs"
            )
        }
        if dimensions.contains(.cohort) && cohortMetrics.isEmpty {
            throw ReportQueryError("dimensions", "cohort groups cohort metrics only (\(CohortMetric.namesText))")
        }

        // Filters.
        var filters: [(dimension: ReportDimension, values: [String])] = []
        for dimension in ReportDimension.allCases {
            guard let text = values[dimension.rawValue] else { continue }
            let items = try list(text, dimension.rawValue)
            guard items.count <= maxFilterValues else { throw ReportQueryError(dimension.rawValue, "at most \(maxFilterValues) values") }
            for item in items { try checkFilterValue(item, dimension) }
            filters.append((dimension, Array(Set(items)).sorted()))
        }
        if !cohortMetrics.isEmpty {
            try checkCohortReport(dimensions: dimensions, filters: filters, apps: apps, timezone: timezone, tzGiven: values["tz"] != nil, compare: values["compare"])
        } else if let filter = filters.first(where: { $0.dimension == .cohort }) {
            throw ReportQueryError(filter.dimension.rawValue, "cohort filters a cohort report only (metrics \(CohortMetric.namesText))")
        }
        if let appFilter = filters.first(where: { $0.dimension == .app }) {
            for id in appFilter.values where !apps.contains(where: { $0.id == id }) {
                if !isAdmin && readableByID[id] == nil {
                    throw ReportQueryError("app", "this key may not read app \"\(id)\"", kind: .forbidden)
                }
                throw ReportQueryError("app", "app \"\(id)\" is not among the report's apps (\(apps.map(\.id).joined(separator: ",")))")
            }
        }

        // Currency.
        let currency: String
        if let text = values["currency"] {
            guard ISOCodes.isCurrency(text) else { throw ReportQueryError("currency", "\"\(text)\" is not an ISO 4217 currency code (e.g. USD, EUR, JPY)") }
            currency = text
        } else {
            currency = apps.count == 1 ? apps[0].currency : "USD"
        }

        // Sort.
        var sort: [ReportSortKey] = []
        if let text = values["sort"], !text.isEmpty {
            for item in try list(text, "sort") {
                // One sign at most: "--revenue" is a typo, not a sort.
                let isDescending = item.hasPrefix("-")
                let name = String(item.hasPrefix("-") || item.hasPrefix("+") ? item.dropFirst() : item[...])
                let field: ReportSortKey.Field
                if let dimension = ReportDimension(rawValue: name), dimensions.contains(dimension) {
                    field = .dimension(dimension)
                } else if let metric = ReportMetric(rawValue: name), metrics.contains(metric) {
                    field = .metric(metric)
                } else {
                    throw ReportQueryError("sort", "\"\(name)\" is not one of the report's dimensions or metrics (\((dimensions.map(\.rawValue) + metrics.map(\.rawValue)).joined(separator: ", "))); prefix - for descending")
                }
                guard !sort.contains(where: { $0.field == field }) else { throw ReportQueryError("sort", "\"\(name)\" is given twice") }
                sort.append(ReportSortKey(field: field, isDescending: isDescending))
            }
        }
        for dimension in dimensions where !sort.contains(where: { $0.field == .dimension(dimension) }) {
            sort.append(ReportSortKey(field: .dimension(dimension), isDescending: false))
        }

        // Format, limit, compare.
        let format: ReportFormat
        if let text = outputFormat, let value = ReportFormat(rawValue: text) {
            format = value
        } else {
            format = acceptsCSV ? .csv : .json
        }
        var limit: Int? = format == .json ? defaultLimit : nil
        if let text = values["limit"] {
            guard let value = Int(text), (1...maxLimit).contains(value) else { throw ReportQueryError("limit", "must be a whole number from 1 to \(maxLimit)") }
            limit = value
        }
        var comparison: ReportComparison?
        if let text = values["compare"] {
            guard let value = ReportComparison(rawValue: text) else { throw ReportQueryError("compare", "must be previous_period or year_over_year") }
            comparison = value
        }

        if comparison != nil, let metric = metrics.first(where: { [.uniqueDevices, .activeDevices, .adViewers].contains($0) }) {
            // Compared rows are matched in memory by their shifted keys, and two earlier rows can
            // land on one (29 February, a repeated DST hour): counts add up, distinct devices do not
            // (daily values do: dau and the metrics over it compare).
            throw ReportQueryError("compare", "cannot be used with \(metric.rawValue) (distinct devices over two merged periods do not add up; dau and dav compare)")
        }
        let hourly = dimensions.contains(.hour) || filters.contains { $0.dimension == .hour }
        if hourly, let metric = metrics.first(where: \.isDailyAverage) {
            throw ReportQueryError(
                "metrics", "\(metric.rawValue) averages each local day's devices; an hour is not a day: group or filter by date, week or month (active_devices and ad_viewers count an hour's devices)"
            )
        }

        var query = ReportQuery(
            apps: apps.map(\.id), from: from, to: to, timezone: timezone, timezoneReason: timezoneReason,
            dimensions: dimensions, metrics: metrics, filters: filters, currency: currency, sort: sort,
            limit: limit, after: nil, comparison: comparison, format: format,
            isInAppsOwnZone: apps.allSatisfy { $0.timezone == timezone }
        )
        query.cohortMetrics = cohortMetrics
        if let text = values["revenue_source"] {
            guard let value = ReportRevenueSource(rawValue: text) else {
                throw ReportQueryError("revenue_source", "must be of_record (each network's policy: its final earnings where it is network_when_final) or sdk (the SDKs' and the rate card's amounts)")
            }
            query.revenueSource = value
        }
        if let text = values["cursor"] {
            query.after = try ReportCursor.keys(text, for: query)
        }
        return query
    }

    /// What a cohort report may be (DESIGN §13): grouped and filtered by the cohort, the
    /// app and what devices were first seen with; in the apps' own zone, where their
    /// cohorts are kept; never compared (a cohort's days are its own comparison).
    static func checkCohortReport(
        dimensions: [ReportDimension], filters: [(dimension: ReportDimension, values: [String])], apps: [ReportApp], timezone: String, tzGiven: Bool, compare: String?
    ) throws(ReportQueryError) {
        let allowed = ReportDimension.allCases.filter(\.isCohortDimension).map(\.rawValue).joined(separator: ", ")
        if let dimension = dimensions.first(where: { !$0.isCohortDimension }) {
            throw ReportQueryError("dimensions", "a cohort report groups by \(allowed) (of the device's first sight), not \(dimension.rawValue)")
        }
        if let filter = filters.first(where: { !$0.dimension.isCohortDimension }) {
            throw ReportQueryError(filter.dimension.rawValue, "a cohort report filters by \(allowed) (of the device's first sight), not \(filter.dimension.rawValue)")
        }
        let zones = Set(apps.map(\.timezone))
        if zones.count > 1 {
            throw ReportQueryError("apps", "cohorts are read in each app's own zone, and these apps are in \(zones.count) zones (\(zones.sorted().joined(separator: ", "))); ask for the apps of one zone at a time")
        }
        if tzGiven, let zone = zones.first, zone != timezone {
            throw ReportQueryError("tz", "cohorts are read in the app's own zone (\(zone)), where an install's day is kept; leave tz out or give \(zone)")
        }
        if compare != nil {
            throw ReportQueryError("compare", "a cohort report is not compared with another period: its days N are the comparison (retention_d1 … retention_d90)")
        }
    }

    static func list(_ text: String, _ parameter: String) throws(ReportQueryError) -> [String] {
        let items = text.split(separator: ",", omittingEmptySubsequences: false).map { String($0) }
        guard !items.contains(where: \.isEmpty) else { throw ReportQueryError(parameter, "an empty item in a comma-separated list") }
        return items
    }

    static func checkFilterValue(_ value: String, _ dimension: ReportDimension) throws(ReportQueryError) {
        let name = dimension.rawValue
        // A filter value obeys the rule its field has at ingest: any value an event can
        // carry can be asked for, and nothing longer is ever read.
        guard TextRule.placement.allows(value), !value.utf8.contains(0) else {
            throw ReportQueryError(name, "a filter value is \(TextRule.placement.limitText), without NUL")
        }
        switch dimension {
        case .placement:
            guard EventValidator.isPlacement(value) else { throw ReportQueryError(name, "\"\(value)\": a placement " + EventValidator.placementRule.dropFirst(5)) }
        case .osVersion, .appVersion:
            guard EventValidator.isVersion(value) else { throw ReportQueryError(name, "a filter value is \(TextRule.version.limitText)") }
        case .date, .cohort:
            guard parseDate(value) != nil else { throw ReportQueryError(name, "\"\(value)\" is not a date YYYY-MM-DD") }
        case .week:
            // A week is named by its Monday (ISO); 1970-01-01 was a Thursday.
            guard let day = parseDate(value), ((day + 3) % 7 + 7) % 7 == 0 else {
                throw ReportQueryError(name, "\"\(value)\" is not a Monday YYYY-MM-DD (a week is named by its Monday)")
            }
        case .month:
            guard value.count == 7, parseDate(value + "-01") != nil else { throw ReportQueryError(name, "\"\(value)\" is not a month YYYY-MM") }
        case .errorCode:
            guard Int32(value) != nil else { throw ReportQueryError(name, "\"\(value)\" is not an integer") }
        case .format:
            guard AdFormat(rawValue: value) != nil else { throw ReportQueryError(name, "\"\(value)\" is not one of \(AdFormat.allCases.map(\.rawValue).joined(separator: ", "))") }
        case .revenuePrecision:
            guard RevenuePrecision(rawValue: value) != nil else {
                throw ReportQueryError(name, "\"\(value)\" is not one of \(RevenuePrecision.allCases.map(\.rawValue).joined(separator: ", "))")
            }
        case .platform:
            guard Platform(rawValue: value) != nil else { throw ReportQueryError(name, "\"\(value)\" is not one of \(Platform.allCases.map(\.rawValue).joined(separator: ", "))") }
        default:
            break
        }
    }

    /// Whether `name` is a zone the system knows (IANA names and UTC; not abbreviations or offsets).
    public static func isZone(_ name: String) -> Bool {
        guard name.utf8.count <= 64, name == "UTC" || name.contains("/") || TimeZone.knownTimeZoneIdentifiers.contains(name) else { return false }
        return TimeZone(identifier: name) != nil
    }

    /// Today's date (days since 1970) in a zone.
    public static func today(in zone: String, now: Date) throws(ReportQueryError) -> Int {
        guard let timeZone = TimeZone(identifier: zone) else { throw ReportQueryError("tz", "\"\(zone)\" is not an IANA time zone") }
        let local = Int64(now.timeIntervalSince1970.rounded(.down)) + Int64(timeZone.secondsFromGMT(for: now))
        return Int(local >= 0 ? local / 86_400 : (local - 86_399) / 86_400)
    }

    /// Days since the epoch of a `YYYY-MM-DD` date, nil when malformed or impossible.
    public static func parseDate(_ text: String) -> Int? {
        let bytes = Array(text.utf8)
        guard bytes.count == 10, bytes[4] == UInt8(ascii: "-"), bytes[7] == UInt8(ascii: "-") else { return nil }
        func number(_ range: Range<Int>) -> Int? {
            var value = 0
            for byte in bytes[range] {
                guard (0x30...0x39).contains(byte) else { return nil }
                value = value * 10 + Int(byte - 0x30)
            }
            return value
        }
        // From 1900: a compared period (a year or the range's length earlier) stays a date PostgreSQL and this code agree on.
        guard let year = number(0..<4), let month = number(5..<7), let day = number(8..<10), year >= 1900, (1...12).contains(month), day >= 1 else { return nil }
        let days = CivilTime.days(year: year, month: month, day: day)
        guard CivilTime.date(days: days) == (year, month, day) else { return nil }
        return days
    }

    /// `YYYY-MM-DD` of a day number.
    public static func formatDate(_ days: Int) -> String {
        let date = CivilTime.date(days: days)
        func pad(_ value: Int, _ width: Int) -> String {
            let text = String(value)
            return String(repeating: "0", count: max(0, width - text.count)) + text
        }
        return "\(pad(date.year, 4))-\(pad(date.month, 2))-\(pad(date.day, 2))"
    }

    // MARK: - As understood

    /// The query as text that identifies it, without paging or format: what a cursor is bound to.
    public var canonicalText: String {
        // Every value escaped, so that no two queries read as the same text.
        func escaped(_ value: String) -> String {
            var out = ""
            for scalar in value.unicodeScalars {
                if scalar == "%" || scalar == "&" || scalar == "=" || scalar == "," { out += "%" + String(scalar.value, radix: 16) } else { out.unicodeScalars.append(scalar) }
            }
            return out
        }
        var parts = [
            "apps=\(apps.joined(separator: ","))", "from=\(Self.formatDate(from))", "to=\(Self.formatDate(to))", "tz=\(timezone)",
            "dimensions=\(dimensions.map(\.rawValue).joined(separator: ","))", "metrics=\((metrics.map(\.rawValue) + cohortMetrics.map(\.name)).joined(separator: ","))",
            "currency=\(currency)", "sort=\(sortText)", "compare=\(comparison?.rawValue ?? "")",
        ]
        for filter in filters { parts.append("\(filter.dimension.rawValue)=\(filter.values.map(escaped).joined(separator: ","))") }
        if revenueSource != .ofRecord { parts.append("revenue_source=\(revenueSource.rawValue)") }
        return parts.joined(separator: "&")
    }

    /// The sort as the `sort` parameter writes it.
    public var sortText: String {
        sort.map { ($0.isDescending ? "-" : "") + $0.field.name }.joined(separator: ",")
    }
}

/// An opaque cursor: the sort key of the last row returned (keyset paging: the next
/// page is the rows after it in the report's total order, so page N costs what page 1
/// costs, and no row repeats or vanishes because rows before it moved), bound to the
/// query it came from (a cursor used with another query is refused, not silently
/// applied to it) and signed with a key every server of the database shares
/// (`useKey`), so a client cannot mint a cursor for a position it was never given.
public enum ReportCursor {
    private static let key = Mutex<[UInt8]?>(nil)
    /// Until `useKey` is called (a process that never reads the database's key): a
    /// random key of this process, so cursors are still unforgeable, if only here.
    private static let processKey: [UInt8] = (0..<32).map { _ in UInt8.random(in: 0...255) }

    /// Whether the shared key has been given.
    public static var hasKey: Bool { key.withLock { $0 != nil } }

    /// Signs and checks cursors with `secret` from now on (the database's shared secret).
    public static func useKey(_ secret: [UInt8]) {
        key.withLock { $0 = secret }
    }

    /// The longest cursor accepted (a sort key is a few dimension values and metrics).
    static let maxLength = 4096

    /// The cursor that continues `query` after a row whose sort key values are `keys`.
    public static func make(after keys: [String?], for query: ReportQuery) -> String {
        let position = keys.map { value in
            value.map { "v" + Data($0.utf8).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "") } ?? "n"
        }.joined(separator: "~")
        return "c3." + position + "." + signature(position, query)
    }

    /// The sort key values a cursor stands for; a 400 when it is malformed, forged or from another query.
    static func keys(_ cursor: String, for query: ReportQuery) throws(ReportQueryError) -> [String?] {
        let malformed = ReportQueryError("cursor", "not a cursor this server made; use next_cursor from a previous page as it is")
        let parts = cursor.split(separator: ".", omittingEmptySubsequences: false)
        guard cursor.utf8.count <= maxLength, parts.count == 3, parts[0] == "c3" else { throw malformed }
        guard constantTimeEqual(Array(parts[2].utf8), Array(signature(String(parts[1]), query).utf8)) else {
            throw ReportQueryError("cursor", "belongs to another query, or was not made by this service; a cursor continues only the query that returned it")
        }
        var keys: [String?] = []
        for item in parts[1].split(separator: "~", omittingEmptySubsequences: false) {
            if item == "n" { keys.append(nil); continue }
            guard item.first == "v" else { throw malformed }
            var text = item.dropFirst().replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
            text += String(repeating: "=", count: (4 - text.count % 4) % 4)
            guard let data = Data(base64Encoded: text), let value = String(data: data, encoding: .utf8) else { throw malformed }
            keys.append(value)
        }
        guard keys.count == query.sort.count else { throw malformed }
        return keys
    }

    /// HMAC-SHA256 of the position and the query, 128 bits in hex.
    static func signature(_ position: String, _ query: ReportQuery) -> String {
        let secret = key.withLock { $0 } ?? processKey
        let mac = SHA256.hmac(key: secret, message: Array(("report cursor\n" + position + "\n" + query.canonicalText).utf8))
        return SHA256.hex(mac.prefix(16))
    }

    /// Whether two byte strings are equal, in a time that does not depend on where they differ.
    public static func constantTimeEqual(_ given: [UInt8], _ expected: [UInt8]) -> Bool {
        guard given.count == expected.count else { return false }
        var difference: UInt8 = 0
        for index in expected.indices { difference |= given[index] ^ expected[index] }
        return difference == 0
    }
}
