import AdTallyApp
import AdTallyCore
@testable import AdTallyStorage
import AdTallyTestSupport
import Foundation
import Hummingbird
import HummingbirdTesting
import Logging
import NIOCore
import PostgresKit
import Testing

/// A real streaming replica, of a primary of its own (`scripts/test-replica.sh`): both
/// on sockets in a folder beside the suite's cluster. Not a replica of that cluster:
/// it would replay every test's WAL, and under a loaded CI run it lagged past the
/// test's bound for minutes.
final class TestReplica: Sendable {
    let directory: String
    let port = 5433
    let primaryPort = 5434

    private init(root: String) {
        directory = root + "/replica-" + UUID().uuidString.prefix(8).lowercased()
    }

    static var script: String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("scripts/test-replica.sh").path
    }

    /// The primary's maintenance database, for `withTestApp(cluster:)`.
    var primaryCluster: String { "host=\(directory) port=\(primaryPort) user=adtally dbname=postgres" }

    /// Starts a primary and its replica in a folder under the suite's cluster's
    /// (`ADTALLY_TEST_DATABASE_URL`), which removes them if the suite dies first.
    static func start() async throws -> TestReplica {
        let cluster = try TestDatabase.clusterURL
        guard let root = cluster.split(separator: " ").first(where: { $0.hasPrefix("host=") }).map({ String($0.dropFirst(5)) }) else {
            throw TestSetupError(description: "no host= in \(cluster)")
        }
        let replica = TestReplica(root: root)
        // Not Foundation's Process: it waits for pipes the started postgres keeps open.
        let result = try await onOwnThread { [script, directory = replica.directory, primaryPort = replica.primaryPort, port = replica.port] in
            try CommandRunner.run(script, ["start", directory, "\(primaryPort)", "\(port)"])
        }
        guard result.status == 0 else {
            await replica.stop()
            throw TestSetupError(description: "the replica did not start: \(result.output)")
        }
        return replica
    }

    /// The replica's conninfo for the database a primary conninfo names.
    func conninfo(for primary: String) -> String {
        primary.replacingOccurrences(of: "host=\(directory) port=\(primaryPort)", with: "host=\(directory) port=\(port)")
    }

    /// Stops the replica; its primary goes on.
    func stopReplica() async throws {
        let result = try await onOwnThread { [directory] in try CommandRunner.run(Self.script, ["stop-replica", directory]) }
        guard result.status == 0 else { throw TestSetupError(description: "the replica did not stop: \(result.output)") }
    }

    /// Stops both and removes their folder.
    func stop() async {
        _ = try? await onOwnThread { [directory] in
            try CommandRunner.run(Self.script, ["stop", directory])
        }
    }
}

/// Collects what a logger logs, for tests that check a message was logged.
struct CapturingLogHandler: LogHandler {
    let lines: Locked<[String]>
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level = .trace

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(level: Logger.Level, message: Logger.Message, metadata: Logger.Metadata?, source: String, file: String, function: String, line: UInt) {
        lines.withLock { $0.append("\(level) \(message)") }
    }
}

@Suite("Reports from a streaming replica", .serialized)
struct ReplicaTests {
    static func notes(_ body: [String: Any]) -> [String: Any] { body["notes"] as? [String: Any] ?? [:] }

    static func requests(_ body: [String: Any]) -> Int {
        ((body["totals"] as? [String: Any])?["requests"] as? NSNumber)?.intValue ?? -1
    }

    static func ingest(_ client: some TestClientProtocol, _ key: String, count: Int) async throws {
        let events = (0..<count).map { _ in Ingest.event() }
        try await client.execute(uri: "/v1/events", method: .post, headers: Ingest.headers(key), body: Ingest.body(events)) { response in
            #expect(response.status == .ok)
            let receipt = try Ingest.receipt(response)
            #expect(receipt.accepted == count)
        }
    }

    /// The server's bound on replica lag: generous enough for a loaded machine's replay
    /// of this test's own WAL; the paused replica below passes it.
    static let maxLag = 10

    @Test("reports, the CLI, exports and the dashboard read the replica and say its lag; a lagging, paused or stopped replica is skipped for the primary, logged")
    func readReplica() async throws {
        let replica = try await TestReplica.start()
        do {
            try await Self.scenario(replica)
        } catch {
            await replica.stop()
            throw error
        }
        await replica.stop()
    }

    static func scenario(_ replica: TestReplica) async throws {
        var flags = Reports.flags
        flags.readMaxLagSeconds = Self.maxLag
        // The live client sends every request down one connection and does not reopen
        // it; the waits below that go around HTTP (the export run, the paused replica)
        // can add up past the server's 60 s idle timeout on a busy machine, and the next
        // request then fails with "I/O on closed channel" (CI did, once).
        flags.httpIdleTimeoutSeconds = 3600
        let urls = Locked((primary: "", replica: ""))
        try await withTestApp(cluster: replica.primaryCluster, flags: flags, readURL: { primary in
            let url = replica.conninfo(for: primary)
            urls.withLock { $0 = (primary, url) }
            return url
        }) { services, client in
            let keys = try await Ingest.keys(services, app: "rep")
            let (primaryURL, replicaURL) = urls.withLock { $0 }
            let replicaPool = try #require(services.database.readPool)
            let today = ReportQuery.formatDate(Int(Date().timeIntervalSince1970) / 86_400)
            let query = "apps=rep&from=\(today)&to=\(today)&tz=UTC&metrics=requests"
            func report() async throws -> [String: Any] {
                let (status, body) = try await Reports.get(client, keys.read, query)
                #expect(status == .ok, "\(body)")
                return body
            }
            func replicaScans() async throws -> Int64 {
                // Scans of AdTally's tables: this query reads only the statistics views.
                try await replicaPool.query("SELECT sum(coalesce(seq_scan, 0) + coalesce(idx_scan, 0))::bigint FROM pg_stat_user_tables")
                    .first!.decode(0, as: Int64.self)
            }

            // Ingested on the primary, answered by the replica once it has replayed it.
            try await Self.ingest(client, keys.ingest, count: 50)
            // And one impression with revenue in USD, for the FX check below.
            let priced = Ingest.event(type: "impression", extra: #","revenue_micros":2000000,"currency":"USD""#)
            let pricedStatus = try await client.execute(uri: "/v1/events", method: .post, headers: Ingest.headers(keys.ingest), body: Ingest.body([priced])) { $0.status }
            #expect(pricedStatus == .ok)
            var body: [String: Any] = [:]
            try await waitUntil("the replica answers with all 50 events", within: 180) {
                body = try await report()
                return Self.notes(body)["read_from"] as? String == "replica" && Self.requests(body) == 50
            }
            #expect(Self.notes(body)["replica_lag_seconds"] is NSNumber, "\(Self.notes(body))")
            #expect(Self.notes(body)["replica_skipped"] == nil)
            let before = try await replicaScans()
            _ = try await report()
            // Backends publish their counters about once a second.
            try await waitUntil("the replica counts the report's table scans", within: 30) { try await replicaScans() > before }

            // The dashboard and the CLI read it too, and say so.
            try await waitUntil("the dashboard says it read the replica") {
                try await client.execute(uri: "/dashboard?app=rep", method: .get, headers: Reports.headers(keys.read)) { String(buffer: $0.body) }
                    .contains("Read from the replica (replay lag")
            }
            let cli = try await runProcess([
                adtallyBinary(), "report", "--database-url", primaryURL, "--database-read-url", replicaURL, "--apps", "rep", "--from", today, "--to", today,
                "--tz", "UTC", "--metrics", "requests", "--format", "json",
            ])
            #expect(cli.status == 0 && cli.output.contains(#""read_from":"replica""#), "\(cli.output)")

            // An export's manifest names the server its rows came from.
            let directory = Exports.folder()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let schedule = #"{"name":"rep","cron":"0 6 * * *","tz":"UTC","format":"csv","dir":"\#(directory)","query":{"apps":"rep","days":"1","dimensions":"date"}}"#
            let admin = keys.admin
            let created = try await client.execute(uri: "/v1/exports", method: .post, headers: Ingest.headers(admin), body: ByteBuffer(string: schedule)) { $0.status }
            #expect(created == .created)
            // Not while a burst of WAL (the export schedule's, a checkpoint's) holds the replica past the bound.
            try await waitUntil("the replica is within the bound again", within: 180) { Self.notes(try await report())["read_from"] as? String == "replica" }
            let run = try await services.exports.requestRun("rep", slot: nil)
            try await waitUntil("the export ran", within: 60) { try await services.exports.run("rep", slot: run.slot)?.status == "succeeded" }
            let file = try #require(try await services.exports.run("rep", slot: run.slot)?.file)
            let manifest = try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: directory + "/" + file + ".manifest.json"))) as? [String: Any] ?? [:]
            #expect(manifest["read_from"] as? String == "replica" && manifest["replica_lag_seconds"] is NSNumber, "\(manifest)")

            // Replay paused: a reader allowing an hour of lag still reads the replica and
            // gets the old numbers (they really come from it), with the lag it has.
            let lines = Locked<[String]>([])
            let patient = ReportEngine(reads: ReportReads(primary: services.database.reportPool, replica: replicaPool, maxLag: .seconds(3600)))
            let strict = ReportReads(
                primary: services.database.reportPool, replica: replicaPool, maxLag: .seconds(1),
                logger: Logger(label: "test.replica") { _ in CapturingLogHandler(lines: lines) }
            )
            _ = try await replicaPool.query("SELECT pg_wal_replay_pause()")
            try await Self.ingest(client, keys.ingest, count: 10)
            let reportQuery = try ReportQuery.parse(
                [("apps", "rep"), ("from", today), ("to", today), ("tz", "UTC"), ("metrics", "requests")], readable: try await patient.readableApps(only: "rep"), isAdmin: false
            )
            try await waitUntil("the paused replica lags past the server's bound") {
                let stale = try await patient.page(reportQuery)
                // On a busy machine the lag probe itself can take past its 2 s: that report
                // is rightly read from the primary; probe again (seen once in CI).
                if stale.notes.readFrom.replicaSkipped?.contains("did not answer its lag probe") == true { return false }
                #expect(stale.notes.readFrom.server == .replica && stale.totals.requests == 50, "\(stale.notes.readFrom) \(stale.totals.requests)")
                return (stale.notes.readFrom.replicaLagSeconds ?? 0) > Double(Self.maxLag) + 0.5
            }
            // Past the server's bound it answers from the primary, with the new events, and says why.
            body = try await report()
            #expect(Self.notes(body)["read_from"] as? String == "primary" && Self.requests(body) == 60, "\(Self.notes(body))")
            #expect((Self.notes(body)["replica_skipped"] as? String ?? "").contains("more than the \(Self.maxLag).000 s allowed"), "\(Self.notes(body))")
            #expect(Self.notes(body)["replica_lag_seconds"] is NSNull)
            let choice = await strict.choose()
            #expect(choice.readFrom.server == .primary)
            #expect(lines.withLock { $0 }.contains { $0.hasPrefix("warning") && $0.contains("reports read from the primary: the replica lags") }, "\(lines.withLock { $0 })")

            // An FX rate imported while the replica lags is not missing: the primary is asked
            // before a report is refused for it.
            _ = try await services.database.pool.query("""
                INSERT INTO fx_rates (day, base, currency, rate) VALUES (\(today)::date, 'EUR', 'USD', 1.1), (\(today)::date, 'EUR', 'EUR', 1)
                """)
            let inEuros = try ReportQuery.parse(
                [("apps", "rep"), ("from", today), ("to", today), ("tz", "UTC"), ("metrics", "revenue"), ("currency", "EUR")],
                readable: try await patient.readableApps(only: "rep"), isAdmin: false
            )
            let converted = try await patient.page(inEuros)
            #expect(converted.notes.readFrom.server == .primary && (converted.notes.readFrom.replicaSkipped ?? "").contains("FX rate"), "\(converted.notes.readFrom)")
            #expect(converted.totals.revenueMicros > 0)

            // Resumed: back on the replica, caught up, logged.
            _ = try await replicaPool.query("SELECT pg_wal_replay_resume()")
            // Generous: a loaded machine (the suite runs beside this test) slows replay too.
            try await waitUntil("the replica has caught up again", within: 180) {
                body = try await report()
                return Self.notes(body)["read_from"] as? String == "replica" && Self.requests(body) == 60
            }
            try await waitUntil("the strict reader reads the replica again", within: 180) { await strict.choose().readFrom.server == .replica }
            #expect(lines.withLock { $0 }.contains { $0.contains("reports read from the replica again") }, "\(lines.withLock { $0 })")

            // Stopped: reports still answer, from the primary, and say the replica could not be reached.
            try await replica.stopReplica()
            body = try await report()
            #expect(Self.notes(body)["read_from"] as? String == "primary" && Self.requests(body) == 60, "\(Self.notes(body))")
            let skipped = Self.notes(body)["replica_skipped"] as? String ?? ""
            #expect(skipped.contains("could not be reached") || skipped.contains("failed the report"), "\(skipped)")
        }
    }
}
