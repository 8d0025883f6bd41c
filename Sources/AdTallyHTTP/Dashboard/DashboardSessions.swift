import AdTallyCore
import AdTallyStorage
import Foundation
import Synchronization

/// The dashboard's session cookies: `v1.KEYID.EXPIRES.MAC`, where MAC is the
/// HMAC-SHA256 of the rest under a secret every server of the database shares
/// (`server_secrets`). The cookie names the key by id and never holds its secret;
/// a session is good until it expires or its key is revoked (checked on every
/// request, so revocation signs a key's sessions out at once, on every server).
final class DashboardSessions: Sendable {
    /// The cookie's name.
    static let cookieName = "adtally_session"
    /// How long a session lasts after login.
    static let lifetime: Int64 = 12 * 3600

    /// A signature that does not verify makes the secret be read again, at most this often:
    /// another server may have made a new one (the row was deleted to sign everyone out).
    static let reread: Duration = .seconds(10)
    /// The cached secret is read again after this long however cookies verify: deleting
    /// the row (to sign everyone out) takes effect on every server within it.
    static let lifetimeOfCache: Duration = .seconds(60)

    private let store: AppStore
    private let secret = Mutex<(bytes: [UInt8], read: ContinuousClock.Instant)?>(nil)

    init(store: AppStore) {
        self.store = store
    }

    /// The secret: cached; `fresh` reads it again unless it was read in the last `reread`;
    /// `always` reads it again (a sign-in: a new cookie is signed with what every server will read).
    private func key(fresh: Bool = false, always: Bool = false) async throws -> [UInt8] {
        if !always, let cached = secret.withLock({ $0 }), ContinuousClock.now - cached.read < Self.lifetimeOfCache,
           !fresh || ContinuousClock.now - cached.read < Self.reread {
            return cached.bytes
        }
        let read = try await store.sharedSecret(named: "dashboard_session")
        secret.withLock { $0 = (read, ContinuousClock.now) }
        return read
    }

    /// A signed session value for a key, expiring `lifetime` after `now`.
    func make(keyID: String, now: Date = Date()) async throws -> String {
        let body = "v1.\(keyID).\(Int64(now.timeIntervalSince1970) + Self.lifetime)"
        return body + "." + SHA256.hmac(key: try await key(always: true), message: Array(body.utf8)).hexString
    }

    /// The key id a session value names, when its signature holds and it has not expired.
    func keyID(from value: String, now: Date = Date()) async throws -> String? {
        let parts = value.split(separator: ".", omittingEmptySubsequences: false)
        guard value.utf8.count < 200, parts.count == 4, parts[0] == "v1",
              parts[1].utf8.allSatisfy({ (0x30...0x39).contains($0) || (0x61...0x7a).contains($0) || $0 == 0x5f }),
              let expires = Int64(parts[2]), expires > Int64(now.timeIntervalSince1970)
        else { return nil }
        let message = Array("v1.\(parts[1]).\(parts[2])".utf8), given = Array(parts[3].utf8)
        guard given.count == 64 else { return nil }
        if Self.matches(given, SHA256.hmac(key: try await key(), message: message).hexString) { return String(parts[1]) }
        // Signed under a secret made since this server read its own?
        let secret = try await key(fresh: true)
        return Self.matches(given, SHA256.hmac(key: secret, message: message).hexString) ? String(parts[1]) : nil
    }

    /// Compared in constant time: how far a forged MAC matches must not show in timing.
    static func matches(_ given: [UInt8], _ expected: String) -> Bool {
        let wanted = Array(expected.utf8)
        guard given.count == wanted.count else { return false }
        var difference: UInt8 = 0
        for index in wanted.indices { difference |= given[index] ^ wanted[index] }
        return difference == 0
    }
}
