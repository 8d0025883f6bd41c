import AdTallyApp
import AdTallyCore
@testable import AdTallyStorage
import AdTallyTestSupport
import Foundation
import Hummingbird
import HummingbirdTesting
import NIOCore
import PostgresKit
import Synchronization
import Testing

/// Pulls of the networks' reports from their APIs (issue 27 item 2), against a local
/// HTTP server that answers in the shapes the networks document: AdMob's JSON stream
/// (a DATA_DELAYED warning first, then a restated day), MAX's CSV, and a LevelPlay
/// that refuses the token.
@Suite("Network report pulls: the elected runner pulls yesterday and the restatement window from each network's API", .serialized)
struct NetworkPullTests {
    /// The fixture networks: what they were asked, and how many AdMob calls so far.
    final class Networks: Sendable {
        let admobCalls = Mutex(0)
        let asked = Mutex<[String]>([])

        /// AdMob's answer: a row per day of the asked range, the last day restated on the second call.
        func admob(_ request: Request) async throws -> Response {
            guard request.headers[.authorization] == "Bearer tok-admob" else { return Response(status: .unauthorized) }
            let body = try await request.body.collect(upTo: 1 << 16)
            let spec = try JSONSerialization.jsonObject(with: Data(buffer: body)) as? [String: Any]
            let range = (spec?["reportSpec"] as? [String: Any])?["dateRange"] as? [String: [String: Int]]
            guard let start = range?["startDate"], let end = range?["endDate"] else { return Response(status: .badRequest) }
            let call = admobCalls.withLock { $0 += 1; return $0 }
            func day(_ date: [String: Int]) -> Int {
                ReportQuery.parseDate(String(format: "%04d-%02d-%02d", date["year"]!, date["month"]!, date["day"]!))!
            }
            asked.withLock { $0.append("admob \(ReportQuery.formatDate(day(start)))..\(ReportQuery.formatDate(day(end)))") }
            var parts = [#"{"header": {"dateRange": {"startDate": {"year": \#(start["year"]!), "month": \#(start["month"]!), "day": \#(start["day"]!)}, "endDate": {"year": \#(end["year"]!), "month": \#(end["month"]!), "day": \#(end["day"]!)}}, "localizationSettings": {"currencyCode": "USD"}, "reportingTimeZone": "America/Los_Angeles"}}"#]
            for date in day(start)...day(end) {
                let earnings = date == day(end) && call > 1 ? 650_000 : 600_000
                let compact = ReportQuery.formatDate(date).replacingOccurrences(of: "-", with: "")
                parts.append(#"{"row": {"dimensionValues": {"DATE": {"value": "\#(compact)"}, "APP": {"value": "ca-app-pub-1234567890123456~1111111111"}, "FORMAT": {"value": "BANNER"}, "COUNTRY": {"value": "US"}}, "metricValues": {"IMPRESSIONS": {"integerValue": "100"}, "CLICKS": {"integerValue": "2"}, "ESTIMATED_EARNINGS": {"microsValue": "\#(earnings)"}}}}"#)
            }
            parts.append(call == 1
                ? #"{"footer": {"warnings": [{"type": "DATA_DELAYED", "description": "There is an unusual delay in processing the source data for the requested date range."}], "matchingRowCount": "4"}}"#
                : #"{"footer": {"matchingRowCount": "4"}}"#)
            return Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(string: "[" + parts.joined(separator: ",\n") + "]")))
        }

        /// Google's token endpoint: a refresh token for an hour's access token.
        func token(_ request: Request) async throws -> Response {
            let form = String(buffer: try await request.body.collect(upTo: 1 << 16))
            let fields = Dictionary(uniqueKeysWithValues: form.split(separator: "&").map { pair -> (String, String) in
                let parts = pair.split(separator: "=", maxSplits: 1).map { String($0).removingPercentEncoding ?? String($0) }
                return (parts[0], parts.count > 1 ? parts[1] : "")
            })
            guard fields["grant_type"] == "refresh_token", fields["client_id"] == "client-1", fields["client_secret"] == "s+cret", fields["refresh_token"] == "refresh-1" else {
                return Response(status: .badRequest, body: .init(byteBuffer: ByteBuffer(string: #"{"error": "invalid_grant"}"#)))
            }
            return Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(string: #"{"access_token": "tok-admob", "expires_in": 3599, "token_type": "Bearer"}"#)))
        }

        /// MAX's maxReport CSV: the key in the query, as MAX takes it.
        func max(_ request: Request) -> Response {
            let query = request.uri.queryParameters
            guard query.get("api_key") == "key-max", query.get("format") == "csv", let start = query.get("start"), let end = query.get("end") else {
                return Response(status: .forbidden, body: .init(byteBuffer: ByteBuffer(string: #"{"error": "invalid api_key"}"#)))
            }
            asked.withLock { $0.append("max \(start)..\(end)") }
            let csv = "day,application,package_name,platform,network,ad_format,country,impressions,estimated_revenue\n\(end),Game,com.example.game,android,APPLOVIN_NETWORK,INTER,us,10,0.2\n"
            return Response(status: .ok, headers: [.contentType: "text/csv"], body: .init(byteBuffer: ByteBuffer(string: csv)))
        }
    }

    @Test("pulls import each network's answer as an import of its own (via pull); a DATA_DELAYED day is not final until the restated pull; a refused token retries, then fails, naming the status; credentials never come back out")
    func pulls() async throws {
        let networks = Networks()
        let router = Router()
        router.post("admob/v1/accounts/pub-1/networkReport:generate") { request, _ in try await networks.admob(request) }
        router.post("oauth/token") { request, _ in try await networks.token(request) }
        router.get("max/maxReport") { request, _ in networks.max(request) }
        router.get("levelplay/stats") { _, _ in Response(status: .unauthorized, body: .init(byteBuffer: ByteBuffer(string: #"{"error": "token expired\u0007"}"#))) }
        let fixture = Application(router: router, configuration: .init(address: .hostname("127.0.0.1", port: 0)))
        try await fixture.test(.live) { client in
            let base = "http://127.0.0.1:\(try #require(client.port))"
            try await ExportTests.withSeededDatabase { conninfo, services, _ in
                let reports = NetworkReportStore(pool: services.database.pool)
                try await reports.setMappings([
                    .init(source: .admob, kind: .app, external: "ca-app-pub-1234567890123456~1111111111", target: "exp"),
                    .init(source: .max, kind: .app, external: "com.example.game", target: "exp"),
                ])
                let pulls = NetworkPulls(pool: services.database.pool, key: "test-key", fetch: NetworkPullClient(gate: .loopbackAllowed).fetch)
                // AdMob's credential mints an hour's token at the (fixture's) OAuth endpoint first.
                let oauth = #"{"client_id": "client-1", "client_secret": "s+cret", "refresh_token": "refresh-1", "token_uri": "\#(base)/oauth/token"}"#
                _ = try await pulls.save(NetworkPull(name: "admob-main", source: .admob, endpoint: base + "/admob/v1/accounts/pub-1/networkReport:generate"), credential: oauth)
                _ = try await pulls.save(NetworkPull(name: "max", source: .max, endpoint: base + "/max/maxReport", restatementDays: 0), credential: "key-max")
                _ = try await pulls.save(NetworkPull(name: "lp", source: .levelplay, endpoint: base + "/levelplay/stats"), credential: "tok-lp")
                // Refused, naming the field: a CSV has no API; an endpoint with a password in it.
                await #expect(throws: FieldError.self) { _ = try await pulls.save(NetworkPull(name: "x", source: .csv, endpoint: base), credential: "k") }
                await #expect(throws: FieldError.self) { _ = try await pulls.save(NetworkPull(name: "x", source: .max, endpoint: "http://u:p@127.0.0.1/"), credential: "k") }
                // Stored encrypted: the token's bytes are nowhere in the row.
                let plain = try await services.database.pool.query("SELECT count(*) FROM network_pulls WHERE position(convert_to('refresh-1', 'UTF8') IN credential) > 0 OR position(convert_to('key-max', 'UTF8') IN credential) > 0")
                #expect(try plain.first!.decode(0, as: Int.self) == 0)
                let listed = String(decoding: try JSONEncoder().encode(try await pulls.list()), as: UTF8.self)
                #expect(!listed.contains("tok-") && !listed.contains("refresh-1") && !listed.contains("key-max"))

                let (runner, pool) = Exports.runner(services, conninfo, identity: "puller") { configuration in
                    configuration.pulls = pulls
                    configuration.maxAttempts = 2
                }
                let task = Task { await runner.run() }
                let today = Int((Date().timeIntervalSince1970 / 86_400).rounded(.down))
                let todayText = ReportQuery.formatDate(today)
                try await waitUntil(within: 30) {
                    let runs = try await pulls.runs()
                    return runs.count == 3 && runs.allSatisfy { $0.status == "succeeded" || $0.status == "failed" }
                }
                var runs = Dictionary(uniqueKeysWithValues: try await pulls.runs().map { ($0.pull, $0) })
                // AdMob: yesterday and the 3 days before; MAX: yesterday only.
                let (from, to) = (ReportQuery.formatDate(today - 4), ReportQuery.formatDate(today - 1))
                #expect(runs["admob-main"]?.status == "succeeded" && runs["admob-main"]?.firstDay == from && runs["admob-main"]?.lastDay == to && runs["admob-main"]?.day == todayText)
                #expect(networks.asked.withLock { $0 }.sorted() == ["admob \(from)..\(to)", "max \(to)..\(to)"])
                #expect(runs["max"]?.status == "succeeded" && runs["max"]?.lines == 1)
                // LevelPlay refused the token: retried once (maxAttempts 2), then failed, with the status and the
                // network's words (its control character dropped), never the token.
                let failed = try #require(runs["lp"])
                #expect(failed.status == "failed" && failed.attempts == 2, "\(failed)")
                #expect(failed.error?.contains("HTTP 401") == true && failed.error?.contains("token expired") == true && failed.error?.contains("tok-lp") == false, "\(failed)")

                // The AdMob import: via pull, delayed, so none of its days is final.
                let firstImport = try #require(runs["admob-main"]?.importID)
                let imported = try await services.database.pool.query("SELECT via, is_delayed, first_day::text, last_day::text FROM network_imports WHERE import_id = \(firstImport)").first!
                #expect(try imported.decode(0, as: String.self) == "pull" && imported.decode(1, as: Bool.self) && imported.decode(2, as: String.self) == from && imported.decode(3, as: String.self) == to)
                var document = try await ReconciliationTests.run(services, [("apps", "exp"), ("from", to), ("to", to), ("dimensions", "date,network"), ("network", "admob")])
                #expect(document.rows.first?.theirs?.revenueMicros == 600_000 && document.rows.first?.isFinal == false && document.rows.first?.imports == [firstImport], "\(document.rows)")

                // Run again by hand: the restated day (0.65) replaces the first import's; no warning now.
                #expect(try await pulls.requestRun("admob-main")?.status == "pending")
                try await waitUntil(within: 30) {
                    let run = try await pulls.runs("admob-main").first
                    return run?.status == "succeeded" && run?.importID != firstImport
                }
                runs = Dictionary(uniqueKeysWithValues: try await pulls.runs().map { ($0.pull, $0) })
                let secondImport = try #require(runs["admob-main"]?.importID)
                document = try await ReconciliationTests.run(services, [("apps", "exp"), ("from", to), ("to", to), ("dimensions", "date,network"), ("network", "admob")])
                #expect(document.rows.first?.theirs?.revenueMicros == 650_000 && document.rows.first?.imports == [secondImport], "\(document.rows)")
                task.cancel()
                await task.value
                await pool.shutdown()
                // A paused pull runs nothing, by hand neither.
                #expect(try await pulls.setPaused("max", true))
                await #expect(throws: NetworkPulls.Paused.self) { _ = try await pulls.requestRun("max") }
                #expect(try await pulls.delete("lp"))
                #expect(try await pulls.runs("lp").isEmpty)
                // A pull created paused never ran, not even between its creation and a pause
                // (the runner plans every pull not paused); replacing it keeps it paused.
                var quiet = NetworkPull(name: "quiet", source: .max, endpoint: "http://127.0.0.1:1/maxReport")
                quiet.isPaused = true
                #expect(try await pulls.save(quiet, credential: "k").isPaused)
                quiet.isPaused = false
                #expect(try await pulls.save(quiet, credential: "k").isPaused)
                #expect(try await pulls.list().first { $0.name == "quiet" }?.isPaused == true)
                await #expect(throws: NetworkPulls.Paused.self) { _ = try await pulls.requestRun("quiet") }
            }
        }
    }
}
