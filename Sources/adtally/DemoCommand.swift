import AdTallyApp
import AdTallyCore
import ArgumentParser
import Foundation

/// `adtally demo`: realistic traffic for a few apps over weeks, then the commands to look at it.
struct DemoCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "demo",
        abstract: "Load demo apps, a rate card, FX rates and weeks of realistic traffic, then print what to try.",
        discussion: "Loads once per database (it refuses when the demo apps exist). about 1 M events at the default size."
    )

    @OptionGroup var database: DatabaseOptions
    @Option(help: "Days of history, ending now (or at --until).") var days = 28
    @Option(help: "Traffic multiplier (1: about 1 M events over 28 days).") var scale = 1.0
    @Option(help: "Random seed (the same seed makes the same traffic).") var seed: UInt64 = 2026
    @Option(help: "End of the history, an RFC 3339 time within the last --days (default: now). The same seed and end load the same traffic, e.g. on two databases to compare.")
    var until: String?

    /// `--until` in microseconds, or nil for now.
    var untilMicros: Int64? {
        get throws {
            guard let until else { return nil }
            guard let micros = RFC3339.parseMicros(until) else {
                throw ValidationError("--until must be an RFC 3339 time with an offset, e.g. 2026-11-20T12:00:00Z")
            }
            let now = Int64(Date().timeIntervalSince1970 * 1_000_000)
            guard micros <= now + 60_000_000, micros > now - Int64(days) * 86_400_000_000 else {
                throw ValidationError("--until must lie between --days ago and now")
            }
            return micros
        }
    }

    func validate() throws {
        guard (1...120).contains(days) else { throw ValidationError("--days must be from 1 to 120") }
        guard scale > 0, scale <= 50 else { throw ValidationError("--scale must be above 0 and at most 50") }
        _ = try untilMicros
    }

    func run() async throws {
        let settings = try Settings.resolve(flags: database.flags)
        let retention = settings.retentionDays
        let end = try untilMicros.map { Date(timeIntervalSince1970: Double($0) / 1_000_000) } ?? Date()
        // The oldest day loaded lies --days before the end, which --until may move back.
        let reach = days + max(0, Int(Date().timeIntervalSince(end) / 86_400))
        guard reach < retention else {
            throw ValidationError("--days (plus --until's days before now) must be less than the retention period (\(retention) days), or the oldest events would be dropped at once")
        }
        let isTerminal = isatty(STDERR_FILENO) == 1
        let started = ContinuousClock.now
        var lastLine = ContinuousClock.now
        let summary = try await database.withDatabase { database, logger in
            do {
                return try await DemoLoader(database: database, days: days, scale: scale, seed: seed, logger: logger).load(now: end) { progress in
                    let percent = progress.total > 0 ? progress.done * 100 / progress.total : 100
                    let status = "\(percent)% — \(progress.events) events"
                    if isTerminal {
                        let filled = percent * 30 / 100
                        let bar = String(repeating: "█", count: filled) + String(repeating: "░", count: 30 - filled)
                        FileHandle.standardError.write(Data("\r\u{1B}[2K\(bar) \(status)".utf8))
                    } else if ContinuousClock.now - lastLine > .seconds(2) || progress.done == progress.total {
                        lastLine = ContinuousClock.now
                        FileHandle.standardError.write(Data("\(status)\n".utf8))
                    }
                }
            } catch let error as DemoLoader.DemoError {
                throw ValidationError(error.description)
            }
        }
        if isTerminal { FileHandle.standardError.write(Data("\n".utf8)) }
        let seconds = Double((ContinuousClock.now - started).components.attoseconds) / 1e18 + Double((ContinuousClock.now - started).components.seconds)
        // Every export folder must lie inside the exports root (`--exports-root`).
        let finance = ShellText.quoted(settings.exportsRoot + "/finance")
        // The binary as the user ran it (`.build/release/adtally`, or `adtally` on the PATH).
        let adtally = ShellText.quoted(CommandLine.arguments.first.flatMap { $0.isEmpty ? nil : $0 } ?? "adtally")
        print("""
            Demo loaded in \(String(format: "%.1f", seconds)) s: \(summary.events) events from \(ReportQuery.formatDate(summary.firstDay)) to \(ReportQuery.formatDate(summary.lastDay)) (UTC)\(summary.rejected > 0 ? ", \(summary.rejected) refused" : ""),
            apps \(DemoLoader.appIDs.joined(separator: ", ")) (Tokyo/JPY, New York/USD, Berlin/EUR), a rate card and EUR-based FX rates,
            and an experiment on demo-puzzle's level_end placement over the last ten days (nend against applovin on half the devices).

            Try:
              \(adtally) report --apps demo-puzzle --days 14 --dimensions date,network
              \(adtally) report --apps demo-news --days 7 --dimensions network,format --metrics requests,fill_rate,taps,ctr,cancel_rate,revenue,ecpm
              \(adtally) report --apps demo-runner --days 28 --dimensions week,network --metrics impressions,expiries,wasted_fills,revenue,estimated_revenue
              \(adtally) report --days 28 --dimensions app --metrics requests,revenue,unique_devices --currency EUR
              \(adtally) report --apps demo-puzzle --days 7 --dimensions country --compare previous_period
              \(adtally) experiments results level-end-applovin --app demo-puzzle

            Over HTTP (\(adtally) serve, or make run):
              curl -H 'Authorization: Bearer \(summary.readKey.secret)' 'http://127.0.0.1:8080/v1/reports?apps=demo-puzzle&days=7&dimensions=date,network&metrics=requests,fill_rate,impressions,ecpm,revenue&format=csv'
              admin key (every app, exports, rates): \(summary.adminKey.secret)
              charts: http://127.0.0.1:8080/dashboard (sign in with either key)

            A daily CSV for finance, written by the running server (inside its exports root, \(settings.exportsRoot)):
              mkdir -p \(finance)
              \(adtally) exports create demo-daily --cron "0 6 * * *" --tz Asia/Tokyo --dir \(finance) --apps demo-puzzle --days 1 --dimensions date,network
              \(adtally) exports run-now demo-daily
            """)
    }
}
