import AdTallyCore
import Foundation
import Hummingbird
import Logging
import NIOCore
import NIOHTTP1
import PostgresKit

extension HTTPResponse.Status {
    /// 499, nginx's "client closed request": the client left before its request was read.
    public static let clientClosedRequest = HTTPResponse.Status(code: 499, reasonPhrase: "Client Closed Request")
}

/// Maps every error escaping a route into problem+json, once, at the HTTP boundary.
///
/// Expected failures (`ProblemDetails`, Hummingbird's `HTTPError` such as 404) keep
/// their status; a `FieldError` (a value breaking a rule, field named) is a 400. Anything else is a 500 whose body says nothing internal and whose
/// full detail is logged at error level. A client that went away mid-request (EOF
/// inside the body, a reset) is nobody's fault here: 499, as nginx counts it, logged
/// at debug level, whichever route was reading.
public struct ProblemMiddleware<Context: RequestContext>: RouterMiddleware {
    let routes: RouteTable?

    /// Creates the middleware; with `routes`, a path routed under other methods is 405.
    public init(routes: RouteTable? = nil) {
        self.routes = routes
    }

    public func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        do {
            return try await next(request, context)
        } catch let problem as ProblemDetails {
            return try problem.response(from: request, context: context)
        } catch let error as HTTPError {
            var problem = ProblemDetails(error.status, detail: error.body ?? error.status.reasonPhrase, headers: error.headers)
            if error.status == .notFound && error.body == nil {
                problem.detail = "no route for \(request.method) \(request.uri.path)"
                if let allowed = routes?.methods(for: request.uri.path), !allowed.isEmpty {
                    let list = allowed.map(\.rawValue).joined(separator: ", ")
                    problem = ProblemDetails(
                        .methodNotAllowed, detail: "\(request.uri.path) does not take \(request.method); it takes \(list)",
                        headers: [.allow: list]
                    )
                }
            }
            return try problem.response(from: request, context: context)
        } catch let error as FieldError {
            // A value that breaks a rule (a rate card, an export schedule, a mediation policy).
            return try ProblemDetails(.badRequest, detail: error.description).response(from: request, context: context)
        } catch let error as PostgresError where error.isTransient {
            // The database is down or saturated: a retry later can succeed.
            context.logger.warning("database unavailable", metadata: ["path": "\(redactedPath(request.uri.path))", "error": "\(error)"])
            // Say which: a busy pool or a long query is not a database that is down.
            let retry = error.sqlState == .queryCanceled ? "30" : error.kind == .poolTimeout ? "5" : "1"
            return try ProblemDetails(.serviceUnavailable, detail: error.transientReason + "; retry shortly", headers: [.retryAfter: retry])
                .response(from: request, context: context)
        } catch let error as PostgresError where error.kind == .invalidParameter {
            // A value PostgreSQL cannot take as text (a NUL byte) reached a query: the
            // request's fault, whichever route forgot to check it (logged, to fix there).
            context.logger.warning("a request value PostgreSQL cannot store", metadata: ["path": "\(redactedPath(request.uri.path))", "error": "\(error)"])
            return try ProblemDetails(.badRequest, detail: "a parameter or field holds a value that cannot be stored as text (a NUL byte)")
                .response(from: request, context: context)
        } catch let error where Self.isClientGone(error) {
            context.logger.debug("client left mid-request", metadata: ["path": "\(redactedPath(request.uri.path))", "error": "\(error)"])
            return try ProblemDetails(.clientClosedRequest, detail: "the connection closed before the request was complete")
                .response(from: request, context: context)
        } catch let error as any HTTPResponseError {
            let problem = ProblemDetails(error.status, detail: "\(error)")
            return try problem.response(from: request, context: context)
        } catch {
            context.logger.error("unexpected error handling request", metadata: [
                "method": "\(request.method)", "path": "\(redactedPath(request.uri.path))", "error": "\(String(reflecting: error))",
            ])
            return try ProblemDetails(.internalServerError, detail: "an internal error occurred; it has been logged")
                .response(from: request, context: context)
        }
    }

    /// Errors that mean the client closed or reset the connection while the request was read.
    static func isClientGone(_ error: any Error) -> Bool {
        switch error {
        case let parser as HTTPParserError: parser == .invalidEOFState
        case let io as IOError: io.errnoCode == ECONNRESET || io.errnoCode == EPIPE
        case let channel as ChannelError: channel == .eof || channel == .ioOnClosedChannel || channel == .inputClosed
        default: false
        }
    }
}
