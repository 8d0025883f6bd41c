import AdTallyApp
import AdTallyCore
import AdTallyStorage
import AdTallyTestSupport
import Foundation
import Hummingbird
import HummingbirdTesting
import Logging
import PostgresKit
import Synchronization
import Testing

/// Helpers for the export tests.
enum Exports {
    /// A fresh folder under the temporary directory.
    static func folder() -> String {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("adtally-exports-\(UUID().uuidString)").path
        try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }

    /// An app with a day of traffic on each of the ten days before now.
    static func seed(_ services: AppServices, app: String = "exp") async throws {
        _ = try await services.appStore.createApp(id: app, name: nil, timezone: "UTC", currency: "USD")
        let now = Int64(Date().timeIntervalSince1970) * 1_000_000
        var events: [AdEvent] = []
        for day in 1...10 {
            let at = now - Int64(day) * 86_400_000_000
            for network in ["admob", "iad", "nend"] {
                events.append(Reports.event(.request, at: at, network: network))
                events.append(Reports.event(.impression, at: at, network: network))
            }
        }
        try await Reports.store(services, app: app, events)
        _ = try await services.compactor.compactOnce()
    }

    /// A runner over its own one-connection pool (as every server has).
    static func runner(_ services: AppServices, _ conninfo: String, identity: String, _ tune: (inout ExportRunner.Configuration) -> Void = { _ in }) -> (ExportRunner, PostgresPool) {
        let pool = PostgresPool(configuration: .init(conninfo: conninfo, maxConnections: 1))
        var configuration = ExportRunner.Configuration(identity: identity)
        configuration.tick = .milliseconds(20)
        configuration.retryBase = .milliseconds(10)
        configuration.exportsRoot = services.exportsRoot
        tune(&configuration)
        var logger = Logger(label: "adtally.exports")
        logger.logLevel = .critical
        return (ExportRunner(configuration: configuration, leaderPool: pool, engine: services.reports, logger: logger), pool)
    }

    /// The files of a schedule's folder: data files and manifests, without hidden temporaries.
    static func files(_ directory: String, _ name: String) -> (data: [String], manifests: [String], temporary: [String]) {
        let all = ((try? FileManager.default.contentsOfDirectory(atPath: directory + "/" + name)) ?? []).sorted()
        return (
            all.filter { !$0.hasPrefix(".") && !$0.hasSuffix(".manifest.json") }, all.filter { $0.hasSuffix(".manifest.json") },
            all.filter { $0.hasPrefix(".") }
        )
    }

    /// SHA-256 of a file by coreutils' sha256sum (not the code under test).
    static func sha256sum(_ path: String) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/sha256sum")
        process.arguments = [path]
        let pipe = Pipe()
        process.standardOutput = pipe
        try process.run()
        let output = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return String(String(decoding: output, as: UTF8.self).prefix(64))
    }

    /// Checks a data file against its manifest and its run row; returns the manifest.
    @discardableResult
    static func checkManifest(_ directory: String, _ name: String, _ file: String, run: ExportRun?, sourceLocation: SourceLocation = #_sourceLocation) throws -> [String: Any] {
        let path = "\(directory)/\(name)/\(file)"
        if !FileManager.default.fileExists(atPath: path) {
            Issue.record("missing \(file); folder: \(files(directory, name)); run: \(String(describing: run))", sourceLocation: sourceLocation)
        }
        let data = try Data(contentsOf: URL(fileURLWithPath: path))
        let manifest = try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: path + ".manifest.json"))) as! [String: Any]
        let sha = try sha256sum(path)
        #expect(manifest["sha256"] as? String == sha, sourceLocation: sourceLocation)
        #expect((manifest["bytes"] as? NSNumber)?.intValue == data.count, sourceLocation: sourceLocation)
        let rows: Int
        if file.hasSuffix(".csv") {
            rows = String(decoding: data, as: UTF8.self).components(separatedBy: "\r\n").filter { !$0.isEmpty }.count - 1
        } else {
            let object = try JSONSerialization.jsonObject(with: data) as! [String: Any]
            rows = (object["rows"] as! [Any]).count
        }
        #expect((manifest["rows"] as? NSNumber)?.intValue == rows, sourceLocation: sourceLocation)
        #expect(manifest["query"] is [String: Any], sourceLocation: sourceLocation)
        #expect(["provisional", "final"].contains(manifest["status"] as? String ?? ""), sourceLocation: sourceLocation)
        if let run {
            #expect(run.sha256 == sha && run.bytes == Int64(data.count) && run.rows == Int64(rows), sourceLocation: sourceLocation)
            #expect(manifest["slot"] as? String == run.slot, sourceLocation: sourceLocation)
        }
        return manifest
    }
}

@Suite("Scheduled exports")
struct ExportTests {
    static func utc(_ text: String) -> Int64 { Reports.micros(text) / 1_000_000 }

    @Test("cron: a DST zone's skipped and repeated wall times run once, named by the wall time")
    func cronDaylightSaving() throws {
        let newYork = TimeZone(identifier: "America/New_York")!
        // 2026-03-08: 02:00 EST jumps to 03:00 EDT; 2026-11-01: 02:00 EDT falls back to 01:00 EST.
        let spring = try CronSchedule("30 2 * * *").slots(after: Self.utc("2026-03-07T00:00:00Z"), through: Self.utc("2026-03-10T00:00:00Z"), in: newYork, limit: 100)
        #expect(spring.map(\.name) == ["20260307T0230", "20260308T0230", "20260309T0230"])
        // The skipped 02:30 runs once, at the change (03:00 EDT = 07:00Z).
        #expect(spring[1].due == Self.utc("2026-03-08T07:00:00Z"))
        #expect(spring[0].due == Self.utc("2026-03-07T07:30:00Z") && spring[2].due == Self.utc("2026-03-09T06:30:00Z"))

        let fall = try CronSchedule("30 2 * * *").slots(after: Self.utc("2026-10-31T00:00:00Z"), through: Self.utc("2026-11-03T00:00:00Z"), in: newYork, limit: 100)
        #expect(fall.map(\.name) == ["20261031T0230", "20261101T0230", "20261102T0230"])
        #expect(fall[1].due == Self.utc("2026-11-01T07:30:00Z"))
        // 01:30 happens twice on the fall-back day: it runs at the first (EDT).
        let repeated = try CronSchedule("30 1 * * *").slots(after: Self.utc("2026-11-01T00:00:00Z"), through: Self.utc("2026-11-02T00:00:00Z"), in: newYork, limit: 100)
        #expect(repeated.map(\.name) == ["20261101T0130"] && repeated[0].due == Self.utc("2026-11-01T05:30:00Z"))
        // Hourly on the 25-hour day: each wall hour once (24), every due instant distinct and rising.
        let hourly = try CronSchedule("0 * * * *").slots(after: Self.utc("2026-11-01T03:59:00Z"), through: Self.utc("2026-11-02T04:59:00Z"), in: newYork, limit: 100)
        #expect(hourly.count == 24 && Set(hourly.map(\.name)).count == 24)
        #expect(zip(hourly, hourly.dropFirst()).allSatisfy { $0.due < $1.due })
        // On the 23-hour day, every half hour: all 48 wall times, the skipped 02:00 and 02:30
        // due with 03:00 at the change; 46 distinct instants.
        let halves = try CronSchedule("*/30 * * * *").slots(after: Self.utc("2026-03-08T04:59:00Z"), through: Self.utc("2026-03-09T03:59:00Z"), in: newYork, limit: 100)
        #expect(halves.count == 48 && Set(halves.map(\.name)).count == 48 && Set(halves.map(\.due)).count == 46)
        #expect(halves.filter { $0.due == Self.utc("2026-03-08T07:00:00Z") }.map(\.name) == ["20260308T0200", "20260308T0230", "20260308T0300"])
        // Planned in two passes split at the change, nothing is lost or repeated.
        let cut = Self.utc("2026-03-08T07:00:00Z")
        let split = try CronSchedule("*/30 * * * *").slots(after: Self.utc("2026-03-08T04:59:00Z"), through: cut, in: newYork, limit: 100)
            + CronSchedule("*/30 * * * *").slots(after: cut, through: Self.utc("2026-03-09T03:59:00Z"), in: newYork, limit: 100)
        #expect(split == halves)

        // Offsets of a quarter hour: 06:00 in Kathmandu (+05:45) is 00:15Z.
        let kathmandu = try CronSchedule("0 6 * * *").nextSlot(after: Self.utc("2026-11-22T12:00:00Z"), in: TimeZone(identifier: "Asia/Kathmandu")!)
        #expect(kathmandu?.name == "20261123T0600" && kathmandu?.due == Self.utc("2026-11-23T00:15:00Z"))
    }

    @Test("cron: fields, names, steps and macros as crontab reads them; errors name the field")
    func cronSyntax() throws {
        let utc = TimeZone(identifier: "UTC")!
        // Weekdays at 09:15 from Friday 2026-11-20: Friday, then Monday.
        let weekdays = try CronSchedule("15 9 * * MON-FRI").slots(after: Self.utc("2026-11-20T00:00:00Z"), through: Self.utc("2026-11-24T00:00:00Z"), in: utc, limit: 10)
        #expect(weekdays.map(\.name) == ["20261120T0915", "20261123T0915"])
        // Day of month and day of week both restricted: either matches (crontab(5)).
        let either = try CronSchedule("0 0 1 * sun").slots(after: Self.utc("2026-11-28T00:00:00Z"), through: Self.utc("2026-12-07T00:00:00Z"), in: utc, limit: 10)
        #expect(either.map(\.name) == ["20261129T0000", "20261201T0000", "20261206T0000"])
        // A step in a day field still restricts it: with the other field at *, both must match.
        let everyOtherDay = try CronSchedule("0 0 */2 * *").slots(after: Self.utc("2026-11-27T12:00:00Z"), through: Self.utc("2026-12-04T00:00:00Z"), in: utc, limit: 10)
        #expect(everyOtherDay.map(\.name) == ["20261129T0000", "20261201T0000", "20261203T0000"])
        let everyOtherWeekday = try CronSchedule("0 0 * * */2").slots(after: Self.utc("2026-11-22T12:00:00Z"), through: Self.utc("2026-11-29T12:00:00Z"), in: utc, limit: 10)
        #expect(everyOtherWeekday.map(\.name) == ["20261124T0000", "20261126T0000", "20261128T0000", "20261129T0000"])
        let both = try CronSchedule("0 0 1-15 * */2").slots(after: Self.utc("2026-12-01T12:00:00Z"), through: Self.utc("2026-12-31T00:00:00Z"), in: utc, limit: 31)
        #expect(both.map(\.name) == ["20261203T0000", "20261205T0000", "20261206T0000", "20261208T0000", "20261210T0000", "20261212T0000", "20261213T0000", "20261215T0000"])
        #expect(try CronSchedule("@daily").slots(after: Self.utc("2026-11-20T00:00:00Z"), through: Self.utc("2026-11-22T00:00:00Z"), in: utc, limit: 10).count == 2)
        #expect(try CronSchedule("0-10/5,50 3 * jan,nov 7").slots(after: Self.utc("2026-11-22T00:00:00Z"), through: Self.utc("2026-11-23T00:00:00Z"), in: utc, limit: 10).map(\.name)
            == ["20261122T0300", "20261122T0305", "20261122T0310", "20261122T0350"])
        for (bad, words) in [("61 * * * *", "minute"), ("* * *", "5 fields"), ("0 0 30 2 *", "never run"), ("0 25 * * *", "hour"), ("*/0 * * * *", "step"), ("0 0 * foo *", "month"), ("5-1 * * * *", "backwards")] {
            #expect(throws: CronError.self, "\(bad)") { try CronSchedule(bad) }
            do { _ = try CronSchedule(bad) } catch { #expect(error.message.contains(words), "\(bad): \(error.message)") }
        }
    }

    @Test("two runners on one database write every slot exactly once, also when the leader dies")
    func twoRunnersEachSlotOnce() async throws {
        try await Self.withSeededDatabase { conninfo, services, directory in
                let readable = try await services.reports.readableApps(only: nil)
                // Final days (fixed dates long past): no second pass muddles the count.
                let created = try await services.exports.create(
                    ExportSchedule(name: "every-minute", query: ["apps": "exp", "from": "2020-01-01", "to": "2020-01-03", "dimensions": "date,network"], format: .csv, cron: "* * * * *", timezone: "Europe/Berlin", directory: directory),
                    readable: readable, exportsRoot: services.exportsRoot
                )
                #expect(created.name == "every-minute")
                // A clock 600 times as fast: ten minutes (slots) per second.
                let start = Date()
                let clock: @Sendable () -> Date = { start.addingTimeInterval(Date().timeIntervalSince(start) * 600) }
                let (first, firstPool) = Exports.runner(services, conninfo, identity: "runner-a") { $0.now = clock }
                let (second, secondPool) = Exports.runner(services, conninfo, identity: "runner-b") { $0.now = clock }
                let a = Task { await first.run() }
                let b = Task { await second.run() }
                try await Task.sleep(for: .milliseconds(1500))
                // Kill the leader as a crash would: its task stops and its connection (and lock) dies.
                try await waitUntil { first.isLeader || second.isLeader }
                let leader = first.isLeader ? (first, a, "runner-a") : (second, b, "runner-b")
                // Its connection (and lock) dies first, as in a crash; then its task stops, so it
                // cannot win the lock back.
                _ = try await services.database.pool.query("""
                    SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = \("adtally export runner " + leader.2)
                    """)
                leader.1.cancel()
                // The other takes over.
                let survivor = leader.0 === first ? second : first
                try await waitUntil { survivor.isLeader }
                // Long enough for 20 slots of the fast clock even when the machine is loaded
                // (1.5 s gave 17 once under the full suite).
                try await Task.sleep(for: .milliseconds(2500))
                a.cancel()
                b.cancel()
                _ = await (a.value, b.value)
                await firstPool.shutdown()
                await secondPool.shutdown()

                // Finish what was claimed when they stopped, with one more runner at the time they stopped.
                let stopped = clock()
                let (last, lastPool) = Exports.runner(services, conninfo, identity: "runner-c") { $0.now = { stopped } }
                let c = Task { await last.run() }
                // Dozens of slots, each a report and a file: on a loaded machine (the suite runs
                // schemathesis beside this) that can take longer than the default wait.
                try await waitUntil(within: 240) { try await services.database.pool.query("SELECT 1 FROM export_runs WHERE status <> 'succeeded'").isEmpty }
                c.cancel()
                await c.value
                await lastPool.shutdown()

                let runs = try await services.exports.runs("every-minute", limit: 10_000)
                let planned = try await services.database.pool.query("SELECT planned_through FROM export_schedules")[0].decode(0, as: Date.self)
                let expected = try CronSchedule("* * * * *").slots(
                    after: Int64(created.createdAt!.timeIntervalSince1970.rounded(.down)), through: Int64(planned.timeIntervalSince1970.rounded(.down)),
                    in: TimeZone(identifier: "Europe/Berlin")!, limit: 100_000
                )
                #expect(expected.count >= 20, "the clock ran \(expected.count) minutes")
                #expect(runs.map(\.slot).sorted() == expected.map(\.name), "every slot has exactly one run")
                #expect(runs.allSatisfy { $0.status == "succeeded" && $0.fileStatus == "final" })
                let files = Exports.files(directory, "every-minute")
                #expect(files.data == expected.map { "every-minute-\($0.name).csv" })
                #expect(files.manifests.count == expected.count && files.temporary.isEmpty, "\(files.temporary)")
                for run in runs { try Exports.checkManifest(directory, "every-minute", "every-minute-\(run.slot).csv", run: run) }
        }
    }

    @Test("run-now on a schedule deleted while it asks is a 'no such schedule', not a database error (found by schemathesis)")
    func runNowRacesDelete() async throws {
        try await Self.withSeededDatabase { _, services, directory in
            _ = try await services.exports.create(
                ExportSchedule(name: "gone", query: ["apps": "exp", "days": "1"], format: .csv, cron: "0 6 * * *", timezone: "UTC", directory: directory),
                readable: try await services.reports.readableApps(only: nil), exportsRoot: services.exportsRoot
            )
            // The schedule disappears between requestRun's read and its insert, every time.
            try await services.database.pool.query("""
                CREATE FUNCTION test_delete_schedule() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN DELETE FROM export_schedules WHERE name = NEW.schedule; RETURN NEW; END $$
                """)
            try await services.database.pool.query("CREATE TRIGGER delete_first BEFORE INSERT ON export_runs FOR EACH ROW EXECUTE FUNCTION test_delete_schedule()")
            await #expect(throws: ExportStoreError.unknown("gone")) { _ = try await services.exports.requestRun("gone", slot: nil) }
        }
    }

    @Test("a runner killed in the middle of a file leaves no file under the final name, and the slot is retried")
    func killedMidFile() async throws {
        try await Self.withSeededDatabase { conninfo, services, directory in
                _ = try await services.exports.create(
                    ExportSchedule(name: "daily", query: ["apps": "exp", "days": "7", "dimensions": "date,network"], format: .csv, cron: "0 6 * * *", timezone: "UTC", directory: directory),
                    readable: try await services.reports.readableApps(only: nil), exportsRoot: services.exportsRoot
                )
                let run = try await services.exports.requestRun("daily", slot: nil)
                // The first runner writes the header and first rows, then hangs there.
                let stuck = Locked(false)
                let (first, firstPool) = Exports.runner(services, conninfo, identity: "dies") { configuration in
                    configuration.afterChunk = { _ in
                        stuck.withLock { $0 = true }
                        try await Task.sleep(for: .seconds(3600))
                    }
                }
                let a = Task { await first.run() }
                try await waitUntil { stuck.withLock { $0 } }
                var files = Exports.files(directory, "daily")
                #expect(files.data.isEmpty && files.manifests.isEmpty, "nothing under a final name mid-file: \(files)")
                #expect(files.temporary.count == 1, "the partial file is hidden: \(files.temporary)")
                let partial = try Data(contentsOf: URL(fileURLWithPath: "\(directory)/daily/\(files.temporary[0])"))
                #expect(!partial.isEmpty)
                // SIGKILL's effect on the database side: the connection and its lock die.
                _ = try await services.database.pool.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'adtally export runner dies'")
                a.cancel()
                await a.value
                await firstPool.shutdown()
                #expect(try await services.exports.run("daily", slot: run.slot)?.status != "succeeded")

                // A temporary file a crashed attempt left behind (a SIGKILL runs no cleanup).
                let leftover = "\(directory)/daily/.daily-\(run.slot).csv.tmp-999999-1"
                #expect(FileManager.default.createFile(atPath: leftover, contents: Data("half a fi".utf8)))
                let (second, secondPool) = Exports.runner(services, conninfo, identity: "takes-over")
                let b = Task { await second.run() }
                try await waitUntil { try await services.exports.run("daily", slot: run.slot)?.status == "succeeded" }
                b.cancel()
                await b.value
                await secondPool.shutdown()

                let done = try #require(try await services.exports.run("daily", slot: run.slot))
                #expect(done.attempts == 2 && done.runner == "takes-over")
                files = Exports.files(directory, "daily")
                #expect(files.data == ["daily-\(run.slot).csv"] && files.manifests.count == 1 && files.temporary.isEmpty)
                let manifest = try Exports.checkManifest(directory, "daily", "daily-\(run.slot).csv", run: done)
                #expect(manifest["status"] as? String == "provisional" && done.finalDueAt != nil)
                #expect(done.rows == 21, "7 days × 3 networks")
        }
    }

    @Test("slots missed while no server ran are caught up to the limit; older ones are counted skipped")
    func catchUpAfterDowntime() async throws {
        try await Self.withSeededDatabase { conninfo, services, directory in
                _ = try await services.exports.create(
                    ExportSchedule(name: "hourly", query: ["apps": "exp", "from": "2020-01-01", "to": "2020-01-01"], format: .json, cron: "0 * * * *", timezone: "Asia/Kolkata", directory: directory),
                    readable: try await services.reports.readableApps(only: nil), exportsRoot: services.exportsRoot
                )
                // Every server was down for 30 hours.
                let since = try await services.database.pool.query("UPDATE export_schedules SET planned_through = now() - interval '30 hours' RETURNING planned_through")[0].decode(0, as: Date.self)
                let now = Date()
                let (runner, pool) = Exports.runner(services, conninfo, identity: "back") { configuration in
                    configuration.catchUp = .seconds(24 * 3600)
                    configuration.now = { now }
                }
                let task = Task { await runner.run() }
                try await waitUntil(within: 180) {
                    let rows = try await services.database.pool.query("SELECT status, count(*)::int FROM export_runs GROUP BY 1 ORDER BY 1")
                    let counts = try rows.map { "\(try $0.decode(0, as: String.self))=\(try $0.decode(1, as: Int.self))" }
                    // Every due slot is planned in the runner's first pass: never all done but some.
                    if counts.count == 1, counts[0].hasPrefix("succeeded="), counts[0] != "succeeded=24" {
                        Issue.record("only \(counts): a slot was planned after the others had run")
                    }
                    return counts == ["succeeded=24"]
                }
                task.cancel()
                await task.value
                await pool.shutdown()

                let kolkata = TimeZone(identifier: "Asia/Kolkata")!
                let all = try CronSchedule("0 * * * *").slots(after: Int64(since.timeIntervalSince1970.rounded(.down)), through: Int64(now.timeIntervalSince1970.rounded(.down)), in: kolkata, limit: 100)
                let oldest = Int64(now.timeIntervalSince1970.rounded(.down)) - 24 * 3600
                let written = all.filter { $0.due >= oldest }, skipped = all.filter { $0.due < oldest }
                let runs = try await services.exports.runs("hourly", limit: 100)
                #expect(runs.map(\.slot).sorted() == written.map(\.name) && written.count == 24)
                let schedule = try await services.exports.schedule("hourly")
                #expect(schedule.skippedSlots == Int64(skipped.count) && schedule.lastSkipped == skipped.last?.name && skipped.count >= 5)
                // Kolkata's hours start at :30 UTC; slot names are its wall times.
                #expect(runs.allSatisfy { $0.slot.hasSuffix("00") } && written.allSatisfy { $0.due % 3600 == 1800 })
                for run in runs { try Exports.checkManifest(directory, "hourly", "hourly-\(run.slot).json", run: run) }
        }
    }

    @Test("a scheduled export of a cohort report writes the engine's cohort rows, with immature cells empty, and is provisional while its cohorts may change")
    func cohortExport() async throws {
        try await Self.withSeededDatabase { conninfo, services, directory in
            _ = try await services.appStore.createApp(id: "coh", name: nil, timezone: "UTC", currency: "USD")
            let now = Int64(Date().timeIntervalSince1970) * 1_000_000
            // Three devices a day over five days; each comes back the next day.
            var events: [AdEvent] = []
            for day in 1...5 {
                for device in 0..<3 {
                    for at in [now - Int64(day) * 86_400_000_000, now - Int64(day - 1) * 86_400_000_000 - 60_000_000] where at < now {
                        events.append(Reports.event(.impression, at: at) { $0.device = "d\(day)-\(device)" })
                    }
                }
            }
            try await Reports.store(services, app: "coh", events)
            let readable = try await services.reports.readableApps(only: nil)
            _ = try await services.exports.create(
                ExportSchedule(name: "cohorts", query: ["apps": "coh", "days": "5", "dimensions": "cohort", "metrics": "installs,retention_d1"], format: .csv, cron: "0 6 * * *", timezone: "UTC", directory: directory),
                readable: readable, exportsRoot: services.exportsRoot
            )
            let run = try await services.exports.requestRun("cohorts", slot: nil)
            let (runner, pool) = Exports.runner(services, conninfo, identity: "one")
            let task = Task { await runner.run() }
            try await waitUntil { try await services.exports.run("cohorts", slot: run.slot)?.status == "succeeded" }
            task.cancel()
            await task.value
            await pool.shutdown()
            let done = try #require(try await services.exports.run("cohorts", slot: run.slot))
            #expect(done.fileStatus == "provisional", "its cohorts are inside the accepted event age")
            let text = try String(contentsOfFile: directory + "/" + (done.file ?? ""), encoding: .utf8)
            let records = try #require(Reports.strictCSV(text))
            #expect(records.first == ["cohort", "installs", "retention_d1"], "\(records)")
            #expect(records.count == 6, "five cohorts: \(records)")
            // Yesterday's cohort has not lived its day 1 yet: empty, never 0.
            #expect(records.last?[1] == "3" && records.last?[2] == "", "\(records)")
            #expect(records.dropFirst().dropLast().allSatisfy { $0[1] == "3" && $0[2] == "1" }, "\(records)")
        }
    }

    @Test("a provisional file is written again as NAME-SLOT.final once its days are final; a failing run retries with backoff, then fails")
    func finalPassAndRetries() async throws {
        try await Self.withSeededDatabase { conninfo, services, directory in
                let readable = try await services.reports.readableApps(only: nil)
                _ = try await services.exports.create(
                    ExportSchedule(name: "weekly", query: ["apps": "exp", "days": "3", "dimensions": "network"], format: .csv, cron: "0 6 * * 1", timezone: "UTC", directory: directory),
                    readable: readable, exportsRoot: services.exportsRoot
                )
                let run = try await services.exports.requestRun("weekly", slot: nil)
                let clock = Locked(Date())
                let (runner, pool) = Exports.runner(services, conninfo, identity: "one") { configuration in
                    configuration.now = { clock.withLock { $0 } }
                    configuration.maxAttempts = 3
                }
                var task = Task { await runner.run() }
                try await waitUntil { try await services.exports.run("weekly", slot: run.slot)?.status == "succeeded" }
                let first = try #require(try await services.exports.run("weekly", slot: run.slot))
                #expect(first.fileStatus == "provisional")
                let finalDue = try #require(first.finalDueAt)
                // Late events no longer count after the window: make it a second, and move past the due
                // time. (An hour made the test fail for the first hour after UTC midnight: the day
                // before, the range's last, was still provisional by PostgreSQL's clock.)
                _ = try await services.database.pool.query("UPDATE id_horizon SET max_event_age_seconds = 1")
                clock.withLock { $0 = finalDue.addingTimeInterval(1) }
                try await waitUntil { try await services.exports.run("weekly", slot: run.slot, pass: 2)?.status == "succeeded" }
                let final = try #require(try await services.exports.run("weekly", slot: run.slot, pass: 2))
                #expect(final.fileStatus == "final" && final.trigger == "final" && final.file == "weekly/weekly-\(run.slot).final.csv")
                let earlier = try Exports.checkManifest(directory, "weekly", "weekly-\(run.slot).csv", run: first)
                let later = try Exports.checkManifest(directory, "weekly", "weekly-\(run.slot).final.csv", run: final)
                #expect(earlier["status"] as? String == "provisional" && later["status"] as? String == "final")

                // A run that cannot write: three attempts, backing off, then failed with the error.
                // The folder is changed while no runner runs (a leader's tick may be in it: the
                // removal raced it under a loaded machine's full suite).
                task.cancel()
                await task.value
                try FileManager.default.removeItem(atPath: directory + "/weekly")
                _ = FileManager.default.createFile(atPath: directory + "/weekly", contents: Data("not a folder".utf8))
                task = Task { await runner.run() }
                let broken = try await services.exports.requestRun("weekly", slot: nil, now: Date().addingTimeInterval(3600))
                try await waitUntil(within: 30) { try await services.exports.run("weekly", slot: broken.slot)?.status == "failed" }
                let failed = try #require(try await services.exports.run("weekly", slot: broken.slot))
                #expect(failed.attempts == 3 && (failed.error ?? "").contains("Not a directory"), "\(failed)")
                // Started again by hand once the folder is back.
                task.cancel()
                await task.value
                try FileManager.default.removeItem(atPath: directory + "/weekly")
                task = Task { await runner.run() }
                _ = try await services.exports.requestRun("weekly", slot: broken.slot)
                try await waitUntil { try await services.exports.run("weekly", slot: broken.slot)?.status == "succeeded" }
                task.cancel()
                await task.value
                await pool.shutdown()
        }
    }

    @Test("a reconciliation schedule writes the discrepancy report of its days beside its manifest; a report-only parameter is refused, naming it")
    func reconciliationExport() async throws {
        try await Self.withSeededDatabase { conninfo, services, directory in
            let readable = try await services.reports.readableApps(only: nil)
            let today = Int((Date().timeIntervalSince1970 / 86_400).rounded(.down))
            func day(_ back: Int) -> String { ReportQuery.formatDate(today - back) }
            // The seed has one admob impression on each UTC day before today; the network says 1, 1, 2.
            let csv = "date,app,network,format,country,impressions,clicks,revenue,currency\n"
                + "\(day(1)),exp,admob,banner,US,1,0,0,USD\n\(day(2)),exp,admob,banner,US,1,0,0,USD\n\(day(3)),exp,admob,banner,US,2,0,0,USD\n"
            _ = try await NetworkReportStore(pool: services.database.pool)
                .importReport(try NetworkReport.parse(Array(csv.utf8), source: .csv), fileSHA256: String(repeating: "c", count: 64), via: "cli")
            var schedule = ExportSchedule(
                name: "recon", query: ["apps": "exp", "from": day(3), "to": day(1), "metrics": "revenue"], format: .csv, cron: "0 6 * * *", timezone: "UTC", directory: directory
            )
            schedule.kind = .reconciliation
            await #expect {
                _ = try await services.exports.create(schedule, readable: readable, exportsRoot: services.exportsRoot)
            } throws: { error in
                (error as? FieldError)?.field == "query.metrics"
            }
            schedule.query = ["apps": "exp", "from": day(3), "to": day(1), "dimensions": "date,network", "network": "admob"]
            let saved = try await services.exports.create(schedule, readable: readable, exportsRoot: services.exportsRoot)
            #expect(saved.kind == .reconciliation)
            #expect(String(decoding: try JSONEncoder().encode(saved), as: UTF8.self).contains(#""kind":"reconciliation""#))
            let run = try await services.exports.requestRun("recon", slot: nil)
            let (runner, pool) = Exports.runner(services, conninfo, identity: "one")
            let task = Task { await runner.run() }
            try await waitUntil { try await services.exports.run("recon", slot: run.slot)?.status == "succeeded" }
            task.cancel()
            await task.value
            await pool.shutdown()
            let done = try #require(try await services.exports.run("recon", slot: run.slot))
            let manifest = try Exports.checkManifest(directory, "recon", "recon-\(run.slot).csv", run: done)
            // The last day is not final yet (1 day after it, the window is 3).
            #expect(manifest["status"] as? String == "provisional" && done.fileStatus == "provisional")
            let rows = try #require(Reports.strictCSV(try String(contentsOfFile: "\(directory)/recon/recon-\(run.slot).csv", encoding: .utf8)))
            #expect(rows.first == ["date", "network"] + ReconciliationDocument.metricColumns.map(\.name))
            #expect(rows.dropFirst().map { Array($0.prefix(5)) } == [
                [day(3), "admob", "1", "2", "50"], [day(2), "admob", "1", "1", "0"], [day(1), "admob", "1", "1", "0"],
            ], "\(rows)")
            let flagged = ReconciliationDocument.metricColumns.firstIndex { $0.name == "flagged" }! + 2
            #expect(rows.dropFirst().map { $0[flagged] } == ["true", "false", "false"])
        }
    }

    @Test("a failed attempt waits its backoff; a run left running by a dead leader counts as an attempt; a paused schedule runs nothing")
    func backoffOrphansAndPause() async throws {
        try await Self.withSeededDatabase { conninfo, services, directory in
            _ = try await services.exports.create(
                ExportSchedule(name: "slow", query: ["apps": "exp", "days": "1"], format: .csv, cron: "0 6 * * *", timezone: "UTC", directory: directory),
                readable: try await services.reports.readableApps(only: nil), exportsRoot: services.exportsRoot
            )
            // Rows a dead leader left running: one on its last attempt, one on its first.
            _ = try await services.database.pool.query("""
                INSERT INTO export_runs (schedule, slot, pass, due_at, status, attempts, runner, next_attempt_at)
                VALUES ('slow', '20260101T0600', 1, now(), 'running', 3, 'gone', now()), ('slow', '20260102T0600', 1, now(), 'running', 1, 'gone', now())
                """)
            // The folder becomes a file: every attempt fails.
            _ = FileManager.default.createFile(atPath: directory + "/slow", contents: Data("x".utf8))
            // A leader whose clock runs an hour behind claims nothing: only its takeover is seen.
            let (watcher, watcherPool) = Exports.runner(services, conninfo, identity: "takeover") { configuration in
                configuration.retryBase = .seconds(3)
                configuration.maxAttempts = 3
                configuration.now = { Date().addingTimeInterval(-3600) }
            }
            let watching = Task { await watcher.run() }
            try await waitUntil { watcher.isLeader }
            let last = try #require(try await services.exports.run("slow", slot: "20260101T0600"))
            #expect(last.status == "failed" && (last.error ?? "").contains("gone"), "\(last)")
            // The other counts as attempt 1 and waits 3 s.
            let requeued = try #require(try await services.exports.run("slow", slot: "20260102T0600"))
            #expect(requeued.attempts == 1 && requeued.status == "retrying", "\(requeued)")
            let requeuedFinished = try #require(requeued.finishedAt)
            #expect(abs(requeued.nextAttemptAt.timeIntervalSince(requeuedFinished) - 3) < 0.1, "\(requeued)")
            watching.cancel()
            await watching.value
            await watcherPool.shutdown()

            // A runner on time: attempt 2 after the 3 s, fails, waits 6 s, attempt 3 fails for good.
            let (runner, pool) = Exports.runner(services, conninfo, identity: "backoff") { configuration in
                configuration.retryBase = .seconds(3)
                configuration.maxAttempts = 3
            }
            let task = Task { await runner.run() }
            try await waitUntil {
                let run = try await services.exports.run("slow", slot: "20260102T0600")
                return run?.attempts == 2 && run?.status == "retrying"
            }
            let second = try #require(try await services.exports.run("slow", slot: "20260102T0600"))
            let secondStarted = try #require(second.startedAt), secondFinished = try #require(second.finishedAt)
            #expect(secondStarted.timeIntervalSince(requeued.nextAttemptAt) > -0.1, "not before its backoff: \(second)")
            #expect(abs(second.nextAttemptAt.timeIntervalSince(secondFinished) - 6) < 0.1, "\(second)")
            try await waitUntil { try await services.exports.run("slow", slot: "20260102T0600")?.status == "failed" }
            let failed = try #require(try await services.exports.run("slow", slot: "20260102T0600"))
            #expect(failed.attempts == 3 && (failed.error ?? "").contains("Not a directory"))
            #expect(try #require(failed.startedAt).timeIntervalSince(second.nextAttemptAt) > -0.1, "not before its backoff: \(failed)")

            // Paused: a queued run stays queued.
            try FileManager.default.removeItem(atPath: directory + "/slow")
            _ = try await services.exports.setPaused("slow", true)
            await #expect(throws: ExportStoreError.paused("slow")) { _ = try await services.exports.requestRun("slow", slot: "20260102T0600") }
            _ = try await services.database.pool.query("UPDATE export_runs SET status = 'pending', attempts = 0, next_attempt_at = now() WHERE slot = '20260102T0600'")
            try await Task.sleep(for: .milliseconds(500))
            #expect(try await services.exports.run("slow", slot: "20260102T0600")?.status == "pending")
            _ = try await services.exports.setPaused("slow", false)
            try await waitUntil { try await services.exports.run("slow", slot: "20260102T0600")?.status == "succeeded" }
            task.cancel()
            await task.value
            await pool.shutdown()
        }
    }

    @Test("the API creates, lists, pauses and deletes schedules; a bad cron, zone, query or folder is a 400 naming it")
    func api() async throws {
        try await withTestApp(flags: Reports.flags) { services, client in
            let admin = try await services.appStore.createKey(app: nil, scope: .admin).secret
            _ = try await services.appStore.createApp(id: "exp", name: nil)
            let read = try await services.appStore.createKey(app: "exp", scope: .read).secret
            let directory = Exports.folder()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            func post(_ path: String, _ body: String, key: String = admin) async throws -> (HTTPResponse.Status, String) {
                try await client.execute(uri: path, method: .post, headers: [.authorization: "Bearer \(key)", .contentType: "application/json"], body: ByteBuffer(string: body)) {
                    ($0.status, String(buffer: $0.body))
                }
            }
            let good = #"{"name":"fin","cron":"0 6 * * *","tz":"Europe/Berlin","format":"csv","dir":"\#(directory)","query":{"apps":"exp","days":"1","dimensions":"date,network"}}"#
            for (body, words) in [
                (good.replacingOccurrences(of: "0 6 * * *", with: "0 6 * *"), "cron"),
                (good.replacingOccurrences(of: "Europe/Berlin", with: "Europe/Nowhere"), "tz:"),
                (good.replacingOccurrences(of: "date,network", with: "date,planet"), "query.dimensions"),
                (good.replacingOccurrences(of: "\"exp\"", with: "\"ghost\""), "query.apps"),
                (good.replacingOccurrences(of: directory, with: "/proc/version/x"), "dir: /proc/version/x"),
                (good.replacingOccurrences(of: "\"fin\"", with: "\"Fin Report\""), "name"),
                (good.replacingOccurrences(of: "\"csv\"", with: "\"xlsx\""), "format"),
            ] {
                let (status, text) = try await post("/v1/exports", body)
                #expect(status == .badRequest && text.contains(words), "\(words): \(status) \(text)")
            }
            #expect(try await post("/v1/exports", good, key: read).0 == .forbidden)
            #expect(try await post("/v1/exports", good).0 == .created)
            #expect(try await post("/v1/exports", good).0 == .conflict)
            let listed = try await client.execute(uri: "/v1/exports", method: .get, headers: [.authorization: "Bearer \(admin)"]) { String(buffer: $0.body) }
            #expect(listed.contains(#""name":"fin""#) && listed.contains(#""next_slots":[{"#))
            #expect(try await post("/v1/exports/fin/pause", "").0 == .ok)
            #expect(try await services.exports.schedule("fin").isPaused)
            #expect(try await post("/v1/exports/fin/resume", "").0 == .ok)
            let queued = try await post("/v1/exports/fin/run", "")
            #expect(queued.0 == .accepted && queued.1.contains(#""status":"pending""#), "\(queued)")
            let runs = try await client.execute(uri: "/v1/exports/fin/runs", method: .get, headers: [.authorization: "Bearer \(admin)"]) { String(buffer: $0.body) }
            #expect(runs.contains(#""trigger":"manual""#))
            #expect(try await client.execute(uri: "/v1/exports/nope/runs", method: .get, headers: [.authorization: "Bearer \(admin)"]) { $0.status } == .notFound)
            #expect(try await client.execute(uri: "/v1/exports/fin", method: .delete, headers: [.authorization: "Bearer \(admin)"]) { $0.status } == .noContent)
            #expect(try await services.exports.list().isEmpty)
        }
    }

    @Test("adtally demo --until refuses a malformed time, a future one, one before --days, and a reach past retention, naming the rule")
    func demoUntilIsChecked() async throws {
        let iso = ISO8601DateFormatter()
        func demo(_ arguments: [String]) async throws -> (Int32, String) {
            try await runProcess([adtallyBinary(), "demo", "--database-url", "host=/nonexistent-adtally-socket dbname=x"] + arguments)
        }
        let malformed = try await demo(["--until", "2026-11-20 12:00"])
        #expect(malformed.0 != 0 && malformed.1.contains("--until must be an RFC 3339 time with an offset"), "\(malformed.1)")
        let future = try await demo(["--until", iso.string(from: Date().addingTimeInterval(3600))])
        #expect(future.0 != 0 && future.1.contains("--until must lie between --days ago and now"), "\(future.1)")
        let early = try await demo(["--days", "3", "--until", iso.string(from: Date().addingTimeInterval(-4 * 86_400))])
        #expect(early.0 != 0 && early.1.contains("--until must lie between --days ago and now"), "\(early.1)")
        // 80 days ending 20 days ago reach 100 days back, past the default 90 of retention.
        let far = try await demo(["--days", "80", "--until", iso.string(from: Date().addingTimeInterval(-20 * 86_400))])
        #expect(far.0 != 0 && far.1.contains("must be less than the retention period (90 days)"), "\(far.1)")
    }

    @Test("adtally demo loads apps, money and weeks of valid traffic once; status reads the database")
    func demoAndStatus() async throws {
        try await withMigratedDatabase { conninfo in
            try await Self.withServices(conninfo) { services in
                var logger = Logger(label: "test")
                logger.logLevel = .warning
                let loader = DemoLoader(database: services.database, days: 3, scale: 0.1, logger: logger)
                var updates = 0
                let summary = try await loader.load { _ in updates += 1 }
                #expect(summary.rejected == 0 && summary.events > 3000 && updates == 3 * 4)
                await #expect(throws: DemoLoader.DemoError.self) { _ = try await loader.load() }
                let readable = try await services.reports.readableApps(only: nil)
                #expect(readable.map(\.id) == DemoLoader.appIDs.sorted())
                for app in DemoLoader.appIDs {
                    let query = try ReportQuery.parse(
                        [("apps", app), ("days", "2"), ("dimensions", "network"), ("metrics", "requests,impressions,taps,action_cancels,expiries,wasted_fills,errors,revenue")],
                        readable: readable, isAdmin: true
                    )
                    let page = try await services.reports.page(query)
                    #expect(page.rows.count == 3, "\(app): three networks")
                    let totals = page.totals
                    #expect(totals.requests > totals.impressions && totals.impressions > totals.taps && totals.taps > 0 && totals.errors > 0, "\(app): \(totals)")
                    #expect(totals.revenueMicros > 0)
                    if app != "demo-news" { #expect(totals.expiries > totals.wastedFills && totals.wastedFills > 0, "\(app): \(totals)") }
                }
                let status = try await ServiceStatus.read(pool: services.database.pool, migrator: services.database.migrator)
                #expect(status.migrationsPending.isEmpty && status.migrationsApplied == services.database.migrator.migrations.count)
                #expect(status.eventsLastHour == Int64(summary.events) && status.pendingDeltaRows == 0 && status.exportRunner == nil)
                #expect(status.biggestTables.contains { $0.name == "events" && $0.partitions > 1 })
                #expect(status.isComplete)
                // A database a migration behind: the status says which, and reads no table it lacks.
                _ = try await services.database.pool.query("DELETE FROM schema_migrations WHERE file_name = '0006_exports.sql'")
                _ = try await services.database.pool.query("DROP TABLE export_leader")
                let behind = try await ServiceStatus.read(pool: services.database.pool, migrator: services.database.migrator)
                #expect(!behind.isComplete && behind.migrationsPending.contains { $0.contains("0006_exports") }, "\(behind.migrationsPending)")
            }
        }
    }

    /// A fresh database with services, the seeded app `exp` and an export folder.
    static func withSeededDatabase(_ body: (String, AppServices, String) async throws -> Void) async throws {
        try await withMigratedDatabase { conninfo in
            try await withServices(conninfo) { services in
                try await Exports.seed(services)
                let directory = Exports.folder()
                defer { try? FileManager.default.removeItem(atPath: directory) }
                try await body(conninfo, services, directory)
            }
        }
    }

    /// Services over an existing test database (the runners need its conninfo too).
    static func withServices(_ conninfo: String, _ body: (AppServices) async throws -> Void) async throws {
        var flags = Reports.flags
        flags.databaseURL = conninfo
        flags.port = 0
        flags.poolSize = 4
        flags.exportsRoot = FileManager.default.temporaryDirectory.path
        let settings = try Settings.resolve(flags: flags, environment: [:])
        var logger = Logger(label: "adtally.test")
        logger.logLevel = .critical
        let database = try await Database.open(settings, logger: logger)
        do {
            try await database.migrate()
            try await body(AppServices(settings: settings, database: database, logger: logger))
            await database.close()
        } catch {
            await database.close()
            throw error
        }
    }
}
