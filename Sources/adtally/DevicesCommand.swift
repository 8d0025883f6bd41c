import AdTallyApp
import AdTallyCore
import AdTallyStorage
import ArgumentParser
import Foundation
import Logging

/// `adtally devices`: a data subject's requests (DESIGN §15, docs/privacy.md).
struct DevicesCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "devices", abstract: "Erase a device's data, or write it out (privacy requests).",
        subcommands: [Forget.self, Show.self, Erasures.self]
    )

    struct Forget: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Erase devices: their raw events, install and daily rows; waits for the job and prints what it removed.",
            discussion: """
                The job runs on the server that runs erasures; when no server runs, this command runs it itself. \
                Events of these devices that occurred before now and arrive later are refused (`erased`). \
                Counts, priced rollups and device sketches hold no id and stay (docs/privacy.md).
                """
        )
        @OptionGroup var database: DatabaseOptions
        @Option(help: "The app.") var app: String
        @Option(help: "A device id (repeat for several).") var device: [String] = []
        @Option(help: "A file of device ids, one per line (at most 1,000).") var file: String?
        @Flag(help: "Queue the job and print its id without waiting.") var noWait = false
        @Option(help: "Longest wait for the job, in seconds.") var timeout = 3600
        @Option(help: "table or json.") var format = OutputFormat.table

        func validate() throws {
            if device.isEmpty == (file == nil) { throw ValidationError("give --device or --file (one of them)") }
        }

        func run() async throws {
            var ids = device
            // Where each id came from, as an error names it: `--device[2]`, `--file line 7`.
            var origins = device.indices.map { "--device[\($0)]" }
            if let file {
                guard let text = FileManager.default.contents(atPath: file) else { throw ValidationError("--file: cannot read \(file)") }
                (ids, origins) = ([], [])
                for (number, line) in String(decoding: text, as: UTF8.self).split(omittingEmptySubsequences: false, whereSeparator: \.isNewline).enumerated() {
                    let id = line.trimmingCharacters(in: .whitespacesAndNewlines)
                    if id.isEmpty { continue }
                    ids.append(id)
                    origins.append("--file line \(number + 1)")
                }
            }
            let timeout = self.timeout, noWait = self.noWait
            let erasure = try await database.withDatabase { database, logger -> Erasure in
                let store = ErasureStore(pool: database.pool)
                let queued: Erasure
                do {
                    queued = try await store.queue(app: app, devices: ids, requestedBy: "cli")
                } catch ErasureError.invalid(let error) {
                    // `devices[i]` is the i-th id given: named where it came from.
                    if let open = error.field.firstIndex(of: "["), let index = Int(error.field[error.field.index(after: open)...].dropLast()), origins.indices.contains(index) {
                        throw ValidationError("\(origins[index]): \(error.rule)")
                    }
                    throw ValidationError("\(file == nil ? "--device" : "--file"): \(error.rule)")
                } catch let error as ErasureError {
                    throw ValidationError(error.description)
                }
                if noWait { return queued }
                // Run this job here while no server runs erasures (the lock decides: a server that
                // leads runs it, and this runner only waits for the lock meanwhile); only this
                // one, so that stopping here never leaves another app's job half done.
                var configuration = ErasureRunner.Configuration(identity: "adtally devices forget pid \(getpid())", credentialsKey: database.credentialsKey)
                configuration.only = queued.id
                configuration.tick = .milliseconds(500)
                let runner = ErasureRunner(configuration: configuration, leaderPool: database.erasureLeaderPool, pool: database.erasurePool, logger: logger)
                let running = Task { await runner.run() }
                defer { running.cancel() }
                let deadline = ContinuousClock.now + .seconds(timeout)
                while true {
                    if let now = try await store.get(queued.id), now.isFinished { running.cancel(); await running.value; return now }
                    guard ContinuousClock.now < deadline else {
                        throw ValidationError("erasure \(queued.id.uuidString.lowercased()) is still not done after \(timeout) s; see adtally devices erasures --app \(app)")
                    }
                    try await Task.sleep(for: .milliseconds(250))
                }
            }
            if format == .json { return try printJSON(erasure) }
            print(Self.describe(erasure))
            if erasure.status == .failed { throw ExitCode.failure }
        }

        static func describe(_ erasure: Erasure) -> String {
            let id = erasure.id.uuidString.lowercased()
            let rows = erasure.rows
            switch erasure.status {
            case .queued, .running:
                return "erasure \(id) \(erasure.status.rawValue): \(erasure.devices) device\(erasure.devices == 1 ? "" : "s") of \(erasure.app)"
            case .failed:
                return "erasure \(id) failed: \(erasure.error ?? "?")"
            case .done:
                return "erasure \(id) done: \(erasure.devices) device\(erasure.devices == 1 ? "" : "s") of \(erasure.app); rows removed: "
                    + "events \(rows.events), installs \(rows.installs), install_days \(rows.installDays), "
                    + "install_day_revenue \(rows.installDayRevenue), install_delta \(rows.installDelta), experiment_exposures \(rows.experimentExposures)"
            }
        }
    }

    struct Show: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Write a device's data (install, days, money, raw events still kept) to a file as NDJSON (an access request).",
            discussion: "The file is made readable by its owner only: it is personal data. docs/privacy.md says what each line holds."
        )
        @OptionGroup var database: DatabaseOptions
        @Option(help: "The app.") var app: String
        @Option(help: "The device id.") var device: String
        @Option(help: "The file to write (- for standard output).") var output: String

        func run() async throws {
            try await database.withDatabase { database, _ in
                let settings = try Settings.resolve(flags: self.database.flags)
                let access = DeviceAccess(pool: database.pool)
                do {
                    try await access.check(app: app, device: device)
                } catch let refusal as DeviceAccess.Refusal {
                    throw ValidationError(refusal.description.replacingOccurrences(of: "device:", with: "--device:"))
                }
                let handle: FileHandle
                if output == "-" {
                    handle = .standardOutput
                } else {
                    guard FileManager.default.createFile(atPath: output, contents: nil, attributes: [.posixPermissions: 0o600]),
                          let opened = FileHandle(forWritingAtPath: output) else { throw ValidationError("--output: cannot create \(output)") }
                    handle = opened
                }
                defer { if output != "-" { try? handle.close() } }
                try await access.stream(app: app, device: device, retentionDays: settings.retentionDays) { bytes in
                    try handle.write(contentsOf: bytes)
                }
            }
            if output != "-" { FileHandle.standardError.write(Data("wrote \(output)\n".utf8)) }
        }
    }

    struct Erasures: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "The erasure log of an app: when, by whom, how many devices and rows (never the ids).")
        @OptionGroup var database: DatabaseOptions
        @Option(help: "The app.") var app: String
        @Option(help: "table or json.") var format = OutputFormat.table

        func run() async throws {
            let list = try await database.withDatabase { database, _ in try await ErasureStore(pool: database.pool).list(app: app) }
            if format == .json { return try printJSON(list) }
            printTable(["ID", "REQUESTED", "BY", "DEVICES", "STATUS", "EVENTS", "INSTALLS", "DAY ROWS"], list.map {
                [$0.id.uuidString.lowercased(), isoText($0.requestedAt), $0.requestedBy, String($0.devices), $0.status.rawValue, String($0.rows.events),
                 String($0.rows.installs), String($0.rows.installDays + $0.rows.installDayRevenue)]
            })
        }
    }
}
