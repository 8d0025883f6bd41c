import AdTallyApp
import AdTallyCore
@testable import AdTallyHTTP
import AdTallyTestSupport
@testable import AdTallyStorage
import AsyncHTTPClient
import Foundation
import Hummingbird
import HummingbirdTesting
import NIOCore
import PostgresKit
import Testing

/// Privacy (DESIGN §15): erasure of a device and its tombstones, access to its data,
/// retention per app. Over the cohort reports' hand-computed fixture (CohortReportTests).
@Suite("Privacy: erasure, tombstones, access, retention", .serialized)
struct PrivacyTests {
    /// Every row of a device, per table.
    static func rows(of device: String, app: String = "ktm", _ pool: PostgresPool) async throws -> [String: Int] {
        let row = try await pool.query("""
            SELECT (SELECT count(*) FROM events WHERE app_id = \(app) AND device = \(device))::int,
                   (SELECT count(*) FROM installs WHERE app_id = \(app) AND device = \(device))::int,
                   (SELECT count(*) FROM install_days WHERE app_id = \(app) AND device = \(device))::int,
                   (SELECT count(*) FROM install_day_revenue WHERE app_id = \(app) AND device = \(device))::int,
                   (SELECT count(*) FROM install_delta WHERE app_id = \(app) AND device = \(device))::int,
                   (SELECT count(*) FROM experiment_exposures WHERE app_id = \(app) AND device = \(device))::int
            """)[0]
        return [
            "events": try row.decode(0), "installs": try row.decode(1), "install_days": try row.decode(2),
            "install_day_revenue": try row.decode(3), "install_delta": try row.decode(4), "experiment_exposures": try row.decode(5),
        ]
    }

    static func json(_ response: TestResponse) -> [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(response.body.readableBytesView)) as? [String: Any]) ?? [:]
    }

    /// Waits for an erasure to finish, with the runner running (as a server's service does).
    static func waitForErasure(_ client: some TestClientProtocol, _ admin: String, _ id: String) async throws -> [String: Any] {
        var last: [String: Any] = [:]
        try await waitUntil("erasure \(id) is done", within: 60) {
            last = try await client.execute(uri: "/v1/erasures/\(id)", method: .get, headers: Reports.headers(admin)) { Self.json($0) }
            return ["done", "failed"].contains(last["status"] as? String ?? "")
        }
        return last
    }

    @Test("erasing a device removes its raw events, install and daily rows (the cohort grain loses it), keeps the rollups, logs no id, and refuses its old events as erased while later ones are stored")
    func erasure() async throws {
        try await withTestApp(flags: Reports.flags) { services, client in
            let (admin, today, d0) = try await CohortReportTests.fixtureMoney(services)
            let adminID = try await services.appStore.listKeys().first { $0.scope == .admin }!.id
            let ingest = try await services.appStore.createKey(app: "ktm", scope: .ingest).secret
            let pool = services.database.pool
            for batch in CohortReportTests.batches(d0: d0, today: today) { try await Reports.store(services, app: "ktm", batch) }
            try await services.compactor.compactOnce()
            // One more event of A still pending in install_delta when the job runs.
            try await Reports.store(services, app: "ktm", [CohortReportTests.event("A", .session, day: d0 + 8, 12)])
            let cohorts = "apps=ktm&dimensions=cohort&from=\(ReportQuery.formatDate(d0))&to=\(ReportQuery.formatDate(today - 1))&metrics=installs,revenue_per_install_d7"
            let rollups = "apps=ktm&dimensions=app&from=\(ReportQuery.formatDate(d0))&to=\(ReportQuery.formatDate(today))&metrics=impressions,requests,taps&tz=Asia/Kathmandu"
            let cohortsBefore = CohortReportTests.table(try await Reports.get(client, admin, cohorts).body)
            let rollupsBefore = try await Reports.rows(client, admin, rollups)
            #expect(cohortsBefore[ReportQuery.formatDate(d0)]?["installs"] == "4")
            let before = try await Self.rows(of: "A", pool)
            #expect(before == ["events": 7, "installs": 1, "install_days": 4, "install_day_revenue": 2, "install_delta": 1, "experiment_exposures": 0], "\(before)")
            let othersBefore = try await Self.rows(of: "B", pool)

            // Access first (GDPR Art. 15): every row of A, as NDJSON, ending with the counts.
            let lines = try await client.execute(uri: "/v1/apps/ktm/devices/A", method: .get, headers: Reports.headers(admin)) { response in
                #expect(response.status == .ok)
                #expect(response.headers[.contentType] == "application/x-ndjson")
                return String(buffer: response.body).split(separator: "\n").map { line in
                    (try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]) ?? [:]
                }
            }
            let kinds = lines.map { $0["kind"] as? String ?? "?" }
            #expect(kinds == ["install", "pending"] + Array(repeating: "day", count: 4) + ["day_revenue", "day_revenue"] + Array(repeating: "event", count: 7) + ["end"], "\(kinds)")
            #expect(lines.first?["device"] as? String == "A" && lines.first?["platform"] as? String == "android")
            #expect((lines.last?["lines"] as? [String: Int])?["event"] == 7 && lines.last?["retention_days"] as? Int == 3650, "\(lines.last ?? [:])")
            #expect(lines.filter { $0["kind"] as? String == "event" }.allSatisfy { $0["id"] is String && $0["device"] == nil })

            // Refusals name the field and the rule.
            let tooMany = #"{"devices": [\#((0...1000).map { "\"d\($0)\"" }.joined(separator: ","))]}"#
            try await client.execute(uri: "/v1/apps/ktm/devices/erase", method: .post, headers: Reports.headers(admin), body: ByteBuffer(string: tooMany)) { response in
                #expect(response.status == .badRequest && String(buffer: response.body).contains("devices: must name at most 1000 devices"), "\(String(buffer: response.body))")
            }
            try await client.execute(uri: "/v1/apps/ktm/devices/erase", method: .post, headers: Reports.headers(admin), body: ByteBuffer(string: #"{"devices": ["A", ""]}"#)) { response in
                #expect(response.status == .badRequest && String(buffer: response.body).contains("devices[1]: must be a device id"), "\(String(buffer: response.body))")
            }
            try await client.execute(uri: "/v1/apps/nope/devices/A", method: .delete, headers: Reports.headers(admin)) { #expect($0.status == .notFound) }
            try await client.execute(uri: "/v1/apps/ktm/devices/A", method: .delete, headers: Reports.headers(ingest)) { #expect($0.status == .forbidden) }

            // The erasure.
            let runner = Task { await services.erasureRunner.run() }
            defer { runner.cancel() }
            let queued = try await client.execute(uri: "/v1/apps/ktm/devices/A", method: .delete, headers: Reports.headers(admin)) { response in
                #expect(response.status == .accepted)
                #expect(response.headers[.location]?.hasPrefix("/v1/erasures/") == true)
                return Self.json(response)
            }
            #expect(queued["status"] as? String == "queued" && queued["devices"] as? Int == 1 && queued["requested_by"] as? String == adminID, "\(queued)")
            let id = try #require(queued["id"] as? String)
            let done = try await Self.waitForErasure(client, admin, id)
            #expect(done["status"] as? String == "done", "\(done)")
            let removed = done["rows"] as? [String: Int] ?? [:]
            // The server's own compaction pass may fold A's pending delta between the count above
            // and the job (a loaded run took 145 s over this test): then it is one more day row.
            var folded = before
            folded["install_delta", default: 0] -= 1
            folded["install_days", default: 0] += 1
            #expect(removed == before || removed == folded, "the rows removed per table are the rows A had: \(removed)")
            #expect(done["first_cohort"] as? String == ReportQuery.formatDate(d0))
            #expect(try await Self.rows(of: "A", pool).values.allSatisfy { $0 == 0 })
            #expect(try await Self.rows(of: "B", pool) == othersBefore, "other devices keep every row")

            // What stays holds no id: the log and the tombstone.
            #expect(try await pool.query("SELECT count(*)::int FROM erasure_devices").first!.decode(0, as: Int.self) == 0)
            let tombstones = try await pool.query("SELECT length(device_hash)::int FROM device_tombstones WHERE app_id = 'ktm'").map { try $0.decode(0, as: Int.self) }
            #expect(tombstones == [32], "one keyed hash (HMAC-SHA-256), not the id")

            // The sketches hold no hash of A (nor of any device): Migrations/0028.
            let hashA = String(DeviceHash.hash("A"))
            for table in ["rollup_devices_15m_compacted", "rollup_devices_1h_compacted", "rollup_devices_day_compacted", "rollup_devices_app_day"] {
                let listing = try await pool.query("""
                    SELECT count(*)::int FROM \(unsafeRaw: table)
                    WHERE position(\(hashA) IN hll_print(devices)::text) > 0 OR position(\(hashA) IN coalesce(hll_print(viewers)::text, '')) > 0
                    """)[0].decode(0, as: Int.self)
                #expect(listing == 0, "\(table) lists A's hash")
            }
            // Aggregates stay; the cohort grain loses A, and the cohort report says why.
            #expect(try await Reports.rows(client, admin, rollups).description == rollupsBefore.description, "the rollups hold no id and stay")
            #expect(try await CohortReportTests.grainMismatches(pool) == 0, "the cohort grain is the device rows summed and priced, without A")
            let (status, after) = try await Reports.get(client, admin, cohorts)
            #expect(status == .ok)
            let cohortsAfter = CohortReportTests.table(after)
            #expect(cohortsAfter[ReportQuery.formatDate(d0)]?["installs"] == "3", "\(cohortsAfter)")
            #expect(cohortsAfter[ReportQuery.formatDate(d0)]?["revenue_per_install_d7"] != cohortsBefore[ReportQuery.formatDate(d0)]?["revenue_per_install_d7"])
            #expect(cohortsAfter[ReportQuery.formatDate(d0 + 1)] == cohortsBefore[ReportQuery.formatDate(d0 + 1)])
            let notes = "\(after["notes"] ?? "")"
            #expect(notes.contains("1 erasure of up to 1 device"), "\(notes)")

            // Tombstones: A's event from before the erasure (a kit's queue) is answered erased
            // and not stored; one that occurs after it is new data.
            let old = Date().addingTimeInterval(-3600), new = Date().addingTimeInterval(1)
            try await Task.sleep(for: .milliseconds(1100))
            let body = [old, new].map { at in
                #"{"id":"\#(UUID().uuidString.lowercased())","type":"session","occurred_at":"\#(ISO8601DateFormatter().string(from: at))","device":"A"}"#
            }.joined(separator: "\n")
            var headers = Reports.headers(ingest)
            headers[.contentType] = "application/x-ndjson"
            let receipt = try await client.execute(uri: "/v1/events", method: .post, headers: headers, body: ByteBuffer(string: body)) { response in
                #expect(response.status == .ok)
                return Self.json(response)
            }
            #expect(receipt["accepted"] as? Int == 1 && receipt["duplicates"] as? Int == 1, "an erased event counts among the duplicates: \(receipt)")
            #expect((receipt["erased"] as? [[String: Any]])?.map { $0["index"] as? Int } == [0], "\(receipt)")
            #expect(try await Self.rows(of: "A", pool)["events"] == 1, "only the event after the erasure is stored")

            // The log.
            let log = try await client.execute(uri: "/v1/apps/ktm/erasures", method: .get, headers: Reports.headers(admin)) { Self.json($0) }
            let entries = log["erasures"] as? [[String: Any]] ?? []
            #expect(entries.count == 1 && entries.first?["id"] as? String == id && entries.first?["requested_by"] as? String == adminID, "\(entries)")
        }
    }

    @Test("the debug access log names no device: an id in a path is redacted")
    func accessLogRedactsDevices() {
        #expect(redactedPath("/v1/apps/ktm/devices/6f1c0e3a-91d2") == "/v1/apps/ktm/devices/{device}")
        #expect(redactedPath("/v1/devices/a%2Fb") == "/v1/devices/{device}")
        #expect(redactedPath("/v1/apps/ktm/devices/erase") == "/v1/apps/ktm/devices/erase")
        #expect(redactedPath("/v1/reports") == "/v1/reports")
    }

    @Test("the kit's own erasure request: an ingest key, for an id its app has sent only; a bulk erasure of many devices of another app leaves this app alone")
    func kitRequest() async throws {
        try await withTestApp(flags: Reports.flags) { services, client in
            _ = try await services.appStore.createApp(id: "one", name: nil)
            _ = try await services.appStore.createApp(id: "two", name: nil)
            let ingest = try await services.appStore.createKey(app: "one", scope: .ingest).secret
            let admin = try await services.appStore.createKey(app: nil, scope: .admin).secret
            let now = Int64(Date().timeIntervalSince1970 * 1_000_000)
            let device = UUID().uuidString.lowercased()
            try await services.eventStore.store([
                AppEvent(appID: "one", event: AdEvent(id: UUID(), type: .session, occurredAtMicros: now - 60_000_000, network: "", format: nil, device: device)),
                AppEvent(appID: "two", event: AdEvent(id: UUID(), type: .session, occurredAtMicros: now - 60_000_000, network: "", format: nil, device: device)),
            ])
            try await client.execute(uri: "/v1/devices/\(UUID().uuidString.lowercased())", method: .delete, headers: Reports.headers(ingest)) { response in
                #expect(response.status == .notFound && String(buffer: response.body).contains("no event of this app ever named it"))
            }
            try await client.execute(uri: "/v1/devices/\(device)", method: .delete, headers: Reports.headers(admin)) { #expect($0.status == .forbidden) }
            // A process keyed otherwise than the first (ADTALLY_CREDENTIALS_KEY) would miss every
            // tombstone: it refuses to ingest.
            let otherKey = EventStore(pool: services.database.pool, credentialsKey: "not the servers' key")
            await #expect(throws: TombstoneKeyMismatch.self) {
                try await otherKey.store([AppEvent(appID: "one", event: AdEvent(id: UUID(), type: .session, occurredAtMicros: now, network: "", format: nil, device: "x"))])
            }
            let runner = Task { await services.erasureRunner.run() }
            defer { runner.cancel() }
            let queued = try await client.execute(uri: "/v1/devices/\(device)", method: .delete, headers: Reports.headers(ingest)) { response in
                #expect(response.status == .accepted)
                return Self.json(response)
            }
            #expect(queued["requested_by"] as? String == "kit" && queued["app"] as? String == "one")
            let done = try await Self.waitForErasure(client, admin, try #require(queued["id"] as? String))
            // The device's install row: still a pending delta, or folded by the server's own
            // compaction pass before the job ran (a loaded clean-clone run did).
            let erased = done["rows"] as? [String: Int] ?? [:]
            #expect(erased["events"] == 1 && (erased["install_delta"] ?? 0) + (erased["installs"] ?? 0) == 1, "\(done)")
            #expect(try await Self.rows(of: device, app: "one", services.database.pool)["events"] == 0)
            #expect(try await Self.rows(of: device, app: "two", services.database.pool)["events"] == 1, "the same id in another app is another person's")
            // Percent-encoded ids: a slash and a space.
            try await client.execute(uri: "/v1/apps/two/devices/a%2Fb%20c", method: .delete, headers: Reports.headers(admin)) { response in
                #expect(response.status == .accepted)
            }
        }
    }

    @Test("an erasure job killed with its server (SIGKILL) midway is resumed by the next server where it was, and finishes")
    func resumedAfterKill() async throws {
        try await withMigratedDatabase { conninfo in
            let (database, _) = try await openWithApp(conninfo, app: "big")
            let admin = try await AppStore(pool: database.pool).createKey(app: nil, scope: .admin).secret
            // Six days of a device, a session a minute, beside another device: with a 1 ms
            // target a statement deletes one minute of events, so the job takes a while.
            let now = Int64(Date().timeIntervalSince1970) / 60 * 60 * 1_000_000
            let store = EventStore(pool: database.pool, credentialsKey: nil)
            for day in 0..<6 {
                var batch: [AppEvent] = []
                for minute in 0..<1440 {
                    let at = now - Int64(day * 1440 + minute + 10) * 60_000_000
                    batch.append(AppEvent(appID: "big", event: AdEvent(id: UUID(), type: .session, occurredAtMicros: at, network: "", format: nil, device: "gone")))
                    if minute % 10 == 0 {
                        batch.append(AppEvent(appID: "big", event: AdEvent(id: UUID(), type: .session, occurredAtMicros: at, network: "", format: nil, device: "kept")))
                    }
                }
                _ = try await store.store(batch)
            }
            await database.close()
            let log = FileManager.default.temporaryDirectory.appendingPathComponent("adtally-erasure-\(UUID().uuidString).log")
            defer { try? FileManager.default.removeItem(at: log) }
            let environment = ["ADTALLY_ERASURE_STATEMENT_MS": "1"]
            try await withHTTPClient { client in
                let first = try ServerProcess(databaseURL: conninfo, port: try freePort(), log: log, environment: environment)
                defer { first.terminate() }
                try await first.waitUntilReady(client)
                var request = HTTPClientRequest(url: "http://127.0.0.1:\(first.port)/v1/apps/big/devices/gone")
                request.method = .DELETE
                request.headers.add(name: "Authorization", value: "Bearer \(admin)")
                let response = try await client.execute(request, timeout: .seconds(30))
                #expect(response.status == .accepted)
                let queued = try JSONSerialization.jsonObject(with: Data(buffer: try await response.body.collect(upTo: 1 << 20))) as? [String: Any] ?? [:]
                let id = try #require(queued["id"] as? String)
                let settings = try Settings.resolve(flags: .init(databaseURL: conninfo), environment: [:])
                let watcher = try await Database.open(settings, logger: .init(label: "test"))
                func progress() async throws -> (events: Int64, status: String, attempts: Int) {
                    let row = try await watcher.pool.query("SELECT events_rows, status, attempts FROM erasures WHERE id = \(id)::uuid")[0]
                    return (try row.decode(0), try row.decode(1), try row.decode(2))
                }
                try await waitUntil("the job has deleted some events", within: 60) { try await progress().events > 500 }
                first.kill()
                let midway = try await progress()
                #expect(midway.status == "running" && midway.events < 8640, "killed midway: \(midway)")
                let second = try ServerProcess(databaseURL: conninfo, port: try freePort(), log: log, environment: environment)
                defer { second.terminate() }
                // Thousands of statements of the 1 ms target: 134 s under the whole suite once.
                try await waitUntil("the next server finished the job", within: 300) { try await progress().status == "done" }
                let done = try await progress()
                #expect(done.events == 8640 && done.attempts == 2, "every event of the device counted once, across the two servers: \(done)")
                let left = try await watcher.pool.query("""
                    SELECT count(*) FILTER (WHERE device = 'gone')::int, count(*) FILTER (WHERE device = 'kept')::int FROM events WHERE app_id = 'big'
                    """)[0]
                let gone = try left.decode(0, as: Int.self), kept = try left.decode(1, as: Int.self)
                #expect(gone == 0 && kept == 864)
                await watcher.close()
                await second.stop()
            }
        }
    }

    @Test("retention per app: the shorter of the app's and the servers' wins for its raw events and device rows; other apps and the aggregates keep theirs")
    func retentionPerApp() async throws {
        try await withTestApp(flags: Reports.flags) { services, client in
            _ = try await services.appStore.createApp(id: "short", name: nil)
            _ = try await services.appStore.createApp(id: "long", name: nil)
            let admin = try await services.appStore.createKey(app: nil, scope: .admin).secret
            try await client.execute(uri: "/v1/apps/short", method: .patch, headers: Reports.headers(admin), body: ByteBuffer(string: #"{"retention_days": 3}"#)) { response in
                #expect(response.status == .badRequest && String(buffer: response.body).contains("retention_days: must be a whole number of days from 9"))
            }
            try await client.execute(uri: "/v1/apps/short", method: .patch, headers: Reports.headers(admin), body: ByteBuffer(string: #"{}"#)) { response in
                #expect(response.status == .badRequest && String(buffer: response.body).contains("retention_days: is required"))
            }
            try await client.execute(uri: "/v1/apps/short", method: .patch, headers: Reports.headers(admin), body: ByteBuffer(string: #"{"retention_days": 10}"#)) { response in
                #expect(response.status == .ok && Self.json(response)["retention_days"] as? Int == 10)
            }
            let now = Int64(Date().timeIntervalSince1970 * 1_000_000)
            let day: Int64 = 86_400_000_000
            var events: [AppEvent] = []
            for app in ["short", "long"] {
                for age in [1, 5, 20, 40] {
                    events.append(AppEvent(appID: app, event: AdEvent(
                        id: UUID(), type: .impression, occurredAtMicros: now - Int64(age) * day, network: "admob", format: .banner, device: "d\(age)"
                    )))
                }
            }
            try await services.eventStore.store(events)
            // Folded by this call or, when it finds the server's own pass holding the lock
            // (it then moves nothing), by that pass.
            try await waitUntil("the deltas are folded", within: 60) {
                try await services.compactor.compactOnce()
                return try await Ingest.count(services, "SELECT ((SELECT count(*) FROM rollup_delta) + (SELECT count(*) FROM install_delta))::int") == 0
            }
            let pool = services.database.pool
            let totalBefore = try await pool.query("SELECT sum(impressions)::int FROM rollup_day_compacted").first!.decode(0, as: Int.self)
            // The server's own pass at start reads the apps when it gets there: on a loaded
            // machine that was after they were set up here, and it removed short's old events
            // before or beside this call (a make test run). So this call's count is at most
            // those two, and what is left is checked below; `retentionFloor`, with no server
            // running, checks a pass's count exactly.
            let removed = try await services.maintenance.runOnce()
            #expect(removed.appEvents <= 2, "short's events 20 and 40 days old: \(removed)")
            func counts(_ app: String) async throws -> [Int] {
                let row = try await pool.query("""
                    SELECT (SELECT count(*) FROM events WHERE app_id = \(app))::int, (SELECT count(*) FROM install_days WHERE app_id = \(app))::int,
                           (SELECT count(*) FROM installs WHERE app_id = \(app))::int
                    """)[0]
                return [try row.decode(0), try row.decode(1), try row.decode(2)]
            }
            #expect(try await counts("short") == [2, 2, 2], "10 days kept: two devices' events, days and installs")
            #expect(try await counts("long") == [4, 4, 4], "the servers' 3650 days")
            let from = try await pool.query("SELECT app_id, (device_rows_from - (now() AT TIME ZONE 'UTC')::date)::text FROM apps ORDER BY app_id")
                .map { "\(try $0.decode(0, as: String.self)):\(try $0.decode(1, as: String?.self) ?? "nil")" }
            #expect(from == ["long:nil", "short:-9"], "where short's device rows start is recorded: \(from)")
            // A cohort report read from the device rows (by country) says where they start.
            let today = try ReportQuery.today(in: "UTC", now: Date())
            let (cohortStatus, byCountry) = try await Reports.get(
                client, admin, "apps=short&dimensions=cohort,country&from=\(ReportQuery.formatDate(today - 30))&to=\(ReportQuery.formatDate(today - 1))&metrics=installs"
            )
            let cohortNotes = (byCountry["notes"] as? [String: Any])?["cohorts"] as? [String] ?? []
            #expect(cohortStatus == .ok && cohortNotes.contains { $0.hasPrefix("short's device rows start on \(ReportQuery.formatDate(today - 9))") }, "\(cohortNotes)")
            #expect(try await pool.query("SELECT sum(impressions)::int FROM rollup_day_compacted").first!.decode(0, as: Int.self) == totalBefore)
            #expect(try await services.maintenance.runOnce().appEvents == 0, "nothing more to do")
            // A tombstone no accepted event can match any more (older than the event age and a day) goes.
            try await pool.query("""
                INSERT INTO device_tombstones (app_id, device_hash, erased_at)
                VALUES ('short', decode(md5('old'), 'hex'), now() - interval '30 days'), ('short', decode(md5('new'), 'hex'), now() - interval '1 day')
                """)
            _ = try await services.maintenance.runOnce()
            let left = try await pool.query("SELECT count(*)::int, count(*) FILTER (WHERE device_hash = decode(md5('new'), 'hex'))::int FROM device_tombstones")[0]
            #expect(try left.decode(0, as: Int.self) == 1 && left.decode(1, as: Int.self) == 1, "the day-old tombstone stays, the month-old one is gone")
            // A report on raw events says where the app's raw detail ends.
            let (status, body) = try await Reports.get(
                client, admin, "apps=short&dimensions=placement&from=\(ReportQuery.formatDate(try ReportQuery.today(in: "UTC", now: Date()) - 30))&to=\(ReportQuery.formatDate(try ReportQuery.today(in: "UTC", now: Date())))&metrics=impressions"
            )
            #expect(status == .ok)
            #expect("\(body["notes"] ?? "")".contains("there are raw events only from"), "\(body["notes"] ?? "")")
        }
    }

    @Test("an app never keeps fewer days than the accepted event age and two: a late event must find its device's rows")
    func retentionFloor() async throws {
        var flags = Reports.flags
        flags.maxEventAgeDays = 30
        try await withServices(flags: flags) { services in
            _ = try await services.appStore.createApp(id: "brief", name: nil)
            _ = try await services.appStore.setRetention(app: "brief", days: 10)
            let now = Int64(Date().timeIntervalSince1970 * 1_000_000)
            try await services.eventStore.store([20, 40].map { age in AppEvent(appID: "brief", event: AdEvent(
                id: UUID(), type: .impression, occurredAtMicros: now - Int64(age) * 86_400_000_000, network: "admob", format: .banner, device: "late\(age)"
            )) })
            try await services.compactor.compactOnce()
            let removed = try await services.maintenance.runOnce()
            #expect(removed.appEvents == 1 && removed.deviceRows == 3, "32 days kept, not 10: only the 40-day-old event goes, with its device's day, its day's revenue row and its install: \(removed)")
            #expect(try await Ingest.count(services, "SELECT count(*)::int FROM events WHERE app_id = 'brief'") == 1)
        }
    }

    @Test("no stored sketch lists a device's hash: migration 0028 rewrites explicit sketches without them (their counts kept), and the ones made from then on never list them")
    func sketchesHoldNoHashes() async throws {
        try await TestDatabase.withPool { pool in
            let all = try Migrator(directory: Migrator.defaultDirectory(explicit: nil))
            _ = try await Migrator(migrations: all.migrations.filter { $0.version < 28 }).migrate(pool)
            try await pool.query("INSERT INTO apps (app_id, name) VALUES ('old', 'old')")
            // As the previous version stored them: explicit (a few devices), sparse (300), empty.
            try await pool.query("""
                INSERT INTO rollup_devices_15m_compacted (app_id, bucket, network, format, devices, viewers)
                SELECT 'old', '2026-11-01T00:00:00Z'::timestamptz + n * interval '15 minutes', 'admob', 'banner',
                       (SELECT hll_add_agg(hll_hash_text('device-' || d), 11, 5) FROM generate_series(1, CASE n WHEN 0 THEN 3 ELSE 300 END) AS d),
                       CASE WHEN n = 0 THEN hll_empty(11, 5) END
                FROM generate_series(0, 1) AS n
                """)
            let hash = String(DeviceHash.hash("device-2"))
            let listed: PostgresQuery = "SELECT count(*)::int FROM rollup_devices_15m_compacted WHERE position(\(hash) IN hll_print(devices)::text) > 0"
            #expect(try await pool.query(listed)[0].decode(0, as: Int.self) == 1, "the previous version's explicit sketch lists device-2's hash")
            let countsSQL: PostgresQuery = """
                SELECT round(hll_cardinality(devices))::int, coalesce(hll_cardinality(viewers), -1)::int FROM rollup_devices_15m_compacted ORDER BY bucket
                """
            func counts() async throws -> [[Int]] { try await pool.query(countsSQL).map { [try $0.decode(0), try $0.decode(1)] } }
            let before = try await counts()
            let unionBefore = try await pool.query("""
                SELECT round(hll_cardinality(hll_union_agg(devices) || (SELECT hll_add_agg(hll_hash_text('new'), 11, 5))))::int FROM rollup_devices_15m_compacted
                """)[0].decode(0, as: Int.self)
            _ = try await all.migrate(pool)
            #expect(try await pool.query(listed)[0].decode(0, as: Int.self) == 0)
            #expect(try await counts() == before && before.first == [3, 0], "the same counts: \(before)")
            #expect(try await pool.query("SELECT count(*)::int FROM rollup_devices_15m_compacted WHERE hll_expthresh(devices)::text <> '(0,0)'")[0].decode(0, as: Int.self) == 0)
            // They union with the sketches this version makes, as before.
            let union = try await pool.query("""
                SELECT round(hll_cardinality(hll_union_agg(devices) || (SELECT \(unsafeRaw: ReportPlan.sketch("hll_hash_text('new')")))))::int
                FROM rollup_devices_15m_compacted
                """)[0].decode(0, as: Int.self)
            #expect(union == unionBefore)
        }
    }
}

