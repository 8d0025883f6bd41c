import AdTallyCore
import Foundation
import PostgresKit

/// The networks' own reports in PostgreSQL (Migrations/0015): their names for apps and
/// ad sources mapped once, each network's tolerance and restatement window, and every
/// import, kept. A later import replaces an earlier one for the app, network and day
/// it has figures for; the earlier rows stay as history.
public struct NetworkReportStore: Sendable {
    let pool: PostgresPool

    /// A store over a pool.
    public init(pool: PostgresPool) { self.pool = pool }

    /// Rows per statement of a bulk write.
    static let chunk = 5_000

    // MARK: - Mappings

    /// A network's name for an app (`kind` app: its AdTally app id) or for an ad source
    /// (`kind` network: AdTally's network name).
    public struct Mapping: Sendable, Equatable, Codable {
        public var source: NetworkReportSource
        public var kind: Kind
        /// As the network's report writes it.
        public var external: String
        /// The AdTally app id or network name.
        public var target: String

        /// What is mapped.
        public enum Kind: String, Sendable, Codable, CaseIterable { case app, network }

        /// The mapped name as messages say it: `max app "com.example.game"`.
        var key: String { "\(source.rawValue) \(kind.rawValue) \"\(external)\"" }

        public init(source: NetworkReportSource, kind: Kind, external: String, target: String) {
            self.source = source
            self.kind = kind
            self.external = external
            self.target = target
        }
    }

    /// Stores mappings, all or none. A name mapped already to the same target is kept;
    /// to another target it is refused (ambiguous: delete the old one first), as is one
    /// name given twice with two targets, an app that does not exist and a network name
    /// AdTally's events could not carry. Returns how many were new.
    @discardableResult
    public func setMappings(_ mappings: [Mapping]) async throws -> Int {
        var given: [String: Mapping] = [:]
        for (index, mapping) in mappings.enumerated() {
            let field = "mappings[\(index)]"
            var mapping = mapping
            mapping.external = try NetworkReport.externalName(mapping.external, field: "\(field).external")
            switch mapping.kind {
            case .network:
                guard EventValidator.isNetworkName(mapping.target) else { throw FieldError("\(field).target", "a network must match [a-z0-9_.-]{1,32}") }
            case .app:
                guard !mapping.target.isEmpty, mapping.target.utf8.count <= 64 else { throw FieldError("\(field).target", "must be an app id") }
            }
            if let earlier = given[mapping.key], earlier.target != mapping.target {
                throw FieldError(field, "\(mapping.key) is given twice, to \(earlier.target) and to \(mapping.target): ambiguous")
            }
            given[mapping.key] = mapping
        }
        let wanted = given
        return try await pool.withTransaction { connection in
            // Mapping changes one at a time (imports read under SHARE): two adding the same
            // name to different targets cannot both find it free.
            try connection.execute(unsafeSQL: "LOCK TABLE network_mappings IN SHARE ROW EXCLUSIVE MODE")
            let apps = Set(wanted.values.filter { $0.kind == .app }.map(\.target))
            if !apps.isEmpty {
                let known = Set(try connection.query("SELECT app_id FROM apps WHERE app_id = ANY(\(array: Array(apps)))").map { try $0.decode(0, as: String.self) })
                if let missing = apps.subtracting(known).sorted().first { throw FieldError("target", "there is no app \"\(missing)\"") }
            }
            let given = Array(wanted.values)
            var mapped = Set<String>()
            for row in try connection.query("""
                SELECT m.source, m.kind, m.external, m.target FROM network_mappings m
                JOIN unnest(\(array: given.map(\.source.rawValue))::text[], \(array: given.map(\.kind.rawValue))::text[], \(array: given.map(\.external))::text[]) AS g (source, kind, external)
                  ON g.source = m.source AND g.kind = m.kind AND g.external = m.external
                """) {
                let stored = Mapping(
                    source: NetworkReportSource(rawValue: try row.decode(0)) ?? .csv, kind: Mapping.Kind(rawValue: try row.decode(1)) ?? .app,
                    external: try row.decode(2), target: try row.decode(3)
                )
                if let asked = wanted[stored.key], asked.target != stored.target {
                    throw FieldError("mappings", "\(stored.key) is mapped to \(stored.target) already; delete that mapping first (adtally networks unmap) to map it to \(asked.target)")
                }
                mapped.insert(stored.key)
            }
            let new = given.filter { !mapped.contains($0.key) }
            guard !new.isEmpty else { return 0 }
            try connection.query("""
                INSERT INTO network_mappings (source, kind, external, target)
                SELECT * FROM unnest(\(array: new.map(\.source.rawValue))::text[], \(array: new.map(\.kind.rawValue))::text[], \(array: new.map(\.external))::text[], \(array: new.map(\.target))::text[])
                """)
            return new.count
        }
    }

    /// Every mapping, by source, kind and name; only `source`'s when given.
    public func mappings(source: NetworkReportSource? = nil) async throws -> [Mapping] {
        try await pool.query("""
            SELECT source, kind, external, target FROM network_mappings WHERE \(source?.rawValue)::text IS NULL OR source = \(source?.rawValue)::text
            ORDER BY source, kind, external
            """).map { row in
            Mapping(
                source: NetworkReportSource(rawValue: try row.decode(0)) ?? .csv, kind: Mapping.Kind(rawValue: try row.decode(1)) ?? .app,
                external: try row.decode(2), target: try row.decode(3)
            )
        }
    }

    /// Deletes one mapping; false when there was none. Imports already made keep the
    /// app and network they were mapped to.
    public func deleteMapping(source: NetworkReportSource, kind: Mapping.Kind, external: String) async throws -> Bool {
        try await !pool.query("""
            DELETE FROM network_mappings WHERE source = \(source.rawValue)::text AND kind = \(kind.rawValue)::text AND external = \(external)::text RETURNING 1
            """).isEmpty
    }

    /// Mappings from a CSV of `external,app` (the network's app id and AdTally's app id),
    /// as `adtally networks import --app-map` takes them.
    public static func appMap(csv bytes: [UInt8], source: NetworkReportSource) throws -> [Mapping] {
        let records = CSVRecordReader.records(of: bytes)
        guard let header = records.first?.fields.map({ $0.trimmingCharacters(in: .whitespaces).lowercased() }),
              let external = header.firstIndex(of: "external"), let app = header.firstIndex(of: "app") else {
            throw FieldError("app map", "must be a CSV with the header external,app (the network's app id, the AdTally app id)")
        }
        return try records.dropFirst().map { record in
            guard external < record.fields.count, app < record.fields.count else { throw FieldError("app map: line \(record.line)", "must have external and app") }
            return Mapping(
                source: source, kind: .app, external: record.fields[external].trimmingCharacters(in: .whitespaces),
                target: record.fields[app].trimmingCharacters(in: .whitespaces)
            )
        }
    }

    // MARK: - Settings

    /// A network's reconciliation settings.
    public struct Settings: Sendable, Equatable, Codable {
        public var network: String
        /// Percent beyond which a discrepancy is flagged.
        public var tolerancePct: Double
        /// Days after a day until the network's figures for it are final.
        public var finalAfterDays: Int
        /// Whose revenue reports show for the network (Migrations/0016): `sdk`, or
        /// `network_when_final` (its final earnings for its final days).
        public var revenueSource: String

        /// The revenue policies a network can have.
        public static let revenueSources = ["sdk", "network_when_final"]

        /// The defaults of a network without settings: 10 %, 3 days, SDK revenue.
        public static func defaults(_ network: String) -> Settings {
            Settings(network: network, tolerancePct: ReconciliationRow.defaultTolerancePct, finalAfterDays: 3, revenueSource: "sdk")
        }

        public init(network: String, tolerancePct: Double, finalAfterDays: Int, revenueSource: String) {
            self.network = network
            self.tolerancePct = tolerancePct
            self.finalAfterDays = finalAfterDays
            self.revenueSource = revenueSource
        }

        enum CodingKeys: String, CodingKey {
            case network
            case tolerancePct = "tolerance_pct"
            case finalAfterDays = "final_after_days"
            case revenueSource = "revenue_source"
        }
    }

    /// Sets a network's tolerance, restatement window and revenue policy (those given;
    /// the rest keep their values or the defaults).
    public func setSettings(network: String, tolerancePct: Double?, finalAfterDays: Int?, revenueSource: String? = nil) async throws -> Settings {
        guard EventValidator.isNetworkName(network) else { throw FieldError("network", "must match [a-z0-9_.-]{1,32}") }
        // Stored to 2 decimals: checked as stored (5e-324 is above 0 but stores as 0.00).
        let tolerancePct = tolerancePct.map { ($0 * 100).rounded() / 100 }
        if let tolerancePct, !(tolerancePct >= 0.01 && tolerancePct <= 100) { throw FieldError("tolerance_pct", "must be a percentage from 0.01 to 100") }
        if let finalAfterDays, !(0...60).contains(finalAfterDays) { throw FieldError("final_after_days", "must be a whole number of days from 0 to 60") }
        if let revenueSource, !Settings.revenueSources.contains(revenueSource) {
            throw FieldError("revenue_source", "must be sdk (the SDKs' and the rate card's amounts) or network_when_final (the network's earnings for its final days)")
        }
        let defaults = Settings.defaults(network)
        let row = try await pool.query("""
            INSERT INTO network_settings AS s (network, tolerance_pct, final_after_days, revenue_source)
            VALUES (\(network), round(\(tolerancePct ?? defaults.tolerancePct)::numeric, 2), \(finalAfterDays ?? defaults.finalAfterDays), \(revenueSource ?? defaults.revenueSource))
            ON CONFLICT (network) DO UPDATE SET
                tolerance_pct = CASE WHEN \(tolerancePct)::float8 IS NULL THEN s.tolerance_pct ELSE excluded.tolerance_pct END,
                final_after_days = CASE WHEN \(finalAfterDays)::int IS NULL THEN s.final_after_days ELSE excluded.final_after_days END,
                revenue_source = CASE WHEN \(revenueSource)::text IS NULL THEN s.revenue_source ELSE excluded.revenue_source END,
                updated_at = excluded.updated_at
            RETURNING tolerance_pct::float8, final_after_days, revenue_source
            """).first!
        return Settings(network: network, tolerancePct: try row.decode(0), finalAfterDays: try row.decode(1), revenueSource: try row.decode(2))
    }

    /// The settings of every network that has some.
    public func settings() async throws -> [Settings] {
        try await pool.query("SELECT network, tolerance_pct::float8, final_after_days, revenue_source FROM network_settings ORDER BY network").map { row in
            Settings(network: try row.decode(0), tolerancePct: try row.decode(1), finalAfterDays: try row.decode(2), revenueSource: try row.decode(3))
        }
    }

    // MARK: - Imports

    /// What an import did.
    public struct ImportResult: Sendable, Equatable, Codable {
        public var importID: Int64
        public var source: NetworkReportSource
        /// The zone its days are in.
        public var timezone: String
        public var firstDay: String?
        public var lastDay: String?
        /// Lines read, and rows stored (lines summed by app, network, day, format, country and currency).
        public var lines: Int
        public var rows: Int
        public var apps: [String]
        public var networks: [String]
        /// App, network and days an earlier import of the same source had figures for, now replaced (restated).
        public var replaced: Int
        /// The network's own warnings about the data.
        public var warnings: [String]
        /// Lines left out and why (LevelPlay's offerwall).
        public var leftOut: [String: Int]
        /// The earlier import of the same source whose file had the same bytes (nil:
        /// none): networks restate old months, so it is stored again, and said.
        public var identicalTo: Int64?
        /// The app × currency pairs whose earnings no FX rate converts into the app's
        /// currency on some of their days: the reconciliation of those days in the app's
        /// currency is refused (422) until the rates are imported.
        public var fxMissing: [String] = []
        /// Per app and network, the days of an earlier import of the same source this one
        /// replaced, and the formats those days had that this file has none of (now zero).
        public var restated: [Restated] = []
        /// Comparisons this import ended: an app's network is compared with the source and
        /// zone of its newest import, so the days another source (or, with `replace_zone`,
        /// another zone) had for it are no longer compared in a range that includes this one's.
        public var comparisonsEnded: [Ended] = []

        /// Days of an app's network an earlier import had, replaced by this one.
        public struct Restated: Sendable, Equatable, Codable {
            public var app: String
            public var network: String
            /// The days, as `YYYY-MM-DD` or `YYYY-MM-DD..YYYY-MM-DD` spans.
            public var days: [String]
            public var dayCount: Int
            /// The imports whose figures for those days this one replaced.
            public var earlierImports: [Int64]
            /// The earlier zone, when the restatement changed it (`replace_zone`).
            public var earlierTimezone: String?
            /// Formats those days had that this file has no line for: zero from now on.
            public var formatsDropped: [Dropped]

            enum CodingKeys: String, CodingKey {
                case app, network, days
                case dayCount = "day_count"
                case earlierImports = "earlier_imports"
                case earlierTimezone = "earlier_timezone"
                case formatsDropped = "formats_dropped"
            }
        }

        /// A format an earlier import had on days this one replaced, and what it had.
        public struct Dropped: Sendable, Equatable, Codable {
            public var format: String
            public var dayCount: Int
            public var impressions: Int64
            /// Per currency, micros.
            public var revenueMicros: [String: Int64]

            enum CodingKeys: String, CodingKey {
                case format, impressions
                case dayCount = "day_count"
                case revenueMicros = "revenue_micros"
            }
        }

        /// Days of an app's network from another source or zone that are no longer compared.
        public struct Ended: Sendable, Equatable, Codable {
            public var app: String
            public var network: String
            public var source: String
            public var timezone: String
            public var days: [String]
            public var dayCount: Int

            enum CodingKeys: String, CodingKey {
                case app, network, source, timezone, days
                case dayCount = "day_count"
            }
        }

        enum CodingKeys: String, CodingKey {
            case restated
            case comparisonsEnded = "comparisons_ended"
            case fxMissing = "fx_missing"
            case source, timezone, lines, rows, apps, networks, replaced, warnings
            case identicalTo = "identical_to"
            case importID = "import_id"
            case firstDay = "first_day"
            case lastDay = "last_day"
            case leftOut = "left_out"
        }
    }

    /// Stores a report, all or none: every line's app and network mapped (by the
    /// mappings, else an AdTally app id or a network name as it is), or the first that
    /// cannot be is refused naming its line.
    ///
    /// An app's network whose earlier figures from the same source are in another zone is
    /// refused unless `replaceZone` (a day in one zone is not that day in another, and the
    /// earlier days would no longer be compared); a pull takes its API's zone as stated.
    public func importReport(_ report: NetworkReport, fileSHA256: String, via: String, replaceZone: Bool = false) async throws -> ImportResult {
        try await pool.withTransaction { connection in
            // The mappings are read under a share lock: one changed meanwhile cannot leave
            // half a file mapped the old way.
            try connection.execute(unsafeSQL: "LOCK TABLE network_mappings IN SHARE MODE")
            var appMap: [String: String] = [:], networkMap: [String: String] = [:]
            for row in try connection.query("SELECT kind, external, target FROM network_mappings WHERE source = \(report.source.rawValue)") {
                let (kind, external, target): (String, String, String) = (try row.decode(0), try row.decode(1), try row.decode(2))
                if kind == "app" { appMap[external] = target } else { networkMap[external] = target }
            }
            let source = report.source.rawValue
            // The import's row first: on Citus a reference table must be written before any
            // statement of the transaction reads a distributed table across shards
            // (app_networks, network_report_rows); a refused file rolls it back.
            let importID = try connection.query("""
                INSERT INTO network_imports (source, zone, file_sha256, first_day, last_day, lines, is_delayed, has_range, warnings, via)
                VALUES (\(source), \(report.zone), \(fileSHA256), \(report.firstDay.map(ReportQuery.formatDate))::date, \(report.lastDay.map(ReportQuery.formatDate))::date,
                        \(report.lines.count), \(report.isDelayed), \(report.hasRange), \(array: report.warnings)::text[], \(via))
                RETURNING import_id
                """).first!.decode(0, as: Int64.self)
            let identical = try connection.query("""
                SELECT max(import_id) FROM network_imports WHERE source = \(source) AND file_sha256 = \(fileSHA256) AND import_id <> \(importID)
                """).first?.decode(0, as: Int64?.self)
            // Each app's first day of data in AdTally, in the file's zone: a network's day
            // before it has nothing to be compared with (1900 for 2019 is a typo).
            var firstDays: [String: Int] = [:]
            func firstDay(of app: String) throws -> Int? {
                if let known = firstDays[app] { return known == Int.min ? nil : known }
                let day = try ReportEngine.firstDataDay(of: app, in: report.zone, on: connection)
                firstDays[app] = day ?? Int.min
                return day
            }
            let written = Array(Set(report.lines.map(\.app)))
            let bareNames = written.compactMap { $0.split(separator: "/", maxSplits: 1).count == 2 ? String($0.split(separator: "/", maxSplits: 1)[1]) : nil }
            let apps = Set(try connection.query("""
                SELECT app_id FROM apps WHERE app_id = ANY(\(array: written + bareNames + Array(Set(appMap.values))))
                """).map { try $0.decode(0, as: String.self) })
            func app(of line: NetworkReportLine) throws -> String {
                // MAX writes "platform/package": a mapping of either, or an app id as either.
                let parts = line.app.split(separator: "/", maxSplits: 1)
                let bare = parts.count == 2 ? String(parts[1]) : nil
                if let mapped = appMap[line.app] ?? bare.flatMap({ appMap[$0] }) {
                    guard apps.contains(mapped) else { throw FieldError("\(line.position): app", "\"\(line.app.prefix(80))\" is mapped to app \(mapped), which no longer exists") }
                    return mapped
                }
                if apps.contains(line.app) { return line.app }
                if let bare, apps.contains(bare) { return bare }
                throw FieldError(
                    "\(line.position): app", "\"\(line.app.prefix(80))\" is no AdTally app and is not mapped to one; map it (adtally networks map --source \(source) --app \(ShellText.quoted(String(line.app.prefix(200)))) --to APP, or --app-map FILE)"
                )
            }
            // The networks each app's events name: a network report's name that is not a
            // known spelling must be one of them (or mapped), so a typo is refused, not kept.
            var admitted: [String: Set<String>] = [:]
            for row in try connection.query("SELECT app_id, network FROM app_networks WHERE app_id = ANY(\(array: Array(apps)))") {
                admitted[try row.decode(0, as: String.self), default: []].insert(try row.decode(1, as: String.self))
            }
            func network(of line: NetworkReportLine, app: String) throws -> String {
                if let mapped = networkMap[line.network] { return mapped }
                // The app's own name for it first (its events say "facebook": keep that), then a known spelling.
                if let name = NetworkNames.plain(line.network, source: report.source), admitted[app]?.contains(name) == true { return name }
                if let known = NetworkNames.known(line.network) { return known }
                throw FieldError(
                    "\(line.position): network", "\"\(line.network.prefix(80))\" is neither a known spelling of a network nor one \(app)'s events name; map it (adtally networks map --source \(source) --network \(ShellText.quoted(String(line.network.prefix(200)))) --to NAME)"
                )
            }
            // Each line, mapped, goes to a table of this transaction a chunk at a time, and
            // PostgreSQL sums them by app, network, day, format, country and currency: half a
            // million distinct keys summed here took a dictionary of ~130 MB.
            try connection.execute(unsafeSQL: """
                CREATE TEMPORARY TABLE import_lines (
                    app_id text, network text, day date, format text, country text, currency text,
                    impressions bigint, clicks bigint, revenue_micros bigint
                ) ON COMMIT DROP
                """)
            // What the rows cover (app, network, day, formats) and what earns in which currency: small sets.
            struct Earning: Hashable { var app, currency: String; var day: Int }
            var formatsByDay: [AppNetwork: [Int: Set<String>]] = [:]
            var earning = Set<Earning>()
            var part: [(app: String, network: String, line: NetworkReportLine)] = []
            part.reserveCapacity(Self.chunk)
            func write() throws {
                guard !part.isEmpty else { return }
                try connection.query("""
                    INSERT INTO import_lines
                    SELECT * FROM unnest(\(array: part.map(\.app))::text[], \(array: part.map(\.network))::text[], \(array: part.map { ReportQuery.formatDate($0.line.day) })::date[],
                                         \(array: part.map(\.line.format.rawValue))::text[], \(array: part.map { $0.line.country ?? "ZZ" })::text[], \(array: part.map(\.line.currency))::text[],
                                         \(array: part.map(\.line.impressions))::bigint[], \(array: part.map { $0.line.clicks ?? -1 })::bigint[], \(array: part.map(\.line.revenueMicros))::bigint[])
                    """)
                part.removeAll(keepingCapacity: true)
            }
            // A file a person chose is refused at such a line (1900 for 2019 is a typo); a
            // pull's restatement window may reach before an app's first event, and its
            // lines there are left out and counted instead.
            var leftOut = report.leftOut
            for line in report.lines {
                let app = try app(of: line)
                let first = try firstDay(of: app)
                guard let first, line.day >= first else {
                    if via == "pull" {
                        leftOut["before the app's first event", default: 0] += 1
                        continue
                    }
                    guard let first else {
                        throw FieldError("\(line.position): app", "\(app) has no events in AdTally yet: there is nothing to compare the network's figures with")
                    }
                    throw FieldError(
                        "\(line.position): day",
                        "is \(ReportQuery.formatDate(line.day)), before \(app)'s first event in AdTally (\(ReportQuery.formatDate(first)) in \(report.zone)): there is nothing to compare it with"
                    )
                }
                let network = try network(of: line, app: app)
                formatsByDay[AppNetwork(app: app, network: network), default: [:]][line.day, default: []].insert(line.format.rawValue)
                if line.revenueMicros != 0 { earning.insert(Earning(app: app, currency: line.currency, day: line.day)) }
                part.append((app, network, line))
                if part.count == Self.chunk { try write() }
            }
            try write()
            // A key's sums past what a bigint holds (10^12 units a line, half a million lines).
            if let row = try connection.query("""
                SELECT app_id, network, day::text FROM import_lines GROUP BY app_id, network, day, format, country, currency
                HAVING sum(revenue_micros) > 9223372036854775807 OR sum(impressions) > 9223372036854775807 LIMIT 1
                """).first {
                throw FieldError("file", "the sums of \(try row.decode(0, as: String.self)) \(try row.decode(1, as: String.self)) on \(try row.decode(2, as: String.self)) are too large to store")
            }
            let (restated, ended) = try Self.supersedes(
                covered: formatsByDay, report: report, importID: importID, replaceZone: replaceZone || via == "pull", on: connection
            )
            let replaced = restated.map(\.dayCount).reduce(0, +)
            // An unknown country is ZZ, as an event's is (Migrations/0001); clicks are summed
            // only where every line of the key has them (MAX's have none).
            // (No data-modifying CTE: Citus plans an INSERT … SELECT into a distributed table only bare.)
            let rows = try connection.query("""
                INSERT INTO network_report_rows (app_id, network, day, import_id, format, country, currency, impressions, clicks, revenue_micros)
                SELECT app_id, network, day, \(importID), format, country, currency, sum(impressions)::bigint,
                       CASE WHEN bool_and(clicks >= 0) THEN sum(clicks)::bigint END, sum(revenue_micros)::bigint
                FROM import_lines GROUP BY app_id, network, day, format, country, currency
                """).affectedRows
            // Earnings in a currency no FX rate converts to the app's own on their day.
            let earnings = Array(earning)
            let fxMissing = try connection.query("""
                SELECT r.app_id, r.currency, a.currency, min(r.day)::text, max(r.day)::text, count(DISTINCT r.day)::int
                FROM unnest(\(array: earnings.map(\.app))::text[], \(array: earnings.map(\.currency))::text[], \(array: earnings.map { ReportQuery.formatDate($0.day) })::date[])
                     AS r (app_id, currency, day)
                JOIN apps a ON a.app_id = r.app_id
                WHERE r.currency <> a.currency::text AND NOT EXISTS (
                    SELECT 1 FROM fx_rates t JOIN fx_rates f ON f.day = t.day AND f.base = t.base AND f.currency = r.currency
                    WHERE t.day = r.day AND t.currency = a.currency::text
                )
                GROUP BY 1, 2, 3 ORDER BY 1, 2
                """).map { row -> String in
                let (app, currency, appCurrency): (String, String, String) = (try row.decode(0), try row.decode(1), try row.decode(2))
                let (first, last, days): (String, String, Int) = (try row.decode(3), try row.decode(4), try row.decode(5))
                return "\(app): no FX rate converts \(currency) to \(appCurrency) on \(days) day\(days == 1 ? "" : "s") from \(first) to \(last); "
                    + "its reconciliation in \(appCurrency) over them is refused (422) until the rates are imported (adtally fx import, POST /v1/fx)"
            }
            let pairs = formatsByDay.keys.sorted()
            try connection.query("""
                INSERT INTO network_import_pairs (app_id, network, import_id)
                SELECT app_id, network, \(importID) FROM unnest(\(array: pairs.map(\.app))::text[], \(array: pairs.map(\.network))::text[]) AS p (app_id, network)
                """)
            return ImportResult(
                importID: importID, source: report.source, timezone: report.zone,
                firstDay: report.firstDay.map(ReportQuery.formatDate), lastDay: report.lastDay.map(ReportQuery.formatDate),
                lines: report.lines.count, rows: rows, apps: Set(pairs.map(\.app)).sorted(), networks: Set(pairs.map(\.network)).sorted(),
                replaced: replaced, warnings: report.warnings, leftOut: leftOut, identicalTo: identical, fxMissing: fxMissing,
                restated: restated, comparisonsEnded: ended
            )
        }
    }

    /// What an import about to store rows `covered` (app, network → day → formats) supersedes: the
    /// days of its apps' networks an earlier import of its source had, and the formats of
    /// them it has no line for; and the days of another source (or zone) no longer
    /// compared. A zone that differs from the same source's earlier figures for an app's
    /// network is refused unless `replaceZone`.
    static func supersedes(
        covered: [AppNetwork: [Int: Set<String>]], report: NetworkReport, importID: Int64, replaceZone: Bool,
        on connection: PostgresConnection
    ) throws -> (restated: [ImportResult.Restated], ended: [ImportResult.Ended]) {
        typealias Pair = AppNetwork
        var covered = covered
        // A file that states its range (AdMob's) covers every day of it: one without a line is a zero.
        if report.hasRange, let first = report.firstDay, let last = report.lastDay {
            for pair in covered.keys { for day in first...last { covered[pair]![day, default: []].formUnion([]) } }
        }
        guard !covered.isEmpty else { return ([], []) }
        let pairs = covered.keys.sorted()
        struct Earlier { var importID: Int64; var source, zone: String; var formats: [String: (impressions: Int64, revenue: [String: Int64])] = [:] }
        var earlier: [Pair: [String: [Int: Earlier]]] = [:]  // pair → source → day
        // Each earlier day's current import per source, as the reconciliation engine finds
        // it (ReconciliationEngine.coverageSQL): the days a file has lines for, and every
        // day of a range a file states (AdMob's: a day without a line is a zero).
        let p: PostgresQuery = "SELECT * FROM unnest(\(array: pairs.map(\.app))::text[], \(array: pairs.map(\.network))::text[]) AS p (app_id, network)"
        var sourceOf: [Int64: String] = [:]
        for row in try connection.query("""
            WITH p AS (\(p)), ranged AS (
                SELECT DISTINCT r.import_id, r.app_id, r.network FROM network_report_rows r JOIN p ON p.app_id = r.app_id AND p.network = r.network
                WHERE r.import_id <> \(importID) AND r.import_id IN (SELECT import_id FROM network_imports WHERE has_range)
            ), days AS (
                SELECT g.import_id, g.app_id, g.network, d.day::date AS day
                FROM ranged g JOIN network_imports i ON i.import_id = g.import_id
                CROSS JOIN LATERAL generate_series(i.first_day, i.last_day, interval '1 day') AS d (day)
                UNION
                SELECT r.import_id, r.app_id, r.network, r.day FROM network_report_rows r JOIN p ON p.app_id = r.app_id AND p.network = r.network
                WHERE r.import_id <> \(importID)
            )
            SELECT DISTINCT ON (c.app_id, c.network, c.day, i.source) c.app_id, c.network, c.day::text, i.source, i.zone, c.import_id
            FROM days c JOIN network_imports i ON i.import_id = c.import_id
            ORDER BY c.app_id, c.network, c.day, i.source, c.import_id DESC
            """) {
            guard let day = ReportQuery.parseDate(try row.decode(2, as: String.self)) else { continue }
            let (source, zone, id): (String, String, Int64) = (try row.decode(3), try row.decode(4), try row.decode(5))
            earlier[Pair(app: try row.decode(0), network: try row.decode(1)), default: [:]][source, default: [:]][day] = Earlier(importID: id, source: source, zone: zone)
            sourceOf[id] = source
        }
        // Their figures by format (a day of a range without lines has none).
        if !sourceOf.isEmpty {
            for row in try connection.query("""
                WITH p AS (\(p))
                SELECT r.app_id, r.network, r.day::text, r.import_id, r.format, r.currency, sum(r.impressions)::bigint, sum(r.revenue_micros)::bigint
                FROM network_report_rows r JOIN p ON p.app_id = r.app_id AND p.network = r.network
                WHERE r.import_id = ANY(\(array: Array(sourceOf.keys))::bigint[])
                GROUP BY 1, 2, 3, 4, 5, 6
                """) {
                let pair = Pair(app: try row.decode(0), network: try row.decode(1))
                let id: Int64 = try row.decode(3)
                guard let day = ReportQuery.parseDate(try row.decode(2, as: String.self)), let source = sourceOf[id],
                      var entry = earlier[pair]?[source]?[day], entry.importID == id else { continue }
                let (format, currency): (String, String) = (try row.decode(4), try row.decode(5))
                var figures = entry.formats[format] ?? (0, [:])
                figures.impressions += try row.decode(6, as: Int64.self)
                figures.revenue[currency, default: 0] += try row.decode(7, as: Int64.self)
                entry.formats[format] = figures
                earlier[pair]![source]![day] = entry
            }
        }
        let mine = report.source.rawValue
        var restated: [ImportResult.Restated] = []
        var ended: [ImportResult.Ended] = []
        for pair in pairs {
            let days = covered[pair]!
            let bySource = earlier[pair] ?? [:]
            // The engine compares an app's network with the source and zone of its newest
            // import: before this one, that of the newest earlier day's import.
            let current = bySource.values.flatMap(\.values).max { $0.importID < $1.importID }
            // The same source's newest figures for it, whose zone a restatement keeps.
            if let newest = bySource[mine]?.values.max(by: { $0.importID < $1.importID }), newest.zone != report.zone, !replaceZone {
                let spans = Self.spans(bySource[mine]!.filter { $0.value.zone == newest.zone }.map(\.key))
                throw FieldError(
                    "timezone",
                    "this \(mine) report is in \(report.zone), but \(pair.app) \(pair.network)'s \(mine) figures are in \(newest.zone) (import \(newest.importID); \(spans.joined(separator: ", "))). "
                        + "A day in one zone is not that day in another, and the comparisons of those days would end. "
                        + "Import a report exported in \(newest.zone) (for a file that states no zone: --timezone \(newest.zone), API timezone=), or, if the network's reporting zone changed, ask for the change (--replace-zone, API replace_zone=true)"
                )
            }
            if let byDay = bySource[mine] {
                let replacedDays = byDay.keys.filter { days[$0] != nil }.sorted()
                if !replacedDays.isEmpty {
                    var dropped: [String: ImportResult.Dropped] = [:]
                    for day in replacedDays {
                        for (format, figures) in byDay[day]!.formats where !days[day]!.contains(format) {
                            var entry = dropped[format] ?? ImportResult.Dropped(format: format, dayCount: 0, impressions: 0, revenueMicros: [:])
                            entry.dayCount += 1
                            entry.impressions += figures.impressions
                            for (currency, micros) in figures.revenue { entry.revenueMicros[currency, default: 0] += micros }
                            dropped[format] = entry
                        }
                    }
                    let zones = Set(replacedDays.map { byDay[$0]!.zone }).subtracting([report.zone])
                    restated.append(ImportResult.Restated(
                        app: pair.app, network: pair.network, days: Self.spans(replacedDays), dayCount: replacedDays.count,
                        earlierImports: Set(replacedDays.map { byDay[$0]!.importID }).sorted(), earlierTimezone: zones.sorted().first,
                        formatsDropped: dropped.values.sorted { $0.format < $1.format }
                    ))
                }
            }
            // Ended: the days of the source and zone compared until now, when this import
            // moves the comparison to another (its days this import replaced aside).
            if let current, current.source != mine || current.zone != report.zone {
                let left = (bySource[current.source] ?? [:]).filter { $0.value.zone == current.zone && !(current.source == mine && days[$0.key] != nil) }
                let zoneDays = left.keys.sorted()
                if !zoneDays.isEmpty {
                    ended.append(ImportResult.Ended(
                        app: pair.app, network: pair.network, source: current.source, timezone: current.zone, days: Self.spans(zoneDays), dayCount: zoneDays.count
                    ))
                }
            }
        }
        return (restated, ended)
    }

    /// Days as spans: `2026-11-01..2026-11-07`, `2026-11-09`.
    static func spans(_ days: [Int]) -> [String] {
        var spans: [String] = []
        var start: Int?, previous: Int?
        func close() {
            guard let start, let previous else { return }
            spans.append(start == previous ? ReportQuery.formatDate(start) : "\(ReportQuery.formatDate(start))..\(ReportQuery.formatDate(previous))")
        }
        for day in Set(days).sorted() {
            if let last = previous, day == last + 1 { previous = day; continue }
            close()
            start = day
            previous = day
        }
        close()
        return spans
    }

    /// An app's network, as imports cover them.
    struct AppNetwork: Hashable, Comparable {
        var app, network: String
        static func < (a: AppNetwork, b: AppNetwork) -> Bool { (a.app, a.network) < (b.app, b.network) }
    }

    /// An import as listed.
    public struct ImportSummary: Sendable, Equatable, Codable {
        public var importID: Int64
        public var source: String
        public var timezone: String
        public var firstDay: String?
        public var lastDay: String?
        public var lines: Int
        public var isDelayed: Bool
        public var warnings: [String]
        public var via: String
        public var importedAt: String
        /// App, network and days it has figures for and is its source's newest import with figures for.
        public var current: Int

        enum CodingKeys: String, CodingKey {
            case source, timezone, lines, warnings, via, current
            case importID = "import_id"
            case firstDay = "first_day"
            case lastDay = "last_day"
            case isDelayed = "is_delayed"
            case importedAt = "imported_at"
        }
    }

    /// The newest imports first.
    public func imports(limit: Int = 100) async throws -> [ImportSummary] {
        try await pool.query("""
            WITH current AS (
                SELECT DISTINCT ON (r.app_id, r.network, r.day, i.source) r.import_id
                FROM network_report_rows r JOIN network_imports i ON i.import_id = r.import_id
                ORDER BY r.app_id, r.network, r.day, i.source, r.import_id DESC
            )
            SELECT i.import_id, i.source, i.zone, i.first_day::text, i.last_day::text, i.lines, i.is_delayed, to_json(i.warnings)::text, i.via,
                   to_char(i.imported_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                   (SELECT count(*) FROM current c WHERE c.import_id = i.import_id)::int
            FROM network_imports i ORDER BY i.import_id DESC LIMIT \(limit)
            """).map { row in
            ImportSummary(
                importID: try row.decode(0), source: try row.decode(1), timezone: try row.decode(2), firstDay: try row.decode(3), lastDay: try row.decode(4),
                lines: try row.decode(5), isDelayed: try row.decode(6), warnings: try Self.strings(row.decode(7)), via: try row.decode(8), importedAt: try row.decode(9),
                current: try row.decode(10)
            )
        }
    }

    /// A JSON array of strings as PostgreSQL's to_json writes a text[].
    static func strings(_ json: String) throws -> [String] {
        try JSONDecoder().decode([String].self, from: Data(json.utf8))
    }
}
