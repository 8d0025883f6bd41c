import AdTallyApp
import AdTallyCore
import AdTallyStorage
import Foundation
import Testing

@Suite("Group commit")
struct IngestBatcherTests {
    @Test("a request whose events cannot be written fails alone; the others in its group are stored")
    func badRequestFailsAlone() async throws {
        try await withServices { services in
            let batcher = IngestBatcher(store: services.eventStore, configuration: .init(flushers: 1))
            func event(placement: String = "default") -> AppEvent {
                AppEvent(appID: "a", event: AdEvent(
                    id: UUID(), type: .request, occurredAtMicros: Int64(Date().timeIntervalSince1970 * 1_000_000),
                    network: "admob", format: .banner, placement: placement
                ))
            }
            // Validation refuses U+0000; built by hand, it makes the COPY fail for the whole group.
            let good = [event(), event()]
            let bad = [event(placement: "a\u{0}b")]
            let goodReceipt = Task { try await batcher.submit(good) }
            let badReceipt = Task { try await batcher.submit(bad) }
            // Both are queued before any writer runs, so they are written as one group.
            try await Task.sleep(for: .milliseconds(200))
            let writers = Task { await batcher.run() }
            let receipt = try await goodReceipt.value
            #expect(receipt.accepted == 2)
            #expect(receipt.duplicates == 0)
            await #expect(throws: (any Error).self) { _ = try await badReceipt.value }
            batcher.finish()
            await writers.value
            #expect(try await Ingest.count(services, "SELECT count(*)::int FROM events") == 2)
        }
    }
}
