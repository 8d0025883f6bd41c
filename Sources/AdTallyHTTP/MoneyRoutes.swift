import AdTallyCore
import AdTallyStorage
import Foundation
import Hummingbird
import NIOCore

/// Rate cards and FX rates over HTTP (DESIGN §3):
///
/// - `GET /v1/rates[?network=]`; `POST /v1/rates` with `{"rates": [...]}` or a rate card
///   CSV (`Content-Type: text/csv`); `DELETE /v1/rates?network=&format=&country=&effective_from=`.
/// - `GET /v1/fx[?currency=&base=&from=&to=]`; `POST /v1/fx` with `{"base", "rates":
///   [{"date", "currency", "rate"}], "fill_gaps"}` or an FX CSV (`?base=EUR&fill_gaps=true`);
///   `DELETE /v1/fx?date=&currency=&base=`.
///
/// Changes need an admin key; any read key may look (its reports are priced with them).
public struct MoneyRoutes: Sendable {
    let store: MoneyStore
    let authenticator: KeyAuthenticator

    /// Creates the routes.
    public init(store: MoneyStore, authenticator: KeyAuthenticator) {
        self.store = store
        self.authenticator = authenticator
    }

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
        router.get("v1/fx") { request, _ in
            _ = try await authenticator.require(.read, request)
            let parameters = request.uri.queryParameters
            for name in ["from", "to"] {
                if let value = parameters[Substring(name)], ReportQuery.parseDate(String(value)) == nil {
                    throw ProblemDetails(.badRequest, detail: "\(name): must be a date, YYYY-MM-DD")
                }
            }
            let rates = try await store.fxRates(
                currency: parameters["currency"].map(String.init), base: parameters["base"].map(String.init),
                from: parameters["from"].map(String.init), to: parameters["to"].map(String.init)
            )
            return try AdminRoutes.json(["rates": rates])
        }
        router.post("v1/fx") { request, _ in
            _ = try await authenticator.require(.admin, request)
            let parameters = request.uri.queryParameters
            let rates: [FXRate]
            let fillGaps: Bool
            if Self.isCSV(request) {
                let base = parameters["base"].map(String.init) ?? "EUR"
                rates = try FXRate.parseCSV(try await Self.body(request).readableBytesView, base: base)
                fillGaps = parameters["fill_gaps"] == "true"
            } else {
                let body: FXBody = try await AdminRoutes.decode(request, upTo: Self.maxImportBytes)
                let base = body.base ?? "EUR"
                var parsed: [FXRate] = []
                for (index, input) in body.rates.enumerated() {
                    do {
                        parsed.append(try FXRate.parse(date: input.date, base: base, currency: input.currency, rate: input.rate))
                    } catch let error as MoneyTableError {
                        throw MoneyTableError("rates[\(index)].\(error.field)", error.rule)
                    }
                }
                rates = parsed
                fillGaps = body.fillGaps ?? false
            }
            return try AdminRoutes.json(try await store.importFX(rates, fillGaps: fillGaps))
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
