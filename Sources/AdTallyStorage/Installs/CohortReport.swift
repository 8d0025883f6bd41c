import AdTallyCore
import PostgresKit

/// A cohort report (DESIGN §13), the report engine's reading of installs: the cohorts of
/// the range (install days in the apps' own zone), grouped by the query's dimensions
/// (cohort, app, and what a device was first seen with), with each cohort metric's sums
/// over the cohorts mature at its day N.
///
/// Read from `installs` and the day rows kept beside them (Migrations/0023), exact (no
/// sketch): installs per cohort, the devices active on each day N, their impressions, and
/// their money priced exactly as `revenue` is (`ReportPlan.pricedSums`: reported revenue
/// in its currency, the rate card in force on the UTC date, a network's final earnings on
/// its record days spread over its impressions; converted and rounded once per group,
/// cohort, day N, UTC date and currency). A device's revenue on days 0…N is the sum of
/// its days' rounded buckets, so the rows add up to the totals.
struct CohortReport {
    let query: ReportQuery
    /// The record days (the networks' final earnings) of the cohorts' days.
    let record: [ReportPlan.RecordDay]
    let distributed: Bool
    /// The dirty ranges of the apps' money (a card change not yet re-priced, Migrations/0012).
    var dirty: [ReportPlan.DirtyRange] = []

    /// The days N the metrics read, and the largest.
    var days: [Int] { Array(Set(query.cohortMetrics.filter { $0.kind != .installs }.map(\.day))).sorted() }
    var maxDay: Int { days.last ?? 0 }
    var needsMoney: Bool { query.cohortMetrics.contains { $0.kind == .revenuePerInstall } }
    /// Whether a dimension or filter reads what devices were first seen with (then the
    /// day rows are joined to their installs).
    var needsInstalls: Bool {
        query.usedDimensions.contains { [.country, .platform, .appVersion].contains($0) }
    }
    /// Whether the report reads the cohort grain (Migrations/0024, summed over devices):
    /// where it is exact, grouped and filtered by cohort and app only, with no network's
    /// final earnings (spread by the UTC hour) in its money. Else the device rows.
    var readsGrain: Bool { !needsInstalls && record.isEmpty }

    /// The query the money of the cohorts is priced as: revenue over the cohorts' days.
    static func moneyQuery(_ query: ReportQuery, maxDay: Int) -> ReportQuery {
        var money = query
        money.metrics = [.revenue]
        money.cohortMetrics = []
        money.dimensions = []
        money.sort = []
        money.filters = query.filters.filter { $0.dimension == .app }
        money.to = query.to + maxDay
        return money
    }

    /// A dimension's column in the rows every part reads (`x`: app_id, c (the cohort),
    /// country, platform, app_version of the device's first sight).
    func column(_ dimension: ReportDimension) -> String {
        switch dimension {
        case .cohort: "x.c"
        case .app: "x.app_id"
        case .country: "x.country"
        case .platform: "x.platform"
        case .appVersion: "x.app_version"
        default: preconditionFailure("\(dimension) is not a cohort dimension")
        }
    }

    /// ` AND …` for the query's filters, on those rows.
    func filters() -> PostgresQuery {
        var sql: PostgresQuery = ""
        for filter in query.filters {
            if filter.dimension == .cohort {
                sql.append(" AND x.c = ANY(\(array: filter.values)::date[])")
            } else {
                sql.append(" AND \(unsafeRaw: column(filter.dimension)) = ANY(\(array: filter.values)::text[])")
            }
        }
        return sql
    }

    /// The statement: one row per group, `d0…` (text), installs of ended cohorts and of
    /// today's, then per day N of
    /// `days`: mature installs, active devices, impressions and revenue of days 0…N (micros),
    /// then the first missing FX rate and the unrated events.
    ///
    /// Install deltas not yet folded count at once, as the rollups' do: a device with
    /// pending rows (`touched`) has its install, cohort and days as the compactor will
    /// leave them (its earliest event, pending or stored; its stored days and its pending
    /// ones, under that cohort); every other device is read as stored.
    func statement() -> PostgresQuery { readsGrain ? grainStatement() : deviceStatement() }

    /// `WITH t (today), pend (the install deltas not yet folded), touched (their devices,
    /// with their cohort and first sight as the compactor will leave them, and `old_day`:
    /// the cohort their stored rows are under, NULL for none), touched_in (those whose
    /// cohort is in the range)`, ending with a comma.
    func prelude() -> PostgresQuery {
        let from = ReportQuery.formatDate(query.from), to = ReportQuery.formatDate(query.to)
        let apps: PostgresQuery = "\(array: query.apps)::text[]"
        var sql: PostgresQuery = "WITH t AS (SELECT (now() AT TIME ZONE \(query.timezone))::date AS today),\n"
        sql.append("""
            pend AS MATERIALIZED (
                SELECT d.app_id, d.device, (d.bucket AT TIME ZONE a.timezone)::date AS day, date_trunc('hour', d.bucket, 'UTC') AS hour,
                       d.network, d.format, d.country, d.currency, d.first_at, d.first_platform, d.first_version,
                       (d.first_at AT TIME ZONE a.timezone)::date AS first_day, d.impressions, d.taps, d.revenue_micros,
                       d.unpriced_impressions, d.unpriced_taps
                FROM install_delta d JOIN apps a USING (app_id)
                WHERE d.app_id = ANY(\(apps))
            ), touched AS MATERIALIZED (
                SELECT DISTINCT ON (p.app_id, p.device) p.app_id, p.device,
                       CASE WHEN e.earlier THEN p.first_day ELSE i.day END AS day,
                       CASE WHEN e.earlier THEN p.country ELSE i.country END::text AS country,
                       CASE WHEN e.earlier THEN p.first_platform ELSE i.platform END AS platform,
                       CASE WHEN e.earlier THEN p.first_version ELSE i.app_version END AS app_version,
                       i.day AS old_day
                FROM pend p LEFT JOIN installs i ON i.app_id = p.app_id AND i.device = p.device
                CROSS JOIN LATERAL (SELECT i.first_seen IS NULL OR (p.first_at, p.country, coalesce(p.first_platform, ''), coalesce(p.first_version, ''))
                                        < (i.first_seen, i.country, coalesce(i.platform, ''), coalesce(i.app_version, '')) AS earlier) AS e
                ORDER BY p.app_id, p.device, p.first_at, p.country, coalesce(p.first_platform, ''), coalesce(p.first_version, '')
            ), touched_in AS MATERIALIZED (
                -- Those whose cohort is in the range: only their stored rows are read again.
                SELECT * FROM touched WHERE day BETWEEN \(from)::date AND \(to)::date
            ),\n
            """)
        return sql
    }

    /// The rows of every touched device whose cohort is in the range, as the compactor will
    /// leave them: its stored rows of `table` and its pending ones (`pend`), of days 0…max
    /// that have passed, with `columns` (x. or p. before each).
    func touchedRows(_ table: String, _ columns: [String], pendingWhere: String = "true") -> PostgresQuery {
        let apps: PostgresQuery = "\(array: query.apps)::text[]"
        var sql: PostgresQuery = "SELECT x.app_id, x.device, x.day\(unsafeRaw: columns.map { ", x." + $0 }.joined()) FROM \(unsafeRaw: table) x JOIN touched_in tt USING (app_id, device) CROSS JOIN t\n"
        sql.append("WHERE x.app_id = ANY(\(apps)) AND x.day <= tt.day + \(unsafeRaw: String(maxDay)) AND x.day < t.today\n")
        sql.append("UNION ALL SELECT p.app_id, p.device, p.day\(unsafeRaw: columns.map { ", p." + $0 }.joined()) FROM pend p WHERE \(unsafeRaw: pendingWhere)")
        return sql
    }

    /// The statement read from each device's rows (Migrations/0023).
    func deviceStatement() -> PostgresQuery {
        let dimensions = query.dimensions
        let names = dimensions.indices.map { "d\($0)" }
        let from = ReportQuery.formatDate(query.from), to = ReportQuery.formatDate(query.to)
        let apps: PostgresQuery = "\(array: query.apps)::text[]"
        let select = dimensions.enumerated().map { "(\(column($0.element)))::text AS d\($0.offset), " }.joined()
        let groupKeys = names.map { $0 + ", " }.joined()
        // Stored rows with what their device was first seen with, when a dimension or filter needs it.
        let attributes = needsInstalls ? "i.country::text AS country, i.platform, i.app_version" : "NULL::text AS country, NULL::text AS platform, NULL::text AS app_version"
        let join = needsInstalls ? " JOIN installs i ON i.app_id = x.app_id AND i.device = x.device" : ""
        let untouched = "NOT EXISTS (SELECT 1 FROM touched tt WHERE tt.app_id = x.app_id AND tt.device = x.device)"
        let inRange = "x.app_id = ANY($apps) AND x.cohort BETWEEN '\(from)'::date AND '\(to)'::date AND x.day <= x.cohort + \(maxDay) AND x.day < t.today"
        func rangeSQL(_ text: String) -> PostgresQuery {
            // `$apps` stands for the apps' bind in the fragments above.
            var sql: PostgresQuery = ""
            var rest = Substring(text)
            while let marker = rest.range(of: "$apps") {
                sql.append("\(unsafeRaw: String(rest[..<marker.lowerBound]))")
                sql.append(apps)
                rest = rest[marker.upperBound...]
            }
            sql.append("\(unsafeRaw: String(rest))")
            return sql
        }
        var sql = prelude()
        sql.append("""
            inst AS (
                SELECT \(unsafeRaw: select)x.c, count(*)::bigint AS installs
                FROM (SELECT x.app_id, x.day AS c, x.country::text AS country, x.platform, x.app_version FROM installs x
                      WHERE x.app_id = ANY(\(apps)) AND x.day BETWEEN \(from)::date AND \(to)::date AND \(unsafeRaw: untouched)
                      UNION ALL
                      SELECT tt.app_id, tt.day, tt.country, tt.platform, tt.app_version FROM touched_in tt) AS x
                WHERE true\(filters())
                GROUP BY \(unsafeRaw: groupKeys)x.c
            ), act AS (
                SELECT \(unsafeRaw: select)x.c, x.n, count(*)::bigint AS active, sum(x.impressions)::bigint AS impressions
                FROM (
            """)
        sql.append(rangeSQL("""
                    SELECT x.app_id, x.cohort AS c, \(attributes), x.day - x.cohort AS n, x.impressions
                    FROM install_days x\(join) CROSS JOIN t
                    WHERE \(inRange) AND \(untouched)
                    UNION ALL
                    SELECT u.app_id, tt.day, tt.country, tt.platform, tt.app_version, u.day - tt.day, sum(u.impressions)
                    FROM (SELECT x.app_id, x.device, x.day, x.impressions FROM install_days x JOIN touched_in tt USING (app_id, device) CROSS JOIN t
                          WHERE x.app_id = ANY($apps) AND x.day <= tt.day + \(maxDay) AND x.day < t.today
                          UNION ALL SELECT p.app_id, p.device, p.day, p.impressions FROM pend p) AS u
                    JOIN touched_in tt USING (app_id, device) CROSS JOIN t
                    WHERE u.day <= tt.day + \(maxDay) AND u.day < t.today
                    GROUP BY u.app_id, u.device, tt.day, tt.country, tt.platform, tt.app_version, u.day
            """))
        sql.append("""
                ) AS x
                WHERE true\(filters())
                GROUP BY \(unsafeRaw: groupKeys)x.c, x.n
            )
            """)
        var parts = countParts()
        if needsMoney {
            let plan = ReportPlan(Self.moneyQuery(query, maxDay: maxDay), distributed: distributed, record: record, source: .raw)
            let record = plan.hasRecord ? ", x.app_id, x.hour" : ""
            sql.append("""
                ,
                pending AS MATERIALIZED (
                    SELECT \(unsafeRaw: select)x.c, x.n, (x.hour AT TIME ZONE 'UTC')::date AS u, x.network, x.format,
                           0::bigint AS requests, 0::bigint AS loads, sum(x.impressions)::bigint AS impressions, 0::bigint AS errors, sum(x.taps)::bigint AS taps,
                           0::bigint AS action_cancels, 0::bigint AS expiries, 0::bigint AS wasted_fills, 0::bigint AS sessions,
                           NULL::hll AS devices, sum(x.revenue_micros)::numeric AS revenue_micros, x.currency, x.event_country AS country,
                           sum(x.unpriced_impressions)::bigint AS ui, sum(x.unpriced_taps)::bigint AS ut, NULL::numeric AS est, NULL::bigint AS unrated_adjust,
                           0::numeric AS precise_micros\(unsafeRaw: plan.hasRecord ? ", x.app_id, x.hour AS h" : "")
                    FROM (
                """)
            let columns = "network, format, country::text AS event_country, currency, impressions, taps, revenue_micros, unpriced_impressions, unpriced_taps"
            sql.append(rangeSQL("""
                        SELECT x.app_id, x.cohort AS c, \(attributes), x.day - x.cohort AS n, x.hour, \(columns.split(separator: ",").map { "x." + $0.trimmingCharacters(in: .whitespaces) }.joined(separator: ", "))
                        FROM install_day_revenue x\(join) CROSS JOIN t
                        WHERE \(inRange) AND \(untouched)
                        UNION ALL
                        SELECT u.app_id, tt.day, tt.country, tt.platform, tt.app_version, u.day - tt.day, u.hour, u.network, u.format, u.event_country, u.currency,
                               u.impressions, u.taps, u.revenue_micros, u.unpriced_impressions, u.unpriced_taps
                        FROM (SELECT x.app_id, x.device, x.day, x.hour, \(columns.split(separator: ",").map { "x." + $0.trimmingCharacters(in: .whitespaces) }.joined(separator: ", "))
                              FROM install_day_revenue x JOIN touched_in tt USING (app_id, device) CROSS JOIN t
                              WHERE x.app_id = ANY($apps) AND x.day <= tt.day + \(maxDay) AND x.day < t.today
                              UNION ALL
                              SELECT p.app_id, p.device, p.day, p.hour, \(columns.split(separator: ",").map { "p." + $0.trimmingCharacters(in: .whitespaces) }.joined(separator: ", "))
                              FROM pend p WHERE p.impressions + p.taps > 0) AS u
                        JOIN touched_in tt USING (app_id, device) CROSS JOIN t
                        WHERE u.day <= tt.day + \(maxDay) AND u.day < t.today
                """))
            sql.append("""
                    ) AS x
                    WHERE true\(filters())
                    GROUP BY \(unsafeRaw: groupKeys)x.c, x.n, u, x.network, x.format, x.currency, x.event_country\(unsafeRaw: record)
                ),
                \(unsafeRaw: RatePricing.pricesCTE("prices", of: "pending"))
                """)
            if plan.hasRecord { sql.append(",\n\(plan.recordCTE())") }
            parts.append(money(&sql, plan: plan))
        }
        finish(&sql, parts: parts)
        return sql
    }

    /// The statement read from the cohort grain (`readsGrain`, Migrations/0024): its sums
    /// per cohort and day, less the stored rows of the devices with install deltas pending
    /// (`touched`) under the cohort they are stored under, plus those devices' rows as the
    /// compactor will leave them; money on the days a card change left dirty is priced now
    /// from every device's rows, as the rollups' is (Migrations/0012).
    func grainStatement() -> PostgresQuery {
        let names = query.dimensions.indices.map { "d\($0)" }
        let from = ReportQuery.formatDate(query.from), to = ReportQuery.formatDate(query.to)
        let apps: PostgresQuery = "\(array: query.apps)::text[]"
        let select = query.dimensions.enumerated().map { "(\(column($0.element)))::text AS d\($0.offset), " }.joined()
        let groupKeys = names.map { $0 + ", " }.joined()
        let maxDay = String(self.maxDay)
        // The rows of a table `x` (cohort, day) of the range's cohorts, days 0…max.
        let cohorts: PostgresQuery = "x.app_id = ANY(\(apps)) AND x.cohort BETWEEN \(from)::date AND \(to)::date AND x.day <= x.cohort + \(unsafeRaw: maxDay)"
        var sql = prelude()
        sql.append("""
            touched_old AS MATERIALIZED (
                -- Touched devices stored under a cohort of the range: their stored rows leave its sums.
                SELECT app_id, device, old_day FROM touched WHERE old_day BETWEEN \(from)::date AND \(to)::date
            ), counted AS (
                SELECT x.app_id, x.cohort AS c, x.day - x.cohort AS n, x.devices AS active, x.impressions
                FROM cohort_days x WHERE \(cohorts)
                UNION ALL
                SELECT x.app_id, x.cohort, x.day - x.cohort, -1, -x.impressions
                FROM install_days x JOIN touched_old o USING (app_id, device) WHERE \(cohorts) AND x.cohort = o.old_day
                UNION ALL
                SELECT u.app_id, tt.day, u.day - tt.day, 1, sum(u.impressions)
                FROM (\(touchedRows("install_days", ["impressions"]))) AS u JOIN touched_in tt USING (app_id, device)
                WHERE u.day <= tt.day + \(unsafeRaw: maxDay)
                GROUP BY u.app_id, u.device, tt.day, u.day
            ), inst AS (
                -- A cohort's installs: its devices of day 0.
                SELECT \(unsafeRaw: select)x.c, sum(x.active)::bigint AS installs
                FROM counted x WHERE x.n = 0\(filters())
                GROUP BY \(unsafeRaw: groupKeys)x.c
            ), act AS (
                SELECT \(unsafeRaw: select)x.c, x.n, sum(x.active)::bigint AS active, sum(x.impressions)::bigint AS impressions
                FROM counted x CROSS JOIN t WHERE x.c + x.n < t.today\(filters())
                GROUP BY \(unsafeRaw: groupKeys)x.c, x.n
            )
            """)
        var parts = countParts()
        if needsMoney {
            let plan = ReportPlan(Self.moneyQuery(query, maxDay: self.maxDay), distributed: distributed, dirty: dirty, source: .raw)
            let dirty = !self.dirty.isEmpty
            // The grain's money is per UTC date over every network and format: a date with
            // any dirty key is priced now, whole, from the device rows.
            func isDirty(_ u: String) -> String {
                "EXISTS (SELECT 1 FROM dirty_days dd WHERE dd.app_id = x.app_id AND dd.u = \(u))"
            }
            let utc = "(x.hour AT TIME ZONE 'UTC')::date"
            let unpriced = "x.network, x.format, x.country::text, x.currency"
            if dirty { sql.append(",\n\(plan.dirtyDaysCTE())") }
            sql.append("""
                ,
                pending AS MATERIALIZED (
                    SELECT \(unsafeRaw: select)x.c, x.n, x.u, x.network, x.format,
                           0::bigint AS requests, 0::bigint AS loads, sum(x.impressions)::bigint AS impressions, 0::bigint AS errors, sum(x.taps)::bigint AS taps,
                           0::bigint AS action_cancels, 0::bigint AS expiries, 0::bigint AS wasted_fills, 0::bigint AS sessions,
                           NULL::hll AS devices, sum(x.revenue_micros)::numeric AS revenue_micros, x.currency, x.country,
                           sum(x.ui)::bigint AS ui, sum(x.ut)::bigint AS ut, sum(x.est) AS est, sum(x.unrated)::bigint AS unrated_adjust,
                           0::numeric AS precise_micros
                    FROM (
                        -- The grain's priced money (a row's estimate and unrated events as stored; no country).
                        SELECT x.app_id, x.cohort AS c, x.day - x.cohort AS n, x.utc_day AS u, ''::text AS network, ''::text AS format, NULL::text AS country, x.currency,
                               0::bigint AS impressions, 0::bigint AS taps, x.reported AS revenue_micros, 0::bigint AS ui, 0::bigint AS ut,
                               x.estimated AS est, x.unrated
                        FROM cohort_priced_day x CROSS JOIN t WHERE \(cohorts) AND x.day < t.today\(unsafeRaw: dirty ? " AND NOT " + isDirty("x.utc_day") : "")
                """)
            if dirty {
                sql.append("""
                    \nUNION ALL
                        -- Dirty UTC dates: every device's rows, priced now.
                        SELECT x.app_id, x.cohort, x.day - x.cohort, \(unsafeRaw: utc), \(unsafeRaw: unpriced), x.impressions, x.taps, x.revenue_micros,
                               x.unpriced_impressions, x.unpriced_taps, NULL::numeric, NULL::bigint
                        FROM install_day_revenue x CROSS JOIN t WHERE \(cohorts) AND x.day < t.today AND \(unsafeRaw: isDirty(utc))
                    """)
            }
            sql.append("""
                \nUNION ALL
                        -- Touched devices: their stored rows out of the cohort they are stored under…
                        SELECT x.app_id, x.cohort, x.day - x.cohort, \(unsafeRaw: utc), \(unsafeRaw: unpriced), -x.impressions, -x.taps, -x.revenue_micros,
                               -x.unpriced_impressions, -x.unpriced_taps, NULL::numeric, NULL::bigint
                        FROM install_day_revenue x JOIN touched_old o USING (app_id, device) CROSS JOIN t
                        WHERE \(cohorts) AND x.cohort = o.old_day AND x.day < t.today
                        UNION ALL
                        -- …and all their rows, stored and pending, into the cohort they will be under.
                        SELECT x.app_id, tt.day, x.day - tt.day, \(unsafeRaw: utc), \(unsafeRaw: unpriced), x.impressions, x.taps, x.revenue_micros,
                               x.unpriced_impressions, x.unpriced_taps, NULL::numeric, NULL::bigint
                        FROM (\(touchedRows("install_day_revenue", ["hour", "network", "format", "country", "currency", "impressions", "taps", "revenue_micros", "unpriced_impressions", "unpriced_taps"], pendingWhere: "p.impressions + p.taps > 0"))) AS x
                        JOIN touched_in tt USING (app_id, device) CROSS JOIN t
                        WHERE x.day <= tt.day + \(unsafeRaw: maxDay) AND x.day < t.today
                    ) AS x
                    WHERE true\(filters())
                    GROUP BY \(unsafeRaw: groupKeys)x.c, x.n, x.u, x.network, x.format, x.currency, x.country
                ),
                \(unsafeRaw: RatePricing.pricesCTE("prices", of: "pending"))
                """)
            parts.append(money(&sql, plan: plan))
        }
        finish(&sql, parts: parts)
        return sql
    }

    /// The parts of installs (CTE `inst`) and of active devices and impressions (`act`).
    func countParts() -> [String] {
        let groupKeys = query.dimensions.indices.map { "d\($0), " }.joined()
        return [
            "SELECT \(groupKeys)c, NULL::int AS n, installs, 0::bigint AS active, 0::bigint AS impressions, 0::numeric AS revenue, NULL::text AS missing_fx, 0::bigint AS unrated FROM inst",
            "SELECT \(groupKeys)c, n, 0::bigint, active, impressions, 0::numeric, NULL::text, 0::bigint FROM act",
        ]
    }

    /// Appends the CTE `money` (the rows of `pending` priced and summed per group, cohort,
    /// day N, UTC date and currency, then converted: `ReportPlan.pricedSums`), and returns
    /// its part.
    func money(_ sql: inout PostgresQuery, plan: ReportPlan) -> String {
        let keys = query.dimensions.indices.map { "d\($0)" } + ["c", "n"]
        sql.append(",\nmoney AS (\n")
        sql.append(plan.pricedSums(names: keys, rows: "pending AS s", dimensionList: keys.map { "s.\($0), " }.joined()))
        sql.append("\n)")
        let groupKeys = query.dimensions.indices.map { "d\($0), " }.joined()
        return "SELECT \(groupKeys)c, n, 0::bigint, 0::bigint, 0::bigint, reported_micros + estimated_micros + network_micros, missing_fx, unrated FROM money"
    }

    /// The statement's end, after its CTEs (`parts`: per group, cohort and day N or none,
    /// installs, active devices, impressions, revenue, the missing FX rate and unrated events).
    func finish(_ sql: inout PostgresQuery, parts: [String]) {
        let dimensions = query.dimensions
        let names = dimensions.indices.map { "d\($0)" }
        sql.append(",\nparts AS (\n\(unsafeRaw: parts.joined(separator: "\nUNION ALL\n"))\n)\n")
        var columns = ["coalesce(sum(p.installs) FILTER (WHERE p.c < t.today), 0)::bigint", "coalesce(sum(p.installs) FILTER (WHERE p.c >= t.today), 0)::bigint"]
        for day in days {
            let mature = "p.c + \(day) < t.today"
            columns.append("coalesce(sum(p.installs) FILTER (WHERE \(mature)), 0)::bigint")
            columns.append("coalesce(sum(p.active) FILTER (WHERE p.n = \(day) AND \(mature)), 0)::bigint")
            columns.append("coalesce(sum(p.impressions) FILTER (WHERE p.n <= \(day) AND \(mature)), 0)::bigint")
            columns.append("coalesce(sum(p.revenue) FILTER (WHERE p.n <= \(day) AND \(mature)), 0)::numeric(60, 0)::text")
        }
        columns.append("min(p.missing_fx)")
        columns.append("coalesce(sum(p.unrated), 0)::bigint")
        let order = query.sort.compactMap { key -> String? in
            guard case .dimension(let dimension) = key.field, let index = dimensions.firstIndex(of: dimension) else { return nil }
            return "p.d\(index) COLLATE \"C\" \(key.isDescending ? "DESC" : "ASC") NULLS FIRST"
        }
        sql.append("""
            SELECT \(unsafeRaw: names.map { "p.\($0), " }.joined())\(unsafeRaw: columns.joined(separator: ", "))
            FROM parts p CROSS JOIN t
            \(unsafeRaw: names.isEmpty ? "" : "GROUP BY " + names.map { "p.\($0)" }.joined(separator: ", "))
            -- A group is a group of installs: a cohort the grain holds only emptied rows of
            -- (its devices moved to an earlier one) is none.
            HAVING coalesce(sum(p.installs), 0) <> 0
            \(unsafeRaw: names.isEmpty ? "" : "ORDER BY " + order.joined(separator: ", "))
            """)
    }

    /// Every row of the report, in its order, and the impressions and taps no rate card
    /// entry priced (a missing FX rate throws `ReportCurrencyError`).
    func rows(on connection: PostgresConnection) throws -> (rows: [ReportRow], unrated: Int64) {
        let width = query.dimensions.count
        var rows: [ReportRow] = []
        var unrated: Int64 = 0
        for row in try connection.query(statement()) {
            var counts = ReportCounts()
            counts.cohort.installs = try row.decode(width, as: Int64.self)
            counts.cohort.immatureInstalls = try row.decode(width + 1, as: Int64.self)
            var column = width + 2
            for day in days {
                let revenue = try row.decode(column + 3, as: String.self)
                guard let micros = Int128(revenue) else {
                    throw PostgresError(kind: .decoding, message: "revenue_per_install_d\(day): \(revenue) is not a whole number of micros")
                }
                counts.cohort.days[day] = CohortDay(
                    matureInstalls: try row.decode(column, as: Int64.self), active: try row.decode(column + 1, as: Int64.self),
                    revenueMicros: micros, impressions: try row.decode(column + 2, as: Int64.self)
                )
                column += 4
            }
            if let missing = try row.decode(column, as: String?.self) {
                throw ReportCurrencyError(missing: missing, reportCurrency: query.currency)
            }
            unrated += try row.decode(column + 1, as: Int64.self)
            // A grouping with no cohort at all (no install in the range) is no row.
            if width > 0 || counts.cohort.installs + counts.cohort.immatureInstalls > 0 || !rows.isEmpty {
                rows.append(ReportRow(dimensions: try (0..<width).map { try row.decode($0, as: String?.self) }, counts: counts))
            }
        }
        return (rows, unrated)
    }

    /// The notes a cohort report adds: when day N is mature, and where install history starts.
    func notes(on connection: PostgresConnection) throws -> [String] {
        let today = try connection.query("SELECT (now() AT TIME ZONE \(query.timezone))::date - DATE '1970-01-01'").first!.decode(0, as: Int.self)
        var lines = [
            "cohorts are install days in \(query.timezone) (the app's own zone): a device's day 0 is the local day AdTally first saw any event of it, its day N the N-th day after; "
                + "a value of day N counts only the cohorts whose day N has fully passed (the others show null, never a partial value)"
        ]
        var youngest: [String] = []
        for day in days {
            let last = min(query.to, today - 1 - day)
            youngest.append(last >= query.from ? "d\(day): \(ReportQuery.formatDate(last))" : "d\(day): none yet")
        }
        if !youngest.isEmpty { lines.append("youngest mature cohort: " + youngest.joined(separator: ", ")) }
        if needsMoney {
            lines.append(
                "revenue per install: each device day's revenue as revenue is priced (reported amounts, the rate card on the UTC date, a network's final earnings on its record days), "
                    + "summed per row, cohort, day N, UTC date and currency, converted at that date's FX rate and rounded half to even once, then added up over days 0…N"
            )
        }
        // An app's install history starts with its earliest install: one index lookup per
        // app (on Citus one shard each; a correlated subquery over unnest() is refused there).
        for app in query.apps {
            guard let first = try connection.query("SELECT min(day) - DATE '1970-01-01' FROM installs WHERE app_id = \(app)").first?.decode(0, as: Int?.self) ?? nil,
                  first <= query.to else { continue }
            // Its first month's cohorts hold the devices installed before it most (each shows
            // up on the first day it is active again): said for ranges that reach into it.
            guard query.from <= first + 30 else { continue }
            lines.append(
                "\(app)'s install history starts on \(ReportQuery.formatDate(first)): devices installed before AdTally saw them (older events were not kept, or the app sent none) "
                    + "are cohorted on their first-seen day, so that day's cohort and those of the days after it hold long-installed devices too"
            )
        }
        // Device rows older than the app's retention are gone (RetentionPruner records from
        // which local day they are kept); the cohort grain keeps their sums. A report read
        // from the device rows (a first-sight attribute, a network's final earnings) counts
        // only the days still kept: said when the range reaches before them.
        if !readsGrain {
            for app in query.apps {
                guard let kept = try connection.query("""
                    SELECT device_rows_from - DATE '1970-01-01' FROM apps WHERE app_id = \(app)
                    """).first?.decode(0, as: Int?.self), query.from < kept else { continue }
                lines.append(
                    "\(app)'s device rows start on \(ReportQuery.formatDate(kept)) (older ones went with its retention): "
                        + "read by \(needsInstalls ? "a first-sight attribute" : "a network's final earnings"), this report counts only the days from then on; "
                        + "by cohort alone it counts them all"
                )
            }
        }
        // Erasures (DESIGN §15) took their devices out of these cohorts: the numbers changed
        // after the fact, by design, and a reader comparing with an older copy should know.
        for app in query.apps {
            let erased = try ErasureStore.erasedCohorts(
                app: app, first: ReportQuery.formatDate(query.from), last: ReportQuery.formatDate(query.to), on: connection
            )
            guard erased.jobs > 0 else { continue }
            lines.append(
                "\(app): \(erased.jobs) erasure\(erased.jobs == 1 ? "" : "s") of up to \(erased.devices) device\(erased.devices == 1 ? "" : "s") (privacy requests) "
                    + "removed devices installed in this range: their installs, days and money are no longer counted in these cohorts"
            )
        }
        return lines
    }
}
