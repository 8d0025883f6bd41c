import AdTallyCore
import Foundation
import Testing

/// The readers of the networks' own reports (issue 27, DESIGN §11), on small
/// real-shaped fixtures (Tests/AdTallyTests/Fixtures/networks) and on hostile files.
@Suite("Network reports: each network's shape read, hostile files refused naming the line")
struct NetworkReportTests {
    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Fixtures/networks")

    static func fixture(_ name: String) throws -> [UInt8] {
        Array(try Data(contentsOf: fixtures.appendingPathComponent(name)))
    }

    static func day(_ text: String) -> Int { ReportQuery.parseDate(text)! }

    static func refusal(_ text: String, _ source: NetworkReportSource, zone: String? = nil) -> FieldError? {
        do {
            _ = try NetworkReport.parse(Array(text.utf8), source: source, zone: zone)
            return nil
        } catch {
            return error
        }
    }

    @Test("AdMob's network report: header zone and currency, YYYYMMDD dates, integerValue and microsValue, the footer")
    func admobNetworkReport() throws {
        let report = try NetworkReport.parse(try Self.fixture("admob-network.json"), source: .admob)
        #expect(report.zone == "America/Los_Angeles")
        #expect(report.firstDay == Self.day("2026-10-31") && report.lastDay == Self.day("2026-11-01"))
        #expect(!report.isDelayed && report.warnings.isEmpty)
        #expect(report.lines == [
            NetworkReportLine(position: "row 1", day: Self.day("2026-10-31"), app: "ca-app-pub-1234567890123456~1111111111", network: "admob",
                              format: .banner, country: "US", impressions: 30, clicks: 0, revenueMicros: 0, currency: "USD"),
            NetworkReportLine(position: "row 2", day: Self.day("2026-11-01"), app: "ca-app-pub-1234567890123456~1111111111", network: "admob",
                              format: .banner, country: "US", impressions: 100, clicks: 2, revenueMicros: 600_000, currency: "USD"),
        ])
    }

    @Test("a header with half a date range states none: the report's days are its lines' (found by make fuzz)")
    func halfARange() throws {
        let admob = String(decoding: try Self.fixture("admob-network.json"), as: UTF8.self)
        let half = admob.replacingOccurrences(of: #", "endDate": {"year": 2026, "month": 11, "day": 1}"#, with: "")
            .replacingOccurrences(of: #""startDate": {"year": 2026, "month": 10, "day": 31}"#, with: #""startDate": {"year": 2026, "month": 11, "day": 1}"#)
        #expect(half != admob)
        let report = try NetworkReport.parse(Array(half.utf8), source: .admob)
        #expect(!report.hasRange)
        #expect(report.firstDay == Self.day("2026-10-31") && report.lastDay == Self.day("2026-11-01"))
    }

    @Test("AdMob's mediation report: ad sources by label, APP_OPEN as interstitial, ZZ as unknown, DATA_DELAYED kept; no header zone is Los Angeles")
    func admobMediationReport() throws {
        let report = try NetworkReport.parse(try Self.fixture("admob-mediation.json"), source: .admob)
        #expect(report.zone == "America/Los_Angeles")
        #expect(report.isDelayed)
        #expect(report.warnings.first?.hasPrefix("DATA_DELAYED: There is an unusual delay") == true)
        #expect(report.lines.map(\.network) == ["AdMob Network", "Meta Audience Network (bidding)"])
        #expect(report.lines.map(\.format) == [.rewarded, .interstitial])
        #expect(report.lines.map(\.country) == ["DE", nil])
        #expect(report.lines.map(\.currency) == ["EUR", "EUR"])
        #expect(report.lines.map(\.revenueMicros) == [14_250_000, 230_000])
        // Micros up to 10^12 units: a JPY or IDR account's rows are large numbers.
        let large = String(decoding: try Self.fixture("admob-mediation.json"), as: UTF8.self).replacingOccurrences(of: "\"14250000\"", with: "\"2000000000000000\"")
        #expect(try NetworkReport.parse(Array(large.utf8), source: .admob).lines.first?.revenueMicros == 2_000_000_000_000_000)
        #expect(NetworkNames.adTally("AdMob Network", source: .admob) == "admob")
        #expect(NetworkNames.adTally("Meta Audience Network (bidding)", source: .admob) == "meta")
    }

    @Test("MAX's report as CSV and as JSON: package names per platform, MAX's format names, lower-case countries, revenue rounded half up to micros")
    func maxReport() throws {
        let csv = try NetworkReport.parse(try Self.fixture("max-report.csv"), source: .max)
        #expect(csv.zone == "UTC")
        #expect(csv.lines.map(\.app) == ["android/com.example.game", "ios/com.example.game"])
        #expect(csv.lines.map(\.format) == [.interstitial, .banner])
        #expect(csv.lines.map(\.country) == ["US", "GB"])
        #expect(csv.lines.map(\.impressions) == [10, 800])
        #expect(csv.lines.map(\.clicks) == [nil, nil])
        // 0.0123456789 USD: 12,345.6789 micros, half up.
        #expect(csv.lines.map(\.revenueMicros) == [200_000, 12_346])
        #expect(csv.lines.map { NetworkNames.adTally($0.network, source: .max) } == ["applovin", "meta"])
        let json = try NetworkReport.parse(try Self.fixture("max-report.json"), source: .max)
        #expect(json.lines.map(\.impressions) == [8])
        #expect(json.lines.map(\.revenueMicros) == [160_000])
        #expect(json.lines.first?.position == "results[0]")
    }

    @Test("LevelPlay's report, flat and nested: offerwall left out and counted, exponents and long decimals read exactly")
    func levelplayReport() throws {
        let report = try NetworkReport.parse(try Self.fixture("levelplay.json"), source: .levelplay)
        #expect(report.zone == "UTC")
        #expect(report.leftOut == ["offerwall": 1])
        #expect(report.lines.map(\.network) == ["ironSource", "UnityAds", "AdMob"])
        #expect(report.lines.map(\.format) == [.rewarded, .interstitial, .interstitial])
        // 18.1234565 rounds half up to 18.123457; 2.5e-1 is 0.25.
        #expect(report.lines.map(\.revenueMicros) == [18_123_457, 250_000, 0])
        #expect(report.lines.map(\.clicks) == [15, 4, 0])
        #expect(report.lines.map(\.country) == ["US", "JP", nil])
        #expect(report.lines.map(\.position) == ["[0]", "[2].data[0]", "[2].data[1]"])
        #expect(report.lines.map { NetworkNames.adTally($0.network, source: .levelplay) } == ["ironsource", "unity", "admob"])
    }

    @Test("the networks' dashboard exports (what most publishers download): AdMob's, MAX's and LevelPlay's CSV, by their column names, with country names, grouped thousands, currency signs and the header's currency; the totals line left out and counted")
    func dashboardExports() throws {
        let admob = try NetworkReport.parse(try Self.fixture("admob-export.csv"), source: .admob)
        #expect(admob.zone == "America/Los_Angeles")
        #expect(admob.leftOut == ["totals line": 1])
        #expect(admob.lines.map(\.day) == [Self.day("2026-11-01"), Self.day("2026-11-01"), Self.day("2026-11-02")])
        #expect(admob.lines.map(\.app) == ["Word Game (Android)", "Word Game (Android)", "Word Game (Android)"])
        #expect(admob.lines.map(\.network) == ["admob", "admob", "admob"])
        #expect(admob.lines.map(\.format) == [.banner, .interstitial, .rewarded])
        #expect(admob.lines.map(\.country) == ["US", "TR", nil])
        #expect(admob.lines.map(\.impressions) == [1_027_080, 2_400, 100])
        #expect(admob.lines.map(\.clicks) == [5_135, 24, 0])
        #expect(admob.lines.map(\.revenueMicros) == [1_234_560_000, 12_300_000, 50_000])
        #expect(admob.lines.map(\.currency) == ["USD", "USD", "USD"])
        // The account's zone when it is not Los Angeles, as the API's import takes it.
        #expect(try NetworkReport.parse(try Self.fixture("admob-export.csv"), source: .admob, zone: "Asia/Tokyo").zone == "Asia/Tokyo")
        let euros = String(decoding: try Self.fixture("admob-export.csv"), as: UTF8.self).replacingOccurrences(of: "Estimated earnings (USD)", with: "Estimated earnings (EUR)")
        #expect(try NetworkReport.parse(Array(euros.utf8), source: .admob).lines.map(\.currency) == ["EUR", "EUR", "EUR"])

        let max = try NetworkReport.parse(try Self.fixture("max-export.csv"), source: .max)
        #expect(max.zone == "UTC" && max.leftOut == ["totals line": 1])
        #expect(max.lines.map(\.app) == ["android/com.example.game", "ios/com.example.game"])
        #expect(max.lines.map(\.format) == [.banner, .rewarded])
        #expect(max.lines.map(\.impressions) == [12_000, 300])
        #expect(max.lines.map(\.revenueMicros) == [24_500_000, 6_100_000])
        #expect(max.lines.map(\.currency) == ["USD", "USD"])
        #expect(max.lines.map { NetworkNames.adTally($0.network, source: .max) } == ["applovin", "meta"])

        let levelplay = try NetworkReport.parse(try Self.fixture("levelplay-export.csv"), source: .levelplay)
        #expect(levelplay.zone == "UTC" && levelplay.leftOut == ["offerwall": 1])
        #expect(levelplay.lines.map(\.app) == ["1a2b3c4d5", "1a2b3c4d5"])
        #expect(levelplay.lines.map(\.format) == [.rewarded, .interstitial])
        #expect(levelplay.lines.map(\.country) == ["US", "KR"])
        #expect(levelplay.lines.map(\.clicks) == [30, 12])
        #expect(levelplay.lines.map(\.revenueMicros) == [18_750_000, 4_000_000])
        #expect(levelplay.lines.map { NetworkNames.adTally($0.network, source: .levelplay) } == ["ironsource", "unity"])
    }

    @Test("a dashboard export AdTally cannot read is refused naming the header it saw and what it takes; a decimal comma, a slashed date, an unknown country name and an amount without a currency are refused by name")
    func dashboardExportsRefused() throws {
        // A report with no earnings column: the header seen and the shapes taken are named.
        let noRevenue = Self.refusal("Date,App,Format,Impressions,Clicks\n2026-11-01,Game,Banner,10,1\n", .admob)
        #expect(noRevenue?.field == "header", "\(String(describing: noRevenue))")
        #expect(noRevenue?.rule.contains("has no revenue column (a header named estimatedearnings") == true)
        #expect(noRevenue?.rule.contains("it reads \"Date,App,Format,Impressions,Clicks\"") == true)
        #expect(noRevenue?.rule.contains(NetworkReportSource.admob.expectedShape) == true)
        let header = "Date,App,Format,Country,Impressions,Estimated earnings (USD)\n"
        #expect(Self.refusal(header + "2026-11-01,Game,Banner,US,10,\"0,25\"\n", .admob)?.rule.contains("decimal comma") == true)
        #expect(Self.refusal(header + "2026-11-01,Game,Banner,US,10,\"0,125\"\n", .admob)?.rule.contains("decimal comma") == true)
        // An app whose name starts with "Total" is an app; a totals line has no day.
        let battle = try NetworkReport.parse(Array(("App,Date,Format,Country,Impressions,Estimated earnings (USD)\nTotal Battle,2026-11-01,Banner,US,10,0.25\nTotal,,,,10,0.25\n").utf8), source: .admob)
        #expect(battle.lines.map(\.app) == ["Total Battle"] && battle.leftOut == ["totals line": 1])
        // An AdMob export given as the generic CSV: the header it read, and the source to use.
        let generic = Self.refusal(String(decoding: try Self.fixture("admob-export.csv"), as: UTF8.self), .csv)
        #expect(generic?.field == "header" && generic?.rule.contains("it reads \"Date,App,Ad unit") == true && generic?.rule.contains("--source admob") == true, "\(String(describing: generic))")
        #expect(Self.refusal(header + "11/01/2026,Game,Banner,US,10,0.25\n", .admob)?.rule.contains("month-first or day-first") == true)
        #expect(Self.refusal(header + "2026-11-01,Game,Banner,Atlantis,10,0.25\n", .admob)?.field == "line 2: country")
        #expect(Self.refusal(header + "2026-11-01,Game,Banner,US,\"1,23\",0.25\n", .admob)?.field == "line 2: impressions")
        let noCurrency = "Date,App,Format,Country,Impressions,Estimated earnings\n2026-11-01,Game,Banner,US,10,0.25\n"
        #expect(Self.refusal(noCurrency, .admob)?.rule.contains("names no currency") == true)
        #expect(try NetworkReport.parse(Array(noCurrency.replacingOccurrences(of: ",0.25", with: ",€0.25").utf8), source: .admob).lines.first?.currency == "EUR")
        // A LevelPlay export without an ad source breakdown cannot be compared by network.
        let noSource = Self.refusal("Date,App Key,Ad Unit,Impressions,Revenue ($)\n2026-11-01,abc,Banner,10,0.5\n", .levelplay)
        #expect(noSource?.field == "header" && noSource?.rule.contains("has no network column") == true, "\(String(describing: noSource))")
    }

    @Test("the generic CSV: its timezone column, empty clicks as none, any currency")
    func genericCSV() throws {
        let report = try NetworkReport.parse(try Self.fixture("generic.csv"), source: .csv)
        #expect(report.zone == "Asia/Tokyo")
        #expect(report.lines.map(\.clicks) == [3, nil])
        #expect(report.lines.map(\.revenueMicros) == [120_500_000, 1_000_000])
        #expect(report.lines.map(\.currency) == ["JPY", "JPY"])
        #expect(Self.refusal(String(decoding: try Self.fixture("generic.csv"), as: UTF8.self), .csv, zone: "UTC")?.field == "timezone")
    }

    @Test("files a publisher saves by mistake are refused by name: a header alone, another source's file, UTF-16, semicolons or tabs, a day after tomorrow; a UTF-8 BOM is read past")
    func publishersMistakes() throws {
        let maxHeader = "day,application,package_name,platform,network,ad_format,country,impressions,estimated_revenue"
        // A header alone, or any one-line file, recognised nothing: refused, naming what was expected and what was seen.
        for (text, source) in [(maxHeader + "\n", NetworkReportSource.max), ("[]", .levelplay), ("date,app,network,format,country,impressions,clicks,revenue,currency\n", .csv)] {
            let error = Self.refusal(text, source)
            #expect(error?.field == "file" && error?.rule.contains("has no line of \(source.expectedShape)") == true, "\(text): \(String(describing: error))")
        }
        #expect(Self.refusal("[]", .levelplay)?.rule.hasSuffix("it begins \"[]\"") == true)
        // A CSV whose first line is no header of the source's: the header seen, the column missing, the shapes taken.
        let hello = Self.refusal("hello world\n", .max)
        #expect(hello?.field == "header" && hello?.rule.contains("it reads \"hello world\"") == true && hello?.rule.contains(NetworkReportSource.max.expectedShape) == true, "\(String(describing: hello))")
        // MAX's JSON saved with a BOM is MAX's JSON.
        let json = #"{"code": 200, "results": [{"day": "2026-11-01", "package_name": "com.example.game", "platform": "android", "network": "APPLOVIN_NETWORK", "ad_format": "BANNER", "country": "us", "impressions": "10", "estimated_revenue": "0.5"}]}"#
        let bom = try NetworkReport.parse([0xEF, 0xBB, 0xBF] + Array(json.utf8), source: .max)
        #expect(bom.lines.count == 1 && bom.lines[0].impressions == 10)
        // UTF-16, with or without its byte order mark.
        let utf16 = Array(maxHeader.utf16).flatMap { [UInt8($0 & 0xFF), UInt8($0 >> 8)] }
        for bytes in [[0xFF, 0xFE] + utf16, utf16] {
            #expect(throws: FieldError.self) { try NetworkReport.parse(bytes, source: .max) }
            #expect((try? NetworkReport.parse(bytes, source: .max)) == nil)
            do { _ = try NetworkReport.parse(bytes, source: .max) } catch { #expect(error.rule.contains("UTF-16")) }
        }
        // Europe's semicolons and "Unicode Text"'s tabs.
        for separator in [";", "\t"] {
            let text = maxHeader.replacingOccurrences(of: ",", with: separator) + "\n2026-11-01" + String(repeating: separator + "x", count: 8) + "\n"
            let error = Self.refusal(text, .max)
            #expect(error?.field == "header" && error?.rule.contains(separator == ";" ? "separated by semicolons" : "separated by tabs") == true, "\(String(describing: error))")
        }
        // A MAX export pasted twice: refused naming both lines; the same keys with other figures (two ad units) are summed later.
        let line = "\n2026-11-01,Game,com.example.game,android,APPLOVIN_NETWORK,BANNER,us,10,0.5"
        let twice = Self.refusal(maxHeader + line + "\n2026-11-01,Game,com.example.game,android,APPLOVIN_NETWORK,BANNER,de,3,0.1" + line + "\n", .max)
        #expect(twice?.field == "line 4" && twice?.rule.hasPrefix("repeats line 2 byte for byte") == true, "\(String(describing: twice))")
        #expect(try NetworkReport.parse(Array((maxHeader + line + line.replacingOccurrences(of: ",10,", with: ",11,") + "\n").utf8), source: .max).lines.count == 2)
        // Two ad units with the same figures (a column AdTally does not read) are two lines, summed later.
        let units = maxHeader + ",ad_unit" + line + ",unit-a" + line + ",unit-b\n"
        #expect(try NetworkReport.parse(Array(units.utf8), source: .max).lines.count == 2)
        // 2099 for 2019: after tomorrow in the file's zone, refused naming the line.
        let future = maxHeader + "\n2099-11-01,Game,com.example.game,android,APPLOVIN_NETWORK,BANNER,us,10,0.5\n"
        let late = Self.refusal(future, .max)
        #expect(late?.field == "line 2: day" && late?.rule.contains("2099-11-01, after tomorrow in UTC") == true, "\(String(describing: late))")
        // Tomorrow itself is a day that has begun somewhere: taken.
        let now = Date(timeIntervalSince1970: 1_800_000_000)
        let tomorrow = ReportQuery.formatDate(Int(1_800_000_000 / 86_400) + 1)
        #expect(try NetworkReport.parse(Array((maxHeader + "\n\(tomorrow),Game,com.example.game,android,APPLOVIN_NETWORK,BANNER,us,10,0.5\n").utf8), source: .max, now: now).lines.count == 1)
    }

    @Test("hostile files are refused whole, naming the line and the rule: wrong columns, huge numbers, formula cells, a truncated stream, too many bytes")
    func hostileFiles() throws {
        let header = "date,app,network,format,country,impressions,clicks,revenue,currency\n"
        #expect(Self.refusal("date,app,network\n2026-11-01,game,admob\n", .csv)?.description.hasPrefix("header: has no format column") == true)
        #expect(Self.refusal(header + "2026-11-01,game,admob,banner,US,10000000000000,0,1,USD\n", .csv)?.field == "line 2: impressions")
        #expect(Self.refusal(header + "2026-11-01,game,admob,banner,US,1,0,1000000000000,USD\n", .csv)?.field == "line 2: revenue")
        #expect(Self.refusal(header + "2026-11-01,game,admob,banner,US,-1,0,1,USD\n", .csv)?.field == "line 2: impressions")
        #expect(Self.refusal(header + "2026-11-01,game,admob,banner,US,1,0,1e400,USD\n", .csv)?.field == "line 2: revenue")
        let formula = Self.refusal(header + "2026-11-01,\"=HYPERLINK(\"\"http://x\"\")\",admob,banner,US,1,0,1,USD\n", .csv)
        #expect(formula?.field == "line 2: app" && formula?.rule.contains("formula") == true)
        #expect(Self.refusal(header + "2026-11-01,game,admob,popup,US,1,0,1,USD\n", .csv)?.field == "line 2: format")
        #expect(Self.refusal(header + "2026-13-01,game,admob,banner,US,1,0,1,USD\n", .csv)?.field == "line 2: date")
        #expect(Self.refusal(header + "2026-11-01,game,admob,banner,Narnia,1,0,1,USD\n", .csv)?.field == "line 2: country")
        #expect(Self.refusal(header + "2026-11-01,game,admob,banner,US,1,0,1,XYZ\n", .csv)?.field == "line 2: currency")
        // MAX: a column missing on a line, an error body.
        #expect(Self.refusal("day,package_name,network,ad_format,country,impressions\n2026-11-01,a,B,INTER,us,1\n", .max)?.rule.hasPrefix("has no revenue column") == true)
        #expect(Self.refusal("day,package_name,network,ad_format,country,impressions,estimated_revenue\n2026-11-01,a,B,INTER,us,1\n", .max)?.field == "line 2: revenue")
        #expect(Self.refusal(#"{"code": 401, "results": []}"#, .max)?.field == "code")
        // AdMob: no footer (a cut stream), a metric of the wrong shape, not JSON at all.
        let admob = String(decoding: try Self.fixture("admob-network.json"), as: UTF8.self)
        let cut = admob.replacingOccurrences(of: ",\n{\n  \"footer\": {\"matchingRowCount\": \"2\"}\n}]", with: "]")
        #expect(cut != admob)
        #expect(Self.refusal(cut, .admob)?.rule.contains("incomplete") == true)
        #expect(Self.refusal(admob.replacingOccurrences(of: "\"integerValue\": \"100\"", with: "\"integerValue\": \"1e30\""), .admob)?.field == "row 2: metricValues.IMPRESSIONS.integerValue")
        #expect(Self.refusal("date,app\n", .admob)?.field == "header")
        #expect(Self.refusal("{\"date\": 1}", .admob)?.field == "file")
        #expect(Self.refusal(admob.replacingOccurrences(of: "20261101", with: "20261102"), .admob)?.field == "row 2: dimensionValues.DATE")
        // A range that ends before it starts (a trap once: found by make fuzz).
        #expect(Self.refusal(admob.replacingOccurrences(of: #""month": 10, "day": 31"#, with: #""month": 11, "day": 30"#), .admob)?.field == "header.dateRange")
        #expect(Self.refusal(#"[{"date": "2026-11-01", "appKey": "k", "adFormat": "rewarded", "adNetwork": {"x": 1}}]"#, .levelplay)?.description == "[0]: adNetwork: must be a string or a number")
        // What a file holds is bounded before it is read whole: lines, a line's length, JSON objects and members.
        let header9 = "date,app,network,format,country,impressions,clicks,revenue,currency\n"
        #expect(Self.refusal(header9 + String(repeating: "x\n", count: NetworkReport.maxLines + 1), .csv)?.rule.contains("more than \(NetworkReport.maxLines) lines") == true)
        #expect(Self.refusal(header9 + String(repeating: ",", count: NetworkReport.maxLineBytes + 1), .csv)?.rule.contains("line longer than") == true)
        #expect(Self.refusal("[" + String(repeating: "{},", count: NetworkReport.maxJSONObjects) + "{}]", .levelplay)?.rule.contains("JSON objects") == true)
        #expect(Self.refusal(#"{"code": 200, "results": [{"# + String(repeating: #""k": 1,"#, count: NetworkReport.maxJSONMembers) + #""z": 1}]}"#, .max)?.rule.contains("members") == true)
        // More bytes than an import takes: refused before a line is read.
        let huge = [UInt8](repeating: 0x20, count: NetworkReport.maxBytes + 1)
        #expect((try? NetworkReport.parse(huge, source: .csv)) == nil)
        do {
            _ = try NetworkReport.parse(huge, source: .csv)
        } catch {
            #expect(error.field == "file" && error.rule.contains("at most"))
        }
    }
}
