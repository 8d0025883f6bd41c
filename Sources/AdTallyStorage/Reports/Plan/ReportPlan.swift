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
    /// The database is a Citus coordinator (ReportEngine.prepare says): the rollups' rows
    /// are joined to their apps, which Citus needs and one node's planner is misled by.
    let distributed: Bool

    /// Summed columns after the dimensions, in `ReportCount` order.
    static let countNames = ["requests", "loads", "impressions", "errors", "taps", "action_cancels", "expiries", "wasted_fills", "sessions", "reported_micros", "estimated_micros", "unique_devices",
                             "active_devices", "ad_viewers", "device_days", "viewer_days", "days", "precise_micros", "network_micros", "network_impressions"]
    /// The audience columns (`ReportCount.activeDevices` …): not summed over groups, but
    /// read from the audience CTEs (`audience`).
    static let audienceNames = ["active_devices", "ad_viewers", "device_days", "viewer_days", "days"]
    /// The audience columns when no audience metric is asked for.
    static let audienceZeros = audienceNames.map { "0::bigint AS \($0)" }.joined(separator: ", ")
    static let countColumns = countNames.count
    static let rollupCounts = countNames.prefix(9)

    /// A range of UTC dates whose priced rollups a card change left stale, for one app,
    /// network and format (Migrations/0012), as `rollup_dirty` holds it.
    struct DirtyRange: Sendable, Equatable {
        var app: String
        var network: String
        var format: String
        /// Dates as PostgreSQL writes them (`-infinity` and `infinity` included).
        var from: String
        var to: String
    }

    /// The dirty ranges of the report's apps (ReportEngine.prepare reads them in the
    /// report's snapshot): there, money is priced at query time.
    let dirty: [DirtyRange]

    /// The days whose revenue is a network's final earnings (`RevenueOfRecord`).
    let record: [RecordDay]
    /// The longest restatement window (days) of a network whose final earnings may
    /// still replace revenue in this report (nil: none; its days are provisional that long).
    var recordWindow: Int?

    /// `source`: the source the rows are read from when the caller builds them itself
    /// (a cohort report's device rows price as raw events do, by the hour); nil: the
    /// cheapest that answers the query.
    init(_ query: ReportQuery, distributed: Bool = false, dirty: [DirtyRange] = [], record: [RecordDay] = [], source forced: Source? = nil) {
        self.query = query
        self.distributed = distributed
        self.dirty = dirty
        self.record = record
        if let forced {
            source = forced
            recordByHour = false
        } else if !query.isServedByRollups {
            source = .raw
            recordByHour = false
        } else if query.isInAppsOwnZone, !query.usedDimensions.contains(.hour) {
            // A network's days in the apps' zone are placed by the daily rows' own day, when
            // the days are whole UTC hours (their impressions, counted by the hour, are then
            // the daily rows'). In another zone (AdMob's Los Angeles days of an app in New
            // York) they are placed by the hour: every row is still read by the day, placed
            // at its day's noon, and only the hours of those apps and networks that lie in
            // another network day (where one of the two is a record day: `edgesCTE`) are moved
            // by the hour (reading every network by the hour
            // took the report from ~10 ms to 180 ms on the bench's 10 M events; reading those
            // apps and networks by the hour, to 5-6x the default report).
            source = .daily
            recordByHour = !record.allSatisfy({ $0.zone == query.timezone && $0.fromEpoch % 3600 == 0 && $0.toEpoch % 3600 == 0 })
        } else {
            source = .hourly
            recordByHour = false
        }
    }

    /// With the daily source: the days of a network to place (the `record`) are not whole
    /// local days, so every daily row is placed at its day's noon and the hours of the apps
    /// and networks with such days (`recordPairs`) that lie in another network day are moved
    /// by the hour (`ReportPlan.rollupParts`, `edgesCTE`).
    let recordByHour: Bool

    /// `app_id || chr(1) || network` of each app and network whose hours in another network
    /// day are moved by the hour when `recordByHour`.
    var recordPairs: [String] { recordPairZones.map { $0.app + "\u{1}" + $0.network } }

    /// Each app and network with record days, in `recordPairs`' order, with the zone of its
    /// days (one per app and network: `recordDays` chooses one source and zone for each).
    var recordPairZones: [(app: String, network: String, zone: String)] {
        var zones: [String: (app: String, network: String, zone: String)] = [:]
        for day in record { zones[day.app + "\u{1}" + day.network] = (day.app, day.network, day.zone) }
        return zones.keys.sorted().map { zones[$0]! }
    }

    /// The plan of the compared period's query, on the same database state.
    func compared(_ earlier: ReportQuery) -> ReportPlan { ReportPlan(earlier, distributed: distributed, dirty: dirty, record: record) }

    var sourceDescription: String {
        switch source {
        case .daily where recordByHour:
            "rollups: daily rows in the apps' own zone (and hourly rows, with 15-minute rows for hours a day boundary cuts, of the hours that lie in another of a network's days than their day's noon, for the apps and networks whose days in the network's zone take its earnings), and pending 15-minute deltas"
        case .daily: "rollups: daily rows in the apps' own zone, and pending 15-minute deltas"
        case .hourly: "rollups: hourly rows for whole hours, 15-minute rows for hours a day or hour boundary of the zone cuts, and pending deltas"
        case .raw:
            "raw events (\((query.usedDimensions.filter { !$0.isInRollups }.map(\.rawValue) + (needsPrecise ? ["precise_revenue_share"] : [])).sorted().joined(separator: ", ")) are not in the rollups)"
        }
    }

    /// Index of the first window total in `page` rows.
    var totalsColumn: Int { query.dimensions.count + Self.countColumns }

    /// Whether a metric reads revenue (then the revenue rollups are read and currencies checked).
    var needsMoney: Bool { !needed.isDisjoint(with: [.revenueMicros, .reportedMicros, .estimatedMicros, .preciseMicros, .networkMicros, .networkImpressions]) }

    // MARK: - Fragments

    /// The report's zone as an SQL literal. Every local day and hour below is computed
    /// with it explicitly (AT TIME ZONE, date_trunc's zone argument), never with the
    /// session's TimeZone, which Citus does not send to the workers a query is pushed
    /// to: the same SQL is right on one node and on a cluster. ReportEngine.prepare
    /// refuses a name with anything but letters, digits and `/_+-` before any of it runs.
    var zone: String { "'" + query.timezone.replacingOccurrences(of: "'", with: "''") + "'" }

    /// Start of the range: local midnight of `from` in the report's zone.
    var t0: PostgresQuery { "(\(ReportQuery.formatDate(query.from))::date::timestamp AT TIME ZONE \(unsafeRaw: zone))" }
    /// End of the range (exclusive): local midnight after `to`.
    var t1: PostgresQuery { "((\(ReportQuery.formatDate(query.to))::date + 1)::timestamp AT TIME ZONE \(unsafeRaw: zone))" }

    /// An instant's local date and time (timestamp without zone) in the report's zone.
    func local(_ instant: String) -> String { "((\(instant)) AT TIME ZONE \(zone))" }

    /// A time dimension's value over the instant `time`, in the report's zone (raw
    /// events: one zone conversion per event).
    func timeExpression(_ dimension: ReportDimension, _ time: String) -> String {
        switch dimension {
        case .date: "\(local(time))::date::text"
        case .week: "date_trunc('week', \(local(time)))::date::text"
        case .month: "to_char(\(local(time)), 'YYYY-MM')"
        case .hour: hourText("date_trunc('hour', \(time), \(zone))")
        default: preconditionFailure("not a time dimension")
        }
    }

    /// `YYYY-MM-DDTHH:MM:SS±HH:MM` of an instant, in the report's zone: the local time
    /// and its offset from UTC at that instant (a repeated hour on a DST day is two).
    func hourText(_ instant: String) -> String {
        let offset = "(\(local(instant)) - ((\(instant)) AT TIME ZONE 'UTC'))"
        return "(to_char(\(local(instant)), 'YYYY-MM-DD\"T\"HH24:MI:SS') || CASE WHEN \(offset) < interval '0' "
            + "THEN '-' || to_char(-\(offset), 'HH24:MI') ELSE '+' || to_char(\(offset), 'HH24:MI') END)"
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
        case .date, .week, .month, .hour: return source == .raw ? timeExpression(dimension, "e.occurred_at") : Self.rollupTimeExpression(dimension)
        case .app: return "\(row).app_id"
        case .network: return "\(row).network"
        case .format: return "\(row).format"
        case .country: return "e.country::text"
        case .placement, .size, .platform: return "e.\(dimension.rawValue)"
        case .osVersion: return "e.os_version"
        case .appVersion: return "e.app_version"
        case .errorCode: return "e.error_code"
        case .revenuePrecision: return Self.precisionExpression
        case .cohort: preconditionFailure("a cohort report is read by CohortReport, not planned here")
        }
    }

    /// An event's revenue precision: `unknown` when reported revenue came without one,
    /// NULL for events without reported revenue.
    static let precisionExpression = "CASE WHEN e.revenue_micros IS NOT NULL THEN coalesce(e.revenue_precision, 'unknown') END"

    /// Whether precise reported revenue is asked for (raw events only: ReportQuery.isServedByRollups).
    var needsPrecise: Bool { needed.contains(.preciseMicros) }

    /// `AND column = ANY(values)` for each filter on a stored column (`alias.column`):
    /// pushed into every part of the source.
    func columnFilters(_ alias: String, devices: Bool = false, sessionless: Bool = false) -> PostgresQuery {
        var sql: PostgresQuery = ""
        // Sessions are stored under no network (Migrations/0011): rows of their own that
        // only the sessions count reads; left out otherwise, so no grouping by network or
        // format shows an empty one. Their devices are never read: unique_devices counts
        // the devices of ad events, whether sessions are asked for beside it or not.
        // With the audience, a day that saw only sessions still has its row, unless a row
        // names what sessions lack (their '' network would be a row of its own; the audience
        // CTEs read the sessions' devices through filters of their own).
        let sessionRows = needed.contains(.sessions) || (needsAudience && !query.dimensions.contains(where: \.isOnAdEventsOnly))
        // (`sessionless`: the active devices' parts, which always read the sessions.)
        if devices || (!sessionRows && !sessionless) { sql.append(" AND \(unsafeRaw: alias).network <> ''") }
        for filter in query.filters where !filter.dimension.isTime {
            // Active devices are the app's: a session names no network, format or placement.
            if sessionless && filter.dimension.isOnAdEventsOnly { continue }
            let column = filter.dimension == .app ? "app_id" : filter.dimension.rawValue
            if filter.dimension == .errorCode {
                sql.append(" AND \(unsafeRaw: alias).\(unsafeRaw: column) = ANY(\(array: filter.values.compactMap { Int32($0) })::int[])")
            } else if filter.dimension == .revenuePrecision {
                sql.append(" AND \(unsafeRaw: Self.precisionExpression) = ANY(\(array: filter.values)::text[])")
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

    /// A row's local date and hour text (or NULL) from its 15-minute `r.bucket`: per-row
    /// zone conversions, only for the few rows of cut hours and pending deltas.
    var rowDate: String { "\(local("r.bucket"))::date" }
    /// Noon of a local date (a `date` expression) in the report's zone: where a daily row is
    /// placed among a network's days (`RevenueOfRecord`).
    func noon(_ day: String) -> String { "((\(day) + time '12:00') AT TIME ZONE \(zone))" }
    var rowHour: String { needsHour ? hourText("date_trunc('hour', r.bucket, \(zone))") : "NULL::text" }
    /// Hourly rows (`r.hour`) that lie whole in one group (`hoursCTE`).
    var wholeHours: PostgresQuery { "JOIN hours ON hours.h = r.hour AND hours.whole" }
    var hourRange: PostgresQuery { "r.hour >= \(t0) AND r.hour < \(t1)" }
    /// The 15-minute rows (`r.bucket`) of the hours a group boundary cuts.
    var cutBuckets: PostgresQuery { "r.bucket = ANY((SELECT buckets FROM cut)::timestamptz[]) AND r.bucket >= \(t0) AND r.bucket < \(t1)" }

    /// A dimension as the `d<index>` column of a grouping: text in byte order ("C"), the
    /// order rows are sorted in, so that a grouping done by sorting already yields it.
    func dimensionSelect(_ index: Int, _ dimension: ReportDimension? = nil) -> String {
        let dimension = dimension ?? query.dimensions[index]
        return dimension == .errorCode ? "\(expression(dimension)) AS d\(index)" : "(\(expression(dimension))) COLLATE \"C\" AS d\(index)"
    }

    /// `, instant` of a part's row (its hour or 15-minute bucket) when a network's earnings
    /// are placed by the hour (`RevenueOfRecord`: the column `h`); nothing otherwise.
    func at(_ instant: String) -> String { hasRecord ? ", \(instant)" : "" }

    /// Whether rows need their hour text (`hk`).
    var needsHour: Bool { query.usedDimensions.contains(.hour) }

    var apps: PostgresQuery { "\(array: query.apps)::text[]" }

    /// hll(11, 5, 0), as every sketch is (Migrations/0005, 0028: never the explicit list of hashes).
    static func sketch(_ hashes: String) -> String { "hll_add_agg(\(hashes), 11, 5, 0)" }
    /// A sketch's estimate as a whole number (0 for none).
    static func cardinality(_ sketch: String) -> String { "coalesce(round(hll_cardinality(\(sketch)))::bigint, 0)" }

    /// Whether unique devices are asked for (then sketches are read).
    var needsDevices: Bool { needed.contains(.uniqueDevices) }

    /// The counts the query's metrics read.
    var needed: Set<ReportCount> {
        var counts = Set(query.metrics.flatMap(\.counts))
        if counts.contains(.revenueMicros) { counts.formUnion([.reportedMicros, .estimatedMicros, .networkMicros]) }
        // A network's earnings are spread over impressions (RevenueOfRecord).
        if !record.isEmpty && !counts.isDisjoint(with: [.reportedMicros, .estimatedMicros, .networkMicros, .networkImpressions]) {
            counts.formUnion([.impressions, .networkMicros, .networkImpressions])
        }
        return counts
    }

    /// `sum(alias.count)` for each of the 8 counts a metric reads, else 0.
    func countSums(_ alias: String) -> String {
        Self.rollupCounts.enumerated().map { index, name in
            needed.contains(ReportCount(rawValue: index)!) ? "coalesce(sum(\(alias).\(name)), 0)::bigint AS \(name)" : "0::bigint AS \(name)"
        }.joined(separator: ", ")
    }

    /// One row per group (all rows as one group when `dimensions` is empty): the
    /// dimension values `d0…`, the sums in `countNames` order, then `unrated` (unpriced
    /// impressions and taps no rate card entry priced), `missing_fx` (the first
    /// "UTC-date from missing" whose conversion has no FX rate, or NULL) and `devices`
    /// (the group's device sketch, or NULL).
    ///
    /// Money (DESIGN §3): impressions and taps without reported revenue are priced by
    /// the rate card entry in force on their UTC date, the country's over the
    /// any-country one. Amounts are summed exactly per group, UTC date and currency,
    /// then converted to the report currency at that date's FX rate and rounded half
    /// to even to micros, once each: a row is the sum of its rounded buckets, and the
    /// totals are the sum of the rows. Reported and estimated revenue are rounded
    /// apart, so revenue is always exactly their sum.
    func grouped(dimensions: [ReportDimension]? = nil, fxCheck: Bool = false) -> PostgresQuery {
        let dimensions = dimensions ?? query.dimensions
        let names = dimensions.indices.map { "d\($0)" }
        let groupBy = names.isEmpty ? "" : "\nGROUP BY " + names.joined(separator: ", ")
        let select = dimensions.enumerated().map { dimensionSelect($0.offset, $0.element) + ", " }.joined()
        // The audience beside the groups (not in the FX check, which has no groups).
        let audience = needsAudience && !fxCheck
        var with: [PostgresQuery] = source == .hourly || recordByHour ? [hoursCTE()] : []
        if audience { with.append(contentsOf: audienceCTEs()) }
        if needsMoney && !dirty.isEmpty && source != .raw { with.append(dirtyDaysCTE()) }
        if hasRecord { with.append(recordCTE()) }
        if source == .daily && recordByHour { with.append(edgesCTE()) }
        // The rows every grouping below reads: `s` with the dimension values as d0…; with
        // money, the rows the report prices itself are the CTE `pending` (priced once per
        // distinct UTC date, network, format and country: `RatePricing`).
        var rows: PostgresQuery
        if source == .raw {
            rows = rawRows(select: select, dimensionCount: dimensions.count)
            if needsMoney {
                with.append("pending AS MATERIALIZED (\n\(rows)\n)")
                rows = "pending AS s"
            } else {
                rows = "(\n\(rows)\n) AS s"
            }
        } else {
            let columns = "app_id, d, hk, u, network, format, \(Self.countList), \(Self.partColumns)" + (hasRecord ? ", h" : "")
            var (stored, pending) = rollupParts(fxCheck: fxCheck)
            if !pending.isEmpty {
                with.append("pending (\(unsafeRaw: columns)) AS MATERIALIZED (\n\(Self.union(pending))\n)")
                stored.append("SELECT * FROM pending")
            }
            rows = "(SELECT \(unsafeRaw: select)s.* FROM (\n\(Self.union(stored))\n) AS s (\(unsafeRaw: columns)) WHERE true\(timeFilters())) AS s"
        }
        if needsMoney { with.append("\(unsafeRaw: RatePricing.pricesCTE("prices", of: "pending"))") }
        var sql: PostgresQuery = ""
        for (index, part) in with.enumerated() {
            sql.append(index == 0 ? "WITH " : ",\n")
            sql.append(part)
        }
        if !with.isEmpty { sql.append("\n") }
        let dimensionList = names.map { "s.\($0), " }.joined()
        let devices = needsDevices ? "hll_union_agg(s.devices)" : "NULL::hll"
        guard needsMoney else {
            let main: PostgresQuery = """
                SELECT \(unsafeRaw: dimensionList)\(unsafeRaw: countSums("s")), 0::numeric AS reported_micros, 0::numeric AS estimated_micros,
                    \(unsafeRaw: Self.cardinality(devices)) AS unique_devices, \(unsafeRaw: Self.audienceZeros), 0::numeric AS precise_micros,
                    0::numeric AS network_micros, 0::bigint AS network_impressions, 0::bigint AS unrated, NULL::text AS missing_fx, \(unsafeRaw: devices) AS devices
                FROM \(rows)\(unsafeRaw: groupBy)
                """
            sql.append(audience ? withAudience(main) : main)
            return sql
        }
        let main = pricedSums(names: names, rows: rows, dimensionList: dimensionList)
        sql.append(audience ? withAudience(main) : main)
        return sql
    }

    /// The sort keys over `g` (a `grouped` row), in order: the query's sort, which names
    /// every dimension (ReportQuery.parse adds those it lacks), so the order is total and
    /// a row's key values say where it stands: the keyset a cursor carries.
    var sortKeys: [(sql: String, type: String, isDescending: Bool)] {
        query.sort.map { key in
            switch key.field {
            case .dimension(let dimension):
                let index = query.dimensions.firstIndex(of: dimension)!
                // Hours by their instant: in byte order the second 01:00 of a fall-back day
                // east of UTC (+00:00 after +01:00 in London) would come first.
                switch dimension {
                case .hour: return ("(g.d\(index))::timestamptz", "timestamptz", key.isDescending)
                case .errorCode: return ("g.d\(index)", "int", key.isDescending)
                default: return ("g.d\(index)", "text", key.isDescending)
                }
            case .metric(let metric):
                let type: String
                switch metric.formula {
                case .count(let count): type = [.reportedMicros, .estimatedMicros, .revenueMicros, .preciseMicros, .networkMicros].contains(count) ? "numeric" : "bigint"
                case .money, .moneyPerMille, .moneyPerDevice: type = "numeric"
                case .ratio, .average: type = "float8"
                case .revenueSource: type = "text"
                }
                return (Self.sortExpression(metric), type, key.isDescending)
            }
        }
    }

    /// The ORDER BY of the query over `g`: its sort keys, NULLs last either way.
    var orderBy: String {
        let keys = sortKeys.map { "\($0.sql) \($0.isDescending ? "DESC" : "ASC") NULLS LAST" }
        return keys.isEmpty ? "" : "ORDER BY " + keys.joined(separator: ", ")
    }

    /// The sort key values of a row, as text (NULL stays NULL), for the next cursor.
    /// Named apart: a cast is named after its column (`requests`), and Citus, which
    /// deparses the ORDER BY by name, found `requests` ambiguous beside the row's own.
    var sortKeyTexts: String { sortKeys.enumerated().map { ", (\($0.element.sql))::text AS sort_key_\($0.offset)" }.joined() }

    /// `AND` the rows after `query.after` in the order (keyset paging), or nothing.
    /// Lexicographic over the keys: after = gt1 OR (eq1 AND (gt2 OR (eq2 AND …))), where
    /// with NULLs last a NULL is after every value and equal only to NULL.
    var afterFilter: PostgresQuery {
        guard let after = query.after, after.count == sortKeys.count, !after.isEmpty else { return "" }
        // Built from the last key back: after(i) = gt(i) OR (eq(i) AND after(i + 1)).
        var sql: PostgresQuery = ""
        for (index, key) in sortKeys.enumerated().reversed() {
            var step: PostgresQuery
            let isLast = index == sortKeys.count - 1
            if let value = after[index] {
                let op = key.isDescending ? "<" : ">"
                step = "(\(unsafeRaw: key.sql) \(unsafeRaw: op) \(value)::\(unsafeRaw: key.type) OR \(unsafeRaw: key.sql) IS NULL"
                if !isLast {
                    step.append(" OR (\(unsafeRaw: key.sql) = \(value)::\(unsafeRaw: key.type) AND ")
                    step.append(sql)
                    step.append(")")
                }
            } else {
                // Nothing sorts after NULL within this key: only rows equal here go on.
                step = "(false"
                if !isLast {
                    step.append(" OR (\(unsafeRaw: key.sql) IS NULL AND ")
                    step.append(sql)
                    step.append(")")
                }
            }
            step.append(")")
            sql = step
        }
        return "\nWHERE \(sql)"
    }

    /// A metric over a `grouped` row `g`, from its formula, for ORDER BY.
    static func sortExpression(_ metric: ReportMetric) -> String {
        func column(_ count: ReportCount) -> String {
            count == .revenueMicros ? "(g.reported_micros + g.estimated_micros + g.network_micros)" : "g." + countNames[count.rawValue]
        }
        switch metric.formula {
        case .count(let count), .money(let count): return column(count)
        case .ratio(let numerator, let denominator), .average(let numerator, let denominator):
            return "(\(column(numerator))::float8 / NULLIF(\(column(denominator)), 0))"
        case .moneyPerDevice(let numerator, let denominator): return "(\(column(numerator)) / NULLIF(\(column(denominator)), 0))"
        case .moneyPerMille(let numerator, let denominator): return "(\(column(numerator)) * 1000 / NULLIF(\(column(denominator)), 0))"
        // As `ReportCounts.revenueSource` says it.
        case .revenueSource:
            return "(CASE WHEN g.network_impressions = 0 AND g.network_micros = 0 THEN 'sdk' "
                + "WHEN g.network_impressions = g.impressions AND g.reported_micros + g.estimated_micros = 0 THEN 'network' ELSE 'mixed' END)"
        }
    }

    /// The columns of a `grouped` row `g` that a report row holds: dimensions, then counts.
    func rowColumns(_ alias: String = "g") -> String {
        (query.dimensions.indices.map { "\(alias).d\($0)" } + Self.countNames.map { "\(alias).\($0)" }).joined(separator: ", ")
    }

    /// One page: `limit` rows after the cursor's (and one more, which says whether there
    /// is a next page), each row also carrying the sums over all groups (unique devices:
    /// the union of every group's sketch), the unrated events, the number of groups, the
    /// first missing FX rate, then its sort key values (`keyColumn`). The sums are taken
    /// before the cursor's rows are left out: totals cover every matching row.
    func page(limit: Int) -> PostgresQuery {
        let windows = Self.countNames.map { name in
            name == "unique_devices"
                ? (needsDevices ? Self.cardinality("hll_union_agg(g.devices) OVER ()") : "0::bigint")
                : Self.audienceNames.contains(name) ? (needsAudience ? "g.t_\(name)" : "0::bigint")
                : "sum(g.\(name)) OVER ()"
        }.enumerated().map { "\($0.element) AS total_\($0.offset)" }.joined(separator: ", ")
        let totals = Self.countNames.indices.map { "g.total_\($0)" }.joined(separator: ", ")
        return """
            SELECT \(unsafeRaw: rowColumns()), \(unsafeRaw: totals), g.total_unrated, g.total_groups, g.total_missing_fx\(unsafeRaw: sortKeyTexts) FROM (
            SELECT g.*, \(unsafeRaw: windows), sum(g.unrated) OVER () AS total_unrated, count(*) OVER () AS total_groups,
                   min(g.missing_fx) OVER () AS total_missing_fx FROM (
            \(grouped())
            ) AS g) AS g\(afterFilter) \(unsafeRaw: orderBy) LIMIT \(limit + 1)
            """
    }

    /// Where `page` rows hold their sort key values.
    var keyColumn: Int { unratedColumn + 3 }

    /// Where `page` rows hold the unrated total, the number of groups and the first missing FX rate.
    var unratedColumn: Int { totalsColumn + Self.countColumns }

    /// The sums over every matching row, as one row: the counts, the unrated events,
    /// the first missing FX rate. Summed from the rows, so money agrees with them to the micro.
    func totals() -> PostgresQuery {
        let sums = Self.countNames.map { name in
            name == "unique_devices"
                ? (needsDevices ? Self.cardinality("hll_union_agg(g.devices)") : "0::bigint")
                : Self.audienceNames.contains(name) ? (needsAudience ? "coalesce(max(g.t_\(name)), 0)" : "0::bigint")
                : "coalesce(sum(g.\(name)), 0)"
        }.joined(separator: ", ")
        return "SELECT \(unsafeRaw: sums), coalesce(sum(g.unrated), 0), min(g.missing_fx) FROM (\n\(grouped())\n) AS g"
    }

    /// The first "UTC-date from missing" the report would have to convert without an FX
    /// rate (NULL: none): the (UTC date, currency) buckets of the rows that may need a
    /// rate (stored money in other currencies than the report's, and the pending rows),
    /// without counts or dimensions: a check before a stream, not a second evaluation of
    /// the report (it still reads the range's priced rows, whose currency no index leads).
    func missingFX() -> PostgresQuery {
        "SELECT missing_fx FROM (\n\(grouped(dimensions: [], fxCheck: true))\n) AS g"
    }

    /// Where a cursor row holds its `missing_fx`.
    var missingFXColumn: Int { query.dimensions.count + Self.countColumns }

    /// A server-side cursor over the ordered rows, for streaming: each row's columns,
    /// then its `missing_fx` and `unrated`.
    func declareCursor(limit: Int?) -> PostgresQuery {
        var sql: PostgresQuery = "DECLARE report_rows NO SCROLL CURSOR FOR SELECT \(unsafeRaw: rowColumns()), g.missing_fx, g.unrated FROM (\n\(grouped())\n) AS g\(afterFilter) \(unsafeRaw: orderBy)"
        if let limit { sql.append(" LIMIT \(limit)") }
        return sql
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
        counts.sessions = try count(8)
        counts.reportedMicros = try integer(9)
        counts.estimatedMicros = try integer(10)
        counts.uniqueDevices = try count(11)
        counts.activeDevices = try count(12)
        counts.adViewers = try count(13)
        counts.deviceDays = try count(14)
        counts.viewerDays = try count(15)
        counts.days = try count(16)
        counts.preciseMicros = try integer(17)
        counts.networkMicros = try integer(18)
        counts.networkImpressions = try count(19)
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
