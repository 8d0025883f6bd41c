import Foundation

/// The body of `GET /v1/apps/{app}/mediation`, but for `enable_advertising`: the
/// weights, the window, each network's numbers in it, the rule and why. Stored as
/// JSON text with the decision (every server serves the same bytes) and put behind
/// `{"enable_advertising": …,` when served, so that the key apps already parse comes first.
public struct MediationAnswer: Sendable, Encodable {
    /// One network's line.
    public struct NetworkLine: Sendable, Encodable {
        var network: String
        var requests: Int64
        var impressions: Int64
        var fillRate: Double?
        var ecpm: String?
        var rpm: String?
        /// Shown (null when no device saw its ads) when the policy ranks by ARPDAV.
        var arpdav: String?
        var showsARPDAV = false
        var revenue: String
        var isTrusted: Bool

        enum CodingKeys: String, CodingKey {
            case network, requests, impressions, fillRate = "fill_rate", ecpm, rpm, arpdav, revenue, isTrusted = "trusted"
        }

        public func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(network, forKey: .network)
            try container.encode(requests, forKey: .requests)
            try container.encode(impressions, forKey: .impressions)
            try container.encode(fillRate, forKey: .fillRate)
            try container.encode(ecpm, forKey: .ecpm)
            try container.encode(rpm, forKey: .rpm)
            if showsARPDAV { try container.encode(arpdav, forKey: .arpdav) }
            try container.encode(revenue, forKey: .revenue)
            try container.encode(isTrusted, forKey: .isTrusted)
        }
    }

    /// The metric window.
    public struct Window: Sendable, Encodable {
        var hours: Int
        var from: String
        var to: String
        var currency: String
        var minRequests: Int64

        enum CodingKeys: String, CodingKey {
            case hours, from, to, currency, minRequests = "min_requests"
        }
    }

    var weights: [String: Double]
    var rule: MediationRule
    var decidedBy: MediationBasis
    var reason: String
    var policy: MediationPolicy
    var window: Window
    var networks: [NetworkLine]
    var chosenSince: String
    var decidedAt: String

    enum CodingKeys: String, CodingKey {
        case weights, rule, decidedBy = "decided_by", reason, policy, window, networks, chosenSince = "chosen_since", decidedAt = "decided_at"
    }

    /// The most network lines an answer lists (apps read it at every launch).
    public static let maxLines = 64
    /// The most bytes of an answer's JSON: lines past it are left out (the policy's
    /// own networks and the trusted ones first), so no traffic can grow the file.
    public static let maxBytes = 32 << 10

    /// The answer for a choice. `stats` are the window's numbers (the policy's
    /// networks without any get zero lines); amounts in `currency`. Lines are the
    /// policy's candidates only: the networks it names, else those with at least
    /// `min_requests` in the window, at most `maxLines` of them.
    public init(
        policy: MediationPolicy, choice: MediationChoice, stats: [MediationNetworkStats], windowFrom: Date, windowTo: Date, currency: String,
        chosenSince: Date, decidedAt: Date
    ) {
        var byNetwork = Dictionary(stats.map { ($0.network, $0) }, uniquingKeysWith: { a, _ in a })
        for name in policy.named where byNetwork[name] == nil { byNetwork[name] = MediationNetworkStats(network: name, counts: ReportCounts()) }
        let digits = Money.digits(currency)
        func money(_ value: MetricValue, _ metric: ReportMetric = .revenue) -> String? {
            guard case .micros(let micros, let per) = value else { return nil }
            return Money.format(micros: micros, per: per, digits: ReportLayout.digits(of: metric, currency: digits))
        }
        let named = Set(policy.named)
        let candidates = byNetwork.values.filter { line in
            line.network != EventValidator.otherNetwork && (named.contains(line.network) || policy.named.isEmpty || policy.rule == .automatic && policy.networks.isEmpty)
                && (named.contains(line.network) || line.counts.requests >= policy.minRequests)
        }
        networks = candidates.sorted { MediationChooser.order($1, $0, policy.rankBy) }.prefix(Self.maxLines).map { line in
            NetworkLine(
                network: line.network, requests: line.counts.requests, impressions: line.counts.impressions, fillRate: line.fillRate.number,
                ecpm: money(line.ecpm), rpm: money(line.expected),
                arpdav: money(line.arpdav, .arpdav), showsARPDAV: policy.rankBy == .arpdav,
                revenue: money(ReportMetric.revenue.value(line.counts)) ?? "0",
                isTrusted: line.counts.requests >= policy.minRequests
            )
        }
        weights = Dictionary(choice.weights.map { ($0.network, $0.share) }, uniquingKeysWith: +)
        rule = policy.rule
        decidedBy = choice.basis
        reason = choice.reason
        self.policy = policy
        window = Window(hours: policy.windowHours, from: Self.text(windowFrom), to: Self.text(windowTo), currency: currency, minRequests: policy.minRequests)
        self.chosenSince = Self.text(chosenSince)
        self.decidedAt = Self.text(decidedAt)
    }

    /// The answer as stored: a JSON object with sorted keys, at most `maxBytes` (lines
    /// dropped from the end of the list until it fits).
    public func json() -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .iso8601
        var answer = self
        while true {
            // Every field encodes (strings, numbers, optionals): this cannot fail.
            let data = try! encoder.encode(answer)
            if data.count <= Self.maxBytes || answer.networks.isEmpty { return String(decoding: data, as: UTF8.self) }
            answer.networks.removeLast(max(1, answer.networks.count / 4))
        }
    }

    /// The served body: `{"enable_advertising": network,` and then the stored answer's fields.
    public static func body(network: String, answer: String) -> [UInt8] {
        head(network: network, answer: answer) + sharedPart(answer: answer)
    }

    /// The start of a served body, all that differs between the networks of a split:
    /// `{"enable_advertising": network` and the comma before the answer's fields.
    public static func head(network: String, answer: String) -> [UInt8] {
        var out: [UInt8] = Array(#"{"enable_advertising":"#.utf8)
        ReportText.appendJSONString(network, to: &out)
        if answer.utf8.dropFirst().first != UInt8(ascii: "}") { out.append(UInt8(ascii: ",")) }
        return out
    }

    /// The rest of a served body: the stored answer's fields and its closing brace.
    public static func sharedPart(answer: String) -> [UInt8] {
        Array(answer.utf8.dropFirst())
    }

    /// An instant as RFC 3339 in UTC, to the second.
    static func text(_ date: Date) -> String {
        date.formatted(.iso8601)
    }
}

extension MediationPolicy {
    /// Every network the policy names.
    public var named: [String] {
        switch rule {
        case .pinned: [network].compactMap { $0 }
        case .weighted: (weights ?? [:]).keys.sorted()
        case .automatic: networks + [defaultNetwork].compactMap { $0 }
        }
    }
}
