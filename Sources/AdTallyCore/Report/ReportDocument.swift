import TextFormats

/// What a reader must know to trust a report's numbers (DESIGN §4 notes).
public struct ReportNotes: Sendable, Equatable {
    /// How far `unique_devices` may be off (hll(11, 5, 0) sketches, Migrations/0005, 0028).
    public static let uniqueDevicesBound = "unique_devices is estimated from HyperLogLog sketches of 2,048 registers: "
        + "standard error 2.3%, so about 2 values in 3 are within ±2.3% of the exact count and 997 in 1,000 within ±6.9%; "
        + "small groups are estimated too (linear counting, standard error under 2%): the sketches keep no device's hash"

    /// How far the audience metrics may be off (the same sketches, per local day).
    public static let audienceBound = "active_devices, ad_viewers, dau, dav and the metrics over them (engagement_rate, arpdau, arpdav, "
        + "impressions_per_dau, impressions_per_dav, sessions_per_dau) are estimated from the same HyperLogLog sketches, per local day of the "
        + "report's zone: each day's count and each range-unique count has a standard error of 2.3% (997 in 1,000 within ±6.9%), "
        + "small groups included; dau and dav average those daily counts, so they are within the same bound"

    /// Whose devices `active_devices` and `dau` are, when a row or filter names what a session does not.
    public static func appAudience(_ query: ReportQuery) -> String? {
        let named = Set(query.dimensions).union(query.filters.map(\.dimension))
            .filter(\.isOnAdEventsOnly)
        guard !named.isEmpty, query.metrics.contains(where: { $0.counts.contains(.activeDevices) || $0.counts.contains(.deviceDays) }) else { return nil }
        let names = named.map(\.rawValue).sorted().joined(separator: ", ")
        return "active_devices and dau (and engagement_rate, arpdau, impressions_per_dau, sessions_per_dau over them) are the app's, "
            + "not the \(names)'s: a session (what makes a device active) names no \(names); ad_viewers and dav are the devices of the row's own impressions"
    }

    /// How money is converted and rounded (DESIGN §3).
    public static func moneyRule(_ currency: String) -> String {
        "amounts are converted to \(currency) at the FX rate of their UTC date, summed exactly per row, UTC date and currency, "
            + "and rounded half to even to micros once; reported and estimated revenue are rounded apart and revenue is their sum; "
            + "shown with \(Money.digits(currency)) decimal\(Money.digits(currency) == 1 ? "" : "s") (half to even)"
    }

    /// A day of the range that is not 24 hours long in the report's zone.
    public struct DayLength: Sendable, Equatable {
        /// The day.
        public var day: Int
        /// Its length in hours (23, 25, 23.5 …).
        public var hours: Double

        /// A day and its length.
        public init(day: Int, hours: Double) {
            self.day = day
            self.hours = hours
        }
    }

    /// Days whose length is not 24 hours.
    public var dayLengths: [DayLength] = []
    /// Days late events may still change (inside the accepted window).
    public var provisionalDays: [Int] = []
    /// When the last provisional day turns final (seconds since 1970), if any is provisional.
    public var finalAt: Int64?
    /// Where the numbers were read: rollups or raw events.
    public var source: String = ""
    /// For a report read from raw events: the first UTC day whose raw events are
    /// still kept, when the range starts before it (earlier days are missing).
    public var rawEventsFrom: Int?
    /// The first UTC day whose impressions' devices are sketched (Migrations/0014), when the
    /// report reads ad viewers and starts before it; nil otherwise.
    public var viewersFrom: Int?
    /// The database server the report was read from.
    public var readFrom = ReadFrom(server: .primary)
    /// Which days' revenue is a network's final earnings, and from which imports (DESIGN §11).
    public var revenueOfRecord: [String] = []
    /// A cohort report's lines (DESIGN §13): when a day N is mature, where install history starts.
    public var cohorts: [String] = []

    /// Which server answered a report, and how far behind it was.
    public struct ReadFrom: Sendable, Equatable {
        /// A database server.
        public enum Server: String, Sendable {
            case primary, replica
        }
        /// The server that answered.
        public var server: Server
        /// How far the replica was behind the primary when the report started, at most, in
        /// seconds: its replay lag at the last probe plus the time since (read from the replica).
        public var replicaLagSeconds: Double?
        /// WAL bytes the replica had still to replay at the last probe, when known.
        public var replicaBehindBytes: Int64?
        /// Why a configured replica was not used.
        public var replicaSkipped: String?

        /// Where a report was read.
        public init(server: Server, replicaLagSeconds: Double? = nil, replicaBehindBytes: Int64? = nil, replicaSkipped: String? = nil) {
            self.server = server
            self.replicaLagSeconds = replicaLagSeconds
            self.replicaBehindBytes = replicaBehindBytes
            self.replicaSkipped = replicaSkipped
        }

        /// Whether people should be told: a replica answered, or one was configured but skipped.
        public var isWorthNoting: Bool { server == .replica || replicaSkipped != nil }

        /// One line for people: "replica (replay lag 0.012 s)", "primary (…why not the replica)".
        public var text: String {
            switch server {
            case .replica: "replica (replay lag at most \(String(format: "%.3f", replicaLagSeconds ?? 0)) s when the report started)"
            case .primary: replicaSkipped.map { "primary: \($0)" } ?? "primary"
            }
        }
    }

    /// Empty notes.
    public init() {}

    /// Weeks and months the range cuts: the first or last one is only partly inside it.
    public static func cutPeriods(_ query: ReportQuery) -> [String] {
        var cuts: [String] = []
        if query.dimensions.contains(.week) {
            // 1970-01-01 was a Thursday: Monday is (day + 3) % 7 == 0.
            let fromWeekday = ((query.from + 3) % 7 + 7) % 7, toWeekday = ((query.to + 3) % 7 + 7) % 7
            if fromWeekday != 0 {
                cuts.append("week \(ReportQuery.formatDate(query.from - fromWeekday)) starts before the range: only from \(ReportQuery.formatDate(query.from)) is counted")
            }
            if toWeekday != 6 {
                cuts.append("week \(ReportQuery.formatDate(query.to - toWeekday)) ends after the range: only up to \(ReportQuery.formatDate(query.to)) is counted")
            }
        }
        if query.dimensions.contains(.month) {
            let first = CivilTime.date(days: query.from), last = CivilTime.date(days: query.to + 1)
            if first.day != 1 {
                cuts.append("month \(ReportQuery.formatDate(query.from).prefix(7)) starts before the range: only from \(ReportQuery.formatDate(query.from)) is counted")
            }
            if last.day != 1 {
                cuts.append("month \(ReportQuery.formatDate(query.to).prefix(7)) ends after the range: only up to \(ReportQuery.formatDate(query.to)) is counted")
            }
        }
        return cuts
    }
}

/// A JSON report page (DESIGN §4): `query`, `columns`, `rows`, `totals`, `notes`, `next_cursor`.
public struct ReportDocument: Sendable {
    /// The layout, with the query.
    public var layout: ReportLayout
    /// The rows of this page.
    public var rows: [ReportRow]
    /// Sums over every matching row, not just the page.
    public var totals: ReportCounts
    /// The compared period's totals.
    public var previousTotals: ReportCounts?
    /// The notes.
    public var notes: ReportNotes
    /// The cursor of the next page; nil on the last one.
    public var nextCursor: String?

    /// A page.
    public init(layout: ReportLayout, rows: [ReportRow], totals: ReportCounts, previousTotals: ReportCounts?, notes: ReportNotes, nextCursor: String?) {
        self.layout = layout
        self.rows = rows
        self.totals = totals
        self.previousTotals = previousTotals
        self.notes = notes
        self.nextCursor = nextCursor
    }

    /// The page as JSON.
    public func json() -> [UInt8] {
        var out = Self.jsonHead(layout)
        out.reserveCapacity(out.count + 512 + rows.count * 24 * layout.columns.count)
        for (index, row) in rows.enumerated() { Self.appendJSONRow(row, layout: layout, isFirst: index == 0, to: &out) }
        appendJSONTail(to: &out)
        return out
    }

    /// The query as understood, as the JSON object of a page's `query` (and an export manifest's).
    public static func appendQueryJSON(_ query: ReportQuery, to out: inout [UInt8]) {
        func key(_ name: String) { ReportText.appendJSONKey(name, to: &out) }
        func string(_ text: String) { ReportText.appendJSONString(text, to: &out) }
        func strings(_ items: [String]) { ReportText.appendJSONStrings(items, to: &out) }
        func raw(_ text: String) { out.append(contentsOf: text.utf8) }
        raw("{")
        key("apps"); strings(query.apps); raw(",")
        key("from"); string(ReportQuery.formatDate(query.from)); raw(",")
        key("to"); string(ReportQuery.formatDate(query.to)); raw(",")
        key("tz"); string(query.timezone); raw(",")
        key("dimensions"); strings(query.dimensions.map(\.rawValue)); raw(",")
        key("metrics"); strings(query.metrics.map(\.rawValue) + query.cohortMetrics.map(\.name)); raw(",")
        key("filters"); raw("{")
        for (index, filter) in query.filters.enumerated() {
            if index > 0 { raw(",") }
            key(filter.dimension.rawValue); strings(filter.values)
        }
        raw("},")
        key("currency"); string(query.currency); raw(",")
        key("sort"); string(query.sortText); raw(",")
        key("limit"); raw(query.limit.map { String($0) } ?? "null"); raw(",")
        key("compare"); if let comparison = query.comparison { string(comparison.rawValue) } else { raw("null") }
        raw(",")
        key("format"); string(query.format.rawValue)
        raw("}")
    }

    /// A page's JSON up to its first row: `{"query":…,"columns":…,"rows":[`.
    public static func jsonHead(_ layout: ReportLayout) -> [UInt8] {
        var out: [UInt8] = []
        func key(_ name: String) { ReportText.appendJSONKey(name, to: &out) }
        func raw(_ text: String) { out.append(contentsOf: text.utf8) }
        raw("{")
        key("query"); appendQueryJSON(layout.query, to: &out); raw(",")
        key("columns"); raw("[")
        for (index, column) in layout.columns.enumerated() {
            if index > 0 { raw(",") }
            raw("{"); key("name"); ReportText.appendJSONString(column.name, to: &out); raw(",")
            key("type"); ReportText.appendJSONString(column.type.rawValue, to: &out); raw("}")
        }
        raw("],")
        key("rows"); raw("[")
        return out
    }

    /// One row of `rows`, after a comma unless it is the first.
    public static func appendJSONRow(_ row: ReportRow, layout: ReportLayout, isFirst: Bool, to out: inout [UInt8]) {
        if !isFirst { out.append(UInt8(ascii: ",")) }
        out.append(UInt8(ascii: "["))
        for (position, cell) in layout.cells(row).enumerated() {
            if position > 0 { out.append(UInt8(ascii: ",")) }
            ReportText.appendJSON(cell, to: &out)
        }
        out.append(UInt8(ascii: "]"))
    }

    /// The rest of the page after its rows: `],"totals":…,"notes":…,"next_cursor":…}`.
    public func appendJSONTail(to out: inout [UInt8]) {
        let query = layout.query
        func key(_ name: String) { ReportText.appendJSONKey(name, to: &out) }
        func string(_ text: String) { ReportText.appendJSONString(text, to: &out) }
        func strings(_ items: [String]) { ReportText.appendJSONStrings(items, to: &out) }
        func raw(_ text: String) { out.append(contentsOf: text.utf8) }
        raw("],")

        key("totals"); raw("{")
        var metricColumns = layout.columns.dropFirst(query.dimensions.count).makeIterator()
        for (index, cell) in layout.totalCells(totals, previous: previousTotals).enumerated() {
            if index > 0 { raw(",") }
            key(metricColumns.next()?.name ?? "")
            ReportText.appendJSON(cell, to: &out)
        }
        raw("},")

        key("notes"); raw("{")
        key("timezone"); string("\(query.timezone) (\(query.timezoneReason))"); raw(",")
        key("currency"); string(query.currency); raw(",")
        key("source"); string(notes.source); raw(",")
        key("read_from"); string(notes.readFrom.server.rawValue); raw(",")
        key("replica_lag_seconds"); raw(notes.readFrom.replicaLagSeconds.map { String(format: "%.3f", $0) } ?? "null"); raw(",")
        if let skipped = notes.readFrom.replicaSkipped { key("replica_skipped"); string(skipped); raw(",") }
        key("day_lengths"); raw("[")
        for (index, length) in notes.dayLengths.enumerated() {
            if index > 0 { raw(",") }
            raw("{"); key("date"); string(ReportQuery.formatDate(length.day)); raw(","); key("hours"); raw(ReportText.ratio(length.hours)); raw("}")
        }
        raw("],")
        key("provisional_days"); strings(notes.provisionalDays.map(ReportQuery.formatDate)); raw(",")
        key("cut_periods"); strings(ReportNotes.cutPeriods(query)); raw(",")
        var approximate: [String] = []
        if query.metrics.contains(.uniqueDevices) { approximate.append(ReportNotes.uniqueDevicesBound) }
        if query.metrics.contains(where: \.isAudience) { approximate.append(ReportNotes.audienceBound) }
        if let whose = ReportNotes.appAudience(query) { approximate.append(whose) }
        key("approximate"); strings(approximate); raw(",")
        var incomplete: [String] = []
        if let day = notes.rawEventsFrom {
            incomplete.append(
                "there are raw events only from \(ReportQuery.formatDate(day)) (UTC) on (older ones were dropped by retention, or never sent): this report reads raw events, so days before that count nothing"
            )
        }
        if let day = notes.viewersFrom {
            incomplete.append(
                "ad viewers are counted from \(ReportQuery.formatDate(day)) (UTC) on: older impressions were summed before their devices were sketched apart (Migrations/0014), so ad_viewers, dav and the metrics over them count none before that"
            )
        }
        if !incomplete.isEmpty { key("incomplete"); strings(incomplete); raw(",") }
        var estimated: [String] = []
        if query.metrics.contains(where: \.isMoney) {
            if totals.estimatedMicros != 0 {
                estimated.append(
                    "\(Money.format(micros: totals.estimatedMicros, currency: query.currency)) \(query.currency) of \(Money.format(micros: totals.revenueMicros, currency: query.currency)) \(query.currency) revenue is estimated from the rate card "
                        + "(estimated_revenue): impressions and taps without reported revenue, priced per network, format and country at the rate in force on their UTC date"
                )
            }
            if totals.unratedEvents > 0 {
                estimated.append("\(totals.unratedEvents) impressions and taps had no reported revenue and no rate card entry: they add nothing to revenue")
            }
        }
        if query.cohortMetrics.contains(where: { $0.kind == .revenuePerInstall }) && totals.unratedEvents > 0 {
            estimated.append("\(totals.unratedEvents) impressions and taps of these cohorts had no reported revenue and no rate card entry: they add nothing to revenue per install")
        }
        key("estimated"); strings(estimated); raw(",")
        let cohortMoney = query.cohortMetrics.contains { $0.kind == .revenuePerInstall }
        key("revenue_of_record"); strings(query.metrics.contains(where: { $0.isMoney || $0 == .revenueSource }) || cohortMoney ? notes.revenueOfRecord : []); raw(",")
        if query.isCohortReport { key("cohorts"); strings(notes.cohorts); raw(",") }
        key("money"); strings(query.metrics.contains(where: \.isMoney) || cohortMoney ? [ReportNotes.moneyRule(query.currency)] : [])
        raw("},")
        key("next_cursor"); if let cursor = nextCursor { string(cursor) } else { raw("null") }
        raw("}")
    }
}
