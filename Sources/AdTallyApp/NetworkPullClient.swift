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
/// The bearer token of AdMob and LevelPlay lives an hour, so their credential is
/// normally what mints one, as JSON: AdMob's OAuth client and refresh token
/// (`{"client_id", "client_secret", "refresh_token"[, "token_uri"]}`, exchanged at
/// Google's token endpoint), LevelPlay's secret key and refresh token
/// (`{"secret_key", "refresh_token"[, "auth_uri"]}`, exchanged at its auth API). Any
/// other credential is sent as the bearer token itself.
///
/// A body over `NetworkReport.maxBytes`, a status other than 200, a redirect, or a
/// whole exchange (token and report) over two minutes is an error; no error names the
/// credential (MAX's key is in the query, which errors leave out). Every request (the
/// token's too: its URI comes from the credential) goes only where the `OutboundGate`
/// lets it, with no redirects: a report comes from the endpoint given, or not at all.
public struct NetworkPullClient: Sendable {
    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    /// The longest a whole pull (token and report) may take.
    static let deadline: Duration = .seconds(120)

    public let gate: OutboundGate

    public init(gate: OutboundGate) { self.gate = gate }

    public func fetch(_ request: NetworkPullRequest) async throws -> [UInt8] {
        try await withThrowingTaskGroup(of: [UInt8].self) { group in
            group.addTask { try await exchange(request) }
            group.addTask {
                try await Task.sleep(for: Self.deadline)
                throw Failure(description: "\(Self.shown(request.endpoint)) took longer than \(Self.deadline.components.seconds) s")
            }
            defer { group.cancelAll() }
            return try await group.next()!
        }
    }

    /// The endpoint without its query (where MAX's key is); without its path too when
    /// `path` is false (a chat's incoming-webhook URL holds its token there).
    static func shown(_ endpoint: String, path: Bool = true) -> String {
        guard let components = URLComponents(string: endpoint), let host = components.host else { return "the endpoint" }
        return "\(components.scheme ?? "http")://\(host)\(components.port.map { ":\($0)" } ?? "")\(path ? components.path : "/…")"
    }

    /// The bearer token for AdMob or LevelPlay: minted from the credential's JSON, or the credential itself.
    func bearer(_ request: NetworkPullRequest) async throws -> String {
        guard request.credential.hasPrefix("{") else { return request.credential }
        // JSON that does not parse is a broken credential, never a token to send.
        guard let object = try? JSONSerialization.jsonObject(with: Data(request.credential.utf8)) as? [String: Any] else {
            throw Failure(description: "credential: starts with { but is not a JSON object (client_id, client_secret, refresh_token, or secret_key, refresh_token)")
        }
        func field(_ name: String) throws -> String {
            guard let value = object[name] as? String, !value.isEmpty else { throw Failure(description: "credential: the JSON has no \(name)") }
            return value
        }
        var http: HTTPClientRequest
        let uri: String
        switch request.source {
        case .admob:
            uri = (object["token_uri"] as? String) ?? "https://oauth2.googleapis.com/token"
            http = HTTPClientRequest(url: uri)
            http.method = .POST
            http.headers.add(name: "Content-Type", value: "application/x-www-form-urlencoded")
            var form = URLComponents()
            form.queryItems = [
                URLQueryItem(name: "grant_type", value: "refresh_token"), URLQueryItem(name: "client_id", value: try field("client_id")),
                URLQueryItem(name: "client_secret", value: try field("client_secret")), URLQueryItem(name: "refresh_token", value: try field("refresh_token")),
            ]
            // application/x-www-form-urlencoded: '+' would read as a space.
            http.body = .bytes(ByteBuffer(string: (form.percentEncodedQuery ?? "").replacingOccurrences(of: "+", with: "%2B")))
        case .levelplay:
            uri = (object["auth_uri"] as? String) ?? "https://platform.ironsrc.com/partners/publisher/auth"
            http = HTTPClientRequest(url: uri)
            http.headers.add(name: "secretkey", value: try field("secret_key"))
            http.headers.add(name: "refreshToken", value: try field("refresh_token"))
        default:
            return request.credential
        }
        let body = try await send(http, shown: Self.shown(uri), field: object[request.source == .admob ? "token_uri" : "auth_uri"] == nil ? "the token endpoint" : request.source == .admob ? "credential: token_uri" : "credential: auth_uri", limit: 1 << 16)
        let text = String(decoding: body, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        // Google answers {"access_token": …}; LevelPlay the token itself, as a JSON string or bare.
        if let object = try? JSONSerialization.jsonObject(with: Data(text.utf8), options: [.fragmentsAllowed]) {
            if let token = (object as? [String: Any])?["access_token"] as? String, !token.isEmpty { return token }
            if let token = object as? String, !token.isEmpty { return token }
        }
        guard !text.isEmpty, !text.hasPrefix("{") else { throw Failure(description: "\(Self.shown(uri)) answered no token") }
        return text
    }

    /// Sends a request; the body when the answer is 200 (at most `limit` bytes).
    func send(_ http: HTTPClientRequest, shown: String, field: String, limit: Int) async throws -> [UInt8] {
        do {
            return try await gate.execute(http, field: field, connect: .seconds(10), read: .seconds(60), timeout: .seconds(60)) { response in
                guard response.status == .ok else {
                    // A little of the network's own words (its error JSON), never the request.
                    var excerpt = (try? await response.body.collect(upTo: 2048)).map { String(buffer: $0) } ?? ""
                    excerpt = String(excerpt.unicodeScalars.filter { $0.value >= 0x20 && $0.value != 0x7F }.prefix(300))
                    throw Failure(description: "\(shown) answered HTTP \(response.status.code)\(excerpt.isEmpty ? "" : ": \(excerpt)")")
                }
                do {
                    return Array(try await response.body.collect(upTo: limit).readableBytesView)
                } catch is NIOTooManyBytesError {
                    throw Failure(description: "\(shown) answered more than \(limit) bytes, the most a report may have")
                }
            }
        } catch let error as Failure {
            throw error
        } catch let refused as OutboundGate.Refused {
            throw refused
        } catch {
            throw Failure(description: "\(shown) did not answer: \(type(of: error))")
        }
    }

    func exchange(_ request: NetworkPullRequest) async throws -> [UInt8] {
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
            http.headers.add(name: "Authorization", value: "Bearer \(try await bearer(request))")
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
            http.headers.add(name: "Authorization", value: "Bearer \(try await bearer(request))")
        case .csv:
            throw Failure(description: "source: a generic CSV has no API")
        }
        http.headers.add(name: "Accept", value: "application/json, text/csv")
        return try await send(http, shown: shown, field: "endpoint", limit: NetworkReport.maxBytes)
    }
}
