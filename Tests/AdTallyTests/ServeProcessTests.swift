import AdTallyApp
import AdTallyTestSupport
import AsyncHTTPClient
import Foundation
import NIOCore
import Testing

@Suite("adtally serve as a process")
struct ServeProcessTests {
    /// Tests in one process share swift-metrics' one-time bootstrap, so only a fresh
    /// process shows whether metrics made at start-up reach /metrics.
    @Test("ingest and rollup metrics made at start-up reach /metrics, and a start with an exports root that exists logs no error")
    func metricsFromStartUp() async throws {
        try await TestDatabase.withDatabase { conninfo in
            let (database, secret) = try await openWithApp(conninfo, app: "metrics")
            await database.close()

            let log = FileManager.default.temporaryDirectory.appendingPathComponent("adtally-serve-\(UUID().uuidString).log")
            defer { try? FileManager.default.removeItem(at: log) }
            let port = try freePort()
            let server = try ServerProcess(databaseURL: conninfo, port: port, log: log)
            defer { server.terminate() }
            let client = HTTPClient(eventLoopGroupProvider: .singleton)
            do {
                try await server.waitUntilReady(client)
                var request = HTTPClientRequest(url: "http://127.0.0.1:\(port)/v1/events")
                request.method = .POST
                request.headers.add(name: "Authorization", value: "Bearer \(secret)")
                request.headers.add(name: "Content-Type", value: "application/json")
                request.body = .bytes(ByteBuffer(string: #"{"events":[\#((0..<3).map { _ in Ingest.event() }.joined(separator: ","))]}"#))
                let response = try await client.execute(request, timeout: .seconds(10))
                #expect(response.status == .ok)

                let metrics = try await client.execute(HTTPClientRequest(url: "http://127.0.0.1:\(port)/metrics"), timeout: .seconds(10))
                let text = String(buffer: try await metrics.body.collect(upTo: 1 << 20))
                #expect(text.contains(#"adtally_ingest_events_total{outcome="accepted"} 3"#))
                #expect(text.contains("adtally_ingest_flush_seconds_count"))
                #expect(text.contains("adtally_ingest_queue_events"))
                #expect(text.contains("adtally_rollup_delta_rows_compacted_total"))
                // Prometheus's own linter: HELP on every metric, counters in _total, durations in _seconds.
                let file = FileManager.default.temporaryDirectory.appendingPathComponent("adtally-metrics-\(UUID().uuidString).txt")
                defer { try? FileManager.default.removeItem(at: file) }
                try Data(text.utf8).write(to: file)
                let (status, lint) = try await runProcess(["sh", "-c", "promtool check metrics < '\(file.path)'"])
                #expect(status == 0 && lint.trimmingCharacters(in: .whitespacesAndNewlines).isEmpty, "promtool check metrics: \(lint)")
                #expect(text.contains("# HELP hb_requests_total ") && !text.contains("hb_requests{"))
                // The exports root (the temporary folder) exists already: nothing to report.
                let lines = try String(contentsOf: log, encoding: .utf8).split(separator: "\n")
                #expect(!lines.contains { $0.contains(" error ") || $0.contains(" critical ") }, "\(lines.filter { $0.contains(" error ") })")
            } catch {
                try? await client.shutdown()
                throw error
            }
            try await client.shutdown()
        }
    }
}
