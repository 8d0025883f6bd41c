import AdTallyCore
import PostgresKit
import Synchronization

/// Reports whose rows are a stored rollup grain, one row per stored key: `hour, app,
/// network, format` (the hourly rollups, in a zone whose hours are whole UTC hours) or
/// `date, app, network, format` (the daily rollups, in the apps' own zone), time first
/// or app first, in that order (Migrations/0013). An export of one is read from the
/// rollups in the order it is written, instead of grouped and sorted:
///
/// - the counts and the priced money of every key come from index scans in key order,
///   and the pending deltas (priced as every report prices them, `RatePricing`) are
///   sorted and merged in: one ordered union, no sort of stored rows;
/// - it is grouped per (key, UTC date, currency) bucket as it passes, each bucket
///   converted at its date's FX rate and rounded once (`ReportPlan.convertedSums`, the
///   same SQL as every report), then grouped per key;
/// - so each FETCH costs its own rows: no statement does the whole report before the
///   first row, and no statement timeout cuts a stream that is making progress.
///
/// Not a grain: Citus (each worker's order would have to be merged on the coordinator),
/// unique devices (sketches), filters on time, a sort other than the dimensions',
/// keyset cursors, and dirty ranges of a card change (priced at query time until the
/// re-pricer has rewritten them: the old plan answers meanwhile).
extension ReportPlan {
    struct Grain: Equatable {
        /// `.hour` or `.date`.
        var time: ReportDimension
        /// (time, app, network, format); else (app, time, network, format).
        var timeFirst: Bool

        /// The key columns, in the order rows are written.
        var keys: [String] { timeFirst ? ["t", "app_id", "network", "format"] : ["app_id", "t", "network", "format"] }
    }

    /// The grain this report's rows are, or nil (then `declareCursor` groups and sorts).
    /// An hourly grain also needs every hour of the range whole (`ReportEngine.grainHours`).
    var grain: Grain? {
        guard !distributed, source != .raw, !needsDevices, query.after == nil, !(needsMoney && !dirty.isEmpty) else { return nil }
        guard !query.filters.contains(where: { $0.dimension.isTime }) else { return nil }
        let time: ReportDimension = source == .hourly ? .hour : .date
        let orders: [[ReportDimension]] = [[time, .app, .network, .format], [.app, time, .network, .format]]
        guard let order = orders.firstIndex(of: query.dimensions) else { return nil }
        guard query.sort.count == query.dimensions.count,
              zip(query.sort, query.dimensions).allSatisfy({ key, dimension in key.field == .dimension(dimension) && !key.isDescending })
        else { return nil }
        return Grain(time: time, timeFirst: order == 0)
    }

    /// The hours of the range (`hoursCTE`): each one's start (epoch seconds), whether it
    /// is whole, and its text in the report's zone.
    func hoursList() -> PostgresQuery {
        "WITH \(hoursCTE())\nSELECT extract(epoch FROM h)::bigint, whole, hk FROM hours ORDER BY h"
    }

    /// A cursor over the grain's rows in key order: the dimensions (an hour as its epoch
    /// seconds, a date as text), the counts in `countNames` order, `missing_fx`, `unrated`.
    func declareGrainCursor(_ grain: Grain, limit: Int?) -> PostgresQuery {
        let hourly = grain.time == .hour
        let keys = grain.keys
        var with: [PostgresQuery] = hourly ? [hoursCTE()] : []
        let columns = "app_id, d, hk, u, network, format, \(Self.countList), \(Self.partColumns)"
        with.append("pending (\(unsafeRaw: columns)) AS MATERIALIZED (\n\(Self.union(rollupParts(deltasPending: true).pending))\n)")
        if needsMoney { with.append("\(unsafeRaw: RatePricing.pricesCTE("prices", of: "pending"))") }

        // One union in key order: stored counts, stored priced money, pending rows.
        let noMoney = "0::numeric AS reported, 0::numeric AS estimated, 0::bigint AS unrated"
        let zeroCounts = Self.rollupCounts.map { "0::bigint AS \($0)" }.joined(separator: ", ")
        let (counts, priced, timeColumn, utcDay): (String, String, String, String) = hourly
            ? ("rollup_1h_compacted", "rollup_priced_1h", "hour", "NULL::date")
            : ("rollup_day_compacted", "rollup_priced_day", "day", "r.utc_day")
        let range: PostgresQuery = hourly
            ? "r.hour >= \(t0) AND r.hour < \(t1)"
            : "r.day BETWEEN \(ReportQuery.formatDate(query.from))::date AND \(ReportQuery.formatDate(query.to))::date"
        var parts: [PostgresQuery] = [
            """
            SELECT r.\(unsafeRaw: timeColumn) AS t, r.app_id, r.network, r.format, NULL::date AS u, NULL::text AS cur, \(unsafeRaw: Self.countList), \(unsafeRaw: noMoney)
            FROM \(unsafeRaw: counts) r WHERE r.app_id = ANY(\(apps)) AND \(range)\(columnFilters("r"))
            """,
        ]
        if needsMoney {
            parts.append("""
                SELECT r.\(unsafeRaw: timeColumn), r.app_id, r.network, r.format, \(unsafeRaw: utcDay), NULLIF(r.currency, ''), \(unsafeRaw: zeroCounts), r.reported, r.estimated, r.unrated
                FROM \(unsafeRaw: priced) r WHERE r.app_id = ANY(\(apps)) AND \(range)\(columnFilters("r"))
                """)
        }
        // Pending rows: an hour by its instant (its text carries the offset), a day as it is.
        let pendingTime = hourly ? "p.hk::timestamptz" : "p.d"
        let (pendingCurrency, pendingMoney) = needsMoney
            ? (RatePricing.currency("p"), "\(RatePricing.reported("p", "p.revenue_micros")), coalesce(p.est, \(RatePricing.estimated("p.ui", "p.ut"))), "
                + "coalesce(p.unrated_adjust, \(RatePricing.unrated("p", "p.ui", "p.ut")))::bigint")
            : ("NULL::text", "0::numeric, 0::numeric, 0::bigint")
        parts.append("""
            SELECT \(unsafeRaw: pendingTime), p.app_id, p.network, p.format, \(unsafeRaw: hourly ? "NULL::date" : "p.u"), \(unsafeRaw: pendingCurrency),
                   \(unsafeRaw: Self.rollupCounts.map { "p.\($0)::bigint" }.joined(separator: ", ")), \(unsafeRaw: pendingMoney)
            FROM pending p\(unsafeRaw: needsMoney ? " " + RatePricing.join("p", prices: "prices") : "")
            """)

        let keyList = keys.map { "x.\($0)" }.joined(separator: ", ")
        let grouped: PostgresQuery
        if needsMoney {
            let bucketKeys = keyList + (hourly ? "" : ", x.u") + ", x.cur"
            let sums = Self.rollupCounts.map { "sum(x.\($0)) AS \($0)" }.joined(separator: ", ")
            grouped = convertedSums(keys: keys, buckets: """
                SELECT \(unsafeRaw: keyList), \(unsafeRaw: hourly ? "(x.t AT TIME ZONE 'UTC')::date" : "x.u") AS u, x.cur,
                       \(unsafeRaw: sums), NULL::hll AS devices, sum(x.reported) AS reported, sum(x.estimated) AS estimated, sum(x.unrated) AS unrated
                FROM (
                \(Self.union(parts))
                ) AS x
                GROUP BY \(unsafeRaw: bucketKeys)
                """)
        } else {
            grouped = """
                SELECT \(unsafeRaw: keyList), \(unsafeRaw: countSums("x")), 0::numeric AS reported_micros, 0::numeric AS estimated_micros,
                       0::bigint AS unique_devices, 0::bigint AS unrated, NULL::text AS missing_fx
                FROM (
                \(Self.union(parts))
                ) AS x
                GROUP BY \(unsafeRaw: keyList)
                """
        }
        var cursor: PostgresQuery = "DECLARE report_rows NO SCROLL CURSOR FOR\n"
        for (index, part) in with.enumerated() {
            cursor.append(index == 0 ? "WITH " : ",\n")
            cursor.append(part)
        }
        let time = hourly ? "extract(epoch FROM g.t)::bigint" : "g.t::text"
        let outputs = keys.map { $0 == "t" ? time : "g.\($0)" }.joined(separator: ", ")
        let countColumns = Self.countNames.map { "g.\($0)" }.joined(separator: ", ")
        cursor.append("\nSELECT \(unsafeRaw: outputs), \(unsafeRaw: countColumns), g.missing_fx, g.unrated FROM (\n")
        cursor.append(grouped)
        cursor.append("\n) AS g ORDER BY \(unsafeRaw: keys.map { "g.\($0)" }.joined(separator: ", "))")
        if let limit { cursor.append(" LIMIT \(limit)") }
        return cursor
    }
}

/// Turns a grain cursor's rows (`ReportPlan.declareGrainCursor`) into report rows with
/// no String made per row: an hour's text comes from the range's hours (read once), and
/// app, network and format values are kept once each (a grain has few of them) and
/// shared by every row that holds them.
final class GrainDecoder: Sendable {
    let plan: ReportPlan
    /// Where the time dimension is in a row.
    let timeColumn: Int
    /// Hourly: the first hour's start (epoch seconds) and every hour's text from it on.
    let firstHour: Int64
    let hourTexts: [String]
    private let texts = Mutex(TextTable())

    /// A decoder for `grain`, or nil when the grain cannot answer the report after all:
    /// an hourly one whose range has hours a group boundary cuts (a zone half an hour
    /// off UTC), which the hourly rollups do not hold.
    init?(_ plan: ReportPlan, _ grain: ReportPlan.Grain, on connection: PostgresConnection) throws {
        self.plan = plan
        timeColumn = grain.timeFirst ? 0 : 1
        guard grain.time == .hour else {
            firstHour = 0
            hourTexts = []
            return
        }
        var first: Int64?
        var texts: [String] = []
        for row in try connection.query(plan.hoursList()) {
            guard try row.decode(1, as: Bool.self) else { return nil }
            let start = try row.decode(0, as: Int64.self)
            // One text per hour from the first: the list is every hour of the range, in order.
            guard start == (first ?? start) + Int64(texts.count) * 3600 else { return nil }
            if first == nil { first = start }
            texts.append(try row.decode(2, as: String.self))
        }
        firstHour = first ?? 0
        hourTexts = texts
    }

    /// A row's dimensions and counts (its unrated events and FX check are the caller's).
    func decode(_ row: PostgresRow) throws -> ReportRow {
        var dimensions: [String?] = []
        dimensions.reserveCapacity(4)
        try texts.withLock { table in
            for column in 0..<4 {
                if column == timeColumn, !hourTexts.isEmpty {
                    let start = try row.decode(column, as: Int64.self)
                    let index = Int((start - firstHour) / 3600)
                    guard start >= firstHour, (start - firstHour) % 3600 == 0, index < hourTexts.count else {
                        throw PostgresError(kind: .decoding, message: "hour \(start) is not an hour of the report's range")
                    }
                    dimensions.append(hourTexts[index])
                } else {
                    dimensions.append(row.withBytes(column) { bytes in bytes.map { table.text($0) } })
                }
            }
        }
        return ReportRow(dimensions: dimensions, counts: try plan.decodeCounts(row, at: 4))
    }
}

/// Text values kept once each, looked up by their bytes without making a String.
struct TextTable {
    private var entries: [Int: [String]] = [:]
    private var count = 0

    /// The kept String equal to `bytes` (kept now if new). At most 100,000 are kept:
    /// past that, the table starts again (a grain's values are apps, networks, formats).
    mutating func text(_ bytes: UnsafeRawBufferPointer) -> String {
        var hasher = Hasher()
        hasher.combine(bytes: bytes)
        let hash = hasher.finalize()
        if let candidates = entries[hash] {
            for candidate in candidates where candidate.utf8.elementsEqual(bytes) { return candidate }
        }
        if count >= 100_000 {
            entries.removeAll(keepingCapacity: true)
            count = 0
        }
        let text = String(decoding: bytes, as: UTF8.self)
        entries[hash, default: []].append(text)
        count += 1
        return text
    }
}
