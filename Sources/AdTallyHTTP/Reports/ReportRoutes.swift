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

    /// Creates the routes; `shares` keeps one key or address to its part of the report pool.
    public init(engine: ReportEngine, authenticator: KeyAuthenticator, shares: ReportShares) {
        self.engine = engine
        self.authenticator = authenticator
        self.shares = shares
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
                    // Refusals (422, a zone PostgreSQL does not know) must come before the
                    // 200 and the first byte: checked here, in a short transaction of its own.
                    try await engine.check(query)
                    return Response(status: .ok, headers: Self.csvHeaders(query), body: Self.csvBody(query, engine: engine, holding: place))
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

    /// The CSV, written as the engine fetches it: the header, then one chunk of rows at a
    /// time. `place` (the request's share of the report pool) is held until the body has
    /// been written, or dropped unwritten.
    static func csvBody(_ query: ReportQuery, engine: ReportEngine, holding place: ReportShares.Place) -> ResponseBody {
        ResponseBody { writer in
            defer { withExtendedLifetime(place) {} }
            let layout = ReportLayout(query: query)
            var out: [UInt8] = []
            out.reserveCapacity(1 << 16)
            ReportText.appendCSVRecord(layout.columns.map { .text($0.name) }, to: &out)
            var pending = out
            do {
                try await engine.stream(query) { _ in
                    try await writer.write(ByteBuffer(bytes: pending))
                    pending = []
                } rows: { rows in
                    out.removeAll(keepingCapacity: true)
                    for row in rows { layout.appendCSV(row, to: &out) }
                    try await writer.write(ByteBuffer(bytes: out))
                }
            } catch {
                // The 200 and part of the file are sent: all that is left is to cut the
                // connection (the client sees a truncated body, never a complete-looking
                // file) and to say why here, as nothing else will.
                let logger = Logger(label: "adtally.reports")
                if error is ChannelError {
                    // The client left, or stopped reading and was cut (WriteStallHandler): its own doing.
                    logger.notice("CSV report stream ended: the connection closed", metadata: ["error": "\(error)", "query": "\(query.canonicalText)"])
                } else {
                    logger.error("CSV report stream failed", metadata: ["error": "\(error)", "query": "\(query.canonicalText)"])
                }
                throw error
            }
            try await writer.finish(nil)
        }
    }
}
