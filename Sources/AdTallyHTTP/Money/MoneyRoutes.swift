import AdTallyCore
import AdTallyStorage
import Foundation
import Hummingbird
import NIOCore

/// Rate cards and FX rates over HTTP (DESIGN §3):
///
/// - `GET /v1/rates[?network=]`; `POST /v1/rates` with `{"rates": [...]}` or a rate card
///   CSV (`Content-Type: text/csv`); `DELETE /v1/rates?network=&format=&country=&effective_from=`.
/// - `GET /v1/fx[?currency=&base=&from=&to=&limit=&cursor=]`, a page at a time (default
///   the last 31 days); `POST /v1/fx` with `{"base", "rates": [{"date", "currency",
///   "rate"}], "fill_gaps"}` (up to 1 MiB) or an FX CSV (`?base=EUR&fill_gaps=true`, up to
///   16 MiB, loaded as it is parsed); `DELETE /v1/fx?date=&currency=&base=`.
///
/// Changes need an admin key; any read key may look (its reports are priced with them).
public struct MoneyRoutes: Sendable {
    let store: MoneyStore
    /// Where the lists read: the report pool, not the connections ingest commits with.
    let reads: MoneyStore
    /// Where imports run: a connection of their own, off the ingest connections.
    let imports: MoneyStore
    let authenticator: KeyAuthenticator
    /// The FX list reads on the report pool: one key or address gets its share of it.
    let shares: ReportShares

    /// Creates the routes: changes through `store`, lists through `reads`, bulk imports through `imports`.
    public init(store: MoneyStore, reads: MoneyStore, imports: MoneyStore, authenticator: KeyAuthenticator, shares: ReportShares) {
        self.store = store
        self.shares = shares
        self.reads = reads
        self.imports = imports
        self.authenticator = authenticator
    }

    /// Most FX rates one `GET /v1/fx` page holds, and the default.
    static let maxFXPage = 10_000
    static let defaultFXPage = 1_000
    /// Days `GET /v1/fx` lists when no range is given: the last 31.
    static let defaultFXDays = 31
    /// Most bytes of a JSON FX body: the JSON is decoded whole, so bulk loads come as CSV.
    static let maxFXJSONBytes = 1 << 20

    struct RatesBody: Decodable {
        var rates: [RateCardEntry]
    }

    struct FXBody: Decodable {
        var base: String?
        var rates: [FXInput]
        var fillGaps: Bool?

        enum CodingKeys: String, CodingKey {
            case base, rates
            case fillGaps = "fill_gaps"
        }
    }

    struct FXInput: Decodable {
        var date: String
        var currency: String
        var rate: String

        init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            date = try container.decode(String.self, forKey: .date)
            currency = try container.decode(String.self, forKey: .currency)
            rate = try container.decimalText(forKey: .rate)
        }

        enum CodingKeys: String, CodingKey { case date, currency, rate }
    }

    /// Most bytes of an import body (a rate card or years of ECB rates).
    static let maxImportBytes = 16 << 20

    /// Adds the routes to a router.
    public func register(on router: Routes) {
        router.get("v1/rates") { request, _ in
            _ = try await authenticator.require(.read, request)
            let network = request.uri.queryParameters["network"].map(String.init)
            if let network, !EventValidator.isNetworkName(network) {
                throw ProblemDetails(.badRequest, detail: "network: must match [a-z0-9_.-]{1,32}")
            }
            return try AdminRoutes.json(["rates": try await store.rates(network: network)])
        }
        router.post("v1/rates") { request, _ in
            _ = try await authenticator.require(.admin, request)
            let entries: [RateCardEntry]
            if Self.isCSV(request) {
                entries = try RateCardEntry.parseCSV(try await Self.body(request).readableBytesView)
            } else {
                let body: RatesBody = try await AdminRoutes.decode(request, upTo: Self.maxImportBytes)
                entries = body.rates
            }
            return try AdminRoutes.json(["stored": try await store.setRates(entries)])
        }
        router.delete("v1/rates") { request, _ in
            _ = try await authenticator.require(.admin, request)
            let parameters = request.uri.queryParameters
            func required(_ name: String) throws -> String {
                guard let value = parameters[Substring(name)] else { throw ProblemDetails(.badRequest, detail: "\(name): is required") }
                return String(value)
            }
            let found = try await store.deleteRate(
                network: try required("network"), format: try required("format"),
                country: parameters["country"].map(String.init) ?? "*", effectiveFrom: try required("effective_from")
            )
            guard found else { throw ProblemDetails(.notFound, detail: "no such rate card entry") }
            return Response(status: .noContent)
        }
        router.get("v1/fx") { request, context in
            let key = try await authenticator.require(.read, request)
            let place = try shares.enter(keyID: key.id, channel: context.channel)
            defer { withExtendedLifetime(place) {} }
            let parameters = request.uri.queryParameters
            func date(_ name: String) throws -> Int? {
                guard let value = parameters[Substring(name)] else { return nil }
                guard let day = ReportQuery.parseDate(String(value)) else { throw ProblemDetails(.badRequest, detail: "\(name): must be a date, YYYY-MM-DD") }
                return day
            }
            func code(_ name: String) throws -> String? {
                guard let value = parameters[Substring(name)] else { return nil }
                guard let code = ISOCodes.currency(String(value)) else { throw ProblemDetails(.badRequest, detail: "\(name): must be an ISO 4217 code (USD, EUR)") }
                return code
            }
            let today = Int((Date().timeIntervalSince1970 / 86_400).rounded(.down))
            let to = try date("to") ?? (try date("from")).map { $0 + Self.defaultFXDays - 1 } ?? today
            let from = try date("from") ?? to - Self.defaultFXDays + 1
            guard from <= to else { throw ProblemDetails(.badRequest, detail: "from: must not be after to") }
            var limit = Self.defaultFXPage
            if let text = parameters["limit"] {
                guard let value = Int(text), (1...Self.maxFXPage).contains(value) else {
                    throw ProblemDetails(.badRequest, detail: "limit: must be a whole number from 1 to \(Self.maxFXPage)")
                }
                limit = value
            }
            let after = try parameters["cursor"].map { try Self.fxCursor(String($0)) }
            let (rates, next) = try await reads.fxRates(
                currency: try code("currency"), base: try code("base"), from: ReportQuery.formatDate(from), to: ReportQuery.formatDate(to),
                limit: limit, after: after
            )
            struct Page: Encodable {
                var rates: [FXRate]
                var from: String
                var to: String
                var nextCursor: String?
                enum CodingKeys: String, CodingKey {
                    case rates, from, to
                    case nextCursor = "next_cursor"
                }
                func encode(to encoder: any Encoder) throws {
                    var container = encoder.container(keyedBy: CodingKeys.self)
                    try container.encode(rates, forKey: .rates)
                    try container.encode(from, forKey: .from)
                    try container.encode(to, forKey: .to)
                    try container.encode(nextCursor, forKey: .nextCursor)
                }
            }
            let cursor = next.map { "\($0.date).\($0.currency).\($0.base)" }
            return try AdminRoutes.json(Page(rates: rates, from: ReportQuery.formatDate(from), to: ReportQuery.formatDate(to), nextCursor: cursor))
        }
        router.post("v1/fx") { request, _ in
            _ = try await authenticator.require(.admin, request)
            let parameters = request.uri.queryParameters
            if Self.isCSV(request) {
                let base = parameters["base"].map(String.init) ?? "EUR"
                let body = try await Self.body(request)
                let (result, _) = try await imports.importFX(csv: Array(body.readableBytesView), base: base, fillGaps: parameters["fill_gaps"] == "true")
                return try AdminRoutes.json(result)
            }
            let body: FXBody = try await AdminRoutes.decode(request, upTo: Self.maxFXJSONBytes)
            let base = body.base ?? "EUR"
            var rates: [FXRate] = []
            for (index, input) in body.rates.enumerated() {
                do {
                    rates.append(try FXRate.parse(date: input.date, base: base, currency: input.currency, rate: input.rate))
                } catch let error as MoneyTableError {
                    throw MoneyTableError("rates[\(index)].\(error.field)", error.rule)
                }
            }
            return try AdminRoutes.json(try await imports.importFX(rates, fillGaps: body.fillGaps ?? false))
        }
        router.delete("v1/fx") { request, _ in
            _ = try await authenticator.require(.admin, request)
            let parameters = request.uri.queryParameters
            guard let date = parameters["date"], let currency = parameters["currency"] else {
                throw ProblemDetails(.badRequest, detail: "date and currency: are required (base: default EUR)")
            }
            let found = try await store.deleteFX(date: String(date), currency: String(currency), base: parameters["base"].map(String.init) ?? "EUR")
            guard found else { throw ProblemDetails(.notFound, detail: "no such FX rate") }
            return Response(status: .noContent)
        }
    }

    /// The key after which a `GET /v1/fx` page starts: `DAY.CURRENCY.BASE` of the previous page's last rate.
    static func fxCursor(_ text: String) throws -> (day: String, currency: String, base: String) {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        guard parts.count == 3, let day = ReportQuery.parseDate(parts[0]), ISOCodes.isCurrency(parts[1]), ISOCodes.isCurrency(parts[2]) else {
            throw ProblemDetails(.badRequest, detail: "cursor: not a cursor this server made; use next_cursor from the previous page as it is")
        }
        return (ReportQuery.formatDate(day), parts[1], parts[2])
    }

    static func isCSV(_ request: Request) -> Bool {
        request.headers[.contentType]?.lowercased().hasPrefix("text/csv") ?? false
    }

    static func body(_ request: Request) async throws -> ByteBuffer {
        do {
            return try await request.body.collect(upTo: maxImportBytes)
        } catch is NIOTooManyBytesError {
            throw ProblemDetails(.contentTooLarge, detail: "the body is larger than \(maxImportBytes) bytes")
        }
    }
}
