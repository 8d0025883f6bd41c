import AdTallyCore
import Foundation
import Logging
import Metrics
import NIOCore
import PostgresKit
import Synchronization
import TextFormats

/// A decision ready to serve: the bytes of each answer it may give and their ETags.
public struct ServedMediation: Sendable {
    /// One answer: the network `enable_advertising` names and its body.
    public struct Variant: Sendable {
        /// The network.
        public var network: String
        /// Its share of answers (1 but for a weighted policy).
        public var share: Double
        /// The body, built once per refresh: `head` and then `rest`, which every variant of
        /// a weighted split shares (one copy of the numbers, however many networks it
        /// draws); a response shares both, nothing is copied per request.
        public var head: ByteBuffer
        /// The part of the body after `head` (empty when `head` is all of it).
        public var rest: ByteBuffer
        /// The body's bytes, for callers that want them in one piece.
        public var body: ByteBuffer {
            var whole = head
            var tail = rest
            whole.writeBuffer(&tail)
            return whole
        }
        /// Its entity tag, quoted.
        public var etag: String
    }

    /// The policy's scope.
    public var scope: MediationScope
    /// `Cache-Control: max-age`.
    public var maxAgeSeconds: Int
    /// One answer per network a weighted policy draws, else the one chosen.
    public var variants: [Variant]

    /// The decision stored for a policy, nil before there is one. The networks drawn
    /// and their shares come from the stored answer's own `weights` (so the draw and
    /// the body always agree, even when the policy changed after it was decided).
    ///
    /// The entity tag is weak and covers what an app acts on — the network, the split,
    /// the policy's version and since when the network is served — not the numbers,
    /// which change at every refresh: a client revalidating gets 304 for as long as
    /// its network stands (and a device keeps its side of a weighted split).
    init?(_ stored: StoredMediationPolicy) {
        guard let decision = stored.decision, let chosen = stored.chosen,
              let answer = try? JSONSerialization.jsonObject(with: Data(decision.utf8)) as? [String: Any],
              let weights = answer["weights"] as? [String: Double]
        else { return nil }
        scope = stored.policy.scope
        maxAgeSeconds = stored.policy.maxAgeSeconds
        let split = weights.filter { $0.value > 0 }.sorted { $0.key < $1.key }
        let shares = split.count > 1 ? split.map { ($0.key, $0.value) } : [(chosen, 1.0)]
        let version = "\(stored.policy.updatedAt?.timeIntervalSince1970 ?? 0) \(stored.chosenSince?.timeIntervalSince1970 ?? 0) "
            + split.map { "\($0.key)=\($0.value)" }.joined(separator: ",")
        let etag = { (network: String) in "W/\"" + String(SHA256.hex("\(network) \(version)").prefix(32)) + "\"" }
        if shares.count == 1 {
            let (network, share) = shares[0]
            variants = [Variant(network: network, share: share, head: ByteBuffer(bytes: MediationAnswer.body(network: network, answer: decision)), rest: ByteBuffer(), etag: etag(network))]
        } else {
            let rest = ByteBuffer(bytes: MediationAnswer.sharedPart(answer: decision))
            variants = shares.map { network, share in
                Variant(network: network, share: share, head: ByteBuffer(bytes: MediationAnswer.head(network: network, answer: decision)), rest: rest, etag: etag(network))
            }
        }
    }

    /// The answer a client already holds, by one of the entity tags of `If-None-Match`
    /// (compared weakly, as RFC 9110 has it for If-None-Match; or `*`): it keeps it.
    public func variant(matching ifNoneMatch: String) -> Variant? {
        func opaque(_ tag: some StringProtocol) -> Substring {
            let trimmed = Substring(tag).trimmingCharacters(in: .whitespaces)
            return Substring(trimmed.hasPrefix("W/") ? String(trimmed.dropFirst(2)) : trimmed)
        }
        let tags = ifNoneMatch.split(separator: ",", maxSplits: 64).prefix(64).map(opaque)
        if tags.contains("*") { return variants.first }
        return variants.first { tags.contains(opaque($0.etag)) }
    }

    /// An answer drawn by share (the only one unless the policy is weighted).
    public func draw<G: RandomNumberGenerator>(using generator: inout G) -> Variant {
        variant(at: Double.random(in: 0..<1, using: &generator))
    }

    /// The answer at a point in 0..<1 of the shares laid end to end, in network order.
    public func variant(at point: Double) -> Variant {
        // `init?` makes at least one variant.
        guard variants.count > 1 else { return variants[0] }
        var point = point
        for variant in variants {
            point -= variant.share
            if point < 0 { return variant }
        }
        return variants[variants.count - 1]
    }
}

/// Keeps every policy's decision fresh and in memory, so that `GET
/// /v1/apps/{app}/mediation` is answered without the database or the report engine.
///
/// Each pass reads the policies with their stored decisions; a decision older than
/// the interval (or one of a policy changed since) is computed again: the policy's
/// window through the report engine, the choice by `MediationChooser` against the
/// network stored as chosen, stored under the row's lock (another server may decide
/// at the same moment; hysteresis compares with whatever was stored last). Then the
/// served set is rebuilt from what is stored, so every server serves the same bytes.
/// When a pass fails (the database unreachable) the last served set stays; when one
/// policy's numbers fail (a missing FX rate) its last decision stays.
public final class MediationRefresher: Sendable {
    /// How often decisions are recomputed, and who this server is in the history.
    public struct Configuration: Sendable {
        /// A decision older than this is computed again.
        public var interval: Duration = .seconds(60)
        /// This server, as history names who switched.
        public var identity: String

        /// A configuration.
        public init(interval: Duration = .seconds(60), identity: String) {
            self.interval = interval
            self.identity = identity
        }
    }

    /// What is served, per app, and which refresh installed each app's: a refresh
    /// reads an app's policies at its start, so the one that started last wins (a full
    /// pass that read before a policy changed does not undo the change's own refresh).
    private struct Served {
        var decisions: [String: [MediationScope: ServedMediation]] = [:]
        /// Per app and placement, the experiment running there.
        var experiments: [String: [String: ServedExperiment]] = [:]
        var installedBy: [String: Int] = [:]
    }

    /// A running experiment as served: who is in it and each arm's decision.
    public struct ServedExperiment: Sendable {
        /// The experiment (name, salt, share, countries).
        public var experiment: Experiment
        /// Each arm's decision (absent until its first one is stored).
        public var arms: [ExperimentArm: ServedMediation]
    }

    /// A device's answer under an experiment: its arm, and the variant it is answered.
    public struct ExperimentAnswer: Sendable {
        /// The experiment's name.
        public var experiment: String
        /// The device's arm.
        public var arm: ExperimentArm
        /// The answer it gets: its arm's, drawn by the device for a weighted arm (so it gets
        /// the same network every time).
        public var variant: ServedMediation.Variant
    }

    /// What `lookup` found.
    public enum Lookup: Sendable {
        /// No pass has succeeded yet (the server just started, the database is down).
        case notLoaded
        /// The app has no policy that answers the request.
        case noPolicy
        /// The decision to serve.
        case served(ServedMediation)
        /// A device in a running experiment: its arm's decision and its answer.
        case experiment(ServedMediation, ExperimentAnswer)
    }

    let store: MediationStore
    let experiments: ExperimentStore
    /// Where devices' first exposures to experiments are recorded.
    public let exposures: ExposureRecorder
    let engine: ReportEngine
    /// The interval and this server's name.
    public let configuration: Configuration
    /// Where failed decisions are logged.
    public let logger: Logger
    private let served = Mutex<Served?>(nil)
    private let tickets = Atomic<Int>(0)
    private let decisions = Counter(label: "adtally_mediation_decisions_total")
    private let unreadableNumbers = Counter(label: "adtally_mediation_unreadable_numbers_total")

    /// A refresher; nothing is served before the first `refresh`.
    public init(store: MediationStore, engine: ReportEngine, configuration: Configuration, logger: Logger = Logger(label: "adtally.mediation")) {
        self.store = store
        self.experiments = ExperimentStore(pool: store.pool)
        self.exposures = ExposureRecorder(pool: store.pool, logger: logger)
        self.engine = engine
        self.configuration = configuration
        self.logger = logger
    }

    /// The decision that answers a request, most specific scope first; a device (its
    /// per-install id) in an experiment running on the placement (and the country, when it
    /// names countries) gets its arm's, and its first exposure is recorded.
    public func lookup(app: String, placement: String?, country: String?, device: String? = nil) -> Lookup {
        // One read of the served set: the experiment on the placement (hashed outside the
        // lock), or the decision of the most specific scope.
        let found: (experiment: ServedExperiment?, lookup: Lookup) = served.withLock { served in
            guard let served else { return (nil, .notLoaded) }
            if device != nil, let placement, let running = served.experiments[app]?[placement] {
                // Served only once both arms are decided: one arm alone would take its devices
                // in while the other's got the placement's policy, unrecorded.
                if running.arms.count == ExperimentArm.allCases.count,
                   running.experiment.countries.isEmpty || country.map(running.experiment.countries.contains) == true {
                    return (running, .noPolicy)
                }
            }
            guard let decisions = served.decisions[app] else { return (nil, .noPolicy) }
            for scope in MediationScope.candidates(app: app, placement: placement, country: country) {
                if let decision = decisions[scope] { return (nil, .served(decision)) }
            }
            return (nil, .noPolicy)
        }
        guard let device, let running = found.experiment else { return found.lookup }
        let experiment = running.experiment
        let (arm, point) = ExperimentArm.place(salt: experiment.salt, device: device, treatmentShare: experiment.treatmentShare)
        let decision = running.arms[arm]!
        let variant = decision.variant(at: point)
        exposures.note(app: app, experiment: experiment.name, device: device, arm: arm)
        return .experiment(decision, ExperimentAnswer(experiment: experiment.name, arm: arm, variant: variant))
    }

    /// Whether a pass over every app has succeeded.
    public var isLoaded: Bool { served.withLock { $0 != nil } }

    /// One pass over every policy (one app's, when given; `force`: recompute them even
    /// if fresh). Throws when the database cannot be reached; the served set then
    /// stays. A policy whose numbers fail otherwise falls back (`decide`); one whose
    /// decision cannot be stored keeps its last. `now` is for tests (default: the
    /// clock, read per policy). Returns the policies read, with their decisions as stored.
    @discardableResult
    public func refresh(app: String? = nil, force: Bool = false, now: Date? = nil) async throws -> [StoredMediationPolicy] {
        let ticket = tickets.add(1, ordering: .relaxed).newValue
        var policies = try await store.policies(app: app, arms: true)
        let running = try await experiments.running(app: app)
        var deleted: Set<MediationScope> = []
        // The apps' zones and currencies, read once a pass and only when a decision is due.
        var apps: [String: ReportApp]?
        let interval = Double(configuration.interval.components.seconds)
        for index in policies.indices {
            let stored = policies[index]
            let now = now ?? Date()
            let isFresh = stored.decision != nil && stored.decidedAt.map { decided in
                now.timeIntervalSince(decided) < interval * 0.9 && stored.policy.updatedAt.map { $0 <= decided } ?? true
            } ?? false
            guard force || !isFresh else { continue }
            if apps == nil {
                apps = Dictionary(try await engine.readableApps(only: app).map { ($0.id, $0) }, uniquingKeysWith: { a, _ in a })
            }
            guard let reportApp = apps?[stored.policy.scope.app] else { continue }
            do {
                switch try await decide(stored.policy, app: reportApp, now: now) {
                case .stored(let decided): policies[index] = decided
                case .policyChanged: break
                // Deleted through another server meanwhile: no longer served.
                case .policyDeleted: deleted.insert(stored.policy.scope)
                }
            } catch let error as PostgresError where error.isUnreachable {
                throw error
            } catch {
                logger.warning("mediation decision not stored; the last one is served", metadata: ["policy": "\(stored.policy.scope.description)", "error": "\(error)"])
            }
        }
        policies.removeAll { deleted.contains($0.policy.scope) }
        let byApp = Dictionary(grouping: policies.compactMap(ServedMediation.init), by: \.scope.app)
        var experimentsByApp: [String: [String: ServedExperiment]] = [:]
        for experiment in running {
            var arms: [ExperimentArm: ServedMediation] = [:]
            for arm in ExperimentArm.allCases {
                arms[arm] = byApp[experiment.app]?.first { $0.scope == MediationScope(app: experiment.app, placement: experiment.placement, arm: arm) }
            }
            experimentsByApp[experiment.app, default: [:]][experiment.placement] = ServedExperiment(experiment: experiment, arms: arms)
        }
        served.withLock { served in
            // Before the first full pass, one app's decisions alone would make every
            // other app look as if it had no policy (404 instead of 503): stored only.
            guard served != nil || app == nil else { return }
            var next = served ?? Served()
            let read = app.map { Set([$0]) } ?? Set(next.decisions.keys).union(byApp.keys).union(next.experiments.keys)
            for name in read where ticket > next.installedBy[name, default: 0] {
                next.decisions[name] = byApp[name].map { Dictionary($0.map { ($0.scope, $0) }, uniquingKeysWith: { a, _ in a }) }
                next.experiments[name] = experimentsByApp[name]
                next.installedBy[name] = ticket
            }
            served = next
        }
        return policies
    }

    /// Computes and stores a policy's decision (not when the policy changed or went away meanwhile).
    /// Numbers that cannot be read for a reason other than the database being
    /// unreachable (a missing FX rate, a statement timeout, a busy report pool) count as no numbers: the policy falls back to
    /// its last choice or default, saying why, rather than serving nothing.
    func decide(_ policy: MediationPolicy, app: ReportApp, now: Date) async throws -> StoredDecision {
        var window: (stats: [MediationNetworkStats], from: Date)
        var unreadable: String?
        // An automatic policy without a list chooses among the app's own networks (declared,
        // or admitted): not among names its history may hold from before it declared them.
        var choosing = policy
        do {
            if policy.rule == .automatic && policy.networks.isEmpty {
                choosing.networks = try await store.admittedNetworks(app: app.id)
                if choosing.networks.isEmpty, let fallback = policy.defaultNetwork { choosing.networks = [fallback] }
            }
            window = try await stats(choosing, app: app, now: now)
        } catch let error as PostgresError where error.isUnreachable {
            throw error
        } catch {
            unreadableNumbers.increment()
            logger.warning("mediation numbers unreadable; falling back", metadata: ["policy": "\(policy.scope.description)", "error": "\(error)"])
            window = ([], Self.windowStart(policy, now: now))
            unreadable = "\(error)"
        }
        let numbers = window, why = unreadable, chooser = choosing
        decisions.increment()
        return try await store.storeDecision(
            policy.scope, policyUpdatedAt: policy.updatedAt, actor: configuration.identity,
            decide: { incumbent in
                MediationChooser.choose(chooser, stats: numbers.stats, incumbent: incumbent, currency: app.currency, unreadable: why)
            },
            answer: { choice, since, decidedAt in
                MediationAnswer(
                    policy: policy, choice: choice, stats: numbers.stats, windowFrom: numbers.from, windowTo: now, currency: app.currency,
                    chosenSince: since, decidedAt: decidedAt
                ).json()
            }
        )
    }

    /// The whole UTC days (since the epoch) of a policy ranked by ARPDAV: the `windowHours
    /// / 24` days before today's; nil for a policy whose window is in hours.
    static func windowDays(_ policy: MediationPolicy, now: Date) -> ClosedRange<Int>? {
        guard policy.rankBy == .arpdav else { return nil }
        let today = Int(now.timeIntervalSince1970.rounded(.down)) / 86_400
        return (today - policy.windowHours / 24)...(today - 1)
    }

    /// Where a policy's window starts.
    static func windowStart(_ policy: MediationPolicy, now: Date) -> Date {
        Date(timeIntervalSince1970: Double(windowDays(policy, now: now).map { $0.lowerBound * 86_400 } ?? windowHours(policy, now: now).lowerBound * 3600))
    }

    /// The UTC hours (since the epoch) a policy's window spans at `now`: from the hour
    /// `windowHours` before now's to now's own.
    static func windowHours(_ policy: MediationPolicy, now: Date) -> ClosedRange<Int> {
        let hour = Int(now.timeIntervalSince1970.rounded(.down)) / 3600
        return (hour - policy.windowHours)...hour
    }

    /// Each network's numbers in a policy's window — from the start of the UTC hour
    /// `windowHours` hours before `now`'s to `now` — summed by the report engine: a
    /// network report in UTC over the window's days, filtered to the window's hours.
    /// Ranked by ARPDAV, the window is whole UTC days: the `windowHours / 24` days before
    /// today's (DAV is counted per day; a day under way would start every night from
    /// nothing).
    public func stats(_ policy: MediationPolicy, app: ReportApp, now: Date) async throws -> (stats: [MediationNetworkStats], from: Date) {
        let hours = Self.windowHours(policy, now: now)
        let days = Self.windowDays(policy, now: now)
        var parameters = [
            ("apps", app.id), ("tz", "UTC"),
            ("from", ReportQuery.formatDate(days?.lowerBound ?? hours.lowerBound / 24)), ("to", ReportQuery.formatDate(days?.upperBound ?? hours.upperBound / 24)),
            ("dimensions", "network"), ("metrics", "requests,impressions,revenue" + (days == nil ? "" : ",arpdav")), ("limit", String(ReportQuery.maxLimit)),
        ]
        // Only the policy's candidates: the networks it names (an automatic policy without
        // a list may choose any the app admitted, Migrations/0010, at most 64).
        if !(policy.rule == .automatic && policy.networks.isEmpty) { parameters.append(("network", policy.named.joined(separator: ","))) }
        var query = try ReportQuery.parse(parameters, readable: [app], isAdmin: true, now: now)
        // Set as they are: the parameters' syntax would split a placement at its commas.
        if days == nil { query.filters.append((.hour, hours.map(Self.hourText))) }
        if let placement = policy.scope.placement { query.filters.append((.placement, [placement])) }
        if let country = policy.scope.country { query.filters.append((.country, [country])) }
        let page = try await engine.page(query)
        guard page.nextCursor == nil else {
            throw MediationWindowError(detail: "more than \(ReportQuery.maxLimit) networks in the window of \(policy.scope.description)")
        }
        let stats = page.rows.compactMap { row in row.dimensions[0].map { MediationNetworkStats(network: $0, counts: row.counts) } }
        return (stats, Self.windowStart(policy, now: now))
    }

    /// An hour's start as the engine writes it in UTC: `2026-11-23T15:00:00+00:00`.
    static func hourText(_ hour: Int) -> String {
        let (year, month, day) = CivilTime.date(days: hour / 24)
        func two(_ value: Int) -> String { value < 10 ? "0\(value)" : "\(value)" }
        return "\(year)-\(two(month))-\(two(day))T\(two(hour % 24)):00:00+00:00"
    }
}

/// A policy's window could not be read whole.
public struct MediationWindowError: Error, Sendable, CustomStringConvertible {
    /// What went wrong.
    public var detail: String
    public var description: String { detail }
}
