import AdTallyCore
import PostgresKit

/// The money of a report (DESIGN §3): each row priced by the rate card or a network's
/// earnings, summed exactly per group, UTC date and currency, then converted and
/// rounded once (`grouped` says the rules).
extension ReportPlan {
    /// Steps 1 and 2 of money over `rows` (the source's rows, dimension values `names`),
    /// then step 3 (`convertedSums`).
    func pricedSums(names: [String], rows: PostgresQuery, dimensionList: String) -> PostgresQuery {
        // 1. Each row priced: reported revenue in its currency, or unpriced counts at the rate
        //    in force on its UTC date (the country's entry, else the any-country one), in its
        //    currency; a priced rollup row as it is stored.
        //    On Citus the rollups' rows are joined to their apps, a join that keeps every row
        //    (each row's app is in apps): a UNION of per-app tables whose parts join anything
        //    (the hours, the prices) and that is then grouped is pushed down to the
        //    workers only with an equality on app_id in the join tree; without it a report of
        //    several apps with money failed there ("complex joins are only supported when all
        //    distributed tables are co-located and joined on their distribution columns").
        //    Only there: on one node the join divides the UNION's estimated rows by ~200 (its
        //    app_id has no statistics), and the plans chosen on that estimate (nested loops
        //    over the card) took a 30-day demo report from 23 ms to 0.45 s, and all apps' from
        //    0.15 s to 6 s.
        //    A row in a day whose revenue is a network's final earnings (`RevenueOfRecord`) has
        //    no SDK or rate-card money: its impressions' share of those earnings instead.
        func sdk(_ amount: String, _ zero: String = "0::numeric") -> String { hasRecord ? "CASE WHEN rec.id IS NULL THEN \(amount) ELSE \(zero) END" : amount }
        let priced: PostgresQuery = """
            SELECT \(unsafeRaw: dimensionList)s.u, \(unsafeRaw: RatePricing.currency("s")) AS cur,
                   \(unsafeRaw: Self.countList), s.devices,
                   \(unsafeRaw: sdk(RatePricing.reported("s", "s.revenue_micros"))) AS reported,
                   \(unsafeRaw: sdk("coalesce(s.est, \(RatePricing.estimated("s.ui", "s.ut")))")) AS estimated,
                   \(unsafeRaw: sdk("coalesce(s.unrated_adjust, \(RatePricing.unrated("s", "s.ui", "s.ut")))", "0::bigint")) AS unrated,
                   \(unsafeRaw: needsPrecise ? sdk(RatePricing.reported("s", "s.precise_micros")) : "0::numeric") AS precise,
                   \(unsafeRaw: hasRecord ? "CASE WHEN rec.id IS NOT NULL AND rec.w > 0 THEN rec.micros * s.impressions / rec.w ELSE 0 END" : "0::numeric") AS network,
                   \(unsafeRaw: hasRecord ? "CASE WHEN rec.id IS NOT NULL THEN s.impressions ELSE 0 END" : "0::bigint") AS network_impressions
            FROM \(rows)\(unsafeRaw: source == .raw || !distributed ? "" : "\nJOIN apps AS known ON known.app_id = s.app_id")
            \(unsafeRaw: RatePricing.join("s", prices: "prices"))\(unsafeRaw: hasRecord ? "\n" + recordJoin : "")
            """
        // 2. Summed exactly per group, UTC date and currency (a bucket). Columns that are
        //    zero in every row (precise revenue but from raw events, a network's earnings
        //    without a record day) are not summed: each sum costs per row (~0.3 ms a report).
        let bucketSums = Self.rollupCounts.enumerated().map { index, name in
            needed.contains(ReportCount(rawValue: index)!) ? "sum(p.\(name)) AS \(name)" : "0::numeric AS \(name)"
        }.joined(separator: ", ")
        let bucketKeys = (names.map { "p.\($0)" } + ["p.u", "p.cur"]).joined(separator: ", ")
        let main = convertedSums(keys: names, buckets: """
            SELECT \(unsafeRaw: bucketKeys.isEmpty ? "" : bucketKeys + ", ")\(unsafeRaw: bucketSums), \(unsafeRaw: needsDevices ? "hll_union_agg(p.devices)" : "NULL::hll") AS devices,
                   sum(p.reported) AS reported, sum(p.estimated) AS estimated, sum(p.unrated) AS unrated,
                   \(unsafeRaw: needsPrecise ? "sum(p.precise)" : "0::numeric") AS precise,
                   \(unsafeRaw: hasRecord ? "sum(p.network)" : "0::numeric") AS network,
                   \(unsafeRaw: hasRecord ? "sum(p.network_impressions)" : "0::numeric") AS network_impressions
            FROM (
            \(priced)
            ) AS p
            GROUP BY \(unsafeRaw: bucketKeys)
            """)
        return main
    }

    /// Step 3 of money (see `grouped`): each bucket of `buckets` (columns `keys`, `u` (its
    /// UTC date), `cur`, the 9 counts, `devices`, `reported`, `estimated`, `unrated`)
    /// converted at its date's FX rate and rounded half to even once, then summed per
    /// `keys` (all buckets as one group when there are none). The rows come out in the
    /// order of `keys` when the buckets do (a lateral lookup per bucket, then a grouping
    /// over sorted input: `ReportGrain` streams them that way).
    func convertedSums(keys: [String], buckets: PostgresQuery) -> PostgresQuery {
        let rc = query.currency
        // Precise reported revenue, converted and rounded as reported revenue is.
        let precise: PostgresQuery = needsPrecise
            ? "coalesce(sum(CASE WHEN s.cur = \(rc) THEN s.precise ELSE adtally_div_half_even(s.precise * fx.to_rate, fx.from_rate) END), 0)"
            : "0::numeric"
        let keyList = keys.map { "s.\($0), " }.joined()
        let groupBy = keys.isEmpty ? "" : "\nGROUP BY " + keys.map { "s.\($0)" }.joined(separator: ", ")
        let devices = needsDevices ? "hll_union_agg(s.devices)" : "NULL::hll"
        return """
            SELECT \(unsafeRaw: keyList)\(unsafeRaw: countSums("s")),
                coalesce(sum(CASE WHEN s.cur = \(rc) THEN s.reported ELSE adtally_div_half_even(s.reported * fx.to_rate, fx.from_rate) END), 0) AS reported_micros,
                coalesce(sum(CASE WHEN s.cur = \(rc) THEN \(unsafeRaw: Self.roundHalfEven("s.estimated")) ELSE adtally_div_half_even(s.estimated * fx.to_rate, fx.from_rate) END), 0) AS estimated_micros,
                \(unsafeRaw: Self.cardinality(devices)) AS unique_devices, \(unsafeRaw: Self.audienceZeros),
                \(precise) AS precise_micros,
                -- A network's earnings: in the report currency already, rounded once per row
                -- (a row that holds a whole network day holds its earnings exactly).
                \(unsafeRaw: hasRecord
                    ? "coalesce(\(Self.roundHalfEven("sum(s.network)")), 0) AS network_micros, coalesce(sum(s.network_impressions), 0)::bigint AS network_impressions"
                    : "0::numeric AS network_micros, 0::bigint AS network_impressions"),
                coalesce(sum(s.unrated), 0)::bigint AS unrated,
                -- "date from missing": the currency of the bucket, and the one without a rate that day.
                min(CASE WHEN s.cur <> \(rc) AND fx.to_rate IS NULL AND (s.reported <> 0 OR s.estimated <> 0)
                         THEN s.u::text || ' ' || s.cur || ' '
                              || CASE WHEN NOT EXISTS (SELECT 1 FROM fx_rates x WHERE x.day = s.u) THEN '*'
                                      WHEN EXISTS (SELECT 1 FROM fx_rates x WHERE x.day = s.u AND x.currency = \(rc)) THEN s.cur ELSE \(rc) END END) AS missing_fx,
                \(unsafeRaw: devices) AS devices
            FROM (
            \(buckets)
            ) AS s
            LEFT JOIN LATERAL (
                -- Units of the report currency and of the bucket currency per one base, on its UTC date.
                SELECT t.rate AS to_rate, f.rate AS from_rate
                FROM fx_rates t JOIN fx_rates f ON f.day = t.day AND f.base = t.base AND f.currency = s.cur
                WHERE s.cur <> \(rc) AND t.day = s.u AND t.currency = \(rc)
                ORDER BY t.base LIMIT 1
            ) AS fx ON true\(unsafeRaw: groupBy)
            """
    }
}

extension ReportPlan {
    /// `amount` (numeric) rounded half to even to a whole number, as
    /// `adtally_div_half_even(amount, 1)` rounds it, in fewer numeric operations (round,
    /// then one step back where the amount was exactly half way from an odd whole): each
    /// priced bucket of a report is rounded so, and the function's div and three mods
    /// were a tenth of the default report's time. `amount` is evaluated more than once:
    /// a column or an aggregate (computed once), not an expression with side effects.
    static func roundHalfEven(_ amount: String) -> String {
        "(round(\(amount)) - CASE WHEN abs(mod(\(amount), 2)) = 0.5 THEN sign(\(amount)) ELSE 0 END)"
    }
}
