import AdTallyApp
import AdTallyCore
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

    /// Before: ids pruned under a 7-day window came back when an import widened it,
    /// and the same events counted twice.
    @Test("events whose ids were pruned are refused, whatever window a later import uses")
    func prunedIDsStayRefused() async throws {
        try await withServices { services in
            _ = try await services.appStore.createApp(id: "history", name: nil)
            let url = FileManager.default.temporaryDirectory.appendingPathComponent("adtally-\(UUID().uuidString).ndjson")
            let old = Date().addingTimeInterval(-10 * 86_400)
            let line = Ingest.event(at: old)
            try line.write(to: url, atomically: true, encoding: .utf8)
            defer { try? FileManager.default.removeItem(at: url) }
            // Stored while it was recent (as a server would have), then pruned by a pass
            // under the default 7-day horizon.
            let raw = try EventBatchReader.readNDJSON(Array(line.utf8))
            guard case .event(let fields) = raw.first else { Issue.record("unreadable"); return }
            var validator = EventValidator(appID: "history", maxAge: .seconds(30 * 86_400))
            validator.maxAge = .seconds(30 * 86_400)
            let event = try validator.validate(fields, nowMicros: Int64(Date().timeIntervalSince1970 * 1_000_000))
            #expect(try await services.eventStore.store([AppEvent(appID: "history", event: event)]) == [true])
            let report = try await services.maintenance.runOnce()
            #expect(report.prunedIDs == 1)
            // An import with a 30-day window now refuses it instead of storing it again.
            let again = try await FileImporter(store: services.eventStore, appID: "history", maxAge: .seconds(30 * 86_400))
                .importFiles([url.path])
            #expect(again.accepted == 0)
            #expect(again.rejected == 1)
            #expect(again.firstRejections.first?.contains("dedupe ledger has been pruned") == true)
            #expect(try await Ingest.count(services, "SELECT count(*)::int FROM events") == 1)
            // Pruning goes by time ranges and leaves younger ids alone.
            #expect(try await Ingest.count(services, "SELECT count(*)::int FROM event_ids") == 0)
        }
    }
}
