import AdTallyApp
import AdTallyStorage
import AdTallyTestSupport
import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import PostgresKit

/// An app for the kit's tests on a fresh test database: its ingest key (and that key's
/// id, to revoke it), a read key and an admin key.
struct KitFixture: Sendable {
    var conninfo: String
    var app: String
    var ingest: String
    var ingestKeyID: String
    var read: String
    var admin: String

    static func make(_ conninfo: String, app: String = "kitapp") async throws -> KitFixture {
        let settings = try Settings.resolve(flags: .init(databaseURL: conninfo), environment: [:])
        let database = try await Database.open(settings, logger: Logger(label: "test"))
        do {
            try await database.migrate()
            let store = AppStore(pool: database.pool)
            _ = try await store.createApp(id: app, name: nil)
            let ingest = try await store.createKey(app: app, scope: .ingest)
            let read = try await store.createKey(app: app, scope: .read)
            let admin = try await store.createKey(app: nil, scope: .admin)
            await database.close()
            return KitFixture(conninfo: conninfo, app: app, ingest: ingest.secret, ingestKeyID: ingest.id, read: read.secret, admin: admin.secret)
        } catch {
            await database.close()
            throw error
        }
    }

    /// A new ingest key for the app (after one was revoked).
    func newIngestKey() async throws -> String {
        let settings = try Settings.resolve(flags: .init(databaseURL: conninfo), environment: [:])
        let database = try await Database.open(settings, logger: Logger(label: "test"))
        let secret = try await AppStore(pool: database.pool).createKey(app: app, scope: .ingest).secret
        await database.close()
        return secret
    }

    /// Rows of a SQL query on the app's database, as text.
    func sql(_ text: String) async throws -> [[String?]] {
        try await runSQL(conninfo, [text])
    }
}

/// An HTTP request with a key, and a JSON body when given: its status and body text
/// (the servers' tests in this suite share it).
func authorizedCall(
    _ client: HTTPClient, _ method: HTTPMethod, _ url: String, key: String, body: String? = nil, timeout: Int64 = 30
) async throws -> (status: Int, body: String) {
    var request = HTTPClientRequest(url: url)
    request.method = method
    request.headers.add(name: "Authorization", value: "Bearer \(key)")
    if let body {
        request.headers.add(name: "Content-Type", value: "application/json")
        request.body = .bytes(ByteBuffer(string: body))
    }
    let response = try await client.execute(request, timeout: .seconds(timeout))
    return (Int(response.status.code), String(buffer: try await response.body.collect(upTo: 1 << 24)))
}

/// `authorizedCall` with the answer read as a JSON object (empty when it is none).
func kitHTTP(
    _ client: HTTPClient, _ method: HTTPMethod, _ url: String, key: String, body: String? = nil
) async throws -> (status: Int, body: [String: Any]) {
    let (status, text) = try await authorizedCall(client, method, url, key: key, body: body)
    let object = (try? JSONSerialization.jsonObject(with: Data(text.utf8))) as? [String: Any] ?? [:]
    return (status, object)
}

/// The kit's executables (`make test` builds them with the kit's own package).
func kitBinary(_ name: String) -> String {
    if let folder = ProcessInfo.processInfo.environment["ADTALLY_KIT_BIN"], !folder.isEmpty { return folder + "/" + name }
    return URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Clients/AdTallyKit/.build/debug/\(name)").path
}

/// Runs statements on a database by its conninfo (the cluster's maintenance database
/// for ALTER DATABASE); the last one's rows, as text.
@discardableResult
func runSQL(_ conninfo: String, _ statements: [String]) async throws -> [[String?]] {
    try await onOwnThread {
        let connection = try PostgresConnection(connecting: conninfo)
        var rows: [[String?]] = []
        for statement in statements {
            let result = try connection.execute(unsafeSQL: statement)
            rows = try result.map { row in try result.columns.indices.map { try row.decode($0, as: String?.self) } }
        }
        return rows
    }
}
