import AdTallyCore
import AdTallyStorage
import Foundation
import Hummingbird

/// Experiments on the switch over HTTP (DESIGN §14), under `/v1/apps/{app}/experiments`:
///
/// - `POST` (an admin key) creates and starts one: `{"name", "placement", "control",
///   "treatment", "treatment_share", "countries"}`, each policy an object as `PUT
///   …/mediation/policies` takes it (without app, placement or country) or a string as
///   the CLI writes it (`pinned:admob`, `weighted:admob=70,unity=30`, `automatic;default=admob`);
/// - `GET` lists them, `GET …/{name}` shows one (an admin key or the app's read key);
/// - `GET …/{name}/results`: the results from the report engine;
/// - `POST …/{name}/stop` with `{"keep": "control" | "treatment"}` (an admin key): the kept
///   arm becomes the placement's policy; the decision is recorded with the results it was made on.
public struct ExperimentRoutes: Sendable {
    let store: ExperimentStore
    let engine: ReportEngine
    let refresher: MediationRefresher
    let authenticator: KeyAuthenticator

    /// Creates the routes.
    public init(store: ExperimentStore, engine: ReportEngine, refresher: MediationRefresher, authenticator: KeyAuthenticator) {
        self.store = store
        self.engine = engine
        self.refresher = refresher
        self.authenticator = authenticator
    }

    /// What `POST` takes.
    struct Creation: Decodable {
        var name: String
        var placement: String
        var countries: [String]?
        var control: PolicyValue
        var treatment: PolicyValue
        var treatmentShare: Int

        enum CodingKeys: String, CodingKey {
            case name, placement, countries, control, treatment, treatmentShare = "treatment_share"
        }

        init(from decoder: any Decoder) throws {
            for key in try decoder.container(keyedBy: AnyCodingKey.self).allKeys where CodingKeys(stringValue: key.stringValue) == nil {
                throw FieldError(key.stringValue, "is not an experiment field; the fields are name, placement, countries, control, treatment, treatment_share")
            }
            let container = try decoder.container(keyedBy: CodingKeys.self)
            name = try container.decode(String.self, forKey: .name)
            placement = try container.decode(String.self, forKey: .placement)
            countries = try container.decodeIfPresent([String].self, forKey: .countries)
            control = try container.decode(PolicyValue.self, forKey: .control)
            treatment = try container.decode(PolicyValue.self, forKey: .treatment)
            treatmentShare = try container.decode(Int.self, forKey: .treatmentShare)
        }
    }

    /// A policy as an object or as the CLI's string.
    enum PolicyValue: Decodable {
        case object(MediationPolicy)
        case text(String)

        init(from decoder: any Decoder) throws {
            if let text = try? decoder.singleValueContainer().decode(String.self) {
                self = .text(text)
            } else {
                self = .object(try MediationPolicy(from: decoder))
            }
        }

        func policy(_ field: String, scope: MediationScope) throws -> MediationPolicy {
            switch self {
            case .text(let text): return try MediationPolicy.parse(text, scope: scope, field: field)
            case .object(var policy):
                guard policy.scope.app.isEmpty, policy.scope.placement == nil, policy.scope.country == nil else {
                    throw FieldError(field, "an arm's policy takes no app, placement or country: the experiment's are its own")
                }
                policy.scope = scope
                return policy
            }
        }
    }

    struct Stop: Decodable {
        var keep: String
    }

    /// Adds the routes to a router.
    public func register(on router: Routes) {
        router.post("v1/apps/:app/experiments") { request, context in
            let app = try context.parameters.require("app")
            let key = try await authenticator.require(.admin, request)
            let body: Creation = try await AdminRoutes.decode(request)
            // Each arm's scope is set by the experiment's validation.
            let scope = MediationScope(app: app, placement: body.placement)
            let experiment = Experiment(
                name: body.name, app: app, placement: body.placement, countries: body.countries ?? [],
                control: try body.control.policy("control", scope: scope), treatment: try body.treatment.policy("treatment", scope: scope),
                treatmentShare: body.treatmentShare
            )
            let created = try await Self.mapping { try await store.create(experiment, actor: "admin key \(key.id)") }
            await refreshNow(app)
            var response = try Self.json(created.jsonObject(), status: .created)
            response.headers[.location] = "/v1/apps/\(app)/experiments/\(created.name)"
            return response
        }
        router.get("v1/apps/:app/experiments") { request, context in
            let app = try context.parameters.require("app")
            _ = try await authenticator.require(.read, app: app, request)
            return try Self.json(["experiments": try await store.list(app: app).map { $0.jsonObject() }])
        }
        router.get("v1/apps/:app/experiments/:name") { request, context in
            let app = try context.parameters.require("app"), name = try context.parameters.require("name")
            _ = try await authenticator.require(.read, app: app, request)
            return try Self.json(try await Self.mapping { try await store.experiment(app: app, name: name) }.jsonObject())
        }
        router.get("v1/apps/:app/experiments/:name/results") { request, context in
            let app = try context.parameters.require("app"), name = try context.parameters.require("name")
            _ = try await authenticator.require(.read, app: app, request)
            return try Self.json(try await results(app: app, name: name).jsonObject())
        }
        router.post("v1/apps/:app/experiments/:name/stop") { request, context in
            let app = try context.parameters.require("app"), name = try context.parameters.require("name")
            let key = try await authenticator.require(.admin, request)
            let body: Stop = try await AdminRoutes.decode(request)
            guard let keep = ExperimentArm(rawValue: body.keep) else { throw FieldError("keep", "must be control or treatment") }
            let experiment = try await Self.mapping { try await store.experiment(app: app, name: name) }
            guard experiment.status == "running" else {
                throw ProblemDetails(.conflict, detail: ExperimentStoreError.stopped(app: app, name: name, kept: experiment.kept?.rawValue ?? "?").description)
            }
            let decision = await engine.stopDecision(experiment).json
            let stopped = try await Self.mapping {
                try await store.stop(app: app, name: name, keep: keep, actor: "admin key \(key.id)", decision: decision)
            }
            await refreshNow(app)
            return try Self.json(stopped.jsonObject())
        }
    }

    /// An experiment's results now.
    func results(app: String, name: String) async throws -> ExperimentResults {
        let experiment = try await Self.mapping { try await store.experiment(app: app, name: name) }
        guard let reportApp = try await engine.readableApps(only: app).first else { throw ProblemDetails(.notFound, detail: "app: no app \"\(app)\"") }
        return try await engine.experimentResults(experiment, app: reportApp)
    }

    /// The app's switch decisions redone now, so a change serves at once here.
    func refreshNow(_ app: String) async {
        do {
            try await refresher.refresh(app: app)
        } catch {
            refresher.logger.warning("mediation refresh after an experiment change failed", metadata: ["app": "\(app)", "error": "\(error)"])
        }
    }

    static func json(_ object: Any, status: HTTPResponse.Status = .ok) throws -> Response {
        let data = try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes])
        return Response(status: status, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: data)))
    }

    /// Maps the stores' refusals onto problems.
    static func mapping<T>(_ body: () async throws -> T) async throws -> T {
        do {
            return try await body()
        } catch let error as ExperimentStoreError {
            switch error {
            case .unknownApp, .unknown: throw ProblemDetails(.notFound, detail: error.description)
            case .nameTaken, .placementBusy, .stopped: throw ProblemDetails(.conflict, detail: error.description)
            }
        }
    }
}
