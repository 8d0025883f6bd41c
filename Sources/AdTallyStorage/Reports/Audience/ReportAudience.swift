import AdTallyCore
import PostgresKit

/// The audience metrics of DESIGN §3 (DAU, DAV and the metrics over them), as SQL
/// beside a report's groups: each group's devices are read from the device sketches
/// (Migrations/0005 and 0014) per local day of the report's zone, so that
/// - `active_devices` / `ad_viewers` are the union over the group's days (range-unique),
/// - `device_days` / `viewer_days` are each day's count summed over those days (DAU × days),
/// - `days` are the days of the range the group covers,
/// and every ratio is made of these by its formula (`ReportMetric`): dau is
/// device-days / days, arpdau revenue / device-days.
///
/// A day is exact in every zone: the daily source reads the app's own days; the hourly
/// one reads whole UTC hours inside one local day and the 15-minute rows of the hours
/// a local midnight cuts (`hoursCTE` makes every local midnight a boundary when the
/// audience is asked for); raw events are sketched by their local day.
///
/// Active devices are the app's, whatever network, format, placement, size, error code or
/// revenue precision a row or filter names: a session (what makes a device active without
/// an ad) has none of them. Ad viewers are the devices of the row's own impressions.
extension ReportPlan {
    var needsActive: Bool { !needed.isDisjoint(with: [.activeDevices, .deviceDays]) }
    var needsViewers: Bool { !needed.isDisjoint(with: [.adViewers, .viewerDays]) }
    var needsDays: Bool { needed.contains(.days) }
    /// Whether an audience metric is asked for (then the audience CTEs are read).
    var needsAudience: Bool { needsActive || needsViewers || needsDays }

    /// `d0 …` of the query's dimensions a kind of device groups by: active devices by
    /// those sessions carry, viewers by all.
    func audienceDimensions(viewers: Bool) -> [Int] {
        query.dimensions.indices.filter { viewers || !query.dimensions[$0].isOnAdEventsOnly }
    }

    /// Whether active devices and viewers are read in one scan (`AudienceKind.both`): both
    /// are asked for, and they group and filter alike (no dimension or filter names what
    /// a session lacks). Viewers are then read beside the sessions' rows, whose viewers are
    /// NULL (no impression) and add nothing. Two scans of the same sketch rows, and their
    /// per-day unions, were most of what the audience added to a report.
    var readsAudienceOnce: Bool {
        needsActive && needsViewers && source != .raw && !namesAdDimensions
    }

    /// Whether a dimension or filter names what only ad events carry (network, format …).
    var namesAdDimensions: Bool {
        query.dimensions.contains(where: \.isOnAdEventsOnly) || query.filters.contains(where: { !$0.dimension.isTime && $0.dimension.isOnAdEventsOnly })
    }

    /// Whether a kind's days are read from each app's own day sketch (`rollup_devices_app_day`,
    /// Migrations/0022: the union over every network and format) rather than per network
    /// and format: in the apps' own zone, for active devices always (they are the app's),
    /// for viewers when nothing names a network or format. A day is then one row of two
    /// sketches, not one per network and format (720 rows for the bench's largest app's
    /// 30 days, whose unions were half the audience report's time).
    func readsAppDays(_ kind: AudienceKind) -> Bool {
        source == .daily && (kind == .active || !namesAdDimensions)
    }

    /// Which devices a sketch read holds: any event's, the impressions' (viewers), or
    /// both (two sketches a row: `s` and `v`).
    enum AudienceKind {
        case active, viewers, both
    }

    /// Rows (app_id, d, hk, network, format, s) of the range's per-day sketches from the
    /// rollups: `s` the devices of any event, or of the impressions; for `both`, a last
    /// column `v`, the impressions'.
    func audienceParts(_ kind: AudienceKind) -> [PostgresQuery] {
        let viewers = kind == .viewers
        let column = switch kind { case .active: "devices"; case .viewers: "viewers"; case .both: "devices, r.viewers" }
        let filters = viewers ? columnFilters("r", devices: true) : columnFilters("r", sessionless: true)
        let present: PostgresQuery = viewers ? " AND r.viewers IS NOT NULL" : ""
        var parts: [PostgresQuery] = []
        switch source {
        case .daily where readsAppDays(kind):
            parts.append("""
                SELECT r.app_id, r.day, NULL::text, ''::text, ''::text, r.\(unsafeRaw: column)
                FROM rollup_devices_app_day r
                WHERE r.app_id = ANY(\(apps)) AND r.day BETWEEN \(ReportQuery.formatDate(query.from))::date AND \(ReportQuery.formatDate(query.to))::date\(columnFilters("r", sessionless: true))\(present)
                """)
        case .daily:
            parts.append("""
                SELECT r.app_id, r.day, NULL::text, r.network, r.format, r.\(unsafeRaw: column)
                FROM rollup_devices_day_compacted r
                WHERE r.app_id = ANY(\(apps)) AND r.day BETWEEN \(ReportQuery.formatDate(query.from))::date AND \(ReportQuery.formatDate(query.to))::date\(filters)\(present)
                """)
        case .hourly:
            parts.append("""
                SELECT r.app_id, hours.d, hours.hk, r.network, r.format, r.\(unsafeRaw: column)
                FROM rollup_devices_1h_compacted r \(wholeHours)
                WHERE r.app_id = ANY(\(apps)) AND \(hourRange)\(filters)\(present)
                """)
            parts.append("""
                SELECT r.app_id, \(unsafeRaw: rowDate), \(unsafeRaw: rowHour), r.network, r.format, r.\(unsafeRaw: column)
                FROM rollup_devices_15m_compacted r
                WHERE r.app_id = ANY(\(apps)) AND \(cutBuckets)\(filters)\(present)
                """)
        case .raw:
            preconditionFailure("raw events are not rollup parts")
        }
        let hashes = viewers ? "viewer_hashes" : "device_hashes"
        let sketches = (kind == .both ? ["device_hashes", "viewer_hashes"] : [hashes])
            .map { "(SELECT \(Self.sketch("h::hll_hashval")) FROM unnest(r.\($0)) AS h)" }.joined(separator: ", ")
        parts.append("""
            SELECT r.app_id, \(unsafeRaw: rowDate), \(unsafeRaw: rowHour), r.network, r.format,
                   \(unsafeRaw: sketches)
            FROM rollup_delta r
            WHERE r.app_id = ANY(\(apps)) AND r.bucket >= \(t0) AND r.bucket < \(t1) AND r.\(unsafeRaw: hashes) IS NOT NULL\(filters)
            """)
        return parts
    }

    /// One kind of device per group and local day: `d…` of its dimensions, `day`, `s`
    /// (and `v`, the viewers, for `both`).
    func audienceDays(_ kind: AudienceKind) -> PostgresQuery {
        let viewers = kind == .viewers
        let dimensions = audienceDimensions(viewers: viewers)
        let select = dimensions.map { dimensionSelect($0) + ", " }.joined()
        let positions = (0...dimensions.count).map { String($0 + 1) }.joined(separator: ", ")
        if source == .raw {
            precondition(kind != .both, "raw events are read per kind of device")
            let impressions = viewers ? " AND e.type = 'impression'" : ""
            let filters = viewers ? columnFilters("e") : columnFilters("e", sessionless: true)
            return """
                SELECT \(unsafeRaw: select)\(unsafeRaw: local("e.occurred_at"))::date AS day, \(unsafeRaw: Self.sketch("hll_hash_text(e.device)")) AS s
                FROM events e
                WHERE e.app_id = ANY(\(apps)) AND e.occurred_at >= \(t0) AND e.occurred_at < \(t1) AND e.device IS NOT NULL\(unsafeRaw: impressions)\(filters)\(timeFilters())
                GROUP BY \(unsafeRaw: positions)
                """
        }
        let both = kind == .both
        var sql: PostgresQuery = "SELECT \(unsafeRaw: select)s.d AS day, hll_union_agg(s.s) AS s\(unsafeRaw: both ? ", hll_union_agg(s.v) AS v" : "") FROM (\n"
        sql.append(Self.union(audienceParts(kind)))
        sql.append("\n) AS s (app_id, d, hk, network, format, s\(unsafeRaw: both ? ", v" : "")) WHERE true")
        sql.append(timeFilters())
        sql.append("\nGROUP BY \(unsafeRaw: positions)")
        return sql
    }

    /// The CTEs the audience columns come from: per group (`aud_active`, `aud_viewers`,
    /// `aud_days`) and over all groups (`aud_total`, one row).
    func audienceCTEs() -> [PostgresQuery] {
        var ctes: [PostgresQuery] = []
        let once = readsAudienceOnce
        if once { ctes.append("aud_both_days AS MATERIALIZED (\n\(audienceDays(.both))\n)") }
        // Each kind's per-day sketches: its own CTE `<name>_days` (column `s`), or a column of `aud_both_days`.
        func days(_ name: String, _ viewers: Bool) -> (table: String, column: String) {
            once ? ("aud_both_days", viewers ? "v" : "s") : (name + "_days", "s")
        }
        func perGroup(_ name: String, _ viewers: Bool, _ unique: String, _ daily: String) {
            let keys = audienceDimensions(viewers: viewers).map { "d\($0)" }
            let groupBy = keys.isEmpty ? "" : " GROUP BY " + keys.joined(separator: ", ")
            let (table, s) = days(name, viewers)
            if !once { ctes.append("\(unsafeRaw: name)_days AS MATERIALIZED (\n\(audienceDays(viewers ? .viewers : .active))\n)") }
            ctes.append("""
                \(unsafeRaw: name) AS (
                    SELECT \(unsafeRaw: keys.map { $0 + ", " }.joined())\(unsafeRaw: Self.cardinality("hll_union_agg(\(s))")) AS \(unsafeRaw: unique),
                           coalesce(sum(\(unsafeRaw: Self.cardinality(s))), 0)::bigint AS \(unsafeRaw: daily)
                    FROM \(unsafeRaw: table)\(unsafeRaw: groupBy)
                )
                """)
        }
        if needsActive { perGroup("aud_active", false, "active_devices", "device_days") }
        if needsViewers { perGroup("aud_viewers", true, "ad_viewers", "viewer_days") }
        if needsDays {
            // The range's local days, as `s.d`, grouped by the time dimensions (an hour is no day:
            // ReportQuery.parse refuses daily averages by hour).
            let time = query.dimensions.indices.filter { query.dimensions[$0].isTime }
            var filters: PostgresQuery = ""
            for filter in query.filters where filter.dimension.isTime {
                filters.append(" AND \(unsafeRaw: Self.rollupTimeExpression(filter.dimension)) = ANY(\(array: filter.values)::text[])")
            }
            let select = time.map { "(\(Self.rollupTimeExpression(query.dimensions[$0]))) COLLATE \"C\" AS d\($0), " }.joined()
            let groupBy = time.isEmpty ? "" : " GROUP BY " + time.map { "d\($0)" }.joined(separator: ", ")
            ctes.append("""
                aud_days AS (
                    SELECT \(unsafeRaw: select)count(*)::bigint AS days
                    FROM generate_series(\(ReportQuery.formatDate(query.from))::date::timestamp, \(ReportQuery.formatDate(query.to))::date::timestamp, interval '1 day') AS t,
                         LATERAL (SELECT t::date AS d) AS s
                    WHERE true\(filters)\(unsafeRaw: groupBy)
                )
                """)
        }
        func total(_ name: String, _ viewers: Bool, _ needed: Bool) -> (unique: String, daily: String) {
            guard needed else { return ("0::bigint", "0::bigint") }
            let (table, s) = days(name, viewers)
            return (
                "(SELECT \(Self.cardinality("hll_union_agg(\(s))")) FROM \(table))",
                "(SELECT coalesce(sum(\(Self.cardinality("x.s"))), 0)::bigint FROM (SELECT hll_union_agg(\(s)) AS s FROM \(table) GROUP BY day) AS x)"
            )
        }
        let active = total("aud_active", false, needsActive), viewers = total("aud_viewers", true, needsViewers)
        ctes.append("""
            aud_total AS (
                SELECT \(unsafeRaw: active.unique) AS active_devices, \(unsafeRaw: viewers.unique) AS ad_viewers,
                       \(unsafeRaw: active.daily) AS device_days, \(unsafeRaw: viewers.daily) AS viewer_days,
                       \(unsafeRaw: needsDays ? "(SELECT coalesce(sum(days), 0)::bigint FROM aud_days)" : "0::bigint") AS days
            )
            """)
        return ctes
    }

    /// `grouped` rows (`main`) with their audience columns filled from the audience CTEs,
    /// and the totals over all groups as `t_active_devices …` on every row.
    func withAudience(_ main: PostgresQuery) -> PostgresQuery {
        let names = query.dimensions.indices.map { "d\($0)" }
        // Raw dimensions can be NULL (an event without a platform); the rollups' never are.
        func on(_ alias: String, _ indices: [Int]) -> String {
            let conditions = indices.map { index in
                source == .raw && !query.dimensions[index].isTime
                    ? "\(alias).d\(index) IS NOT DISTINCT FROM g.d\(index)" : "\(alias).d\(index) = g.d\(index)"
            }
            return conditions.isEmpty ? "true" : conditions.joined(separator: " AND ")
        }
        let summed = Self.countNames.prefix(while: { $0 != "active_devices" }).map { "g.\($0)" }.joined(separator: ", ")
        var joins = ""
        if needsActive { joins += "\nLEFT JOIN aud_active a ON \(on("a", audienceDimensions(viewers: false)))" }
        if needsViewers { joins += "\nLEFT JOIN aud_viewers v ON \(on("v", audienceDimensions(viewers: true)))" }
        if needsDays { joins += "\nLEFT JOIN aud_days n ON \(on("n", query.dimensions.indices.filter { query.dimensions[$0].isTime }))" }
        let totals = Self.audienceNames.map { "t.\($0) AS t_\($0)" }.joined(separator: ", ")
        var sql: PostgresQuery = """
            SELECT \(unsafeRaw: names.map { "g.\($0), " }.joined())\(unsafeRaw: summed),
                   \(unsafeRaw: needsActive ? "coalesce(a.active_devices, 0)" : "0::bigint") AS active_devices,
                   \(unsafeRaw: needsViewers ? "coalesce(v.ad_viewers, 0)" : "0::bigint") AS ad_viewers,
                   \(unsafeRaw: needsActive ? "coalesce(a.device_days, 0)" : "0::bigint") AS device_days,
                   \(unsafeRaw: needsViewers ? "coalesce(v.viewer_days, 0)" : "0::bigint") AS viewer_days,
                   \(unsafeRaw: needsDays ? "coalesce(n.days, 0)" : "0::bigint") AS days, g.precise_micros, g.network_micros, g.network_impressions,
                   g.unrated, g.missing_fx, g.devices, \(unsafeRaw: totals)
            FROM (

            """
        sql.append(main)
        sql.append("\n) AS g\(unsafeRaw: joins)\nCROSS JOIN aud_total t")
        return sql
    }
}
