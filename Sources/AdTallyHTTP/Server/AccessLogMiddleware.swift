import Foundation
import Hummingbird
import Logging

/// One log line per request at `debug` (`--log-level debug`): method, path (a device id
/// in it redacted), status,
/// `Retry-After` when given, and the arrival and answer instants to the microsecond
/// (the log's own timestamps are whole seconds). Nothing is formatted at other levels.
public struct AccessLogMiddleware<Context: RequestContext>: RouterMiddleware {
    public init() {}

    public func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard context.logger.logLevel <= .debug else { return try await next(request, context) }
        let received = Date()
        do {
            let response = try await next(request, context)
            log(request, context, received, status: response.status.code, retryAfter: response.headers[.retryAfter])
            return response
        } catch let error as any HTTPResponseError {
            log(request, context, received, status: error.status.code, retryAfter: nil)
            throw error
        }
    }

    private func log(_ request: Request, _ context: Context, _ received: Date, status: Int, retryAfter: String?) {
        var metadata: Logger.Metadata = [
            "status": "\(status)",
            "received_at": "\(Self.micros(received))",
            "answered_at": "\(Self.micros(Date()))",
        ]
        if let retryAfter { metadata["retry_after"] = "\(retryAfter)" }
        context.logger.debug("\(request.method) \(redactedPath(request.uri.path))", metadata: metadata)
    }

    /// Microseconds since the Unix epoch.
    static func micros(_ date: Date) -> Int64 { Int64((date.timeIntervalSince1970 * 1_000_000).rounded()) }
}

/// A request path as the log may show it: a device id in it replaced by `{device}` (a
/// device id is personal data, DESIGN §15: an erasure or access request must not leave
/// it in the log).
func redactedPath(_ path: String) -> String {
    var parts = path.split(separator: "/", omittingEmptySubsequences: false)
    for index in parts.indices.dropLast() where parts[index] == "devices" && parts[index + 1] != "erase" && !parts[index + 1].isEmpty {
        parts[index + 1] = "{device}"
    }
    return parts.joined(separator: "/")
}
