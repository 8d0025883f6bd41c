import Foundation

/// An experiment's arm (DESIGN §14).
public enum ExperimentArm: String, Sendable, Codable, CaseIterable, Hashable {
    /// The arm most devices get (1 − the treatment's share).
    case control
    /// The arm under test.
    case treatment

    /// A device's arm in an experiment: the first 8 bytes of SHA-256(salt ‖ 0 ‖ device),
    /// as a number, taken modulo 100, below the treatment's share (in percent) is the
    /// treatment. Fixed for the experiment's life (its salt never changes), the same on
    /// every server, after every restart, whatever the request's order.
    public static func assign(salt: String, device: String, treatmentShare: Int) -> ExperimentArm {
        place(salt: salt, device: device, treatmentShare: treatmentShare).arm
    }

    /// The device's arm, and from the same hash's next 8 bytes a point in 0..<1 for its
    /// draw within the arm (a weighted arm answers a device the same network every time).
    public static func place(salt: String, device: String, treatmentShare: Int) -> (arm: ExperimentArm, point: Double) {
        var hash = SHA256()
        hash.update(salt.utf8)
        hash.update([0])
        hash.update(device.utf8)
        let digest = hash.finalize()
        var arm: UInt64 = 0, point: UInt64 = 0
        for byte in digest[0..<8] { arm = arm << 8 | UInt64(byte) }
        for byte in digest[8..<16] { point = point << 8 | UInt64(byte) }
        return (arm % 100 < UInt64(treatmentShare) ? .treatment : .control, Double(point >> 11) / Double(1 << 53))
    }
}

/// An experiment on the switch (DESIGN §14): two policies for one placement of an app
/// (optionally only in some countries), a treatment share of devices, and its state.
public struct Experiment: Sendable, Equatable {
    /// Its name, unique in its app: `[a-z0-9][a-z0-9_.-]{0,63}`.
    public var name: String
    /// The app.
    public var app: String
    /// The placement tested.
    public var placement: String
    /// The countries it runs in (ISO 3166-1 alpha-2); empty: every country.
    public var countries: [String]
    /// The control arm's policy.
    public var control: MediationPolicy
    /// The treatment arm's policy.
    public var treatment: MediationPolicy
    /// Percent of devices in the treatment: 10, 20 or 50.
    public var treatmentShare: Int
    /// `running` or `stopped`.
    public var status: String = "running"
    /// The assignment's salt (set when it is created).
    public var salt: String = ""
    /// When it started, and who started it.
    public var startedAt: Date?
    public var createdBy: String = ""
    /// When it stopped, the arm kept, who decided, and the result they decided on.
    public var stoppedAt: Date?
    public var kept: ExperimentArm?
    public var stoppedBy: String?
    public var decision: String?

    /// The shares a treatment may have (AdMob's experiments allow 1–50 %; three steps
    /// keep the sample-ratio check and the needed sample sizes easy to reason about).
    public static let shares = [10, 20, 50]

    /// An experiment to create; `validated()` checks it.
    public init(name: String, app: String, placement: String, countries: [String] = [], control: MediationPolicy, treatment: MediationPolicy, treatmentShare: Int) {
        self.name = name
        self.app = app
        self.placement = placement
        self.countries = countries
        self.control = control
        self.treatment = treatment
        self.treatmentShare = treatmentShare
    }

    /// Whether the two arms have the same policy (an A/A test).
    public var isAA: Bool {
        var a = control, b = treatment
        a.scope = b.scope
        a.updatedAt = nil
        b.updatedAt = nil
        return a == b
    }

    /// Whether a name keeps the rule.
    public static func isName(_ name: String) -> Bool {
        let bytes = Array(name.utf8)
        guard (1...64).contains(bytes.count) else { return false }
        func allowed(_ byte: UInt8, first: Bool) -> Bool {
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"): true
            case UInt8(ascii: "_"), UInt8(ascii: "."), UInt8(ascii: "-"): !first
            default: false
            }
        }
        return bytes.enumerated().allSatisfy { allowed($0.element, first: $0.offset == 0) }
    }

    /// The experiment if every field keeps its rule (the arms' policies scoped to the
    /// placement and checked as `adtally mediation set` checks them), else the first broken one.
    public func validated() throws(FieldError) -> Experiment {
        var experiment = self
        guard Self.isName(name) else { throw FieldError("name", "must be 1 to 64 characters of a-z, 0-9, _, . and -, starting with a letter or digit") }
        guard EventValidator.isPlacement(placement) else { throw FieldError("placement", "is required: 1 to 64 characters, without NUL") }
        guard countries.count <= 250 else { throw FieldError("countries", "at most 250 codes") }
        var codes: [String] = []
        for country in countries {
            guard let code = EventValidator.countryCode(country), code != "ZZ" else {
                throw FieldError("countries", "\"\(country.prefix(16))\" is not an ISO 3166-1 alpha-2 code")
            }
            if !codes.contains(code) { codes.append(code) }
        }
        experiment.countries = codes.sorted()
        guard Self.shares.contains(treatmentShare) else { throw FieldError("treatment_share", "must be 10, 20 or 50 (percent of devices in the treatment)") }
        for (arm, policy) in [(ExperimentArm.control, control), (.treatment, treatment)] {
            var scoped = policy
            scoped.scope = MediationScope(app: app, placement: placement, arm: arm)
            do {
                scoped = try scoped.validated()
            } catch {
                throw FieldError("\(arm.rawValue).\(error.field)", error.rule)
            }
            if arm == .control { experiment.control = scoped } else { experiment.treatment = scoped }
        }
        return experiment
    }
}

extension MediationPolicy {
    /// The policy as an arm holds it: the API's flat object without the scope (an arm's
    /// app, placement and country are its experiment's) or when it was set.
    public var armObject: [String: Any] {
        // Every field encodes (strings, numbers, optionals): this cannot fail.
        var object = try! JSONSerialization.jsonObject(with: JSONEncoder().encode(self)) as! [String: Any]
        for key in ["app", "placement", "country", "updated_at"] { object.removeValue(forKey: key) }
        return object
    }

    /// A policy written as the CLI takes it: `pinned:admob`, `weighted:admob=70,unity=30`
    /// or `automatic`, then `;option=value` pairs named as `adtally mediation set` names
    /// its options: `default`, `networks` (comma-separated), `window-hours`,
    /// `min-requests`, `hysteresis`, `rank-by` and `max-age`
    /// (`automatic;default=admob;networks=admob,unity;window-hours=48`).
    public static func parse(_ text: String, scope: MediationScope, field: String) throws(FieldError) -> MediationPolicy {
        var parts = text.split(separator: ";", omittingEmptySubsequences: false).map(String.init)
        let head = parts.removeFirst()
        let ruleText = head.split(separator: ":", maxSplits: 1).first.map(String.init) ?? ""
        let argument = head.contains(":") ? String(head.split(separator: ":", maxSplits: 1, omittingEmptySubsequences: false)[1]) : nil
        guard let rule = MediationRule(rawValue: ruleText) else {
            throw FieldError(field, "\"\(text.prefix(64))\": must start pinned:NETWORK, weighted:NETWORK=WEIGHT,… or automatic")
        }
        var policy = MediationPolicy(scope: scope, rule: rule)
        switch rule {
        case .pinned:
            guard let argument, !argument.isEmpty else { throw FieldError(field, "pinned needs its network: pinned:admob") }
            policy.network = argument
        case .weighted:
            guard let argument, !argument.isEmpty else { throw FieldError(field, "weighted needs its weights: weighted:admob=70,unity=30") }
            var weights: [String: Int] = [:]
            for pair in argument.split(separator: ",") {
                let halves = pair.split(separator: "=", maxSplits: 1)
                guard halves.count == 2, let weight = Int(halves[1]) else { throw FieldError(field, "\"\(pair.prefix(64))\" is not network=weight") }
                guard weights[String(halves[0])] == nil else { throw FieldError(field, "\(halves[0].prefix(32)) is named twice") }
                weights[String(halves[0])] = weight
            }
            policy.weights = weights
        case .automatic:
            guard argument == nil else { throw FieldError(field, "automatic takes options after ;, not : (automatic;default=admob)") }
        }
        for option in parts {
            let halves = option.split(separator: "=", maxSplits: 1)
            guard halves.count == 2 else { throw FieldError(field, "\"\(option.prefix(64))\" is not option=value") }
            let name = String(halves[0]), value = String(halves[1])
            func number<T: LosslessStringConvertible>(_ type: T.Type) throws(FieldError) -> T {
                guard let number = T(value) else { throw FieldError(field, "\(name): \"\(value.prefix(32))\" is not a number") }
                return number
            }
            switch name {
            case "default": policy.defaultNetwork = value
            case "networks": policy.networks = value.split(separator: ",").map(String.init)
            case "window-hours": policy.windowHours = try number(Int.self)
            case "min-requests": policy.minRequests = try number(Int64.self)
            case "hysteresis": policy.hysteresis = try number(Double.self)
            case "rank-by":
                guard let rank = MediationRank(rawValue: value) else { throw FieldError(field, "rank-by: must be rpm or arpdav") }
                policy.rankBy = rank
            case "max-age": policy.maxAgeSeconds = try number(Int.self)
            default:
                throw FieldError(field, "\(name.prefix(32)): unknown option; the options are default, networks, window-hours, min-requests, hysteresis, rank-by, max-age")
            }
        }
        do {
            return try policy.validated()
        } catch {
            throw FieldError(field, "\(error.field): \(error.rule)")
        }
    }

    /// The policy as `parse` reads it back.
    public var spec: String {
        var text: String
        switch rule {
        case .pinned: text = "pinned:\(network ?? "")"
        case .weighted: text = "weighted:" + (weights ?? [:]).sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: ",")
        case .automatic:
            text = "automatic;default=\(defaultNetwork ?? "")"
            if !networks.isEmpty { text += ";networks=" + networks.joined(separator: ",") }
            if windowHours != Self.defaultWindowHours { text += ";window-hours=\(windowHours)" }
            if minRequests != Self.defaultMinRequests { text += ";min-requests=\(minRequests)" }
            if hysteresis != Self.defaultHysteresis { text += ";hysteresis=\(hysteresis)" }
            if rankBy != .rpm { text += ";rank-by=\(rankBy.rawValue)" }
        }
        if maxAgeSeconds != Self.defaultMaxAgeSeconds { text += ";max-age=\(maxAgeSeconds)" }
        return text
    }
}

extension Experiment {
    /// The experiment as the API shows it (each arm's policy as `adtally mediation set`
    /// takes it, and as the CLI writes it: `spec`).
    public func jsonObject() -> [String: Any] {
        func policy(_ policy: MediationPolicy) -> [String: Any] {
            var object = policy.armObject
            object["spec"] = policy.spec
            return object
        }
        func time(_ date: Date?) -> Any { date.map { $0.formatted(.iso8601) } ?? NSNull() }
        let decisionObject = decision.flatMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) } ?? NSNull()
        return [
            "name": name, "app": app, "placement": placement, "countries": countries, "treatment_share": treatmentShare,
            "control": policy(control), "treatment": policy(treatment), "aa_test": isAA,
            "status": status, "started_at": time(startedAt), "created_by": createdBy,
            "stopped_at": time(stoppedAt), "kept": kept?.rawValue ?? NSNull(), "stopped_by": stoppedBy ?? NSNull(), "decision": decisionObject,
        ]
    }
}
