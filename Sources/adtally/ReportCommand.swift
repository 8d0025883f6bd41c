import AdTallyApp
import AdTallyCore
import AdTallyStorage
import ArgumentParser
import Foundation

/// `adtally report`: the report of `GET /v1/reports`, with the same options under the
/// same names, read through the same engine straight from the database.
struct ReportCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "report",
        abstract: "Print a report: a table on a terminal, CSV or JSON otherwise.",
        discussion: """
            Examples:
              adtally report --apps my-app --days 30 --dimensions date,network
              adtally report --days 7 --dimensions app --metrics requests,revenue,ecpm --sort -revenue
              adtally report --apps my-app --from 2026-11-01 --to 2026-11-30 --dimensions date \\
                  --filter network=admob,iad --format csv --output november.csv
            """
    )

    enum Output: String, ExpressibleByArgument, CaseIterable {
        case table, csv, json
    }

    @OptionGroup var database: DatabaseOptions
    @OptionGroup var report: ReportOptions
    @Option(help: "IANA time zone (default: the apps' own, or UTC when they differ).") var tz: String?
    @Option(help: "table, csv or json (default: a table on a terminal, else CSV).") var format: Output?
    @Option(help: "Write to this file instead of standard output.") var output: String?

    func run() async throws {
        let toTerminal = output == nil && isatty(STDOUT_FILENO) == 1
        let chosen = format ?? (toTerminal ? .table : .csv)
        let parameters = try report.parameters(tz: tz)
        try await database.withDatabase { database, logger in
            let engine = database.reportEngine(logger: logger)
            let query: ReportQuery
            do {
                query = try ReportQuery.parse(
                    parameters, readable: try await engine.readableApps(only: nil), isAdmin: true, output: chosen == .csv ? .csv : .json
                )
            } catch let error as ReportQueryError {
                throw ValidationError(ReportOptions.describe(error))
            }
            let sink = try OutputSink(path: output)
            do {
                switch chosen {
                case .csv:
                    // Refusals (a missing FX rate, an unknown zone) before the header is
                    // written, from the stream's own snapshot.
                    let layout = ReportLayout(query: query)
                    var bytes: [UInt8] = []
                    try await engine.stream(query, refusingFirst: true) { _ in
                        ReportText.appendCSVRecord(layout.columns.map { .text($0.name) }, to: &bytes)
                        try sink.write(bytes)
                    } rows: { rows in
                        bytes.removeAll(keepingCapacity: true)
                        for row in rows { layout.appendCSV(row, to: &bytes) }
                        try sink.write(bytes)
                    }
                case .json:
                    try sink.write(try await engine.page(query).json() + [0x0A])
                case .table:
                    try sink.write(Array(Self.table(try await engine.page(query)).utf8))
                }
            } catch let error as ReportCurrencyError {
                throw ValidationError(error.description)
            } catch let error as ReportQueryError {
                throw ValidationError(ReportOptions.describe(error))
            }
            try sink.close()
        }
    }

    /// An aligned table: text left, numbers right, a totals line, then the notes that matter.
    static func table(_ document: ReportDocument) -> String {
        let layout = document.layout
        let header = layout.columns.map(\.name)
        let rightAligned = layout.columns.map { ![.string, .date, .month, .timestamp].contains($0.type) }
        var rows = document.rows.map { layout.cells($0).map(ReportText.plain) }
        let totals = Array(repeating: "", count: layout.query.dimensions.count) + layout.totalCells(document.totals, previous: document.previousTotals).map(ReportText.plain)
        var totalsRow = totals
        if !totalsRow.isEmpty { totalsRow[0] = totalsRow[0].isEmpty ? "TOTAL" : totalsRow[0] }
        let widths = header.indices.map { column in ([header, totalsRow] + rows).map { $0[column].count }.max() ?? 0 }
        func line(_ cells: [String]) -> String {
            cells.indices.map { column in
                let pad = String(repeating: " ", count: widths[column] - cells[column].count)
                return rightAligned[column] ? pad + cells[column] : cells[column] + pad
            }.joined(separator: "  ")
        }
        var text = line(header.map { $0.uppercased() }) + "\n"
        rows.append(widths.map { String(repeating: "-", count: $0) })
        for row in rows { text += line(row) + "\n" }
        text += line(totalsRow) + "\n"
        let query = layout.query
        text += "\n\(ReportQuery.formatDate(query.from)) to \(ReportQuery.formatDate(query.to)), \(query.timezone) (\(query.timezoneReason)), \(query.currency)\n"
        if let cursor = document.nextCursor {
            text += "more rows follow (\(document.rows.count) shown): raise --limit, or use --format csv for all (cursor \(cursor))\n"
        }
        for length in document.notes.dayLengths {
            text += "note: \(ReportQuery.formatDate(length.day)) is \(ReportText.ratio(length.hours)) hours long in \(query.timezone)\n"
        }
        if let first = document.notes.provisionalDays.first, let last = document.notes.provisionalDays.last {
            text += "note: \(ReportQuery.formatDate(first))…\(ReportQuery.formatDate(last)) are provisional: late events may still arrive\n"
        }
        for cut in ReportNotes.cutPeriods(query) { text += "note: \(cut)\n" }
        let readFrom = document.notes.readFrom
        if readFrom.isWorthNoting { text += "note: read from the \(readFrom.text)\n" }
        return text
    }
}

/// Standard output or a file, written in chunks.
final class OutputSink {
    private let handle: FileHandle
    private let isFile: Bool

    init(path: String?) throws {
        if let path {
            guard FileManager.default.createFile(atPath: path, contents: nil), let handle = FileHandle(forWritingAtPath: path) else {
                throw ValidationError("--output: cannot write \(path)")
            }
            self.handle = handle
            isFile = true
        } else {
            handle = FileHandle.standardOutput
            isFile = false
        }
    }

    func write(_ bytes: [UInt8]) throws {
        try handle.write(contentsOf: Data(bytes))
    }

    func close() throws {
        if isFile { try handle.close() }
    }
}

/// The report options `adtally report` and `adtally exports create` share, under the
/// names `GET /v1/reports` uses.
struct ReportOptions: ParsableArguments {
    @Option(help: "Apps, comma-separated (default: all).") var apps: String?
    @Option(help: "First day YYYY-MM-DD, in the report's zone.") var from: String?
    @Option(help: "Last day YYYY-MM-DD, inclusive.") var to: String?
    @Option(help: "The N whole days before today (an export: before its slot's day) instead of --from/--to.") var days: Int?
    @Option(help: "Group by: app date hour week month network placement format size country platform os_version app_version error_code revenue_precision, or cohort (install day; with app country platform app_version of first sight).")
    var dimensions: String?
    @Option(help: "Metrics, comma-separated (default: requests,impressions,fill_rate,taps,ctr,revenue,ecpm); a cohort report's: installs, retention_dN, revenue_per_install_dN, impressions_per_install_dN (N 0-90).") var metrics: String?
    @Option(name: .customLong("filter"), help: ArgumentHelp("Only these values of a dimension, e.g. network=admob,iad (repeatable).", valueName: "dimension=values"))
    var filters: [String] = []
    @Option(help: "Currency money is shown in (default: the app's; several apps: USD).") var currency: String?
    @Option(help: "Sort keys, comma-separated, - for descending (e.g. -revenue,date).") var sort: String?
    @Option(help: "Most rows (a table and JSON: 1000 unless given; CSV: all).") var limit: Int?
    @Option(help: "previous_period or year_over_year.") var compare: String?
    @Option(help: "of_record (each network's policy: its final earnings where it is network_when_final; the default) or sdk (the SDKs' and the rate card's amounts).")
    var revenueSource: String?

    /// The parameters as `GET /v1/reports` names them; `tz` is the report's zone.
    func parameters(tz: String?) throws -> [(String, String)] {
        var parameters: [(String, String)] = []
        func add(_ name: String, _ value: String?) { if let value { parameters.append((name, value)) } }
        add("apps", apps)
        add("from", from)
        add("to", to)
        add("days", days.map(String.init))
        add("tz", tz)
        add("dimensions", dimensions)
        add("metrics", metrics)
        add("currency", currency)
        add("sort", sort)
        add("limit", limit.map(String.init))
        add("compare", compare)
        add("revenue_source", revenueSource)
        return parameters + (try Self.filterParameters(filters, dimensions: ReportDimension.allCases))
    }

    /// `--filter dimension=values` options as parameters, each naming one of `dimensions`.
    static func filterParameters(_ filters: [String], dimensions: [ReportDimension]) throws -> [(String, String)] {
        try filters.map { filter in
            let parts = filter.split(separator: "=", maxSplits: 1)
            guard parts.count == 2, let dimension = ReportDimension(rawValue: String(parts[0])), dimensions.contains(dimension) else {
                throw ValidationError("--filter must be dimension=value[,value…] with a dimension of \(dimensions.map(\.rawValue).joined(separator: ", ")), e.g. network=admob,iad")
            }
            return (String(parts[0]), String(parts[1]))
        }
    }

    /// A report error as a CLI error, naming the option.
    static func describe(_ error: ReportQueryError) -> String {
        "--\(error.parameter.replacingOccurrences(of: "_", with: "-")): \(error.message)"
    }
}
