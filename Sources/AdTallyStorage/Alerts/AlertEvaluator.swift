import AdTallyCore
import Foundation
import Logging
import Metrics
import PostgresKit
import Synchronization
import TextFormats

/// A POST to a webhook: the body and the headers that sign and name it.
public struct WebhookRequest: Sendable {
    public var url: String
    public var body: [UInt8]
    public var headers: [(String, String)]

    public init(url: String, body: [UInt8], headers: [(String, String)]) {
        self.url = url
        self.body = body
        self.headers = headers
    }
}

/// Evaluates the alert rules (DESIGN §12): one server at a time, elected as the export
/// runner is (`Leadership`, a lock of its own), on a connection of its own.
///
/// Each due rule (every `every_seconds`, a minute by default) is read for each of its
/// apps through the report engine: a report in the app's zone by the hour, with the
/// rule's filters, summed over the window (the last `window_minutes` of whole hours)
/// and, for a change, over the same hours of each of the 4 same weekdays before. The
/// metric's value comes from the metric itself (`ReportMetric.value`), as every report's
/// does. The state (ok → firing → resolved → firing …) changes, and a transition is
/// recorded with its numbers, in one transaction on the leader's connection, together
/// with one delivery per webhook: a row whose id and body every retry sends again.
/// Deliveries are sent after the evaluations, retried after 30 s, 1, 2, 4 … minutes (at
/// most an hour) up to `maxAttempts`, then `failed`; a delivery left `sending` by a
/// server that stopped is sent again (same id) after 5 minutes.
public final class AlertEvaluator: Sendable {
    /// Sends a webhook request; returns the HTTP status, throws when there was none.
    public typealias Send = @Sendable (WebhookRequest) async throws -> Int

    public struct Configuration: Sendable {
        /// This server, as the history names it.
        public var identity: String
        /// How often the leader looks for due rules and deliveries, and a follower for the lock.
        public var tick: Duration = .seconds(5)
        /// Attempts before a delivery is `failed`.
        public var maxAttempts = 8
        /// Wait after the first failed attempt; doubles each time, to `retryCap`.
        public var retryBase: Duration = .seconds(30)
        public var retryCap: Duration = .seconds(3600)
        /// The time (tests run their own clock).
        public var now: @Sendable () -> Date = { Date() }
        /// Where the server's dashboard is, for the link in each notification (ADTALLY_PUBLIC_URL).
        public var dashboardBase: String?
        /// The key webhook secrets are encrypted with (nil: the servers' shared one).
        public var credentialsKey: String?
        /// How webhooks are sent; nil: nothing is sent (deliveries wait).
        public var send: Send?
        /// The longest a pass spends sending, before it evaluates again.
        public var deliveryBudget: Duration = .seconds(20)
        /// A closed window already read is read again (for late events) after this long.
        public var reread: Duration = .seconds(600)

        public init(identity: String) { self.identity = identity }
    }

    /// The advisory lock key ("AdTally alert evaluator").
    public static let lockKey: Int64 = 0x4164_5461_6C6C_7906

    public let configuration: Configuration
    let leaderPool: PostgresPool
    let engine: ReportEngine
    let logger: Logger
    private let leading = Mutex(false)
    private let leaderGauge = Gauge(label: "adtally_alert_evaluator_leader")
    private let evaluationFailures = Counter(label: "adtally_alert_evaluation_failures_total")
    private let deliveredCounter = Counter(label: "adtally_alert_deliveries_total", dimensions: [("outcome", "delivered")])
    private let retryingCounter = Counter(label: "adtally_alert_deliveries_total", dimensions: [("outcome", "retrying")])
    private let failedCounter = Counter(label: "adtally_alert_deliveries_total", dimensions: [("outcome", "failed")])
    private let transitionCounters = Dictionary(uniqueKeysWithValues: AlertTransition.allCases.map {
        ($0, Counter(label: "adtally_alert_transitions_total", dimensions: [("kind", $0.rawValue)]))
    })
    /// The key webhook secrets decrypt with, once read.
    private let credentialsKey = Mutex<String?>(nil)

    /// An evaluator; `leaderPool` should be a pool of one connection of its own.
    public init(configuration: Configuration, leaderPool: PostgresPool, engine: ReportEngine, logger: Logger = Logger(label: "adtally.alerts")) {
        self.configuration = configuration
        self.leaderPool = leaderPool
        self.engine = engine
        self.logger = logger
    }

    /// Whether this server evaluates now.
    public var isLeader: Bool { leading.withLock { $0 } }

    /// Runs until cancelled: waits for the lead, then evaluates and delivers while it leads.
    public func run() async {
        let identity = configuration.identity
        await Leadership(lockKey: Self.lockKey, role: "alert evaluator", table: "alert_leader", identity: identity, tick: configuration.tick, logger: logger).run(
            pool: leaderPool,
            leading: { value in
                self.leading.withLock { $0 = value }
                self.leaderGauge.record(value ? 1 : 0)
            },
            take: { _ in },
            lead: { lease in
                while !Task.isCancelled {
                    do {
                        try await self.pass(lease)
                    } catch where Task.isCancelled {
                        break
                    }
                    try? await Task.sleep(for: self.configuration.tick)
                }
            }
        )
    }

    /// One pass of the leader: evaluates the due rules, then sends the due deliveries.
    func pass(_ lease: PostgresLease) async throws {
        let now = configuration.now()
        let due = try await lease.run { connection in
            try connection.query("""
                SELECT \(unsafeRaw: AlertStore.columns) FROM alert_rules WHERE NOT paused AND next_evaluation_at <= \(now) ORDER BY next_evaluation_at, name
                """).map(AlertStore.rule)
        }
        if !due.isEmpty {
            let apps = Dictionary(try await engine.readableApps(only: nil).map { ($0.id, $0) }, uniquingKeysWith: { a, _ in a })
            for rule in due {
                let read = try await lease.run { connection in
                    try connection.query("SELECT app, window_to, evaluated_at, note FROM alert_states WHERE rule = \(rule.name)").map {
                        (app: try $0.decode(0, as: String.self), read: LastRead(windowTo: try $0.decode(1), evaluatedAt: try $0.decode(2), note: try $0.decode(3)))
                    }
                }
                let last = Dictionary(read.map { ($0.app, $0.read) }, uniquingKeysWith: { a, _ in a })
                for name in rule.apps where !Task.isCancelled {
                    if let app = apps[name], let previous = last[name], previous.isFresh(for: Self.window(rule, zone: app.timezone, now: now).to, now: now, reread: configuration.reread) {
                        continue
                    }
                    try await evaluate(rule, app: apps[name], name: name, now: now, lease: lease)
                }
                try await lease.run { connection in
                    _ = try connection.query("""
                        UPDATE alert_rules SET next_evaluation_at = \(now) + make_interval(secs => every_seconds) WHERE name = \(rule.name)
                        """)
                }
            }
        }
        try await deliver(lease)
    }

    /// What the last evaluation of a rule for an app read.
    struct LastRead {
        var windowTo: Date?
        var evaluatedAt: Date?
        var note: String?

        /// Whether the window ending at `windowTo` was read less than `reread` ago (and
        /// could be: a report that could not be read is tried again at once).
        func isFresh(for windowTo: Date, now: Date, reread: Duration) -> Bool {
            guard self.windowTo == windowTo, let evaluatedAt, note?.hasPrefix(AlertEvaluator.unreadable) != true else { return false }
            return now.timeIntervalSince(evaluatedAt) < ExportRunner.seconds(reread)
        }
    }

    /// How the note of an evaluation whose report could not be read starts.
    static let unreadable = "the report could not be read"

    /// Reads a rule for one app and records what it finds (a transition with its delivery, or only the numbers).
    func evaluate(_ rule: AlertRule, app: ReportApp?, name: String, now: Date, lease: PostgresLease) async throws {
        var reading: AlertReading
        var currency: String?
        if let app {
            currency = app.currency
            do {
                reading = try await self.reading(rule, app: app, now: now)
            } catch let error as PostgresError where error.isUnreachable {
                throw error
            } catch {
                // A missing FX rate, a statement timeout: nothing decided, and said why.
                evaluationFailures.increment()
                logger.warning("alert rule could not be read", metadata: ["rule": "\(rule.name)", "app": "\(name)", "error": "\(error)"])
                let window = Self.window(rule, zone: app.timezone, now: now)
                reading = AlertReading(windowFrom: window.from, windowTo: window.to, requests: 0, value: nil, note: "\(Self.unreadable): \(error)")
            }
        } else {
            let window = Self.window(rule, zone: "UTC", now: now)
            reading = AlertReading(windowFrom: window.from, windowTo: window.to, requests: 0, value: nil, note: "there is no app \(name)")
        }
        let (identity, base) = (configuration.identity, configuration.dashboardBase)
        let observed = reading, zone = app?.timezone, money = currency
        let fired = try await lease.run { connection in
            try connection.withTransaction { connection -> AlertTransition? in
                // The rule may have been deleted or paused meanwhile: then nothing is recorded.
                guard try !connection.query("SELECT 1 FROM alert_rules WHERE name = \(rule.name) AND NOT paused FOR SHARE").isEmpty else { return nil }
                try connection.query("INSERT INTO alert_states (rule, app) VALUES (\(rule.name), \(name)) ON CONFLICT DO NOTHING")
                let row = try connection.query("SELECT state, notified_at FROM alert_states WHERE rule = \(rule.name) AND app = \(name) FOR UPDATE")[0]
                let state = AlertState(rawValue: try row.decode(0)) ?? .ok
                let transition = AlertTransition.next(rule: rule, state: state, notifiedAt: try row.decode(1), reading: observed, now: now)
                let nextState: AlertState = switch transition {
                case .firing, .renotify: .firing
                case .resolved: .resolved
                case nil: state
                }
                try connection.query("""
                    UPDATE alert_states SET evaluated_at = \(now), value = \(observed.value), baseline = \(observed.baseline), requests = \(observed.requests),
                           window_from = \(observed.windowFrom), window_to = \(observed.windowTo), note = \(observed.note),
                           state = \(nextState.rawValue),
                           since = CASE WHEN state = \(nextState.rawValue) THEN since ELSE \(now) END,
                           notified_at = CASE WHEN \(transition != nil) THEN \(now) ELSE notified_at END
                    WHERE rule = \(rule.name) AND app = \(name)
                    """)
                guard let transition else { return nil }
                let event = try connection.query("""
                    INSERT INTO alert_events (rule, app, kind, at, value, baseline, requests, window_from, window_to, evaluator)
                    VALUES (\(rule.name), \(name), \(transition.rawValue), \(now), \(observed.value), \(observed.baseline), \(observed.requests),
                            \(observed.windowFrom), \(observed.windowTo), \(identity))
                    RETURNING event_id
                    """)[0]
                let delivery = UUID()
                let notification = AlertNotification(
                    deliveryID: delivery.uuidString.lowercased(), eventID: try event.decode(0), kind: transition.rawValue, rule: rule, app: name, reading: observed,
                    timezone: zone, currency: money, at: now, dashboard: base.map { Self.dashboardLink($0, app: name, reading: observed, zone: zone) }
                )
                try connection.query("""
                    INSERT INTO alert_deliveries (delivery_id, event_id, webhook_url, webhook_url_sealed, webhook_shown, body, status, next_attempt_at)
                    SELECT \(delivery), \(notification.eventID), webhook_url, webhook_url_sealed, webhook_shown,
                           \(String(decoding: notification.json(), as: UTF8.self)), 'pending', \(now)
                    FROM alert_rules WHERE name = \(rule.name)
                    """)
                return transition
            }
        }
        if let fired {
            transitionCounters[fired]?.increment()
            logger.notice("alert \(fired.rawValue)", metadata: [
                "rule": "\(rule.name)", "app": "\(name)", "value": "\(observed.value.map { AlertRule.text($0) } ?? "none")",
                "baseline": "\(observed.baseline.map { AlertRule.text($0) } ?? "none")", "requests": "\(observed.requests)",
            ])
        }
    }

    // MARK: - Reading a rule through the report engine

    /// A rule's window at `now` in a zone: the last `window_minutes` of whole hours, ending where the current hour starts.
    static func window(_ rule: AlertRule, zone: String, now: Date) -> (from: Date, to: Date) {
        let calendar = Self.calendar(zone)
        let to = calendar.dateInterval(of: .hour, for: now)?.start ?? now
        return (to.addingTimeInterval(-TimeInterval(rule.windowMinutes * 60)), to)
    }

    /// Each hour that starts in the windows, as the report engine writes an hour in
    /// `zone`: `2026-11-23T10:00:00-05:00` (the local hour and the zone's offset then).
    static func hourTexts(_ windows: [(from: Date, to: Date)], zone: String) -> [String] {
        let timeZone = TimeZone(identifier: zone) ?? TimeZone(identifier: "UTC")!
        func two(_ value: Int) -> String { value < 10 ? "0\(value)" : "\(value)" }
        var texts = Set<String>()
        for window in windows {
            var hour = window.from
            while hour < window.to {
                let offset = timeZone.secondsFromGMT(for: hour)
                let local = Int(hour.timeIntervalSince1970.rounded(.down)) + offset
                let days = Int((Double(local) / 86_400).rounded(.down))
                let (year, month, day) = CivilTime.date(days: days)
                let seconds = local - days * 86_400
                let sign = offset < 0 ? "-" : "+"
                texts.insert("\(year)-\(two(month))-\(two(day))T\(two(seconds / 3600)):\(two(seconds % 3600 / 60)):00\(sign)\(two(abs(offset) / 3600)):\(two(abs(offset) % 3600 / 60))")
                hour = hour.addingTimeInterval(3600)
            }
        }
        return texts.sorted()
    }

    static func calendar(_ zone: String) -> Calendar {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: zone) ?? TimeZone(identifier: "UTC")!
        return calendar
    }

    /// The report a rule reads for an app over `days` (its zone's): by the hour, requests
    /// and the rule's metric, with its filters.
    static func query(_ rule: AlertRule, app: ReportApp, days: ClosedRange<Int>) throws(ReportQueryError) -> ReportQuery {
        var parameters = [
            ("apps", app.id), ("tz", app.timezone), ("from", ReportQuery.formatDate(days.lowerBound)), ("to", ReportQuery.formatDate(days.upperBound)),
            ("dimensions", "hour"), ("metrics", rule.metric == .requests ? "requests" : "requests," + rule.metric.rawValue),
            ("limit", String(ReportQuery.maxLimit)),
        ]
        // Each filter under its dimension's name, as the API takes it. The output is named
        // apart, so `format` can only be the ad-format filter (`format=csv` is refused).
        parameters += rule.filters.sorted(by: { $0.key < $1.key }).map { ($0.key, $0.value) }
        return try ReportQuery.parse(parameters, readable: [app], isAdmin: true, output: .json)
    }

    /// What a rule finds for an app at `now`: the window's requests and value, and for a
    /// change the baseline — the mean of the metric over the same local hours of each of
    /// the 4 same weekdays before that had at least the minimum volume (at least one request).
    public func reading(_ rule: AlertRule, app: ReportApp, now: Date) async throws -> AlertReading {
        let window = Self.window(rule, zone: app.timezone, now: now)
        let calendar = Self.calendar(app.timezone)
        var windows = [window]
        if rule.condition.isChange {
            for week in 1...4 {
                guard let from = calendar.date(byAdding: .day, value: -7 * week, to: window.from),
                      let to = calendar.date(byAdding: .day, value: -7 * week, to: window.to) else { continue }
                windows.append((from, to))
            }
        }
        let days = try ReportQuery.today(in: app.timezone, now: windows.map(\.from).min()!)...ReportQuery.today(in: app.timezone, now: window.to.addingTimeInterval(-1))
        // Only the windows' hours (as the mediation refresher reads its window): a change
        // rule's 5 windows, not the 29 days they span by the hour.
        var query = try Self.query(rule, app: app, days: days)
        query.filters.append((.hour, Self.hourTexts(windows, zone: app.timezone)))
        let page = try await engine.page(query)
        var sums = [ReportCounts](repeating: ReportCounts(), count: windows.count)
        for row in page.rows {
            guard let text = row.dimensions.first ?? nil, let micros = RFC3339.parseMicros(text) else { continue }
            let hour = Date(timeIntervalSince1970: Double(micros) / 1_000_000)
            for (index, span) in windows.enumerated() where hour >= span.from && hour < span.to {
                sums[index].add(row.counts)
            }
        }
        var reading = AlertReading(windowFrom: window.from, windowTo: window.to, requests: sums[0].requests, value: rule.value(sums[0]))
        if rule.condition.isChange {
            // A week whose same wall-clock hours span a DST change has an hour more or less
            // than the window: its counts and money are scaled to the window's length.
            let length = window.to.timeIntervalSince(window.from)
            let weeks = zip(windows, sums).dropFirst().filter { $0.1.requests >= max(rule.minRequests, 1) }.compactMap { span, counts in
                rule.value(counts).map { value in rule.isAdditive ? value * length / span.to.timeIntervalSince(span.from) : value }
            }
            reading.baseline = weeks.isEmpty ? nil : weeks.reduce(0, +) / Double(weeks.count)
            if weeks.isEmpty {
                reading.note = "no baseline: none of the 4 weeks before had \(max(rule.minRequests, 1)) requests in these hours"
            } else if reading.baseline == 0 {
                reading.note = "the baseline is 0: no change can be measured against it"
            }
        }
        if reading.requests < rule.minRequests {
            reading.note = "\(reading.requests) requests in the window, under the rule's minimum of \(rule.minRequests): nothing decided"
        } else if reading.value == nil {
            reading.note = "\(rule.metric.rawValue) has no value in the window (nothing to divide by)"
        }
        return reading
    }

    /// The dashboard's view of an app over the window's days.
    static func dashboardLink(_ base: String, app: String, reading: AlertReading, zone: String?) -> String {
        // The day an instant falls in, in the app's zone (UTC for an app that is gone).
        func day(_ date: Date) -> String {
            ReportQuery.formatDate((try? ReportQuery.today(in: zone ?? "UTC", now: date)) ?? Int((date.timeIntervalSince1970 / 86_400).rounded(.down)))
        }
        let (from, to) = (day(reading.windowFrom), day(reading.windowTo.addingTimeInterval(-1)))
        let encoded = app.addingPercentEncoding(withAllowedCharacters: .alphanumerics.union(CharacterSet(charactersIn: "-._~"))) ?? app
        return "\(base)/dashboard?app=\(encoded)&from=\(from)&to=\(to)"
    }

    // MARK: - Deliveries

    /// The request of a delivery: its body, signed with the webhook's secret.
    static func request(url: String, body: [UInt8], secret: String, delivery: UUID, kind: String) -> WebhookRequest {
        WebhookRequest(url: url, body: body, headers: [
            ("Content-Type", "application/json"), ("User-Agent", "AdTally-Webhook/1"),
            ("X-AdTally-Signature", AlertNotification.signature(body: body, secret: secret)),
            ("X-AdTally-Delivery", delivery.uuidString.lowercased()), ("X-AdTally-Event", kind),
        ])
    }

    /// How one attempt ended.
    enum Outcome: Sendable {
        case delivered(status: Int)
        case failed(status: Int?, error: String)
    }

    /// Sends a request once: delivered on a 2xx answer.
    static func attempt(_ request: WebhookRequest, send: Send) async -> Outcome {
        do {
            let status = try await send(request)
            return (200..<300).contains(status) ? .delivered(status: status) : .failed(status: status, error: "the webhook answered HTTP \(status)")
        } catch {
            return .failed(status: nil, error: String("\(error)".prefix(2000)))
        }
    }

    /// Records an attempt's outcome, unless the delivery was claimed again meanwhile.
    static func record(_ connection: PostgresConnection, delivery: UUID, attempt: Int, outcome: Outcome, maxAttempts: Int, retryAt: Date) throws {
        switch outcome {
        case .delivered(let status):
            try connection.query("""
                UPDATE alert_deliveries SET status = 'delivered', last_status = \(status), delivered_at = now(), error = NULL
                WHERE delivery_id = \(delivery) AND attempts = \(attempt) AND status = 'sending'
                """)
        case .failed(let status, let error):
            try connection.query("""
                UPDATE alert_deliveries SET status = \(attempt >= maxAttempts ? "failed" : "retrying"), last_status = \(status), error = \(error),
                       next_attempt_at = \(retryAt)
                WHERE delivery_id = \(delivery) AND attempts = \(attempt) AND status = 'sending'
                """)
        }
    }

    /// Sends due deliveries, oldest first, for at most `deliveryBudget` a pass (a
    /// receiver that never answers must not hold up the rules' evaluations). Those of
    /// a paused rule wait.
    func deliver(_ lease: PostgresLease) async throws {
        guard let send = configuration.send else { return }
        let given = configuration.credentialsKey
        // Read once, and only when there is something to sign (without
        // ADTALLY_CREDENTIALS_KEY it is an upsert of server_secrets); it never changes.
        var key = credentialsKey.withLock { $0 }
        let now = configuration.now()
        let maxAttempts = configuration.maxAttempts
        // Left sending by a server (or an `alerts test`) that stopped mid-attempt.
        let gaveUp = try await lease.run { connection in
            try connection.query("""
                UPDATE alert_deliveries SET status = CASE WHEN attempts >= \(maxAttempts) THEN 'failed' ELSE 'retrying' END,
                       error = 'the sender stopped during this attempt'
                WHERE status = 'sending' AND next_attempt_at < \(now.addingTimeInterval(-300))
                RETURNING delivery_id, status
                """).filter { try $0.decode(1, as: String.self) == "failed" }.map { try $0.decode(0, as: UUID.self) }
        }
        for id in gaveUp {
            failedCounter.increment()
            logger.warning("alert webhook delivery failed", metadata: [
                "delivery": "\(id.uuidString.lowercased())", "error": "the sender stopped during its last attempt", "gave_up": "true",
            ])
        }
        let started = ContinuousClock.now
        while !Task.isCancelled, ContinuousClock.now - started < configuration.deliveryBudget {
            let now = configuration.now()
            let claimed = try await lease.run { connection -> (id: UUID, body: [UInt8], attempt: Int, rule: String, kind: String)? in
                let rows = try connection.query("""
                    WITH next AS (
                        SELECT d.delivery_id FROM alert_deliveries d
                        JOIN alert_events e ON e.event_id = d.event_id JOIN alert_rules r ON r.name = e.rule AND NOT r.paused
                        WHERE d.status IN ('pending', 'retrying') AND d.next_attempt_at <= \(now)
                        ORDER BY d.next_attempt_at, d.delivery_id LIMIT 1 FOR UPDATE OF d SKIP LOCKED
                    )
                    UPDATE alert_deliveries d SET status = 'sending', attempts = attempts + 1, next_attempt_at = \(now)
                    FROM next, alert_events e WHERE d.delivery_id = next.delivery_id AND e.event_id = d.event_id
                    RETURNING d.delivery_id, d.body, d.attempts, e.rule, e.kind
                    """)
                guard let row = rows.first else { return nil }
                return (try row.decode(0), Array(try row.decode(1, as: String.self).utf8), try row.decode(2), try row.decode(3), try row.decode(4))
            }
            guard let claimed else { return }
            let outcome: Outcome
            do {
                // On the lease's own connection: it is this pool's only one.
                if key == nil {
                    let read = try await lease.run { connection in try AppStore.credentialsKey(given, on: connection) }
                    credentialsKey.withLock { $0 = read }
                    key = read
                }
                let passKey = key ?? ""
                let secret = try await lease.run { connection in try AlertStore.secret(connection, rule: claimed.rule, key: passKey) }
                guard let secret else { throw FieldError("rule", "the rule \(claimed.rule) was deleted") }
                let url = try await lease.run { connection in try AlertStore.webhookURL(connection, delivery: claimed.id, key: passKey) }
                guard let url else { throw FieldError("webhook", "the delivery's webhook could not be read") }
                outcome = await Self.attempt(Self.request(url: url, body: claimed.body, secret: secret, delivery: claimed.id, kind: claimed.kind), send: send)
            } catch let error as PostgresError where error.isUnreachable {
                throw error
            } catch {
                // A secret that no longer decrypts (ADTALLY_CREDENTIALS_KEY changed): a failed attempt like any other.
                outcome = .failed(status: nil, error: "the webhook's secret or URL could not be read: \(error)")
            }
            let retryAt = configuration.now().addingTimeInterval(
                ExportRunner.seconds(retryDelay(attempt: claimed.attempt, base: configuration.retryBase, cap: configuration.retryCap)))
            try await lease.run { connection in
                try Self.record(connection, delivery: claimed.id, attempt: claimed.attempt, outcome: outcome, maxAttempts: maxAttempts, retryAt: retryAt)
            }
            switch outcome {
            case .delivered: deliveredCounter.increment()
            case .failed(_, let error):
                (claimed.attempt >= maxAttempts ? failedCounter : retryingCounter).increment()
                logger.warning("alert webhook delivery failed", metadata: [
                    "rule": "\(claimed.rule)", "delivery": "\(claimed.id.uuidString.lowercased())", "attempt": "\(claimed.attempt)", "error": "\(error)",
                    "gave_up": "\(claimed.attempt >= maxAttempts)",
                ])
            }
        }
    }

}
