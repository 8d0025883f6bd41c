import AdTallyCore
import Foundation
import PostgresKit

/// What the experiment store refuses.
public enum ExperimentStoreError: Error, Sendable, CustomStringConvertible, Equatable {
    /// No such app.
    case unknownApp(String)
    /// No experiment of that name in the app.
    case unknown(app: String, name: String)
    /// The name is taken (experiments are kept after they stop).
    case nameTaken(app: String, name: String)
    /// Another experiment runs on the placement.
    case placementBusy(app: String, placement: String, running: String)
    /// The experiment has stopped already.
    case stopped(app: String, name: String, kept: String)

    public var description: String {
        switch self {
        case .unknownApp(let app): "app: no app \"\(app)\""
        case .unknown(let app, let name): "no experiment \"\(name)\" in app \"\(app)\""
        case .nameTaken(let app, let name): "name: app \"\(app)\" already has an experiment \"\(name)\" (stopped ones are kept); choose another name"
        case .placementBusy(let app, let placement, let running):
            "placement: experiment \"\(running)\" already runs on placement \(placement) of app \"\(app)\"; one runs per placement: stop it first (adtally experiments stop \(running) --app \(app) --keep control|treatment)"
        case .stopped(_, let name, let kept): "experiment \"\(name)\" has stopped already (it kept the \(kept) arm)"
        }
    }
}

/// Experiments on the switch (DESIGN §14, Migrations/0029): created with their arms'
/// policies (stored as mediation policies of the placement with an arm, decided and
/// served by the refresher), listed, stopped with the kept arm made the placement's policy.
public struct ExperimentStore: Sendable {
    let pool: PostgresPool

    /// A store over a pool of the primary.
    public init(pool: PostgresPool) {
        self.pool = pool
    }

    static let columns = """
        app_id, name, salt::text, placement, to_json(countries)::text, control::text, treatment::text, treatment_share, status, started_at, created_by,
        stopped_at, kept, stopped_by, decision::text
        """

    static func decode(_ row: PostgresRow) throws -> Experiment {
        let decoder = JSONDecoder()
        let app: String = try row.decode(0), placement: String = try row.decode(3)
        func policy(_ column: Int, _ arm: ExperimentArm) throws -> MediationPolicy {
            var policy = try decoder.decode(MediationPolicy.self, from: Data(try row.decode(column, as: String.self).utf8))
            policy.scope = MediationScope(app: app, placement: placement, arm: arm)
            return policy
        }
        var experiment = Experiment(
            name: try row.decode(1), app: app, placement: placement,
            countries: try decoder.decode([String].self, from: Data(try row.decode(4, as: String.self).utf8)),
            control: try policy(5, .control), treatment: try policy(6, .treatment), treatmentShare: try row.decode(7)
        )
        experiment.salt = try row.decode(2)
        experiment.status = try row.decode(8)
        experiment.startedAt = try row.decode(9)
        experiment.createdBy = try row.decode(10)
        experiment.stoppedAt = try row.decode(11)
        experiment.kept = try row.decode(12, as: String?.self).flatMap(ExperimentArm.init(rawValue:))
        experiment.stoppedBy = try row.decode(13)
        experiment.decision = try row.decode(14)
        return experiment
    }

    /// A policy's JSON as stored in an arm column (the API's flat object, without scope).
    static func json(_ policy: MediationPolicy) throws -> String {
        String(decoding: try JSONSerialization.data(withJSONObject: policy.armObject, options: [.sortedKeys]), as: UTF8.self)
    }

    /// Creates and starts an experiment: its row (a fresh salt) and its arms' policies, in
    /// one transaction. Refused when the name is taken or another runs on the placement.
    public func create(_ experiment: Experiment, actor: String) async throws -> Experiment {
        let experiment = try experiment.validated()
        do {
            return try await pool.withTransaction { connection in
                try MediationStore.lockPlacement(app: experiment.app, placement: experiment.placement, on: connection)
                if let running = try connection.query("""
                    SELECT name FROM experiments WHERE app_id = \(experiment.app) AND placement = \(experiment.placement) AND status = 'running'
                    """).first?.decode(0, as: String.self) {
                    throw ExperimentStoreError.placementBusy(app: experiment.app, placement: experiment.placement, running: running)
                }
                if try !connection.query("SELECT 1 FROM experiments WHERE app_id = \(experiment.app) AND name = \(experiment.name)").isEmpty {
                    throw ExperimentStoreError.nameTaken(app: experiment.app, name: experiment.name)
                }
                // Countries with a policy of their own on the placement: an experiment over
                // every country would answer them its arms, and its stop could not say which
                // policy they keep. It must name the countries it covers.
                if experiment.countries.isEmpty {
                    let own = try connection.query("""
                        SELECT country FROM mediation_policies
                        WHERE app_id = \(experiment.app) AND placement = \(experiment.placement) AND country <> '' AND arm = '' ORDER BY country
                        """).map { try $0.decode(0, as: String.self) }
                    if !own.isEmpty {
                        throw FieldError("countries", "placement \(experiment.placement) has policies of its own for \(own.joined(separator: ", ")): name the countries the experiment covers, or delete those policies first")
                    }
                }
                try connection.query("""
                    INSERT INTO experiments (app_id, name, salt, placement, countries, control, treatment, treatment_share, created_by)
                    VALUES (\(experiment.app), \(experiment.name), \(UUID().uuidString.lowercased())::uuid, \(experiment.placement), \(array: experiment.countries)::text[],
                            \(try Self.json(experiment.control))::jsonb, \(try Self.json(experiment.treatment))::jsonb, \(experiment.treatmentShare), \(actor))
                    """)
                for policy in [experiment.control, experiment.treatment] {
                    _ = try MediationStore.set(policy, actor: actor, reason: "experiment \(experiment.name) started", on: connection)
                }
                return try Self.read(app: experiment.app, name: experiment.name, on: connection)!
            }
        } catch let error as PostgresError where error.sqlState == .foreignKeyViolation {
            throw ExperimentStoreError.unknownApp(experiment.app)
        } catch let error as PostgresError where error.sqlState == .uniqueViolation {
            // Two creations at once: the index decides, named as the check above names it.
            throw ExperimentStoreError.placementBusy(app: experiment.app, placement: experiment.placement, running: "(another, created just now)")
        }
    }

    static func read(app: String, name: String, lock: Bool = false, on connection: PostgresConnection) throws -> Experiment? {
        try connection.query("""
            SELECT \(unsafeRaw: columns) FROM experiments WHERE app_id = \(app) AND name = \(name)\(unsafeRaw: lock ? " FOR UPDATE" : "")
            """).first.map(decode)
    }

    /// One experiment.
    public func experiment(app: String, name: String) async throws -> Experiment {
        guard let experiment = try await pool.withConnection({ try Self.read(app: app, name: name, on: $0) }) else {
            throw ExperimentStoreError.unknown(app: app, name: name)
        }
        return experiment
    }

    /// The experiments of that name in any app (the CLI's lookup when no app is named).
    public func named(_ name: String) async throws -> [Experiment] {
        try await pool.query("SELECT \(unsafeRaw: Self.columns) FROM experiments WHERE name = \(name) ORDER BY app_id").map(Self.decode)
    }

    /// An app's experiments, the running first, newest first.
    public func list(app: String) async throws -> [Experiment] {
        try await pool.query("""
            SELECT \(unsafeRaw: Self.columns) FROM experiments WHERE app_id = \(app) ORDER BY status = 'running' DESC, started_at DESC, name
            """).map(Self.decode)
    }

    /// The running experiments (of one app, when given): what the switch serves.
    public func running(app: String? = nil) async throws -> [Experiment] {
        try await pool.query("""
            SELECT \(unsafeRaw: Self.columns) FROM experiments WHERE status = 'running' AND (\(app)::text IS NULL OR app_id = \(app)::text)
            """).map(Self.decode)
    }

    /// Stops an experiment: the kept arm's policy becomes the placement's own, the arms'
    /// policies go, and the experiment records who decided, when, and on what result
    /// (`decision`: the results as they stood, JSON).
    public func stop(app: String, name: String, keep: ExperimentArm, actor: String, decision: String) async throws -> Experiment {
        try await pool.withTransaction { connection in
            guard let experiment = try Self.read(app: app, name: name, lock: true, on: connection) else {
                throw ExperimentStoreError.unknown(app: app, name: name)
            }
            guard experiment.status == "running" else {
                throw ExperimentStoreError.stopped(app: app, name: name, kept: experiment.kept?.rawValue ?? "?")
            }
            // The instant read first, then written as a value: Citus refuses a volatile
            // function (clock_timestamp()) in an UPDATE of a distributed table.
            let now: Date = try connection.query("SELECT clock_timestamp()")[0].decode(0)
            try connection.query("""
                UPDATE experiments SET status = 'stopped', stopped_at = \(now), kept = \(keep.rawValue), stopped_by = \(actor), decision = \(decision)::jsonb
                WHERE app_id = \(app) AND name = \(name)
                """)
            // The kept arm is the policy of what the experiment covered: the placement, or its
            // countries when it named some.
            let kept = keep == .control ? experiment.control : experiment.treatment
            for country in experiment.countries.isEmpty ? [nil] : experiment.countries.map(Optional.some) {
                var policy = kept
                policy.scope = MediationScope(app: app, placement: experiment.placement, country: country)
                _ = try MediationStore.set(policy, actor: actor, reason: "experiment \(name) stopped: kept its \(keep.rawValue) arm", on: connection)
            }
            try connection.query("""
                DELETE FROM mediation_policies WHERE app_id = \(app) AND placement = \(experiment.placement) AND country = '' AND arm <> ''
                """)
            return try Self.read(app: app, name: name, on: connection)!
        }
    }
}
