import Foundation

/// How a policy picks the network an app shows (DESIGN §9).
public enum MediationRule: String, Sendable, Codable, CaseIterable {
    /// Always one network.
    case pinned
    /// A fixed split: each app launch gets a network drawn by weight.
    case weighted
    /// The highest expected revenue per request (fill × eCPM) over a trailing window.
    case automatic
}

/// What an automatic policy ranks networks by (DESIGN §9, §3).
public enum MediationRank: String, Sendable, Codable, CaseIterable {
    /// Expected revenue per 1000 requests: fill × eCPM (`rpm`), over a window of hours.
    case rpm
    /// Revenue per daily ad viewer of the network (`arpdav`: its revenue over the device-days
    /// of the devices that saw its ads), over a window of whole UTC days. Not `arpdau`: by
    /// network, DAU is the app's (DESIGN §3), so a network's ARPDAU is its revenue over one
    /// denominator shared by all, and ranking by it would rank by revenue, which the network
    /// served most always wins; per request (RPM) or per viewer (ARPDAV) compares them.
    case arpdav
}

/// Which requests a policy answers: an app, and optionally one placement and/or one
/// country of it (nil: every one). The most specific policy that matches wins.
public struct MediationScope: Sendable, Hashable {
    /// The app.
    public var app: String
    /// One placement, or nil for every placement.
    public var placement: String?
    /// One country (ISO 3166-1 alpha-2), or nil for every country.
    public var country: String?
    /// An experiment's arm (DESIGN §14): the policy its devices are answered with; nil for
    /// the placement's own policy. Arms are set and removed by experiments only.
    public var arm: ExperimentArm?

    /// A scope.
    public init(app: String, placement: String? = nil, country: String? = nil, arm: ExperimentArm? = nil) {
        self.app = app
        self.placement = placement
        self.country = country
        self.arm = arm
    }

    /// The scopes a request for (placement, country) may be answered by, most specific
    /// first: both, the placement's, the country's, the app's.
    public static func candidates(app: String, placement: String?, country: String?) -> [MediationScope] {
        var scopes: [MediationScope] = []
        for p in placement == nil ? [nil] : [placement, nil] {
            for c in country == nil ? [nil] : [country, nil] {
                scopes.append(MediationScope(app: app, placement: p, country: c))
            }
        }
        return scopes
    }

    /// The scope with its placement and country checked as events check theirs (the
    /// country upper-cased), else the field that breaks its rule.
    public func validated() throws(FieldError) -> MediationScope {
        var scope = self
        if let placement {
            guard EventValidator.isPlacement(placement) else { throw FieldError("placement", "must be 1 to 64 characters, without NUL") }
        }
        if let country {
            guard let code = EventValidator.countryCode(country) else { throw FieldError("country", "must be an ISO 3166-1 alpha-2 code (ZZ for unknown)") }
            scope.country = code
        }
        return scope
    }

    /// "placement=home country=JP", "" for the whole app.
    public var qualifiers: String {
        [placement.map { "placement=\($0)" }, country.map { "country=\($0)" }, arm.map { "arm=\($0.rawValue)" }].compactMap { $0 }.joined(separator: " ")
    }

    /// "my-app", "my-app placement=home country=JP".
    public var description: String { qualifiers.isEmpty ? app : "\(app) \(qualifiers)" }
}

/// A mediation policy: the rule and its parameters for one scope.
public struct MediationPolicy: Sendable, Equatable, Codable {
    /// Which requests it answers.
    public var scope: MediationScope
    /// How it picks.
    public var rule: MediationRule
    /// `pinned`: the network.
    public var network: String?
    /// `weighted`: network → weight (positive integers; the split is weight / sum).
    public var weights: [String: Int]?
    /// `automatic`: the networks it may choose; empty: any the app reports in the window.
    public var networks: [String]
    /// `automatic`: the network served while no network has enough data and none was chosen before.
    public var defaultNetwork: String?
    /// `automatic`: the trailing window, in hours (from the start of the hour this many hours ago to now).
    public var windowHours: Int
    /// `automatic`: requests a network needs in the window before its numbers are trusted.
    public var minRequests: Int64
    /// `automatic`: the fraction by which a challenger must beat the incumbent's expected revenue.
    public var hysteresis: Double
    /// `automatic`: what networks are ranked by.
    public var rankBy: MediationRank
    /// Seconds an app may keep the answer (`Cache-Control: max-age`).
    public var maxAgeSeconds: Int
    /// When it was last set (nil before it is stored).
    public var updatedAt: Date?

    /// Defaults of the optional parameters.
    public static let defaultWindowHours = 24, defaultMinRequests: Int64 = 1000, defaultHysteresis = 0.1, defaultMaxAgeSeconds = 300
    /// Most networks a policy may name, and the bounds of its numbers.
    public static let maxNetworks = 50, maxWindowHours = 168, maxWeight = 1_000_000

    /// A policy; `validated()` checks it.
    public init(
        scope: MediationScope, rule: MediationRule, network: String? = nil, weights: [String: Int]? = nil, networks: [String] = [],
        defaultNetwork: String? = nil, windowHours: Int = defaultWindowHours, minRequests: Int64 = defaultMinRequests,
        hysteresis: Double = defaultHysteresis, rankBy: MediationRank = .rpm, maxAgeSeconds: Int = defaultMaxAgeSeconds, updatedAt: Date? = nil
    ) {
        self.rankBy = rankBy
        self.scope = scope
        self.rule = rule
        self.network = network
        self.weights = weights
        self.networks = networks
        self.defaultNetwork = defaultNetwork
        self.windowHours = windowHours
        self.minRequests = minRequests
        self.hysteresis = hysteresis
        self.maxAgeSeconds = maxAgeSeconds
        self.updatedAt = updatedAt
    }

    /// The policy if every field keeps its rule (placement and country checked as
    /// events check them; networks named as events name them), else the first broken one.
    public func validated() throws(FieldError) -> MediationPolicy {
        var policy = self
        policy.scope = try scope.validated()
        func checkNetwork(_ name: String, _ field: String) throws(FieldError) {
            guard EventValidator.isNetworkName(name) else { throw .init(field, "\"\(name)\" is not a network name ([a-z0-9_.-], 1 to 32 characters)") }
        }
        func refuse(_ present: Bool, _ field: String, _ rules: String) throws(FieldError) {
            if present { throw .init(field, "only for rule \(rules)") }
        }
        switch rule {
        case .pinned:
            guard let network else { throw .init("network", "is required for rule pinned") }
            try checkNetwork(network, "network")
        case .weighted:
            guard let weights, !weights.isEmpty else { throw .init("weights", "is required for rule weighted: {\"network\": weight, …}") }
            guard weights.count <= Self.maxNetworks else { throw .init("weights", "at most \(Self.maxNetworks) networks") }
            for (name, weight) in weights.sorted(by: { $0.key < $1.key }) {
                try checkNetwork(name, "weights")
                guard (0...Self.maxWeight).contains(weight) else { throw .init("weights.\(name)", "must be a whole number from 0 to \(Self.maxWeight)") }
            }
            guard weights.values.contains(where: { $0 > 0 }) else { throw .init("weights", "at least one weight must be above 0") }
        case .automatic:
            guard networks.count <= Self.maxNetworks else { throw .init("networks", "at most \(Self.maxNetworks) networks") }
            for name in networks { try checkNetwork(name, "networks") }
            guard Set(networks).count == networks.count else { throw .init("networks", "names a network twice") }
            guard let defaultNetwork else { throw .init("default", "is required for rule automatic (served until a network has enough data)") }
            try checkNetwork(defaultNetwork, "default")
            guard networks.isEmpty || networks.contains(defaultNetwork) else { throw .init("default", "must be one of networks") }
        }
        try refuse(network != nil && rule != .pinned, "network", "pinned")
        try refuse(weights != nil && rule != .weighted, "weights", "weighted")
        try refuse(!networks.isEmpty && rule != .automatic, "networks", "automatic")
        try refuse(defaultNetwork != nil && rule != .automatic, "default", "automatic")
        try refuse(rankBy != .rpm && rule != .automatic, "rank_by", "automatic")
        if rankBy == .arpdav, windowHours % 24 != 0 {
            throw .init("window_hours", "must be whole days (24, 48 … 168) with rank_by arpdav: DAV is counted per day")
        }
        guard (1...Self.maxWindowHours).contains(windowHours) else { throw .init("window_hours", "must be a whole number from 1 to \(Self.maxWindowHours)") }
        guard (1...1_000_000_000).contains(minRequests) else { throw .init("min_requests", "must be a whole number from 1 to 1000000000") }
        guard hysteresis.isFinite, (0...10).contains(hysteresis) else { throw .init("hysteresis", "must be a fraction from 0 to 10 (0.1: a challenger must be 10% better)") }
        guard (0...86_400).contains(maxAgeSeconds) else { throw .init("max_age_seconds", "must be a whole number from 0 to 86400") }
        return policy
    }

    /// The networks a weighted policy draws from, with their share (weight / sum), by name.
    public var shares: [(network: String, share: Double)] {
        let weights = (weights ?? [:]).filter { $0.value > 0 }
        let total = Double(weights.values.reduce(0, +))
        return weights.sorted { $0.key < $1.key }.map { ($0.key, Double($0.value) / total) }
    }

    /// One line for history and the CLI: "automatic over admob, iad (24 h window, ≥ 1000 requests, 10% hysteresis, default admob)".
    public var summary: String {
        let text: String
        switch rule {
        case .pinned:
            text = "pinned to \(network ?? "?")"
        case .weighted:
            text = "weighted " + (weights ?? [:]).sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
        case .automatic:
            let over = networks.isEmpty ? "any network" : networks.joined(separator: ", ")
            let window = rankBy == .arpdav ? "ARPDAV over \(windowHours / 24) d" : "\(windowHours) h window"
            text = "automatic over \(over) (\(window), ≥ \(minRequests) requests, \(Self.percent(hysteresis)) hysteresis, default \(defaultNetwork ?? "?"))"
        }
        return maxAgeSeconds == Self.defaultMaxAgeSeconds ? text : text + ", max-age \(maxAgeSeconds) s"
    }

    /// 0.1 as "10%".
    static func percent(_ fraction: Double) -> String {
        let value = (fraction * 1000).rounded() / 10
        return value == value.rounded() ? "\(Int(value))%" : "\(value)%"
    }

    enum CodingKeys: String, CodingKey {
        case app, placement, country, rule, network, weights, networks
        case defaultNetwork = "default"
        case windowHours = "window_hours", minRequests = "min_requests", hysteresis, rankBy = "rank_by"
        case maxAgeSeconds = "max_age_seconds", updatedAt = "updated_at"
    }

    /// Decodes the API's flat object; absent parameters take their defaults (the app
    /// may be left out where the path names it; `updated_at`, as GET shows it, is ignored).
    public init(from decoder: any Decoder) throws {
        // A misspelt field would otherwise leave its default in place without a word.
        for key in try decoder.container(keyedBy: AnyCodingKey.self).allKeys where CodingKeys(stringValue: key.stringValue) == nil {
            throw FieldError(key.stringValue, "is not a policy field; the fields are app, placement, country, rule, network, weights, networks, default, window_hours, min_requests, hysteresis, rank_by, max_age_seconds")
        }
        let container = try decoder.container(keyedBy: CodingKeys.self)
        scope = MediationScope(
            app: try container.decodeIfPresent(String.self, forKey: .app) ?? "", placement: try container.decodeIfPresent(String.self, forKey: .placement),
            country: try container.decodeIfPresent(String.self, forKey: .country)
        )
        let ruleText = try container.decode(String.self, forKey: .rule)
        guard let rule = MediationRule(rawValue: ruleText) else {
            throw FieldError("rule", "must be pinned, weighted or automatic")
        }
        self.rule = rule
        network = try container.decodeIfPresent(String.self, forKey: .network)
        // Whole numbers are read as numbers and then checked, so that 1.5 or 1e20 is
        // refused naming its field (the decoder's own error names none).
        func whole(_ value: Double, _ field: String) throws -> Int {
            guard abs(value) <= 9_007_199_254_740_992, let number = Int(exactly: value) else { throw FieldError(field, "must be a whole number") }
            return number
        }
        func whole(_ key: CodingKeys) throws -> Int? {
            try container.decodeIfPresent(Double.self, forKey: key).map { try whole($0, key.stringValue) }
        }
        weights = try container.decodeIfPresent([String: Double].self, forKey: .weights).map { weights in
            try Dictionary(uniqueKeysWithValues: weights.map { ($0.key, try whole($0.value, "weights.\($0.key)")) })
        }
        networks = try container.decodeIfPresent([String].self, forKey: .networks) ?? []
        defaultNetwork = try container.decodeIfPresent(String.self, forKey: .defaultNetwork)
        windowHours = try whole(.windowHours) ?? Self.defaultWindowHours
        minRequests = try whole(.minRequests).map(Int64.init) ?? Self.defaultMinRequests
        hysteresis = try container.decodeIfPresent(Double.self, forKey: .hysteresis) ?? Self.defaultHysteresis
        let rankText = try container.decodeIfPresent(String.self, forKey: .rankBy) ?? MediationRank.rpm.rawValue
        guard let rankBy = MediationRank(rawValue: rankText) else {
            throw FieldError("rank_by", rankText == "arpdau"
                ? "must be rpm or arpdav: by network DAU is the app's, so ARPDAU would rank networks by their revenue (the one served most always wins); arpdav ranks by revenue per daily ad viewer of each network"
                : "must be rpm or arpdav")
        }
        self.rankBy = rankBy
        maxAgeSeconds = try whole(.maxAgeSeconds) ?? Self.defaultMaxAgeSeconds
        updatedAt = nil
    }

    /// Encodes every field (null where the rule has none).
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(scope.app, forKey: .app)
        try container.encode(scope.placement, forKey: .placement)
        try container.encode(scope.country, forKey: .country)
        try container.encode(rule, forKey: .rule)
        try container.encode(network, forKey: .network)
        try container.encode(weights, forKey: .weights)
        try container.encode(networks, forKey: .networks)
        try container.encode(defaultNetwork, forKey: .defaultNetwork)
        try container.encode(windowHours, forKey: .windowHours)
        try container.encode(minRequests, forKey: .minRequests)
        try container.encode(hysteresis, forKey: .hysteresis)
        try container.encode(rankBy, forKey: .rankBy)
        try container.encode(maxAgeSeconds, forKey: .maxAgeSeconds)
        try container.encode(updatedAt, forKey: .updatedAt)
    }
}

/// Any key of a JSON object, to list them (a decoder that refuses unknown fields).
public struct AnyCodingKey: CodingKey {
    public var stringValue: String
    public var intValue: Int? { nil }
    public init(stringValue: String) { self.stringValue = stringValue }
    public init?(intValue: Int) { nil }
}
