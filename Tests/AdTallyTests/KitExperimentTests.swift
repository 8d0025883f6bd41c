import AdTallyCore
import AdTallyTestSupport
import AsyncHTTPClient
import Foundation
import Testing

/// AdTallyKit in an experiment (DESIGN §14, §10): the kit's executable, as an app would run
/// it, against a real `adtally serve`. A device's arm follows its per-install id through
/// switch refreshes, app relaunches (offline too, from its cached answer) and a server restart.
@Suite("AdTallyKit in an experiment on the switch", .serialized)
struct KitExperimentTests {
    /// One launch of the app (the kit's child) reading the switch for `home`: every
    /// network it was handed.
    static func launch(_ server: URL, _ fixture: KitFixture, _ folder: URL) async throws -> (handed: Set<String>, output: String) {
        let run = try await KitHostileNetworkTests.child(server, fixture.ingest, folder, ["--record", "0", "--wait", "1", "--switch", "home"])
        #expect(run.exitedNormally, "\(run.output.suffix(800))")
        return (Set(run.networks + run.refreshed), run.output)
    }

    static func deviceID(_ folder: URL) throws -> String {
        try String(contentsOf: folder.appendingPathComponent("device-id"), encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    @Test("a device follows its arm: its id picks it, the same through switch refreshes, app relaunches (offline: from its cache) and a server restart; its exposure is recorded once")
    func deviceFollowsItsArm() async throws {
        try await withMigratedDatabase { conninfo in
            let fixture = try await KitFixture.make(conninfo)
            var folders: [URL] = []
            defer { for folder in folders { try? FileManager.default.removeItem(at: folder) } }
            var expected: [URL: String] = [:]
            try await KitTests.withServer(fixture) { _, url, client, _ in
                let created = try await authorizedCall(
                    client, .POST, url.absoluteString + "/v1/apps/\(fixture.app)/experiments", key: fixture.admin,
                    body: #"{"name": "kit-ab", "placement": "home", "control": "pinned:admob", "treatment": "pinned:nend", "treatment_share": 50}"#
                )
                #expect(created.status == 201, "\(created.body)")
                let salt = try #require(try await fixture.sql("SELECT salt::text FROM experiments WHERE name = 'kit-ab'").first?.first ?? nil)
                // Devices (kit folders) until both arms have at least 3, 12 at least: ids are
                // random, so a fixed count could fall in one arm.
                while folders.count < 12 || Set(expected.values).count < 2 || expected.values.filter({ $0 == "nend" }).count < 3
                    || expected.values.filter({ $0 == "admob" }).count < 3 {
                    guard folders.count < 60 else { break }
                    let folder = KitTests.folder()
                    folders.append(folder)
                    // First launch: the kit makes its id and sends it with the switch request.
                    let first = try await Self.launch(url, fixture, folder)
                    let arm = ExperimentArm.assign(salt: salt, device: try Self.deviceID(folder), treatmentShare: 50)
                    let network = arm == .treatment ? "nend" : "admob"
                    expected[folder] = network
                    #expect(first.handed == [network], "\(arm): \(first.handed) \(first.output.suffix(600))")
                    // Relaunched while the server runs: refreshed (revalidated with its own tag), the same.
                    #expect(try await Self.launch(url, fixture, folder).handed == [network])
                }
                #expect(Set(expected.values) == ["admob", "nend"], "\(expected.values)")
                let count = String(folders.count)
                try await waitUntil("every device's exposure is written", within: 30) {
                    try await fixture.sql("SELECT count(*), count(DISTINCT device) FROM experiment_exposures WHERE experiment = 'kit-ab'").first == [count, count]
                }
            }
            // Relaunched with no server at all: the cached answer, its arm's.
            for folder in folders.prefix(4) {
                let offline = try await Self.launch(URL(string: "http://127.0.0.1:1")!, fixture, folder)
                #expect(offline.handed == [expected[folder]!], "\(offline.output.suffix(600))")
            }
            // Another server process on the same database (another port): the same arms.
            let arms = expected
            try await KitTests.withServer(fixture) { _, url, _, _ in
                for folder in folders.prefix(6) {
                    let relaunched = try await Self.launch(url, fixture, folder)
                    #expect(relaunched.handed == [arms[folder]!], "\(relaunched.output.suffix(600))")
                }
            }
            let exposures = try await fixture.sql("SELECT count(*) FROM experiment_exposures WHERE experiment = 'kit-ab'")
            #expect(exposures.first == [String(folders.count)], "one exposure per device, whatever the requests: \(exposures)")
        }
    }
}
