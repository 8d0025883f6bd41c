import AdTallyCore
import AdTallyStorage
import Foundation
import HTTPTypes
import Hummingbird

/// The mediation switch over HTTP (DESIGN §9):
///
/// - `GET /v1/apps/{app}/mediation?placement=&country=` with any of the app's keys (the
///   ingest key apps ship with included): the decision served from memory, with `ETag`
///   and `Cache-Control: max-age`; `If-None-Match` with a current tag answers 304;
///   `GET /v1/mediation` the same for the key's own app (AdTallyKit reads this one);
/// - `GET`/`PUT`/`DELETE /v1/apps/{app}/mediation/policies` (admin keys change; the
///   app's read key may list) and `GET /v1/apps/{app}/mediation/history?limit=`.
public struct MediationRoutes: Sendable {
    let store: MediationStore
    let refresher: MediationRefresher
    let authenticator: KeyAuthenticator

    /// Creates the routes.
    public init(store: MediationStore, refresher: MediationRefresher, authenticator: KeyAuthenticator) {
        self.store = store
        self.refresher = refresher
        self.authenticator = authenticator
    }

    /// Adds the routes to a router.
    public func register(on router: Routes) {
        router.get("v1/apps/:app/mediation") { request, context in
            let app = try context.parameters.require("app")
            _ = try await authenticator.require(anyKeyOf: app, request)
            let (scope, device) = try Self.switchQuery(app: app, request)
            return try serve(refresher.lookup(app: app, placement: scope.placement, country: scope.country, device: device), app: app, request)
        }
        // The same answer for the key's own app: what AdTallyKit reads, since an app ships
        // with its key and need not know its app id.
        router.get("v1/mediation") { request, _ in
            let app = try await authenticator.requireApp(request)
            let (scope, device) = try Self.switchQuery(app: app, request)
            return try serve(refresher.lookup(app: app, placement: scope.placement, country: scope.country, device: device), app: app, request)
        }
        router.get("v1/apps/:app/mediation/policies") { request, context in
            let app = try context.parameters.require("app")
            _ = try await authenticator.require(.read, app: app, request)
            return try AdminRoutes.json(["policies": try await store.policies(app: app)])
        }
        router.on(.put, "v1/apps/:app/mediation/policies") { request, context in
            let app = try context.parameters.require("app")
            let key = try await authenticator.require(.admin, request)
            var policy: MediationPolicy = try await AdminRoutes.decode(request)
            guard policy.scope.app.isEmpty || policy.scope.app == app else {
                throw ProblemDetails(.badRequest, detail: "app: \"\(policy.scope.app)\" differs from the path's app \"\(app)\"; leave it out")
            }
            policy.scope.app = app
            let saved = try await Self.mapping { try await store.set(policy, actor: "admin key \(key.id)") }
            return try AdminRoutes.json(try await decided(saved.scope))
        }
        router.delete("v1/apps/:app/mediation/policies") { request, context in
            let app = try context.parameters.require("app")
            let key = try await authenticator.require(.admin, request)
            let scope = try Self.scope(app: app, request)
            try await Self.mapping { try await store.delete(scope, actor: "admin key \(key.id)") }
            await refreshNow(app)
            return Response(status: .noContent)
        }
        router.get("v1/apps/:app/mediation/history") { request, context in
            let app = try context.parameters.require("app")
            _ = try await authenticator.require(.read, app: app, request)
            return try AdminRoutes.json(["changes": try await store.history(app: app, limit: try ExportRoutes.limit(request))])
        }
    }

    /// Decides an app's policies at once (a change through this server serves at once;
    /// other servers pick it up within their refresh interval), then reads one back.
    func decided(_ scope: MediationScope) async throws -> StoredMediationPolicy {
        var policies = await refreshNow(scope.app)
        if policies == nil { policies = try await store.policies(app: scope.app) }
        guard let stored = policies?.first(where: { $0.policy.scope == scope }) else {
            throw ProblemDetails(.notFound, detail: MediationStoreError.unknownPolicy(scope).description)
        }
        return stored
    }

    /// The app's policies as decided now; nil when that failed (logged).
    @discardableResult
    func refreshNow(_ app: String) async -> [StoredMediationPolicy]? {
        do {
            return try await refresher.refresh(app: app)
        } catch {
            refresher.logger.warning("mediation refresh after a policy change failed", metadata: ["app": "\(app)", "error": "\(error)"])
            return nil
        }
    }

    /// The answer for a lookup: 200 with a body drawn by weight, or 304 when the client
    /// holds a current one.
    func serve(_ lookup: MediationRefresher.Lookup, app: String, _ request: Request) throws -> Response {
        switch lookup {
        case .notLoaded:
            throw ProblemDetails(
                .serviceUnavailable, detail: "the mediation decisions are not loaded yet (the server has just started or cannot reach its database); retry shortly",
                headers: [.retryAfter: "5"]
            )
        case .noPolicy:
            throw ProblemDetails(
                .notFound,
                detail: "no mediation policy answers this request for app \"\(app)\"; set one with PUT /v1/apps/\(app)/mediation/policies or adtally mediation set \(app)"
            )
        case .served(let decision):
            let cacheControl = "max-age=\(decision.maxAgeSeconds)"
            if let ifNoneMatch = request.headers[.ifNoneMatch], let held = decision.variant(matching: ifNoneMatch) {
                return Response(status: .notModified, headers: [.eTag: held.etag, .cacheControl: cacheControl])
            }
            var generator = SystemRandomNumberGenerator()
            return Self.response(decision.draw(using: &generator), cacheControl: cacheControl)
        case .experiment(let decision, let answer):
            // The device's own arm and network: a 304 only for the tag of that answer (a
            // tag held from before the experiment, or of another network, gets the new one).
            let cacheControl = "max-age=\(decision.maxAgeSeconds)"
            let experiment = "\(answer.experiment); arm=\(answer.arm.rawValue)"
            if let ifNoneMatch = request.headers[.ifNoneMatch], decision.variant(matching: ifNoneMatch)?.etag == answer.variant.etag {
                return Response(status: .notModified, headers: [.eTag: answer.variant.etag, .cacheControl: cacheControl, Self.experimentHeader: experiment])
            }
            var response = Self.response(answer.variant, cacheControl: cacheControl)
            response.headers[Self.experimentHeader] = experiment
            return response
        }
    }

    /// Names the experiment and arm of an answer given under one.
    static let experimentHeader = HTTPField.Name("AdTally-Experiment")!

    /// A 200 with a variant's body.
    static func response(_ variant: ServedMediation.Variant, cacheControl: String) -> Response {
        Response(
            status: .ok, headers: [.contentType: "application/json", .eTag: variant.etag, .cacheControl: cacheControl],
            body: variant.rest.readableBytes == 0 ? .init(byteBuffer: variant.head) : .init(contentsOf: [variant.head, variant.rest])
        )
    }

    /// The scope and the device (the kit's per-install id, checked as events check theirs)
    /// of a switch request.
    static func switchQuery(app: String, _ request: Request) throws -> (MediationScope, String?) {
        var device: String?
        var rest: [(String, String)] = []
        for (name, value) in request.uri.queryParameters {
            if name == "device" {
                guard device == nil else { throw ProblemDetails(.badRequest, detail: "device: given twice") }
                // (Query values arrive percent-decoded.)
                guard DeviceErasure.isDevice(String(value)) else { throw ProblemDetails(.badRequest, detail: "device: \(DeviceErasure.deviceRule)") }
                device = String(value)
            } else {
                rest.append((String(name), String(value)))
            }
        }
        return (try scope(app: app, rest, allowed: "country, device, placement"), device)
    }

    /// The placement and country of a request's query (nil: not given), checked.
    static func scope(app: String, _ request: Request) throws -> MediationScope {
        try scope(app: app, request.uri.queryParameters.map { (String($0.key), String($0.value)) }, allowed: "country, placement")
    }

    static func scope(app: String, _ parameters: [(String, String)], allowed: String) throws -> MediationScope {
        var scope = MediationScope(app: app)
        for (name, value) in parameters {
            switch name {
            case "placement": scope.placement = value
            case "country": scope.country = value
            default: throw ProblemDetails(.badRequest, detail: "\(name): unknown parameter; allowed: \(allowed)")
            }
        }
        return try scope.validated()
    }

    /// Maps the store's refusals onto problems.
    @discardableResult
    static func mapping<T>(_ body: () async throws -> T) async throws -> T {
        do {
            return try await body()
        } catch let error as MediationStoreError {
            if case .experimentRunning = error { throw ProblemDetails(.conflict, detail: error.description) }
            throw ProblemDetails(.notFound, detail: error.description)
        }
    }
}
