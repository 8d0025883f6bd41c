import Foundation

/// The JSON a webhook receives (DESIGN §12): what happened, to which rule and app, the
/// numbers and window that caused it, a link to the dashboard's view of it, and a `text`
/// that Slack's and Mattermost's incoming webhooks show as it is. Built once per
/// transition and webhook; every retry sends the same bytes, with the same
/// `delivery_id`.
public struct AlertNotification: Sendable, Encodable {
    public var deliveryID: String
    public var eventID: Int64
    /// firing, resolved, renotify or test.
    public var kind: String
    public var rule: AlertRule
    public var app: String?
    public var value: Double?
    public var baseline: Double?
    public var change: Double?
    public var requests: Int64?
    public var windowFrom: Date?
    public var windowTo: Date?
    public var timezone: String?
    public var currency: String?
    public var at: Date
    public var dashboard: String?

    public init(
        deliveryID: String, eventID: Int64, kind: String, rule: AlertRule, app: String?, reading: AlertReading?, timezone: String?, currency: String?,
        at: Date, dashboard: String?
    ) {
        self.deliveryID = deliveryID
        self.eventID = eventID
        self.kind = kind
        self.rule = rule
        self.app = app
        self.value = reading?.value
        self.baseline = reading?.baseline
        self.change = reading.flatMap { reading in reading.value.flatMap { AlertRule.change(value: $0, baseline: reading.baseline) } }
        self.requests = reading?.requests
        self.windowFrom = reading?.windowFrom
        self.windowTo = reading?.windowTo
        self.timezone = timezone
        self.currency = currency
        self.at = at
        self.dashboard = dashboard
    }

    struct Window: Encodable {
        var from: Date
        var to: Date
        var minutes: Int
        var timezone: String?
    }

    struct Rule: Encodable {
        var name: String
        var metric: String
        var condition: String
        var threshold: Double
        var filters: [String: String]
        var minRequests: Int64
        var windowMinutes: Int

        enum CodingKeys: String, CodingKey {
            case name, metric, condition, threshold, filters
            case minRequests = "min_requests", windowMinutes = "window_minutes"
        }
    }

    enum CodingKeys: String, CodingKey {
        case deliveryID = "delivery_id", eventID = "event_id", kind, rule, app, value, baseline, change, requests, window, currency, at, dashboard, text
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(deliveryID, forKey: .deliveryID)
        try container.encode(eventID, forKey: .eventID)
        try container.encode(kind, forKey: .kind)
        try container.encode(Rule(
            name: rule.name, metric: rule.metric.rawValue, condition: rule.condition.rawValue, threshold: rule.threshold, filters: rule.filters,
            minRequests: rule.minRequests, windowMinutes: rule.windowMinutes
        ), forKey: .rule)
        try container.encode(app, forKey: .app)
        try container.encode(value, forKey: .value)
        try container.encode(baseline, forKey: .baseline)
        try container.encode(change, forKey: .change)
        try container.encode(requests, forKey: .requests)
        if let windowFrom, let windowTo {
            try container.encode(Window(from: windowFrom, to: windowTo, minutes: rule.windowMinutes, timezone: timezone), forKey: .window)
        } else {
            try container.encodeNil(forKey: .window)
        }
        try container.encode(currency, forKey: .currency)
        try container.encode(at, forKey: .at)
        try container.encode(dashboard, forKey: .dashboard)
        try container.encode(text, forKey: .text)
    }

    /// One line a chat shows: `[FIRING] fill-drop: fill_rate of demo-app (network=admob) is 0.12, rule < 0.5, 2 h to 2026-11-25 15:00 UTC, 5,400 requests <link|dashboard>`.
    public var text: String {
        let head = switch kind {
        case "firing": "[FIRING]"
        case "resolved": "[RESOLVED]"
        case "renotify": "[STILL FIRING]"
        default: "[TEST]"
        }
        var line = "\(head) \(rule.name): \(rule.metric.rawValue)"
        if let app { line += " of \(app)" }
        if !rule.filters.isEmpty { line += " (" + rule.filters.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: ", ") + ")" }
        if kind == "test" {
            line += ": a test notification; the rule fires when \(rule.metric.rawValue) \(rule.condition.describe(rule.threshold))"
        } else {
            let money = rule.metric.isMoney ? (currency.map { " " + $0 } ?? "") : ""
            line += " is " + (value.map { AlertRule.text($0) + money } ?? "none")
            if let baseline { line += " against \(AlertRule.text(baseline))\(money) the same hours of the 4 weeks before" + (change.map { " (\(AlertRule.percent($0)))" } ?? "") }
            line += "; rule: \(rule.condition.describe(rule.threshold))"
            if let windowFrom, let windowTo {
                line += ", \(rule.windowMinutes / 60) h from \(Self.clock(windowFrom, timezone)) to \(Self.clock(windowTo, timezone))"
            }
            if let requests { line += ", \(requests) requests" }
        }
        if let dashboard { line += " <\(dashboard)|dashboard>" }
        return line
    }

    /// `2026-11-25 15:00 America/Los_Angeles`.
    static func clock(_ date: Date, _ zone: String?) -> String {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = zone.flatMap(TimeZone.init(identifier:)) ?? TimeZone(identifier: "UTC")
        formatter.dateFormat = "yyyy-MM-dd HH:mm"
        return formatter.string(from: date) + " " + (zone ?? "UTC")
    }

    /// The body: JSON, keys sorted, dates in RFC 3339.
    public func json() -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .iso8601
        return Array((try? encoder.encode(self)) ?? Data("{}".utf8))
    }

    /// `X-AdTally-Signature`: `sha256=` and the hex HMAC-SHA256 of the body under the webhook's secret.
    public static func signature(body: [UInt8], secret: String) -> String {
        "sha256=" + SHA256.hmac(key: Array(secret.utf8), message: body).hexString
    }
}
