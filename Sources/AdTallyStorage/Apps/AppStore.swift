import AdTallyCore
import Foundation
import PostgresKit

/// An app that sends events.
public struct App: Sendable, Equatable, Codable {
    /// The app id, `[a-z0-9][a-z0-9_.-]{0,63}`.
    public var id: String
    /// Display name.
    public var name: String
    /// IANA zone its reports default to.
    public var timezone: String
    /// ISO 4217 report currency.
    public var currency: String
    /// When it was created.
    public var createdAt: Date
    /// Days of its raw events and device rows kept, when shorter than the servers'
    /// `--retention-days` (nil: the servers' own). The shorter of the two wins.
    public var retentionDays: Int?

    enum CodingKeys: String, CodingKey {
        case id = "app", name, timezone, currency
        case createdAt = "created_at"
        case retentionDays = "retention_days"
    }

    /// Every key written, `retention_days` as null when the app has none of its own.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(id, forKey: .id)
        try container.encode(name, forKey: .name)
        try container.encode(timezone, forKey: .timezone)
        try container.encode(currency, forKey: .currency)
        try container.encode(createdAt, forKey: .createdAt)
        try container.encode(retentionDays, forKey: .retentionDays)
    }
}

/// What a key may do.
public enum KeyScope: String, Sendable, Codable, CaseIterable {
    /// Send events for its app.
    case ingest
    /// Read reports of its app.
    case read
    /// Manage apps and keys.
    case admin
}

/// An API key, without its secret.
public struct APIKey: Sendable, Equatable, Codable {
    /// The key id (`key_…`), not secret.
    public var id: String
    /// The app it belongs to; nil for admin keys.
    public var app: String?
    /// What it may do.
    public var scope: KeyScope
    /// When it was created.
    public var createdAt: Date
    /// When it was revoked, if it was.
    public var revokedAt: Date?

    enum CodingKeys: String, CodingKey {
        case id, app, scope
        case createdAt = "created_at"
        case revokedAt = "revoked_at"
    }
}

/// A key just created: the only time its secret exists outside the client.
public struct NewKey: Sendable, Codable {
    /// The key id.
    public var id: String
    /// The secret, shown this once.
    public var secret: String
    /// Its app; nil for an admin key.
    public var app: String?
    /// What it may do.
    public var scope: KeyScope
}

/// Why an app or key operation was refused.
public enum AppStoreError: Error, CustomStringConvertible, Equatable {
    case invalid(field: String, rule: String)
    case appExists(String)
    case unknownApp(String)
    case unknownKey(String)

    public var description: String {
        switch self {
        case .invalid(let field, let rule): "\(field): \(rule)"
        case .appExists(let id): "app \"\(id)\" already exists"
        case .unknownApp(let id): "no app \"\(id)\""
        case .unknownKey(let id): "no key \"\(id)\""
        }
    }
}

/// Apps and API keys in PostgreSQL. Only a SHA-256 of each secret is stored.
public struct AppStore: Sendable {
    let pool: PostgresPool

    /// Creates a store over a pool.
    public init(pool: PostgresPool) { self.pool = pool }

    /// Creates an app; the id, zone and currency are checked first.
    public func createApp(id: String, name: String?, timezone: String = "UTC", currency: String = "USD") async throws -> App {
        do {
            try AppRules.validateApp(id: id, name: name, timezone: timezone, currency: currency)
        } catch {
            throw AppStoreError.invalid(field: error.field, rule: error.rule)
        }
        do {
            try await DatabaseTimeZones.check(timezone, field: "timezone", pool: pool)
        } catch let error as FieldError {
            throw AppStoreError.invalid(field: error.field, rule: error.rule)
        }
        let name = name ?? id
        do {
            let rows = try await pool.query("""
                INSERT INTO apps (app_id, name, timezone, currency) VALUES (\(id), \(name), \(timezone), \(currency))
                RETURNING app_id, name, timezone, currency, created_at, retention_days
                """)
            return try Self.app(rows[0])
        } catch let error as PostgresError where error.sqlState == .uniqueViolation {
            throw AppStoreError.appExists(id)
        }
    }

    /// All apps, by id.
    public func listApps() async throws -> [App] {
        try await pool.query("SELECT app_id, name, timezone, currency, created_at, retention_days FROM apps ORDER BY app_id").map(Self.app)
    }

    /// One app.
    public func app(_ id: String) async throws -> App? {
        try await pool.query("SELECT app_id, name, timezone, currency, created_at, retention_days FROM apps WHERE app_id = \(id)").first.map(Self.app)
    }

    /// The range an app's own retention may take (the servers' `--retention-days` range).
    public static let retentionRange = 9...36_500

    /// Sets (or, nil, drops) an app's own retention; the shorter of it and the servers'
    /// wins for the app's raw events and device rows, at the next maintenance pass.
    public func setRetention(app: String, days: Int?) async throws -> App {
        if let days, !Self.retentionRange.contains(days) {
            throw AppStoreError.invalid(
                field: "retention_days",
                rule: "must be a whole number of days from \(Self.retentionRange.lowerBound) to \(Self.retentionRange.upperBound), or null for the servers' own"
            )
        }
        guard let row = try await pool.query("""
            UPDATE apps SET retention_days = \(days) WHERE app_id = \(app)
            RETURNING app_id, name, timezone, currency, created_at, retention_days
            """).first else { throw AppStoreError.unknownApp(app) }
        return try Self.app(row)
    }

    /// Creates a key for an app (`ingest`/`read`) or an admin key (`app` nil).
    public func createKey(app: String?, scope: KeyScope) async throws -> NewKey {
        switch (scope, app) {
        case (.admin, .some): throw AppStoreError.invalid(field: "app", rule: "an admin key belongs to no app")
        case (.ingest, nil), (.read, nil): throw AppStoreError.invalid(field: "app", rule: "an \(scope.rawValue) key needs an app")
        default: break
        }
        if let app, try await self.app(app) == nil { throw AppStoreError.unknownApp(app) }
        let id = "key_" + Self.randomHex(bytes: 8)
        let secret = "atk_" + Self.randomHex(bytes: 24)
        try await pool.query("""
            INSERT INTO api_keys (key_id, app_id, scope, secret_hash)
            VALUES (\(id), \(app), \(scope.rawValue), \(SHA256.hex(secret)))
            """)
        return NewKey(id: id, secret: secret, app: app, scope: scope)
    }

    /// Keys, newest first; only those of `app` when given.
    public func listKeys(app: String? = nil) async throws -> [APIKey] {
        let rows = try await pool.query("""
            SELECT key_id, app_id, scope, created_at, revoked_at FROM api_keys
            WHERE \(app)::text IS NULL OR app_id = \(app) ORDER BY created_at DESC, key_id
            """)
        return try rows.map(Self.key)
    }

    /// Revokes a key; its secret stops working. Revoking twice is not an error.
    @discardableResult
    public func revokeKey(_ id: String) async throws -> APIKey {
        // The first revocation's time is kept. now() stands alone in SET, which Citus
        // evaluates once (it refuses one inside COALESCE or CASE, as api_keys is a reference
        // table there), and the key is read back by a second statement.
        _ = try await pool.query("UPDATE api_keys SET revoked_at = now() WHERE key_id = \(id) AND revoked_at IS NULL")
        let rows = try await pool.query("SELECT key_id, app_id, scope, created_at, revoked_at FROM api_keys WHERE key_id = \(id)")
        guard let row = rows.first else { throw AppStoreError.unknownKey(id) }
        return try Self.key(row)
    }

    /// The live key a secret belongs to, or nil (unknown or revoked).
    public func authenticate(secret: String) async throws -> APIKey? {
        let rows = try await pool.query("""
            SELECT key_id, app_id, scope, created_at, revoked_at FROM api_keys
            WHERE secret_hash = \(SHA256.hex(secret)) AND revoked_at IS NULL
            """)
        return try rows.first.map(Self.key)
    }

    /// The key with this id while it is live (not revoked), else nil: a dashboard
    /// session names its key by id and is good only as long as the key is.
    public func liveKey(id: String) async throws -> APIKey? {
        let rows = try await pool.query("""
            SELECT key_id, app_id, scope, created_at, revoked_at FROM api_keys WHERE key_id = \(id) AND revoked_at IS NULL
            """)
        return try rows.first.map(Self.key)
    }

    /// The key the secrets admins give (the networks' API credentials, the alert webhooks'
    /// keys) are encrypted with in the database: `given` (ADTALLY_CREDENTIALS_KEY), else
    /// the servers' shared one.
    public func credentialsKey(_ given: String?) async throws -> String {
        if let given, !given.isEmpty { return given }
        return try await pool.withConnection { try Self.credentialsKey(given, on: $0) }
    }

    /// The same, on a connection the caller holds (a leader's only one).
    static func credentialsKey(_ given: String?, on connection: PostgresConnection) throws -> String {
        if let given, !given.isEmpty { return given }
        return String(decoding: try sharedSecret(named: "network_pull_credentials", on: connection), as: UTF8.self)
    }

    /// A secret every server of this database shares (`server_secrets`: 32 random
    /// bytes as hex, made from this machine's random source by the first server that asks).
    public func sharedSecret(named name: String) async throws -> [UInt8] {
        try await pool.withConnection { try Self.sharedSecret(named: name, on: $0) }
    }

    static func sharedSecret(named name: String, on connection: PostgresConnection) throws -> [UInt8] {
        var found: String?
        // A server making it at the same moment wins the insert; this statement's
        // snapshot may predate its commit, and the next statement sees it.
        for _ in 0..<3 where found == nil {
            let rows = try connection.query("""
                WITH made AS (
                    INSERT INTO server_secrets (name, secret) VALUES (\(name), \(Self.randomHex(bytes: 32))) ON CONFLICT (name) DO NOTHING RETURNING secret
                )
                SELECT secret FROM made UNION ALL SELECT secret FROM server_secrets WHERE name = \(name)
                """)
            found = try rows.first?.decode(0, as: String.self)
        }
        guard let hex = found else { throw AppStoreError.invalid(field: "server_secrets", rule: "the secret \(name) could not be made or read") }
        // Its 64 hex characters are the key: 256 random bits, nothing to decode.
        return Array(hex.utf8)
    }

    static func app(_ row: PostgresRow) throws -> App {
        App(id: try row.decode("app_id"), name: try row.decode("name"), timezone: try row.decode("timezone"),
            currency: try row.decode("currency"), createdAt: try row.decode("created_at"), retentionDays: try row.decode("retention_days"))
    }

    static func key(_ row: PostgresRow) throws -> APIKey {
        let scope: String = try row.decode("scope")
        return APIKey(id: try row.decode("key_id"), app: try row.decode("app_id"), scope: KeyScope(rawValue: scope) ?? .read,
                      createdAt: try row.decode("created_at"), revokedAt: try row.decode("revoked_at"))
    }

    static func randomHex(bytes count: Int) -> String {
        var generator = SystemRandomNumberGenerator()
        return (0..<count).map { _ in UInt8.random(in: .min ... .max, using: &generator) }.hexString
    }
}
