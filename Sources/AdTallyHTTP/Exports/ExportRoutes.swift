import AdTallyCore
import AdTallyStorage
import Foundation
import Hummingbird

/// Scheduled exports over HTTP (DESIGN §5), admin keys only:
///
/// - `GET /v1/exports`; `POST /v1/exports` with `{"name", "cron", "tz", "format", "dir",
///   "query": {report parameters}}` (201, or a 400 naming the field);
/// - `GET /v1/exports/{name}`, `DELETE /v1/exports/{name}`;
/// - `POST /v1/exports/{name}/pause`, `/resume`, `/run` (`{"slot"}` optional: start a failed slot again);
/// - `GET /v1/exports/{name}/runs?limit=` and `GET /v1/exports/runs` for every schedule.
///
/// The directory is checked on this server; every server that may run exports must see
/// the same path (a shared mount) — the runner is whichever server leads.
public struct ExportRoutes: Sendable {
    let store: ExportStore
    let engine: ReportEngine
    let authenticator: KeyAuthenticator
    let exportsRoot: String

    /// Creates the routes.
    public init(store: ExportStore, engine: ReportEngine, authenticator: KeyAuthenticator, exportsRoot: String) {
        self.exportsRoot = exportsRoot
        self.store = store
        self.engine = engine
        self.authenticator = authenticator
    }

    struct CreateBody: Decodable {
        var name: String
        var cron: String
        var tz: String?
        var format: String?
        var dir: String
        var query: [String: String]?
        var kind: String?
    }

    struct RunBody: Decodable {
        var slot: String?
    }

    /// Adds the routes to a router.
    public func register(on router: Routes) {
        router.get("v1/exports") { request, _ in
            _ = try await authenticator.require(.admin, request)
            return try AdminRoutes.json(["exports": try await store.list()])
        }
        router.post("v1/exports") { request, _ in
            _ = try await authenticator.require(.admin, request)
            let body: CreateBody = try await AdminRoutes.decode(request)
            guard let format = ExportFormat(rawValue: body.format ?? "csv") else {
                throw ProblemDetails(.badRequest, detail: "format: must be csv or json")
            }
            guard let kind = ExportKind(rawValue: body.kind ?? "report") else {
                throw ProblemDetails(.badRequest, detail: "kind: must be report or reconciliation")
            }
            var schedule = ExportSchedule(
                name: body.name, query: body.query ?? [:], format: format, cron: body.cron, timezone: body.tz ?? "UTC", directory: body.dir
            )
            schedule.kind = kind
            return try await Self.mapping {
                try AdminRoutes.json(try await store.create(schedule, readable: try await engine.readableApps(only: nil), exportsRoot: exportsRoot), status: .created)
            }
        }
        router.get("v1/exports/runs") { request, _ in
            _ = try await authenticator.require(.admin, request)
            return try AdminRoutes.json(["runs": try await store.runs(nil, limit: try Self.limit(request))])
        }
        router.get("v1/exports/:name") { request, context in
            _ = try await authenticator.require(.admin, request)
            let name = try context.parameters.require("name")
            return try await Self.mapping { try AdminRoutes.json(try await store.schedule(name)) }
        }
        router.delete("v1/exports/:name") { request, context in
            _ = try await authenticator.require(.admin, request)
            let name = try context.parameters.require("name")
            return try await Self.mapping {
                try await store.delete(name)
                return Response(status: .noContent)
            }
        }
        for (action, paused) in [("pause", true), ("resume", false)] {
            router.post("v1/exports/:name/\(action)") { request, context in
                _ = try await authenticator.require(.admin, request)
                let name = try context.parameters.require("name")
                return try await Self.mapping { try AdminRoutes.json(try await store.setPaused(name, paused)) }
            }
        }
        router.post("v1/exports/:name/run") { request, context in
            _ = try await authenticator.require(.admin, request)
            let name = try context.parameters.require("name")
            let body: RunBody = request.headers[.contentLength] == "0" || request.headers[.contentLength] == nil && request.headers[.transferEncoding] == nil
                ? RunBody() : try await AdminRoutes.decode(request)
            return try await Self.mapping { try AdminRoutes.json(try await store.requestRun(name, slot: body.slot), status: .accepted) }
        }
        router.get("v1/exports/:name/runs") { request, context in
            _ = try await authenticator.require(.admin, request)
            let name = try context.parameters.require("name")
            let limit = try Self.limit(request)
            return try await Self.mapping { try AdminRoutes.json(["runs": try await store.runs(name, limit: limit)]) }
        }
    }

    static func limit(_ request: Request) throws -> Int {
        guard let text = request.uri.queryParameters["limit"] else { return 50 }
        guard let value = Int(text), (1...10_000).contains(value) else {
            throw ProblemDetails(.badRequest, detail: "limit: must be a whole number from 1 to 10000")
        }
        return value
    }

    /// Maps the store's refusals onto problems.
    static func mapping(_ body: () async throws -> Response) async throws -> Response {
        do {
            return try await body()
        } catch let error as ExportStoreError {
            switch error {
            case .exists, .slotTaken, .paused: throw ProblemDetails(.conflict, detail: error.description)
            case .unknown, .unknownRun: throw ProblemDetails(.notFound, detail: error.description)
            }
        }
    }
}
