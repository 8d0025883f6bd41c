import AdTallyKit
import AdTallyTestSupport
import AsyncHTTPClient
import Foundation
import Testing

/// AdTallyKit's consent calls (DESIGN §15) against a real `adtally serve`: an install
/// forgotten with events queued and the server down, and an opt-out that outlives the
/// app's process.
@Suite("AdTallyKit: forgetting an install, opting out", .serialized)
struct KitPrivacyTests {
    static func count(_ fixture: KitFixture, device: String) async throws -> Int {
        Int(try await fixture.sql("SELECT count(*) FROM events WHERE app_id = '\(fixture.app)' AND device = '\(device)'")[0][0] ?? "") ?? -1
    }

    @Test("forgetInstall() with events queued and the server down: the queue is dropped (counted as forgotten), a new id starts, and once the server is up again (after a relaunch) it erases everything of the old id; the new id's events arrive")
    func forgetWhileDown() async throws {
        try await withMigratedDatabase { conninfo in
            let fixture = try await KitFixture.make(conninfo)
            let port = try freePort()
            let url = URL(string: "http://127.0.0.1:\(port)")!
            let folder = KitTests.folder()
            var tally: AdTally? = try AdTally(server: url, appKey: fixture.ingest, directory: folder, configuration: KitTests.quick())
            let old = tally!.deviceID
            try await KitTests.withServer(fixture, port: port) { _, _, _, _ in
                for _ in 0..<10 { _ = try tally!.sessionStarted() }
                try await KitTests.flush(tally!)
                #expect(try await Self.count(fixture, device: old) == 10)
                // A switch answer fetched with the id (DESIGN §14): kept in switch.json with it.
                _ = await tally!.refreshNetwork(for: "home")
            }
            let switchFile = folder.appendingPathComponent("switch.json")
            #expect((try? String(contentsOf: switchFile, encoding: .utf8))?.contains(old) == true)
            // The server is down: five more queue up, then the user asks to be forgotten.
            for _ in 0..<5 { _ = try tally!.sessionStarted() }
            #expect(tally!.status.pending == 5)
            try tally!.forgetInstall()
            let status = tally!.status
            #expect(status.pending == 0 && status.dropped[.forgotten] == 5 && status.forgetsPending == 1, "\(status)")
            let new = tally!.deviceID
            #expect(new != old && UUID(uuidString: new) != nil)
            // No answer keeps the forgotten id, on disk either.
            let saved = (try? String(contentsOf: switchFile, encoding: .utf8)) ?? ""
            #expect(!saved.contains(old), "switch.json still holds the forgotten id: \(saved)")
            var recorded: [String] = []
            for _ in 0..<3 { recorded.append(try tally!.sessionStarted().uuidString.lowercased()) }
            // A relaunch: the request to erase the old id is still to be sent, the new id kept.
            tally = nil
            tally = try AdTally(server: url, appKey: fixture.ingest, directory: folder, configuration: KitTests.quick())
            #expect(tally!.deviceID == new && tally!.status.forgetsPending == 1 && tally!.status.pending == 3)
            try await KitTests.withServer(fixture, port: port) { _, _, _, _ in
                try await waitUntil("the server answered the erasure request", within: 60) { tally!.status.forgetsPending == 0 }
                try await KitTests.flush(tally!)
                // The job deletes the raw events first and the device rows after: done is the end.
                try await waitUntil("the server's erasure job is done", within: 60) {
                    try await fixture.sql("SELECT status FROM erasures") == [["done"]]
                }
                #expect(try await Self.count(fixture, device: old) == 0, "the old id's events are erased")
                #expect(try await fixture.sql("SELECT requested_by, status, devices::text FROM erasures") == [["kit", "done", "1"]])
                #expect(try await fixture.sql("SELECT count(*)::text FROM installs WHERE device = '\(old)'") == [["0"]])
                let stored = try await fixture.sql("SELECT event_id::text FROM events WHERE device = '\(new)' ORDER BY event_id").map { $0[0] ?? "" }
                #expect(stored == recorded.sorted(), "the new id's events arrive, once")
                try await waitUntil("the server has the forgotten count", within: 30) {
                    try await fixture.sql("SELECT reason, sum(dropped)::text FROM client_drops WHERE app_id = '\(fixture.app)' GROUP BY reason") == [["forgotten", "5"]]
                }
            }
            tally = nil
            try? FileManager.default.removeItem(at: folder)
        }
    }

    @Test("optOut() outlives a SIGKILL of the app: the next launch records nothing and sends nothing until optIn()")
    func optOutAcrossKill() async throws {
        try await withMigratedDatabase { conninfo in
            let fixture = try await KitFixture.make(conninfo)
            try await KitTests.withServer(fixture) { _, url, _, _ in
                let folder = KitTests.folder()
                defer { try? FileManager.default.removeItem(at: folder) }
                // Opts out, records, and is killed while it waits.
                let killed = try await KitHostileNetworkTests.child(url, fixture.ingest, folder, ["--opt-out", "--record", "5", "--wait", "60"], limit: 5)
                #expect(killed.output.contains("opted-out") && !killed.exitedNormally, "\(killed.output)")
                let quiet = try await KitHostileNetworkTests.child(url, fixture.ingest, folder, ["--record", "20", "--wait", "2"])
                #expect(quiet.exitedNormally && quiet.told.count == 20, "\(quiet.output)")
                #expect(quiet.status["opted_out"] == "true" && quiet.status["pending"] == "0" && quiet.status["requests"] == "0", "\(quiet.output)")
                #expect(try await fixture.sql("SELECT count(*)::text FROM events") == [["0"]], "nothing was sent while opted out")
                let back = try await KitHostileNetworkTests.child(url, fixture.ingest, folder, ["--opt-in", "--record", "5", "--wait", "3"])
                #expect(back.status["opted_out"] == "false" && back.status["pending"] == "0", "\(back.output)")
                let stored = try await fixture.sql("SELECT event_id::text FROM events ORDER BY event_id").map { $0[0] ?? "" }
                #expect(stored == back.told.keys.sorted(), "after optIn() only what was recorded since arrives")
            }
        }
    }
}
