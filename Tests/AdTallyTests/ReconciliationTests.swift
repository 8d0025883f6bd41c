import AdTallyApp
import AdTallyCore
@testable import AdTallyHTTP
@testable import AdTallyStorage
import AdTallyTestSupport
import Foundation
import Hummingbird
import HummingbirdTesting
import PostgresKit
import Testing

/// The networks' reports beside AdTally's counts (issue 27, DESIGN §11), against
/// hand-computed figures.
@Suite("Reconciliation: network reports imported, compared day by day in the network's zone", .serialized)
struct ReconciliationTests {
    static func fixture(_ name: String) throws -> [UInt8] { try NetworkReportTests.fixture(name) }

    /// App `game` (UTC, USD) with AdMob banners around Los Angeles's fall-back day
    /// (2026-11-01 is 25 hours long there) and AppLovin interstitials:
    ///
    /// | UTC time            | events                       | LA day     | UTC day    |
    /// |---------------------|------------------------------|------------|------------|
    /// | 2026-10-31 07:30    | admob 10 impressions         | 10-31      | 10-31      |
    /// | 2026-11-01 06:30    | admob 20 impressions         | 10-31      | 11-01      |
    /// | 2026-11-01 12:00    | admob 50 impressions at 0.01, 2 taps | 11-01 | 11-01 |
    /// | 2026-11-02 07:30    | admob 40 impressions         | 11-01 (PST)| 11-02      |
    /// | 2026-11-01 06:30    | applovin 8 impressions at 0.02 | –        | 11-01      |
    ///
    /// AdTally in Los Angeles: 10-31 30 impressions; 11-01 90 impressions, 2 taps, 0.50 USD.
    static func fixture(_ services: AppServices) async throws {
        _ = try await services.appStore.createApp(id: "game", name: nil, timezone: "UTC", currency: "USD")
        var events: [AdEvent] = []
        func add(_ count: Int, _ type: EventType, _ at: String, network: String = "admob", format: AdFormat = .banner, revenue: Int64? = nil) {
            events += (0..<count).map { _ in
                Reports.event(type, at: Reports.micros(at), network: network, format: format) {
                    $0.country = "US"
                    if let revenue { $0.revenueMicros = revenue; $0.currency = "USD" }
                }
            }
        }
        // The app's first event: imports of days before it are refused.
        add(1, .request, "2026-10-01T00:00:00Z")
        add(10, .impression, "2026-10-31T07:30:00Z")
        add(20, .impression, "2026-11-01T06:30:00Z")
        add(50, .impression, "2026-11-01T12:00:00Z", revenue: 10_000)
        add(2, .tap, "2026-11-01T12:00:00Z")
        add(40, .impression, "2026-11-02T07:30:00Z")
        add(8, .impression, "2026-11-01T06:30:00Z", network: "applovin", format: .interstitial, revenue: 20_000)
        // Los Angeles's 11-03: no network report covers it.
        add(5, .impression, "2026-11-03T20:00:00Z")
        try await Reports.store(services, app: "game", events)
        try await services.compactor.compactOnce()
    }

    static func run(_ services: AppServices, _ parameters: [(String, String)]) async throws -> ReconciliationDocument {
        let query = try ReconciliationQuery.parse(parameters, readable: try await services.reports.readableApps(only: nil), isAdmin: true)
        return try await ReconciliationEngine(reports: services.reports).run(query)
    }

    static func importFile(_ store: NetworkReportStore, _ name: String, _ source: NetworkReportSource) async throws -> NetworkReportStore.ImportResult {
        let bytes = try fixture(name)
        return try await store.importReport(try NetworkReport.parse(bytes, source: source), fileSHA256: SHA256.hex(bytes), via: "cli")
    }

    @Test("an import byte for byte identical to an earlier one of its source is stored again and says which")
    func identicalReimport() async throws {
        try await withServices(flags: Reports.flags) { services in
            try await Self.fixture(services)
            let store = NetworkReportStore(pool: services.database.pool)
            let first = try await Self.importFile(store, "generic.csv", .csv)
            #expect(first.identicalTo == nil)
            let again = try await Self.importFile(store, "generic.csv", .csv)
            #expect(again.identicalTo == first.importID && again.replaced > 0, "\(again)")
        }
    }

    @Test("an import in a currency no FX rate converts into the app's says so, naming app, currency and days; the reconciliation's 422 then gives only advice that holds")
    func importWithoutFXRates() async throws {
        try await withServices(flags: Reports.flags) { services in
            try await Self.fixture(services)
            let store = NetworkReportStore(pool: services.database.pool)
            let file = "date,app,network,format,country,impressions,clicks,revenue,currency,timezone\n2026-11-01,game,unity,rewarded,US,100,3,12.5,CHF,UTC\n2026-11-02,game,unity,rewarded,US,90,1,11,CHF,UTC\n"
            // Days before the app's first event (2026-10-01) are refused, naming the line.
            let early = "date,app,network,format,country,impressions,clicks,revenue,currency,timezone\n2026-11-01,game,unity,rewarded,US,1,0,1,USD,UTC\n1900-09-30,game,unity,rewarded,US,1,0,1,USD,UTC\n"
            await #expect(throws: FieldError("line 3: day", "is 1900-09-30, before game's first event in AdTally (2026-10-01 in UTC): there is nothing to compare it with")) {
                _ = try await store.importReport(try NetworkReport.parse(Array(early.utf8), source: .csv), fileSHA256: SHA256.hex(Array(early.utf8)), via: "cli")
            }
            // A pull's restatement window may reach before the first event: those lines are left out and counted, not the pull refused.
            let pulled = try await store.importReport(try NetworkReport.parse(Array(early.utf8), source: .csv), fileSHA256: SHA256.hex(Array(early.utf8)), via: "pull")
            #expect(pulled.rows == 1 && pulled.leftOut == ["before the app's first event": 1], "\(pulled)")
            // An API's answer for days without traffic may be a header alone.
            let quiet = Array("day,application,package_name,platform,network,ad_format,country,impressions,estimated_revenue\n".utf8)
            #expect(try NetworkReport.parse(quiet, source: .max, fromAPI: true).lines.isEmpty)
            let result = try await store.importReport(try NetworkReport.parse(Array(file.utf8), source: .csv), fileSHA256: SHA256.hex(Array(file.utf8)), via: "cli")
            #expect(result.fxMissing == [
                "game: no FX rate converts CHF to USD on 2 days from 2026-11-01 to 2026-11-02; its reconciliation in USD over them is refused (422) until the rates are imported (adtally fx import, POST /v1/fx)",
            ], "\(result.fxMissing)")
            let refused = await #expect(throws: ReportCurrencyError.self) {
                _ = try await Self.run(services, [("apps", "game"), ("from", "2026-11-01"), ("to", "2026-11-02"), ("dimensions", "date,network")])
            }
            #expect(refused?.description.contains("or ask for currency=CHF if every amount of the report is in CHF") == true, "\(String(describing: refused))")
        }
    }

    @Test("the map command an unknown app's or network's refusal suggests quotes the file's name for a POSIX shell: a name with ' and ; is one word, never code")
    func suggestedCommandIsQuoted() async throws {
        try await withServices(flags: Reports.flags) { services in
            let store = NetworkReportStore(pool: services.database.pool)
            let name = "it's; touch /tmp/adtally-pwned-$(id -u)"
            let file = "date,app,network,format,country,impressions,clicks,revenue,currency,timezone\n2026-11-01,\"\(name)\",unity,rewarded,JP,100,3,120.5,JPY,UTC\n"
            let error = await #expect(throws: FieldError.self) {
                _ = try await store.importReport(try NetworkReport.parse(Array(file.utf8), source: .csv), fileSHA256: SHA256.hex(Array(file.utf8)), via: "cli")
            }
            let rule = try #require(error?.rule)
            let word = try #require(rule.range(of: "--app ").map { String(rule[$0.upperBound...]) }?.components(separatedBy: " --to APP").first, "\(rule)")
            let echoed = try await runProcess(["sh", "-c", "printf '%s' " + word])
            #expect(echoed.status == 0 && echoed.output == name, "\(word) → \(echoed.output)")
            #expect(!FileManager.default.fileExists(atPath: "/tmp/adtally-pwned-\(getuid())"))
        }
    }

    @Test("AdMob's Los Angeles days against AdTally's over the same instants, across the fall-back day; discrepancy and flags as computed by hand")
    func losAngelesDays() async throws {
        try await withServices(flags: Reports.flags) { services in
            try await Self.fixture(services)
            let store = NetworkReportStore(pool: services.database.pool)
            // Not mapped yet: refused naming the row, nothing stored.
            await #expect(throws: FieldError.self) { _ = try await Self.importFile(store, "admob-network.json", .admob) }
            #expect(try await services.database.pool.query("SELECT count(*) FROM network_imports").first!.decode(0, as: Int.self) == 0)
            try await store.setMappings([.init(source: .admob, kind: .app, external: "ca-app-pub-1234567890123456~1111111111", target: "game")])
            let result = try await Self.importFile(store, "admob-network.json", .admob)
            #expect(result.apps == ["game"] && result.networks == ["admob"] && result.rows == 2 && result.replaced == 0)

            let document = try await Self.run(services, [("apps", "game"), ("from", "2026-10-31"), ("to", "2026-11-01"), ("dimensions", "date,network")])
            #expect(document.networks.map(\.zone) == ["America/Los_Angeles"])
            let rows = Dictionary(uniqueKeysWithValues: document.rows.map { ($0.dimensions[0]!, $0) })
            // 10-31: 30 and 30, no earnings on either side.
            #expect(rows["2026-10-31"]?.ours == ReconciliationSide(impressions: 30, clicks: 0, revenueMicros: 0))
            #expect(rows["2026-10-31"]?.impressionsPct == 0 && rows["2026-10-31"]?.revenuePct == nil)
            #expect(rows["2026-10-31"]?.isFlagged == false)
            // 11-01 (25 hours): ours 90 impressions, 2 taps, 0.50; AdMob 100, 2, 0.60.
            let day = try #require(rows["2026-11-01"])
            #expect(day.ours == ReconciliationSide(impressions: 90, clicks: 2, revenueMicros: 500_000))
            #expect(day.theirs == ReconciliationSide(impressions: 100, clicks: 2, revenueMicros: 600_000))
            #expect(day.impressionsPct == 10)  // (1 - 90/100) x 100: at the tolerance, not beyond it
            #expect(day.clicksPct == 0)
            #expect(day.revenuePct == 16.67)  // (1 - 0.50/0.60) x 100
            #expect(day.isFlagged)
            #expect(day.imports == [result.importID])
            #expect(day.isFinal)  // imported 26 days after the day

            // The same network at 20 %: not flagged; AdMob's days, not UTC's: the 20
            // impressions at 06:30 UTC on 11-01 are Los Angeles's 10-31.
            _ = try await store.setSettings(network: "admob", tolerancePct: 20, finalAfterDays: nil)
            let relaxed = try await Self.run(services, [("apps", "game"), ("from", "2026-11-01"), ("to", "2026-11-01"), ("dimensions", "date")])
            #expect(relaxed.rows.count == 1 && relaxed.rows[0].isFlagged == false && relaxed.rows[0].tolerancePct == 20, "\(relaxed.rows)")

            // Only the days AdMob's report covers (10-31 and 11-01, its header's range) are
            // compared: 30 + 90 = 120 against 130, not the 5 impressions of 11-03.
            let total = try await Self.run(services, [("apps", "game"), ("from", "2026-10-25"), ("to", "2026-11-10"), ("dimensions", "network")])
            #expect(total.rows.count == 1 && total.rows[0].ours.impressions == 120 && total.rows[0].theirs?.impressions == 130, "\(total.rows)")
            #expect(total.remarks.contains { $0.contains("compared only for the apps, networks and days") })
            // A date filter.
            let filtered = try await Self.run(services, [("apps", "game"), ("from", "2026-10-25"), ("to", "2026-11-10"), ("dimensions", "date"), ("date", "2026-11-01")])
            #expect(filtered.rows.map(\.dimensions) == [["2026-11-01"]])
            // CSV: a strict reader's view.
            let csv = try #require(Reports.strictCSV(String(decoding: document.csv(), as: UTF8.self)))
            #expect(csv[0] == ["date", "network"] + ReconciliationDocument.metricColumns.map(\.name))
            #expect(csv[2] == ["2026-11-01", "admob", "90", "100", "10", "2", "2", "0", "0.50", "0.60", "16.67", "true", "true", "\(result.importID)"])

            // A stated range covers its days without lines as zeros: AdMob's 11-02..11-03 with a
            // line for 11-02 only; LA's 11-03 had 5 impressions of ours and none of AdMob's.
            let ranged = String(decoding: try Self.fixture("admob-network.json"), as: UTF8.self)
                .replacingOccurrences(of: #""startDate": {"year": 2026, "month": 10, "day": 31}, "endDate": {"year": 2026, "month": 11, "day": 1}"#,
                                      with: #""startDate": {"year": 2026, "month": 11, "day": 2}, "endDate": {"year": 2026, "month": 11, "day": 3}"#)
                .replacingOccurrences(of: "20261031", with: "20261102")
                .replacingOccurrences(of: #"{"value": "20261101"}"#, with: #"{"value": "20261102"}"#)
            let zeros = try NetworkReport.parse(Array(ranged.utf8), source: .admob)
            #expect(zeros.hasRange && Set(zeros.lines.map(\.day)) == [NetworkReportTests.day("2026-11-02")])
            _ = try await store.importReport(zeros, fileSHA256: String(repeating: "e", count: 64), via: "cli")
            let third = try await Self.run(services, [("apps", "game"), ("from", "2026-11-03"), ("to", "2026-11-03"), ("dimensions", "date")])
            #expect(third.rows.count == 1 && third.rows[0].ours.impressions == 5 && third.rows[0].theirs == ReconciliationSide(), "\(third.rows)")
            #expect(third.rows[0].isFlagged)
        }
    }

    @Test("an import names the app x network x days it replaced, the formats those days lose, and the comparisons it ends; a restatement in another zone is refused unless asked, and the engine then compares as the answer said")
    func importSaysWhatItSupersedes() async throws {
        try await withServices(flags: Reports.flags) { services in
            try await Self.fixture(services)
            let store = NetworkReportStore(pool: services.database.pool)
            let header = "date,app,network,format,country,impressions,clicks,revenue,currency,timezone\n"
            func parsed(_ lines: String) throws -> NetworkReport { try NetworkReport.parse(Array((header + lines).utf8), source: .csv) }
            var week = ""
            for day in 1...3 { week += "2026-11-0\(day),game,admob,banner,US,100,1,1.00,USD,UTC\n2026-11-0\(day),game,admob,interstitial,US,10,0,0.50,USD,UTC\n" }
            let first = try await store.importReport(try parsed(week), fileSHA256: String(repeating: "1", count: 64), via: "cli")
            #expect(first.restated.isEmpty && first.comparisonsEnded.isEmpty)

            // One day, banners only: that day is replaced and its interstitials are zero from now on.
            let banners = try await store.importReport(try parsed("2026-11-02,game,admob,banner,US,90,1,0.90,USD,UTC\n"), fileSHA256: String(repeating: "2", count: 64), via: "cli")
            #expect(banners.replaced == 1)
            #expect(banners.restated == [.init(
                app: "game", network: "admob", days: ["2026-11-02"], dayCount: 1, earlierImports: [first.importID], earlierTimezone: nil,
                formatsDropped: [.init(format: "interstitial", dayCount: 1, impressions: 10, revenueMicros: ["USD": 500_000])]
            )])
            #expect(banners.comparisonsEnded.isEmpty)

            // The same source in another zone: refused, naming the zone the figures are in, and nothing stored.
            let losAngeles = try parsed("2026-11-02,game,admob,banner,US,95,1,0.95,USD,America/Los_Angeles\n")
            let imports = try await store.imports().count
            do {
                _ = try await store.importReport(losAngeles, fileSHA256: String(repeating: "3", count: 64), via: "cli")
                Issue.record("a restatement in another zone was taken")
            } catch let error as FieldError {
                #expect(error.field == "timezone" && error.rule.contains("figures are in UTC") && error.rule.contains("--replace-zone"), "\(error)")
            }
            #expect(try await store.imports().count == imports)
            // Asked for: its day is replaced, and the other two UTC days are no longer compared — as the engine then does.
            let moved = try await store.importReport(losAngeles, fileSHA256: String(repeating: "3", count: 64), via: "cli", replaceZone: true)
            #expect(moved.restated.map(\.days) == [["2026-11-02"]] && moved.restated.first?.earlierTimezone == "UTC")
            #expect(moved.comparisonsEnded == [.init(app: "game", network: "admob", source: "csv", timezone: "UTC", days: ["2026-11-01", "2026-11-03"], dayCount: 2)])
            let document = try await Self.run(services, [("apps", "game"), ("from", "2026-11-01"), ("to", "2026-11-03"), ("dimensions", "date,network")])
            #expect(document.rows.filter { $0.dimensions[1] == "admob" && $0.theirs != nil }.map { $0.dimensions[0] } == ["2026-11-02"], "\(document.rows)")

            // Once the zone changed, the source's next import in it is an ordinary one: no
            // --replace-zone, and nothing more ended (the UTC days ended already).
            let next = try await store.importReport(
                try parsed("2026-11-03,game,admob,banner,US,80,1,0.80,USD,America/Los_Angeles\n"), fileSHA256: String(repeating: "4", count: 64), via: "cli"
            )
            #expect(next.comparisonsEnded.isEmpty, "\(next.comparisonsEnded)")
            #expect(next.restated.map(\.days) == [["2026-11-03"]] && next.restated.first?.earlierTimezone == "UTC")

            // Another source for the same app's network (AdMob's own report) ends the csv
            // source's comparisons in Los Angeles, and only those, and says so.
            try await store.setMappings([.init(source: .admob, kind: .app, external: "ca-app-pub-1234567890123456~1111111111", target: "game")])
            let admob = try await Self.importFile(store, "admob-network.json", .admob)
            #expect(admob.comparisonsEnded == [.init(
                app: "game", network: "admob", source: "csv", timezone: "America/Los_Angeles", days: ["2026-11-02..2026-11-03"], dayCount: 2
            )], "\(admob.comparisonsEnded)")
        }
    }

    @Test("a report that states its range covers its days without lines as zeros: a later restatement of such a day replaced that report's zero, not the figures before it")
    func rangedRestatement() async throws {
        try await withServices(flags: Reports.flags) { services in
            try await Self.fixture(services)
            let store = NetworkReportStore(pool: services.database.pool)
            try await store.setMappings([.init(source: .admob, kind: .app, external: "ca-app-pub-1", target: "game")])
            func admob(_ from: Int, _ to: Int, _ rows: [(day: Int, format: String, impressions: Int)]) throws -> NetworkReport {
                func date(_ day: Int) -> String { day == 31 ? #"{"year": 2026, "month": 10, "day": 31}"# : #"{"year": 2026, "month": 11, "day": \#(day)}"# }
                func compact(_ day: Int) -> String { day == 31 ? "20261031" : "2026110" + String(day) }
                let lines = rows.map { row in
                    #"{"row": {"dimensionValues": {"DATE": {"value": "\#(compact(row.day))"}, "APP": {"value": "ca-app-pub-1"}, "FORMAT": {"value": "\#(row.format)"}, "COUNTRY": {"value": "US"}}, "metricValues": {"IMPRESSIONS": {"integerValue": "\#(row.impressions)"}, "ESTIMATED_EARNINGS": {"microsValue": "1000"}}}}"#
                }
                let text = #"[{"header": {"dateRange": {"startDate": \#(date(from)), "endDate": \#(date(to))}, "localizationSettings": {"currencyCode": "USD"}, "reportingTimeZone": "America/Los_Angeles"}}, "#
                    + lines.map { $0 + ", " }.joined() + #"{"footer": {}}]"#
                return try NetworkReport.parse(Array(text.utf8), source: .admob)
            }
            let first = try await store.importReport(try admob(31, 1, [(31, "BANNER", 100), (1, "BANNER", 200), (1, "INTERSTITIAL", 20)]), fileSHA256: String(repeating: "5", count: 64), via: "cli")
            // The same range, nothing on 11-01: that day is a zero now, and the answer says what it lost.
            let second = try await store.importReport(try admob(31, 1, [(31, "BANNER", 90)]), fileSHA256: String(repeating: "6", count: 64), via: "cli")
            #expect(second.restated.map(\.earlierImports) == [[first.importID]])
            #expect(second.restated.first?.formatsDropped.map { "\($0.format) \($0.dayCount) \($0.impressions)" } == ["banner 1 200", "interstitial 1 20"])
            // 11-01 again: it replaces the second report's zero (nothing dropped), not the first's figures.
            let third = try await store.importReport(try admob(1, 1, [(1, "BANNER", 210)]), fileSHA256: String(repeating: "7", count: 64), via: "cli")
            #expect(third.restated.map(\.earlierImports) == [[second.importID]], "\(third.restated)")
            #expect(third.restated.first?.formatsDropped == [])
            #expect(third.restated.first?.days == ["2026-11-01"])
        }
    }

    @Test("a restated day replaces the earlier import for its app, network and day, which stays in the history; finality follows the restatement window exactly")
    func restatementAndFinality() async throws {
        try await withServices(flags: Reports.flags) { services in
            try await Self.fixture(services)
            let store = NetworkReportStore(pool: services.database.pool)
            // MAX writes platform/package: a mapping of the bare package name serves both platforms.
            try await store.setMappings([.init(source: .max, kind: .app, external: "com.example.game", target: "game")])
            let first = try await store.importReport(
                try NetworkReport.parse(try Self.fixture("max-report.csv"), source: .max).withLines { $0.network == "APPLOVIN_NETWORK" },
                fileSHA256: String(repeating: "a", count: 64), via: "api"
            )
            #expect(first.apps.isEmpty == false)
            var document = try await Self.run(services, [("apps", "game"), ("from", "2026-11-01"), ("to", "2026-11-01"), ("dimensions", "date,network,format")])
            var row = try #require(document.rows.first { $0.dimensions[1] == "applovin" })
            // ours 8 at 0.02 = 0.16; MAX 10 and 0.20: 20 % off on both.
            #expect(row.ours.impressions == 8 && row.theirs?.impressions == 10 && row.impressionsPct == 20 && row.revenuePct == 20)
            #expect(row.theirs?.clicks == nil && row.clicksPct == nil)  // MAX reports no clicks
            #expect(row.isFlagged)

            let second = try await Self.importFile(store, "max-report.json", .max)
            #expect(second.replaced == 1)
            document = try await Self.run(services, [("apps", "game"), ("from", "2026-11-01"), ("to", "2026-11-01"), ("dimensions", "date,network,format")])
            row = try #require(document.rows.first { $0.dimensions[1] == "applovin" })
            #expect(row.theirs?.impressions == 8 && row.impressionsPct == 0 && row.revenuePct == 0 && !row.isFlagged)
            #expect(row.imports == [second.importID])
            #expect(document.imports.map(\.id) == [second.importID])
            let history = try await store.imports()
            #expect(history.map(\.importID) == [second.importID, first.importID])
            #expect(history.map(\.current) == [1, 0])

            // Final once imported final_after_days (3) after the day, not a day sooner.
            let pool = services.database.pool
            for (importedAt, isFinal) in [("2026-11-03T23:59:00Z", false), ("2026-11-04T00:00:00Z", true)] {
                try await pool.query("UPDATE network_imports SET imported_at = \(importedAt)::timestamptz WHERE import_id = \(second.importID)")
                document = try await Self.run(services, [("apps", "game"), ("from", "2026-11-01"), ("to", "2026-11-01"), ("dimensions", "date,network")])
                row = try #require(document.rows.first { $0.dimensions[1] == "applovin" })
                #expect(row.isFinal == isFinal, "imported at \(importedAt)")
            }
            _ = try await store.setSettings(network: "applovin", tolerancePct: nil, finalAfterDays: 2)
            document = try await Self.run(services, [("apps", "game"), ("from", "2026-11-01"), ("to", "2026-11-01"), ("dimensions", "date,network")])
            #expect(document.rows.first { $0.dimensions[1] == "applovin" }?.isFinal == true)

            // A newer file of another source (a generic CSV) with lines for 10-25 and 11-05
            // only: it covers those two days, not the days between (no stated range), and
            // the app's applovin is now compared with it, MAX's import left out and said so.
            let csv = """
                date,app,network,format,country,impressions,clicks,revenue,currency
                2026-10-25,game,applovin,interstitial,US,4,0,0.08,USD
                2026-11-05,game,applovin,interstitial,US,6,0,0.12,USD
                """
            _ = try await store.importReport(try NetworkReport.parse(Array(csv.utf8), source: .csv), fileSHA256: String(repeating: "c", count: 64), via: "cli")
            document = try await Self.run(services, [("apps", "game"), ("from", "2026-10-20"), ("to", "2026-11-10"), ("dimensions", "date,network"), ("network", "applovin")])
            #expect(document.rows.map(\.dimensions) == [["2026-10-25", "applovin"], ["2026-11-05", "applovin"]])
            #expect(document.rows.map { $0.theirs?.impressions } == [4, 6] && document.rows.map(\.ours.impressions) == [0, 0])
            #expect(document.remarks.contains { $0.contains("game applovin: compared with its csv report (UTC); imports from max (UTC) are left out") })
        }
    }

    @Test("a delayed report is never final; the network's currency is converted on its day, and a missing rate is a 422 naming it")
    func delayedAndCurrency() async throws {
        try await withTestApp(flags: Reports.flags) { services, client in
            try await Self.fixture(services)
            let admin = try await services.appStore.createKey(app: nil, scope: .admin).secret
            let store = NetworkReportStore(pool: services.database.pool)
            try await store.setMappings([
                .init(source: .admob, kind: .app, external: "ca-app-pub-1234567890123456~1111111111", target: "game"),
            ])
            // Over HTTP: the EUR mediation report with DATA_DELAYED.
            let body = try Self.fixture("admob-mediation.json")
            let imported = try await client.execute(
                uri: "/v1/network-reports?source=admob", method: .post, headers: Reports.headers(admin), body: ByteBuffer(bytes: body)
            ) { response in
                #expect(response.status == .created)
                return try JSONSerialization.jsonObject(with: Data(response.body.readableBytesView)) as? [String: Any] ?? [:]
            }
            #expect(imported["networks"] as? [String] == ["admob", "meta"])
            #expect((imported["warnings"] as? [String])?.first?.hasPrefix("DATA_DELAYED") == true)
            let query = "/v1/reconciliation?apps=game&from=2026-11-20&to=2026-11-20&dimensions=network&currency=USD"
            try await client.execute(uri: query, method: .get, headers: Reports.headers(admin)) { response in
                #expect(response.status == .unprocessableContent)
                #expect(String(buffer: response.body).contains("no FX rate converts EUR to USD on 2026-11-20"))
            }
            _ = try await MoneyStore(pool: services.database.pool).importFX([
                try FXRate.parse(date: "2026-11-20", base: "EUR", currency: "USD", rate: "1.25"),
            ])
            let rows = try await client.execute(uri: query, method: .get, headers: Reports.headers(admin)) { response in
                #expect(response.status == .ok)
                let object = try JSONSerialization.jsonObject(with: Data(response.body.readableBytesView)) as? [String: Any] ?? [:]
                return object["rows"] as? [[Any]] ?? []
            }
            // A foreign-currency day with no rate and no revenue converts to nothing, not to an error.
            let zero = "date,app,network,format,country,impressions,clicks,revenue,currency\n2026-11-25,game,admob,banner,US,5,0,0,EUR\n"
            _ = try await store.importReport(try NetworkReport.parse(Array(zero.utf8), source: .csv), fileSHA256: String(repeating: "d", count: 64), via: "cli")
            let unpriced = try await Self.run(services, [("apps", "game"), ("from", "2026-11-25"), ("to", "2026-11-25"), ("dimensions", "network"), ("currency", "USD")])
            #expect(unpriced.rows.first?.theirs == ReconciliationSide(impressions: 5, clicks: 0, revenueMicros: 0))
            // An unknown country is ZZ on both sides, as in reports.
            let byCountry = try await Self.run(services, [("apps", "game"), ("from", "2026-11-20"), ("to", "2026-11-20"), ("dimensions", "country")])
            #expect(byCountry.rows.map(\.dimensions) == [["DE"], ["ZZ"]])
            // admob: 14.25 EUR x 1.25 = 17.8125 USD, shown to the cent; not final (delayed).
            let admob = try #require(rows.first { $0[0] as? String == "admob" })
            #expect(admob[2] as? Int == 1200 && admob[8] as? String == "17.81" && admob[11] as? Bool == false)
            // Ours has no admob impression that day: 100 % off, flagged.
            #expect(admob[1] as? Int == 0 && admob[3] as? Double == 100 && admob[10] as? Bool == true)
            // The dashboard: a table per network, the flagged day marked.
            let html = try await client.execute(uri: "/dashboard?app=game&from=2026-11-20&to=2026-11-20", method: .get, headers: Reports.headers(admin)) { response in
                #expect(response.status == .ok)
                return String(buffer: response.body)
            }
            #expect(html.contains("data-network=\"admob\"") && html.contains("data-network=\"meta\""))
            #expect(html.contains("<tr class=\"flagged\"><td class=\"text\">2026-11-20</td><td class=\"num\">0</td><td class=\"num\">1200</td>"))
        }
    }

    @Test("imports over HTTP are all or none: a bad line is a 400 naming it, a body over the limit a 413, and nothing is stored; only admin keys import")
    func hostileImports() async throws {
        try await withTestApp(flags: Reports.flags) { services, client in
            _ = try await services.appStore.createApp(id: "game", name: nil, timezone: "UTC", currency: "USD")
            // Its first event: a network's days before it are refused.
            try await Reports.store(services, app: "game", [Reports.event(.request, at: Reports.micros("2026-10-01T00:00:00Z"))])
            let admin = try await services.appStore.createKey(app: nil, scope: .admin).secret
            let read = try await services.appStore.createKey(app: "game", scope: .read).secret
            let good = "date,app,network,format,country,impressions,clicks,revenue,currency\n2026-11-01,game,admob,banner,US,1,0,1,USD\n"
            let bad = good + "2026-11-02,game,admob,banner,US,1,0,=1+1,USD\n"
            try await client.execute(uri: "/v1/network-reports?source=csv", method: .post, headers: Reports.headers(read), body: ByteBuffer(string: good)) { response in
                #expect(response.status == .forbidden)
            }
            try await client.execute(uri: "/v1/network-reports?source=csv", method: .post, headers: Reports.headers(admin), body: ByteBuffer(string: bad)) { response in
                #expect(response.status == .badRequest)
                #expect(String(buffer: response.body).contains("line 3: revenue"))
            }
            // A network name that is no known spelling and that the app's events never used (a typo) is refused.
            try await client.execute(
                uri: "/v1/network-reports?source=csv", method: .post, headers: Reports.headers(admin),
                body: ByteBuffer(string: good.replacingOccurrences(of: ",admob,", with: ",admbo,"))
            ) { response in
                #expect(response.status == .badRequest)
                #expect(String(buffer: response.body).contains("line 2: network"))
            }
            let unknown = ByteBuffer(string: good.replacingOccurrences(of: ",game,", with: ",nobody,"))
            try await client.execute(uri: "/v1/network-reports?source=csv", method: .post, headers: Reports.headers(admin), body: unknown) { response in
                #expect(response.status == .badRequest)
                #expect(String(buffer: response.body).contains("line 2: app"))
            }
            let huge = ByteBuffer(repeating: UInt8(ascii: " "), count: NetworkReport.maxBytes + 1024)
            try await client.execute(uri: "/v1/network-reports?source=csv", method: .post, headers: Reports.headers(admin), body: huge) { response in
                #expect(response.status == .contentTooLarge)
            }
            // The CLI: a 100 MB file is refused by its size, before it is read (a sparse file here).
            let path = FileManager.default.temporaryDirectory.appendingPathComponent("adtally-100mb-\(UUID().uuidString).csv").path
            #expect(FileManager.default.createFile(atPath: path, contents: Data(good.utf8)))
            defer { try? FileManager.default.removeItem(atPath: path) }
            let handle = try #require(FileHandle(forWritingAtPath: path))
            try handle.truncate(atOffset: 100_000_000)
            try handle.close()
            let cli = try await runProcess([adtallyBinary(), "networks", "import", "--source", "csv", "--database-url", "host=/nonexistent", path])
            #expect(cli.status != 0 && cli.output.contains("is 100000000 bytes"), "\(cli.output)")
            #expect(try await services.database.pool.query("SELECT count(*) FROM network_imports").first!.decode(0, as: Int.self) == 0)
            // A name the app's events use needs no mapping: SMAATO_BIDDING is smaato once game's events name it.
            let smaato = #"[{"date": "2026-11-01", "appKey": "game", "adFormat": "banner", "adNetwork": "SMAATO_BIDDING", "countryCode": "US", "impressions": 1, "clicks": 0, "revenue": 0}]"#
            try await client.execute(uri: "/v1/network-reports?source=levelplay", method: .post, headers: Reports.headers(admin), body: ByteBuffer(string: smaato)) { response in
                #expect(response.status == .badRequest)
            }
            try await services.database.pool.query("INSERT INTO app_networks (app_id, network) VALUES ('game', 'smaato')")
            try await client.execute(uri: "/v1/network-reports?source=levelplay", method: .post, headers: Reports.headers(admin), body: ByteBuffer(string: smaato)) { response in
                #expect(response.status == .created)
                #expect(String(buffer: response.body).contains(#""networks":["smaato"]"#))
            }
            // A tolerance above 0 that stores as 0.00 (found by schemathesis) is a 400, not the table's check failing.
            for body in [#"{"tolerance_pct": 5e-324}"#, #"{"tolerance_pct": 100.006}"#, #"{"final_after_days": 61}"#] {
                try await client.execute(uri: "/v1/network-settings/admob", method: .put, headers: Reports.headers(admin), body: ByteBuffer(string: body)) { response in
                    #expect(response.status == .badRequest, "\(body)")
                }
            }
            try await client.execute(uri: "/v1/network-settings/admob", method: .put, headers: Reports.headers(admin), body: ByteBuffer(string: #"{"tolerance_pct": 15.004}"#)) { response in
                #expect(response.status == .ok)
                #expect(String(buffer: response.body).contains(#""tolerance_pct":15"#))
            }
            // A mapping to a second target is ambiguous: refused.
            try await client.execute(
                uri: "/v1/network-mappings", method: .put, headers: Reports.headers(admin),
                body: ByteBuffer(string: #"{"mappings": [{"source": "max", "kind": "app", "external": "com.example.game", "target": "game"}]}"#)
            ) { response in #expect(response.status == .ok) }
            _ = try await services.appStore.createApp(id: "game2", name: nil, timezone: "UTC", currency: "USD")
            try await client.execute(
                uri: "/v1/network-mappings", method: .put, headers: Reports.headers(admin),
                body: ByteBuffer(string: #"{"mappings": [{"source": "max", "kind": "app", "external": " com.example.game ", "target": "game2"}]}"#)
            ) { response in
                #expect(response.status == .badRequest)
                #expect(String(buffer: response.body).contains("mapped to game already"))
            }
        }
    }
}

extension ReconciliationTests {
    @Test("a reconciliation of more rows than a report page (1,000) is whole: 30 days by 40 countries")
    func manyRows() async throws {
        try await withServices(flags: Reports.flags) { services in
            _ = try await services.appStore.createApp(id: "wide", name: nil, timezone: "UTC", currency: "USD")
            let countries = Array(ISOCodes.countries.sorted().prefix(40))
            var events: [AdEvent] = []
            var csv = "date,app,network,format,country,impressions,clicks,revenue,currency\n"
            for day in 1...30 {
                let date = "2026-09-\(day < 10 ? "0" : "")\(day)"
                for country in countries {
                    events.append(Reports.event(.impression, at: Reports.micros("\(date)T12:00:00Z")) { $0.country = country })
                    csv += "\(date),wide,admob,banner,\(country),1,0,0,USD\n"
                }
            }
            try await Reports.store(services, app: "wide", events)
            let store = NetworkReportStore(pool: services.database.pool)
            _ = try await store.importReport(try NetworkReport.parse(Array(csv.utf8), source: .csv), fileSHA256: String(repeating: "b", count: 64), via: "cli")
            let document = try await Self.run(services, [("apps", "wide"), ("from", "2026-09-01"), ("to", "2026-09-30"), ("dimensions", "date,country")])
            #expect(document.rows.count == 1200)
            #expect(document.rows.allSatisfy { $0.ours.impressions == 1 && $0.theirs?.impressions == 1 && !$0.isFlagged })
        }
    }
}

extension ReconciliationTests {
    @Test("one import is read at a time: the gate a second import finds taken (its 429) is free again once the first leaves")
    func oneImportAtATime() {
        let gate = ReconciliationRoutes.ImportGate()
        #expect(gate.enter())
        #expect(!gate.enter())
        gate.leave()
        #expect(gate.enter())
    }
}

extension NetworkReport {
    /// The report with only the lines `keep` keeps.
    func withLines(_ keep: (NetworkReportLine) -> Bool) -> NetworkReport {
        var copy = self
        copy.lines = lines.filter(keep)
        return copy
    }
}
