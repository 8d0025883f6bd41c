import AdTallyApp
import AdTallyCore
import AdTallyStorage
import ArgumentParser
import Foundation

extension NetworkReportSource: ExpressibleByArgument {}

/// `adtally networks import|imports|map|unmap|mappings|settings|pulls`: the networks' own
/// reports (DESIGN §11) and what is needed to compare them.
struct NetworksCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "networks", abstract: "Import the networks' own reports, map their names for apps and networks, set tolerances.",
        discussion: """
            Examples:
              adtally networks import --source admob admob-2026-11.json --app-map admob-apps.csv
              adtally networks import --source max max-report.csv
              adtally networks map --source levelplay --app 1a2b3c4d --to my-game
              adtally networks settings levelplay --tolerance-pct 15 --final-after-days 3
              adtally networks pulls set admob-main --source admob --endpoint https://admob.googleapis.com/v1/accounts/pub-123/networkReport:generate --credential-file token.txt
              adtally reconcile --apps my-game --days 30
            """,
        subcommands: [Import.self, Imports.self, Map.self, Unmap.self, Mappings.self, Settings.self, Pulls.self]
    )

    struct Import: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Import a network's report, all or none; a later import replaces an earlier one for the app, network and day it has figures for."
        )
        @OptionGroup var database: DatabaseOptions
        @Option(help: "admob, max, levelplay or csv (date,app,network,format,country,impressions,clicks,revenue,currency[,timezone]).")
        var source: NetworkReportSource
        @Option(help: "A CSV of external,app (the network's app id, the AdTally app id), stored as mappings before the import.")
        var appMap: String?
        @Option(help: "The zone the report's days are in, when not the source's own (AdMob: its header's, else America/Los_Angeles; the others: UTC).")
        var timezone: String?
        @Flag(help: "Take a report whose zone differs from the same source's earlier figures for an app's network (the network's reporting zone changed); their days no longer compared are listed.")
        var replaceZone = false
        @Argument(help: "The report file.") var file: String

        func run() async throws {
            // The file's bytes are let go once read: the import holds its lines only.
            let (report, sha256) = try { () throws -> (NetworkReport, String) in
                let bytes = try readFile(file, atMost: NetworkReport.maxBytes)
                let sha256 = SHA256.hex(bytes)
                return (try NetworkReport.parse(consume bytes, source: source, zone: timezone), sha256)
            }()
            let mappings = try appMap.map { try NetworkReportStore.appMap(csv: readFile($0, atMost: NetworkReport.maxBytes, what: "--app-map"), source: source) } ?? []
            let result = try await database.withDatabase { database, _ in
                let store = NetworkReportStore(pool: database.pool)
                if !mappings.isEmpty { try await store.setMappings(mappings) }
                return try await store.importReport(report, fileSHA256: sha256, via: "cli", replaceZone: replaceZone)
            }
            print("import \(result.importID): \(result.lines) lines, \(result.rows) rows, \(result.firstDay ?? "-") to \(result.lastDay ?? "-") (\(result.timezone)); "
                + "apps \(result.apps.joined(separator: ",")); networks \(result.networks.joined(separator: ","))")
            for restated in result.restated {
                print("replaced: \(restated.app) \(restated.network) \(restated.days.joined(separator: ", ")) (\(restated.dayCount) day\(restated.dayCount == 1 ? "" : "s") of import "
                    + restated.earlierImports.map(String.init).joined(separator: ", ") + (restated.earlierTimezone.map { ", which was in \($0)" } ?? "") + ")")
                for dropped in restated.formatsDropped {
                    let money = dropped.revenueMicros.sorted { $0.key < $1.key }.map { "\(Money.format(micros: Int128($0.value), currency: $0.key)) \($0.key)" }.joined(separator: ", ")
                    print("  \(dropped.format): none in this file, so zero from now on on \(dropped.dayCount) of those days (it had \(dropped.impressions) impressions" + (money.isEmpty ? "" : ", \(money)") + ")")
                }
            }
            for ended in result.comparisonsEnded {
                print("no longer compared: \(ended.app) \(ended.network) \(ended.days.joined(separator: ", ")) from \(ended.source) (\(ended.timezone)), in a range that includes this import's days")
            }
            for missing in result.fxMissing { print("warning: \(missing)") }
            if let earlier = result.identicalTo { print("identical: the file is byte for byte import \(earlier)'s; its figures replace that import's as a restatement would") }
            for warning in result.warnings { print("network warning: \(warning)") }
            for (what, count) in result.leftOut.sorted(by: { $0.key < $1.key }) { print("left out: \(count) \(what) lines" + (what == "offerwall" ? " (AdTally has no such format)" : "")) }
        }
    }

    struct Imports: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List the imports, newest first, with how many app-network-days each is current for.")
        @OptionGroup var database: DatabaseOptions
        @Option(help: "table or json.") var format = OutputFormat.table

        func run() async throws {
            let imports = try await database.withDatabase { database, _ in try await NetworkReportStore(pool: database.pool).imports() }
            if format == .json { return try printJSON(["imports": imports]) }
            printTable(
                ["ID", "SOURCE", "ZONE", "FROM", "TO", "LINES", "CURRENT", "VIA", "IMPORTED", "WARNINGS"],
                imports.map {
                    [String($0.importID), $0.source, $0.timezone, $0.firstDay ?? "", $0.lastDay ?? "", String($0.lines), String($0.current), $0.via, $0.importedAt,
                     $0.warnings.joined(separator: "; ")]
                }
            )
        }
    }

    /// `--app` or `--network`: what a mapping maps.
    struct Named: ParsableArguments {
        @Option(help: "admob, max, levelplay or csv.") var source: NetworkReportSource
        @Option(help: "The network's id for an app (AdMob's ca-app-pub-…~…, MAX's package name or platform/package, LevelPlay's app key).") var app: String?
        @Option(help: "The network's name for an ad source (\"AdMob Network\", SMAATO_BIDDING).") var network: String?

        func kindAndName() throws -> (NetworkReportStore.Mapping.Kind, String) {
            switch (app, network) {
            case let (app?, nil): return (.app, app)
            case let (nil, network?): return (.network, network)
            default: throw ValidationError("give either --app or --network")
            }
        }
    }

    struct Map: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Map a network's name for an app or an ad source to AdTally's; a name maps to one target only.")
        @OptionGroup var database: DatabaseOptions
        @OptionGroup var named: Named
        @Option(help: "The AdTally app id, or network name.") var to: String

        func run() async throws {
            let (kind, external) = try named.kindAndName()
            let mapping = NetworkReportStore.Mapping(source: named.source, kind: kind, external: external, target: to)
            let added = try await database.withDatabase { database, _ in try await NetworkReportStore(pool: database.pool).setMappings([mapping]) }
            print(added == 1 ? "mapped: \(named.source.rawValue) \(kind.rawValue) \(external) -> \(to)" : "already mapped: \(named.source.rawValue) \(kind.rawValue) \(external) -> \(to)")
        }
    }

    struct Unmap: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Delete a mapping (imports already made keep what they were mapped to).")
        @OptionGroup var database: DatabaseOptions
        @OptionGroup var named: Named

        func run() async throws {
            let (kind, external) = try named.kindAndName()
            let found = try await database.withDatabase { database, _ in
                try await NetworkReportStore(pool: database.pool).deleteMapping(source: named.source, kind: kind, external: external)
            }
            guard found else { throw ValidationError("no mapping \(named.source.rawValue) \(kind.rawValue) \(external)") }
            print("unmapped: \(named.source.rawValue) \(kind.rawValue) \(external)")
        }
    }

    struct Mappings: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List the mappings.")
        @OptionGroup var database: DatabaseOptions
        @Option(help: "Only this source's.") var source: NetworkReportSource?
        @Option(help: "table or json.") var format = OutputFormat.table

        func run() async throws {
            let mappings = try await database.withDatabase { database, _ in try await NetworkReportStore(pool: database.pool).mappings(source: source) }
            if format == .json { return try printJSON(["mappings": mappings]) }
            printTable(["SOURCE", "KIND", "EXTERNAL", "TARGET"], mappings.map { [$0.source.rawValue, $0.kind.rawValue, $0.external, $0.target] })
        }
    }

    struct Settings: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Show every network's settings, or set one network's tolerance (percent, default 10), restatement window (days, default 3) and revenue policy (default sdk)."
        )
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The network to change (AdTally's name); none: list.") var network: String?
        @Option(help: "Flag a discrepancy beyond this many percent.") var tolerancePct: Double?
        @Option(help: "A day's figures are final once imported this many days after it.") var finalAfterDays: Int?
        @Option(help: "Whose revenue reports show for it: sdk, or network_when_final (its final earnings for its final days).") var revenueSource: String?
        @Option(help: "table or json.") var format = OutputFormat.table

        func run() async throws {
            try await database.withDatabase { database, _ in
                let store = NetworkReportStore(pool: database.pool)
                if let network {
                    guard tolerancePct != nil || finalAfterDays != nil || revenueSource != nil else {
                        throw ValidationError("give --tolerance-pct, --final-after-days, --revenue-source or several")
                    }
                    let settings = try await store.setSettings(network: network, tolerancePct: tolerancePct, finalAfterDays: finalAfterDays, revenueSource: revenueSource)
                    print("\(settings.network): tolerance \(ReportText.ratio(settings.tolerancePct)) %, final \(settings.finalAfterDays) days after the day, revenue \(settings.revenueSource)")
                    return
                }
                let all = try await store.settings()
                if format == .json { return try printJSON(["settings": all]) }
                printTable(["NETWORK", "TOLERANCE %", "FINAL AFTER DAYS", "REVENUE"], all.map { [$0.network, ReportText.ratio($0.tolerancePct), String($0.finalAfterDays), $0.revenueSource] })
                let defaults = NetworkReportStore.Settings.defaults("")
                print("other networks: tolerance \(ReportText.ratio(defaults.tolerancePct)) %, final \(defaults.finalAfterDays) days after the day, revenue \(defaults.revenueSource)")
            }
        }
    }
}

extension NetworksCommand {
    /// `adtally networks pulls set|list|runs|run-now|delete`: the networks' reports pulled
    /// from their APIs daily by the running server (yesterday and the restatement window).
    struct Pulls: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Pull the networks' reports from their APIs: the running server asks each day for yesterday and the restatement window.",
            subcommands: [Set.self, List.self, Runs.self, RunNow.self, Pause.self, Resume.self, Delete.self]
        )

        struct Set: AsyncParsableCommand {
            static let configuration = CommandConfiguration(
                abstract: "Create or replace a pull; the credential (an API key or bearer token) is read from a file or standard input, stored encrypted, and never shown."
            )
            @OptionGroup var database: DatabaseOptions
            @Argument(help: "Name: a-z, 0-9, - and _.") var name: String
            @Option(help: "admob, max or levelplay.") var source: NetworkReportSource
            @Option(help: "The reporting API's URL (AdMob's .../networkReport:generate, MAX's .../maxReport, LevelPlay's stats URL).") var endpoint: String
            @Option(help: "A file holding the credential, - for standard input (not an argument: a process list would show it).") var credentialFile: String
            @Option(help: "Days before yesterday asked again each day (restated days).") var restatementDays = 3
            @Flag(help: "Create it paused (resume it to start); a pull replaced without it keeps its state.") var paused = false

            func run() async throws {
                let raw = credentialFile == "-" ? Array(FileHandle.standardInput.readDataToEndOfFile().prefix(8192)) : try readFile(credentialFile, atMost: 8192, what: "--credential-file")
                let credential = String(decoding: raw, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
                let saved = try await database.withDatabase { database, _ in
                    try await NetworkPulls(pool: database.pool, key: ProcessInfo.processInfo.environment["ADTALLY_CREDENTIALS_KEY"])
                        .save(NetworkPull(name: name, source: source, endpoint: endpoint, restatementDays: restatementDays, isPaused: paused), credential: credential)
                }
                print("pull \(saved.name): \(saved.source.rawValue) from \(saved.endpoint), yesterday and \(saved.restatementDays) days before, each UTC day\(saved.isPaused ? " (paused)" : "")")
            }
        }

        struct List: AsyncParsableCommand {
            static let configuration = CommandConfiguration(abstract: "List the pulls (without their credentials).")
            @OptionGroup var database: DatabaseOptions
            @Option(help: "table or json.") var format = OutputFormat.table

            func run() async throws {
                let pulls = try await database.withDatabase { database, _ in try await NetworkPulls(pool: database.pool).list() }
                if format == .json { return try printJSON(["pulls": pulls]) }
                printTable(["NAME", "SOURCE", "ENDPOINT", "RESTATEMENT DAYS", "STATE"], pulls.map {
                    [$0.name, $0.source.rawValue, $0.endpoint, String($0.restatementDays), $0.isPaused ? "paused" : "active"]
                })
            }
        }

        struct Runs: AsyncParsableCommand {
            static let configuration = CommandConfiguration(abstract: "A pull's runs (or every pull's), newest day first.")
            @OptionGroup var database: DatabaseOptions
            @Argument(help: "The pull (none: all).") var name: String?
            @Option(help: "Most runs.") var limit = 30
            @Option(help: "table or json.") var format = OutputFormat.table

            func run() async throws {
                let runs = try await database.withDatabase { database, _ in try await NetworkPulls(pool: database.pool).runs(name, limit: limit) }
                if format == .json { return try printJSON(["runs": runs]) }
                printTable(["PULL", "DAY", "STATUS", "ATTEMPTS", "DAYS", "IMPORT", "LINES", "ERROR"], runs.map { run in
                    [run.pull, run.day, run.status, String(run.attempts), run.firstDay.map { "\($0)..\(run.lastDay ?? "")" } ?? "-",
                     run.importID.map(String.init) ?? "-", run.lines.map(String.init) ?? "-", run.error ?? ""]
                })
            }
        }

        struct RunNow: AsyncParsableCommand {
            static let configuration = CommandConfiguration(commandName: "run-now", abstract: "Ask the running server to pull now (today's run, again if it ended).")
            @OptionGroup var database: DatabaseOptions
            @Argument(help: "The pull.") var name: String

            func run() async throws {
                let run = try await database.withDatabase { database, _ in try await NetworkPulls(pool: database.pool).requestRun(name) }
                guard let run else { throw ValidationError("no pull \(name)") }
                print("pull \(run.pull) for \(run.day): \(run.status); the running server's export runner takes it (adtally networks pulls runs \(run.pull))")
            }
        }

        struct Pause: AsyncParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Pause a pull: no run of it is planned or taken until it is resumed.")
            @OptionGroup var database: DatabaseOptions
            @Argument(help: "The pull.") var name: String

            func run() async throws {
                guard try await database.withDatabase({ database, _ in try await NetworkPulls(pool: database.pool).setPaused(name, true) }) else { throw ValidationError("no pull \(name)") }
                print("pull \(name) paused")
            }
        }

        struct Resume: AsyncParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Resume a paused pull (today's run is planned at once).")
            @OptionGroup var database: DatabaseOptions
            @Argument(help: "The pull.") var name: String

            func run() async throws {
                guard try await database.withDatabase({ database, _ in try await NetworkPulls(pool: database.pool).setPaused(name, false) }) else { throw ValidationError("no pull \(name)") }
                print("pull \(name) resumed")
            }
        }

        struct Delete: AsyncParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Delete a pull and its run history (its imports stay).")
            @OptionGroup var database: DatabaseOptions
            @Argument(help: "The pull.") var name: String

            func run() async throws {
                guard try await database.withDatabase({ database, _ in try await NetworkPulls(pool: database.pool).delete(name) }) else { throw ValidationError("no pull \(name)") }
                print("pull \(name) deleted")
            }
        }
    }
}

/// `adtally reconcile`: the discrepancy report of `GET /v1/reconciliation`, with the
/// same options under the same names, from the same engine.
struct ReconcileCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "reconcile",
        abstract: "Compare AdTally's counts with the networks' imported reports: a table on a terminal, CSV or JSON otherwise.",
        discussion: """
            Each network's days are in its report's zone (AdMob's America/Los_Angeles, MAX's and LevelPlay's UTC);
            discrepancy = (1 - ours / network) x 100 %, flagged beyond the network's tolerance.
            Examples:
              adtally reconcile --apps my-game --days 30
              adtally reconcile --days 30 --dimensions network --filter network=admob,applovin --format csv
            """
    )

    @OptionGroup var database: DatabaseOptions
    @Option(help: "Apps, comma-separated (default: all).") var apps: String?
    @Option(help: "First day YYYY-MM-DD.") var from: String?
    @Option(help: "Last day YYYY-MM-DD, inclusive.") var to: String?
    @Option(help: "The N whole days before today (UTC) instead of --from/--to.") var days: Int?
    @Option(help: "Group by any of date, app, network, format, country (default date,app,network,format).") var dimensions: String?
    @Option(name: .customLong("filter"), help: ArgumentHelp("Only these values of app, network, format or country (repeatable).", valueName: "dimension=values"))
    var filters: [String] = []
    @Option(help: "Currency money is shown in (default: the app's; several apps: USD).") var currency: String?
    @Option(help: "table, csv or json (default: a table on a terminal, else CSV).") var format: ReportCommand.Output?
    @Option(help: "Write to this file instead of standard output.") var output: String?

    func run() async throws {
        let toTerminal = output == nil && isatty(STDOUT_FILENO) == 1
        let chosen = format ?? (toTerminal ? .table : .csv)
        var parameters: [(String, String)] = []
        func add(_ name: String, _ value: String?) { if let value { parameters.append((name, value)) } }
        add("apps", apps)
        add("from", from)
        add("to", to)
        add("days", days.map(String.init))
        add("dimensions", dimensions)
        add("currency", currency)
        parameters += try ReportOptions.filterParameters(filters, dimensions: ReconciliationQuery.dimensions)
        try await database.withDatabase { database, logger in
            let reports = database.reportEngine(logger: logger)
            let document: ReconciliationDocument
            do {
                let query = try ReconciliationQuery.parse(parameters, readable: try await reports.readableApps(only: nil), isAdmin: true, output: chosen == .csv ? .csv : .json)
                document = try await ReconciliationEngine(reports: reports).run(query)
            } catch let error as ReportQueryError {
                throw ValidationError(ReportOptions.describe(error))
            } catch let error as ReportCurrencyError {
                throw ValidationError(error.description)
            }
            let sink = try OutputSink(path: output)
            switch chosen {
            case .csv: try sink.write(document.csv())
            case .json: try sink.write(document.json() + [0x0A])
            case .table: try sink.write(Array(Self.table(document).utf8))
            }
            try sink.close()
        }
    }

    /// An aligned table, flagged rows marked with `!`, then the networks' zones and the days not final.
    static func table(_ document: ReconciliationDocument) -> String {
        let header = document.query.report.dimensions.map(\.rawValue) + ReconciliationDocument.metricColumns.map(\.name).filter { $0 != "imports" }
        let rows = document.rows.map { row in
            Array(document.cells(row).map(ReportText.plain).dropLast()).enumerated().map { index, cell in
                index == header.count - 2 && cell == "true" ? "! true" : cell
            }
        }
        let widths = header.indices.map { column in ([header] + rows).map { $0[column].count }.max() ?? 0 }
        func line(_ cells: [String]) -> String {
            cells.indices.map { cells[$0] + String(repeating: " ", count: widths[$0] - cells[$0].count) }.joined(separator: "  ")
        }
        var text = line(header.map { $0.uppercased() }) + "\n"
        for row in rows { text += line(row) + "\n" }
        let report = document.query.report
        text += "\n\(ReportQuery.formatDate(report.from)) to \(ReportQuery.formatDate(report.to)), \(report.currency); discrepancy = (1 - ours / network) x 100 %\n"
        for network in document.networks {
            text += "\(network.name): days in \(network.zone), tolerance \(ReportText.ratio(network.tolerancePct)) %, final \(network.finalAfterDays) days after\n"
        }
        let pending = document.rows.filter { !$0.isFinal }.count
        if pending > 0 { text += "note: \(pending) rows are not final (the network may still restate them, or has not reported them)\n" }
        for remark in document.remarks { text += "note: \(remark)\n" }
        return text
    }
}
