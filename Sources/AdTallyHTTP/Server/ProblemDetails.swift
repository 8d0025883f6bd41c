import Foundation
import Hummingbird

/// An RFC 9457 problem document; every error AdTally answers over HTTP is one.
public struct ProblemDetails: Error, HTTPResponseError, Sendable {
    /// The HTTP status.
    public var status: HTTPResponse.Status
    /// A short, fixed summary of the problem type.
    public var title: String
    /// What went wrong this time, naming the field or value at fault.
    public var detail: String
    /// Extra response headers (e.g. `Retry-After`, `WWW-Authenticate`).
    public var headers: HTTPFields

    /// Creates a problem; `title` defaults to the status's reason phrase.
    public init(_ status: HTTPResponse.Status, title: String? = nil, detail: String, headers: HTTPFields = [:]) {
        self.status = status
        self.title = title ?? status.reasonPhrase
        self.detail = detail
        self.headers = headers
    }

    private struct Body: Encodable {
        var type = "about:blank"
        var title: String
        var status: Int
        var detail: String
        var instance: String
    }

    public func response(from request: Request, context: some RequestContext) throws -> Response {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        let json = try encoder.encode(Body(title: title, status: status.code, detail: detail, instance: request.uri.path))
        var headers = self.headers
        headers[.contentType] = "application/problem+json"
        return Response(status: status, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: json)))
    }
}
