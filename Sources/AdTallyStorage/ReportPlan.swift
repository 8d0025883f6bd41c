import AdTallyCore
import PostgresKit
import TextFormats

/// The SQL of one report query: which source answers it (see `ReportEngine`) and
/// the statements that read it, built from fragments written here and binds only.
struct ReportPlan {
    enum Source: Equatable {
        /// Daily rollups in the apps' own zone, plus pending deltas.
        case daily
        /// Hourly rollups for whole hours, 15-minute rollups for cut hours, plus pending deltas.
        case hourly
        /// Raw events.
        case raw
    }

    let query: ReportQuery
    let source: Source

    /// Summed columns after the dimensions, in `ReportCount` order.
    static let countNames = ["requests", "loads", "impressions", "errors", "taps", "action_cancels", "expiries", "wasted_fills", "revenue_micros", "unique_devices"]
    static let countColumns = countNames.count
    static let rollupCounts = countNames.prefix(8)

    init(_ query: ReportQuery) {
        self.query = query
        if !query.isServedByRollups {
            source = .raw
        } else if query.isInAppsOwnZone, !query.usedDimensions.contains(.hour) {
            source = .daily
        } else {
            source = .hourly
        }
    }

    var sourceDescription: String {
        switch source {
        case .daily: "rollups: daily rows in the apps' own zone, and pending 15-minute deltas"
        case .hourly: "rollups: hourly rows for whole hours, 15-minute rows for hours a day or hour boundary of the zone cuts, and pending deltas"
        case .raw: "raw events (\(query.usedDimensions.filter { !$0.isInRollups }.map(\.rawValue).sorted().joined(separator: ", ")) \(query.metrics.contains(.uniqueDevices) ? "and unique_devices " : "")are not in the rollups)"
        }
    }

    /// Index of the first window total in `page` rows.
    var totalsColumn: Int { query.dimensions.count + Self.countColumns }

    /// Whether a metric reads revenue (then the revenue rollups are read and currencies checked).
    var needsMoney: Bool { needed.contains(.revenueMicros) }

    // MARK: - Fragments

    /// Start of the range: local midnight of `from` in the session's zone (the report's).
    var t0: PostgresQuery { "\(ReportQuery.formatDate(query.from))::date::timestamptz" }
    /// End of the range (exclusive): local midnight after `to`.
    var t1: PostgresQuery { "(\(ReportQuery.formatDate(query.to))::date + 1)::timestamptz" }

    /// A time dimension's value over the instant `time`, in the session's zone (raw
    /// events: one zone conversion per event).
    static func timeExpression(_ dimension: ReportDimension, _ time: String) -> String {
        switch dimension {
        case .date: "(\(time))::date::text"
        case .week: "date_trunc('week', \(time))::date::text"
        case .month: "to_char(\(time), 'YYYY-MM')"
        case .hour: hourText("date_trunc('hour', \(time))")
        default: preconditionFailure("not a time dimension")
        }
    }

    /// `YYYY-MM-DDTHH:MM:SS±HH:MM` of an instant, in the session's zone.
    static func hourText(_ instant: String) -> String {
        "to_char(\(instant), 'YYYY-MM-DD\"T\"HH24:MI:SSTZH:TZM')"
    }

    /// A time dimension's value from a rollup row's local date `s.d` (no zone
    /// conversion: the parts computed it once per day or hour) or hour text `s.hk`.
    static func rollupTimeExpression(_ dimension: ReportDimension) -> String {
        switch dimension {
        case .date: "s.d::text"
        case .week: "(s.d - (extract(isodow FROM s.d)::int - 1))::text"
        case .month: "to_char(s.d::timestamp, 'YYYY-MM')"
        case .hour: "s.hk"
        default: preconditionFailure("not a time dimension")
        }
    }

    /// A dimension's value in a row of the source (`s` for rollups, `e` for events).
    func expression(_ dimension: ReportDimension) -> String {
        let row = source == .raw ? "e" : "s"
        switch dimension {
        case .date, .week, .month, .hour: return source == .raw ? Self.timeExpression(dimension, "e.occurred_at") : Self.rollupTimeExpression(dimension)
        case .app: return "\(row).app_id"
        case .network: return "\(row).network"
        case .format: return "\(row).format"
        case .country: return "e.country::text"
        case .placement, .size, .platform: return "e.\(dimension.rawValue)"
        case .osVersion: return "e.os_version"
        case .appVersion: return "e.app_version"
        case .errorCode: return "e.error_code"
        }
    }

    /// `AND column = ANY(values)` for each filter on a stored column (`alias.column`):
    /// pushed into every part of the source.
    func columnFilters(_ alias: String) -> PostgresQuery {
        var sql: PostgresQuery = ""
        for filter in query.filters where !filter.dimension.isTime {
            let column = filter.dimension == .app ? "app_id" : filter.dimension.rawValue
            if filter.dimension == .errorCode {
                sql.append(" AND \(unsafeRaw: alias).\(unsafeRaw: column) = ANY(\(array: filter.values.compactMap { Int32($0) })::int[])")
            } else if filter.dimension == .country {
                sql.append(" AND \(unsafeRaw: alias).country::text = ANY(\(array: filter.values)::text[])")
            } else {
                sql.append(" AND \(unsafeRaw: alias).\(unsafeRaw: column) = ANY(\(array: filter.values)::text[])")
            }
        }
        return sql
    }

    /// `AND value = ANY(values)` for each filter on a time dimension.
    func timeFilters() -> PostgresQuery {
        var sql: PostgresQuery = ""
        for filter in query.filters where filter.dimension.isTime {
            sql.append(" AND \(unsafeRaw: expression(filter.dimension)) = ANY(\(array: filter.values)::text[])")
        }
        return sql
    }

    /// Whether rows need their hour text (`hk`).
    var needsHour: Bool { query.usedDimensions.contains(.hour) }

    var apps: PostgresQuery { "\(array: query.apps)::text[]" }

    // MARK: - Sources

    static let zeroCounts = "0, 0, 0, 0, 0, 0, 0, 0"
    static let countList = rollupCounts.joined(separator: ", ")

    /// The rows the rollup sources sum: (app_id, d = local date, hk = local hour text
    /// or NULL, network, format, 8 counts, revenue_micros, currency).
    func rollupParts() -> PostgresQuery {
        var parts: [PostgresQuery] = []
        let money = needsMoney
        // Per-row zone conversions only for the few rows of cut hours and pending deltas.
        let rowHour = needsHour ? Self.hourText("date_trunc('hour', r.bucket)") : "NULL::text"
        switch source {
        case .daily:
            let days: PostgresQuery = "day BETWEEN \(ReportQuery.formatDate(query.from))::date AND \(ReportQuery.formatDate(query.to))::date"
            parts.append("""
                SELECT r.app_id, r.day, NULL::text, r.network, r.format, \(unsafeRaw: Self.countList), 0::numeric, NULL::text
                FROM rollup_day_compacted r WHERE r.app_id = ANY(\(apps)) AND r.\(days)\(columnFilters("r"))
                """)
            if money {
                parts.append("""
                    SELECT r.app_id, r.day, NULL::text, r.network, r.format, \(unsafeRaw: Self.zeroCounts), r.revenue_micros, r.currency
                    FROM rollup_revenue_day_compacted r WHERE r.app_id = ANY(\(apps)) AND r.\(days)\(columnFilters("r"))
                    """)
            }
        case .hourly:
            parts.append("""
                SELECT r.app_id, hours.d, hours.hk, r.network, r.format, \(unsafeRaw: Self.countList), 0::numeric, NULL::text
                FROM rollup_1h_compacted r JOIN hours ON hours.h = r.hour AND hours.whole
                WHERE r.app_id = ANY(\(apps)) AND r.hour >= \(t0) AND r.hour < \(t1)\(columnFilters("r"))
                """)
            parts.append("""
                SELECT r.app_id, r.bucket::date, \(unsafeRaw: rowHour), r.network, r.format, \(unsafeRaw: Self.countList), 0::numeric, NULL::text
                FROM rollup_15m_compacted r
                WHERE r.app_id = ANY(\(apps)) AND r.bucket = ANY((SELECT buckets FROM cut)::timestamptz[]) AND r.bucket >= \(t0) AND r.bucket < \(t1)\(columnFilters("r"))
                """)
            if money {
                parts.append("""
                    SELECT r.app_id, hours.d, hours.hk, r.network, r.format, \(unsafeRaw: Self.zeroCounts), r.revenue_micros, r.currency
                    FROM rollup_revenue_1h_compacted r JOIN hours ON hours.h = r.hour AND hours.whole
                    WHERE r.app_id = ANY(\(apps)) AND r.hour >= \(t0) AND r.hour < \(t1)\(columnFilters("r"))
                    """)
                parts.append("""
                    SELECT r.app_id, r.bucket::date, \(unsafeRaw: rowHour), r.network, r.format, \(unsafeRaw: Self.zeroCounts), r.revenue_micros, r.currency
                    FROM rollup_revenue_15m_compacted r
                    WHERE r.app_id = ANY(\(apps)) AND r.bucket = ANY((SELECT buckets FROM cut)::timestamptz[]) AND r.currency <> ''
                      AND r.bucket >= \(t0) AND r.bucket < \(t1)\(columnFilters("r"))
                    """)
            }
        case .raw:
            preconditionFailure("raw events are not rollup parts")
        }
        // Deltas not yet compacted: every committed event is counted at once.
        parts.append("""
            SELECT r.app_id, r.bucket::date, \(unsafeRaw: rowHour), r.network, r.format, \(unsafeRaw: Self.countList), r.revenue_micros::numeric, r.currency
            FROM rollup_delta r WHERE r.app_id = ANY(\(apps)) AND r.bucket >= \(t0) AND r.bucket < \(t1)\(columnFilters("r"))
            """)
        var sql: PostgresQuery = ""
        for (index, part) in parts.enumerated() {
            if index > 0 { sql.append("\nUNION ALL\n") }
            sql.append(part)
        }
        return sql
    }

    /// The UTC hours of the range, and whether each lies wholly inside it and inside
    /// one group of the finest time dimension used (then its hourly row is exact).
    func hoursCTE() -> PostgresQuery {
        let used = query.usedDimensions
        // Weeks and months do not nest (a month can end mid-week): any of date, week or
        // month makes every local midnight a boundary; an hour, every local hour.
        let finest: ReportDimension? = used.contains(.hour) ? .hour : used.contains(where: { $0 == .date || $0 == .week || $0 == .month }) ? .date : nil
        let sameGroup: String
        switch finest {
        case .hour?: sameGroup = "date_trunc('hour', h) = date_trunc('hour', h + interval '45 minutes')"
        case .date?: sameGroup = "h::date = (h + interval '45 minutes')::date"
        case .week?: sameGroup = "date_trunc('week', h) = date_trunc('week', h + interval '45 minutes')"
        case .month?: sameGroup = "date_trunc('month', h) = date_trunc('month', h + interval '45 minutes')"
        default: sameGroup = "true"
        }
        return """
            hours AS MATERIALIZED (
                SELECT h, (h >= \(t0) AND h + interval '1 hour' <= \(t1) AND \(unsafeRaw: sameGroup)) AS whole,
                       h::date AS d, \(unsafeRaw: needsHour ? Self.hourText("date_trunc('hour', h)") : "NULL::text") AS hk
                FROM generate_series(date_trunc('hour', \(t0), 'UTC'), \(t1) - interval '15 minutes', interval '1 hour') AS h
            ), cut AS (
                -- The quarter hours of the cut hours, as one array: an index lookup each, and
                -- an estimate the planner gets right (a join on ranges made it expect millions).
                SELECT coalesce(array_agg(b), '{}') AS buckets
                FROM hours, generate_series(hours.h, hours.h + interval '45 minutes', interval '15 minutes') AS b WHERE NOT hours.whole
            )
            """
    }

    /// The revenue sum when a metric reads it, else 0.
    func revenueSum(_ sum: PostgresQuery) -> PostgresQuery {
        needsMoney ? sum : "0::numeric"
    }

    /// The counts the query's metrics read.
    var needed: Set<ReportCount> { Set(query.metrics.flatMap(\.counts)) }

    /// The raw events' counts, as the rollups define them; 0 for counts no metric reads.
    var rawCounts: String {
        let definitions: [(ReportCount, String)] = [
            (.requests, "count(*) FILTER (WHERE e.type = 'request')"), (.loads, "count(*) FILTER (WHERE e.type = 'load')"),
            (.impressions, "count(*) FILTER (WHERE e.type = 'impression')"), (.errors, "count(*) FILTER (WHERE e.type = 'error')"),
            (.taps, "count(*) FILTER (WHERE e.type = 'tap')"), (.actionCancels, "count(*) FILTER (WHERE e.type = 'action_cancel')"),
            (.expiries, "count(*) FILTER (WHERE e.type = 'expiry')"), (.wastedFills, "count(*) FILTER (WHERE e.type = 'expiry' AND e.shown = false)"),
        ]
        return definitions.map { count, sql in
            (needed.contains(count) ? sql : "0::bigint") + " AS " + Self.countNames[count.rawValue]
        }.joined(separator: ", ")
    }

    /// One row per group (all rows as one group when `dimensions` is empty): the
    /// dimension values `d0…`, then the sums in `countNames` order.
    func grouped(dimensions: [ReportDimension]? = nil) -> PostgresQuery {
        let dimensions = dimensions ?? query.dimensions
        var select = ""
        for (index, dimension) in dimensions.enumerated() {
            // Text in byte order ("C"), the order rows are sorted in: then a grouping done by
            // sorting already yields the report's order, and no second sort is needed.
            select += dimension == .errorCode ? "\(expression(dimension)) AS d\(index), " : "(\(expression(dimension))) COLLATE \"C\" AS d\(index), "
        }
        var sql: PostgresQuery
        if source == .raw {
            sql = """
                SELECT \(unsafeRaw: select)\(unsafeRaw: rawCounts),
                    \(revenueSum("coalesce(sum(e.revenue_micros::numeric) FILTER (WHERE e.type IN ('impression', 'tap') AND e.currency::text = \(query.currency)), 0)")) AS revenue_micros,
                    \(unsafeRaw: query.metrics.contains(.uniqueDevices) ? "count(DISTINCT e.device)" : "0::bigint") AS unique_devices
                FROM events e
                WHERE e.app_id = ANY(\(apps)) AND e.occurred_at >= \(t0) AND e.occurred_at < \(t1)\(columnFilters("e"))\(timeFilters())
                """
        } else {
            // Only the counts the metrics read are summed (the others are 0): less state per
            // group, which a million-group export feels.
            let sums = Self.rollupCounts.enumerated().map { index, name in
                needed.contains(ReportCount(rawValue: index)!) ? "coalesce(sum(s.\(name)), 0)::bigint AS \(name)" : "0::bigint AS \(name)"
            }.joined(separator: ", ")
            sql = source == .hourly ? "WITH \(hoursCTE())\n" : ""
            sql.append("""
                SELECT \(unsafeRaw: select)\(unsafeRaw: sums),
                    \(revenueSum("coalesce(sum(s.revenue_micros) FILTER (WHERE s.currency = \(query.currency)), 0)")) AS revenue_micros,
                    0::bigint AS unique_devices
                FROM (
                \(rollupParts())
                ) AS s (app_id, d, hk, network, format, \(unsafeRaw: Self.countList), revenue_micros, currency)
                WHERE true\(timeFilters())
                """)
        }
        if !dimensions.isEmpty {
            sql.append("\nGROUP BY \(unsafeRaw: (1...dimensions.count).map(String.init).joined(separator: ", "))")
        }
        return sql
    }

    /// The ORDER BY of the query over `g` (a `grouped` row): its sort keys, then every
    /// dimension, so the order is total and paging stable.
    var orderBy: String {
        var keys: [String] = []
        for key in query.sort {
            let direction = key.isDescending ? "DESC" : "ASC"
            switch key.field {
            case .dimension(let dimension):
                let index = query.dimensions.firstIndex(of: dimension)!
                // Hours by their instant: in byte order the second 01:00 of a fall-back day
                // east of UTC (+00:00 after +01:00 in London) would come first.
                keys.append(dimension == .hour ? "(g.d\(index))::timestamptz \(direction) NULLS LAST" : "g.d\(index) \(direction) NULLS LAST")
            case .metric(let metric):
                keys.append("\(Self.sortExpression(metric)) \(direction) NULLS LAST")
            }
        }
        return keys.isEmpty ? "" : "ORDER BY " + keys.joined(separator: ", ")
    }

    /// A metric over a `grouped` row `g`, from its formula, for ORDER BY.
    static func sortExpression(_ metric: ReportMetric) -> String {
        func column(_ count: ReportCount) -> String { "g." + countNames[count.rawValue] }
        switch metric.formula {
        case .count(let count), .money(let count): return column(count)
        case .ratio(let numerator, let denominator): return "(\(column(numerator))::float8 / NULLIF(\(column(denominator)), 0))"
        case .moneyPerMille(let numerator, let denominator): return "(\(column(numerator)) * 1000 / NULLIF(\(column(denominator)), 0))"
        }
    }

    /// One page, each row also carrying the sums over all groups and their number.
    func page(limit: Int, offset: Int) -> PostgresQuery {
        let windows = Self.countNames.map { "sum(g.\($0)) OVER ()" }.joined(separator: ", ")
        return """
            SELECT g.*, \(unsafeRaw: windows), count(*) OVER () FROM (
            \(grouped())
            ) AS g \(unsafeRaw: orderBy) LIMIT \(limit) OFFSET \(offset)
            """
    }

    /// The sums over every matching row, as one row.
    func totals() -> PostgresQuery {
        grouped(dimensions: [])
    }

    /// A server-side cursor over the ordered rows, for streaming.
    func declareCursor(limit: Int?, offset: Int) -> PostgresQuery {
        var sql: PostgresQuery = "DECLARE report_rows NO SCROLL CURSOR FOR SELECT g.* FROM (\n\(grouped())\n) AS g \(unsafeRaw: orderBy)"
        if let limit { sql.append(" LIMIT \(limit)") }
        if offset > 0 { sql.append(" OFFSET \(offset)") }
        return sql
    }

    /// The first currency (and its first UTC date) with reported revenue in the range
    /// that is not the report's: no row when there is none.
    func foreignCurrency() -> PostgresQuery {
        let currency = query.currency
        if source == .raw {
            return """
                SELECT e.currency::text, (min(e.occurred_at) AT TIME ZONE 'UTC')::date::text FROM events e
                WHERE e.app_id = ANY(\(apps)) AND e.occurred_at >= \(t0) AND e.occurred_at < \(t1) AND e.type IN ('impression', 'tap')
                  AND e.currency IS NOT NULL AND e.currency::text <> \(currency)\(columnFilters("e"))
                GROUP BY 1 ORDER BY 2, 1 LIMIT 1
                """
        }
        if source == .daily {
            // Days of the apps' own zone: one row per day and key to look at.
            return """
                SELECT currency, min(d)::text FROM (
                    SELECT r.currency, r.day AS d FROM rollup_revenue_day_compacted r
                    WHERE r.app_id = ANY(\(apps)) AND r.day BETWEEN \(ReportQuery.formatDate(query.from))::date AND \(ReportQuery.formatDate(query.to))::date
                      AND r.currency <> \(currency)\(columnFilters("r"))
                    UNION ALL
                    SELECT r.currency, r.bucket::date FROM rollup_delta r
                    WHERE r.app_id = ANY(\(apps)) AND r.currency NOT IN ('', \(currency)) AND r.bucket >= \(t0) AND r.bucket < \(t1)\(columnFilters("r"))
                ) AS f GROUP BY 1 ORDER BY 2, 1 LIMIT 1
                """
        }
        return """
            SELECT currency, (min(t) AT TIME ZONE 'UTC')::date::text FROM (
                SELECT r.currency, r.hour AS t FROM rollup_revenue_1h_compacted r
                WHERE r.app_id = ANY(\(apps)) AND r.hour >= \(t0) AND r.hour + interval '1 hour' <= \(t1) AND r.currency <> \(currency)\(columnFilters("r"))
                UNION ALL
                SELECT r.currency, r.bucket FROM rollup_revenue_15m_compacted r
                WHERE r.app_id = ANY(\(apps)) AND r.currency NOT IN ('', \(currency)) AND r.bucket >= \(t0) AND r.bucket < \(t1)
                  AND (r.bucket < date_trunc('hour', \(t0), 'UTC') + interval '1 hour' OR r.bucket >= date_trunc('hour', \(t1), 'UTC'))\(columnFilters("r"))
                UNION ALL
                SELECT r.currency, r.bucket FROM rollup_delta r
                WHERE r.app_id = ANY(\(apps)) AND r.currency NOT IN ('', \(currency)) AND r.bucket >= \(t0) AND r.bucket < \(t1)\(columnFilters("r"))
            ) AS f GROUP BY 1 ORDER BY 2, 1 LIMIT 1
            """
    }

    // MARK: - Rows

    func decodeRow(_ row: PostgresRow) throws -> ReportRow {
        var dimensions: [String?] = []
        dimensions.reserveCapacity(query.dimensions.count)
        for index in query.dimensions.indices {
            dimensions.append(row.withBytes(index) { bytes in bytes.map { String(decoding: $0, as: UTF8.self) } })
        }
        return ReportRow(dimensions: dimensions, counts: try decodeCounts(row, at: query.dimensions.count))
    }

    /// The sums in `countNames` order from column `start` on, parsed from their text
    /// in place (no String per value: a streamed export decodes millions).
    func decodeCounts(_ row: PostgresRow, at start: Int) throws -> ReportCounts {
        func integer(_ offset: Int) throws -> Int128 {
            try row.withBytes(start + offset) { bytes -> Int128 in
                guard let bytes, !bytes.isEmpty else { return 0 }
                // Up to 18 digits in native arithmetic (every count, and revenue but for
                // totals past 10^18 micros); longer text through Int128's own parser.
                guard bytes.count <= 18 else {
                    if let wide = Int128(String(decoding: bytes, as: UTF8.self)) { return wide }
                    throw PostgresError(kind: .decoding, message: "\(Self.countNames[offset]): \(String(decoding: bytes, as: UTF8.self)) is not an integer")
                }
                var value: Int64 = 0
                var negative = false
                for (position, byte) in bytes.enumerated() {
                    if position == 0 && byte == UInt8(ascii: "-") { negative = true; continue }
                    guard (0x30...0x39).contains(byte) else {
                        throw PostgresError(kind: .decoding, message: "\(Self.countNames[offset]): \(String(decoding: bytes, as: UTF8.self)) is not an integer")
                    }
                    value = value &* 10 &+ Int64(byte &- 0x30)
                }
                return Int128(negative ? -value : value)
            }
        }
        func count(_ offset: Int) throws -> Int64 {
            let value = try integer(offset)
            guard let small = Int64(exactly: value) else {
                throw PostgresError(kind: .decoding, message: "\(Self.countNames[offset]): \(value) is not a 64-bit integer")
            }
            return small
        }
        var counts = ReportCounts()
        counts.requests = try count(0)
        counts.loads = try count(1)
        counts.impressions = try count(2)
        counts.errors = try count(3)
        counts.taps = try count(4)
        counts.actionCancels = try count(5)
        counts.expiries = try count(6)
        counts.wastedFills = try count(7)
        counts.revenueMicros = try integer(8)
        counts.uniqueDevices = try count(9)
        return counts
    }

    /// A row's dimension values as a key for matching it with the compared period's
    /// rows: the earlier period's values are moved forward by `shift` (days for date
    /// and hour, whole weeks for week, months for month; year over year moves a year);
    /// hours compare by local wall time, without their offset.
    static func comparisonKey(_ values: [String?], _ dimensions: [ReportDimension], shift: (query: ReportQuery, shiftDays: Int, shiftMonths: Int)?) -> String {
        var key = ""
        for (index, dimension) in dimensions.enumerated() {
            var value = values[index] ?? "\u{0}"
            if dimension == .hour { value = String(value.prefix(19)) }
            if let shift, dimension.isTime {
                value = shifted(value, dimension, shift.shiftDays == 0, days: shift.shiftDays, months: shift.shiftMonths)
            }
            key += value + "\u{1}"
        }
        return key
    }

    static func shifted(_ value: String, _ dimension: ReportDimension, _ isYearOverYear: Bool, days: Int, months: Int) -> String {
        switch dimension {
        case .date, .hour:
            guard let day = ReportQuery.parseDate(String(value.prefix(10))) else { return value }
            let moved = isYearOverYear ? ReportQuery.shiftYears(day, by: 1) : day + days
            return ReportQuery.formatDate(moved) + value.dropFirst(10)
        case .week:
            guard let day = ReportQuery.parseDate(value) else { return value }
            return ReportQuery.formatDate(day + (isYearOverYear ? 364 : 7 * Int((Double(days) / 7).rounded())))
        case .month:
            guard let day = ReportQuery.parseDate(value + "-01") else { return value }
            let date = CivilTime.date(days: day)
            let total = date.year * 12 + (date.month - 1) + months
            return String(ReportQuery.formatDate(CivilTime.days(year: total / 12, month: total % 12 + 1, day: 1)).prefix(7))
        default:
            return value
        }
    }
}
