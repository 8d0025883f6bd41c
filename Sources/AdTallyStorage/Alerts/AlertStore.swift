import AdTallyCore
import Foundation
import PostgresKit

/// A rule's state for one app, with the last evaluation's numbers (`alert_states`).
public struct AlertStatus: Sendable, Equatable, Encodable {
    public var rule: String
    public var app: String
    public var state: AlertState
    public var since: Date
    public var notifiedAt: Date?
    public var evaluatedAt: Date?
    public var value: Double?
    public var baseline: Double?
    public var requests: Int64?
    public var windowFrom: Date?
    public var windowTo: Date?
    /// Why the last evaluation decided nothing, or nil.
    public var note: String?

    enum CodingKeys: String, CodingKey {
        case rule, app, state, since, value, baseline, requests, note
        case notifiedAt = "notified_at", evaluatedAt = "evaluated_at", windowFrom = "window_from", windowTo = "window_to"
    }

    static let columns = "rule, app, state, since, notified_at, evaluated_at, value, baseline, requests, window_from, window_to, note"

    init(_ row: PostgresRow) throws {
        rule = try row.decode(0)
        app = try row.decode(1)
        state = AlertState(rawValue: try row.decode(2)) ?? .ok
        since = try row.decode(3)
        notifiedAt = try row.decode(4)
        evaluatedAt = try row.decode(5)
        value = try row.decode(6)
        baseline = try row.decode(7)
        requests = try row.decode(8)
        windowFrom = try row.decode(9)
        windowTo = try row.decode(10)
        note = try row.decode(11)
    }
}

/// One delivery of an event to a webhook: its id is the same on every attempt.
public struct AlertDelivery: Sendable, Equatable, Encodable {
    public var id: String
    public var webhook: String
    /// pending, sending, retrying, delivered or failed.
    public var status: String
    public var attempts: Int
    /// The receiver's last HTTP status.
    public var lastStatus: Int?
    public var error: String?
    public var nextAttemptAt: Date?
    public var deliveredAt: Date?

    enum CodingKeys: String, CodingKey {
        case id, webhook, status, attempts, error
        case lastStatus = "last_status", nextAttemptAt = "next_attempt_at", deliveredAt = "delivered_at"
    }

    /// The webhook as it is shown: redacted (Migrations/0020).
    static let columns = "delivery_id, coalesce(webhook_shown, adtally_redact_url(webhook_url)), status, attempts, last_status, error, next_attempt_at, delivered_at"

    init(_ row: PostgresRow, at offset: Int = 0) throws {
        id = try row.decode(offset, as: UUID.self).uuidString.lowercased()
        webhook = try row.decode(offset + 1)
        status = try row.decode(offset + 2)
        attempts = try row.decode(offset + 3)
        lastStatus = try row.decode(offset + 4)
        error = try row.decode(offset + 5)
        nextAttemptAt = try row.decode(offset + 6)
        deliveredAt = try row.decode(offset + 7)
        // The time of the next attempt means nothing once it ended.
        if status == "delivered" || status == "failed" { nextAttemptAt = nil }
    }
}

/// A transition (or a test), with the numbers that caused it and its delivery (`alert_events`).
public struct AlertEvent: Sendable, Equatable, Encodable {
    public var id: Int64
    public var rule: String
    public var app: String?
    /// firing, resolved, renotify or test.
    public var kind: String
    public var at: Date
    public var value: Double?
    public var baseline: Double?
    public var requests: Int64?
    public var windowFrom: Date?
    public var windowTo: Date?
    /// The server that evaluated.
    public var evaluator: String?
    public var deliveries: [AlertDelivery]

    enum CodingKeys: String, CodingKey {
        case id, rule, app, kind, at, value, baseline, requests, evaluator, deliveries
        case windowFrom = "window_from", windowTo = "window_to"
    }
}

/// Why a rule operation was refused.
public enum AlertStoreError: Error, Sendable, Equatable, CustomStringConvertible {
    case exists(String)
    case unknown(String)

    public var description: String {
        switch self {
        case .exists(let name): "an alert rule named \(name) exists already (delete it first, or choose another name)"
        case .unknown(let name): "there is no alert rule named \(name) (adtally alerts list shows them)"
        }
    }
}

/// Alert rules, their states and their history (DESIGN §12, Migrations/0018). The
/// webhooks' secrets are stored encrypted, with the networks' credentials' key.
public struct AlertStore: Sendable {
    let pool: PostgresPool
    /// ADTALLY_CREDENTIALS_KEY, else the servers' shared key.
    let key: String?

    public init(pool: PostgresPool, key: String? = nil) {
        self.pool = pool
        self.key = key
    }

    static let columns = """
        name, to_json(apps)::text, metric, filters::text, condition, threshold, window_minutes, min_requests, every_seconds,
        renotify_minutes, coalesce(webhook_shown, adtally_redact_url(webhook_url)), paused, created_at, updated_at
        """

    static func rule(_ row: PostgresRow) throws -> AlertRule {
        let decoder = JSONDecoder()
        var rule = AlertRule(
            name: try row.decode(0), apps: try decoder.decode([String].self, from: Data(try row.decode(1, as: String.self).utf8)),
            metric: ReportMetric(rawValue: try row.decode(2)) ?? .requests,
            filters: try decoder.decode([String: String].self, from: Data(try row.decode(3, as: String.self).utf8)),
            condition: AlertCondition(rawValue: try row.decode(4)) ?? .below, threshold: try row.decode(5), windowMinutes: try row.decode(6),
            minRequests: try row.decode(7), webhook: try row.decode(10)
        )
        rule.everySeconds = try row.decode(8)
        rule.renotifyMinutes = try row.decode(9)
        rule.isPaused = try row.decode(11)
        rule.createdAt = try row.decode(12)
        rule.updatedAt = try row.decode(13)
        return rule
    }

    /// Creates a rule. Its apps must be among `readable`, its metric and filters what a
    /// report takes (the report engine's parser says so, naming the parameter). Without a
    /// `secret`, one is made (32 random bytes, hex) and returned: it is shown this once.
    public func create(_ rule: AlertRule, secret: String?, readable: [ReportApp]) async throws -> (rule: AlertRule, madeSecret: String?) {
        try rule.validate()
        if let secret {
            guard (16...256).contains(secret.utf8.count), !secret.utf8.contains(where: { $0 < 0x21 || $0 == 0x7F }) else {
                throw FieldError("secret", "must be 16 to 256 bytes without spaces or control characters")
            }
        }
        for app in rule.apps {
            guard let reportApp = readable.first(where: { $0.id == app }) else { throw FieldError("apps", "there is no app \(app)") }
            do {
                _ = try AlertEvaluator.query(rule, app: reportApp, days: 0...0)
            } catch {
                throw FieldError(error.parameter == "metrics" ? "metric" : "filters.\(error.parameter)", error.message)
            }
        }
        let made = secret == nil ? AppStore.randomHex(bytes: 32) : nil
        let key = try await AppStore(pool: pool).credentialsKey(key)
        let filters = String(decoding: try JSONEncoder().encode(rule.filters), as: UTF8.self)
        let rows = try await pool.query("""
            INSERT INTO alert_rules (name, apps, metric, filters, condition, threshold, window_minutes, min_requests, every_seconds,
                                     renotify_minutes, webhook_url_sealed, webhook_shown, webhook_secret, paused)
            VALUES (\(rule.name), \(array: rule.apps)::text[], \(rule.metric.rawValue), \(filters)::jsonb, \(rule.condition.rawValue), \(rule.threshold),
                    \(rule.windowMinutes), \(rule.minRequests), \(rule.everySeconds), \(rule.renotifyMinutes),
                    pgp_sym_encrypt(\(rule.webhook), \(key)), adtally_redact_url(\(rule.webhook)),
                    pgp_sym_encrypt(\(secret ?? made!), \(key)), \(rule.isPaused))
            ON CONFLICT (name) DO NOTHING
            RETURNING \(unsafeRaw: Self.columns)
            """)
        guard let row = rows.first else { throw AlertStoreError.exists(rule.name) }
        return (try Self.rule(row), made)
    }

    /// Every rule, by name.
    public func list() async throws -> [AlertRule] {
        try await pool.query("SELECT \(unsafeRaw: Self.columns) FROM alert_rules ORDER BY name").map(Self.rule)
    }

    /// A rule.
    public func rule(_ name: String) async throws -> AlertRule {
        guard let row = try await pool.query("SELECT \(unsafeRaw: Self.columns) FROM alert_rules WHERE name = \(name)").first else {
            throw AlertStoreError.unknown(name)
        }
        return try Self.rule(row)
    }

    /// The states of a rule's apps (or of every rule's), firing first.
    public func states(_ name: String? = nil) async throws -> [AlertStatus] {
        try await pool.query("""
            SELECT \(unsafeRaw: AlertStatus.columns) FROM alert_states WHERE \(name)::text IS NULL OR rule = \(name)
            ORDER BY state <> 'firing', rule, app
            """).map(AlertStatus.init)
    }

    /// Deletes a rule with its states and history.
    public func delete(_ name: String) async throws {
        guard try await !pool.query("DELETE FROM alert_rules WHERE name = \(name) RETURNING name").isEmpty else { throw AlertStoreError.unknown(name) }
    }

    /// Pauses (nothing evaluated, nothing sent) or resumes a rule; a resumed rule reads
    /// its window again at once.
    public func setPaused(_ name: String, _ paused: Bool) async throws -> AlertRule {
        let row = try await pool.withTransaction { connection in
            let rows = try connection.query("""
                UPDATE alert_rules SET paused = \(paused), updated_at = now(), next_evaluation_at = now() WHERE name = \(name)
                RETURNING \(unsafeRaw: Self.columns)
                """)
            if !paused { try connection.query("UPDATE alert_states SET evaluated_at = NULL WHERE rule = \(name)") }
            return rows.first
        }
        guard let row else { throw AlertStoreError.unknown(name) }
        return try Self.rule(row)
    }

    /// A rule's transitions and tests (or every rule's), newest first, each with its deliveries.
    public func history(_ name: String? = nil, limit: Int = 50) async throws -> [AlertEvent] {
        if let name { _ = try await rule(name) }
        let rows = try await pool.query("""
            SELECT e.event_id, e.rule, e.app, e.kind, e.at, e.value, e.baseline, e.requests, e.window_from, e.window_to, e.evaluator,
                   \(unsafeRaw: AlertDelivery.columns)
            FROM (SELECT * FROM alert_events WHERE \(name)::text IS NULL OR rule = \(name) ORDER BY event_id DESC LIMIT \(min(max(limit, 1), 10_000))) e
            LEFT JOIN alert_deliveries d ON d.event_id = e.event_id
            ORDER BY e.event_id DESC, d.delivery_id
            """)
        var events: [AlertEvent] = []
        for row in rows {
            let id = try row.decode(0, as: Int64.self)
            if events.last?.id != id {
                events.append(AlertEvent(
                    id: id, rule: try row.decode(1), app: try row.decode(2), kind: try row.decode(3), at: try row.decode(4), value: try row.decode(5),
                    baseline: try row.decode(6), requests: try row.decode(7), windowFrom: try row.decode(8), windowTo: try row.decode(9),
                    evaluator: try row.decode(10), deliveries: []
                ))
            }
            if try row.decode(11, as: UUID?.self) != nil { events[events.count - 1].deliveries.append(try AlertDelivery(row, at: 11)) }
        }
        return events
    }

    /// A rule's webhook URL, decrypted (for sending).
    static func webhookURL(_ connection: PostgresConnection, rule name: String, key: String) throws -> String? {
        try connection.query("""
            SELECT coalesce(pgp_sym_decrypt(webhook_url_sealed, \(key)), webhook_url) FROM alert_rules WHERE name = \(name)
            """).first?.decode(0, as: String.self)
    }

    /// A delivery's webhook URL, decrypted (for sending).
    static func webhookURL(_ connection: PostgresConnection, delivery: UUID, key: String) throws -> String? {
        try connection.query("""
            SELECT coalesce(pgp_sym_decrypt(webhook_url_sealed, \(key)), webhook_url) FROM alert_deliveries WHERE delivery_id = \(delivery)
            """).first?.decode(0, as: String?.self)
    }

    /// Encrypts the webhook URLs still stored in plain text (rules and deliveries made
    /// before Migrations/0020) with the servers' key, and forgets the plain text. Each
    /// server runs it when it starts; returns how many were sealed.
    public func sealPlainWebhooks() async throws -> Int {
        let key = try await AppStore(pool: pool).credentialsKey(key)
        return try await pool.withTransaction { connection in
            var sealed = 0
            for table in ["alert_rules", "alert_deliveries"] {
                sealed += try connection.query("""
                    WITH sealed AS (
                        UPDATE \(unsafeRaw: table) SET webhook_url_sealed = pgp_sym_encrypt(webhook_url, \(key)),
                               webhook_shown = adtally_redact_url(webhook_url), webhook_url = NULL
                        WHERE webhook_url IS NOT NULL RETURNING 1
                    )
                    SELECT count(*) FROM sealed
                    """).first?.decode(0, as: Int.self) ?? 0
            }
            return sealed
        }
    }

    /// A rule's webhook secret, decrypted (for signing).
    static func secret(_ connection: PostgresConnection, rule name: String, key: String) throws -> String? {
        try connection.query("SELECT pgp_sym_decrypt(webhook_secret, \(key)) FROM alert_rules WHERE name = \(name)").first?.decode(0, as: String.self)
    }

    /// Records a test notification of a rule (an event of kind `test`) and sends it now
    /// as the evaluator `configuration` sends (its sender, dashboard link, attempts and
    /// backoff); a receiver that fails gets the same delivery again later (the
    /// evaluator's retries). Returns the delivery as it stands after this attempt.
    public func test(_ name: String, configuration: AlertEvaluator.Configuration) async throws -> AlertDelivery {
        guard let send = configuration.send else { throw FieldError("webhook", "this server is set to send no webhooks") }
        let dashboardBase = configuration.dashboardBase
        let rule = try await rule(name)
        let key = try await AppStore(pool: pool).credentialsKey(key)
        let (request, id) = try await pool.withTransaction { connection in
            let event = try connection.query("""
                INSERT INTO alert_events (rule, kind) VALUES (\(rule.name), 'test') RETURNING event_id, at
                """)[0]
            let delivery = UUID()
            let notification = AlertNotification(
                deliveryID: delivery.uuidString.lowercased(), eventID: try event.decode(0), kind: "test", rule: rule, app: rule.apps.count == 1 ? rule.apps[0] : nil,
                reading: nil, timezone: nil, currency: nil, at: try event.decode(1), dashboard: dashboardBase.map { $0 + "/dashboard" }
            )
            let body = notification.json()
            try connection.query("""
                INSERT INTO alert_deliveries (delivery_id, event_id, webhook_url, webhook_url_sealed, webhook_shown, body, status, attempts, next_attempt_at)
                SELECT \(delivery), \(notification.eventID), webhook_url, webhook_url_sealed, webhook_shown, \(String(decoding: body, as: UTF8.self)), 'sending', 1, now()
                FROM alert_rules WHERE name = \(rule.name)
                """)
            guard let secret = try Self.secret(connection, rule: rule.name, key: key), let url = try Self.webhookURL(connection, rule: rule.name, key: key)
            else { throw AlertStoreError.unknown(name) }
            return (AlertEvaluator.request(url: url, body: body, secret: secret, delivery: delivery, kind: "test"), delivery)
        }
        let outcome = await AlertEvaluator.attempt(request, send: send)
        return try await pool.withTransaction { connection in
            let retry = retryDelay(attempt: 1, base: configuration.retryBase, cap: configuration.retryCap)
            try AlertEvaluator.record(
                connection, delivery: id, attempt: 1, outcome: outcome, maxAttempts: configuration.maxAttempts, retryAt: configuration.now().addingTimeInterval(ExportRunner.seconds(retry))
            )
            return try AlertDelivery(connection.query("SELECT \(unsafeRaw: AlertDelivery.columns) FROM alert_deliveries WHERE delivery_id = \(id)")[0])
        }
    }
}
