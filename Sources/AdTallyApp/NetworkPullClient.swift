import AdTallyCore
import AdTallyStorage
import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1

/// Asks a network's reporting API for its report, in the shape each one documents
/// (DESIGN §11), and returns the body for the importers:
/// - AdMob: `POST {endpoint}` (`accounts/{pub}/networkReport:generate` or
///   `mediationReport:generate`), `Authorization: Bearer TOKEN`, a JSON `reportSpec`
///   with the date range, dimensions DATE, APP, FORMAT, COUNTRY and metrics
///   IMPRESSIONS, CLICKS, ESTIMATED_EARNINGS; the answer is the JSON stream.
/// - AppLovin MAX: `GET {endpoint}?api_key=KEY&start=…&end=…&format=csv&columns=…`
///   (`maxReport`).
/// - LevelPlay: `GET {endpoint}?startDate=…&endDate=…&breakdowns=…&metrics=…`,
///   `Authorization: Bearer TOKEN`.
/// A body over `NetworkReport.maxBytes`, a status other than 200 or no answer within a
/// minute is an error; no error names the credential (MAX's is in the query, which
/// errors leave out).
public enum NetworkPullClient {
    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    public static func fetch(_ request: NetworkPullRequest) async throws -> [UInt8] {
        guard var components = URLComponents(string: request.endpoint), let host = components.host else {
            throw Failure(description: "endpoint: not a URL")
        }
        let shown = "\(components.scheme ?? "http")://\(host)\(components.port.map { ":\($0)" } ?? "")\(components.path)"
        var http: HTTPClientRequest
        func query(_ items: [(String, String)]) {
            components.queryItems = (components.queryItems ?? []) + items.map { URLQueryItem(name: $0.0, value: $0.1) }
        }
        func date(_ text: String) -> [String: Int] {
            let parts = text.split(separator: "-").compactMap { Int($0) }
            return ["year": parts[0], "month": parts[1], "day": parts[2]]
        }
        switch request.source {
        case .admob:
            http = HTTPClientRequest(url: components.string ?? request.endpoint)
            http.method = .POST
            http.headers.add(name: "Authorization", value: "Bearer \(request.credential)")
            http.headers.add(name: "Content-Type", value: "application/json")
            let spec: [String: Any] = [
                "reportSpec": [
                    "dateRange": ["startDate": date(request.from), "endDate": date(request.to)],
                    "dimensions": ["DATE", "APP", "FORMAT", "COUNTRY"],
                    "metrics": ["IMPRESSIONS", "CLICKS", "ESTIMATED_EARNINGS"],
                    "localizationSettings": ["currencyCode": "USD"],
                ] as [String: Any],
            ]
            http.body = .bytes(ByteBuffer(bytes: try JSONSerialization.data(withJSONObject: spec, options: [.sortedKeys])))
        case .max:
            query([
                ("api_key", request.credential), ("start", request.from), ("end", request.to), ("format", "csv"),
                ("columns", "day,application,package_name,platform,network,ad_format,country,impressions,estimated_revenue"),
            ])
            http = HTTPClientRequest(url: components.string ?? request.endpoint)
        case .levelplay:
            query([
                ("startDate", request.from), ("endDate", request.to), ("breakdowns", "date,app,country,adSource,adUnits"), ("metrics", "impressions,clicks,revenue"),
            ])
            http = HTTPClientRequest(url: components.string ?? request.endpoint)
            http.headers.add(name: "Authorization", value: "Bearer \(request.credential)")
        case .csv:
            throw Failure(description: "source: a generic CSV has no API")
        }
        http.headers.add(name: "Accept", value: "application/json, text/csv")
        let response: HTTPClientResponse
        do {
            response = try await HTTPClient.shared.execute(http, timeout: .seconds(60))
        } catch {
            throw Failure(description: "\(shown) did not answer: \(type(of: error))")
        }
        guard response.status == .ok else {
            // A little of the network's own words (its error JSON), never the request.
            var excerpt = (try? await response.body.collect(upTo: 2048)).map { String(buffer: $0) } ?? ""
            excerpt = String(excerpt.unicodeScalars.filter { $0.value >= 0x20 && $0.value != 0x7F }.prefix(300))
            throw Failure(description: "\(shown) answered HTTP \(response.status.code)\(excerpt.isEmpty ? "" : ": \(excerpt)")")
        }
        do {
            let body = try await response.body.collect(upTo: NetworkReport.maxBytes)
            return Array(body.readableBytesView)
        } catch is NIOTooManyBytesError {
            throw Failure(description: "\(shown) answered more than \(NetworkReport.maxBytes) bytes, the most a report may have")
        }
    }
}
