@testable import AdTallyApp
import AdTallyTestSupport
import AsyncHTTPClient
import Foundation
import NIOCore
import Testing

@Suite("adtally serve as a process")
struct ServeProcessTests {
    /// A rule or panel on a misspelled metric still evaluates, to nothing: promtool and
    /// Prometheus both call it healthy.
    @Test("every metric the operators' alert rules and the ingest dashboard read is one the server exports")
    func rulesReadRealMetrics() throws {
        let exported = Set(DescribedMetricsFactory.described.values.map(\.name))
        let pattern = try NSRegularExpression(pattern: #"\b((?:adtally|hb|http_server)_[a-z0-9_]+)"#)
        var read = Set<String>()
        for file in ["Dashboards/alerts.yml", "Dashboards/adtally-ingest.json"] {
            let text = try String(contentsOf: DashboardTests.repository.appendingPathComponent(file), encoding: .utf8)
            for match in pattern.matches(in: text, range: NSRange(text.startIndex..., in: text)) {
                var name = String(text[Range(match.range(at: 1), in: text)!])
                // A histogram's series.
                for suffix in ["_bucket", "_sum", "_count"] where name.hasSuffix(suffix) && !exported.contains(name) { name = String(name.dropLast(suffix.count)) }
                read.insert(name)
            }
        }
        #expect(read.count > 10, "\(read)")
        #expect(read.subtracting(exported).isEmpty, "read but not exported: \(read.subtracting(exported).sorted())")
    }

    /// Tests in one process share swift-metrics' one-time bootstrap, so only a fresh
    /// process shows whether metrics made at start-up reach /metrics.
    @Test("ingest and rollup metrics made at start-up reach /metrics, and a start with an exports root that exists logs no error")
    func metricsFromStartUp() async throws {
        try await withMigratedDatabase { conninfo in
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

    @Test("a real Prometheus scrapes a live server with Dashboards/prometheus.yml's job, loads Dashboards/alerts.yml, and answers adtally_ingest_events_total")
    func prometheusScrapes() async throws {
        try await TestDatabase.withDatabase { conninfo in
            try await withReadyServer(conninfo) { server, _ in
                // The compose stack's configuration, its target this server and its interval a second.
                let folder = FileManager.default.temporaryDirectory.appendingPathComponent("adtally-prometheus-\(UUID().uuidString)")
                try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
                defer { try? FileManager.default.removeItem(at: folder) }
                let dashboards = DashboardTests.repository.appendingPathComponent("Dashboards")
                let configuration = try String(contentsOf: dashboards.appendingPathComponent("prometheus.yml"), encoding: .utf8)
                #expect(configuration.contains("\"adtally:8080\"") && configuration.contains("alerts.yml"))
                try configuration.replacingOccurrences(of: "\"adtally:8080\"", with: "\"127.0.0.1:\(server.port)\"")
                    .replacingOccurrences(of: "scrape_interval: 15s", with: "scrape_interval: 1s")
                    .replacingOccurrences(of: "evaluation_interval: 15s", with: "evaluation_interval: 1s")
                    .write(to: folder.appendingPathComponent("prometheus.yml"), atomically: true, encoding: .utf8)
                try FileManager.default.copyItem(at: dashboards.appendingPathComponent("alerts.yml"), to: folder.appendingPathComponent("alerts.yml"))
                let port = try freePort()
                let prometheus = Process()
                prometheus.executableURL = URL(fileURLWithPath: "/usr/bin/env")
                prometheus.arguments = [
                    "prometheus", "--config.file=\(folder.path)/prometheus.yml", "--storage.tsdb.path=\(folder.path)/data",
                    "--web.listen-address=127.0.0.1:\(port)", "--log.level=warn",
                ]
                let log = folder.appendingPathComponent("prometheus.log")
                FileManager.default.createFile(atPath: log.path, contents: nil)
                let handle = try FileHandle(forWritingTo: log)
                prometheus.standardOutput = handle
                prometheus.standardError = handle
                try prometheus.run()
                defer {
                    prometheus.terminate()
                    prometheus.waitUntilExit()
                }
                let client = HTTPClient(eventLoopGroupProvider: .singleton)
                defer { _ = client.shutdown() }
                func get(_ path: String) async -> [String: Any]? {
                    guard let response = try? await client.execute(HTTPClientRequest(url: "http://127.0.0.1:\(port)\(path)"), timeout: .seconds(5)),
                          response.status == .ok, let body = try? await response.body.collect(upTo: 1 << 22) else { return nil }
                    return (try? JSONSerialization.jsonObject(with: Data(buffer: body))) as? [String: Any]
                }
                var series: [[String: Any]] = []
                let scraped = try await eventually(within: 60) {
                    let answer = await get("/api/v1/query?query=adtally_ingest_events_total")
                    series = ((answer?["data"] as? [String: Any])?["result"] as? [[String: Any]]) ?? []
                    return !series.isEmpty
                }
                #expect(scraped, "Prometheus never answered adtally_ingest_events_total: \((try? String(contentsOf: log, encoding: .utf8)) ?? "")")
                let labels = series.compactMap { $0["metric"] as? [String: String] }
                #expect(labels.contains { $0["job"] == "adtally" && $0["instance"] == "127.0.0.1:\(server.port)" && $0["outcome"] == "accepted" }, "\(labels)")
                // Every operators' rule loaded, and evaluated without error.
                var rules: [[String: Any]] = []
                let evaluated = try await eventually(within: 30) {
                    let groups = (((await get("/api/v1/rules"))?["data"] as? [String: Any])?["groups"] as? [[String: Any]]) ?? []
                    rules = groups.flatMap { ($0["rules"] as? [[String: Any]]) ?? [] }
                    return rules.count == 14 && rules.allSatisfy { $0["health"] as? String == "ok" }
                }
                #expect(evaluated, "\(rules.map { ($0["name"] ?? "", $0["health"] ?? "", $0["lastError"] ?? "") })")
            }
        }
    }
}
