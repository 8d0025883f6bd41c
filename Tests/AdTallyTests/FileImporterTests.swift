import AdTallyApp
import AdTallyStorage
import Foundation
import Testing

@Suite("adtally ingest FILE")
struct FileImporterTests {
    func write(_ text: String, _ name: String) throws -> String {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("adtally-\(UUID().uuidString)-\(name)")
        try text.write(to: url, atomically: true, encoding: .utf8)
        return url.path
    }

    @Test("NDJSON and CSV import with the same rules; importing twice adds nothing")
    func importTwice() async throws {
        try await withTestApp { services, _ in
            _ = try await services.appStore.createApp(id: "files", name: nil)
            let now = Date().formatted(.iso8601)
            var lines = (0..<2500).map { _ in Ingest.event(type: "tap") }
            lines.insert(#"{"id":"not-a-uuid","type":"tap","occurred_at":"\#(now)","network":"admob","format":"banner"}"#, at: 7)
            let ndjson = try write(lines.joined(separator: "\n") + "\n", "events.ndjson")
            let csv = try write("""
                id,type,occurred_at,network,format,placement,will_leave,revenue_micros,currency,revenue_precision
                \(UUID().uuidString),tap,\(now),nend,banner,"top, left",true,1200,JPY,
                \(UUID().uuidString),impression,\(now),nend,interstitial,,,,,
                \(UUID().uuidString),impression,\(now),nend,native,x,,,EUR,
                \(UUID().uuidString),session,\(now),,,,,,,
                \(UUID().uuidString),impression,\(now),nend,banner,,,500,USD,precise
                \(UUID().uuidString),impression,\(now),nend,banner,,,,,precise
                """, "events.csv")
            let importer = FileImporter(store: services.eventStore, appID: "files", batchSize: 1000)
            var reports = 0
            let first = try await importer.importFiles([ndjson, csv]) { _ in reports += 1 }
            // CSV takes a session (empty network and format: none) and revenue_precision as JSON does.
            #expect(first.accepted == 2504)
            #expect(first.rejected == 3)
            #expect(first.firstRejections[0].hasSuffix(":8: id: must be a UUID"))
            #expect(first.firstRejections[1].hasSuffix(":4: revenue_micros: is required with currency"))
            #expect(first.firstRejections[2].hasSuffix(":7: revenue_precision: is allowed only with revenue_micros"), "\(first.firstRejections)")
            #expect(reports >= 3)
            let second = try await importer.importFiles([ndjson, csv])
            #expect(second.accepted == 0)
            #expect(second.duplicates == 2504)
            #expect(try await Ingest.count(services, "SELECT count(*)::int FROM events") == 2504)
            #expect(try await Ingest.count(services, "SELECT count(*)::int FROM events WHERE type = 'session' AND network = ''") == 1)
            #expect(try await Ingest.count(services, "SELECT revenue_micros::int FROM events WHERE revenue_precision = 'precise'") == 500)
            #expect(try await Ingest.count(services, "SELECT revenue_micros::int FROM rollup_revenue_15m WHERE currency = 'JPY'") == 1200)
            // The import folded its rollup deltas itself (no server was running).
            #expect(try await Ingest.count(services, "SELECT count(*)::int FROM rollup_delta") == 0)
            #expect(try await Ingest.count(services, "SELECT sum(requests + impressions + taps + loads + errors + expiries + action_cancels)::int FROM rollup_15m_compacted") == 2503)
            #expect(try await Ingest.count(services, "SELECT sum(sessions)::int FROM rollup_15m_compacted") == 1)
        }
    }
}
