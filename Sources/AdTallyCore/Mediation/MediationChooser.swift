/// One network's numbers in a policy's window, as the report engine summed them.
public struct MediationNetworkStats: Sendable, Equatable {
    /// The network.
    public var network: String
    /// Its counts in the window (revenue in the app's currency).
    public var counts: ReportCounts

    /// Stats.
    public init(network: String, counts: ReportCounts) {
        self.network = network
        self.counts = counts
    }

    /// `fill_rate` (DESIGN §3).
    public var fillRate: MetricValue { ReportMetric.fillRate.value(counts) }
    /// `ecpm` (DESIGN §3).
    public var ecpm: MetricValue { ReportMetric.ecpm.value(counts) }
    /// Expected revenue per 1000 requests: fill × eCPM, which is `rpm` (DESIGN §3),
    /// and 0 for a network with requests but no impression.
    public var expected: MetricValue { ReportMetric.rpm.value(counts) }
    /// `expected` as a number; nil without requests.
    public var expectedNumber: Double? { expected.number }
    /// `arpdav` (DESIGN §3): the network's revenue per daily viewer of its ads.
    public var arpdav: MetricValue { ReportMetric.arpdav.value(counts) }

    /// What a policy ranks by, as a number; nil when undefined (no requests, no viewer).
    func rankValue(_ rank: MediationRank) -> Double? { rank == .rpm ? expectedNumber : arpdav.number }
}

/// What decided a choice.
public enum MediationBasis: String, Sendable, Codable {
    /// A pinned policy.
    case pinned
    /// A weighted policy's split.
    case weighted
    /// The best expected revenue (or ARPDAV) among the networks with enough data.
    case best
    /// The incumbent kept: no challenger beat it by more than the hysteresis.
    case kept
    /// Too little data: the last choice kept.
    case lastChoice = "last_choice"
    /// Too little data and no earlier choice: the policy's default.
    case defaultNetwork = "default"
}

/// A policy's decision: the network to show, the split, and why.
public struct MediationChoice: Sendable {
    /// The network `enable_advertising` names (a weighted policy's heaviest network
    /// here; each answer draws its own).
    public var network: String
    /// Network → share of launches (sums to 1).
    public var weights: [(network: String, share: Double)]
    /// What decided.
    public var basis: MediationBasis
    /// Why, in a sentence with the numbers.
    public var reason: String
}

/// The decision rules of DESIGN §9, with no I/O: given a policy, each network's
/// numbers in its window and the network chosen last (the incumbent), the choice.
public enum MediationChooser {
    /// Decides for `policy`. `stats` may name networks the policy does not allow (they
    /// are ignored); `currency` formats the amounts in the reason. `unreadable` says why
    /// the window's numbers could not be read: then an automatic policy falls back as
    /// it does on thin data.
    public static func choose(
        _ policy: MediationPolicy, stats: [MediationNetworkStats], incumbent: String?, currency: String, unreadable: String? = nil
    ) -> MediationChoice {
        switch policy.rule {
        case .pinned:
            let network = policy.network ?? ""
            return MediationChoice(network: network, weights: [(network, 1)], basis: .pinned, reason: "pinned to \(network) by the policy")
        case .weighted:
            let shares = policy.shares
            let heaviest = shares.max { ($0.share, $1.network) < ($1.share, $0.network) }?.network ?? ""
            let split = shares.map { "\($0.network) \(MediationPolicy.percent($0.share))" }.joined(separator: ", ")
            return MediationChoice(network: heaviest, weights: shares, basis: .weighted, reason: "a fixed split by the policy: \(split) of launches")
        case .automatic:
            return automatic(policy, stats: unreadable == nil ? stats : [], incumbent: incumbent, currency: currency, unreadable: unreadable)
        }
    }

    static func automatic(
        _ policy: MediationPolicy, stats: [MediationNetworkStats], incumbent rawIncumbent: String?, currency: String, unreadable: String?
    ) -> MediationChoice {
        let allowed = policy.networks.isEmpty ? nil : Set(policy.networks)
        // `other` (events of networks the app never admitted, Migrations/0010) is no
        // network an app can show.
        let candidates = stats.filter { $0.network != EventValidator.otherNetwork && (allowed?.contains($0.network) ?? true) }
        let rank = policy.rankBy
        let trusted = candidates.filter { $0.counts.requests >= policy.minRequests && $0.rankValue(rank) != nil }
        let incumbent = rawIncumbent.flatMap { name in allowed == nil || allowed!.contains(name) ? name : nil }
        let window = rank == .arpdav ? "in the last \(policy.windowHours / 24) whole UTC days" : "in the last \(policy.windowHours) h"
        func only(_ network: String, _ basis: MediationBasis, _ reason: String) -> MediationChoice {
            MediationChoice(network: network, weights: [(network, 1)], basis: basis, reason: reason)
        }
        func money(_ value: MetricValue, _ metric: ReportMetric) -> String {
            guard case .micros(let micros, let per) = value else { return "–" }
            return Money.format(micros: micros, per: per, digits: ReportLayout.digits(of: metric, currency: Money.digits(currency))) + " " + currency
        }
        func describe(_ stats: MediationNetworkStats) -> String {
            if rank == .arpdav {
                return "\(stats.network) \(money(stats.arpdav, .arpdav)) per daily ad viewer (\(stats.counts.requests) requests)"
            }
            let fill = stats.fillRate.number.map { MediationPolicy.percent($0) } ?? "–"
            return "\(stats.network) \(money(stats.expected, .rpm)) per 1000 requests (fill \(fill) of \(stats.counts.requests))"
        }
        guard let best = trusted.max(by: { order($0, $1, rank) }) else {
            let thin: String
            if let unreadable {
                thin = "the window's numbers could not be read (\(unreadable))"
            } else if candidates.isEmpty {
                thin = "no allowed network reported a request \(window)"
            } else {
                thin = "no network had \(policy.minRequests) requests \(window) ("
                    + candidates.sorted { $0.counts.requests > $1.counts.requests }.prefix(5).map { "\($0.network) \($0.counts.requests)" }.joined(separator: ", ") + ")"
            }
            if let incumbent { return only(incumbent, .lastChoice, "\(thin): keeping the last choice, \(incumbent)") }
            let fallback = policy.defaultNetwork ?? ""
            return only(fallback, .defaultNetwork, "\(thin) and nothing was chosen before: the policy's default, \(fallback)")
        }
        let measure = rank == .arpdav ? "ARPDAV (revenue per daily ad viewer)" : "expected revenue (fill × eCPM)"
        let bestText = "highest \(measure) \(window) among networks with ≥ \(policy.minRequests) requests: \(describe(best))"
        guard let incumbent, incumbent != best.network else {
            return only(best.network, .best, bestText)
        }
        guard let current = trusted.first(where: { $0.network == incumbent }), let currentValue = current.rankValue(rank) else {
            let had = candidates.first { $0.network == incumbent }?.counts.requests ?? 0
            return only(best.network, .best, "\(bestText); the last choice, \(incumbent), had \(had) requests \(window), too few to keep it")
        }
        let bestValue = best.rankValue(rank) ?? 0
        if bestValue > currentValue * (1 + policy.hysteresis) {
            return only(best.network, .best, "\(bestText); it beats the last choice, \(describe(current)), by more than the \(MediationPolicy.percent(policy.hysteresis)) hysteresis")
        }
        return only(
            incumbent, .kept,
            "keeping \(incumbent): \(describe(best)) does not beat \(describe(current)) by more than the \(MediationPolicy.percent(policy.hysteresis)) hysteresis \(window)"
        )
    }

    /// Ascending order for `max`: the ranked value, then requests, then the name
    /// backwards (so that ties go to the alphabetically first network).
    static func order(_ a: MediationNetworkStats, _ b: MediationNetworkStats, _ rank: MediationRank) -> Bool {
        let (x, y) = (a.rankValue(rank) ?? 0, b.rankValue(rank) ?? 0)
        if x != y { return x < y }
        if a.counts.requests != b.counts.requests { return a.counts.requests < b.counts.requests }
        return a.network > b.network
    }
}
