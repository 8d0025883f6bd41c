import AdTallyKit
import AdTallyTestSupport
import AsyncHTTPClient
import Foundation
import Testing

/// AdTallyKit (Clients/AdTallyKit) against a real `adtally serve`: DESIGN §10's
/// promise, that an event recorded by the app is counted exactly once whatever happens
/// to the app process, the network or the server in between.
@Suite("AdTallyKit against a real server", .serialized)
struct KitTests {
    // MARK: - Helpers

    /// Settings that send soon and retry fast, so that tests wait little.
    static func quick() -> AdTallyConfiguration {
        var configuration = AdTallyConfiguration()
        configuration.sendAfterEvents = 20
        configuration.sendInterval = 0.2
        configuration.retryBase = 0.2
        configuration.retryCap = 1
        configuration.country = "JP"
        configuration.appVersion = "2.1.0"
        return configuration
    }

    static func folder() -> URL {
        FileManager.default.temporaryDirectory.appendingPathComponent("adtally-kit-\(UUID().uuidString)")
    }

    static var today: String {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "UTC")
        formatter.dateFormat = "yyyy-MM-dd"
        return formatter.string(from: Date())
    }

    /// Runs `adtally serve` on the fixture's database on `port` (a new one when nil).
    static func withServer(
        _ fixture: KitFixture, port: Int? = nil, arguments: [String] = [],
        _ body: (ServerProcess, URL, HTTPClient, URL) async throws -> Void
    ) async throws {
        let log = FileManager.default.temporaryDirectory.appendingPathComponent("adtally-kit-serve-\(UUID().uuidString).log")
        defer { try? FileManager.default.removeItem(at: log) }
        let server = try ServerProcess(databaseURL: fixture.conninfo, port: try port ?? freePort(), log: log, arguments: arguments)
        defer { server.terminate() }
        let client = HTTPClient(eventLoopGroupProvider: .singleton)
        do {
            try await server.waitUntilReady(client)
            try await body(server, URL(string: "http://127.0.0.1:\(server.port)")!, client, log)
        } catch {
            try? await client.shutdown()
            await server.stop()
            throw error
        }
        try? await client.shutdown()
        await server.stop()  // off the cooperative threads; the defer's terminate finds it stopped
    }

    /// Today's report over the app (UTC), as rows of cells.
    static func report(_ client: HTTPClient, _ url: URL, _ fixture: KitFixture, dimensions: String, metrics: String) async throws -> [[Any]] {
        let query = "apps=\(fixture.app)&from=\(today)&to=\(today)&tz=UTC&dimensions=\(dimensions)&metrics=\(metrics)"
        let (status, body) = try await kitHTTP(client, .GET, url.absoluteString + "/v1/reports?" + query, key: fixture.read)
        #expect(status == 200, "\(body)")
        return body["rows"] as? [[Any]] ?? []
    }

    /// Waits for `flush` at most `seconds`.
    static func flush(_ tally: AdTally, within seconds: Double = 60) async throws {
        try await withThrowingTaskGroup(of: Bool.self) { group in
            group.addTask { try await tally.flush(); return true }
            group.addTask { try await Task.sleep(for: .seconds(seconds)); return false }
            let flushed = try await group.next()!
            group.cancelAll()
            if !flushed { throw TestSetupError(description: "flush did not return within \(seconds) s: \(tally.status)") }
        }
    }

    static func ids(_ fixture: KitFixture) async throws -> [String] {
        try await fixture.sql("SELECT event_id::text FROM events WHERE app_id = '\(fixture.app)' ORDER BY event_id").map { $0[0] ?? "" }
    }

    // MARK: - The lifecycle

    @Test("DESIGN §1's banner and interstitial sequences give the fill, show and cancel rates and wasted fills a hand count gives; misuse is thrown, not sent")
    func lifecycle() async throws {
        try await withMigratedDatabase { conninfo in
            let fixture = try await KitFixture.make(conninfo)
            try await Self.withServer(fixture) { _, url, client, _ in
                let misuses = Locked(0)
                var configuration = Self.quick()
                // Nothing is sent before the flush: the queue shows exactly what was recorded.
                configuration.sendAfterEvents = 10_000
                configuration.sendInterval = 3600
                configuration.misuseHandler = { _ in misuses.withLock { $0 += 1 } }
                let tally = try AdTally(server: url, appKey: fixture.ingest, directory: Self.folder(), configuration: configuration)
                try tally.sessionStarted()
                try tally.sessionStarted()
                // Banners: 10 requests, 2 failed, 8 shown; 4 tapped, one of those actions cancelled.
                for index in 0..<10 {
                    let slot = try tally.slot(network: "admob", format: .banner, placement: "home", size: "320x50")
                    try slot.requested()
                    if index < 2 {
                        try slot.failed(code: 3)
                        continue
                    }
                    try slot.shown()
                    if index < 6 { try slot.tapped(willLeave: index == 3) }
                    if index == 2 { try slot.actionCancelled() }
                }
                // Interstitials: 6 requests, 1 failed, 5 loaded; 3 shown (one tapped, its action
                // cancelled); all 5 expire, 2 of them never shown (wasted fills).
                for index in 0..<6 {
                    let slot = try tally.slot(network: "iad", format: .interstitial, placement: "level \"end\"\n")
                    try slot.requested()
                    if index == 0 {
                        try slot.failed(code: 2)
                        continue
                    }
                    try slot.loaded()
                    if index <= 3 {
                        try slot.shown(revenueMicros: 5_000, currency: "USD", precision: .precise)
                        if index == 1 {
                            try slot.tapped(willLeave: true)
                            try slot.actionCancelled()
                        }
                    }
                    try slot.expired()
                }
                // Out of order: thrown, reported, not sent.
                let pendingBefore = tally.status.pending
                let banner = try tally.slot(network: "admob", format: .banner)
                #expect(throws: AdTallyError.self) { try banner.tapped() }
                #expect(throws: AdTallyError.self) { try banner.expired() }
                try banner.requested()
                #expect(throws: AdTallyError.self) { try banner.requested() }
                try banner.shown()
                #expect(throws: AdTallyError.self) { try banner.shown() }
                #expect(throws: AdTallyError.self) { try banner.actionCancelled() }
                #expect(throws: AdTallyError.self) { try banner.shown(revenueMicros: 5, currency: nil) }
                #expect(tally.status.pending == pendingBefore + 2)
                #expect(misuses.withLock { $0 } == 6)

                try await Self.flush(tally)
                #expect(tally.status.deadLettered == 0)
                let rows = try await Self.report(
                    client, url, fixture, dimensions: "format",
                    metrics: "requests,impressions,fill_rate,loads,show_rate,taps,action_cancels,cancel_rate,expiries,wasted_fills,errors"
                )
                var byFormat: [String: [Double?]] = [:]
                for row in rows { byFormat["\(row[0])"] = row.dropFirst().map { ($0 as? NSNumber)?.doubleValue } }
                // By hand: banners 11 requests (one the misuse slot's), 9 impressions, 4 taps, 1 cancel.
                // Ratios are shown to 6 decimals.
                #expect(byFormat["banner"] == [11, 9, (9.0 / 11 * 1e6).rounded() / 1e6, 0, nil, 4, 1, 0.25, 0, 0, 2])
                #expect(byFormat["interstitial"] == [6, 3, 0.5, 5, 0.6, 1, 1, 1.0, 5, 2, 1])
                #expect(rows.count == 2, "\(rows)")
                let sessions = try await Self.report(client, url, fixture, dimensions: "app", metrics: "sessions,requests,unique_devices")
                #expect(sessions.first.map { ($0[1] as? NSNumber)?.intValue } == 2, "\(sessions)")
                // One device, counted once, whether sessions are asked for beside it or not.
                let devices = try await Self.report(client, url, fixture, dimensions: "app", metrics: "unique_devices")
                #expect(sessions.first.map { ($0[3] as? NSNumber)?.intValue } == 1 && devices.first.map { ($0[1] as? NSNumber)?.intValue } == 1, "\(sessions) \(devices)")
                // Every event carries the install's facts.
                let facts = try await fixture.sql("SELECT DISTINCT country, app_version, device, revenue_precision FROM events WHERE type = 'impression' AND format = 'interstitial'")
                #expect(facts == [["JP", "2.1.0", tally.deviceID, "precise"]])
            }
        }
    }

    // MARK: - Offline, bounds, throttling, splits, a refused key

    @Test("recorded with the server down: the queue's bound drops the oldest, counted to the app and the server; the rest arrive once when it is up")
    func offlineThenUp() async throws {
        try await withMigratedDatabase { conninfo in
            let fixture = try await KitFixture.make(conninfo)
            let port = try freePort()
            let url = URL(string: "http://127.0.0.1:\(port)")!
            let noticed = Locked(0)
            var configuration = Self.quick()
            configuration.maxQueueBytes = 16 * 1024
            configuration.segmentBytes = 4096
            configuration.notices = { notice in
                if case .dropped(let count, .queueFull) = notice { noticed.withLock { $0 += count } }
            }
            let tally = try AdTally(server: url, appKey: fixture.ingest, directory: Self.folder(), configuration: configuration)
            // A second device, within its bound: everything it recorded must arrive.
            let roomy = try AdTally(server: url, appKey: fixture.ingest, directory: Self.folder(), configuration: Self.quick())
            var whole: [String] = []
            for _ in 0..<60 { whole.append(try roomy.sessionStarted().uuidString.lowercased()) }
            var recorded: [String] = []
            for _ in 0..<100 {
                let slot = try tally.slot(network: "admob", format: .banner)
                recorded.append(try slot.requested().uuidString.lowercased())
                recorded.append(try slot.shown().uuidString.lowercased())
            }
            // A failed batch may be in flight as recording ends: the bound applies once it is back.
            try await waitUntil("the bound held and every drop was told", within: 30) {
                let status = tally.status
                let dropped = status.dropped[.queueFull] ?? 0
                return status.pendingBytes <= 16 * 1024 && status.pending + dropped == 200 && noticed.withLock { $0 } == dropped
            }
            let dropped = tally.status.dropped[.queueFull] ?? 0
            #expect(dropped > 0)
            // flush waits while the server is down, and returns once it answered.
            let flushing = Task { try await Self.flush(tally, within: 90) }
            let flushingWhole = Task { try await Self.flush(roomy, within: 90) }
            try await Task.sleep(for: .seconds(1))
            #expect(roomy.status.pending == 60 && roomy.status.dropped.isEmpty)
            try await Self.withServer(fixture, port: port) { _, _, _, _ in
                try await flushing.value
                try await flushingWhole.value
                // Everything the roomy device recorded, and exactly the bounded one's newest,
                // arrived once each: the oldest were the ones dropped.
                #expect(try await Self.ids(fixture) == (whole + recorded.suffix(200 - dropped)).sorted())
                // The drop count follows the events (flush waits for events only).
                try await waitUntil("the server has the drop count", within: 30) {
                    try await fixture.sql("SELECT reason, sum(dropped)::text FROM client_drops WHERE app_id = '\(fixture.app)' GROUP BY reason") == [["queue_full", "\(dropped)"]]
                }
            }
        }
    }

    @Test("the database unreachable: the server answers 503 with Retry-After, and the kit waits that long, timed from the server's own log")
    func retryAfterRespected() async throws {
        try await withMigratedDatabase { conninfo in
            let fixture = try await KitFixture.make(conninfo)
            try await Self.withServer(fixture, arguments: ["--log-level", "debug"]) { _, url, _, log in
                let tally = try AdTally(server: url, appKey: fixture.ingest, directory: Self.folder(), configuration: Self.quick())
                try tally.sessionStarted()
                try await Self.flush(tally)
                let name = try #require(conninfo.split(separator: " ").first { $0.hasPrefix("dbname=") }?.dropFirst(7))
                let admin = try TestDatabase.clusterURL
                func setConnections(_ allowed: Bool) async throws {
                    try await runSQL(admin, ["ALTER DATABASE \(name) ALLOW_CONNECTIONS \(allowed)"]
                        + (allowed ? [] : ["SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '\(name)'"]))
                }
                try await setConnections(false)
                for _ in 0..<5 { try tally.sessionStarted() }
                let flushing = Task { try await Self.flush(tally, within: 90) }
                func refusals() throws -> [[String: String]] {
                    try Self.accessLog(log).filter { $0["path"] == "POST /v1/events" && $0["status"] == "503" }
                }
                try await waitUntil("the server refused three batches", within: 60) { try refusals().count >= 3 }
                try await setConnections(true)
                try await flushing.value
                let lines = try Self.accessLog(log).filter { $0["path"] == "POST /v1/events" }
                var checked = 0
                for (line, next) in zip(lines, lines.dropFirst()) where line["status"] == "503" {
                    let retryAfter = try #require(line["retry_after"].flatMap(Int64.init))
                    let answered = try #require(line["answered_at"].flatMap(Int64.init))
                    let received = try #require(next["received_at"].flatMap(Int64.init))
                    #expect(received - answered >= retryAfter * 1_000_000, "retried \(received - answered) µs after a 503 with Retry-After: \(retryAfter)")
                    checked += 1
                }
                #expect(checked >= 3)
                #expect(tally.status.throttled >= 3)
                #expect(try await fixture.sql("SELECT count(*)::text FROM events WHERE type = 'session'") == [["6"]])
            }
        }
    }

    /// The access log lines (`--log-level debug`) as their metadata, `path` the message.
    static func accessLog(_ log: URL) throws -> [[String: String]] {
        let text = try String(contentsOf: log, encoding: .utf8)
        return text.split(separator: "\n").compactMap { line -> [String: String]? in
            guard line.contains("received_at="), let bracket = line.range(of: "] ") else { return nil }
            var fields: [String: String] = ["path": String(line[bracket.upperBound...])]
            for token in line[..<bracket.lowerBound].split(separator: " ") {
                let parts = token.split(separator: "=", maxSplits: 1)
                if parts.count == 2 { fields[String(parts[0])] = String(parts[1]) }
            }
            return fields
        }
    }

    @Test("a 413 halves the batch until the server takes it; every event arrives once")
    func splitsOn413() async throws {
        try await withMigratedDatabase { conninfo in
            let fixture = try await KitFixture.make(conninfo)
            try await Self.withServer(fixture, arguments: ["--max-events", "10"]) { _, url, _, _ in
                var configuration = Self.quick()
                configuration.sendAfterEvents = 1000
                configuration.sendInterval = 3600
                let tally = try AdTally(server: url, appKey: fixture.ingest, directory: Self.folder(), configuration: configuration)
                for _ in 0..<45 { try tally.sessionStarted() }
                try await Self.flush(tally)
                #expect(tally.status.splits >= 2, "\(tally.status)")
                #expect(tally.status.delivered == 45)
                #expect(try await fixture.sql("SELECT count(*)::text, count(DISTINCT event_id)::text FROM events") == [["45", "45"]])
            }
        }
    }

    @Test("a revoked key stops sending and keeps the queue; a new key sends it, once")
    func revokedKey() async throws {
        try await withMigratedDatabase { conninfo in
            let fixture = try await KitFixture.make(conninfo)
            try await Self.withServer(fixture) { _, url, client, _ in
                let folder = Self.folder()
                let stopped = Locked<Int?>(nil)
                var configuration = Self.quick()
                configuration.sendAfterEvents = 1000
                configuration.sendInterval = 3600
                configuration.notices = { notice in
                    if case .sendingStopped(let status, _) = notice { stopped.withLock { $0 = status } }
                }
                var tally: AdTally? = try AdTally(server: url, appKey: fixture.ingest, directory: folder, configuration: configuration)
                for _ in 0..<5 { try tally!.sessionStarted() }
                let (status, body) = try await kitHTTP(client, .DELETE, url.absoluteString + "/v1/keys/\(fixture.ingestKeyID)", key: fixture.admin)
                #expect(status == 200 || status == 204, "\(body)")
                await #expect(throws: AdTallyError.self) { try await Self.flush(tally!) }
                #expect(stopped.withLock { $0 } == 401)
                #expect(tally!.status.pending == 5 && tally!.status.stoppedBy == 401)
                #expect(try await Self.ids(fixture).isEmpty)
                tally = nil
                let renewed = try AdTally(server: url, appKey: try await fixture.newIngestKey(), directory: folder, configuration: configuration)
                try await Self.flush(renewed)
                #expect(renewed.status.pending == 0)
                #expect(try await Self.ids(fixture).count == 5)
            }
        }
    }

    @Test("events too old to send are counted; a refused key on that count is told to the app like a batch's")
    func refusedDropReport() async throws {
        try await withMigratedDatabase { conninfo in
            let fixture = try await KitFixture.make(conninfo)
            try await Self.withServer(fixture) { _, url, client, _ in
                let stopped = Locked<Int?>(nil)
                var configuration = Self.quick()
                // Every event is past the kit's age bound by the time it could be sent,
                // and nothing is sent before the flush (the sender would race it otherwise).
                configuration.maxEventAge = 0.001
                configuration.sendAfterEvents = 1000
                configuration.sendInterval = 3600
                configuration.notices = { notice in
                    if case .sendingStopped(let status, _) = notice { stopped.withLock { $0 = status } }
                }
                let (status, body) = try await kitHTTP(client, .DELETE, url.absoluteString + "/v1/keys/\(fixture.ingestKeyID)", key: fixture.admin)
                #expect(status == 200 || status == 204, "\(body)")
                let tally = try AdTally(server: url, appKey: fixture.ingest, directory: Self.folder(), configuration: configuration)
                for _ in 0..<3 { try tally.sessionStarted() }
                try await Task.sleep(for: .milliseconds(10))
                // The batch leaves as expired without a request; only the drop report reaches the server.
                try await Self.flush(tally)
                #expect(tally.status.dropped[.expired] == 3 && tally.status.requests == 0, "\(tally.status)")
                try await waitUntil("the refused drop report was told", within: 30) { stopped.withLock { $0 } == 401 }
                #expect(tally.status.stoppedBy == 401)
                await #expect(throws: AdTallyError.self) { try await tally.flush() }
                #expect(try await fixture.sql("SELECT count(*)::text FROM client_drops") == [["0"]])
            }
        }
    }

    // MARK: - The switch

    @Test("the switch: revalidated with its ETag (304), the last good answer offline, the default on a fresh install offline, a weighted split kept per device")
    func theSwitch() async throws {
        try await withMigratedDatabase { conninfo in
            let fixture = try await KitFixture.make(conninfo)
            let port = try freePort()
            let folder = Self.folder()
            var configuration = Self.quick()
            configuration.defaultNetworks = ["home": "nend"]
            try await Self.withServer(fixture, port: port) { _, url, client, _ in
                let put = try await kitHTTP(client, .PUT, url.absoluteString + "/v1/apps/\(fixture.app)/mediation/policies", key: fixture.admin,
                                            body: #"{"placement": "home", "rule": "pinned", "network": "admob", "max_age_seconds": 1}"#)
                #expect(put.status == 200, "\(put.body)")
                let weighted = try await kitHTTP(client, .PUT, url.absoluteString + "/v1/apps/\(fixture.app)/mediation/policies", key: fixture.admin,
                                                 body: #"{"placement": "level_end", "rule": "weighted", "weights": {"admob": 1, "iad": 1}, "max_age_seconds": 1}"#)
                #expect(weighted.status == 200, "\(weighted.body)")

                let tally = try AdTally(server: url, appKey: fixture.ingest, directory: folder, configuration: configuration)
                #expect(await tally.refreshNetwork(for: "home") == "admob")
                try await Task.sleep(for: .seconds(1.1))
                // The answer lapsed: asking starts a revalidation, answered 304; the network stands.
                #expect(tally.network(for: "home") == "admob")
                try await waitUntil("the lapsed answer was revalidated", within: 30) { tally.status.switchNotModified >= 1 }
                #expect(tally.network(for: "home") == "admob")

                // A weighted split: each device stays on the side it drew.
                var sides: Set<String> = []
                for _ in 0..<20 {
                    let device = try AdTally(server: url, appKey: fixture.ingest, directory: Self.folder(), configuration: configuration)
                    let first = try #require(await device.refreshNetwork(for: "level_end"))
                    sides.insert(first)
                    for _ in 0..<3 { #expect(await device.refreshNetwork(for: "level_end") == first) }
                    #expect(device.status.switchNotModified >= 3)
                }
                #expect(sides == ["admob", "iad"])
            }
            // The server is gone: a relaunch serves the last good answer from disk.
            let dead = URL(string: "http://127.0.0.1:\(port)")!
            let relaunched = try AdTally(server: dead, appKey: fixture.ingest, directory: folder, configuration: configuration)
            #expect(relaunched.network(for: "home") == "admob")
            #expect(await relaunched.refreshNetwork(for: "home") == "admob")
            // A fresh install that never reached the server: the default compiled into the app.
            let fresh = try AdTally(server: dead, appKey: fixture.ingest, directory: Self.folder(), configuration: configuration)
            #expect(fresh.network(for: "home") == "nend")
            #expect(await fresh.refreshNetwork(for: "home") == "nend")
        }
    }

    // MARK: - Kills

    @Test("a child recording slots is SIGKILLed 55 times, and the server 6 times under it: every event the child was told was recorded is counted exactly once")
    func killedAtRandom() async throws {
        try await withMigratedDatabase { conninfo in
            let fixture = try await KitFixture.make(conninfo)
            let port = try freePort()
            let url = "http://127.0.0.1:\(port)"
            let folder = Self.folder()
            let log = FileManager.default.temporaryDirectory.appendingPathComponent("adtally-kit-kill-\(UUID().uuidString).log")
            defer { try? FileManager.default.removeItem(at: log) }
            var server = try ServerProcess(databaseURL: conninfo, port: port, log: log)
            defer { server.terminate() }
            var told: [String: String] = [:]  // id → type
            var unconfirmed: [String: Int] = [:]  // type → begun, not confirmed, at a kill
            var serverKills = 0
            var generator = SystemRandomNumberGenerator()
            for round in 0..<55 {
                let child = Process()
                child.executableURL = URL(fileURLWithPath: kitBinary("adtally-kit-child"))
                child.arguments = ["--server", url, "--key", fixture.ingest, "--dir", folder.path, "--seed", "\(round + 1)"]
                let output = Pipe()
                child.standardOutput = output
                child.standardError = FileHandle.nullDevice
                try child.run()
                let alive = Int.random(in: 100...400, using: &generator)
                if round % 10 == 5 {
                    // The server dies under the child, while it records and sends; it comes back
                    // before the child is killed in turn.
                    try await Task.sleep(for: .milliseconds(alive / 2))
                    server.kill()
                    serverKills += 1
                    server = try ServerProcess(databaseURL: conninfo, port: port, log: log)
                    try await Task.sleep(for: .milliseconds(alive / 2 + 300))
                } else {
                    try await Task.sleep(for: .milliseconds(alive))
                }
                Foundation.kill(child.processIdentifier, SIGKILL)
                let text = await onOwnThread { () -> String in
                    let data = output.fileHandleForReading.readDataToEndOfFile()
                    child.waitUntilExit()
                    return String(decoding: data, as: UTF8.self)
                }
                var begun: String?
                // Only whole lines count: a kill can cut the last one.
                for line in text.split(separator: "\n", omittingEmptySubsequences: false).dropLast() {
                    let parts = line.split(separator: " ")
                    if parts.first == "begin", parts.count == 2 {
                        begun = String(parts[1])
                    } else if parts.first == "did", parts.count == 3 {
                        told[String(parts[1])] = String(parts[2])
                        begun = nil
                    } else if parts.first == "error" {
                        Issue.record("the child failed: \(line)")
                    }
                }
                // A call the kill interrupted may or may not have reached the queue.
                if let begun { unconfirmed[begun] = (unconfirmed[begun] ?? 0) + 1 } else if text.last != "\n" || text.isEmpty {
                    // The kill may have cut a `begin` line itself.
                    unconfirmed["any"] = (unconfirmed["any"] ?? 0) + 1
                }
                #expect(child.terminationReason == .uncaughtSignal, "the child exited by itself: \(text.suffix(300))")
            }
            #expect(serverKills >= 5)
            #expect(told.count > 1000, "only \(told.count) events recorded")

            // A last run that only sends what is left.
            let flusher = Process()
            flusher.executableURL = URL(fileURLWithPath: kitBinary("adtally-kit-child"))
            flusher.arguments = ["--server", url, "--key", fixture.ingest, "--dir", folder.path, "--flush"]
            let output = Pipe()
            flusher.standardOutput = output
            try flusher.run()
            let flushed = await onOwnThread { () -> String in
                let data = output.fileHandleForReading.readDataToEndOfFile()
                flusher.waitUntilExit()
                return String(decoding: data, as: UTF8.self)
            }
            #expect(flushed == "flushed\n", "\(flushed)")

            let stored = try await fixture.sql("SELECT event_id::text, type FROM events WHERE app_id = '\(fixture.app)'")
            var storedTypes: [String: String] = [:]
            for row in stored { storedTypes[row[0] ?? ""] = row[1] ?? "" }
            #expect(storedTypes.count == stored.count, "an id stored twice")
            let lost = told.filter { storedTypes[$0.key] != $0.value }
            #expect(lost.isEmpty, "\(lost.count) told-recorded events lost, e.g. \(lost.prefix(3))")
            // Events beyond the told ones: only calls a kill interrupted, of their type.
            var extra: [String: Int] = [:]
            for (id, type) in storedTypes where told[id] == nil { extra[type] = (extra[type] ?? 0) + 1 }
            let loose = unconfirmed["any"] ?? 0
            for (type, count) in extra {
                let interrupted = (unconfirmed[type] ?? 0) + loose
                #expect(count <= interrupted, "\(count) \(type) events nobody recorded (interrupted: \(unconfirmed))")
            }
            // The report counts them per type exactly as stored: told + interrupted that landed.
            var expected: [String: Int] = [:]
            for type in storedTypes.values { expected[type] = (expected[type] ?? 0) + 1 }
            let client = HTTPClient(eventLoopGroupProvider: .singleton)
            let rows: [[Any]]
            do {
                try await server.waitUntilReady(client)
                rows = try await Self.report(
                    client, URL(string: url)!, fixture, dimensions: "app",
                    metrics: "requests,loads,impressions,taps,action_cancels,expiries,errors,sessions"
                )
            } catch {
                try? await client.shutdown()
                throw error
            }
            try await client.shutdown()
            let reported = try #require(rows.first).dropFirst().map { ($0 as? NSNumber)?.intValue ?? -1 }
            let types = ["request", "load", "impression", "tap", "action_cancel", "expiry", "error", "session"]
            #expect(reported == types.map { expected[$0, default: 0] }, "report \(reported) vs stored \(expected)")
            var toldTypes: [String: Int] = [:]
            for type in told.values { toldTypes[type] = (toldTypes[type] ?? 0) + 1 }
            for type in types {
                let landedBeyondTold = (expected[type] ?? 0) - (toldTypes[type] ?? 0)
                #expect(landedBeyondTold >= 0, "\(type)")
            }
        }
    }
}
