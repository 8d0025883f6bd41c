import AdTallyApp
import AdTallyStorage
import Foundation
import PostgresKit
import Testing

@Suite("Retention and the id horizon")
struct MaintenanceTests {
    @Test("ids are pruned after the widest accepted window plus a day, never sooner")
    func idHorizon() async throws {
        try await withServices { services in
            let pool = services.database.pool
            func seed() async throws {
                try await pool.query("""
                    INSERT INTO event_ids (app_id, event_id, occurred_at) VALUES
                        ('a', gen_random_uuid(), now() - interval '20 days'),
                        ('a', gen_random_uuid(), now() - interval '2 days')
                    """)
            }
            try await seed()
            // Default window (7 days): the 20-day-old id goes, the recent one stays.
            var report = try await services.maintenance.runOnce()
            #expect(report.prunedIDs == 1)
            // An import that accepts 30-day-old events widens the horizon for everyone.
            try await services.eventStore.widenIDHorizon(to: .seconds(30 * 86_400))
            try await services.eventStore.widenIDHorizon(to: .seconds(7 * 86_400))  // never narrows
            try await seed()
            report = try await services.maintenance.runOnce()
            #expect(report.prunedIDs == 0)
            #expect(try await Ingest.count(services, "SELECT count(*)::int FROM event_ids") == 3)
        }
    }

    @Test("partitions older than the retention period are dropped whole")
    func retentionDropsPartitions() async throws {
        try await withServices(flags: .init(retentionDays: 10)) { services in
            let old = Date().addingTimeInterval(-20 * 86_400)
            let store = services.eventStore
            // Store an old event directly (validation would refuse it), as history would be.
            let event = AppEvent(appID: "a", event: .init(
                id: UUID(), type: .request, occurredAtMicros: Int64(old.timeIntervalSince1970 * 1_000_000), network: "admob", format: .banner
            ))
            #expect(try await store.store([event]) == [true])
            #expect(try await Ingest.count(services, "SELECT count(*)::int FROM events") == 1)
            let report = try await services.maintenance.runOnce()
            #expect(report.droppedPartitions.count == 1)
            #expect(try await Ingest.count(services, "SELECT count(*)::int FROM events") == 0)
            // Rollups are kept: they are the long-term record.
            #expect(try await Ingest.count(services, "SELECT sum(requests)::int FROM rollup_15m") == 1)
        }
    }

    @Test("a wider window lets adtally ingest load older history")
    func widerImportWindow() async throws {
        try await withServices { services in
            _ = try await services.appStore.createApp(id: "history", name: nil)
            let url = FileManager.default.temporaryDirectory.appendingPathComponent("adtally-\(UUID().uuidString).ndjson")
            try Ingest.event(at: Date().addingTimeInterval(-20 * 86_400)).write(to: url, atomically: true, encoding: .utf8)
            defer { try? FileManager.default.removeItem(at: url) }
            let narrow = try await FileImporter(store: services.eventStore, appID: "history").importFiles([url.path])
            #expect(narrow.rejected == 1)
            #expect(narrow.firstRejections.first?.contains("occurred_at: is more than 7 days in the past") == true)
            let wide = try await FileImporter(store: services.eventStore, appID: "history", maxAge: .seconds(30 * 86_400))
                .importFiles([url.path])
            #expect(wide.accepted == 1)
        }
    }
}
