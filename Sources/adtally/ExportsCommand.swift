import AdTallyApp
import AdTallyCore
import AdTallyStorage
import ArgumentParser
import Foundation

extension ExportFormat: ExpressibleByArgument {}
extension ExportKind: ExpressibleByArgument {}

/// `adtally exports`: scheduled report files (DESIGN §5). Schedules live in the
/// database; the server that leads the export runner writes them.
struct ExportsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "exports",
        abstract: "Schedule report files: create, list, show, pause, resume, delete, run-now, runs.",
        discussion: """
            Examples:
              adtally exports create daily-networks --cron "0 6 * * *" --tz Europe/Berlin --format csv \\
                  --dir /srv/finance --apps my-app --days 1 --dimensions date,network --metrics requests,impressions,revenue
              adtally exports runs daily-networks
            A running `adtally serve` writes the files: DIR/NAME/NAME-YYYYMMDDTHHMM.csv and a .manifest.json beside each.
            """,
        subcommands: [Create.self, List.self, Show.self, Pause.self, Resume.self, Delete.self, RunNow.self, Runs.self]
    )

    struct Create: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Create a schedule: a report written as a file at each cron time.",
            discussion: "The report options are those of `adtally report`; --days counts the whole days before each slot's day in the report's zone."
        )
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "Name: a-z, 0-9, - and _ (names the folder and files).") var name: String
        @Option(help: "5-field cron expression (minute hour day-of-month month day-of-week), or @daily, @hourly, @weekly, @monthly.") var cron: String
        @Option(help: "IANA zone of the cron times and slot names (default UTC).") var tz = "UTC"
        @Option(help: "csv or json.") var format = ExportFormat.csv
        @Option(help: "report, or reconciliation (the discrepancy report of adtally reconcile, with its options: --apps, --from/--to or --days, --dimensions, --filter, --currency).")
        var kind = ExportKind.report
        @Option(help: "Destination directory (absolute; the schedule's folder is made in it).") var dir: String
        @OptionGroup var report: ReportOptions
        @Option(name: .customLong("report-tz"), help: "IANA zone of the report's days (default: the apps' own, or UTC when they differ).")
        var reportTZ: String?

        func run() async throws {
            let parameters = try report.parameters(tz: reportTZ)
            var schedule = ExportSchedule(
                name: name, query: Dictionary(parameters, uniquingKeysWith: { $1 }), format: format, cron: cron, timezone: tz,
                directory: URL(fileURLWithPath: dir).standardizedFileURL.path
            )
            schedule.kind = kind
            let exportsRoot = try Settings.resolve(flags: database.flags).exportsRoot
            let saved = try await database.withDatabase { database, _ in
                let engine = database.reportEngine()
                do {
                    return try await ExportStore(pool: database.pool).create(schedule, readable: try await engine.readableApps(only: nil), exportsRoot: exportsRoot)
                } catch let error as ExportScheduleError {
                    throw ValidationError(ExportsCommand.describe(error))
                } catch let error as ExportStoreError {
                    throw ValidationError(error.description)
                }
            }
            print("export schedule \(saved.name) created: \(saved.cron) in \(saved.timezone), \(saved.format.rawValue) files in \(saved.directory)/\(saved.name)/")
            for slot in saved.nextSlots(after: Date(), count: 3) {
                print("  next: \(slot.name) (due \(isoText(slot.dueDate)))")
            }
        }
    }

    /// An error about a field, named as the CLI's option.
    static func describe(_ error: ExportScheduleError) -> String {
        var option = ["dir": "--dir", "tz": "--tz", "cron": "--cron", "name": "NAME", "format": "--format", "query.tz": "--report-tz"][error.field]
            ?? "--\(error.field.replacingOccurrences(of: "query.", with: "").replacingOccurrences(of: "_", with: "-"))"
        if error.field == "query.apps" || error.field == "query.from" || error.field == "query.to" { option = "--" + error.field.dropFirst(6) }
        return "\(option): \(error.rule)"
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List schedules with their next slot and last run.")
        @OptionGroup var database: DatabaseOptions
        @Option(help: "table or json.") var format = OutputFormat.table

        func run() async throws {
            let (schedules, runs) = try await database.withDatabase { database, _ in
                let store = ExportStore(pool: database.pool)
                return (try await store.list(), try await store.lastRuns())
            }
            if format == .json { return try printJSON(["exports": schedules]) }
            guard !schedules.isEmpty else { return print("no export schedules (adtally exports create NAME --cron … --dir …)") }
            printTable(["NAME", "CRON", "TZ", "FORMAT", "DIR", "STATE", "NEXT SLOT", "LAST RUN"], schedules.map { schedule in
                let last = runs[schedule.name]
                return [
                    schedule.name, schedule.cron, schedule.timezone, schedule.format.rawValue, schedule.directory,
                    schedule.isPaused ? "paused" : "active", schedule.isPaused ? "-" : schedule.nextSlots(after: Date(), count: 1).first?.name ?? "-",
                    last.map { "\($0.slot) \($0.status)" } ?? "-",
                ]
            })
        }
    }

    struct Show: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Show a schedule, its next slots and its last runs.")
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The schedule.") var name: String
        @Option(help: "table or json.") var format = OutputFormat.table

        func run() async throws {
            let (schedule, runs) = try await database.withDatabase { database, _ in
                let store = ExportStore(pool: database.pool)
                do {
                    return (try await store.schedule(name), try await store.runs(name, limit: 10))
                } catch let error as ExportStoreError {
                    throw ValidationError(error.description)
                }
            }
            if format == .json { return try printJSON(schedule) }
            print("name:      \(schedule.name)")
            print("cron:      \(schedule.cron) (\(schedule.timezone))")
            print("kind:      \(schedule.kind.rawValue)")
            print("format:    \(schedule.format.rawValue)")
            print("files:     \(schedule.directory)/\(schedule.name)/\(schedule.name)-YYYYMMDDTHHMM.\(schedule.format.rawValue)")
            print("query:     \(schedule.query.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " "))")
            print("state:     \(schedule.isPaused ? "paused" : "active")")
            if schedule.skippedSlots > 0 {
                print("skipped:   \(schedule.skippedSlots) slots missed beyond the catch-up limit (last \(schedule.lastSkipped ?? "?"))")
            }
            if !schedule.isPaused {
                print("next:      " + schedule.nextSlots(after: Date(), count: 3).map { "\($0.name) (\(isoText($0.dueDate)))" }.joined(separator: ", "))
            }
            if !runs.isEmpty {
                print("")
                Runs.table(runs)
            }
        }
    }

    struct Pause: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Pause a schedule: nothing of it is written (retries and final rewrites wait too) until it is resumed.")
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The schedule.") var name: String

        func run() async throws {
            try await setPaused(database, name, true)
            print("\(name) paused; slots due while paused are not written")
        }
    }

    struct Resume: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Resume a paused schedule from its next slot on.")
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The schedule.") var name: String

        func run() async throws {
            let schedule = try await setPaused(database, name, false)
            print("\(name) resumed; next slot \(schedule.nextSlots(after: Date(), count: 1).first?.name ?? "-")")
        }
    }

    @discardableResult
    static func setPaused(_ database: DatabaseOptions, _ name: String, _ paused: Bool) async throws -> ExportSchedule {
        try await database.withDatabase { database, _ in
            do {
                return try await ExportStore(pool: database.pool).setPaused(name, paused)
            } catch let error as ExportStoreError {
                throw ValidationError(error.description)
            }
        }
    }

    struct Delete: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Delete a schedule and its run history (its files stay).")
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The schedule.") var name: String

        func run() async throws {
            try await database.withDatabase { database, _ in
                do {
                    try await ExportStore(pool: database.pool).delete(name)
                } catch let error as ExportStoreError {
                    throw ValidationError(error.description)
                }
            }
            print("\(name) deleted; its files are left where they are")
        }
    }

    struct RunNow: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "run-now",
            abstract: "Write the schedule's file for the current minute now (or, with --slot, start a failed slot again), and wait for it.",
            discussion: "The server that leads the export runner writes it; this command waits up to --wait seconds for the outcome."
        )
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The schedule.") var name: String
        @Option(help: "A failed slot (YYYYMMDDTHHMM) to run again.") var slot: String?
        @Option(help: "Seconds to wait for the run to finish (0: do not wait).") var wait = 60

        func run() async throws {
            let outcome = try await database.withDatabase { database, _ -> ExportRun? in
                let store = ExportStore(pool: database.pool)
                let run: ExportRun
                do {
                    run = try await store.requestRun(name, slot: slot)
                } catch let error as ExportStoreError {
                    throw ValidationError(error.description)
                } catch let error as ExportScheduleError {
                    throw ValidationError(ExportsCommand.describe(error))
                }
                print("slot \(run.slot) of \(name) queued")
                let deadline = ContinuousClock.now + .seconds(wait)
                while ContinuousClock.now < deadline {
                    try await Task.sleep(for: .milliseconds(250))
                    if let current = try await store.run(name, slot: run.slot), ["succeeded", "failed", "retrying"].contains(current.status) {
                        return current
                    }
                }
                return nil
            }
            guard let outcome else {
                if wait > 0 {
                    print("not finished after \(wait) s: is `adtally serve` running? (adtally status names the export runner; adtally exports runs \(name) shows the outcome)")
                }
                return
            }
            Runs.table([outcome])
            if outcome.status != "succeeded" { throw ExitCode(1) }
        }
    }

    struct Runs: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Run history, newest first: slot, status, rows, bytes, SHA-256, duration, error.")
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The schedule (default: every schedule).") var name: String?
        @Option(help: "Most runs shown.") var limit = 50
        @Option(help: "table or json.") var format = OutputFormat.table

        func run() async throws {
            let runs = try await database.withDatabase { database, _ in
                do {
                    return try await ExportStore(pool: database.pool).runs(name, limit: max(1, min(limit, 10_000)))
                } catch let error as ExportStoreError {
                    throw ValidationError(error.description)
                }
            }
            if format == .json { return try printJSON(["runs": runs]) }
            guard !runs.isEmpty else { return print("no runs yet") }
            Self.table(runs)
        }

        static func table(_ runs: [ExportRun]) {
            printTable(["SCHEDULE", "SLOT", "PASS", "STATUS", "FILE", "ROWS", "BYTES", "SHA256", "MS", "TRIES", "ERROR"], runs.map { run in
                [
                    run.schedule, run.slot, run.pass == 2 ? "final" : "1", run.status + (run.fileStatus.map { " (\($0))" } ?? ""),
                    run.file ?? "-", run.rows.map(String.init) ?? "-", run.bytes.map(String.init) ?? "-",
                    run.sha256.map { String($0.prefix(12)) + "…" } ?? "-", run.durationMs.map(String.init) ?? "-", String(run.attempts),
                    run.error.map { $0.count > 80 ? String($0.prefix(79)) + "…" : $0 } ?? (run.status == "retrying" || run.status == "pending" ? "next try \(isoText(run.nextAttemptAt))" : ""),
                ]
            })
        }
    }
}
