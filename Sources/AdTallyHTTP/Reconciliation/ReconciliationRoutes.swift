import AdTallyCore
import AdTallyStorage
import Foundation
import Hummingbird
import NIOCore
import Synchronization

/// The networks' own reports and the discrepancy report over HTTP (DESIGN §11):
///
/// - `GET /v1/reconciliation`: the report's parameters (apps, from/to or days,
///   dimensions of date, app, network, format, country, their filters, currency,
///   format), JSON or CSV; any read key for its apps.
/// - `POST /v1/network-reports?source=admob|max|levelplay|csv[&timezone=]` with the
///   network's file as the body (up to 32 MiB), all or none; `GET /v1/network-reports`
///   lists the imports.
/// - `GET|PUT|DELETE /v1/network-mappings`: the networks' names for apps and networks.
/// - `GET /v1/network-settings`, `PUT /v1/network-settings/{network}`: tolerance,
///   restatement window and revenue policy.
/// - `GET /v1/network-pulls`, `PUT|DELETE /v1/network-pulls/{name}`, `POST
///   /v1/network-pulls/{name}/run`, `GET /v1/network-pulls/runs`: pulls from the
///   networks' APIs (the credential goes in, never out).
///
/// Everything but the discrepancy report needs an admin key.
public struct ReconciliationRoutes: Sendable {
    let engine: ReconciliationEngine
    let reports: ReportEngine
    let store: NetworkReportStore
    let authenticator: KeyAuthenticator
    let shares: ReportShares
    let pulls: NetworkPulls
    /// One import is read at a time per server: a report is decoded whole (up to
    /// `NetworkReport.maxBytes`), so this is what bounds the memory imports take.
    let importing = ImportGate()

    final class ImportGate: Sendable {
        let busy = Mutex(false)
        func enter() -> Bool { busy.withLock { busy in busy ? false : { busy = true; return true }() } }
        func leave() { busy.withLock { $0 = false } }
    }

    /// Creates the routes; imports and settings go through `store`, the report through `engine`.
    public init(engine: ReconciliationEngine, reports: ReportEngine, store: NetworkReportStore, pulls: NetworkPulls, authenticator: KeyAuthenticator, shares: ReportShares) {
        self.pulls = pulls
        self.engine = engine
        self.reports = reports
        self.store = store
        self.authenticator = authenticator
        self.shares = shares
    }

    struct MappingsBody: Decodable { var mappings: [NetworkReportStore.Mapping] }
    struct PullBody: Decodable {
        var source: String
        var endpoint: String
        var credential: String
        var restatementDays: Int?
        enum CodingKeys: String, CodingKey {
            case source, endpoint, credential
            case restatementDays = "restatement_days"
        }
    }
    struct SettingsBody: Decodable {
        var tolerancePct: Double?
        var finalAfterDays: Int?
        var revenueSource: String?
        enum CodingKeys: String, CodingKey {
            case tolerancePct = "tolerance_pct"
            case finalAfterDays = "final_after_days"
            case revenueSource = "revenue_source"
        }
    }

    /// Adds the routes to a router.
    public func register(on router: Routes) {
        router.get("v1/reconciliation") { request, context in
            let key = try await authenticator.require(.read, request)
            let place = try shares.enter(keyID: key.id, channel: context.channel)
            defer { withExtendedLifetime(place) {} }
            let readable = try await reports.readableApps(only: key.app)
            let parameters = request.uri.queryParameters.map { (String($0.key), String($0.value)) }
            let acceptsCSV = request.headers[.accept].map(ReportRoutes.prefersCSV) ?? false
            do {
                let query = try ReconciliationQuery.parse(parameters, readable: readable, isAdmin: key.app == nil, acceptsCSV: acceptsCSV)
                let document = try await engine.run(query)
                if query.report.format == .csv {
                    let name = "adtally-reconciliation-\(ReportQuery.formatDate(query.report.from))-\(ReportQuery.formatDate(query.report.to)).csv"
                    return Response(
                        status: .ok, headers: [.contentType: "text/csv; charset=utf-8; header=present", .contentDisposition: "attachment; filename=\"\(name)\""],
                        body: .init(byteBuffer: ByteBuffer(bytes: document.csv()))
                    )
                }
                return Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: document.json())))
            } catch let error as ReportQueryError {
                throw ReportRoutes.problem(error)
            } catch let error as ReportCurrencyError {
                throw ProblemDetails(.unprocessableContent, title: "FX rate missing", detail: error.description)
            }
        }
        router.post("v1/network-reports") { request, _ in
            _ = try await authenticator.require(.admin, request)
            let parameters = request.uri.queryParameters
            guard let text = parameters["source"], let source = NetworkReportSource(rawValue: String(text)) else {
                throw ProblemDetails(.badRequest, detail: "source: is required, one of \(NetworkReportSource.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            guard importing.enter() else {
                throw ProblemDetails(.tooManyRequests, detail: "another network report is being imported on this server; retry when it is done")
            }
            defer { importing.leave() }
            var body: ByteBuffer
            do {
                body = try await request.body.collect(upTo: NetworkReport.maxBytes)
            } catch is NIOTooManyBytesError {
                throw ProblemDetails(.contentTooLarge, detail: "the body is larger than \(NetworkReport.maxBytes) bytes; split the report by month")
            }
            let bytes = Array(body.readableBytesView)
            body = ByteBuffer()  // one copy of the file, not two
            let sha256 = SHA256.hex(bytes)
            let replaceZone: Bool
            switch parameters["replace_zone"].map(String.init) {
            case nil, "false": replaceZone = false
            case "true": replaceZone = true
            case let other?: throw ProblemDetails(.badRequest, detail: "replace_zone: must be true or false, not \"\(other.prefix(20))\"")
            }
            let report = try NetworkReport.parse(consume bytes, source: source, zone: parameters["timezone"].map(String.init))
            let result = try await store.importReport(report, fileSHA256: sha256, via: "api", replaceZone: replaceZone)
            return try AdminRoutes.json(result, status: .created)
        }
        router.get("v1/network-reports") { request, _ in
            _ = try await authenticator.require(.admin, request)
            return try AdminRoutes.json(["imports": try await store.imports()])
        }
        router.get("v1/network-mappings") { request, _ in
            _ = try await authenticator.require(.admin, request)
            let source = try request.uri.queryParameters["source"].map { text in
                guard let source = NetworkReportSource(rawValue: String(text)) else { throw ProblemDetails(.badRequest, detail: "source: must be one of \(NetworkReportSource.allCases.map(\.rawValue).joined(separator: ", "))") }
                return source
            }
            return try AdminRoutes.json(["mappings": try await store.mappings(source: source)])
        }
        router.on(.put, "v1/network-mappings") { request, _ in
            _ = try await authenticator.require(.admin, request)
            let body: MappingsBody = try await AdminRoutes.decode(request)
            return try AdminRoutes.json(["stored": try await store.setMappings(body.mappings)])
        }
        router.delete("v1/network-mappings") { request, _ in
            _ = try await authenticator.require(.admin, request)
            let parameters = request.uri.queryParameters
            guard let source = parameters["source"].flatMap({ NetworkReportSource(rawValue: String($0)) }),
                  let kind = parameters["kind"].flatMap({ NetworkReportStore.Mapping.Kind(rawValue: String($0)) }),
                  let external = parameters["external"] else {
                throw ProblemDetails(.badRequest, detail: "source, kind (app or network) and external: are required")
            }
            guard try await store.deleteMapping(source: source, kind: kind, external: String(external)) else {
                throw ProblemDetails(.notFound, detail: "no such mapping")
            }
            return Response(status: .noContent)
        }
        router.get("v1/network-settings") { request, _ in
            _ = try await authenticator.require(.admin, request)
            return try AdminRoutes.json(["settings": try await store.settings()])
        }
        router.on(.put, "v1/network-settings/:network") { request, context in
            _ = try await authenticator.require(.admin, request)
            let network = try context.parameters.require("network")
            let body: SettingsBody = try await AdminRoutes.decode(request)
            return try AdminRoutes.json(try await store.setSettings(network: network, tolerancePct: body.tolerancePct, finalAfterDays: body.finalAfterDays, revenueSource: body.revenueSource))
        }
        router.get("v1/network-pulls") { request, _ in
            _ = try await authenticator.require(.admin, request)
            return try AdminRoutes.json(["pulls": try await pulls.list()])
        }
        router.get("v1/network-pulls/runs") { request, _ in
            _ = try await authenticator.require(.admin, request)
            let limit = try request.uri.queryParameters.get("limit").map { text in
                guard let value = Int(text), (1...10_000).contains(value) else { throw ProblemDetails(.badRequest, detail: "limit: must be a whole number from 1 to 10000") }
                return value
            } ?? 100
            return try AdminRoutes.json(["runs": try await pulls.runs(request.uri.queryParameters.get("pull"), limit: limit)])
        }
        router.on(.put, "v1/network-pulls/:name") { request, context in
            _ = try await authenticator.require(.admin, request)
            let name = try context.parameters.require("name")
            let body: PullBody = try await AdminRoutes.decode(request)
            guard let source = NetworkReportSource(rawValue: body.source) else { throw FieldError("source", "must be admob, max or levelplay") }
            return try AdminRoutes.json(try await pulls.save(NetworkPull(name: name, source: source, endpoint: body.endpoint, restatementDays: body.restatementDays ?? 3), credential: body.credential))
        }
        router.delete("v1/network-pulls/:name") { request, context in
            _ = try await authenticator.require(.admin, request)
            guard try await pulls.delete(try context.parameters.require("name")) else { throw ProblemDetails(.notFound, detail: "no such pull") }
            return Response(status: .noContent)
        }
        router.post("v1/network-pulls/:name/run") { request, context in
            _ = try await authenticator.require(.admin, request)
            do {
                guard let run = try await pulls.requestRun(try context.parameters.require("name")) else { throw ProblemDetails(.notFound, detail: "no such pull") }
                return try AdminRoutes.json(run, status: .accepted)
            } catch let paused as NetworkPulls.Paused {
                throw ProblemDetails(.conflict, detail: paused.description)
            }
        }
    }
}
