import AdTallyCore
import AdTallyStorage
import Foundation
import Hummingbird
import PostgresKit
import Synchronization

/// Turns `Authorization: Bearer <secret>` into the key it belongs to.
///
/// Lookups are cached for a few seconds (hits and misses) so that ingest does not
/// query the key table on every request; a revocation through this server takes
/// effect at once, one through another server or the CLI within `ttl`.
///
/// Anyone can send any bearer token, so what a token costs is bounded: a token that
/// cannot be a key (`atk_` and 48 hex digits) is refused without a lookup; lookups
/// run on the store's own small pool (never the ingest writers' connections); and
/// both caches are bounded in entries, so random tokens cannot grow memory or push
/// out the live keys (misses and hits are kept apart).
public final class KeyAuthenticator: Sendable {
    private struct Entry {
        var key: APIKey?
        var expires: ContinuousClock.Instant
        /// When the store last answered for it.
        var checked: ContinuousClock.Instant
        /// After a failed lookup: no new lookup for this key before then.
        var retryAt: ContinuousClock.Instant?
    }

    /// How long after its last successful check a live key is still accepted, while
    /// the database cannot be reached, where a caller allows it (the mediation answers).
    public static let staleGrace: Duration = .seconds(3600)

    /// At most this many entries per cache (~250 bytes each: a 64-character hash
    /// and a key without its secret): under 5 MB for both.
    public static let maxCachedKeys = 10_000

    private let store: AppStore
    private let ttl: Duration
    private let known = Mutex([String: Entry]())
    /// Lookups in flight, by secret hash (`lookup`): at most one per secret.
    private let inFlight = Mutex([String: Task<APIKey?, any Error>]())
    private let lookups = Atomic<Int>(0)

    /// Lookups the store has been asked for since this authenticator was made.
    public var lookupCount: Int { lookups.load(ordering: .relaxed) }
    private let unknown = Mutex([String: Entry]())

    /// Creates an authenticator over the app store.
    public init(store: AppStore, ttl: Duration = .seconds(5)) {
        self.store = store
        self.ttl = ttl
    }

    /// Whether a secret has the shape AdTally gives keys (`AppStore.createKey`).
    static func isKeyShaped(_ secret: Substring) -> Bool {
        let utf8 = secret.utf8
        guard utf8.count == 52, secret.hasPrefix("atk_") else { return false }
        return utf8.dropFirst(4).allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }
    }

    /// The request's live key, or a 401 problem. `allowStale`: see `authenticate(secret:allowStale:)`.
    public func authenticate(_ request: Request, allowStale: Bool = false) async throws -> APIKey {
        guard let header = request.headers[.authorization] else {
            throw Self.unauthorized("missing Authorization header; send \"Authorization: Bearer <key>\"")
        }
        let parts = header.split(separator: " ", maxSplits: 1)
        guard parts.count == 2, parts[0].lowercased() == "bearer", !parts[1].isEmpty else {
            throw Self.unauthorized("Authorization must be \"Bearer <key>\"")
        }
        guard let key = try await authenticate(secret: parts[1].trimmingCharacters(in: .whitespaces), allowStale: allowStale) else {
            throw Self.unauthorized("unknown or revoked key")
        }
        return key
    }

    /// The live key a secret belongs to, or nil (the dashboard's login form sends one).
    ///
    /// `allowStale`: when the database cannot be reached, a key the store called live
    /// within `staleGrace` is still accepted (for what works without the database:
    /// the mediation answers served from memory), and the store is asked again for
    /// it only once per `ttl` (not on every request while it is down); a key never
    /// seen live cannot be checked, and the error is thrown.
    public func authenticate(secret: String, allowStale: Bool = false) async throws -> APIKey? {
        guard Self.isKeyShaped(Substring(secret)) else { return nil }
        let hash = SHA256.hex(secret)
        let now = ContinuousClock.now
        let cached = known.withLock { $0[hash] } ?? unknown.withLock { $0[hash] }
        if let cached, cached.expires > now { return cached.key }
        func usableStale() -> Entry? {
            guard allowStale, let cached, cached.key != nil, now - cached.checked < Self.staleGrace else { return nil }
            return cached
        }
        if var stale = usableStale() {
            if let retryAt = stale.retryAt, retryAt > now { return stale.key }
            // One lookup at a time for a stale key: the requests arriving meanwhile get
            // the stale answer instead of each waiting on an unreachable database.
            stale.retryAt = now + ttl
            Self.remember(hash, stale, in: known, now: now, unlessNewerThan: stale.checked)
        }
        let key: APIKey?
        do {
            key = try await lookup(secret, hash: hash)
        } catch let error as PostgresError where error.isUnreachable {
            // Only when the database cannot be reached at all: a busy pool or a failed
            // statement is no reason to trust an old answer (a revoked key stays out).
            guard let stale = usableStale() else { throw error }
            return stale.key
        }
        let entry = Entry(key: key, expires: now + ttl, checked: now)
        if key == nil {
            // Revoked (or never a key): a live entry from before must not outlive it.
            _ = known.withLock { $0.removeValue(forKey: hash) }
            Self.remember(hash, entry, in: unknown, now: now)
        } else {
            Self.remember(hash, entry, in: known, now: now)
        }
        return key
    }

    /// The store's answer for a secret: one lookup per secret at a time, which every
    /// request that needs it meanwhile shares. Without it, a burst of requests with a key
    /// not yet cached (an app's first launch wave, or anyone holding a key) made a lookup
    /// each, and the key pool's two connections turned the rest away after 2 s: one key
    /// holding the whole pool every key shares.
    private func lookup(_ secret: String, hash: String) async throws -> APIKey? {
        let store = self.store
        let flight = inFlight.withLock { flights -> Task<APIKey?, any Error> in
            if let running = flights[hash] { return running }
            let task = Task {
                defer { self.inFlight.withLock { _ = $0.removeValue(forKey: hash) } }
                self.lookups.add(1, ordering: .relaxed)
                return try await store.authenticate(secret: secret)
            }
            flights[hash] = task
            return task
        }
        return try await flight.value
    }

    /// The live key with this id, read afresh (a dashboard session names its key by
    /// id): revoking a key ends its sessions on every server at once.
    public func liveKey(id: String) async throws -> APIKey? {
        try await store.liveKey(id: id)
    }

    /// Caches an entry; when the cache is full, drops expired entries, and failing
    /// that an arbitrary one (in place: the map is never copied under the lock).
    private static func remember(
        _ hash: String, _ entry: Entry, in cache: borrowing Mutex<[String: Entry]>, now: ContinuousClock.Instant,
        unlessNewerThan checked: ContinuousClock.Instant? = nil
    ) {
        cache.withLock { cache in
            // A stale entry must not replace one a newer lookup wrote (or removed) meanwhile.
            if let checked, cache[hash].map({ $0.checked > checked }) ?? true { return }
            if cache[hash] == nil, cache.count >= maxCachedKeys {
                var expired: [String] = []
                for (key, value) in cache where value.expires <= now {
                    expired.append(key)
                    if expired.count == 64 { break }
                }
                if expired.isEmpty, let any = cache.keys.first { expired.append(any) }
                for key in expired { cache.removeValue(forKey: key) }
            }
            cache[hash] = entry
        }
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

    /// The request's key, which must belong to `app` (any scope) or be an admin key, else 401/403.
    /// A key seen live within `staleGrace` is accepted while the database cannot be
    /// reached (the only caller, the mediation answer, is served from memory).
    public func require(anyKeyOf app: String, _ request: Request) async throws -> APIKey {
        let key = try await authenticate(request, allowStale: true)
        guard key.scope == .admin || key.app == app else {
            throw ProblemDetails(.forbidden, detail: "this key belongs to app \"\(key.app ?? "")\", not \"\(app)\"")
        }
        return key
    }

    /// The app of the request's key (any scope, the ingest key apps ship with included),
    /// else 401/403: for routes that name no app and serve the key's own (`GET /v1/mediation`).
    /// Stale keys are accepted as `require(anyKeyOf:)` accepts them.
    public func requireApp(_ request: Request) async throws -> String {
        let key = try await authenticate(request, allowStale: true)
        guard let app = key.app else {
            throw ProblemDetails(.forbidden, detail: "an admin key belongs to no app; name the app: /v1/apps/{app}/mediation")
        }
        return app
    }

    /// Forgets a key at once (after revocation).
    public func forget(keyID: String) {
        known.withLock { cache in
            let hashes = cache.compactMap { $0.value.key?.id == keyID ? $0.key : nil }
            for hash in hashes { cache.removeValue(forKey: hash) }
        }
    }

    static func unauthorized(_ detail: String) -> ProblemDetails {
        ProblemDetails(.unauthorized, detail: detail, headers: [.wwwAuthenticate: "Bearer realm=\"adtally\""])
    }
}
