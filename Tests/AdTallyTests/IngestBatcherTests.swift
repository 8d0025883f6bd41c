import AdTallyApp
import AdTallyCore
import AdTallyStorage
import AdTallyTestSupport
import Foundation
import PostgresKit
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

    @Test("while one transaction is writing, a free writer lingers once so small requests share a transaction")
    func lingerGroupsSmallRequests() async throws {
        try await withServices(flags: .init(poolSize: 6)) { services in
            let batcher = IngestBatcher(
                store: services.eventStore,
                // Long enough that C, started 20 ms after B, arrives inside it on a loaded machine.
                configuration: .init(flushers: 2, lingerBelowEvents: 100, linger: .seconds(3))
            )
            func event(_ id: UUID = UUID()) -> AppEvent {
                AppEvent(appID: "a", event: AdEvent(
                    id: id, type: .request, occurredAtMicros: Int64(Date().timeIntervalSince1970 * 1_000_000),
                    network: "admob", format: .banner
                ))
            }
            // Another session claims request A's id without committing, so A's transaction
            // waits on the ledger's unique index: one writer is busy.
            let blockedID = UUID()
            let blocker = try PostgresConnection(connecting: services.database.pool.configuration.conninfo)
            try blocker.execute(unsafeSQL: "BEGIN")
            try blocker.query("INSERT INTO event_ids (app_id, event_id, occurred_at) VALUES ('a', \(blockedID), now())")
            let writers = Task { await batcher.run() }
            let a = Task { try await batcher.submit([event(blockedID)]) }
            // Until A's transaction waits on the blocker's lock.
            let blockerPID = blocker.backendPID
            let blocked = try await eventually {
                try await Ingest.count(services, "SELECT count(*)::int FROM pg_stat_activity WHERE \(blockerPID) = ANY(pg_blocking_pids(pid))") == 1
            }
            try #require(blocked, "request A never waited on the blocking session")
            // B and then C, 20 ms apart: the free writer lingers instead of writing B alone.
            let b = Task { try await batcher.submit([event()]) }
            try await Task.sleep(for: .milliseconds(20))
            let c = Task { try await batcher.submit([event()]) }
            #expect(try await b.value.accepted == 1)
            #expect(try await c.value.accepted == 1)
            // One transaction wrote both: their rows share a transaction id.
            #expect(try await Ingest.count(services, "SELECT count(DISTINCT xmin::text)::int FROM events") == 1)
            try blocker.execute(unsafeSQL: "ROLLBACK")
            #expect(try await a.value.accepted == 1)
            batcher.finish()
            await writers.value
            #expect(try await Ingest.count(services, "SELECT count(*)::int FROM events") == 3)
        }
    }
}
