import AdTallyCore
import Foundation
import PostgresKit

/// A stored policy with the decision the servers serve for it.
public struct StoredMediationPolicy: Sendable, Encodable {
    /// The policy.
    public var policy: MediationPolicy
    /// The network served (a weighted policy's heaviest), nil before the first decision.
    public var chosen: String?
    /// Since when `chosen` is served.
    public var chosenSince: Date?
    /// The answer served (`MediationAnswer`'s JSON without `enable_advertising`).
    public var decision: String?
    /// When it was last computed.
    public var decidedAt: Date?

    enum CodingKeys: String, CodingKey {
        case policy, chosen, chosenSince = "chosen_since", decidedAt = "decided_at"
    }

    /// Every field, null before the first decision.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(policy, forKey: .policy)
        try container.encode(chosen, forKey: .chosen)
        try container.encode(chosenSince, forKey: .chosenSince)
        try container.encode(decidedAt, forKey: .decidedAt)
    }
}

/// One entry of a policy's history: a policy set or deleted, or the served network switched.
public struct MediationChange: Sendable, Equatable, Encodable {
    /// When.
    public var at: Date
    /// The app.
    public var app: String
    /// The placement (nil: every one).
    public var placement: String?
    /// The country (nil: every one).
    public var country: String?
    /// `policy`, `deleted` or `switch`.
    public var kind: String
    /// The policy or network before (nil: none).
    public var from: String?
    /// The policy or network after (nil: none).
    public var to: String?
    /// Why.
    public var reason: String
    /// Who: a key, the CLI, or the server that decided.
    public var actor: String
}

/// What the store refuses.
public enum MediationStoreError: Error, Sendable, CustomStringConvertible, Equatable {
    /// No such app.
    case unknownApp(String)
    /// No policy for that scope.
    case unknownPolicy(MediationScope)
    /// An experiment runs on the scope's placement.
    case experimentRunning(name: String, scope: MediationScope)

    public var description: String {
        switch self {
        case .unknownApp(let app): "app: no app \"\(app)\""
        case .unknownPolicy(let scope): "no mediation policy for \(scope.description)"
        case .experimentRunning(let name, let scope):
            "placement \(scope.placement ?? ""): experiment \"\(name)\" runs on it, so its policy cannot change until it stops "
                + "(adtally experiments stop \(name) --app \(scope.app) --keep control|treatment, or POST /v1/apps/\(scope.app)/experiments/\(name)/stop)"
        }
    }
}

/// What became of a decision `MediationStore.storeDecision` was asked to store.
public enum StoredDecision: Sendable {
    /// Stored: the policy with it.
    case stored(StoredMediationPolicy)
    /// Not stored: the policy changed since its numbers were read (the next pass decides it).
    case policyChanged
    /// Not stored: the policy was deleted.
    case policyDeleted
}

/// Mediation policies, their decisions and their history (Migrations/0009).
public struct MediationStore: Sendable {
    let pool: PostgresPool

    /// The networks an app's events may name (Migrations/0010): its declared list, else
    /// those admitted so far. An automatic policy without a list chooses among these
    /// only, so a name invented before the app declared its list never wins.
    public func admittedNetworks(app: String) async throws -> [String] {
        try await AppStore(pool: pool).networks(app: app)?.admitted ?? []
    }

    /// A store over a pool of the primary.
    public init(pool: PostgresPool) {
        self.pool = pool
    }

    static let columns = """
        app_id, placement, country, rule, network, weights::text, to_json(networks)::text, default_network, window_hours, min_requests,
        hysteresis, max_age_seconds, updated_at, chosen, chosen_since, decision, decided_at, rank_by, arm
        """

    static func decode(_ row: PostgresRow) throws -> StoredMediationPolicy {
        let placement: String = try row.decode(1), country: String = try row.decode(2), arm: String = try row.decode(18)
        let decoder = JSONDecoder()
        let weights = try (row.decode(5, as: String?.self)).map { try decoder.decode([String: Int].self, from: Data($0.utf8)) }
        let networks = try decoder.decode([String].self, from: Data((try row.decode(6, as: String.self)).utf8))
        let policy = MediationPolicy(
            scope: MediationScope(
                app: try row.decode(0), placement: placement.isEmpty ? nil : placement, country: country.isEmpty ? nil : country, arm: ExperimentArm(rawValue: arm)
            ),
            rule: MediationRule(rawValue: try row.decode(3)) ?? .pinned, network: try row.decode(4), weights: weights, networks: networks,
            defaultNetwork: try row.decode(7), windowHours: try row.decode(8), minRequests: try row.decode(9), hysteresis: try row.decode(10),
            rankBy: MediationRank(rawValue: try row.decode(17)) ?? .rpm, maxAgeSeconds: try row.decode(11), updatedAt: try row.decode(12)
        )
        return StoredMediationPolicy(policy: policy, chosen: try row.decode(13), chosenSince: try row.decode(14), decision: try row.decode(15), decidedAt: try row.decode(16))
    }

    /// Every policy (of one app, when given), with its decision; with `arms`, the running
    /// experiments' arms too (what the refresher decides and serves).
    public func policies(app: String? = nil, arms: Bool = false) async throws -> [StoredMediationPolicy] {
        try await pool.query("""
            SELECT \(unsafeRaw: Self.columns) FROM mediation_policies WHERE (\(app)::text IS NULL OR app_id = \(app)::text) AND (\(arms) OR arm = '')
            ORDER BY app_id, placement, country, arm
            """).map(Self.decode)
    }

    /// Sets (creates or replaces) a policy and records the change. The decision stays
    /// until the next refresh: a new rule starts from the network served so far.
    public func set(_ policy: MediationPolicy, actor: String) async throws -> MediationPolicy {
        let policy = try policy.validated()
        do {
            return try await pool.withTransaction { connection in
                try Self.refuseDuringExperiment(policy.scope, on: connection)
                return try Self.set(policy, actor: actor, reason: nil, on: connection)
            }
        } catch let error as PostgresError where error.sqlState == .foreignKeyViolation {
            throw MediationStoreError.unknownApp(policy.scope.app)
        }
    }

    /// A placement's policy cannot change while an experiment runs on it: stopping the
    /// experiment sets it (to the arm kept). Arms change only with their experiment.
    static func refuseDuringExperiment(_ scope: MediationScope, on connection: PostgresConnection) throws {
        guard scope.arm == nil, let placement = scope.placement else { return }
        try lockPlacement(app: scope.app, placement: placement, on: connection)
        if let name = try connection.query("""
            SELECT name FROM experiments WHERE app_id = \(scope.app) AND placement = \(placement) AND status = 'running'
            """).first?.decode(0, as: String.self) {
            throw MediationStoreError.experimentRunning(name: name, scope: scope)
        }
    }

    /// Takes the placement's lock until the transaction ends: an experiment's creation and a
    /// change of the placement's policies check each other, and must not both pass unseen.
    static func lockPlacement(app: String, placement: String, on connection: PostgresConnection) throws {
        try connection.query("SELECT pg_advisory_xact_lock(hashtextextended(\(app) || chr(1) || \(placement), 4702111234474983745))")
    }

    /// Sets a validated policy in the transaction of `connection` (`reason`: why, when not
    /// the user's own change).
    static func set(_ policy: MediationPolicy, actor: String, reason: String?, on connection: PostgresConnection) throws -> MediationPolicy {
                let scope = policy.scope
                let weights = try policy.weights.map { String(decoding: try JSONEncoder().encode($0), as: UTF8.self) }
                let before = try connection.query("""
                    SELECT \(unsafeRaw: Self.columns) FROM mediation_policies
                    WHERE app_id = \(scope.app) AND placement = \(scope.placement ?? "") AND country = \(scope.country ?? "") AND arm = \(scope.arm?.rawValue ?? "") FOR UPDATE
                    """).first.map(Self.decode)
                if var same = before?.policy {
                    // Set again as it is: nothing to record, and no decision to redo everywhere.
                    let updatedAt = same.updatedAt
                    same.updatedAt = nil
                    if same == policy {
                        same.updatedAt = updatedAt
                        return same
                    }
                }
                try connection.query("""
                    INSERT INTO mediation_policies (app_id, placement, country, arm, rule, network, weights, networks, default_network, window_hours,
                                                    min_requests, hysteresis, max_age_seconds, rank_by)
                    VALUES (\(scope.app), \(scope.placement ?? ""), \(scope.country ?? ""), \(scope.arm?.rawValue ?? ""), \(policy.rule.rawValue), \(policy.network), \(weights)::jsonb,
                            \(array: policy.networks)::text[], \(policy.defaultNetwork), \(policy.windowHours), \(policy.minRequests), \(policy.hysteresis),
                            \(policy.maxAgeSeconds), \(policy.rankBy.rawValue))
                    ON CONFLICT (app_id, placement, country, arm) DO UPDATE SET
                        rule = excluded.rule, network = excluded.network, weights = excluded.weights, networks = excluded.networks,
                        default_network = excluded.default_network, window_hours = excluded.window_hours, min_requests = excluded.min_requests,
                        hysteresis = excluded.hysteresis, max_age_seconds = excluded.max_age_seconds, rank_by = excluded.rank_by, updated_at = excluded.updated_at
                    """)
                // Read back, not RETURNING: Citus refuses non-IMMUTABLE functions (to_json,
                // clock_timestamp) in a write's RETURNING and DO UPDATE SET; the default
                // (clock_timestamp()) stamps updated_at.
                let row = try Self.read(scope, on: connection)
                try Self.record(
                    scope, kind: "policy", from: before?.policy.summary, to: policy.summary,
                    reason: reason ?? (before == nil ? "policy created" : "policy replaced"), actor: actor, on: connection
                )
                return try Self.decode(row!).policy
    }

    /// Deletes a policy and records it; requests it answered fall to a broader policy (or none).
    public func delete(_ scope: MediationScope, actor: String) async throws {
        let deleted = try await pool.withTransaction { connection in
            try Self.refuseDuringExperiment(scope, on: connection)
            guard let row = try Self.read(scope, lock: true, on: connection) else { return false }
            try connection.query("""
                DELETE FROM mediation_policies WHERE app_id = \(scope.app) AND placement = \(scope.placement ?? "") AND country = \(scope.country ?? "")
                  AND arm = \(scope.arm?.rawValue ?? "")
                """)
            try Self.record(scope, kind: "deleted", from: try Self.decode(row).policy.summary, to: nil, reason: "policy deleted", actor: actor, on: connection)
            return true
        }
        if !deleted { throw MediationStoreError.unknownPolicy(scope) }
    }

    /// The newest changes of an app (all its scopes), newest first.
    public func history(app: String, limit: Int) async throws -> [MediationChange] {
        try await pool.query("""
            SELECT at, app_id, placement, country, kind, from_value, to_value, reason, actor FROM mediation_changes
            WHERE app_id = \(app) ORDER BY at DESC, id DESC LIMIT \(limit)
            """).map { row in
            let placement: String = try row.decode(2), country: String = try row.decode(3)
            return MediationChange(
                at: try row.decode(0), app: try row.decode(1), placement: placement.isEmpty ? nil : placement, country: country.isEmpty ? nil : country,
                kind: try row.decode(4), from: try row.decode(5), to: try row.decode(6), reason: try row.decode(7), actor: try row.decode(8)
            )
        }
    }

    /// A policy's row as `decode` reads it (locked when `lock`); nil when there is none.
    static func read(_ scope: MediationScope, lock: Bool = false, on connection: PostgresConnection) throws -> PostgresRow? {
        try connection.query("""
            SELECT \(unsafeRaw: columns) FROM mediation_policies
            WHERE app_id = \(scope.app) AND placement = \(scope.placement ?? "") AND country = \(scope.country ?? "") AND arm = \(scope.arm?.rawValue ?? "")\(unsafeRaw: lock ? " FOR UPDATE" : "")
            """).first
    }

    /// Stores a decision for a policy as it was when its numbers were read (`updatedAt`):
    /// under the row's lock, `decide` gets the network chosen last (other servers decide
    /// too, and hysteresis compares with theirs) and `answer` renders the choice with
    /// the time it has been served since; a change of network is recorded. Stores
    /// nothing when the policy changed or went away meanwhile.
    public func storeDecision(
        _ scope: MediationScope, policyUpdatedAt: Date?, actor: String,
        decide: @escaping @Sendable (_ incumbent: String?) -> MediationChoice,
        answer: @escaping @Sendable (_ choice: MediationChoice, _ chosenSince: Date, _ now: Date) -> String
    ) async throws -> StoredDecision {
        try await pool.withTransaction { connection in
            guard let row = try connection.query("""
                SELECT \(unsafeRaw: Self.columns), clock_timestamp() FROM mediation_policies
                WHERE app_id = \(scope.app) AND placement = \(scope.placement ?? "") AND country = \(scope.country ?? "") AND arm = \(scope.arm?.rawValue ?? "") FOR UPDATE
                """).first else { return .policyDeleted }
            let current = try Self.decode(row)
            guard current.policy.updatedAt == policyUpdatedAt else { return .policyChanged }
            let now: Date = try row.decode(19)
            let choice = decide(current.chosen)
            let changed = choice.network != current.chosen
            let since = changed ? now : current.chosenSince ?? now
            try connection.query("""
                UPDATE mediation_policies SET chosen = \(choice.network), chosen_since = \(since), decision = \(answer(choice, since, now)), decided_at = \(now)
                WHERE app_id = \(scope.app) AND placement = \(scope.placement ?? "") AND country = \(scope.country ?? "") AND arm = \(scope.arm?.rawValue ?? "")
                """)
            let stored = try Self.read(scope, on: connection)
            if changed {
                try Self.record(scope, kind: "switch", from: current.chosen, to: choice.network, reason: choice.reason, actor: actor, on: connection)
            }
            return .stored(try Self.decode(stored!))
        }
    }

    static func record(_ scope: MediationScope, kind: String, from: String?, to: String?, reason: String, actor: String, on connection: PostgresConnection) throws {
        let reason = scope.arm.map { "experiment's \($0.rawValue) arm: \(reason)" } ?? reason
        try connection.query("""
            INSERT INTO mediation_changes (app_id, placement, country, arm, kind, from_value, to_value, reason, actor)
            VALUES (\(scope.app), \(scope.placement ?? ""), \(scope.country ?? ""), \(scope.arm?.rawValue ?? ""), \(kind), \(from), \(to), \(reason), \(actor))
            """)
    }
}
