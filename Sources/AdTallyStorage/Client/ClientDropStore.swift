import Foundation
import PostgresKit

/// Counts of events apps' queues dropped before sending them (Migrations/0011,
/// DESIGN §10): the kit reports each loss once, by an id it made for the report.
public struct ClientDropStore: Sendable {
    /// Why a queue dropped events; the kit's `DropReason`.
    public static let reasons = ["queue_full", "expired", "damaged", "forgotten", "opted_out"]
    /// The most one report may carry: more than any queue's bound holds.
    public static let maxDropped: Int64 = 1_000_000_000

    let pool: PostgresPool

    /// Creates a store over a pool.
    public init(pool: PostgresPool) { self.pool = pool }

    /// Records a report; false when its id was already recorded for the app (a retry).
    public func record(app: String, id: UUID, reason: String, dropped: Int64) async throws -> Bool {
        let rows = try await pool.query("""
            INSERT INTO client_drops (app_id, report_id, reason, dropped) VALUES (\(app), \(id), \(reason), \(dropped))
            ON CONFLICT (app_id, report_id) DO NOTHING RETURNING 1
            """)
        return !rows.isEmpty
    }
}
