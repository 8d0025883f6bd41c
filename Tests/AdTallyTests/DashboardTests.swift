import AdTallyApp
@testable import AdTallyCore
@testable import AdTallyHTTP
import AdTallyStorage
import AdTallyTestSupport
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Logging
import NIOCore
import PostgresKit
import Testing

@Suite("Dashboards")
struct DashboardTests {
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// Loads a small demo (28 days, a twentieth of the default traffic) into the test app's database.
    static func loadDemo(_ services: AppServices) async throws -> DemoLoader.Summary {
        var logger = Logger(label: "adtally.test")
        logger.logLevel = .warning
        return try await DemoLoader(database: services.database, days: 28, scale: 0.05, logger: logger).load()
    }

    static func cookie(from response: TestResponse) -> String? {
        response.headers[.setCookie].flatMap { $0.split(separator: ";").first.map(String.init) }
    }

    @Test("signing in trades a read key for an HttpOnly, SameSite=Strict cookie signed by the server; forged, revoked and ingest keys get nothing")
    func signingIn() async throws {
        try await withTestApp(flags: Reports.flags) { services, client in
            let app = try await services.appStore.createApp(id: "dash", name: nil, timezone: "Asia/Kolkata", currency: "USD")
            let read = try await services.appStore.createKey(app: app.id, scope: .read)
            let ingest = try await services.appStore.createKey(app: app.id, scope: .ingest)
            let form: HTTPFields = [.contentType: "application/x-www-form-urlencoded"]
            func login(_ secret: String, headers: HTTPFields = [:]) async throws -> TestResponse {
                var all = form
                all.append(contentsOf: headers)
                return try await client.execute(uri: "/dashboard/login", method: .post, headers: all, body: ByteBuffer(string: "key=\(secret)"))
            }

            // No session: the sign-in form, which posts the key (never a URL parameter).
            let first = try await client.execute(uri: "/dashboard", method: .get)
            #expect(first.status == .ok)
            let form0 = String(buffer: first.body)
            #expect(form0.contains(#"<form method="post" action="/dashboard/login">"#) && form0.contains(#"type="password""#))
            #expect(first.headers[.contentSecurityPolicy]?.contains("default-src 'none'") == true)

            let signedIn = try await login(read.secret)
            #expect(signedIn.status == .seeOther && signedIn.headers[.location] == "/dashboard")
            let setCookie = try #require(signedIn.headers[.setCookie])
            #expect(setCookie.contains("HttpOnly") && setCookie.contains("SameSite=Strict") && setCookie.contains("Path=/dashboard"))
            #expect(!setCookie.contains(read.secret) && !setCookie.contains(String(read.secret.dropFirst(4).prefix(16))))
            let session = try #require(Self.cookie(from: signedIn))
            #expect(session.hasPrefix("adtally_session=v1.\(read.id)."))

            let page = try await client.execute(uri: "/dashboard", method: .get, headers: [.cookie: session])
            #expect(page.status == .ok)
            let html = String(buffer: page.body)
            // Eight charts of the range, and the LTV curves of the cohorts (beside their triangle).
            #expect(html.components(separatedBy: "<svg class=\"chart\"").count - 1 == 9)
            #expect(html.contains("<svg class=\"cohorts\"") || html.contains("No installs in these days"))
            #expect(html.contains("Asia/Kolkata") && !html.contains(read.secret))
            // A script may send its key instead of a cookie.
            #expect(try await client.execute(uri: "/dashboard", method: .get, headers: [.authorization: "Bearer \(read.secret)"]).status == .ok)

            // A session is good on every server of the database: the secret is shared.
            let other = DashboardSessions(store: services.appStore)
            let otherValue = try await other.make(keyID: read.id)
            #expect(try await other.keyID(from: String(session.dropFirst("adtally_session=".count))) == read.id)
            #expect(try await client.execute(uri: "/dashboard", method: .get, headers: [.cookie: "adtally_session=\(otherValue)"]).status == .ok)

            // Forged: another key id under the same MAC, a changed expiry, an expired one.
            let parts = session.dropFirst("adtally_session=".count).split(separator: ".").map(String.init)
            let admin = try await services.appStore.createKey(app: nil, scope: .admin)
            for forged in ["v1.\(admin.id).\(parts[2]).\(parts[3])", "v1.\(parts[1]).\(Int(parts[2])! + 86_400).\(parts[3])", "v1.\(parts[1]).\(parts[2]).\(String(repeating: "0", count: 64))"] {
                let response = try await client.execute(uri: "/dashboard", method: .get, headers: [.cookie: "adtally_session=\(forged)"])
                #expect(String(buffer: response.body).contains("/dashboard/login"), "\(forged) was taken")
                #expect(response.headers[.setCookie]?.contains("Max-Age=0") == true, "a bad cookie is cleared")
            }
            let expired = try await other.make(keyID: read.id, now: Date(timeIntervalSinceNow: -Double(DashboardSessions.lifetime) - 1))
            #expect(try await other.keyID(from: expired) == nil)

            // Refusals name the reason; nothing is set.
            let unknown = try await login("atk_" + String(repeating: "0", count: 48))
            #expect(unknown.status == .unauthorized && unknown.headers[.setCookie] == nil && String(buffer: unknown.body).contains("unknown or revoked"))
            let ingestLogin = try await login(ingest.secret)
            #expect(ingestLogin.status == .forbidden && ingestLogin.headers[.setCookie] == nil && String(buffer: ingestLogin.body).contains("ingest key"))
            #expect(try await client.execute(uri: "/dashboard", method: .get, headers: [.authorization: "Bearer \(ingest.secret)"]).status == .forbidden)
            // Another site's form cannot sign a browser in (or out); this site's can, behind a proxy too.
            #expect(try await login(read.secret, headers: [.origin: "https://evil.example"]).status == .forbidden)
            #expect(try await login(read.secret, headers: [.origin: "null"]).status == .forbidden)
            #expect(try await login(read.secret, headers: [HTTPField.Name("Sec-Fetch-Site")!: "cross-site", .origin: "http://localhost:\(client.port ?? 0)"]).status == .forbidden)
            #expect(try await login(read.secret, headers: [HTTPField.Name("Sec-Fetch-Site")!: "same-origin"]).status == .seeOther)
            #expect(try await login(read.secret, headers: [.origin: "https://ads.example", HTTPField.Name("X-Forwarded-Host")!: "ads.example"]).status == .seeOther)
            #expect(try await client.execute(uri: "/dashboard/logout", method: .post, headers: [.origin: "https://evil.example"]).status == .forbidden)
            // Back to the page the link asked for; nothing but this page's parameters.
            let withNext = try await client.execute(uri: "/dashboard/login", method: .post, headers: form, body: ByteBuffer(string: "key=\(read.secret)&next=app%3Ddash%26from%3D2026-11-01"))
            #expect(withNext.headers[.location] == "/dashboard?app%3Ddash%26from%3D2026-11-01" || withNext.headers[.location] == "/dashboard?app=dash&from=2026-11-01")
            for hostile in ["//evil.example", "https://evil.example", "app=x#y", "a\r\nSet-Cookie:x"] {
                let response = try await login(read.secret + "&next=" + (hostile.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? ""))
                #expect(response.headers[.location] == "/dashboard", "next=\(hostile)")
            }
            let asked = try await client.execute(uri: "/dashboard?app=dash&from=2026-11-01", method: .get)
            #expect(String(buffer: asked.body).contains(#"name="next" value="app=dash&amp;from=2026-11-01""#))
            // A proxy's Basic authentication does not hide the session.
            #expect(String(buffer: try await client.execute(uri: "/dashboard", method: .get, headers: [.cookie: session, .authorization: "Basic dTpw"]).body).contains("<svg class=\"chart\""))
            #expect(try await client.execute(uri: "/dashboard/login", method: .post, headers: [.contentType: "application/json"], body: ByteBuffer(string: "{}")).status == .unsupportedMediaType)
            #expect(try await client.execute(uri: "/dashboard/login", method: .post, headers: form, body: ByteBuffer(string: String(repeating: "k", count: 5000))).status == .contentTooLarge)

            // The CSV under the table: the session's key, the table's columns.
            let csv = try await client.execute(uri: "/dashboard/report.csv?app=dash", method: .get, headers: [.cookie: session])
            #expect(csv.status == .ok && csv.headers[.contentType]?.hasPrefix("text/csv") == true)
            #expect(String(buffer: csv.body).hasPrefix("date,requests,impressions,fill_rate,taps,ctr,action_cancels,cancel_rate,revenue,ecpm\r\n"))
            #expect(try await client.execute(uri: "/dashboard/report.csv", method: .get).status == .unauthorized)
            #expect(try await client.execute(uri: "/dashboard/report.csv?app=other", method: .get, headers: [.cookie: session]).status == .badRequest)

            // Revoking the key ends its sessions at once.
            try await services.appStore.revokeKey(read.id)
            let afterRevoke = try await client.execute(uri: "/dashboard", method: .get, headers: [.cookie: session])
            #expect(String(buffer: afterRevoke.body).contains("/dashboard/login"))

            // Signing out clears the cookie.
            let out = try await client.execute(uri: "/dashboard/logout", method: .post, headers: [.cookie: session])
            #expect(out.status == .seeOther && out.headers[.setCookie]?.contains("Max-Age=0") == true)
        }
    }

    @Test("hostile cookies, forms and parameters get a page or a 4xx, never a 5xx or a session")
    func hostileInput() async throws {
        try await withTestApp(flags: Reports.flags) { services, client in
            _ = try await services.appStore.createApp(id: "dash", name: nil, timezone: "UTC", currency: "USD")
            let read = try await services.appStore.createKey(app: "dash", scope: .read)
            var random = SplitMix64(seed: 11)
            let alphabet = Array("v1.key_0123456789abcdef%=&+;,\"\\ \t<>'\u{0}\u{7f}é😀".unicodeScalars)
            func noise(_ length: Int) -> String {
                String(String.UnicodeScalarView((0..<length).map { _ in alphabet[Int(random.next() % UInt64(alphabet.count))] }))
            }
            for round in 0..<150 {
                let text = noise(Int(random.next() % 120))
                // Cookies: a bad one is the sign-in form, never a session.
                let encoded = text.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? ""
                let cookie = round % 2 == 0 ? "adtally_session=\(encoded)" : "adtally_session=v1.\(read.id).\(Int(Date().timeIntervalSince1970) + 99).\(encoded)"
                let page = try await client.execute(uri: "/dashboard", method: .get, headers: [.cookie: cookie])
                #expect(page.status == .ok && String(buffer: page.body).contains("/dashboard/login"), "cookie \(cookie)")
                // Forms: unknown keys are a 401 with the form again.
                let form = try await client.execute(
                    uri: "/dashboard/login", method: .post, headers: [.contentType: "application/x-www-form-urlencoded"], body: ByteBuffer(string: round % 3 == 0 ? "key=\(text)" : text)
                )
                #expect(form.status == .unauthorized && form.headers[.setCookie] == nil, "form \(text)")
                // Parameters: a page naming the bad one, or the default range.
                let query = "app=\(encoded)&from=\(encoded)&to=\(encoded)"
                let status = try await client.execute(uri: "/dashboard?\(query)", method: .get, headers: [.authorization: "Bearer \(read.secret)"]).status
                #expect(status == .ok || status == .badRequest, "\(query): \(status)")
            }
        }
    }

    @Test("bad ranges are said on the page, named by field; a missing FX rate is a 422 that names currency and date")
    func badSelections() async throws {
        try await withTestApp(flags: Reports.flags) { services, client in
            _ = try await services.appStore.createApp(id: "dash", name: nil, timezone: "UTC", currency: "USD")
            let admin = try await services.appStore.createKey(app: nil, scope: .admin).secret
            func page(_ query: String) async throws -> (HTTPResponse.Status, String) {
                try await client.execute(uri: "/dashboard?\(query)", method: .get, headers: [.authorization: "Bearer \(admin)"]) { ($0.status, String(buffer: $0.body)) }
            }
            #expect(try await page("from=2026-13-01").0 == .badRequest)
            #expect(try await page("from=2026-13-01").1.contains("from: must be a date YYYY-MM-DD"))
            #expect(try await page("from=2026-02-01&to=2026-01-01").1.contains("from: must not be after to"))
            #expect(try await page("from=2020-01-01&to=2026-01-01").1.contains("at most 366 days"))
            #expect(try await page("app=%3Cscript%3E").1.contains("no app &quot;&lt;script&gt;&quot;"))
            // Reported revenue in a currency the FX table cannot convert.
            let ingest = try await services.appStore.createKey(app: "dash", scope: .ingest).secret
            let event = #"{"id":"\#(UUID().uuidString)","type":"impression","occurred_at":"\#(ISO8601DateFormatter().string(from: Date()))","network":"admob","format":"banner","revenue_micros":1000,"currency":"JPY"}"#
            #expect(try await client.execute(uri: "/v1/events", method: .post, headers: [.authorization: "Bearer \(ingest)", .contentType: "application/json"], body: ByteBuffer(string: #"{"events":[\#(event)]}"#)).status == .ok)
            let (status, html) = try await page("app=dash")
            #expect(status == .unprocessableContent && html.contains("no FX rate converts JPY to USD"))
        }
    }

    @Test("an admin key with no app yet gets a page that says so and can sign out")
    func noAppsYet() async throws {
        try await withTestApp(flags: Reports.flags) { services, client in
            let admin = try await services.appStore.createKey(app: nil, scope: .admin).secret
            let page = try await client.execute(uri: "/dashboard", method: .get, headers: [.authorization: "Bearer \(admin)"])
            #expect(page.status == .notFound && page.headers[.contentType]?.hasPrefix("text/html") == true)
            let html = String(buffer: page.body)
            #expect(html.contains("no app to show yet") && html.contains("/dashboard/logout"))
        }
    }

    @Test("the headline compares with the days before only when the app has data for all of them; otherwise it says there is no earlier data")
    func headlineBeforeTheData() async throws {
        try await withTestApp(flags: Reports.flags) { services, client in
            let admin = try await services.appStore.createKey(app: nil, scope: .admin).secret
            let today = Int64(Date().timeIntervalSince1970 / 86_400)
            func day(_ back: Int64) -> Int64 { (today - back) * 86_400_000_000 + 3_600_000_000 }
            // New: data from 30 days ago, so the 28 days before the default range are mostly empty.
            _ = try await services.appStore.createApp(id: "fresh", name: nil)
            try await Reports.store(services, app: "fresh", (0..<40).map { Reports.event(.request, at: day($0 % 2 == 0 ? 30 : 3) + Int64($0)) })
            // Old: data 60 and 40 days ago too: the days before are all after its first, and hold some.
            _ = try await services.appStore.createApp(id: "old", name: nil)
            try await Reports.store(services, app: "old", (0..<60).map { Reports.event(.request, at: day([60, 40, 3][$0 % 3]) + Int64($0)) })
            for (app, compares) in [("fresh", false), ("old", true)] {
                let page = try await client.execute(uri: "/dashboard?app=\(app)", method: .get, headers: [.authorization: "Bearer \(admin)"])
                let html = String(buffer: page.body)
                #expect(page.status == .ok)
                #expect(html.contains("vs the 28 days before") == compares, "\(app)")
                #expect(html.contains("no earlier data to compare") == !compares, "\(app)")
            }
        }
    }

    @Test("hours by hour: every local hour in time order, a DST day's repeated hour twice (east and west of UTC)")
    func localHours() {
        let berlin = DashboardPage.hours(from: ReportQuery.parseDate("2026-10-25")!, to: ReportQuery.parseDate("2026-10-25")!, zone: "Europe/Berlin")
        #expect(berlin.count == 25)
        #expect(Array(berlin[2...3]) == ["2026-10-25T02:00:00+02:00", "2026-10-25T02:00:00+01:00"])
        let newYork = DashboardPage.hours(from: ReportQuery.parseDate("2026-03-08")!, to: ReportQuery.parseDate("2026-03-09")!, zone: "America/New_York")
        #expect(newYork.count == 47 && newYork[2] == "2026-03-08T03:00:00-04:00" && newYork.last == "2026-03-09T23:00:00-04:00")
        let kolkata = DashboardPage.hours(from: ReportQuery.parseDate("2026-01-01")!, to: ReportQuery.parseDate("2026-01-01")!, zone: "Asia/Kolkata")
        #expect(kolkata.count == 24 && kolkata[0] == "2026-01-01T00:00:00+05:30")
        // Sorted as instants, not as text: "+02:00" comes before "+01:00" on the day it is repeated.
        #expect(berlin.shuffled().sorted { DashboardPage.instant($0)! < DashboardPage.instant($1)! } == berlin)
        // Labels: every date's first hour carries its date, wherever the calendar puts it;
        // other labels at local hours dividing the day.
        let threeDays = DashboardPage.hours(from: ReportQuery.parseDate("2026-10-24")!, to: ReportQuery.parseDate("2026-10-26")!, zone: "Europe/Berlin")
        let labels = DashboardPage.labels(threeDays, grain: .hour)
        #expect(threeDays.count == 73 && labels.filter { !$0.isEmpty }.count <= 14)
        #expect(labels.contains("10-25 00:00") && labels.contains("10-26 00:00") && labels.contains("10-24 00:00"))
        #expect(zip(threeDays, labels).allSatisfy { hour, label in label.isEmpty || label.hasSuffix(String(hour.dropFirst(11).prefix(5))) })
        let santiago = DashboardPage.hours(from: ReportQuery.parseDate("2026-09-05")!, to: ReportQuery.parseDate("2026-09-07")!, zone: "America/Santiago")
        #expect(DashboardPage.labels(santiago, grain: .hour).contains { $0.hasPrefix("09-06 ") } && DashboardPage.labels(santiago, grain: .hour).contains("09-07 00:00"))
        let days = (ReportQuery.parseDate("2026-12-20")!...ReportQuery.parseDate("2027-01-10")!).map(ReportQuery.formatDate)
        #expect(DashboardPage.labels(days, grain: .date).first == "2026-12-20" && DashboardPage.labels(days, grain: .date).filter { !$0.isEmpty }.count <= 8)
    }

    @Test("charts: nice quarter ticks, one mark per drawn value, gaps for undefined ratios, stacked bars summing to the stack")
    func chartDrawing() {
        #expect(SVGChart.niceCeiling(0.78) == 0.8 && SVGChart.niceCeiling(113) == 120 && SVGChart.niceCeiling(2114) == 4000 && SVGChart.niceCeiling(0) == 1)
        #expect(SVGChart.tick(0.6000000000000001, .percent) == "60%" && SVGChart.tick(0.075, .percent) == "7.5%")
        #expect(SVGChart.tick(1500, .count) == "1.5k" && SVGChart.tick(2_000_000, .money("JPY")) == "2M" && SVGChart.tick(0.3, .money("USD")) == "0.3")
        let chart = SVGChart(
            id: "t", title: "t <&>", categories: ["2026-01-01", "2026-01-02", "2026-01-03"], categoryLabels: ["01-01", "01-02", "01-03"], provisional: [2],
            leftUnit: .count, leftTitle: "n", rightUnit: .percent, rightTitle: "%", isStacked: true,
            series: [
                .init(name: "a", kind: .bar, colour: 0, values: [1, 2, 0], labels: ["x", "y", "z"]),
                .init(name: "b", kind: .bar, colour: 1, values: [3, 2, 0], labels: ["x", "y", "z"]),
                .init(name: "r", kind: .line, axis: .right, colour: 2, values: [0.5, nil, 0.25], labels: ["x", "y", "z"]),
            ]
        )
        let svg = chart.svg()
        #expect(svg.components(separatedBy: "class=\"mark").count - 1 == 8)
        #expect(svg.components(separatedBy: "<rect class=\"provisional\"").count - 1 == 1)
        #expect(svg.contains("t &lt;&amp;&gt;") && !svg.contains("t <&>"))
        // The undefined ratio breaks the line into two pieces.
        #expect(svg.contains(#"d="M"#) && svg.components(separatedBy: "M").count - 1 >= 2)
        #expect(chart.axisMaximum(.left) == 4 && chart.axisMaximum(.right) == 0.5)
        // A value above 0 however small beside the maximum (a new day's first minutes)
        // is still drawn with a height; 0 is not.
        let tiny = SVGChart(
            id: "t", title: "t", categories: ["a", "b", "c"], categoryLabels: ["a", "b", "c"], provisional: [], leftUnit: .money("USD"), leftTitle: "USD",
            series: [.init(name: "n", kind: .bar, colour: 0, values: [5000, 0.001, 0], labels: ["x", "y", "z"])]
        ).svg()
        let heights = tiny.matches(of: /data-series="n"[^>]*height="([0-9.]+)"/).map { Double($0.1)! }
        #expect(heights.count == 3 && heights[0] > 100 && heights[1] >= 0.5 && heights[2] == 0, "\(heights)")
    }

    @Test("headless Chromium signs in through the form and finds every chart's marks as the report API counts them; the screenshot is saved")
    func browser() async throws {
        try await withTestApp(flags: Reports.flags) { services, client in
            let demo = try await Self.loadDemo(services)
            let port = try #require(client.port)
            let screenshot = ProcessInfo.processInfo.environment["ADTALLY_SCREENSHOT"]
                ?? Self.repository.appendingPathComponent(".build/dashboard.png").path
            let (status, output) = try await runProcess(["python3", Self.repository.appendingPathComponent("scripts/dashboard_browser_check.py").path,
                                                 "http://127.0.0.1:\(port)", demo.readKey.secret, screenshot])
            #expect(status == 0, "\(output)")
            #expect(output.contains(#""inventory""#) && output.contains(#""revenue""#), "\(output)")
            let attributes = try FileManager.default.attributesOfItem(atPath: screenshot)
            #expect((attributes[.size] as? Int ?? 0) > 50_000, "the screenshot is a real page")
        }
    }

    @Test("the report series are written by change: an idle app costs nothing; new events, a card or an FX change rewrite their days; midnight rewrites all")
    func seriesByChange() async throws {
        try await withServices(flags: Reports.flags) { services in
            _ = try await services.appStore.createApp(id: "steady", name: nil, timezone: "Asia/Kolkata", currency: "USD")
            _ = try await services.appStore.createApp(id: "idle", name: nil, timezone: "UTC", currency: "USD")
            let now = Date()
            let today = try ReportQuery.today(in: "Asia/Kolkata", now: now)
            let nowMicros = Int64(now.timeIntervalSince1970) * 1_000_000
            func requests(_ count: Int, hoursAgo: Int64) async throws {
                let events = (0..<count).map { _ in Reports.event(.request, at: nowMicros - hoursAgo * 3_600_000_000) }
                try await Reports.store(services, app: "steady", events)
                try await services.compactor.compactOnce()
            }
            try await requests(5, hoursAgo: 50)
            var configuration = ReportSeriesWriter.Configuration()
            configuration.freshFor = .zero
            let writer = ReportSeriesWriter(engine: services.reports, pool: services.database.pool, configuration: configuration)
            let full = try await writer.refresh(now: now)
            #expect(full > 0)
            let pool = services.database.pool
            func day(_ offset: Int) async throws -> Int64? {
                try await pool.query("""
                    SELECT requests FROM report_series WHERE app_id = 'steady' AND grain = 'day' AND network = '*' AND period = \(ReportQuery.formatDate(today + offset))
                    """).first?.decode(0, as: Int64.self)
            }
            func refreshedAt() async throws -> [String: String] {
                Dictionary(uniqueKeysWithValues: try await pool.query("SELECT app_id, refreshed_at::text FROM report_series_refresh").map {
                    (try $0.decode(0, as: String.self), try $0.decode(1, as: String.self))
                })
            }
            // Nothing changed: no app is written again.
            let before = try await refreshedAt()
            #expect(try await writer.refresh(now: now) == 0)
            #expect(try await refreshedAt() == before)
            // New events: their day's rows (and the windows holding it) are written, the idle app is not.
            try await requests(3, hoursAgo: 0)
            let partial = try await writer.refresh(now: now)
            #expect(partial > 0 && partial < full, "\(partial) of \(full)")
            #expect(try await day(0) == 3)
            #expect(try await refreshedAt()["idle"] == before["idle"])
            #expect(try await pool.query("SELECT count(*) FROM report_series_changes").first!.decode(0, as: Int.self) == 0)
            // A card change marks every app from its date on; an FX change, the days it covers.
            // The series of an app whose priced rows the change left stale wait for the re-pricer
            // (a report would price those ranges itself, at several times the cost), then are written.
            try await MoneyStore(pool: pool).setRates([try MoneyTests.entry("admob", "*", cpm: "1", cpt: "0", from: ReportQuery.formatDate(today - 1))])
            #expect(try await writer.refresh(now: now) == 0, "the series wait for the re-pricer")
            #expect(try await services.compactor.reprice(for: .seconds(120)) == false)
            #expect(try await writer.refresh(now: now) > 0)
            #expect(try await refreshedAt()["idle"] != before["idle"])
            #expect(try await writer.refresh(now: now) == 0)
            // Past `repricingWait` from the change: a re-pricer that does not come is not waited for.
            let waited = try await refreshedAt()
            try await MoneyStore(pool: pool).setRates([try MoneyTests.entry("admob", "*", cpm: "2", cpt: "0", from: ReportQuery.formatDate(today - 1))])
            #expect(try await writer.refresh(now: now) == 0)
            try await pool.query("UPDATE rollup_dirty SET marked_at = now() - interval '11 minutes'")
            #expect(try await writer.refresh(now: now) > 0)
            #expect(try await refreshedAt()["idle"] != waited["idle"])
            #expect(try await services.compactor.reprice(for: .seconds(120)) == false)
            _ = try await MoneyStore(pool: pool).importFX([try FXRate.parse(date: ReportQuery.formatDate(today), base: "EUR", currency: "USD", rate: "1.1")])
            #expect(try await writer.refresh(now: now) > 0)
            // Past the app's next local midnight every part is written again.
            #expect(try await writer.refresh(now: now.addingTimeInterval(86_400)) >= full)
        }
    }

    @Test("every Grafana panel's SQL, macros and variables substituted, runs against demo data and returns rows")
    func grafanaPanels() async throws {
        try await withServices(flags: Reports.flags) { services in
            _ = try await Self.loadDemo(services)
            let written = try await services.reportSeries.refresh(force: true)
            #expect(written > 100)
            // Written twice, the rows are replaced, not doubled.
            #expect(try await services.reportSeries.refresh(force: true) == written)
            #expect(try await services.reportSeries.refresh() == 0, "a fresh app is skipped")
            let count = try await services.database.pool.query("SELECT count(*) FROM report_series")[0].decode(0, as: Int.self)
            #expect(count == written)

            // The engine's own numbers: a day's row equals the report API's for that day.
            let readable = try await services.reports.readableApps(only: nil)
            let query = try ReportQuery.parse([("apps", "demo-puzzle"), ("days", "3"), ("dimensions", "date"), ("metrics", "requests,fill_rate,revenue,dau,arpdau")], readable: readable, isAdmin: true)
            let page = try await services.reports.page(query)
            for row in page.rows {
                let stored = try await services.database.pool.query("""
                    SELECT requests, fill_rate::text, revenue::text, dau::text, arpdau::text FROM report_series
                    WHERE app_id = 'demo-puzzle' AND grain = 'day' AND network = '*' AND period = \(row.dimensions[0]!)
                    """)
                let cells = page.layout.cells(row)
                // A missing row fails the test; indexing it would trap the whole test process.
                let day = try #require(stored.first, "no report_series row for \(row.dimensions[0] ?? "")")
                #expect(try day.decode(0, as: Int64.self) == row.counts.requests)
                // As the API writes it (ratios to 6 decimals).
                #expect(try Double(day.decode(1, as: String.self)) == Double(ReportText.plain(cells[2])))
                #expect(try day.decode(2, as: String.self) == ReportText.plain(cells[3]))
                // The demo's sessions make every day's DAU larger than 0.
                #expect(try Double(day.decode(3, as: String.self)) == Double(ReportText.plain(cells[4])) && row.counts.deviceDays > 0)
                #expect(try day.decode(4, as: String.self) == ReportText.plain(cells[5]))
            }

            // The cohort series (Migrations/0025): the engine's cohort report, cell for cell,
            // for every whole install day of the window (today's installs are null until it ends).
            let tokyo = try ReportQuery.today(in: "Asia/Tokyo", now: Date())
            let cohorts = try await services.reports.page(try ReportQuery.parse(
                [("apps", "demo-puzzle"), ("from", ReportQuery.formatDate(tokyo - 60)), ("to", ReportQuery.formatDate(tokyo - 1)), ("dimensions", "cohort"),
                 ("metrics", ReportSeriesWriter.cohortMetrics.joined(separator: ","))],
                readable: readable, isAdmin: true
            ))
            let stored = try await services.database.pool.query(PostgresQuery(unsafeSQL: "SELECT cohort::text, "
                + ReportSeriesWriter.cohortMetrics.map { "\($0)::text" }.joined(separator: ", ")
                + " FROM cohort_series WHERE app_id = 'demo-puzzle' ORDER BY cohort"))
            #expect(stored.count > 20, "the demo installs devices every day")
            let oldest = try stored.first?.decode(0, as: String.self) ?? ""
            let engineRows = cohorts.rows.filter { ($0.dimensions[0] ?? "") >= oldest }
            #expect(stored.count == engineRows.count, "every whole install day of the window is written")
            for (row, line) in zip(engineRows, stored) {
                let cells = cohorts.layout.cells(row)
                #expect(try line.decode(0, as: String.self) == row.dimensions[0])
                for index in ReportSeriesWriter.cohortMetrics.indices {
                    let text = ReportText.plain(cells[index + 1])
                    let value = try line.decode(index + 1, as: String?.self)
                    #expect(text.isEmpty ? value == nil : value.flatMap(Double.init) == Double(text),
                            "\(row.dimensions[0] ?? "") \(ReportSeriesWriter.cohortMetrics[index]): stored \(value ?? "NULL"), the engine says \(text)")
                }
            }

            var queries = 0
            for file in try FileManager.default.contentsOfDirectory(atPath: Self.repository.appendingPathComponent("Dashboards").path) where file.hasSuffix(".json") {
                let data = try Data(contentsOf: Self.repository.appendingPathComponent("Dashboards/\(file)"))
                let dashboard = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
                // Template variables as Grafana fills them: each one's own query, in order,
                // with the ones before substituted; the first value, or all for a multi-value one.
                var variables: [String: [String]] = [:]
                let list = (dashboard["templating"] as? [String: Any])?["list"] as? [[String: Any]] ?? []
                let multi = Set(list.filter { $0["multi"] as? Bool == true }.compactMap { $0["name"] as? String })
                for variable in list {
                    guard let name = variable["name"] as? String, let sql = variable["query"] as? String else { continue }
                    let rows = try await services.database.pool.query(PostgresQuery(unsafeSQL: try GrafanaSQL.substitute(sql, variables: variables, multi: multi)))
                    let values = try rows.map { try $0.decode(0, as: String.self) }
                    #expect(!values.isEmpty, "\(file): variable \(name) has no values")
                    variables[name] = variable["multi"] as? Bool == true ? values : Array(values.prefix(1))
                    queries += 1
                }
                for (title, sql) in GrafanaSQL.queries(in: dashboard) where !title.hasPrefix("variable ") {
                    let substituted = try GrafanaSQL.substitute(sql, variables: variables, multi: multi)
                    let rows: PostgresRows
                    do {
                        rows = try await services.database.pool.query(PostgresQuery(unsafeSQL: substituted))
                    } catch {
                        Issue.record("\(file) / \(title): \(error)\n\(substituted)")
                        continue
                    }
                    #expect(rows.count > 0, "\(file) / \(title) returned no rows:\n\(substituted)")
                    queries += 1
                }
            }
            #expect(queries >= 25, "every report panel, variable and annotation")
            // Local times stored as UTC, in a range that ends at now+14h: the newest day row
            // of an app east of UTC (Tokyo), today's there, is inside it whatever the hour.
            // (Its newest, not the date today: in the minutes after Tokyo's midnight the demo
            // may have no traffic yet on the new day, so no row for it.)
            let newest = try await services.database.pool.query(
                "SELECT max(period) FROM report_series WHERE app_id = 'demo-puzzle' AND grain = 'day' AND network = '*'"
            )[0].decode(0, as: String.self)
            let tokyoToday = ReportQuery.formatDate(try ReportQuery.today(in: "Asia/Tokyo", now: Date()))
            let tokyoYesterday = ReportQuery.formatDate(try ReportQuery.today(in: "Asia/Tokyo", now: Date()) - 1)
            #expect(newest == tokyoToday || newest == tokyoYesterday, "the newest day row (\(newest)) is Tokyo's today (\(tokyoToday))")
            let today = try await services.database.pool.query(PostgresQuery(unsafeSQL: try GrafanaSQL.substitute(
                "SELECT period FROM report_series WHERE app_id = 'demo-puzzle' AND grain = 'day' AND network = '*' AND $__timeFilter(local_start) AND period = '\(newest)'",
                variables: [:], multi: []
            )))
            #expect(today.count == 1, "the newest day in Tokyo (\(newest)) is in the dashboards' range")
            // The refresh is recorded; an app whose refresh fails says why and does not stop the others.
            let recorded = try await services.database.pool.query("SELECT count(*) FROM report_series_refresh WHERE error IS NULL AND rows > 0")[0].decode(0, as: Int.self)
            #expect(recorded == DemoLoader.appIDs.count)
        }
    }

    @Test("the compose file, the Dockerfile and Grafana's provisioning agree with the repository; a missing mount is caught")
    func composeFiles() async throws {
        let script = Self.repository.appendingPathComponent("scripts/compose_check.py").path
        let (status, output) = try await runProcess(["python3", script, Self.repository.path])
        #expect(status == 0, "\(output)")
        #expect(output.contains("checked service citus-coordinator (profile citus)") && output.contains("checked Dockerfile"), "\(output)")

        // The same check on a copy that lost the PostgreSQL init folder and whose Dockerfile builds another way.
        let copy = FileManager.default.temporaryDirectory.appendingPathComponent("adtally-compose-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: copy) }
        try FileManager.default.createDirectory(at: copy, withIntermediateDirectories: true)
        for item in ["docker-compose.yml", "Dockerfile", "Makefile", "Package.swift", "Dashboards", "deploy", "scripts", "Sources", "Tests", "Migrations"] {
            try FileManager.default.copyItem(at: Self.repository.appendingPathComponent(item), to: copy.appendingPathComponent(item))
        }
        try FileManager.default.removeItem(at: copy.appendingPathComponent("deploy/postgres/init"))
        let dockerfile = try String(contentsOf: copy.appendingPathComponent("Dockerfile"), encoding: .utf8)
        try dockerfile.replacingOccurrences(of: "ADTALLY_DEPS=build make build-release", with: "swift build -c release")
            .write(to: copy.appendingPathComponent("Dockerfile"), atomically: true, encoding: .utf8)
        let (brokenStatus, brokenOutput) = try await runProcess(["python3", script, copy.path])
        #expect(brokenStatus == 1)
        #expect(brokenOutput.contains("mounts ./deploy/postgres/init, which does not exist"), "\(brokenOutput)")
        #expect(brokenOutput.contains("does not build with `make build-release`"), "\(brokenOutput)")
    }
}

/// Grafana's side of a panel query, as its PostgreSQL datasource does it.
enum GrafanaSQL {
    struct UnknownMacro: Error, CustomStringConvertible { var description: String }

    /// Every SQL a dashboard runs: panel targets, query variables and annotations, by title.
    static func queries(in dashboard: [String: Any]) -> [(String, String)] {
        var found: [(String, String)] = []
        for panel in dashboard["panels"] as? [[String: Any]] ?? [] {
            for target in panel["targets"] as? [[String: Any]] ?? [] {
                if let sql = target["rawSql"] as? String { found.append((panel["title"] as? String ?? "?", sql)) }
            }
        }
        for variable in (dashboard["templating"] as? [String: Any])?["list"] as? [[String: Any]] ?? [] {
            if let sql = variable["query"] as? String { found.append(("variable " + (variable["name"] as? String ?? "?"), sql)) }
        }
        for annotation in (dashboard["annotations"] as? [String: Any])?["list"] as? [[String: Any]] ?? [] {
            if let sql = (annotation["target"] as? [String: Any])?["rawSql"] as? String { found.append(("annotation " + (annotation["name"] as? String ?? "?"), sql)) }
        }
        return found
    }

    /// Substitutes the macros of Grafana's PostgreSQL datasource over the dashboards'
    /// range, now-28d to now+14h (as Grafana 11 expands them), and template variables:
    /// a single value as it is, several quoted and comma-separated, as Grafana interpolates SQL.
    static func substitute(_ sql: String, variables: [String: [String]], multi: Set<String>, now: Date = Date()) throws -> String {
        func isMulti(_ name: String) -> Bool { multi.contains(name) }
        let formatter = ISO8601DateFormatter()
        let from = formatter.string(from: now.addingTimeInterval(-28 * 86_400)), to = formatter.string(from: now.addingTimeInterval(14 * 3600))
        var text = sql
        func replaceCalls(_ name: String, _ body: ([String]) -> String) {
            while let range = text.range(of: "$__\(name)(") {
                let close = text[range.upperBound...].firstIndex(of: ")")!
                let arguments = text[range.upperBound..<close].split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
                text.replaceSubrange(range.lowerBound...close, with: body(arguments))
            }
        }
        replaceCalls("timeFilter") { "\($0[0]) BETWEEN '\(from)' AND '\(to)'" }
        replaceCalls("timeGroupAlias") { "floor(extract(epoch from \($0[0]))/86400)*86400 AS \"time\"" }
        replaceCalls("timeGroup") { "floor(extract(epoch from \($0[0]))/86400)*86400" }
        replaceCalls("unixEpochFilter") { "\($0[0]) >= \(Int(now.timeIntervalSince1970) - 28 * 86_400) AND \($0[0]) <= \(Int(now.timeIntervalSince1970) + 14 * 3600)" }
        text = text.replacingOccurrences(of: "$__timeFrom()", with: "'\(from)'").replacingOccurrences(of: "$__timeTo()", with: "'\(to)'")
        if let unknown = text.range(of: "$__") { throw UnknownMacro(description: "a macro this test does not know: \(text[unknown.lowerBound...].prefix(30))") }
        for (name, values) in variables.sorted(by: { $0.key.count > $1.key.count }) {
            let value = isMulti(name) ? values.map { "'\($0)'" }.joined(separator: ",") : values[0]
            text = text.replacingOccurrences(of: "${\(name)}", with: value).replacingOccurrences(of: "$\(name)", with: value)
        }
        if text.contains("$") { throw UnknownMacro(description: "an unsubstituted variable in: \(text)") }
        return text
    }
}
