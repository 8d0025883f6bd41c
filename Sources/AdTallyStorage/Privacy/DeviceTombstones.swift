import AdTallyCore
import PostgresKit
import Synchronization

/// The tombstones of erased devices (Migrations/0027): the ingest path's check, and the
/// lock that orders it with an erasure.
///
/// Why a lock: an erasure job records its tombstones, then deletes the device's rows. An
/// ingest transaction that read the tombstones before they were committed could still
/// commit its events after the job deleted that range, and they would stay. So each
/// ingest transaction holds a shared per-app advisory lock from before it reads the
/// tombstones to its commit, and the job records tombstones under that lock held
/// exclusively: an ingest transaction either committed before the tombstones (its rows
/// are there for the job to delete) or reads them. The exclusive lock is held for one
/// short INSERT (`lock_timeout` 1 s, retried), so ingest waits on it no longer.
enum DeviceTombstones {
    /// The per-app lock's key: the app's SHA-256, its first 8 bytes, in a space of its own.
    static func lockKey(app: String) -> Int64 {
        var hash = SHA256()
        hash.update(Array("adtally erasure lock\u{0}".utf8))
        hash.update(Array(app.utf8))
        let bytes = hash.finalize()
        var value: UInt64 = 0
        for byte in bytes.prefix(8) { value = value << 8 | UInt64(byte) }
        return Int64(bitPattern: value)
    }

    /// The positions of `events` whose device has a tombstone from after the event
    /// occurred. Call inside the write's transaction, before it writes anything: it takes
    /// each app's shared lock first, then reads.
    ///
    /// Two statements in the usual case, whatever the number of apps: the locks, then
    /// which of the apps have any tombstone (one statement). Only for
    /// those are the devices hashed (HMAC) and looked up.
    static func erased(_ events: [AppEvent], key: [UInt8], on connection: PostgresConnection) throws -> Set<Int> {
        var apps = Set<String>()
        for item in events where item.event.device != nil { apps.insert(item.appID) }
        guard !apps.isEmpty else { return [] }
        let sorted = apps.sorted()
        _ = try connection.query("SELECT count(pg_advisory_xact_lock_shared(k)) FROM unnest(\(array: sorted.map(lockKey))::bigint[]) AS k")
        // (Not a correlated subquery over unnest(): Citus refuses it. The tombstones of an
        // app are few: pruned once past the event age.)
        let flagged = try connection.query("""
            SELECT DISTINCT app_id FROM device_tombstones WHERE app_id = ANY(\(array: sorted)::text[])
            """).map { try $0.decode(0, as: String.self) }
        guard !flagged.isEmpty else { return [] }
        var erased = Set<Int>()
        for app in flagged {
            // (device) -> the positions naming it, then by the device's keyed hash.
            var devices: [String: [Int]] = [:]
            for (index, item) in events.enumerated() where item.appID == app {
                if let device = item.event.device { devices[device, default: []].append(index) }
            }
            var positions: [PostgresBytes: [Int]] = [:]
            for (device, indices) in devices { positions[PostgresBytes(DeviceErasure.tombstone(key: key, app: app, device: device))] = indices }
            let rows = try connection.query("""
                SELECT device_hash, (extract(epoch FROM erased_at) * 1000000)::bigint FROM device_tombstones
                WHERE app_id = \(app) AND device_hash = ANY(\(array: Array(positions.keys))::bytea[])
                """)
            for row in rows {
                let hash = try row.decode(0, as: PostgresBytes.self)
                let erasedAt = try row.decode(1, as: Int64.self)
                for index in positions[hash] ?? [] where events[index].event.occurredAtMicros < erasedAt { erased.insert(index) }
            }
        }
        return erased
    }
}

/// The tombstone key, resolved once per process: from `ADTALLY_CREDENTIALS_KEY`, or the
/// database's own secret when that is not set (`AppStore.credentialsKey`), as the
/// networks' credentials are sealed. Every server of a database must agree on it.
final class TombstoneKey: Sendable {
    private let given: String?
    private let resolved = Mutex<[UInt8]?>(nil)

    init(credentialsKey: String?) { self.given = credentialsKey }

    /// The key, checked once against the fingerprint the database holds (`verify`): a
    /// process with another key refuses to ingest or erase rather than miss tombstones.
    func key(on connection: PostgresConnection) throws -> [UInt8] {
        if let key = resolved.withLock({ $0 }) { return key }
        let key = DeviceErasure.tombstoneKey(credentialsKey: try AppStore.credentialsKey(given, on: connection))
        try Self.verify(key, on: connection)
        resolved.withLock { $0 = key }
        return key
    }
}

/// This process's key is not the one every tombstone so far was made with.
struct TombstoneKeyMismatch: Error, CustomStringConvertible {
    var description: String {
        "this process's credentials key (ADTALLY_CREDENTIALS_KEY, or the database's own when unset) is not the one the first erasure's tombstones were "
            + "made with (server_secrets.tombstone_key_fingerprint): it would miss every tombstone, so it neither ingests nor erases; give it the servers' ADTALLY_CREDENTIALS_KEY"
    }
}

extension TombstoneKey {
    /// Checks that `key` is the key of every tombstone so far: the first erasure records
    /// its fingerprint (an HMAC of a fixed text, which says nothing of the key).
    static func verify(_ key: [UInt8], on connection: PostgresConnection) throws {
        let fingerprint = SHA256.hex(SHA256.hmac(key: key, message: Array("adtally tombstone key fingerprint".utf8)))
        var recorded: String?
        // A process recording it at the same moment wins the insert; this statement's
        // snapshot may predate its commit, and the next statement sees it.
        for _ in 0..<3 where recorded == nil {
            recorded = try connection.query("""
                WITH made AS (
                    INSERT INTO server_secrets (name, secret) VALUES ('tombstone_key_fingerprint', \(fingerprint)) ON CONFLICT (name) DO NOTHING RETURNING secret
                )
                SELECT secret FROM made UNION ALL SELECT secret FROM server_secrets WHERE name = 'tombstone_key_fingerprint'
                """).first?.decode(0, as: String.self)
        }
        guard recorded == fingerprint else { throw TombstoneKeyMismatch() }
    }
}
