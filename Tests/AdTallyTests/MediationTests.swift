import AdTallyApp
import AdTallyCore
import AdTallyStorage
import AdTallyTestSupport
import Foundation
import Hummingbird
import HummingbirdTesting
import PostgresKit
import Testing

/// The mediation switch (DESIGN §9): decisions from the report engine's numbers,
/// served from memory with ETags, and their history.
@Suite("Mediation switch")
struct MediationTests {
    /// An instant on the fixtures' day, 2026-06-10, `hours` after its UTC midnight.
    static func at(_ hours: Double) -> Date {
        Date(timeIntervalSince1970: 1_781_049_600 + hours * 3600)
    }

    /// Per hour of the day: `requests` requests of a network and `impressions`
    /// impressions, each reporting `revenueMicros` USD.
    static func traffic(network: String, hours: Range<Int>, requests: Int, impressions: Int, revenueMicros: Int64 = 1000) -> [AdEvent] {
        hours.flatMap { hour in
            let micros = Int64(at(Double(hour)).timeIntervalSince1970) * 1_000_000
            return (0..<requests).map { i in Reports.event(.request, at: micros + Int64(i) * 1_000_000, network: network) }
                + (0..<impressions).map { i in
                    Reports.event(.impression, at: micros + Int64(i) * 1_000_000 + 500_000, network: network) {
                        $0.revenueMicros = revenueMicros
                        $0.currency = "USD"
                    }
                }
        }
    }

    static func stats(_ network: String, requests: Int64, impressions: Int64, revenueMicros: Int128) -> MediationNetworkStats {
        var counts = ReportCounts()
        counts.requests = requests
        counts.impressions = impressions
        counts.reportedMicros = revenueMicros
        return MediationNetworkStats(network: network, counts: counts)
    }

    /// Waits until the server's first background pass has loaded the decisions.
    static func waitUntilLoaded(_ services: AppServices) async throws {
        try #require(try await eventually { services.mediationRefresher.isLoaded }, "the first mediation pass never loaded")
    }

    /// The field a policy's validation refuses, or nil.
    static func refusedField(_ policy: MediationPolicy) -> String? {
        do { _ = try policy.validated(); return nil } catch { return error.field }
    }

    static let automatic = MediationPolicy(
        scope: MediationScope(app: "med"), rule: .automatic, networks: ["admob", "iad", "nend"], defaultNetwork: "admob", windowHours: 6,
        minRequests: 100, hysteresis: 0.1
    )

    @Test("two networks inside the hysteresis band do not flip, whichever leads; beyond it the challenger wins")
    func hysteresisHoldsTheIncumbent() {
        // Expected revenue per 1000 requests: admob 1.00 USD, iad 1.05 (within 10%).
        let close = [Self.stats("admob", requests: 1000, impressions: 500, revenueMicros: 1_000_000), Self.stats("iad", requests: 1000, impressions: 525, revenueMicros: 1_050_000)]
        var incumbent = "admob"
        for round in 0..<6 {
            // The leader alternates between the two, inside the band.
            let stats = round % 2 == 0 ? close : close.map { line in
                Self.stats(line.network == "admob" ? "iad" : "admob", requests: line.counts.requests, impressions: line.counts.impressions, revenueMicros: line.counts.reportedMicros)
            }
            let choice = MediationChooser.choose(Self.automatic, stats: stats, incumbent: incumbent, currency: "USD")
            #expect(choice.network == "admob", "round \(round): \(choice.reason)")
            #expect(choice.basis == .kept || choice.basis == .best)
            incumbent = choice.network
        }
        let kept = MediationChooser.choose(Self.automatic, stats: close, incumbent: "admob", currency: "USD")
        #expect(kept.basis == .kept)
        #expect(kept.reason.contains("10% hysteresis"), "\(kept.reason)")
        // 1.11 > 1.00 × 1.1: the challenger wins.
        let beyond = [close[0], Self.stats("iad", requests: 1000, impressions: 555, revenueMicros: 1_110_000)]
        let switched = MediationChooser.choose(Self.automatic, stats: beyond, incumbent: "admob", currency: "USD")
        #expect(switched.network == "iad" && switched.basis == .best, "\(switched.reason)")
        // Without an incumbent the best wins at once.
        #expect(MediationChooser.choose(Self.automatic, stats: close, incumbent: nil, currency: "USD").network == "iad")
    }

    @Test("thin data keeps the last choice, or the default when there was none; an untrusted network never wins")
    func thinDataFallsBack() {
        let thin = [Self.stats("iad", requests: 99, impressions: 99, revenueMicros: 50_000_000), Self.stats("admob", requests: 10, impressions: 1, revenueMicros: 1)]
        let first = MediationChooser.choose(Self.automatic, stats: thin, incumbent: nil, currency: "USD")
        #expect(first.network == "admob" && first.basis == .defaultNetwork, "\(first.reason)")
        #expect(first.reason.contains("no network had 100 requests"), "\(first.reason)")
        let later = MediationChooser.choose(Self.automatic, stats: thin, incumbent: "nend", currency: "USD")
        #expect(later.network == "nend" && later.basis == .lastChoice, "\(later.reason)")
        let none = MediationChooser.choose(Self.automatic, stats: [], incumbent: "iad", currency: "USD")
        #expect(none.network == "iad" && none.basis == .lastChoice)
        // Numbers that cannot be read (a missing FX rate) count as none, and say so.
        let unreadable = MediationChooser.choose(Self.automatic, stats: thin, incumbent: "iad", currency: "USD", unreadable: "no FX rate converts EUR to USD")
        #expect(unreadable.network == "iad" && unreadable.basis == .lastChoice && unreadable.reason.contains("could not be read (no FX rate"), "\(unreadable.reason)")
        // A network the policy does not list is ignored however good.
        let outsider = MediationChooser.choose(
            Self.automatic, stats: [Self.stats("unity", requests: 10_000, impressions: 10_000, revenueMicros: 99_000_000)], incumbent: nil, currency: "USD"
        )
        #expect(outsider.network == "admob" && outsider.basis == .defaultNetwork)
    }

    @Test("a policy breaking a rule is refused with the field named")
    func policyValidation() throws {
        func error(_ policy: MediationPolicy) -> String? {
            do { _ = try policy.validated(); return nil } catch { return error.field }
        }
        let scope = MediationScope(app: "med")
        #expect(error(MediationPolicy(scope: scope, rule: .pinned)) == "network")
        #expect(error(MediationPolicy(scope: scope, rule: .pinned, network: "Ad Mob")) == "network")
        #expect(error(MediationPolicy(scope: scope, rule: .weighted, weights: ["admob": 0])) == "weights")
        #expect(error(MediationPolicy(scope: scope, rule: .weighted, weights: ["admob": -1, "iad": 1])) == "weights.admob")
        #expect(error(MediationPolicy(scope: scope, rule: .automatic, networks: ["admob"])) == "default")
        #expect(error(MediationPolicy(scope: scope, rule: .automatic, networks: ["admob"], defaultNetwork: "iad")) == "default")
        #expect(error(MediationPolicy(scope: scope, rule: .automatic, defaultNetwork: "iad", windowHours: 0)) == "window_hours")
        #expect(error(MediationPolicy(scope: scope, rule: .automatic, defaultNetwork: "iad", hysteresis: .nan)) == "hysteresis")
        #expect(error(MediationPolicy(scope: scope, rule: .pinned, network: "admob", defaultNetwork: "iad")) == "default")
        #expect(error(MediationPolicy(scope: MediationScope(app: "med", country: "XX"), rule: .pinned, network: "admob")) == "country")
        #expect(error(MediationPolicy(scope: MediationScope(app: "med", placement: ""), rule: .pinned, network: "admob")) == "placement")
        let lower = try MediationPolicy(scope: MediationScope(app: "med", country: "jp"), rule: .pinned, network: "admob").validated()
        #expect(lower.scope.country == "JP")
    }

    @Test("a network whose fill collapses loses the slot once its window shows it, not before; a better one waits for its minimum sample")
    func collapseLosesTheSlotAfterTheWindow() async throws {
        try await withServices(flags: Reports.flags) { services in
            _ = try await services.appStore.createApp(id: "med", name: nil, timezone: "Asia/Tokyo", currency: "USD")
            // admob fills 90% until 12:00, then nothing; iad fills 50% all day; nend fills
            // everything at 5 USD eCPM but only 20 requests an hour, from 16:00. eCPM 1 USD otherwise.
            try await Reports.store(services, app: "med",
                Self.traffic(network: "admob", hours: 0..<12, requests: 50, impressions: 45)
                    + Self.traffic(network: "admob", hours: 12..<24, requests: 50, impressions: 0)
                    + Self.traffic(network: "iad", hours: 0..<24, requests: 50, impressions: 25)
                    + Self.traffic(network: "nend", hours: 16..<24, requests: 20, impressions: 20, revenueMicros: 5000)
            )
            _ = try await services.mediation.set(Self.automatic, actor: "test")
            let refresher = services.mediationRefresher
            func served(at hours: Double) async throws -> (network: String, answer: [String: Any]) {
                try await refresher.refresh(force: true, now: Self.at(hours))
                guard case .served(let decision) = refresher.lookup(app: "med", placement: "home", country: "JP") else {
                    Issue.record("nothing served at \(hours) h")
                    return ("", [:])
                }
                #expect(decision.variants.count == 1)
                let body = try #require(try JSONSerialization.jsonObject(with: Data(decision.variants[0].body.readableBytesView)) as? [String: Any])
                return (body["enable_advertising"] as? String ?? "", body)
            }
            // Window 05:00–11:30: admob 90% against iad 50%.
            let before = try await served(at: 11.5)
            #expect(before.network == "admob", "\(before.answer["reason"] ?? "")")
            let lines = try #require(before.answer["networks"] as? [[String: Any]])
            let admob = try #require(lines.first { $0["network"] as? String == "admob" })
            #expect(admob["requests"] as? Int == 350)
            #expect(admob["impressions"] as? Int == 315)
            #expect(admob["fill_rate"] as? Double == 0.9)
            #expect(admob["ecpm"] as? String == "1.00")
            #expect(admob["rpm"] as? String == "0.90")
            #expect(lines.first { $0["network"] as? String == "nend" }?["requests"] as? Int == 0)
            #expect((before.answer["window"] as? [String: Any])?["from"] as? String == "2026-06-10T05:00:00Z")
            // Collapsed since 12:00, but the window still holds more good hours than bad.
            for hours in [12.5, 13.5, 14.5] {
                let kept = try await served(at: hours)
                #expect(kept.network == "admob", "\(hours) h: \(kept.answer["reason"] ?? "")")
            }
            // 09:00–15:30: admob 3 good hours of 7 (38.6%) against iad's 50%, past the 10% band.
            let after = try await served(at: 15.5)
            #expect(after.network == "iad", "\(after.answer["reason"] ?? "")")
            #expect(after.answer["decided_by"] as? String == "best")
            // The example in docs/mediation.md.
            #expect(after.answer["reason"] as? String == "highest expected revenue (fill × eCPM) in the last 6 h among networks with ≥ 100 requests: "
                + "iad 0.50 USD per 1000 requests (fill 50% of 350); it beats the last choice, admob 0.39 USD per 1000 requests (fill 38.6% of 350), "
                + "by more than the 10% hysteresis")
            // nend is better by far but has 60 requests in 12:00–18:30, under the 100 required.
            let untrusted = try await served(at: 18.5)
            #expect(untrusted.network == "iad", "\(untrusted.answer["reason"] ?? "")")
            #expect((untrusted.answer["networks"] as? [[String: Any]])?.first { $0["network"] as? String == "nend" }?["trusted"] as? Bool == false)
            // 15:00–21:30: 120 requests. Trusted, and 5 USD per 1000 requests against 0.50.
            let trusted = try await served(at: 21.5)
            #expect(trusted.network == "nend", "\(trusted.answer["reason"] ?? "")")
            // Two days on there is no data at all: the last choice stays.
            let thin = try await served(at: 60)
            #expect(thin.network == "nend")
            #expect(thin.answer["decided_by"] as? String == "last_choice", "\(thin.answer["reason"] ?? "")")

            let history = try await services.mediation.history(app: "med", limit: 50)
            #expect(history.map(\.kind) == ["switch", "switch", "switch", "policy"])
            #expect(history.compactMap(\.to) == ["nend", "iad", "admob", Self.automatic.summary])
            #expect(history[1].from == "admob" && history[1].reason.contains("hysteresis"), "\(history[1].reason)")
            #expect(history[0].actor.contains("pid"))
        }
    }

    @Test("the served answer has ETag and max-age, If-None-Match answers 304, and a weighted split draws by weight and stays put per client")
    func etagsAndWeights() async throws {
        var flags = Reports.flags
        flags.mediationRefreshSeconds = 3600
        try await withTestApp(flags: flags) { services, client in
            let admin = try await services.appStore.createKey(app: nil, scope: .admin).secret
            _ = try await services.appStore.createApp(id: "med", name: nil)
            _ = try await services.appStore.createApp(id: "other", name: nil)
            let ingest = try await services.appStore.createKey(app: "med", scope: .ingest).secret
            let otherKey = try await services.appStore.createKey(app: "other", scope: .ingest).secret
            func put(_ body: String) async throws -> (HTTPResponse.Status, String) {
                try await client.execute(uri: "/v1/apps/med/mediation/policies", method: .put, headers: Reports.headers(admin), body: ByteBuffer(string: body)) {
                    ($0.status, String(buffer: $0.body))
                }
            }
            func get(_ query: String = "", key: String, ifNoneMatch: String? = nil) async throws -> (status: HTTPResponse.Status, headers: HTTPFields, body: String) {
                var headers = Reports.headers(key)
                if let ifNoneMatch { headers[.ifNoneMatch] = ifNoneMatch }
                return try await client.execute(uri: "/v1/apps/med/mediation" + query, method: .get, headers: headers) { ($0.status, $0.headers, String(buffer: $0.body)) }
            }
            try await Self.waitUntilLoaded(services)
            #expect(try await get(key: ingest).status == .notFound)
            let (unknownField, unknownText) = try await put(#"{"rule": "pinned", "network": "admob", "window_hour": 6}"#)
            #expect(unknownField == .badRequest && unknownText.contains("window_hour: is not a policy field"), "\(unknownText)")
            let (fraction, fractionText) = try await put(#"{"rule": "weighted", "weights": {"admob": 1.5}}"#)
            #expect(fraction == .badRequest && fractionText.contains("weights.admob: must be a whole number"), "\(fractionText)")
            let (huge, hugeText) = try await put(#"{"rule": "pinned", "network": "x", "window_hours": -9223372036854775808}"#)
            #expect(huge == .badRequest && hugeText.contains("window_hours: must be a whole number"), "\(hugeText)")
            let (nullRule, nullText) = try await put(#"{"rule": null, "network": "x"}"#)
            #expect(nullRule == .badRequest && nullText.contains("rule: is required"), "\(nullText)")
            // What GET shows can be sent back: updated_at is ignored.
            #expect(try await put(#"{"rule": "pinned", "network": "admob", "max_age_seconds": 120, "updated_at": "2026-01-01T00:00:00Z"}"#).0 == .ok)
            let (status, text) = try await put(#"{"rule": "pinned"}"#)
            #expect(status == .badRequest && text.contains("network: is required"), "\(text)")
            #expect(try await put(#"{"rule": "often"}"#).1.contains("rule: must be pinned, weighted or automatic"))
            #expect(try await put(#"{"rule": "pinned", "network": "admob", "app": "other"}"#).0 == .badRequest)
            #expect(try await put(#"{"rule": "pinned", "network": "admob", "max_age_seconds": 120}"#).0 == .ok)

            let first = try await get(key: ingest)
            #expect(first.status == .ok)
            #expect(first.body.hasPrefix(#"{"enable_advertising":"admob","#), "\(first.body)")
            #expect(first.headers[.cacheControl] == "max-age=120")
            let etag = try #require(first.headers[.eTag])
            #expect(etag.hasPrefix("W/\"") && etag.count == 36, "\(etag)")
            let again = try await get(key: ingest, ifNoneMatch: etag)
            #expect(again.status == .notModified && again.body.isEmpty && again.headers[.eTag] == etag)
            #expect(try await get(key: ingest, ifNoneMatch: "\"x\", " + etag.dropFirst(2)).status == .notModified)
            #expect(try await get(key: ingest, ifNoneMatch: "\"0000\"").status == .ok)
            // Decided again (new numbers, a new decided_at): the network stands, and so does the tag.
            try await Task.sleep(for: .seconds(1.1))
            try await services.mediationRefresher.refresh(app: "med", force: true)
            let refreshed = try await get(key: ingest)
            #expect(refreshed.body != first.body && refreshed.headers[.eTag] == etag)
            #expect(try await get(key: ingest, ifNoneMatch: etag).status == .notModified)
            #expect(try await get(key: otherKey).status == .forbidden)
            #expect(try await get("?colour=red", key: ingest).status == .badRequest)
            #expect(try await get("?country=XX", key: ingest).status == .badRequest)

            // A placement of its own, split 3:1.
            let split = #"{"rule": "weighted", "placement": "home", "weights": {"admob": 3, "iad": 1}}"#
            #expect(try await put(split).0 == .ok)
            var seen: [String: Int] = [:]
            var tags: [String: String] = [:]
            for _ in 0..<400 {
                let answer = try await get("?placement=home", key: ingest)
                let object = try #require(try JSONSerialization.jsonObject(with: Data(answer.body.utf8)) as? [String: Any])
                let network = try #require(object["enable_advertising"] as? String)
                seen[network, default: 0] += 1
                tags[network] = answer.headers[.eTag]
                #expect((object["weights"] as? [String: Double]) == ["admob": 0.75, "iad": 0.25])
            }
            // 300 expected of 400: more than 8 standard deviations (8.7 each) leave room.
            #expect((230...370).contains(seen["admob"] ?? 0), "\(seen)")
            #expect(tags["admob"] != tags["iad"])
            // A client holding iad's answer keeps it.
            #expect(try await get("?placement=home", key: ingest, ifNoneMatch: try #require(tags["iad"])).status == .notModified)
            // Another placement falls to the app's policy.
            #expect(try await get("?placement=menu", key: ingest).body.hasPrefix(#"{"enable_advertising":"admob""#))

            let history = try await client.execute(uri: "/v1/apps/med/mediation/history", method: .get, headers: Reports.headers(admin)) { String(buffer: $0.body) }
            #expect(history.contains("\"kind\":\"switch\"") && history.contains("\"kind\":\"policy\""), "\(history)")
            let deleted = try await client.execute(uri: "/v1/apps/med/mediation/policies?placement=home", method: .delete, headers: Reports.headers(admin)) { $0.status }
            #expect(deleted == .noContent)
            #expect(try await get("?placement=home", key: ingest).body.hasPrefix(#"{"enable_advertising":"admob""#))
            // Another network: another tag, and the old one no longer matches.
            #expect(try await put(#"{"rule": "pinned", "network": "iad"}"#).0 == .ok)
            let moved = try await get(key: ingest, ifNoneMatch: etag)
            #expect(moved.status == .ok && moved.body.hasPrefix(#"{"enable_advertising":"iad""#) && moved.headers[.eTag] != etag)
        }
    }

    @Test("reads under load are answered from memory: the report engine runs no report for them")
    func readsUnderLoadSkipTheEngine() async throws {
        var flags = Reports.flags
        flags.mediationRefreshSeconds = 3600
        try await withTestApp(flags: flags) { services, client in
            // The background pass at start is over (the next comes in 15 minutes).
            try await Self.waitUntilLoaded(services)
            _ = try await services.appStore.createApp(id: "med", name: nil)
            let ingest = try await services.appStore.createKey(app: "med", scope: .ingest).secret
            try await Reports.store(services, app: "med", Self.traffic(network: "iad", hours: 0..<2, requests: 5, impressions: 5))
            _ = try await services.mediation.set(Self.automatic, actor: "test")
            try await services.mediationRefresher.refresh(app: "med", force: true)
            // Mediation reads on the background report pools (Database.backgroundReads).
            let reports = services.database.backgroundReads.reportCount
            #expect(reports >= 1)
            try await withThrowingTaskGroup(of: Int.self) { group in
                for _ in 0..<16 {
                    group.addTask {
                        var ok = 0
                        for _ in 0..<125 {
                            ok += try await client.execute(uri: "/v1/apps/med/mediation", method: .get, headers: Reports.headers(ingest)) { $0.status == .ok ? 1 : 0 }
                        }
                        return ok
                    }
                }
                var answered = 0
                for try await ok in group { answered += ok }
                #expect(answered == 2000)
            }
            #expect(services.database.backgroundReads.reportCount == reports)
        }
    }

    @Test("with the database gone the last decision is still served, with its ETag")
    func databaseGoneKeepsTheLastDecision() async throws {
        var flags = Reports.flags
        flags.mediationRefreshSeconds = 1
        try await withTestApp(flags: flags) { services, client in
            _ = try await services.appStore.createApp(id: "med", name: nil)
            let ingest = try await services.appStore.createKey(app: "med", scope: .ingest).secret
            _ = try await services.mediation.set(MediationPolicy(scope: MediationScope(app: "med"), rule: .pinned, network: "nend"), actor: "test")
            try await services.mediationRefresher.refresh(app: "med", force: true)
            let before = try await client.execute(uri: "/v1/apps/med/mediation", method: .get, headers: Reports.headers(ingest)) { ($0.status, $0.headers[.eTag], String(buffer: $0.body)) }
            #expect(before.0 == .ok)
            let name: String = try await services.database.pool.query("SELECT current_database()").first!.decode(0)
            let cluster = try TestDatabase.clusterURL
            try await onOwnThread {
                let admin = try PostgresConnection(connecting: cluster)
                _ = try admin.execute(unsafeSQL: "ALTER DATABASE \(name) ALLOW_CONNECTIONS false")
                _ = try admin.execute(unsafeSQL: "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '\(name)'")
            }
            // Past the key cache's 5 s: the key cannot be checked again, and refreshes fail.
            try await Task.sleep(for: .seconds(6))
            await #expect(throws: (any Error).self) { try await services.mediationRefresher.refresh(app: "med", force: true) }
            let during = try await client.execute(uri: "/v1/apps/med/mediation", method: .get, headers: Reports.headers(ingest)) { ($0.status, $0.headers[.eTag], String(buffer: $0.body)) }
            #expect(during.0 == .ok)
            #expect(during.1 == before.1 && during.2.hasPrefix(#"{"enable_advertising":"nend","#), "\(during)")
            #expect(try await client.execute(uri: "/v1/apps/med/mediation", method: .get, headers: [.authorization: "Bearer \(ingest)", .ifNoneMatch: before.1 ?? ""]) { $0.status } == .notModified)
            // A key never seen before cannot be checked: 503, not a guess.
            let unknown = "atk_" + String(repeating: "a", count: 48)
            #expect(try await client.execute(uri: "/v1/apps/med/mediation", method: .get, headers: Reports.headers(unknown)) { $0.status } == .serviceUnavailable)
            try await onOwnThread {
                let admin = try PostgresConnection(connecting: cluster)
                _ = try admin.execute(unsafeSQL: "ALTER DATABASE \(name) ALLOW_CONNECTIONS true")
            }
        }
    }

    @Test("adtally mediation set, show, history and unset work on the database; a bad option is refused by name")
    func commandLine() async throws {
        try await withMigratedDatabase { conninfo in
            let (database, _) = try await openWithApp(conninfo, app: "med")
            await database.close()
            func adtally(_ arguments: String...) async throws -> (status: Int32, output: String) {
                try await runProcess([adtallyBinary(), "mediation"] + arguments + ["--database-url", conninfo])
            }
            let bad = try await adtally("set", "med", "--rule", "automatic", "--networks", "admob,iad")
            #expect(bad.status != 0 && bad.output.contains("--default: is required"), "\(bad.output)")
            let pinned = try await adtally("set", "med", "--rule", "pinned", "--network", "nend")
            #expect(pinned.status == 0 && pinned.output.contains("serving nend"), "\(pinned.output)")
            let split = try await adtally("set", "med", "--country", "jp", "--rule", "weighted", "--weights", "admob=3,iad=1")
            #expect(split.status == 0, "\(split.output)")
            let show = try await adtally("show", "med")
            #expect(show.status == 0 && show.output.contains("policy:    pinned to nend") && show.output.contains("serving:   nend"), "\(show.output)")
            #expect(show.output.contains("country JP") && show.output.contains("split: admob 75%, iad 25%"), "\(show.output)")
            let json = try await adtally("show", "med", "--format", "json")
            let answers = try #require(try JSONSerialization.jsonObject(with: Data(json.output.utf8)) as? [[String: Any]], "\(json.output)")
            #expect(answers.count == 2 && answers.allSatisfy { $0["enable_advertising"] != nil })
            #expect(try await adtally("unset", "med", "--country", "JP").status == 0)
            #expect(try await adtally("unset", "med", "--country", "JP").output.contains("no mediation policy for med country=JP"))
            let history = try await adtally("history", "med")
            #expect(history.status == 0, "\(history.output)")
            for expected in ["deleted", "switch", "policy", "pinned to nend", "cli "] {
                #expect(history.output.contains(expected), "\(expected): \(history.output)")
            }
        }
    }

    @Test("--static-dir serves a folder's files under /static/ (the benchmark's peer), and nothing outside it")
    func staticFolder() async throws {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("adtally-static-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        try Data(#"{"enable_advertising":"admob"}"#.utf8).write(to: folder.appendingPathComponent("switch.json"))
        var flags = Settings.Flags()
        flags.staticDirectory = folder.path
        try await withTestApp(flags: flags) { _, client in
            let (status, body) = try await client.execute(uri: "/static/switch.json", method: .get) { ($0.status, String(buffer: $0.body)) }
            #expect(status == .ok && body == #"{"enable_advertising":"admob"}"#)
            #expect(try await client.execute(uri: "/static/none.json", method: .get) { $0.status } == .notFound)
            #expect(try await client.execute(uri: "/static/%2e%2e/%2e%2e/etc/passwd", method: .get) { $0.status } != .ok)
            #expect(try await client.execute(uri: "/healthz", method: .get) { $0.status } == .ok)
        }
        #expect(throws: SettingsError.self) { try Settings.resolve(flags: .init(), environment: ["ADTALLY_STATIC_DIR": folder.path + "/none"]) }
    }

    @Test("a placement policy counts exactly its placement's events, commas and all")
    func placementIsMatchedExactly() async throws {
        try await withServices(flags: Reports.flags) { services in
            _ = try await services.appStore.createApp(id: "med", name: nil)
            func placed(_ events: [AdEvent], _ placement: String) -> [AdEvent] {
                events.map { event in
                    var event = event
                    event.placement = placement
                    return event
                }
            }
            try await Reports.store(services, app: "med",
                placed(Self.traffic(network: "admob", hours: 0..<3, requests: 50, impressions: 10), "home,menu")
                    + placed(Self.traffic(network: "iad", hours: 0..<3, requests: 50, impressions: 40), "home")
                    + placed(Self.traffic(network: "nend", hours: 0..<3, requests: 50, impressions: 45), "menu")
            )
            var policy = Self.automatic
            policy.scope.placement = "home,menu"
            _ = try await services.mediation.set(policy, actor: "test")
            let (stats, _) = try await services.mediationRefresher.stats(policy, app: ReportApp(id: "med", timezone: "UTC", currency: "USD"), now: Self.at(3))
            #expect(stats.map(\.network) == ["admob"])
            #expect(stats.first?.counts.requests == 150)
        }
    }

    @Test("an automatic policy may rank by ARPDAV over the whole days before today: the engine's arpdav picks the network RPM would not; arpdau is refused saying why")
    func ranksByARPDAV() async throws {
        try await withServices(flags: Reports.flags) { services in
            _ = try await services.appStore.createApp(id: "med", name: nil)
            // admob earns 0.40 USD on 200 requests (RPM 2.00) from 10 viewers (ARPDAV 0.04);
            // iad 0.60 on 400 (RPM 1.50) from 5 viewers (0.12): by RPM admob, by ARPDAV iad.
            func viewed(_ events: [AdEvent], _ prefix: String, _ viewers: Int) -> [AdEvent] {
                var index = 0
                return events.map { event in
                    var event = event
                    if event.type == .impression { event.device = "\(prefix)\(index % viewers)"; index += 1 }
                    return event
                }
            }
            try await Reports.store(services, app: "med",
                viewed(Self.traffic(network: "admob", hours: 0..<2, requests: 100, impressions: 10, revenueMicros: 20_000), "a", 10)
                    + viewed(Self.traffic(network: "iad", hours: 0..<2, requests: 200, impressions: 50, revenueMicros: 6000), "b", 5)
            )
            var policy = Self.automatic
            policy.windowHours = 24
            policy.rankBy = .arpdav
            _ = try await services.mediation.set(policy, actor: "test")
            #expect(try await services.mediation.policies(app: "med").first?.policy.rankBy == .arpdav)
            let app = ReportApp(id: "med", timezone: "UTC", currency: "USD")
            // The next day at 03:00: the window is the whole day before.
            let (stats, from) = try await services.mediationRefresher.stats(policy, app: app, now: Self.at(27))
            #expect(from == Self.at(0), "whole UTC days: from the day's midnight")
            let byARPDAV = MediationChooser.choose(policy, stats: stats, incumbent: nil, currency: "USD")
            #expect(byARPDAV.network == "iad" && byARPDAV.reason.contains("ARPDAV") && byARPDAV.reason.contains("0.120000 USD"), "\(byARPDAV.reason)")
            var byRPM = policy
            byRPM.rankBy = .rpm
            byRPM.windowHours = 6
            let (hourly, _) = try await services.mediationRefresher.stats(byRPM, app: app, now: Self.at(3))
            #expect(MediationChooser.choose(byRPM, stats: hourly, incumbent: nil, currency: "USD").network == "admob")
            // DAV is per day, and only an automatic policy ranks.
            policy.windowHours = 36
            #expect(Self.refusedField(policy) == "window_hours")
            #expect(Self.refusedField(MediationPolicy(scope: MediationScope(app: "med"), rule: .pinned, network: "admob", rankBy: .arpdav)) == "rank_by")
            // arpdau would rank by revenue (a network's DAU is the app's): refused, saying so.
            let body = #"{"rule":"automatic","default":"admob","window_hours":24,"rank_by":"arpdau"}"#
            #expect(throws: FieldError.self) { try JSONDecoder().decode(MediationPolicy.self, from: Data(body.utf8)) }
            do {
                _ = try JSONDecoder().decode(MediationPolicy.self, from: Data(body.utf8))
            } catch let error as FieldError {
                #expect(error.field == "rank_by" && error.description.contains("rank networks by their revenue"), "\(error)")
            }
        }
    }
}
