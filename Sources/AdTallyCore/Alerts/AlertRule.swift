import Foundation

/// When a rule breaks (DESIGN §12).
public enum AlertCondition: String, Sendable, CaseIterable, Codable {
    /// The metric is below the threshold.
    case below
    /// The metric is above the threshold.
    case above
    /// The metric changed by less than the threshold (a fraction: -0.3 is -30 %) against its baseline.
    case changeBelow = "change_below"
    /// The metric changed by more than the threshold against its baseline.
    case changeAbove = "change_above"

    /// Whether it compares with a baseline.
    public var isChange: Bool { self == .changeBelow || self == .changeAbove }

    /// The comparison as a reader sees it: `< 0.5`, `change < -30 %`.
    public func describe(_ threshold: Double) -> String {
        switch self {
        case .below: "< \(AlertRule.text(threshold))"
        case .above: "> \(AlertRule.text(threshold))"
        case .changeBelow: "change < \(AlertRule.percent(threshold))"
        case .changeAbove: "change > \(AlertRule.percent(threshold))"
        }
    }
}

/// A rule: one report metric of each of its apps, watched over a window of whole hours
/// (DESIGN §12, Migrations/0018).
public struct AlertRule: Sendable, Equatable, Encodable {
    /// `[a-z0-9][a-z0-9_-]{0,63}`.
    public var name: String
    /// The apps it watches, each on its own.
    public var apps: [String]
    /// A metric of DESIGN §3 that hours can be summed into.
    public var metric: ReportMetric
    /// Report filters, as report parameters: `["network": "admob"]`.
    public var filters: [String: String]
    public var condition: AlertCondition
    /// The metric's value (money in the app's currency), or for a change a fraction.
    public var threshold: Double
    /// The window: this many minutes of whole hours (a multiple of 60), ending where the last whole hour ends.
    public var windowMinutes: Int
    /// Below this many requests in the window (and, for a change, in each baseline week
    /// it counts) the rule neither fires nor resolves.
    public var minRequests: Int64
    /// How often it is evaluated.
    public var everySeconds: Int = 60
    /// While firing, notified again this often (0: never).
    public var renotifyMinutes: Int = 720
    /// Where notifications are sent (a POST of JSON).
    public var webhook: String
    public var isPaused = false
    public var createdAt: Date?
    public var updatedAt: Date?

    public init(
        name: String, apps: [String], metric: ReportMetric, filters: [String: String] = [:], condition: AlertCondition, threshold: Double,
        windowMinutes: Int, minRequests: Int64 = 0, webhook: String
    ) {
        self.name = name
        self.apps = apps
        self.metric = metric
        self.filters = filters
        self.condition = condition
        self.threshold = threshold
        self.windowMinutes = windowMinutes
        self.minRequests = minRequests
        self.webhook = webhook
    }

    enum CodingKeys: String, CodingKey {
        case name, apps, metric, filters, condition, threshold, webhook
        case windowMinutes = "window_minutes", minRequests = "min_requests", everySeconds = "every_seconds"
        case renotifyMinutes = "renotify_minutes", isPaused = "paused", createdAt = "created_at", updatedAt = "updated_at"
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(name, forKey: .name)
        try container.encode(apps, forKey: .apps)
        try container.encode(metric.rawValue, forKey: .metric)
        try container.encode(filters, forKey: .filters)
        try container.encode(condition, forKey: .condition)
        try container.encode(threshold, forKey: .threshold)
        try container.encode(windowMinutes, forKey: .windowMinutes)
        try container.encode(minRequests, forKey: .minRequests)
        try container.encode(everySeconds, forKey: .everySeconds)
        try container.encode(renotifyMinutes, forKey: .renotifyMinutes)
        try container.encode(webhook, forKey: .webhook)
        try container.encode(isPaused, forKey: .isPaused)
        try container.encodeIfPresent(createdAt, forKey: .createdAt)
        try container.encodeIfPresent(updatedAt, forKey: .updatedAt)
    }

    /// Why a metric cannot be watched by the hour, or nil when it can. A window is summed
    /// from the report's hours: devices counted per hour (or per day) do not add up.
    public static func unwatchable(_ metric: ReportMetric) -> String? {
        if metric == .revenueSource { return "revenue_source is a word, not a number" }
        if metric.isAudience || metric == .uniqueDevices {
            return "\(metric.rawValue) counts devices, which hours do not add up to; watch requests, fill, taps, revenue or their rates"
        }
        return nil
    }

    /// Checks what an admin gives (a 400 naming the field otherwise). The filters are
    /// checked by the report engine's own parser when the rule is saved.
    public func validate() throws(FieldError) {
        // `history` is the path of every rule's history (GET /v1/alerts/history).
        guard name != "history" else { throw FieldError("name", "history is taken by GET /v1/alerts/history; choose another name") }
        guard FieldError.isName(name) else { throw FieldError("name", FieldError.nameRule) }
        guard (1...100).contains(apps.count), Set(apps).count == apps.count else { throw FieldError("apps", "must name 1 to 100 different apps") }
        if let why = Self.unwatchable(metric) { throw FieldError("metric", why) }
        guard threshold.isFinite, abs(threshold) < 1e15 else { throw FieldError("threshold", "must be a finite number") }
        if condition.isChange {
            guard threshold > -1 || condition == .changeAbove else {
                throw FieldError("threshold", "a change below must be more than -100 % (-1): nothing falls further")
            }
        }
        guard windowMinutes % 60 == 0, (60...10_080).contains(windowMinutes) else {
            throw FieldError("window_minutes", "must be whole hours (a multiple of 60) from 60 to 10080 (a week): reports count by the hour")
        }
        guard minRequests >= 0 else { throw FieldError("min_requests", "must be 0 or more") }
        guard (60...86_400).contains(everySeconds) else { throw FieldError("every_seconds", "must be from 60 to 86400") }
        guard (0...43_200).contains(renotifyMinutes) else { throw FieldError("renotify_minutes", "must be from 0 (never) to 43200 (30 days)") }
        try FieldError.checkURL(webhook, field: "webhook")
        for key in filters.keys {
            guard let dimension = ReportDimension(rawValue: key), !dimension.isTime else {
                throw FieldError("filters", "\(key) is not a dimension a rule can filter on (network, format, placement, country, …)")
            }
        }
    }

    /// The metric's value as the rule compares it: money in currency units, rates as fractions.
    public func value(_ counts: ReportCounts) -> Double? {
        guard let number = metric.value(counts).number, number.isFinite else { return nil }
        return metric.isMoney ? number / 1_000_000 : number
    }

    /// Whether the metric is a sum (a count or an amount), which grows with the window's
    /// length, rather than a rate.
    public var isAdditive: Bool {
        switch metric.formula {
        case .count, .money: true
        default: false
        }
    }

    /// Whether `value` (and for a change, `baseline`) breaks the rule; nil when it cannot be told.
    public func isBroken(value: Double, baseline: Double?) -> Bool? {
        switch condition {
        case .below: return value < threshold
        case .above: return value > threshold
        case .changeBelow, .changeAbove:
            guard let change = Self.change(value: value, baseline: baseline) else { return nil }
            return condition == .changeBelow ? change < threshold : change > threshold
        }
    }

    /// The relative change from `baseline` to `value`; nil without a baseline, or when it is 0.
    public static func change(value: Double, baseline: Double?) -> Double? {
        guard let baseline, baseline != 0 else { return nil }
        return (value - baseline) / abs(baseline)
    }

    /// A number as a rule's text shows it: up to 6 decimals, no trailing zeros.
    public static func text(_ value: Double) -> String {
        var text = String(format: "%.6f", value)
        while text.hasSuffix("0") { text.removeLast() }
        if text.hasSuffix(".") { text.removeLast() }
        return text == "-0" ? "0" : text
    }

    /// A fraction as a percentage: -0.3 is `-30 %`.
    public static func percent(_ fraction: Double) -> String {
        (fraction > 0 ? "+" : "") + text(fraction * 100) + " %"
    }

    /// Parses `-30%`, `-30 %` or `-0.3` (a fraction when there is no percent sign).
    public static func parseChange(_ text: String) -> Double? {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        if trimmed.hasSuffix("%") {
            return Double(trimmed.dropLast().trimmingCharacters(in: .whitespaces)).map { $0 / 100 }
        }
        return Double(trimmed)
    }
}

/// What one evaluation of a rule for an app found.
public struct AlertReading: Sendable, Equatable {
    /// The window, `[from, to)`.
    public var windowFrom: Date
    public var windowTo: Date
    /// Requests in the window.
    public var requests: Int64
    /// The metric in the window; nil when it has no value (no requests for a rate).
    public var value: Double?
    /// For a change rule: the mean of the metric over the baseline weeks that had the minimum volume.
    public var baseline: Double?
    /// Why nothing can be decided, or nil.
    public var note: String?

    public init(windowFrom: Date, windowTo: Date, requests: Int64, value: Double?, baseline: Double? = nil, note: String? = nil) {
        self.windowFrom = windowFrom
        self.windowTo = windowTo
        self.requests = requests
        self.value = value
        self.baseline = baseline
        self.note = note
    }
}

/// A rule's state for an app.
public enum AlertState: String, Sendable, Codable {
    case ok, firing, resolved
}

/// What an evaluation does to a rule's state (DESIGN §12): ok → firing → resolved →
/// firing …; while firing, a re-notification every `renotifyMinutes`.
public enum AlertTransition: String, Sendable, Equatable, CaseIterable {
    case firing, resolved, renotify

    /// The transition a reading causes from `state` (notified last at `notifiedAt`), or
    /// nil: none (also when the reading decides nothing: thin volume, no value, no baseline).
    public static func next(
        rule: AlertRule, state: AlertState, notifiedAt: Date?, reading: AlertReading, now: Date
    ) -> AlertTransition? {
        guard reading.note == nil, let value = reading.value, let broken = rule.isBroken(value: value, baseline: reading.baseline) else { return nil }
        switch (state, broken) {
        case (.firing, false): return .resolved
        case (.firing, true):
            guard rule.renotifyMinutes > 0 else { return nil }
            let due = (notifiedAt ?? .distantPast).addingTimeInterval(TimeInterval(rule.renotifyMinutes * 60))
            return now >= due ? .renotify : nil
        case (_, true): return .firing
        case (_, false): return nil
        }
    }
}
