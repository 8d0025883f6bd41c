import AdTallyApp
import AdTallyStorage
import ArgumentParser
import Foundation

extension FileImporter.Format: ExpressibleByArgument {}

struct IngestCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ingest",
        abstract: "Import events from NDJSON or CSV files (same validation and dedupe as the HTTP API)."
    )

    @OptionGroup var database: DatabaseOptions
    @Option(help: "The app the events belong to.") var app: String
    @Option(help: "ndjson or csv (default: by file extension, .csv is CSV).") var format: FileImporter.Format?
    @Option(help: "Events per transaction.") var batchSize = 10_000
    @Flag(help: "Exit with status 1 when any event was rejected.") var strict = false
    @Argument(help: "Files to import.") var files: [String]

    func validate() throws {
        guard (1...1_000_000).contains(batchSize) else {
            throw ValidationError("--batch-size must be from 1 to 1000000 events, got \(batchSize)")
        }
    }

    func run() async throws {
        let window = try Settings.resolve(flags: database.flags)
        let isTerminal = isatty(STDERR_FILENO) == 1
        var lastLine = ContinuousClock.now
        let summary = try await database.withDatabase { database, logger in
            let store = AppStore(pool: database.pool)
            guard try await store.app(app) != nil else { throw AppStoreError.unknownApp(app) }
            let importer = FileImporter(
                store: EventStore(pool: database.pool, credentialsKey: window.credentialsKey, logger: logger), appID: app, batchSize: batchSize,
                maxAge: window.maxEventAge, maxAhead: window.maxEventAhead
            )
            return try await importer.importFiles(files, format: format) { progress in
                if isTerminal {
                    Self.drawBar(progress)
                } else if ContinuousClock.now - lastLine > .seconds(2) || progress.bytesRead == progress.totalBytes {
                    lastLine = ContinuousClock.now
                    FileHandle.standardError.write(Data("\(Self.status(progress))\n".utf8))
                }
            }
        }
        if isTerminal { FileHandle.standardError.write(Data("\n".utf8)) }
        print("accepted \(summary.accepted), duplicates \(summary.duplicates), rejected \(summary.rejected)" + (summary.erased > 0 ? ", erased \(summary.erased) (of devices erased after they occurred)" : ""))
        if !summary.firstRejections.isEmpty {
            print("first rejections:")
            summary.firstRejections.forEach { print("  \($0)") }
        }
        if strict && summary.rejected > 0 { throw ExitCode(1) }
    }

    static func status(_ progress: FileImporter.Progress) -> String {
        let percent = progress.totalBytes > 0 ? progress.bytesRead * 100 / progress.totalBytes : 100
        return "\(progress.file): \(percent)% — \(progress.accepted) accepted, \(progress.duplicates) duplicates, \(progress.rejected) rejected"
    }

    static func drawBar(_ progress: FileImporter.Progress) {
        let width = 30
        let fraction = progress.totalBytes > 0 ? Double(progress.bytesRead) / Double(progress.totalBytes) : 1
        let filled = Int(fraction * Double(width))
        let bar = String(repeating: "█", count: filled) + String(repeating: "░", count: width - filled)
        FileHandle.standardError.write(Data("\r\u{1B}[2K\(bar) \(status(progress))".utf8))
    }
}
