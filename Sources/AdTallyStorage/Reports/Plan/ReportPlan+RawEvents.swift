import AdTallyCore
import PostgresKit

/// The raw-events source of a report (`Source.raw`): dimensions the rollups do not keep
/// (placement, country, platform, versions, size, error code, revenue precision) are
/// grouped from `events`, partition-pruned by the range.
extension ReportPlan {
    /// The raw events' counts, as the rollups define them; 0 for counts no metric reads.
    var rawCounts: String {
        let definitions: [(ReportCount, String)] = [
            (.requests, "count(*) FILTER (WHERE e.type = 'request')"), (.loads, "count(*) FILTER (WHERE e.type = 'load')"),
            (.impressions, "count(*) FILTER (WHERE e.type = 'impression')"), (.errors, "count(*) FILTER (WHERE e.type = 'error')"),
            (.taps, "count(*) FILTER (WHERE e.type = 'tap')"), (.actionCancels, "count(*) FILTER (WHERE e.type = 'action_cancel')"),
            (.expiries, "count(*) FILTER (WHERE e.type = 'expiry')"), (.wastedFills, "count(*) FILTER (WHERE e.type = 'expiry' AND e.shown = false)"),
            (.sessions, "count(*) FILTER (WHERE e.type = 'session')"),
        ]
        return definitions.map { count, sql in
            (needed.contains(count) ? sql : "0::bigint") + " AS " + Self.countNames[count.rawValue]
        }.joined(separator: ", ")
    }

    /// The raw events of the range grouped by the dimensions (`select` their values as
    /// `d0…`), in the columns of a rollup part; with money, also by UTC date, network,
    /// format, country and currency, what rates and FX apply by.
    func rawRows(select: String, dimensionCount n: Int) -> PostgresQuery {
        let typed = "e.type IN ('impression', 'tap')"
        let sketch = needsDevices ? Self.sketch("hll_hash_text(e.device)") + " FILTER (WHERE e.device IS NOT NULL AND e.type <> 'session')" : "NULL::hll"
        // Money needs each group split by UTC date, network, format, country and currency
        // (what rates and FX apply by); counts alone need only the dimensions.
        // With a network's earnings, also by app and UTC hour (the instants they are placed on).
        let positions = needsMoney ? (1...(n + 3)).map(String.init) + ["\(n + 14)", "\(n + 15)"] + (hasRecord ? ["\(n + 22)", "\(n + 23)"] : []) : (0..<n).map { String($0 + 1) }
        func money(_ sql: String, else other: String) -> String { needsMoney ? sql : other }
        var rows: PostgresQuery = """
            SELECT \(unsafeRaw: select)\(unsafeRaw: money("(e.occurred_at AT TIME ZONE 'UTC')::date AS u, e.network, e.format", else: "NULL::date AS u, NULL::text AS network, NULL::text AS format")),
                \(unsafeRaw: rawCounts),
                \(unsafeRaw: money("coalesce(sum(e.revenue_micros::numeric) FILTER (WHERE \(typed)), 0)", else: "0::numeric")) AS revenue_micros,
                \(unsafeRaw: money("CASE WHEN \(typed) THEN coalesce(e.currency::text, '') END", else: "NULL::text")) AS currency,
                \(unsafeRaw: money("CASE WHEN \(typed) THEN e.country::text END", else: "NULL::text")) AS country,
                \(unsafeRaw: money("count(*) FILTER (WHERE e.type = 'impression' AND e.revenue_micros IS NULL)", else: "0::bigint")) AS ui,
                \(unsafeRaw: money("count(*) FILTER (WHERE e.type = 'tap' AND e.revenue_micros IS NULL)", else: "0::bigint")) AS ut,
                \(unsafeRaw: sketch) AS devices, NULL::numeric AS est, NULL::bigint AS unrated_adjust,
                \(unsafeRaw: needsPrecise ? "coalesce(sum(e.revenue_micros::numeric) FILTER (WHERE \(typed) AND e.revenue_precision = 'precise'), 0)" : "0::numeric") AS precise_micros\(unsafeRaw: hasRecord ? ", e.app_id, date_bin('1 hour', e.occurred_at, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS h" : "")
            FROM events e
            WHERE e.app_id = ANY(\(apps)) AND e.occurred_at >= \(t0) AND e.occurred_at < \(t1)\(columnFilters("e"))\(timeFilters())
            """
        if !positions.isEmpty { rows.append("\nGROUP BY \(unsafeRaw: positions.joined(separator: ", "))") }
        return rows
    }
}
