import AdTallyCore
import AdTallyStorage
import Foundation
import Hummingbird
import Synchronization

/// Turns `Authorization: Bearer <secret>` into the key it belongs to.
///
/// Lookups are cached for a few seconds (hits and misses) so that ingest does not
/// query the key table on every request; a revocation through this server takes
/// effect at once, one through another server or the CLI within `ttl`.
public final class KeyAuthenticator: Sendable {
    private struct Entry {
        var key: APIKey?
        var expires: ContinuousClock.Instant
    }

    private let store: AppStore
    private let ttl: Duration
    private let cache = Mutex([String: Entry]())

    /// Creates an authenticator over the app store.
    public init(store: AppStore, ttl: Duration = .seconds(5)) {
        self.store = store
        self.ttl = ttl
    }

    /// The request's live key, or a 401 problem.
    public func authenticate(_ request: Request) async throws -> APIKey {
        guard let header = request.headers[.authorization] else {
            throw Self.unauthorized("missing Authorization header; send \"Authorization: Bearer <key>\"")
        }
        let parts = header.split(separator: " ", maxSplits: 1)
        guard parts.count == 2, parts[0].lowercased() == "bearer", !parts[1].isEmpty else {
            throw Self.unauthorized("Authorization must be \"Bearer <key>\"")
        }
        let secret = String(parts[1]).trimmingCharacters(in: .whitespaces)
        let hash = SHA256.hex(secret)
        let now = ContinuousClock.now
        let cached = cache.withLock { $0[hash] }
        let key: APIKey?
        if let cached, cached.expires > now {
            key = cached.key
        } else {
            key = try await store.authenticate(secret: secret)
            cache.withLock { cache in
                if cache.count > 10_000 { cache = cache.filter { $0.value.expires > now } }
                cache[hash] = Entry(key: key, expires: now + ttl)
            }
        }
        guard let key else { throw Self.unauthorized("unknown or revoked key") }
        return key
    }

    /// The request's key, which must have `scope` (and belong to `app` when given), else 401/403.
    public func require(_ scope: KeyScope, app: String? = nil, _ request: Request) async throws -> APIKey {
        let key = try await authenticate(request)
        guard key.scope == scope || (key.scope == .admin && scope == .read) else {
            throw ProblemDetails(.forbidden, detail: "this \(key.scope.rawValue) key cannot do that; it needs a key with scope \(scope.rawValue)")
        }
        if let app, let keyApp = key.app, keyApp != app {
            throw ProblemDetails(.forbidden, detail: "this key belongs to app \"\(keyApp)\", not \"\(app)\"")
        }
        return key
    }

    /// Forgets a key at once (after revocation).
    public func forget(keyID: String) {
        cache.withLock { cache in cache = cache.filter { $0.value.key?.id != keyID } }
    }

    static func unauthorized(_ detail: String) -> ProblemDetails {
        ProblemDetails(.unauthorized, detail: detail, headers: [.wwwAuthenticate: "Bearer realm=\"adtally\""])
    }
}
