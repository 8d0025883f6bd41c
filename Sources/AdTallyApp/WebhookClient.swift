import AdTallyStorage
import AsyncHTTPClient
import Foundation
import NIOCore

/// Sends alert notifications (DESIGN §12): a POST of the notification's JSON with its
/// headers, no redirects followed, at most 10 s per attempt. The answer's status is
/// what counts (2xx: delivered); at most 64 KiB of its body is read, and dropped.
public enum WebhookClient {
    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    static let client = HTTPClient(
        eventLoopGroupProvider: .singleton,
        configuration: .init(redirectConfiguration: .disallow, timeout: .init(connect: .seconds(5), read: .seconds(10)))
    )

    /// The longest one attempt may take.
    static let deadline: TimeAmount = .seconds(10)

    public static func send(_ request: WebhookRequest) async throws -> Int {
        var http = HTTPClientRequest(url: request.url)
        http.method = .POST
        for (name, value) in request.headers { http.headers.add(name: name, value: value) }
        http.body = .bytes(ByteBuffer(bytes: request.body))
        let response: HTTPClientResponse
        do {
            response = try await client.execute(http, timeout: deadline)
        } catch {
            throw Failure(description: "\(NetworkPullClient.shown(request.url, path: false)) could not be reached: \(error)")
        }
        _ = try? await response.body.collect(upTo: 1 << 16)
        return Int(response.status.code)
    }
}
