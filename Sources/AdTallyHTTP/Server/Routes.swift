import Hummingbird
import Synchronization

/// The router and a record of every route's method and path, so that a request for
/// a path that exists under another method is answered 405 with `Allow` (Hummingbird
/// answers 404 for it).
public struct Routes {
    /// The router routes are added to.
    public let router: Router<AdTallyRequestContext>
    /// Every route's method and path.
    public let table = RouteTable()

    /// A router with HEAD answered for every GET route.
    public init() {
        router = Router(context: AdTallyRequestContext.self, options: .autoGenerateHeadEndpoints)
    }

    /// Adds a route; `path` as Hummingbird writes it (`v1/apps/:app/keys`).
    public func on(
        _ method: HTTPRequest.Method, _ path: String,
        use handler: @escaping @Sendable (Request, AdTallyRequestContext) async throws -> some ResponseGenerator
    ) {
        router.on(RouterPath(path), method: method, use: handler)
        table.add(method, path)
    }

    /// `GET` route.
    public func get(_ path: String, use handler: @escaping @Sendable (Request, AdTallyRequestContext) async throws -> some ResponseGenerator) {
        on(.get, path, use: handler)
    }

    /// `POST` route.
    public func post(_ path: String, use handler: @escaping @Sendable (Request, AdTallyRequestContext) async throws -> some ResponseGenerator) {
        on(.post, path, use: handler)
    }

    /// `DELETE` route.
    public func delete(_ path: String, use handler: @escaping @Sendable (Request, AdTallyRequestContext) async throws -> some ResponseGenerator) {
        on(.delete, path, use: handler)
    }

}

/// The method and path of every route, for 405 answers.
public final class RouteTable: Sendable {
    private let table = Mutex<[(method: HTTPRequest.Method, segments: [Substring])]>([])

    func add(_ method: HTTPRequest.Method, _ path: String) {
        table.withLock { $0.append((method, path.split(separator: "/"))) }
    }

    /// The methods routed for a path (HEAD wherever GET is), empty when none is.
    public func methods(for path: String) -> [HTTPRequest.Method] {
        let segments = path.split(separator: "/")
        let methods = table.withLock { table in
            table.filter { route in
                route.segments.count == segments.count
                    && zip(route.segments, segments).allSatisfy { pattern, segment in pattern.hasPrefix(":") || pattern == segment }
            }.map(\.method)
        }
        var allowed: [HTTPRequest.Method] = []
        for method in methods where !allowed.contains(method) { allowed.append(method) }
        if allowed.contains(.get) && !allowed.contains(.head) { allowed.append(.head) }
        return allowed
    }
}
