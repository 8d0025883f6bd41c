import AdTallyApp
import AdTallyCore
import AdTallyStorage
import AdTallyTestSupport
import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import PostgresKit
import Testing

@Suite("Several servers on one database")
struct MultiServerTests {
    /// One look at who holds the two cluster-wide locks.
    struct Sample: Sendable {
        var at: ContinuousClock.Instant
        var runners: [String]
        var compactors: Int
    }

    static func lockParts(_ key: Int64) -> (classid: Int64, objid: Int64) {
        (Int64(UInt64(bitPattern: key) >> 32), Int64(UInt64(bitPattern: key) & 0xFFFF_FFFF))
    }

    @Test("three adtally serve processes, one SIGKILLed mid-ingest: every acknowledged event counted once, one compactor and one export runner at a time")
    func threeServers() async throws {
        try await withMigratedDatabase { conninfo in
            let (database, ingestKey) = try await openWithApp(conninfo, app: "multi")
            let store = AppStore(pool: database.pool)
            let admin = try await store.createKey(app: nil, scope: .admin).secret
            let read = try await store.createKey(app: "multi", scope: .read).secret
            let directory = Exports.folder()
            let logs = (0..<3).map { FileManager.default.temporaryDirectory.appendingPathComponent("adtally-multi-\($0)-\(UUID().uuidString).log") }
            defer {
                try? FileManager.default.removeItem(atPath: directory)
                for log in logs { try? FileManager.default.removeItem(at: log) }
            }
            let servers = try logs.map { try ServerProcess(databaseURL: conninfo, port: try freePort(), log: $0) }
            defer { servers.forEach { $0.terminate() } }
            let client = HTTPClient(eventLoopGroupProvider: .singleton)
            do {
                try await Self.run(servers, database, client, ingestKey: ingestKey, admin: admin, read: read, directory: directory, logs: logs)
            } catch {
                for server in servers { await server.stop() }
                try? await client.shutdown()
                await database.close()
                throw error
            }
            for server in servers { await server.stop() }
            try await client.shutdown()
            await database.close()
        }
    }

    static func run(
        _ servers: [ServerProcess], _ database: Database, _ client: HTTPClient, ingestKey: String, admin: String, read: String, directory: String, logs: [URL]
    ) async throws {
        for server in servers { try await server.waitUntilReady(client) }
        let alive = Locked(Set(servers.indices))
        func url(_ index: Int, _ path: String) -> String { "http://127.0.0.1:\(servers[index].port)\(path)" }
        func call(_ index: Int, _ method: HTTPMethod, _ path: String, key: String, body: String? = nil) async throws -> (Int, String) {
            try await authorizedCall(client, method, url(index, path), key: key, body: body, timeout: 20)
        }

        // Who holds the export runner's session lock and the compactor's transaction
        // lock, every 20 ms, from beginning to end. The runner is named as it records
        // itself in export_leader when it takes the lead (its connection's
        // application_name is cut at 63 bytes, which may cut the port off).
        let runnerKey = lockParts(ExportRunner.lockKey)
        let compactorKey = lockParts(0x4164_526F_6C6C)
        let samples = Locked([Sample]())
        let sampling = Locked(true)
        let sampler = Task {
            while !Task.isCancelled, sampling.withLock({ $0 }) {
                if let rows = try? await database.pool.query("""
                    SELECT (l.classid::bigint = \(runnerKey.classid) AND l.objid::bigint = \(runnerKey.objid)), coalesce((SELECT runner FROM export_leader), '')
                    FROM pg_locks l
                    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                      AND ((l.classid::bigint = \(runnerKey.classid) AND l.objid::bigint = \(runnerKey.objid))
                           OR (l.classid::bigint = \(compactorKey.classid) AND l.objid::bigint = \(compactorKey.objid)))
                    """) {
                    var sample = Sample(at: .now, runners: [], compactors: 0)
                    for row in rows {
                        if (try? row.decode(0, as: Bool.self)) == true { sample.runners.append((try? row.decode(1, as: String.self)) ?? "?") } else { sample.compactors += 1 }
                    }
                    samples.withLock { $0.append(sample) }
                }
                try? await Task.sleep(for: .milliseconds(20))
            }
        }
        defer {
            sampling.withLock { $0 = false }
            sampler.cancel()
        }
        func leaderIndex() -> Int? {
            guard let name = samples.withLock({ $0.last?.runners.first }) else { return nil }
            return servers.indices.first { name.contains(":\(servers[$0].port) pid \(servers[$0].process.processIdentifier)") }
        }

        // Four export schedules; two run before the kill, two after it.
        for name in ["e1", "e2", "e3", "e4"] {
            let schedule = #"{"name":"\#(name)","cron":"0 6 1 1 *","tz":"UTC","format":"csv","dir":"\#(directory)","query":{"apps":"multi","days":"1","dimensions":"date,network"}}"#
            let (status, text) = try await call(0, .POST, "/v1/exports", key: admin, body: schedule)
            #expect(status == 201, "\(text)")
        }
        func runs(_ name: String) async throws -> [[String: Any]] {
            let (_, text) = try await call(alive.withLock { $0.min()! }, .GET, "/v1/exports/\(name)/runs", key: admin)
            let object = try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any]
            return object?["runs"] as? [[String: Any]] ?? []
        }
        func runNow(_ name: String, on server: Int) async throws {
            let (status, text) = try await call(server, .POST, "/v1/exports/\(name)/run", key: admin, body: "{}")
            #expect(status == 202, "\(text)")
        }
        func waitForRuns(_ names: [String], seconds: Int) async throws {
            let deadline = ContinuousClock.now + .seconds(seconds)
            while ContinuousClock.now < deadline {
                var done = true
                for name in names where try await runs(name).first?["status"] as? String != "succeeded" { done = false }
                if done { return }
                try await Task.sleep(for: .milliseconds(200))
            }
            var last: [String: [[String: Any]]] = [:]
            for name in names { last[name] = try await runs(name) }
            Issue.record("export runs \(names) did not all succeed in \(seconds) s: \(last)")
        }
        try await runNow("e1", on: 1)
        try await runNow("e2", on: 2)
        try await waitForRuns(["e1", "e2"], seconds: 60)

        // Many clients, requests spread over the three servers; a batch that gets no
        // 200 (its server died, or answered 503) goes again to the next server.
        let batchCount = 240, perBatch = 100, clients = 12
        let bodies = (0..<batchCount).map { _ in (0..<perBatch).map { _ in Ingest.event(type: "impression") } }
        let acked = Locked([Int: (accepted: Int, duplicates: Int)]())
        let attempts = Locked(0)
        let next = Locked(0)
        let killedIndex = Locked<Int?>(nil)
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<clients {
                group.addTask {
                    while let index = next.withLock({ value -> Int? in
                        guard value < batchCount else { return nil }
                        defer { value += 1 }
                        return value
                    }) {
                        var server = index % servers.count
                        for _ in 0..<60 {
                            attempts.withLock { $0 += 1 }
                            if let (status, text) = try? await call(server, .POST, "/v1/events", key: ingestKey, body: #"{"events":[\#(bodies[index].joined(separator: ","))]}"#),
                               status == 200, let receipt = try? JSONDecoder().decode(Ingest.Receipt.self, from: Data(text.utf8)) {
                                acked.withLock { $0[index] = (receipt.accepted, receipt.duplicates) }
                                break
                            }
                            server = (server + 1) % servers.count
                            try? await Task.sleep(for: .milliseconds(50))
                        }
                    }
                }
            }
            // In the middle: SIGKILL the server that runs the exports.
            group.addTask {
                // (Or after a minute: a failing ingest must fail the test, not hang it.)
                _ = try? await eventually { acked.withLock { $0.count } >= batchCount / 3 }
                let victim = leaderIndex() ?? 0
                servers[victim].kill()
                alive.withLock { _ = $0.remove(victim) }
                killedIndex.withLock { $0 = victim }
            }
        }
        let victim = try #require(killedIndex.withLock { $0 })
        let survivors = alive.withLock { $0.sorted() }
        let receipts = acked.withLock { $0 }
        #expect(receipts.count == batchCount, "every batch acknowledged in the end")

        // The exports go on under a new leader, one of the two left.
        try await runNow("e3", on: survivors[0])
        try await runNow("e4", on: survivors[1])
        try await waitForRuns(["e3", "e4"], seconds: 90)

        // Compaction drains the deltas (every 5 s, by whichever server gets the lock).
        let deadline = ContinuousClock.now + .seconds(60)
        while try await database.pool.query("SELECT count(*)::int FROM rollup_delta")[0].decode(0, as: Int.self) > 0, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(200))
        }
        sampling.withLock { $0 = false }
        await sampler.value

        // Every acknowledged event once: in the events, the dedupe ledger, the compacted
        // rollups, and the report any server gives.
        let total = batchCount * perBatch
        let counts = try await database.pool.query("""
            SELECT (SELECT count(*) FROM events)::int, (SELECT count(DISTINCT event_id) FROM events)::int, (SELECT count(*) FROM event_ids)::int,
                   (SELECT count(*) FROM rollup_delta)::int, (SELECT coalesce(sum(impressions), 0) FROM rollup_15m_compacted)::int,
                   (SELECT coalesce(sum(impressions), 0) FROM rollup_day_compacted)::int
            """)[0]
        #expect(try counts.decode(0, as: Int.self) == total)
        #expect(try counts.decode(1, as: Int.self) == total)
        #expect(try counts.decode(2, as: Int.self) == total)
        #expect(try counts.decode(3, as: Int.self) == 0, "compaction drained the deltas")
        #expect(try counts.decode(4, as: Int.self) == total)
        #expect(try counts.decode(5, as: Int.self) == total)
        let today = Int(Date().timeIntervalSince1970) / 86_400
        for server in survivors {
            let (status, text) = try await call(
                server, .GET, "/v1/reports?apps=multi&from=\(ReportQuery.formatDate(today - 1))&to=\(ReportQuery.formatDate(today))&tz=UTC&metrics=impressions", key: read
            )
            let body = try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any] ?? [:]
            let impressions = ((body["totals"] as? [String: Any])?["impressions"] as? NSNumber)?.intValue
            #expect(status == 200 && impressions == total, "server \(server): \(text.prefix(300))")
        }

        // One compactor at a time: the recorded passes (each read its instants while
        // holding the lock) never overlap, and no sample saw two holders.
        let passes = try await database.pool.query("""
            SELECT server, started_at::text, finished_at::text, delta_rows,
                   coalesce(started_at >= lag(finished_at) OVER (ORDER BY started_at, finished_at), true)
            FROM rollup_compaction_passes ORDER BY started_at, finished_at
            """)
        #expect(passes.count >= 1)
        var compactingServers = Set<String>()
        for pass in passes {
            let server = try pass.decode(0, as: String.self), started = try pass.decode(1, as: String.self)
            compactingServers.insert(server)
            #expect(try pass.decode(4, as: Bool.self), "pass by \(server) from \(started) overlaps the one before it")
        }
        let taken = samples.withLock { $0 }
        #expect(taken.count > 100, "samples: \(taken.count)")
        #expect(taken.allSatisfy { $0.runners.count <= 1 && $0.compactors <= 1 }, "two holders of one lock at once")

        // One export runner at a time: the killed leader, then one survivor.
        let victimName = ":\(servers[victim].port) pid \(servers[victim].process.processIdentifier)"
        let holders = taken.compactMap(\.runners.first)
        let firstAfter = holders.firstIndex { !$0.contains(victimName) }
        #expect(holders.first?.contains(victimName) == true, "the killed server led the exports: \(holders.first ?? "none")")
        #expect(firstAfter != nil && holders[firstAfter!...].allSatisfy { !$0.contains(victimName) }, "a survivor took over and kept it")
        for name in ["e1", "e2", "e3", "e4"] {
            let list = try await runs(name)
            #expect(list.count == 1 && list.first?["status"] as? String == "succeeded", "\(name): \(list)")
            let runner = list.first?["runner"] as? String ?? ""
            if name >= "e3" {
                #expect(!runner.contains(victimName) && !runner.isEmpty, "\(name) ran on \(runner)")
            } else {
                #expect(runner.contains(victimName), "\(name) ran before the kill on the leader, the victim: \(runner)")
            }
            let files = Exports.files(directory, name)
            #expect(files.data.count == 1 && files.manifests.count == 1 && files.temporary.isEmpty, "\(name): \(files)")
        }
        let log = (try? String(contentsOf: logs[survivors[0]], encoding: .utf8)) ?? ""
        print("three servers: \(total) events in \(receipts.count) batches over \(attempts.withLock { $0 }) requests; killed server \(victim); "
            + "\(passes.count) compaction passes by \(compactingServers.count) servers; \(taken.count) lock samples; survivor log \(log.count) bytes")
    }
}
