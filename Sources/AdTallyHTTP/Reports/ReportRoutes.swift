import AdTallyCore
import AdTallyStorage
import Foundation
import Hummingbird
import Logging
import NIOCore

/// `GET /v1/reports` (DESIGN §4): JSON pages with totals and notes, or CSV streamed
/// from the database to the socket. A read key reads its own app, an admin key every
/// app; an ingest key reads nothing.
public struct ReportRoutes: Sendable {
    let engine: ReportEngine
    let authenticator: KeyAuthenticator
    let shares: ReportShares
    let streamLimits: ReportStreamLimits

    /// Creates the routes; `shares` keeps one key or address to its part of the report
    /// pool, `streamLimits` a CSV reader to a stated rate and lifetime.
    public init(engine: ReportEngine, authenticator: KeyAuthenticator, shares: ReportShares, streamLimits: ReportStreamLimits = .init()) {
        self.engine = engine
        self.authenticator = authenticator
        self.shares = shares
        self.streamLimits = streamLimits
    }

    /// Adds the routes to a router.
    public func register(on router: Routes) {
        router.get("v1/reports") { request, context in
            let key = try await authenticator.require(.read, request)
            let place = try shares.enter(keyID: key.id, channel: context.channel)
            let readable = try await engine.readableApps(only: key.app)
            let parameters = request.uri.queryParameters.map { (String($0.key), String($0.value)) }
            let acceptsCSV = request.headers[.accept].map(Self.prefersCSV) ?? false
            let query: ReportQuery
            do {
                query = try ReportQuery.parse(parameters, readable: readable, isAdmin: key.app == nil, acceptsCSV: acceptsCSV)
            } catch let error as ReportQueryError {
                throw Self.problem(error)
            }
            do {
                switch query.format {
                case .json:
                    let document = try await engine.page(query)
                    withExtendedLifetime(place) {}
                    return Response(
                        status: .ok, headers: [.contentType: "application/json"],
                        body: .init(byteBuffer: ByteBuffer(bytes: document.json()))
                    )
                case .csv:
                    // Refusals (422, a zone PostgreSQL does not know) come before the 200
                    // and the first byte, from the stream's own snapshot.
                    return try await Self.csvResponse(
                        request, query, engine: engine, holding: place, channel: context.channel, limits: streamLimits, headers: Self.csvHeaders(query)
                    )
                }
            } catch let error as ReportQueryError {
                throw Self.problem(error)
            } catch let error as ReportCurrencyError {
                throw ProblemDetails(.unprocessableContent, title: "FX rate missing", detail: error.description)
            }
        }
    }

    static func problem(_ error: ReportQueryError) -> ProblemDetails {
        switch error.kind {
        case .forbidden: ProblemDetails(.forbidden, detail: error.description)
        case .tooLarge: ProblemDetails(.unprocessableContent, title: "Report too large", detail: error.description)
        case .invalid: ProblemDetails(.badRequest, detail: error.description)
        }
    }

    /// Whether an Accept header ranks text/csv above JSON.
    static func prefersCSV(_ accept: String) -> Bool {
        var best: (csv: Double, json: Double) = (0, 0)
        for item in accept.split(separator: ",") {
            let parts = item.split(separator: ";").map { $0.trimmingCharacters(in: .whitespaces).lowercased() }
            guard let type = parts.first else { continue }
            let quality = parts.dropFirst().first { $0.hasPrefix("q=") }.flatMap { Double($0.dropFirst(2)) } ?? 1
            if type == "text/csv" { best.csv = max(best.csv, quality) }
            if type == "application/json" || type == "*/*" || type == "application/*" { best.json = max(best.json, quality) }
        }
        return best.csv > 0 && best.csv >= best.json
    }

    static func csvHeaders(_ query: ReportQuery) -> HTTPFields {
        let name = "adtally-report-\(ReportQuery.formatDate(query.from))-\(ReportQuery.formatDate(query.to)).csv"
        return [.contentType: "text/csv; charset=utf-8; header=present", .contentDisposition: "attachment; filename=\"\(name)\""]
    }
}
