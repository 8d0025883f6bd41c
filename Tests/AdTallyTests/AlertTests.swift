import AdTallyApp
import AdTallyCore
@testable import AdTallyStorage
import AdTallyTestSupport
import Foundation
import Hummingbird
import HummingbirdTesting
import Logging
import NIOCore
import PostgresKit
import Synchronization
import Testing

/// Alerts (issue 28): rules read through the report engine by one elected evaluator,
/// notifying a local webhook receiver (a real HTTP server) with signed JSON.
@Suite("Alerts: a dead network's fill fires once, signed; resolves; thin data decides nothing; one server notifies, retries keep the delivery id", .serialized)
struct AlertTests {
    /// A webhook receiver: every request it got, and how many it answers 500 first.
    final class Receiver: Sendable {
        struct Received: Sendable {
            var headers: [String: String]
            var body: [UInt8]
            var json: [String: Any] { (try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any]) ?? [:] }
        }

        let received = Mutex<[Received]>([])
        let failuresLeft = Mutex(0)

        func handle(_ request: Request) async throws -> Response {
            let body = try await request.body.collect(upTo: 1 << 20)
            var headers: [String: String] = [:]
            for field in request.headers { headers[field.name.canonicalName.lowercased()] = field.value }
            received.withLock { $0.append(Received(headers: headers, body: Array(body.readableBytesView))) }
            let fail = failuresLeft.withLock { left in
                defer { left = max(0, left - 1) }
                return left > 0
            }
            return Response(status: fail ? .internalServerError : .ok)
        }

        var all: [Received] { received.withLock { $0 } }
    }

    /// Runs `body` with a receiver listening on 127.0.0.1 (its URL given).
    static func withReceiver(_ body: @escaping @Sendable (Receiver, String) async throws -> Void) async throws {
        let receiver = Receiver()
        let router = Router()
        router.post("hook") { request, _ in try await receiver.handle(request) }
        let fixture = Application(router: router, configuration: .init(address: .hostname("127.0.0.1", port: 0)))
        try await fixture.test(.live) { client in
            try await body(receiver, "http://127.0.0.1:\(try #require(client.port))/hook")
        }
    }

    /// An evaluator on a connection of its own, with a fast tick and retries.
    static func evaluator(
        _ services: AppServices, _ conninfo: String, identity: String, key: String? = "test-key", now: (@Sendable () -> Date)? = nil
    ) -> (AlertEvaluator, PostgresPool) {
        let pool = PostgresPool(configuration: .init(conninfo: conninfo, maxConnections: 1))
        var configuration = AlertEvaluator.Configuration(identity: identity)
        configuration.tick = .milliseconds(20)
        configuration.retryBase = .milliseconds(50)
        configuration.dashboardBase = "http://adtally.test"
        configuration.credentialsKey = key
        configuration.send = WebhookClient(gate: .loopbackAllowed).send
        if let now { configuration.now = now }
        var logger = Logger(label: "adtally.alerts")
        logger.logLevel = .critical
        return (AlertEvaluator(configuration: configuration, leaderPool: pool, engine: services.reports, logger: logger), pool)
    }

    /// `count` requests of a network at `hour` (seconds), `filled` of them with an impression.
    static func traffic(hour: Int, network: String, requests: Int, filled: Int) -> [AdEvent] {
        (0..<requests).flatMap { index -> [AdEvent] in
            let at = Int64(hour + 60 + index) * 1_000_000
            let request = Reports.event(.request, at: at, network: network)
            return index < filled ? [request, Reports.event(.impression, at: at + 1, network: network)] : [request]
        }
    }

    /// Checks `X-AdTally-Signature` with openssl (an outside judge), not with AdTally's own HMAC.
    static func signatureIsValid(_ received: Receiver.Received, secret: String) async throws -> Bool {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("adtally-hook-\(UUID().uuidString)").path
        FileManager.default.createFile(atPath: file, contents: Data(received.body))
        defer { try? FileManager.default.removeItem(atPath: file) }
        let (status, output) = try await runProcess(["openssl", "dgst", "-sha256", "-hmac", secret, file])
        guard status == 0, let hex = output.split(separator: "=").last?.trimmingCharacters(in: .whitespacesAndNewlines) else { return false }
        let valid = received.headers["x-adtally-signature"] == "sha256=" + hex
        if !valid { Issue.record("openssl says \(output); the header says \(received.headers["x-adtally-signature"] ?? "nothing")") }
        return valid
    }

    @Test("fill collapse: fires one evaluation after its window closes, notifies once, resolves, thin volume decides nothing")
    func fillCollapse() async throws {
        try await Self.withReceiver { receiver, url in
            try await withMigratedDatabase { conninfo in
                try await ExportTests.withServices(conninfo) { services in
                    _ = try await services.appStore.createApp(id: "alert-app", name: nil, timezone: "UTC", currency: "USD")
                    // Five hours, the first six hours ago: admob fills 90 %, 10 %, 95 %, then too little
                    // traffic to judge; unity never fills (outside the rule's filter).
                    let base = (Int(Date().timeIntervalSince1970) / 3600 - 6) * 3600
                    var events: [AdEvent] = []
                    for (index, (requests, filled)) in [(200, 180), (200, 20), (200, 190), (50, 0)].enumerated() {
                        events += Self.traffic(hour: base + index * 3600, network: "admob", requests: requests, filled: filled)
                        events += Self.traffic(hour: base + index * 3600, network: "unity", requests: 100, filled: 0)
                    }
                    try await Reports.store(services, app: "alert-app", events)
                    let store = AlertStore(pool: services.database.pool, key: "test-key")
                    let readable = try await services.reports.readableApps(only: nil)
                    var rule = AlertRule(
                        name: "admob-fill", apps: ["alert-app"], metric: .fillRate, filters: ["network": "admob"], condition: .below, threshold: 0.5,
                        windowMinutes: 60, minRequests: 100, webhook: url
                    )
                    let secret = "0123456789abcdef-secret"
                    _ = try await store.create(rule, secret: secret, readable: readable)
                    // The same rule with a minimum the window never reaches: never fires.
                    rule.name = "admob-fill-thin"
                    rule.minRequests = 1000
                    let thin = try await store.create(rule, secret: nil, readable: readable)
                    #expect(thin.madeSecret?.count == 64)
                    // Refused, naming the field: a filter that is no dimension; a metric hours do not add up to.
                    await #expect(throws: FieldError("filters", "colour is not a dimension a rule can filter on (network, format, placement, country, …)")) {
                        var bad = rule
                        bad.name = "bad"
                        bad.filters = ["colour": "red"]
                        _ = try await store.create(bad, secret: nil, readable: readable)
                    }
                    await #expect(throws: FieldError.self) {
                        var bad = rule
                        bad.name = "bad"
                        bad.metric = .dau
                        _ = try await store.create(bad, secret: nil, readable: readable)
                    }
                    await #expect(throws: FieldError("name", "history is taken by GET /v1/alerts/history; choose another name")) {
                        _ = try await store.create(rule.renamed("history"), secret: nil, readable: readable)
                    }
                    await #expect(throws: AlertStoreError.exists("admob-fill")) { _ = try await store.create(rule.renamed("admob-fill"), secret: nil, readable: readable) }

                    let clock = Mutex(Date(timeIntervalSince1970: Double(base + 3600 + 30)))
                    let (evaluator, pool) = Self.evaluator(services, conninfo, identity: "evaluator-1") { clock.withLock { $0 } }
                    defer { Task { await pool.shutdown() } }
                    /// One evaluation at `time` (rules made due: the test's clock is hours behind the database's).
                    func evaluate(at time: Int) async throws {
                        clock.withLock { $0 = Date(timeIntervalSince1970: Double(time)) }
                        try await pool.query("UPDATE alert_rules SET next_evaluation_at = '-infinity'")
                        try await pool.withLease { lease in try await evaluator.pass(lease) }
                    }
                    func state(_ name: String) async throws -> AlertStatus? { try await store.states(name).first }

                    // The first hour's window (90 %): ok, nothing sent.
                    try await evaluate(at: base + 3600 + 30)
                    #expect(try await state("admob-fill")?.state == .ok)
                    #expect(try await state("admob-fill")?.value == 0.9)
                    #expect(receiver.all.isEmpty)

                    // The collapse's hour closed 30 s ago: this one evaluation fires, and sends once.
                    try await evaluate(at: base + 2 * 3600 + 30)
                    let firing = try #require(try await state("admob-fill"))
                    #expect(firing.state == .firing && firing.value == 0.1 && firing.requests == 200, "\(firing)")
                    #expect(firing.windowFrom == Date(timeIntervalSince1970: Double(base + 3600)) && firing.windowTo == Date(timeIntervalSince1970: Double(base + 2 * 3600)))
                    let thinState = try #require(try await state("admob-fill-thin"))
                    #expect(thinState.state == .ok && thinState.note?.contains("under the rule's minimum of 1000") == true, "\(thinState)")
                    #expect(receiver.all.count == 1)
                    let first = try #require(receiver.all.first)
                    #expect(try await Self.signatureIsValid(first, secret: secret), "\(first.headers)")
                    #expect(first.json["kind"] as? String == "firing" && first.json["app"] as? String == "alert-app" && first.json["value"] as? Double == 0.1)
                    #expect(first.json["delivery_id"] as? String == first.headers["x-adtally-delivery"] && first.headers["x-adtally-event"] == "firing")
                    #expect((first.json["rule"] as? [String: Any])?["name"] as? String == "admob-fill")
                    let window = try #require(first.json["window"] as? [String: Any])
                    #expect(window["minutes"] as? Int == 60 && window["timezone"] as? String == "UTC")
                    let day = ReportQuery.formatDate((base + 3600) / 86_400)
                    #expect(first.json["dashboard"] as? String == "http://adtally.test/dashboard?app=alert-app&from=\(day)&to=\(day)")
                    let text = try #require(first.json["text"] as? String)
                    #expect(text.hasPrefix("[FIRING] admob-fill: fill_rate of alert-app (network=admob) is 0.1; rule: < 0.5") && text.contains("200 requests"), "\(text)")

                    // A minute on, the same closed window is not read again (for 10 minutes) …
                    let read = firing.evaluatedAt
                    try await evaluate(at: base + 2 * 3600 + 90)
                    #expect(try await state("admob-fill")?.evaluatedAt == read)
                    // … then it is (late events count), still broken: no second notification (re-notify is 12 h away).
                    try await evaluate(at: base + 2 * 3600 + 30 + 660)
                    let again = try #require(try await state("admob-fill"))
                    #expect(again.evaluatedAt == Date(timeIntervalSince1970: Double(base + 2 * 3600 + 30 + 660)) && again.state == .firing && again.since == firing.since)
                    #expect(receiver.all.count == 1)
                    #expect(try await store.history("admob-fill").count == 1)

                    // Fill is back: resolved, sent once more.
                    try await evaluate(at: base + 3 * 3600 + 30)
                    #expect(try await state("admob-fill")?.state == .resolved)
                    #expect(receiver.all.count == 2 && receiver.all.last?.json["kind"] as? String == "resolved")
                    #expect(try await Self.signatureIsValid(try #require(receiver.all.last), secret: secret))

                    // 50 requests, none filled, but under the minimum: neither fires nor resolves.
                    try await evaluate(at: base + 4 * 3600 + 30)
                    let quiet = try #require(try await state("admob-fill"))
                    #expect(quiet.state == .resolved && quiet.value == 0 && quiet.note?.contains("50 requests in the window") == true, "\(quiet)")
                    #expect(receiver.all.count == 2)

                    // The history: the two transitions with their numbers, each delivered on the first attempt.
                    let history = try await store.history("admob-fill")
                    #expect(history.map(\.kind) == ["resolved", "firing"])
                    #expect(history.last?.value == 0.1 && history.last?.requests == 200 && history.last?.evaluator == "evaluator-1")
                    #expect(history.allSatisfy { $0.deliveries.count == 1 && $0.deliveries[0].status == "delivered" && $0.deliveries[0].attempts == 1 })
                    #expect(try await store.history("admob-fill-thin").isEmpty)
                }
            }
        }
    }

    @Test("the state machine: fires, re-notifies only after its interval (never at 0), resolves; a reading that decides nothing changes nothing")
    func transitions() {
        var rule = AlertRule(name: "r", apps: ["a"], metric: .fillRate, condition: .below, threshold: 0.5, windowMinutes: 60, webhook: "http://h/")
        let at = Date(timeIntervalSince1970: 1_800_000_000)
        let low = AlertReading(windowFrom: at, windowTo: at, requests: 10, value: 0.1)
        let high = AlertReading(windowFrom: at, windowTo: at, requests: 10, value: 0.9)
        var thin = low
        thin.note = "thin"
        #expect(AlertTransition.next(rule: rule, state: .ok, notifiedAt: nil, reading: low, now: at) == .firing)
        #expect(AlertTransition.next(rule: rule, state: .resolved, notifiedAt: at, reading: low, now: at) == .firing)
        #expect(AlertTransition.next(rule: rule, state: .ok, notifiedAt: nil, reading: high, now: at) == nil)
        #expect(AlertTransition.next(rule: rule, state: .firing, notifiedAt: at, reading: high, now: at) == .resolved)
        #expect(AlertTransition.next(rule: rule, state: .firing, notifiedAt: at, reading: thin, now: at) == nil)
        #expect(AlertTransition.next(rule: rule, state: .ok, notifiedAt: nil, reading: thin, now: at) == nil)
        // Re-notified 12 h (the default) after the last notification, not a second sooner.
        #expect(AlertTransition.next(rule: rule, state: .firing, notifiedAt: at, reading: low, now: at.addingTimeInterval(12 * 3600 - 1)) == nil)
        #expect(AlertTransition.next(rule: rule, state: .firing, notifiedAt: at, reading: low, now: at.addingTimeInterval(12 * 3600)) == .renotify)
        rule.renotifyMinutes = 0
        #expect(AlertTransition.next(rule: rule, state: .firing, notifiedAt: at, reading: low, now: at.addingTimeInterval(86_400 * 30)) == nil)
        // A change: against the baseline, nothing without one.
        rule.condition = .changeBelow
        rule.threshold = -0.3
        #expect(rule.isBroken(value: 0.6, baseline: 1.0) == true && rule.isBroken(value: 0.8, baseline: 1.0) == false && rule.isBroken(value: 0.6, baseline: nil) == nil)
        #expect(AlertRule.parseChange("-30%") == -0.3 && AlertRule.parseChange("50 %") == 0.5 && AlertRule.parseChange("-0.3") == -0.3 && AlertRule.parseChange("x%") == nil)
    }

    @Test("a reading asks the engine only for its windows' hours, written as the engine writes them: New York across its fall-back hour, Kolkata's half-hour offset, UTC")
    func hourTextsAreTheEngines() async throws {
        try await withServices(flags: Reports.flags) { services in
            for (app, zone) in [("ny", "America/New_York"), ("kolkata", "Asia/Kolkata"), ("utc", "UTC")] {
                _ = try await services.appStore.createApp(id: app, name: nil, timezone: zone, currency: "USD")
                // An event every 20 minutes over the 30 hours around New York's 2026-11-01 fall-back.
                let start = Reports.micros("2026-10-31T18:00:00Z")
                try await Reports.store(services, app: app, (0..<90).map { Reports.event(.request, at: start + Int64($0) * 1_200_000_000) })
                let readable = try await services.reports.readableApps(only: nil)
                let query = try ReportQuery.parse(
                    [("apps", app), ("tz", zone), ("from", "2026-10-30"), ("to", "2026-11-03"), ("dimensions", "hour"), ("limit", "1000")],
                    readable: readable, isAdmin: true
                )
                let engine = try await services.reports.page(query).rows.compactMap { $0.dimensions.first ?? nil }
                let from = Date(timeIntervalSince1970: Double(start) / 1_000_000)
                // Kolkata's hours start at half past a UTC hour: its window starts at its own.
                let window = (from: zone == "Asia/Kolkata" ? from.addingTimeInterval(-1800) : from, to: from.addingTimeInterval(31 * 3600))
                let texts = AlertEvaluator.hourTexts([window], zone: zone)
                #expect(Set(engine).isSubset(of: Set(texts)), "\(zone): \(Set(engine).subtracting(texts).sorted())")
                #expect(engine.count >= 30, "\(zone): \(engine.count) hours")
            }
        }
    }

    @Test("a change against the same hours of the weeks before, in the app's zone")
    func changeAgainstBaseline() async throws {
        try await withMigratedDatabase { conninfo in
            try await ExportTests.withServices(conninfo) { services in
                // Kathmandu (+05:45): its whole hours are not UTC's.
                _ = try await services.appStore.createApp(id: "ktm", name: nil, timezone: "Asia/Kathmandu", currency: "USD")
                let offset = 5 * 3600 + 45 * 60
                let localHour = ((Int(Date().timeIntervalSince1970) + offset) / 3600 - 3) * 3600 - offset
                // The window's hour: 100 requests; the same hour a week before: 400; two weeks
                // before: 10 (under the minimum: not part of the baseline).
                var events = Self.traffic(hour: localHour, network: "admob", requests: 100, filled: 100)
                events += Self.traffic(hour: localHour - 7 * 86_400, network: "admob", requests: 400, filled: 400)
                events += Self.traffic(hour: localHour - 14 * 86_400, network: "admob", requests: 10, filled: 10)
                try await Reports.store(services, app: "ktm", events)
                let rule = AlertRule(
                    name: "requests-drop", apps: ["ktm"], metric: .requests, condition: .changeBelow, threshold: -0.5, windowMinutes: 60, minRequests: 50,
                    webhook: "http://127.0.0.1:9/none"
                )
                let (evaluator, pool) = Self.evaluator(services, conninfo, identity: "e")
                defer { Task { await pool.shutdown() } }
                let reading = try await evaluator.reading(rule, app: ReportApp(id: "ktm", timezone: "Asia/Kathmandu", currency: "USD"), now: Date(timeIntervalSince1970: Double(localHour + 3600 + 10)))
                #expect(reading.windowFrom == Date(timeIntervalSince1970: Double(localHour)) && reading.requests == 100 && reading.value == 100)
                #expect(reading.baseline == 400 && reading.note == nil, "\(reading)")
                #expect(AlertTransition.next(rule: rule, state: .ok, notifiedAt: nil, reading: reading, now: Date()) == .firing)
                // A filter on the ad format (`format`, a word the report parameters share: banner is a
                // format, csv an output) is read as the filter it is.
                var banners = rule
                banners.filters = ["format": "banner"]
                let bannerReading = try await evaluator.reading(banners, app: ReportApp(id: "ktm", timezone: "Asia/Kathmandu", currency: "USD"), now: Date(timeIntervalSince1970: Double(localHour + 3600 + 10)))
                #expect(bannerReading.requests == 100 && bannerReading.baseline == 400, "\(bannerReading)")
                var interstitials = rule
                interstitials.filters = ["format": "interstitial"]
                let interstitialReading = try await evaluator.reading(interstitials, app: ReportApp(id: "ktm", timezone: "Asia/Kathmandu", currency: "USD"), now: Date(timeIntervalSince1970: Double(localHour + 3600 + 10)))
                #expect(interstitialReading.requests == 0, "\(interstitialReading)")
                var output = rule
                output.filters = ["format": "csv"]
                #expect(throws: ReportQueryError.self) { _ = try AlertEvaluator.query(output, app: ReportApp(id: "ktm", timezone: "Asia/Kathmandu", currency: "USD"), days: 0...0) }
                // A window with no week before it of the minimum volume: no baseline, nothing decided.
                let earlier = try await evaluator.reading(rule, app: ReportApp(id: "ktm", timezone: "Asia/Kathmandu", currency: "USD"), now: Date(timeIntervalSince1970: Double(localHour - 7 * 86_400 + 3600 + 10)))
                #expect(earlier.requests == 400 && earlier.baseline == nil && earlier.note?.hasPrefix("no baseline") == true, "\(earlier)")

                // New York, midnight to 03:00 on Sunday 8 November (3 hours); a week before, the
                // same wall-clock hours held 4 (the clocks went back at 02:00). 100 requests an
                // hour throughout: the baseline is scaled to the window's 3 hours, no change.
                _ = try await services.appStore.createApp(id: "nyc", name: nil, timezone: "America/New_York", currency: "USD")
                let first = try #require(ReportQuery.parseDate("2026-11-01")) * 86_400
                var dst: [AdEvent] = []
                for hour in [4, 5, 6, 7] { dst += Self.traffic(hour: first + hour * 3600, network: "admob", requests: 100, filled: 100) }
                for hour in [5, 6, 7] { dst += Self.traffic(hour: first + 7 * 86_400 + hour * 3600, network: "admob", requests: 100, filled: 100) }
                try await Reports.store(services, app: "nyc", dst)
                var nycRule = rule
                nycRule.apps = ["nyc"]
                nycRule.windowMinutes = 180
                nycRule.threshold = -0.2
                let nyc = try await evaluator.reading(nycRule, app: ReportApp(id: "nyc", timezone: "America/New_York", currency: "USD"), now: Date(timeIntervalSince1970: Double(first + 7 * 86_400 + 8 * 3600 + 1800)))
                #expect(nyc.windowFrom == Date(timeIntervalSince1970: Double(first + 7 * 86_400 + 5 * 3600)))
                #expect(nyc.requests == 300 && nyc.baseline == 300 && nyc.note == nil, "\(nyc)")
                #expect(AlertTransition.next(rule: nycRule, state: .ok, notifiedAt: nil, reading: nyc, now: Date()) == nil)
            }
        }
    }

    @Test("two servers evaluate, one notifies; a receiver that fails three times gets the same delivery id the fourth time")
    func oneNotifierAndRetries() async throws {
        try await Self.withReceiver { receiver, url in
            receiver.failuresLeft.withLock { $0 = 3 }
            try await withMigratedDatabase { conninfo in
                try await ExportTests.withServices(conninfo) { services in
                    _ = try await services.appStore.createApp(id: "alert-app", name: nil, timezone: "UTC", currency: "USD")
                    // The last two whole hours (so an hour turning mid-test changes nothing): admob fills nothing.
                    let hour = (Int(Date().timeIntervalSince1970) / 3600 - 1) * 3600
                    try await Reports.store(services, app: "alert-app", Self.traffic(hour: hour, network: "admob", requests: 120, filled: 0)
                        + Self.traffic(hour: hour - 3600, network: "admob", requests: 120, filled: 0))
                    // The servers' own key (no ADTALLY_CREDENTIALS_KEY), as a default install has.
                    let store = AlertStore(pool: services.database.pool)
                    let rule = AlertRule(
                        name: "admob-dead", apps: ["alert-app"], metric: .fillRate, filters: ["network": "admob"], condition: .below, threshold: 0.5,
                        windowMinutes: 60, minRequests: 100, webhook: url
                    )
                    _ = try await store.create(rule, secret: "0123456789abcdef-secret", readable: try await services.reports.readableApps(only: nil))
                    let (first, firstPool) = Self.evaluator(services, conninfo, identity: "server-a", key: nil)
                    let (second, secondPool) = Self.evaluator(services, conninfo, identity: "server-b", key: nil)
                    let tasks = [Task { await first.run() }, Task { await second.run() }]
                    try await waitUntil("the webhook got its delivery after three 500s", within: 60) { receiver.all.count >= 4 }
                    // Both keep running a while: nothing more is sent.
                    try await Task.sleep(for: .milliseconds(500))
                    #expect([first.isLeader, second.isLeader].filter { $0 }.count == 1)
                    let all = receiver.all
                    #expect(all.count == 4)
                    #expect(Set(all.map { $0.headers["x-adtally-delivery"] ?? "" }).count == 1 && Set(all.map(\.body)).count == 1)
                    let history = try await store.history("admob-dead")
                    #expect(history.count == 1 && history.first?.kind == "firing")
                    let delivery = try #require(history.first?.deliveries.first)
                    #expect(delivery.status == "delivered" && delivery.attempts == 4 && delivery.lastStatus == 200 && delivery.id == all[0].headers["x-adtally-delivery"], "\(delivery)")
                    #expect(history.first?.evaluator == (first.isLeader ? "server-a" : "server-b"))
                    for task in tasks { task.cancel() }
                    for task in tasks { await task.value }
                    await firstPool.shutdown()
                    await secondPool.shutdown()

                    // A test notification: sent now, signed, recorded as a test.
                    var alerting = AlertEvaluator.Configuration(identity: "test")
                    alerting.dashboardBase = "http://adtally.test"
                    alerting.send = WebhookClient(gate: .loopbackAllowed).send
                    let test = try await store.test("admob-dead", configuration: alerting)
                    #expect(test.status == "delivered" && test.attempts == 1)
                    let sent = try #require(receiver.all.last)
                    #expect(sent.json["kind"] as? String == "test" && (sent.json["text"] as? String)?.hasPrefix("[TEST] admob-dead") == true)
                    #expect(try await Self.signatureIsValid(sent, secret: "0123456789abcdef-secret"))
                    #expect(try await store.history("admob-dead").first?.kind == "test")
                }
            }
        }
    }

    @Test("adtally alerts create, list, show, test, history, pause and delete; bad options refused by name; status names the evaluator")
    func commandLine() async throws {
        try await Self.withReceiver { receiver, url in
            try await withMigratedDatabase { conninfo in
                let (database, _) = try await openWithApp(conninfo, app: "cli-app")
                await database.close()
                func adtally(_ arguments: String..., environment: [String: String] = [:]) async throws -> (status: Int32, output: String) {
                    try await runProcess([adtallyBinary()] + arguments + ["--database-url", conninfo], environment: environment)
                }
                let both = try await adtally("alerts", "create", "x", "--apps", "cli-app", "--metric", "fill_rate", "--below", "0.5", "--above", "0.9", "--window-minutes", "60", "--webhook", url)
                #expect(both.status != 0 && both.output.contains("give exactly one of --below"), "\(both.output)")
                // The usage that follows is the failing subcommand's, not the root's.
                #expect(both.output.contains("Usage: adtally alerts create [<options>] <name>") && both.output.contains("See 'adtally alerts create --help'"), "\(both.output)")
                let odd = try await adtally("alerts", "create", "x", "--apps", "cli-app", "--metric", "fill_rate", "--below", "0.5", "--window-minutes", "90", "--webhook", url)
                #expect(odd.status != 0 && odd.output.contains("--window-minutes: must be whole hours"), "\(odd.output)")
                let ghost = try await adtally("alerts", "create", "x", "--apps", "ghost", "--metric", "fill_rate", "--below", "0.5", "--window-minutes", "60", "--webhook", url)
                #expect(ghost.status != 0 && ghost.output.contains("--apps: there is no app ghost"), "\(ghost.output)")
                let created = try await adtally(
                    "alerts", "create", "rev-drop", "--apps", "cli-app", "--metric", "revenue", "--filter", "network=admob", "--change-below", "-30%",
                    "--window-minutes", "180", "--min-requests", "500", "--webhook", url
                )
                #expect(created.status == 0 && created.output.contains("revenue change < -30 % over 3 h") && created.output.contains("shown this once"), "\(created.output)")
                let secret = try #require(created.output.split(separator: " ").last.map { $0.trimmingCharacters(in: .whitespacesAndNewlines) })
                let list = try await adtally("alerts", "list")
                #expect(list.status == 0 && list.output.contains("rev-drop") && list.output.contains("revenue{network=admob} change < -30 %"), "\(list.output)")
                let show = try await adtally("alerts", "show", "rev-drop")
                #expect(show.status == 0 && show.output.contains("against the same hours of the 4 same weekdays before") && show.output.contains("not evaluated yet"), "\(show.output)")
                let check = try await adtally("alerts", "check", "rev-drop", "--format", "json")
                let readings = try #require((try? JSONSerialization.jsonObject(with: Data(check.output.utf8)) as? [String: Any])?["app_readings"] as? [[String: Any]], "\(check.output)")
                #expect(readings.count == 1 && readings[0]["app"] as? String == "cli-app" && readings[0]["requests"] as? Int == 0, "\(readings)")
                #expect((readings[0]["note"] as? String)?.contains("under the rule's minimum of 500") == true && readings[0]["would_be"] as? String == "ok (nothing sent)", "\(readings)")
                // The receiver is on loopback, where nothing is sent unless an operator allows it.
                let refused = try await adtally("alerts", "test", "rev-drop")
                #expect(
                    refused.status != 0 && refused.output.contains("webhook: 127.0.0.1 is loopback (127.0.0.0/8)") && refused.output.contains("ADTALLY_OUTBOUND_ALLOW")
                        && receiver.all.isEmpty, "\(refused.output)"
                )
                let test = try await adtally("alerts", "test", "rev-drop", environment: ["ADTALLY_OUTBOUND_ALLOW": "127.0.0.1"])
                #expect(test.status == 0 && test.output.contains("test notification delivered"), "\(test.output)")
                let sent = try #require(receiver.all.last)
                #expect(sent.json["kind"] as? String == "test" && (sent.json["dashboard"] as? String)?.hasSuffix("/dashboard") == true)
                #expect(try await Self.signatureIsValid(sent, secret: secret))
                let history = try await adtally("alerts", "history", "rev-drop")
                #expect(history.status == 0 && history.output.contains("test") && history.output.contains("delivered after 1 attempt (HTTP 200)"), "\(history.output)")
                #expect(try await adtally("alerts", "pause", "rev-drop").status == 0)
                let paused = try await adtally("alerts", "list", "--format", "json")
                #expect(paused.output.contains(#""paused" : true"#) || paused.output.contains(#""paused":true"#), "\(paused.output)")
                let status = try await adtally("status")
                #expect(status.output.contains("alerts:      1 rules, 0 firing, no evaluator"), "\(status.output)")
                // No ADTALLY_CREDENTIALS_KEY here: the rule's secret and URL were sealed with a key the database holds.
                #expect(status.output.contains("secrets:     encrypted with a key kept in this database") && status.output.contains("a dump of the database holds both"), "\(status.output)")
                // With a server up, it names the server that evaluates (the lock's holder).
                try await withReadyServer(conninfo) { _, _ in
                    var named = ""
                    for _ in 0..<100 where !named.contains("evaluated by ") {
                        named = try await adtally("status").output
                        if !named.contains("evaluated by ") { try await Task.sleep(for: .milliseconds(100)) }
                    }
                    #expect(named.contains("alerts:      1 rules, 0 firing, evaluated by "), "\(named)")
                }
                #expect(try await adtally("alerts", "delete", "rev-drop").status == 0)
                let gone = try await adtally("alerts", "show", "rev-drop")
                #expect(gone.status != 0 && gone.output.contains("there is no alert rule named rev-drop"), "\(gone.output)")
            }
        }
    }
}

extension AlertRule {
    func renamed(_ name: String) -> AlertRule {
        var copy = self
        copy.name = name
        return copy
    }
}
