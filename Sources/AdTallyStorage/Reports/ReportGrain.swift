import AdTallyCore
import PostgresKit
import Synchronization

/// Reports whose rows are a stored rollup grain, one row per stored key: `hour, app,
/// network, format` (the hourly rollups, in a zone whose hours are whole UTC hours) or
/// `date, app, network, format` (the daily rollups, in the apps' own zone), time first
/// or app first, in that order (Migrations/0013). An export of one is read from the
/// rollups in the order it is written, instead of grouped and sorted:
///
/// - the counts and the priced money of every key come from two cursors, index scans in
///   key order, and the pending deltas (priced as every report prices them,
///   `RatePricing`) from one small sorted query: nothing stored is grouped or sorted;
/// - `GrainReader` merges the three key by key, sums money per (key, UTC date, currency)
///   bucket and converts and rounds each bucket once, as `ReportPlan.convertedSums` does;
/// - so each FETCH costs its own rows: no statement does the whole report before the
///   first row, and no statement timeout cuts a stream that is making progress.
///
/// Not a grain: Citus (each worker's order would have to be merged on the coordinator),
/// unique devices (sketches), filters on time, a sort other than the dimensions',
/// keyset cursors, dirty ranges of a card change (priced at query time until the
/// re-pricer has rewritten them: the old plan answers meanwhile), and a network's final
/// earnings as revenue of record (`RevenueOfRecord`: placed by the hour).
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
    /// An hourly grain also needs every hour of the range whole (`GrainReader.init`).
    var grain: Grain? {
        guard !distributed, source != .raw, !needsDevices, !needsAudience, query.after == nil, !(needsMoney && !dirty.isEmpty), !hasRecord else { return nil }
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


    /// The counts (`ReportCount` raw values) a grain's rows carry: those the metrics read.
    var grainCounts: [Int] { Self.rollupCounts.indices.filter { needed.contains(ReportCount(rawValue: $0)!) } }

    /// The grain's stored rows in key order, as two cursors read side by side: `grain_counts`
    /// (the key, then the `grainCounts`) and, with money, `grain_money` (the key, then each
    /// (UTC date, currency) part: its UTC date, currency, reported, estimated, unrated,
    /// and for another currency than the report's its FX rates or what is missing).
    /// Index scans in key order, nothing grouped or sorted.
    func grainCursors(_ grain: Grain) -> [PostgresQuery] {
        let hourly = grain.time == .hour
        let (counts, priced, timeColumn): (String, String, String) = hourly
            ? ("rollup_1h_compacted", "rollup_priced_1h", "r.hour") : ("rollup_day_compacted", "rollup_priced_day", "r.day")
        let time = hourly ? "extract(epoch FROM r.hour)::bigint" : "(r.day - DATE '1970-01-01')::bigint"
        let range: PostgresQuery = hourly
            ? "r.hour >= \(t0) AND r.hour < \(t1)"
            : "r.day BETWEEN \(ReportQuery.formatDate(query.from))::date AND \(ReportQuery.formatDate(query.to))::date"
        let order = grain.keys.map { $0 == "t" ? timeColumn : "r.\($0)" }.joined(separator: ", ")
        // One app (a read key's export) by equality: then its own rows are read in time order
        // from the primary key, not every app's from the time index.
        let app: PostgresQuery = query.apps.count == 1 ? "r.app_id = \(query.apps[0])" : "r.app_id = ANY(\(apps))"
        var cursors: [PostgresQuery] = [
            """
            DECLARE grain_counts NO SCROLL CURSOR FOR
            SELECT \(unsafeRaw: time), r.app_id, r.network, r.format\(unsafeRaw: grainCounts.map { ", r.\(Self.countNames[$0])" }.joined())
            FROM \(unsafeRaw: counts) r WHERE \(app) AND \(range)\(columnFilters("r"))
            ORDER BY \(unsafeRaw: order)
            """,
        ]
        if needsMoney {
            let utcDay = hourly ? "(r.hour AT TIME ZONE 'UTC')::date" : "r.utc_day"
            let fx = fxLookup(currency: "r.currency", day: utcDay)
            cursors.append("""
                DECLARE grain_money NO SCROLL CURSOR FOR
                SELECT \(unsafeRaw: time), r.app_id, r.network, r.format, \(unsafeRaw: utcDay)::text, r.currency, r.reported, r.estimated, r.unrated, \(fx)
                FROM \(unsafeRaw: priced) r
                WHERE \(app) AND \(range)\(columnFilters("r"))
                ORDER BY \(unsafeRaw: order)\(unsafeRaw: hourly ? "" : ", r.utc_day"), r.currency
                """)
        }
        return cursors
    }

    /// The rows no rollup holds yet (pending deltas; `rollupParts`), priced as every report
    /// prices them and summed per key, UTC date and currency ('' without money), in key
    /// order: the key, UTC date, currency, the 9 counts, reported, estimated, unrated and
    /// the FX columns of `fxLookup`.
    func grainPending(_ grain: Grain) -> PostgresQuery {
        let hourly = grain.time == .hour
        var with: [PostgresQuery] = hourly ? [hoursCTE()] : []
        let columns = "app_id, d, hk, u, network, format, \(Self.countList), \(Self.partColumns)"
        with.append("pending (\(unsafeRaw: columns)) AS MATERIALIZED (\n\(Self.union(rollupParts(deltasPending: true).pending))\n)")
        if needsMoney { with.append("\(unsafeRaw: RatePricing.pricesCTE("prices", of: "pending"))") }
        let time = hourly ? "extract(epoch FROM p.hk::timestamptz)::bigint" : "(p.d - DATE '1970-01-01')::bigint"
        let (currency, money) = needsMoney
            ? ("coalesce(\(RatePricing.currency("p")), '')",
               "coalesce(sum(\(RatePricing.reported("p", "p.revenue_micros"))), 0), coalesce(sum(coalesce(p.est, \(RatePricing.estimated("p.ui", "p.ut")))), 0), "
                + "coalesce(sum(coalesce(p.unrated_adjust, \(RatePricing.unrated("p", "p.ui", "p.ut")))), 0)::bigint")
            : ("''::text", "0::numeric, 0::numeric, 0::bigint")
        let fx = fxLookup(currency: "b.cur", day: "b.u")
        var sql: PostgresQuery = ""
        for (index, part) in with.enumerated() {
            sql.append(index == 0 ? "WITH " : ",\n")
            sql.append(part)
        }
        let keys = grain.keys.map { "b.\($0)" }.joined(separator: ", ")
        sql.append("""

            SELECT b.t, b.app_id, b.network, b.format, b.u::text, b.cur, \(unsafeRaw: Self.rollupCounts.map { "b.\($0)" }.joined(separator: ", ")),
                   b.reported, b.estimated, b.unrated, \(fx)
            FROM (
                SELECT \(unsafeRaw: time) AS t, p.app_id, p.network, p.format, p.u, \(unsafeRaw: currency) AS cur,
                       \(unsafeRaw: Self.rollupCounts.indices.map { needed.contains(ReportCount(rawValue: $0)!) ? "sum(p.\(Self.countNames[$0]))::bigint" : "0::bigint" }.joined(separator: ", ")),
                       \(unsafeRaw: money)
                FROM pending p\(unsafeRaw: needsMoney ? " " + RatePricing.join("p", prices: "prices") : "")
                GROUP BY 1, 2, 3, 4, 5, 6
            ) AS b (t, app_id, network, format, u, cur, \(unsafeRaw: Self.countList), reported, estimated, unrated)
            ORDER BY \(unsafeRaw: keys), b.u, b.cur
            """)
        return sql
    }

    /// For a part in `currency` on the UTC date `day`: the FX rates that convert it to the
    /// report currency, as `{to,from}` (as `convertedSums` finds them: the first base with
    /// both rates that day), and when there is none the "date from missing" text of
    /// `ReportCurrencyError`. NULLs for the report currency and '' (no money).
    func fxLookup(currency: String, day: String) -> PostgresQuery {
        let rc = query.currency
        // Looked up only for another currency (a CASE branch): the report currency's parts,
        // nearly every part of most exports, cost nothing here.
        let rates: PostgresQuery = """
            (SELECT ARRAY[t.rate, f.rate]::text[]
             FROM fx_rates t JOIN fx_rates f ON f.day = t.day AND f.base = t.base AND f.currency = \(unsafeRaw: currency)
             WHERE t.day = \(unsafeRaw: day) AND t.currency = \(rc) ORDER BY t.base LIMIT 1)
            """
        var columns: PostgresQuery = "CASE WHEN \(unsafeRaw: currency) NOT IN (\(rc), '') THEN "
        columns.append(rates)
        columns.append(" END AS rates,\n")
        columns.append("""
            CASE WHEN \(unsafeRaw: currency) NOT IN (\(rc), '') AND NOT EXISTS (
                     SELECT 1 FROM fx_rates t JOIN fx_rates f ON f.day = t.day AND f.base = t.base AND f.currency = \(unsafeRaw: currency)
                     WHERE t.day = \(unsafeRaw: day) AND t.currency = \(rc))
                 THEN \(unsafeRaw: day)::text || ' ' || \(unsafeRaw: currency) || ' '
                      || CASE WHEN NOT EXISTS (SELECT 1 FROM fx_rates x WHERE x.day = \(unsafeRaw: day)) THEN '*'
                              WHEN EXISTS (SELECT 1 FROM fx_rates x WHERE x.day = \(unsafeRaw: day) AND x.currency = \(rc)) THEN \(unsafeRaw: currency) ELSE \(rc) END END
            """)
        return columns
    }
}

/// Reads a grain (`ReportPlan.grainCursors`, `grainPending`) and merges its sorted streams
/// into report rows: the stored counts, the stored money parts and the pending rows, each
/// in key order, meet key by key. Money is summed exactly per (key, UTC date, currency)
/// bucket — reported micros and estimated thousandths of a micro, integers — then
/// converted at the bucket's FX rates and rounded half to even once (DESIGN §3), as
/// `ReportPlan.convertedSums` does in SQL; an amount too large for 128-bit arithmetic is
/// converted by PostgreSQL instead.
///
/// No String is made per row: an hour's or a date's text comes from the range's (read
/// once), and app, network and format values are kept once each and shared.
final class GrainReader: Sendable {
    let plan: ReportPlan
    let grain: ReportPlan.Grain
    /// Hourly: the first hour's start (epoch seconds) and every hour's text from it on.
    let firstHour: Int64
    let hourTexts: [String]
    /// The counts the stored counts rows carry (`ReportPlan.grainCounts`).
    let countColumns: [Int]
    /// Rows per FETCH of a stream.
    let chunk: Int
    private let state: Mutex<State>

    /// A key: the time (epoch seconds of an hour, or days since 1970 of a date), app,
    /// network and format (kept Strings).
    struct Key: Equatable {
        var time: Int64
        var app: String
        var network: String
        var format: String
    }

    /// A part of a bucket's money: a stored priced row or a pending group.
    struct Part {
        var key: Key
        var utcDay: String
        var currency: String
        var counts: ReportCounts
        /// Reported and estimated revenue in thousandths of a micro of `currency`.
        var reported: Int128
        var estimated: Int128
        var unrated: Int64
        var toRate: String?
        var fromRate: String?
        var missing: String?
    }

    /// One stream read through a cursor, a FETCH at a time.
    struct Stream {
        let name: String
        var rows: PostgresRows?
        var index = 0
        /// The key of `rows[index]`, once read.
        var key: Key?
        /// A chunk fetched ahead, not yet read.
        var next: PostgresRows?
        /// No FETCH is left to send (a chunk came back short).
        var ended = false
    }

    struct State {
        var texts = Texts()
        var dayTexts: [Int64: String] = [:]
        /// Counts, then (with money) the money parts.
        var streams = [Stream(name: "grain_counts")]
        /// The stream whose FETCH is on its way (`PostgresConnection.send`).
        var inFlight: Int?
        var pending: [Part] = []
        var pendingIndex = 0
        /// Rows still to send (the query's limit), or nil: every row.
        var remaining: Int?
    }

    /// Opens the grain's cursors on `connection` (inside the report's transaction), or
    /// returns nil when the grain cannot answer after all: an hourly one whose range has
    /// hours a group boundary cuts (a zone half an hour off UTC).
    init?(_ plan: ReportPlan, _ grain: ReportPlan.Grain, chunk: Int = ReportEngine.fetchSize, on connection: PostgresConnection) throws {
        self.chunk = chunk
        let limit = plan.query.limit
        countColumns = plan.grainCounts
        self.plan = plan
        self.grain = grain
        var first: Int64?
        var texts: [String] = []
        if grain.time == .hour {
            for row in try connection.query(plan.hoursList()) {
                guard try row.decode(1, as: Bool.self) else { return nil }
                let start = try row.decode(0, as: Int64.self)
                // One text per hour from the first: the list is every hour of the range, in order.
                guard start == (first ?? start) + Int64(texts.count) * 3600 else { return nil }
                if first == nil { first = start }
                texts.append(try row.decode(2, as: String.self))
            }
        }
        firstHour = first ?? 0
        hourTexts = texts
        var state = State()
        state.remaining = limit
        for row in try connection.query(plan.grainPending(grain)) {
            state.pending.append(try Self.part(row, &state.texts))
        }
        // Only ordered index scans: no sort or hash of stored rows, and no sequential scan
        // (it would need the sort). Each FETCH then costs its own rows.
        try connection.execute(unsafeSQL: "SET LOCAL enable_sort = off; SET LOCAL enable_seqscan = off; SET LOCAL enable_hashagg = off; SET LOCAL enable_hashjoin = off")
        for cursor in plan.grainCursors(grain) { try connection.query(cursor) }
        // A cursor's plan is made when it is declared: the rest of the transaction (totals
        // for a stream cut by a limit) plans as every report does.
        try connection.execute(unsafeSQL: "SET LOCAL enable_sort = DEFAULT; SET LOCAL enable_seqscan = DEFAULT; SET LOCAL enable_hashagg = DEFAULT; SET LOCAL enable_hashjoin = DEFAULT")
        if plan.needsMoney { state.streams.append(Stream(name: "grain_money")) }
        self.state = Mutex(state)
    }

    /// The next rows (at most `count`) and the unrated events under them; none at the end.
    func next(_ count: Int, on connection: PostgresConnection) throws -> (rows: [ReportRow], unrated: Int64) {
        try state.withLock { state in
            let count = min(count, state.remaining ?? count)
            var rows: [ReportRow] = []
            rows.reserveCapacity(count)
            var unrated: Int64 = 0
            defer { state.remaining = state.remaining.map { $0 - rows.count } }
            // Kept across rows: no array is made per row for its parts.
            var parts: [Part] = []
            var buckets: [Part] = []
            while rows.count < count {
                var next = state.pendingIndex < state.pending.count ? state.pending[state.pendingIndex].key : nil
                for stream in state.streams.indices {
                    if let key = try head(stream, &state, connection), next.map({ precedes(key, $0) }) ?? true { next = key }
                }
                guard let key = next else { break }

                var counts = ReportCounts()
                parts.removeAll(keepingCapacity: true)
                while let current = try head(0, &state, connection), current == key {
                    counts.add(try Self.counts(state.streams[0].rows![state.streams[0].index], at: 4, countColumns))
                    state.streams[0].index += 1
                    state.streams[0].key = nil
                }
                if state.streams.count > 1 {
                    while let current = try head(1, &state, connection), current == key {
                        parts.append(try Self.part(state.streams[1].rows![state.streams[1].index], key: current, &state.texts))
                        state.streams[1].index += 1
                        state.streams[1].key = nil
                    }
                }
                while state.pendingIndex < state.pending.count, state.pending[state.pendingIndex].key == key {
                    parts.append(state.pending[state.pendingIndex])
                    state.pendingIndex += 1
                }
                unrated += try money(parts, &buckets, into: &counts, &state, connection)
                rows.append(ReportRow(dimensions: dimensions(key, &state.dayTexts), counts: counts))
            }
            return (rows, unrated)
        }
    }

    /// The key of a stream's next row, or nil at its end. When a chunk is used up the next
    /// is taken (fetched ahead, or fetched now), and the one after it is sent for at once:
    /// PostgreSQL reads it while this side decodes, so the two work at the same time.
    private func head(_ stream: Int, _ state: inout State, _ connection: PostgresConnection) throws -> Key? {
        if state.streams[stream].rows == nil || state.streams[stream].index == state.streams[stream].rows!.count {
            if state.streams[stream].next == nil {
                if let other = state.inFlight { try receive(other, &state, connection) }
                if state.streams[stream].next == nil {
                    guard !state.streams[stream].ended else { return nil }
                    try send(stream, &state, connection)
                    try receive(stream, &state, connection)
                }
            }
            state.streams[stream].rows = state.streams[stream].next
            state.streams[stream].next = nil
            state.streams[stream].index = 0
            state.streams[stream].key = nil
            if state.inFlight == nil, !state.streams[stream].ended { try send(stream, &state, connection) }
            if state.streams[stream].rows!.isEmpty { return nil }
        }
        if let key = state.streams[stream].key { return key }
        let key = try Self.key(state.streams[stream].rows![state.streams[stream].index], &state.texts)
        state.streams[stream].key = key
        return key
    }

    private func send(_ stream: Int, _ state: inout State, _ connection: PostgresConnection) throws {
        try connection.send(unsafeSQL: "FETCH \(chunk) FROM \(state.streams[stream].name)")
        state.inFlight = stream
    }

    private func receive(_ stream: Int, _ state: inout State, _ connection: PostgresConnection) throws {
        state.inFlight = nil
        let rows = try connection.receive()
        if rows.count < chunk { state.streams[stream].ended = true }
        state.streams[stream].next = rows
    }

    /// Reads a FETCH still on its way (a stream stopped by its limit): the connection is
    /// then free for the transaction's end.
    func finish(on connection: PostgresConnection) throws {
        try state.withLock { state in
            if let stream = state.inFlight { try receive(stream, &state, connection) }
        }
    }

    /// Whether `a` comes before `b` in the grain's order (text in byte order, as "C").
    private func precedes(_ a: Key, _ b: Key) -> Bool {
        func text(_ x: String, _ y: String) -> Int { x == y ? 0 : x.utf8.lexicographicallyPrecedes(y.utf8) ? -1 : 1 }
        let time = a.time == b.time ? 0 : a.time < b.time ? -1 : 1
        let app = text(a.app, b.app)
        let (first, second) = grain.timeFirst ? (time, app) : (app, time)
        if first != 0 { return first < 0 }
        if second != 0 { return second < 0 }
        let network = text(a.network, b.network)
        if network != 0 { return network < 0 }
        return text(a.format, b.format) < 0
    }

    private func dimensions(_ key: Key, _ dayTexts: inout [Int64: String]) -> [String?] {
        let time: String
        if grain.time == .hour {
            time = hourTexts[Int((key.time - firstHour) / 3600)]
        } else if let text = dayTexts[key.time] {
            time = text
        } else {
            time = ReportQuery.formatDate(Int(key.time))
            dayTexts[key.time] = time
        }
        return grain.timeFirst ? [time, key.app, key.network, key.format] : [key.app, time, key.network, key.format]
    }

    /// Sums the parts per (UTC date, currency) bucket, converts and rounds each once into
    /// `counts`; returns their unrated events. A bucket without the FX rate it needs fails
    /// the row with the first such (date, currency) in the text's order, as the SQL's
    /// `min(missing_fx)` names it.
    private func money(_ parts: [Part], _ buckets: inout [Part], into counts: inout ReportCounts, _ state: inout State, _ connection: PostgresConnection) throws -> Int64 {
        func sum(_ a: Int128, _ b: Int128) throws -> Int128 {
            let (total, overflow) = a.addingReportingOverflow(b)
            if overflow { throw PostgresError(kind: .decoding, message: "an amount of the report does not fit in 128 bits") }
            return total
        }
        var unrated: Int64 = 0
        buckets.removeAll(keepingCapacity: true)
        for part in parts {
            counts.add(part.counts)
            unrated += part.unrated
            if let index = buckets.firstIndex(where: { $0.utcDay == part.utcDay && $0.currency == part.currency }) {
                buckets[index].reported = try sum(buckets[index].reported, part.reported)
                buckets[index].estimated = try sum(buckets[index].estimated, part.estimated)
                if buckets[index].toRate == nil { buckets[index].toRate = part.toRate; buckets[index].fromRate = part.fromRate }
                if buckets[index].missing == nil { buckets[index].missing = part.missing }
            } else {
                buckets.append(part)
            }
        }
        let reportCurrency = plan.query.currency
        var missing: String?
        for bucket in buckets where !bucket.currency.isEmpty && (bucket.reported != 0 || bucket.estimated != 0) {
            if bucket.currency == reportCurrency {
                // Reported revenue is whole micros; estimated rounds half to even, once.
                counts.reportedMicros = try sum(counts.reportedMicros, bucket.reported / 1000)
                counts.estimatedMicros = try sum(counts.estimatedMicros, Money.divideHalfEven(bucket.estimated, by: 1000))
                continue
            }
            guard let to = bucket.toRate, let from = bucket.fromRate else {
                let text = bucket.missing ?? "\(bucket.utcDay) \(bucket.currency) \(bucket.currency)"
                if missing.map({ text.utf8.lexicographicallyPrecedes($0.utf8) }) ?? true { missing = text }
                continue
            }
            // A conversion PostgreSQL must do first takes the FETCH on its way.
            let reported = try Self.convert(bucket.reported, to: to, from: from, connection) { if let stream = state.inFlight { try receive(stream, &state, connection) } }
            let estimated = try Self.convert(bucket.estimated, to: to, from: from, connection) { if let stream = state.inFlight { try receive(stream, &state, connection) } }
            counts.reportedMicros = try sum(counts.reportedMicros, reported)
            counts.estimatedMicros = try sum(counts.estimatedMicros, estimated)
        }
        if let missing { throw ReportCurrencyError(missing: missing, reportCurrency: reportCurrency) }
        return unrated
    }

    /// `thousandths / 1000 * to / from` rounded half to even, exactly: in 128-bit integers
    /// when they hold it (the powers of ten cancelled first), else by PostgreSQL
    /// (`adtally_div_half_even`, as reports convert), after `before`.
    static func convert(_ thousandths: Int128, to: String, from: String, _ connection: PostgresConnection, before: () throws -> Void = {}) throws -> Int128 {
        if let to = decimal(to), let from = decimal(from), to.mantissa > 0, from.mantissa > 0 {
            // thousandths/1000 * (tm / 10^ts) / (fm / 10^fs) = thousandths * tm * 10^(fs - ts - 3) / fm
            var numerator: Int128? = thousandths
            var denominator: Int128? = from.mantissa
            func times(_ value: inout Int128?, _ factor: Int128) { value = value.flatMap { v in let (r, o) = v.multipliedReportingOverflow(by: factor); return o ? nil : r } }
            times(&numerator, to.mantissa)
            let exponent = from.scale - to.scale - 3
            for _ in 0..<max(exponent, 0) { times(&numerator, 10) }
            for _ in 0..<max(-exponent, 0) { times(&denominator, 10) }
            if let numerator, let denominator { return Money.divideHalfEven(numerator, by: denominator) }
        }
        try before()
        let row = try connection.query("SELECT adtally_div_half_even(\(String(thousandths))::numeric * 0.001 * \(to)::numeric, \(from)::numeric)::text")
        guard let text = try row.first?.decode(0, as: String.self), let value = Int128(text) else {
            throw PostgresError(kind: .decoding, message: "an FX conversion of \(thousandths) thousandths at \(to) / \(from) did not give an integer")
        }
        return value
    }

    /// A decimal's digits and places ("1.0731" is 10731, 4), or nil past 36 digits.
    static func decimal(_ text: String) -> (mantissa: Int128, scale: Int)? {
        var mantissa: Int128 = 0
        var scale = 0
        var point = false
        var digits = 0
        for byte in text.utf8 {
            if byte == UInt8(ascii: ".") && !point { point = true; continue }
            guard (0x30...0x39).contains(byte), digits < 36 else { return nil }
            mantissa = mantissa * 10 + Int128(byte - 0x30)
            digits += 1
            if point { scale += 1 }
        }
        guard digits > 0 else { return nil }
        while scale > 0, mantissa % 10 == 0 {
            mantissa /= 10
            scale -= 1
        }
        return (mantissa, scale)
    }

    /// An amount's text in thousandths (at most three decimals: micros, and the
    /// thousandths a CPM leaves).
    static func thousandths(_ row: PostgresRow, _ column: Int) throws -> Int128 {
        try row.withBytes(column) { bytes -> Int128 in
            guard let bytes, !bytes.isEmpty else { return 0 }
            var value: Int128 = 0
            var negative = false
            var places: Int?
            var digitsSoFar = 0
            for (position, byte) in bytes.enumerated() {
                if position == 0 && byte == UInt8(ascii: "-") { negative = true; continue }
                if byte == UInt8(ascii: "."), places == nil { places = 0; continue }
                guard (0x30...0x39).contains(byte), (places ?? 0) < 3 || byte == 0x30 else {
                    throw PostgresError(kind: .decoding, message: "\(String(decoding: bytes, as: UTF8.self)) is not an amount in thousandths of a micro")
                }
                if let count = places, count >= 3 { continue }  // trailing zeros past the thousandths
                guard digitsSoFar < 37 else { throw PostgresError(kind: .decoding, message: "an amount of the report does not fit in 128 bits") }
                digitsSoFar += 1
                value = value * 10 + Int128(byte - 0x30)
                if let count = places { places = count + 1 }
            }
            for _ in (places ?? 0)..<3 { value *= 10 }  // at most 37 + 3 digits: within Int128 (38)
            return negative ? -value : value
        }
    }

    static func key(_ row: PostgresRow, _ texts: inout Texts) throws -> Key {
        Key(
            time: try integer(row, 0),
            app: row.withBytes(1) { texts.apps.text($0) }, network: row.withBytes(2) { texts.networks.text($0) }, format: row.withBytes(3) { texts.formats.text($0) }
        )
    }

    /// A bigint column's value, parsed from its text in place (a generic decode per value
    /// cost more than the rest of a row).
    static func integer(_ row: PostgresRow, _ column: Int) throws -> Int64 {
        try row.withBytes(column) { bytes -> Int64 in
            guard let bytes, !bytes.isEmpty, bytes.count <= 19 else {
                if bytes == nil { return 0 }
                throw PostgresError(kind: .decoding, message: "column \(column): not a 64-bit integer")
            }
            var value: Int64 = 0
            var negative = false
            for (position, byte) in bytes.enumerated() {
                if position == 0 && byte == UInt8(ascii: "-") { negative = true; continue }
                guard (0x30...0x39).contains(byte) else { throw PostgresError(kind: .decoding, message: "column \(column): not an integer") }
                value = value &* 10 &+ Int64(byte &- 0x30)
            }
            return negative ? -value : value
        }
    }

    /// The counts `columns` (`ReportCount` raw values) from column `start` on.
    static func counts(_ row: PostgresRow, at start: Int, _ columns: [Int]) throws -> ReportCounts {
        var counts = ReportCounts()
        for (offset, count) in columns.enumerated() {
            let value = try integer(row, start + offset)
            switch ReportCount(rawValue: count)! {
            case .requests: counts.requests = value
            case .loads: counts.loads = value
            case .impressions: counts.impressions = value
            case .errors: counts.errors = value
            case .taps: counts.taps = value
            case .actionCancels: counts.actionCancels = value
            case .expiries: counts.expiries = value
            case .wastedFills: counts.wastedFills = value
            case .sessions: counts.sessions = value
            default: break
            }
        }
        return counts
    }

    /// A money row (`grain_money`: key (read already: `key`), UTC date, currency, reported,
    /// estimated, unrated, FX) or a pending one (no `key`; the 9 counts after the currency).
    static func part(_ row: PostgresRow, key: Key? = nil, _ texts: inout Texts) throws -> Part {
        let pending = key == nil
        let key = try key ?? Self.key(row, &texts)
        let money = pending ? 15 : 6
        func text(_ column: Int) -> String { row.withBytes(column) { texts.others.text($0) } }
        // The rates as PostgreSQL writes a text array: {to,from}.
        var rates: [String] = []
        try row.withBytes(money + 3) { bytes in
            guard let bytes else { return }
            guard bytes.count > 2, bytes.first == UInt8(ascii: "{"), bytes.last == UInt8(ascii: "}") else {
                throw PostgresError(kind: .decoding, message: "FX rates \(String(decoding: bytes, as: UTF8.self)) are not {to,from}")
            }
            rates = bytes[1..<(bytes.count - 1)].split(separator: UInt8(ascii: ",")).map { String(decoding: $0, as: UTF8.self) }
        }
        return Part(
            key: key, utcDay: text(4), currency: text(5),
            counts: pending ? try counts(row, at: 6, Array(0..<9)) : ReportCounts(),
            reported: try thousandths(row, money), estimated: try thousandths(row, money + 1), unrated: try integer(row, money + 2),
            toRate: rates.count == 2 ? rates[0] : nil, fromRate: rates.count == 2 ? rates[1] : nil, missing: try row.decode(money + 4, as: String?.self)
        )
    }
}

/// The kept texts of a grain's columns, each in a table of its own.
struct Texts {
    var apps = TextTable()
    var networks = TextTable()
    var formats = TextTable()
    var others = TextTable()
}

/// Text values kept once each, looked up by their bytes without making a String. Rows
/// come in key order, so a column's next value is most often its last one or the one
/// kept after it: those two are compared first, then a hash lookup.
struct TextTable {
    private var values: [String] = []
    private var last = 0
    private var positions: [Int: [Int]] = [:]

    /// The kept String equal to `bytes` ("" for NULL; kept now if new). At most 100,000
    /// are kept: past that, the table starts again.
    mutating func text(_ bytes: UnsafeRawBufferPointer?) -> String {
        guard let bytes, !bytes.isEmpty else { return "" }
        if last < values.count, Self.equal(values[last], bytes) { return values[last] }
        if last + 1 < values.count, Self.equal(values[last + 1], bytes) {
            last += 1
            return values[last]
        }
        var hasher = Hasher()
        hasher.combine(bytes: bytes)
        let hash = hasher.finalize()
        for position in positions[hash] ?? [] where Self.equal(values[position], bytes) {
            last = position
            return values[position]
        }
        if values.count >= 100_000 {
            values.removeAll(keepingCapacity: true)
            positions.removeAll(keepingCapacity: true)
        }
        let text = String(decoding: bytes, as: UTF8.self)
        last = values.count
        positions[hash, default: []].append(values.count)
        values.append(text)
        return text
    }

    static func equal(_ text: String, _ bytes: UnsafeRawBufferPointer) -> Bool {
        let utf8 = text.utf8
        guard utf8.count == bytes.count else { return false }
        return utf8.withContiguousStorageIfAvailable { UnsafeRawBufferPointer($0).elementsEqual(bytes) } ?? utf8.elementsEqual(bytes)
    }
}
