import Foundation
import Logging
import PostgresKit

/// A role one server at a time holds (the export runner, the alert evaluator): held
/// while a session advisory lock is held on a connection of its own (a pool of one).
/// Everything the leader records goes through that connection, so a leader whose
/// connection died — and with it the lock, which another server then takes — cannot
/// record anything more.
struct Leadership: Sendable {
    /// The lock's key.
    var lockKey: Int64
    /// What the role is, for the log and `application_name` ("export runner").
    var role: String
    /// The one-row table that names the holder and since when (`adtally status` reads
    /// it beside the lock: `holder`).
    var table: String
    /// This server.
    var identity: String
    /// How long a follower waits before trying the lock again.
    var tick: Duration
    var logger: Logger

    /// Runs until cancelled: waits for the lock, then `take` (on the lock's connection,
    /// once), then `lead` while it holds it. `leading` sees each change.
    func run(
        pool: PostgresPool, leading: @Sendable (Bool) -> Void,
        take: @escaping @Sendable (PostgresConnection) throws -> Void, lead: @Sendable (PostgresLease) async throws -> Void
    ) async {
        while !Task.isCancelled {
            do {
                try await pool.withLease { lease in
                    guard try await lease.run({ connection in try self.tryLock(connection, take: take) }) else { return }
                    leading(true)
                    defer { leading(false) }
                    logger.info("this server is the \(role)", metadata: ["runner": "\(identity)"])
                    let ended: Result<Void, any Error>
                    do {
                        try await lead(lease)
                        ended = .success(())
                    } catch {
                        ended = .failure(error)
                    }
                    // Whatever ended the lead (shutdown or an error), hand it over now, not when the
                    // pool closes; a lock taken again on this same session would only raise its count.
                    _ = try? await lease.run { try $0.query("SELECT pg_advisory_unlock_all()") }
                    try ended.get()
                }
            } catch where Task.isCancelled {
                break
            } catch {
                logger.error("the \(role) lost the database; trying again", metadata: ["error": "\(error)"])
            }
            try? await Task.sleep(for: tick)
        }
    }

    /// Takes the lock if it is free, then runs `take`; false when another server holds it.
    func tryLock(_ connection: PostgresConnection, take: (PostgresConnection) throws -> Void) throws -> Bool {
        _ = try connection.query("SELECT set_config('application_name', \("adtally " + role + " " + identity), false)")
        // Over TCP, let PostgreSQL notice a leader that vanished (and free its lock) within
        // about a minute, not the system's two hours.
        _ = try connection.execute(unsafeSQL: "SET tcp_keepalives_idle = 30; SET tcp_keepalives_interval = 10; SET tcp_keepalives_count = 3; SET tcp_user_timeout = 60000")
        guard try connection.query("SELECT pg_try_advisory_lock(\(lockKey))")[0].decode(0, as: Bool.self) else { return false }
        try take(connection)
        _ = try connection.query("""
            INSERT INTO \(unsafeRaw: table) (runner, since) VALUES (\(identity), now())
            ON CONFLICT (id) DO UPDATE SET runner = excluded.runner, since = excluded.since
            """)
        return true
    }

    /// Who holds a role now and since when, read from its table only while its lock is
    /// held (a holder that died left the row but not the lock); nil when nobody leads.
    static func holder(_ connection: PostgresConnection, table: String, lockKey: Int64) throws -> (runner: String, since: Date?)? {
        guard let row = try connection.query("""
            SELECT t.runner, t.since FROM \(unsafeRaw: table) t
            WHERE EXISTS (SELECT 1 FROM pg_locks l
                          WHERE l.locktype = 'advisory' AND l.granted AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                            AND l.objsubid = 1 AND ((l.classid::bigint << 32) | l.objid::bigint) = \(lockKey))
            """).first else { return nil }
        return (try row.decode(0), try row.decode(1))
    }
}

/// The wait before attempt `attempt + 1` of a run or a delivery that failed: `base`,
/// doubled for each attempt after the first, at most `cap`.
func retryDelay(attempt: Int, base: Duration, cap: Duration) -> Duration {
    min(base * (1 << min(max(attempt - 1, 0), 20)), cap)
}
