import AdTallyStorage
import AsyncHTTPClient
import Foundation
import NIOCore

/// Sends alert notifications (DESIGN §12): a POST of the notification's JSON with its
/// headers, no redirects followed, at most 10 s per attempt, only where the
/// `OutboundGate` lets it go. The answer's status is what counts (2xx: delivered); at
/// most 64 KiB of its body is read, and dropped.
public struct WebhookClient: Sendable {
    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    /// The longest one attempt may take.
    static let deadline: TimeAmount = .seconds(10)

    public let gate: OutboundGate

    public init(gate: OutboundGate) { self.gate = gate }

    public func send(_ request: WebhookRequest) async throws -> Int {
        var http = HTTPClientRequest(url: request.url)
        http.method = .POST
        for (name, value) in request.headers { http.headers.add(name: name, value: value) }
        http.body = .bytes(ByteBuffer(bytes: request.body))
        do {
            return try await gate.execute(http, field: "webhook", connect: .seconds(5), read: .seconds(10), timeout: Self.deadline) { response in
                _ = try? await response.body.collect(upTo: 1 << 16)
                return Int(response.status.code)
            }
        } catch let refused as OutboundGate.Refused {
            throw refused
        } catch {
            throw Failure(description: "\(NetworkPullClient.shown(request.url, path: false)) could not be reached: \(error)")
        }
    }
}
