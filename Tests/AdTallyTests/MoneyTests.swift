import AdTallyApp
import AdTallyCore
@testable import AdTallyStorage
import AdTallyTestSupport
import Foundation
import Hummingbird
import HummingbirdTesting
import PostgresKit
import Testing

/// Rate cards, FX and unique devices (issue 9, DESIGN §3) against hand-computed figures.
@Suite("Money: rate cards, FX, reported and estimated revenue; unique devices", .serialized)
struct MoneyTests {
    /// A page straight from the engine, with its counts in micros.
    static func page(_ services: AppServices, _ parameters: [(String, String)]) async throws -> ReportDocument {
        let readable = try await services.reports.readableApps(only: nil)
        let query = try ReportQuery.parse(parameters, readable: readable, isAdmin: true, acceptsCSV: false)
        return try await services.reports.page(query)
    }

    /// Rows as `[first dimension: counts]`.
    static func byFirst(_ document: ReportDocument) -> [String: ReportCounts] {
        var result: [String: ReportCounts] = [:]
        for row in document.rows { result[row.dimensions[0] ?? "", default: ReportCounts()].add(row.counts) }
        return result
    }

    /// Folds the deltas into the priced rollups and re-prices what a card change left dirty:
    /// then a report reads the stored prices, not the query-time ones (Migrations/0012).
    static func compactAndReprice(_ services: AppServices) async throws {
        try await services.compactor.compactOnce()
        try await services.compactor.reprice(for: .seconds(60))
        let dirty = try await services.database.pool.query("SELECT count(*) FROM rollup_dirty").first!.decode(0, as: Int.self)
        #expect(dirty == 0, "every dirty range re-priced")
    }

    static func entry(_ network: String, _ country: String, cpm: String, cpt: String, from: String, currency: String = "USD", format: String = "banner") throws -> RateCardEntry {
        try RateCardEntry.parse(network: network, format: format, country: country, currency: currency, cpm: cpm, cpt: cpt, effectiveFrom: from)
    }

    /// Impressions and taps without reported revenue on both sides of a UTC midnight at
    /// which the any-country rate changes, in a country with its own rate and one without.
    static func pricingFixture(_ services: AppServices) async throws {
        _ = try await services.appStore.createApp(id: "priced", name: nil, timezone: "UTC", currency: "USD")
        let before = Reports.micros("2026-01-10T23:30:00Z")
        let after = Reports.micros("2026-01-11T00:30:00Z")
        var events: [AdEvent] = []
        func add(_ count: Int, _ type: EventType, _ at: Int64, _ country: String, network: String = "admob") {
            events += (0..<count).map { _ in Reports.event(type, at: at, network: network) { $0.country = country } }
        }
        add(100, .impression, before, "US"); add(3, .tap, before, "US")
        add(200, .impression, before, "JP"); add(1, .tap, before, "JP")
        add(100, .impression, after, "US")
        add(200, .impression, after, "JP"); add(2, .tap, after, "JP")
        // Reported revenue is never estimated; a network without a card is not priced.
        events.append(Reports.event(.impression, at: after) { $0.country = "US"; $0.revenueMicros = 1_000_000; $0.currency = "USD" })
        add(7, .impression, after, "US", network: "iad")
        try await Reports.store(services, app: "priced", events)
    }

    /// admob banner: any country CPM 2.00 CPT 0.10 from Jan 1, CPM 3.00 CPT 0.15 from
    /// Jan 11; US CPM 5.00 CPT 0.20 from Jan 1.
    static let card = [
        ("*", "2.00", "0.10", "2026-01-01"), ("*", "3.00", "0.15", "2026-01-11"), ("US", "5.00", "0.20", "2026-01-01"),
    ]

    @Test("the country's rate over the any-country rate, CPT per tap, effective dates at UTC midnight; the same in every zone and from every source")
    func pricing() async throws {
        try await withServices(flags: Reports.flags) { services in
            try await Self.pricingFixture(services)
            let money = MoneyStore(pool: services.database.pool)
            try await money.setRates(try Self.card.map { try Self.entry("admob", $0.0, cpm: $0.1, cpt: $0.2, from: $0.3) })
            // Jan 10 (UTC): US 100 × 5.00 / 1000 + 3 × 0.20 = 1.10; JP 200 × 2.00 / 1000 + 1 × 0.10 = 0.50.
            // Jan 11: US 100 × 5.00 / 1000 = 0.50; JP 200 × 3.00 / 1000 + 2 × 0.15 = 0.90; 1.00 reported.
            let metrics = "revenue,reported_revenue,estimated_revenue,impressions"
            for compacted in [false, true] {
                if compacted { try await Self.compactAndReprice(services) }
                for dimensions in ["date", "date,network"] {
                    let rows = Self.byFirst(try await Self.page(services, [("apps", "priced"), ("from", "2026-01-10"), ("to", "2026-01-11"), ("dimensions", dimensions), ("metrics", metrics)]))
                    #expect(rows["2026-01-10"]?.estimatedMicros == 1_600_000, "\(dimensions) compacted \(compacted)")
                    #expect(rows["2026-01-11"]?.estimatedMicros == 1_400_000)
                    #expect(rows["2026-01-11"]?.reportedMicros == 1_000_000)
                    #expect(rows["2026-01-11"]?.revenueMicros == 2_400_000)
                }
                // By country (raw events): each country's own figure.
                let countries = try await Self.page(services, [("apps", "priced"), ("from", "2026-01-10"), ("to", "2026-01-11"), ("dimensions", "country,network"), ("metrics", metrics)])
                let admob = Dictionary(uniqueKeysWithValues: countries.rows.filter { $0.dimensions[1] == "admob" }.map { ($0.dimensions[0]!, $0.counts) })
                #expect(admob["US"]?.estimatedMicros == 1_600_000)
                #expect(admob["JP"]?.estimatedMicros == 1_400_000)
                #expect(countries.totals.unratedEvents == 7)
                // In Kolkata (+05:30) both hours fall on Jan 11 local, each still priced by its UTC date.
                let kolkata = Self.byFirst(try await Self.page(services, [("apps", "priced"), ("from", "2026-01-10"), ("to", "2026-01-11"), ("tz", "Asia/Kolkata"), ("dimensions", "date"), ("metrics", metrics)]))
                #expect(kolkata["2026-01-11"]?.estimatedMicros == 3_000_000)
                #expect(kolkata["2026-01-10"] == nil)
                // Hours of New York (a 15-minute and hourly mix when cut) agree too.
                let hours = try await Self.page(services, [("apps", "priced"), ("from", "2026-01-10"), ("to", "2026-01-10"), ("tz", "America/New_York"), ("dimensions", "hour"), ("metrics", metrics)])
                #expect(hours.totals.estimatedMicros == 3_000_000)
            }
        }
    }

    @Test("a rate change re-prices history at once, without touching events; deleting it falls back")
    func repricing() async throws {
        try await withTestApp(flags: Reports.flags) { services, client in
            let keys = try await Ingest.keys(services)
            try await Self.pricingFixture(services)
            try await services.compactor.compactOnce()
            let query = "apps=priced&from=2026-01-10&to=2026-01-11&metrics=revenue,estimated_revenue"
            func estimated() async throws -> String {
                let (status, body) = try await Reports.get(client, keys.admin, query)
                #expect(status == .ok, "\(body)")
                return "\((body["totals"] as? [String: Any])?["estimated_revenue"] ?? "")"
            }
            #expect(try await estimated() == "0.00")
            let headers: HTTPFields = [.authorization: "Bearer \(keys.admin)", .contentType: "text/csv"]
            let csv = "network,format,country,currency,cpm,cpt,effective_from\n" + Self.card.map { "admob,banner,\($0.0),USD,\($0.1),\($0.2),\($0.3)" }.joined(separator: "\n")
            try await client.execute(uri: "/v1/rates", method: .post, headers: headers, body: ByteBuffer(string: csv)) { #expect($0.status == .ok) }
            #expect(try await estimated() == "3.00")
            // US from Jan 11 at 6.00: Jan 11's 100 US impressions now 0.60, not 0.50.
            let json: HTTPFields = [.authorization: "Bearer \(keys.admin)", .contentType: "application/json"]
            let change = #"{"rates": [{"network": "admob", "format": "banner", "country": "US", "currency": "USD", "cpm": "6.00", "cpt": 0.2, "effective_from": "2026-01-11"}]}"#
            try await client.execute(uri: "/v1/rates", method: .post, headers: json, body: ByteBuffer(string: change)) { #expect($0.status == .ok) }
            #expect(try await estimated() == "3.10")
            try await client.execute(uri: "/v1/rates?network=admob&format=banner&country=US&effective_from=2026-01-11", method: .delete, headers: json) {
                #expect($0.status == .noContent)
            }
            #expect(try await estimated() == "3.00")
            // The card as listed, amounts as decimal strings; a read key may look, not change.
            try await client.execute(uri: "/v1/rates?network=admob", method: .get, headers: Reports.headers(keys.read)) { response in
                let body = try JSONSerialization.jsonObject(with: Data(response.body.readableBytesView)) as? [String: [[String: String]]]
                #expect(body?["rates"]?.count == 3)
                #expect(body?["rates"]?.first?["cpm"] == "2.00")
            }
            try await client.execute(uri: "/v1/rates", method: .post, headers: [.authorization: "Bearer \(keys.read)", .contentType: "text/csv"], body: ByteBuffer(string: csv)) {
                #expect($0.status == .forbidden)
            }
            // A bad line names its line and field; nothing of the file is stored.
            let bad = csv + "\nadmob,banner,XX,USD,1.00,0,2026-02-01"
            try await client.execute(uri: "/v1/rates", method: .post, headers: headers, body: ByteBuffer(string: bad)) { response in
                #expect(response.status == .badRequest)
                let detail = String(buffer: response.body)
                #expect(detail.contains("line 5: country"), "\(detail)")
            }
        }
    }

    /// Reported revenue in USD, JPY and GBP over three UTC days, for an app reporting in EUR.
    static func fxFixture(_ services: AppServices) async throws {
        _ = try await services.appStore.createApp(id: "euro", name: nil, timezone: "UTC", currency: "EUR")
        var events: [AdEvent] = []
        func add(_ day: String, _ micros: Int64, _ currency: String, network: String = "admob") {
            events.append(Reports.event(.impression, at: Reports.micros("\(day)T12:00:00Z"), network: network) {
                $0.revenueMicros = micros; $0.currency = currency
            })
        }
        add("2026-02-01", 2_500_000, "USD"); add("2026-02-01", 320_000_000, "JPY"); add("2026-02-01", 1_000_000, "GBP")
        add("2026-02-02", 1_000_000, "USD"); add("2026-02-02", 100_000_000, "JPY"); add("2026-02-02", 170_000, "GBP")
        // Exact halves: 5 USD micros / 2 = 2.5 → 2 (even), 7 / 2 = 3.5 → 4; each in its own row.
        add("2026-02-03", 5, "USD"); add("2026-02-03", 7, "USD", network: "iad")
        try await Reports.store(services, app: "euro", events)
    }

    static let fxCSV = """
        Date,USD,JPY,GBP,KWD,
        2026-02-01,1.25,160,0.8,0.3333,
        2026-02-02,1.2,150,0.85,N/A,
        2026-02-03,2,N/A,N/A,N/A,
        """

    @Test("a bucket's amount is rounded half to even as adtally_div_half_even(amount, 1) rounds it, ties, signs and long fractions included")
    func roundHalfEvenIsTheFunctions() async throws {
        try await TestDatabase.withPool { pool in
            _ = try await Migrator(directory: Migrator.defaultDirectory(explicit: nil)).migrate(pool)
            let amount = "x"
            let rows = try await pool.query("""
                SELECT count(*)::int, count(*) FILTER (WHERE adtally_div_half_even(x, 1)::text <> (\(unsafeRaw: ReportPlan.roundHalfEven(amount)))::text)::int
                FROM (SELECT (i / 1000.0)::numeric AS x FROM generate_series(-5000, 5000) AS i
                      UNION ALL SELECT unnest(ARRAY[0.5, -0.5, 1.5, -1.5, 2.5, 1e20 + 0.5, 1e20 + 1.5, -1e20 - 0.5, 0.4999999999999, 12345678.5000001,
                                                    7.0005, 0.0001, -0.0001]::numeric[])) AS v
                """)
            #expect(try rows[0].decode(0, as: Int.self) == 10_014)
            #expect(try rows[0].decode(1, as: Int.self) == 0)
        }
    }

    @Test("amounts convert at their own UTC date's rate, once per row, date and currency, half to even; a missing rate is a 422 naming currency and date")
    func conversion() async throws {
        try await withTestApp(flags: Reports.flags) { services, client in
            let keys = try await Ingest.keys(services)
            try await Self.fxFixture(services)
            let money = MoneyStore(pool: services.database.pool)
            let result = try await money.importFX(try FXRate.parseCSV(Array(Self.fxCSV.utf8), base: "EUR"))
            #expect(result.stored == 8)
            for compacted in [false, true] {
                if compacted { try await Self.compactAndReprice(services) }
                let base = [("apps", "euro"), ("from", "2026-02-01"), ("to", "2026-02-03"), ("dimensions", "date,network"), ("metrics", "revenue,reported_revenue")]
                let eur = try await Self.page(services, base)
                let rows = Dictionary(uniqueKeysWithValues: eur.rows.map { ("\($0.dimensions[0]!) \($0.dimensions[1]!)", $0.counts.reportedMicros) })
                // Feb 1: 2.50 USD / 1.25 = 2.00, 320 JPY / 160 = 2.00, 1.00 GBP / 0.8 = 1.25.
                #expect(rows["2026-02-01 admob"] == 5_250_000)
                // Feb 2: 1,000,000 / 1.2 = 833,333.3 → 833,333; 100,000,000 / 150 = 666,666.7 → 666,667; 170,000 / 0.85 = 200,000.
                #expect(rows["2026-02-02 admob"] == 1_700_000)
                #expect(rows["2026-02-03 admob"] == 2)
                #expect(rows["2026-02-03 iad"] == 4)
                #expect(eur.totals.reportedMicros == 6_950_006)
                // Into JPY across the EUR base: 2.50 USD × 160 / 1.25 = 320 JPY on Feb 1.
                let jpy = Self.byFirst(try await Self.page(services, [("apps", "euro"), ("from", "2026-02-01"), ("to", "2026-02-01"), ("dimensions", "date"), ("metrics", "revenue"), ("currency", "JPY")]))
                #expect(jpy["2026-02-01"]?.reportedMicros == 840_000_000)
            }
            // Money strings in 0, 2 and 3 decimals.
            func revenue(_ currency: String, to: String = "2026-02-01") async throws -> String {
                let (status, body) = try await Reports.get(client, keys.admin, "apps=euro&from=2026-02-01&to=\(to)&metrics=revenue&currency=\(currency)")
                #expect(status == .ok, "\(body)")
                return "\((body["totals"] as? [String: Any])?["revenue"] ?? "")"
            }
            #expect(try await revenue("JPY") == "840")
            #expect(try await revenue("EUR") == "5.25")
            // 5.25 EUR × 0.3333 = 1.749825 KWD, shown with 3 decimals.
            #expect(try await revenue("KWD") == "1.750")
            #expect(try await revenue("USD") == "6.56")
            // Feb 2 has no KWD rate: 422, naming KWD and the date.
            let (status, body) = try await Reports.get(client, keys.admin, "apps=euro&from=2026-02-01&to=2026-02-02&metrics=revenue&currency=KWD")
            #expect(status == .unprocessableContent)
            let detail = body["detail"] as? String ?? ""
            #expect(detail.contains("no KWD rate") && detail.contains("2026-02-02"), "\(detail)")
            // CSV is refused before its first byte, too.
            try await client.execute(uri: "/v1/reports?apps=euro&from=2026-02-01&to=2026-02-02&metrics=revenue&currency=KWD&format=csv", method: .get, headers: Reports.headers(keys.admin)) {
                #expect($0.status == .unprocessableContent)
            }
            // A stream that was not checked first refuses by itself, at the row that needs the rate.
            let kwd = try ReportQuery.parse(
                [("apps", "euro"), ("from", "2026-02-01"), ("to", "2026-02-02"), ("dimensions", "date"), ("metrics", "revenue"), ("currency", "KWD")],
                readable: try await services.reports.readableApps(only: nil), isAdmin: true, acceptsCSV: false
            )
            var streamed: [String?] = []
            await #expect(throws: ReportCurrencyError.self) {
                try await services.reports.stream(kwd, start: { _ in }, rows: { rows in streamed += rows.map { $0.dimensions[0] } })
            }
            #expect(!streamed.contains("2026-02-02"))
            // Counts need no rate.
            #expect(try await Reports.get(client, keys.admin, "apps=euro&from=2026-02-01&to=2026-02-03&metrics=impressions&currency=KWD").status == .ok)
            // A day's GBP rate deleted: the report that needs it names GBP and the day.
            #expect(try await money.deleteFX(date: "2026-02-02", currency: "GBP", base: "EUR"))
            let gap = try await Reports.get(client, keys.admin, "apps=euro&from=2026-02-01&to=2026-02-03&metrics=revenue")
            #expect(gap.status == .unprocessableContent)
            #expect((gap.body["detail"] as? String ?? "").contains("GBP to EUR on 2026-02-02"), "\(gap.body)")
        }
    }

    @Test("estimated revenue in the card's currency converts like reported revenue")
    func estimatedInAnotherCurrency() async throws {
        try await withServices(flags: Reports.flags) { services in
            try await Self.pricingFixture(services)
            let money = MoneyStore(pool: services.database.pool)
            // The US rate in JPY: 100 impressions × 800 JPY / 1000 = 80 JPY = 0.50 USD at 160 JPY per USD.
            try await money.setRates([try Self.entry("admob", "US", cpm: "800", cpt: "0", from: "2026-01-01", currency: "JPY")])
            _ = try await money.importFX([
                try FXRate.parse(date: "2026-01-10", base: "USD", currency: "JPY", rate: "160"),
                try FXRate.parse(date: "2026-01-11", base: "USD", currency: "JPY", rate: "200"),
            ])
            for compacted in [false, true] {
                if compacted { try await Self.compactAndReprice(services) }
                let rows = Self.byFirst(try await Self.page(services, [("apps", "priced"), ("from", "2026-01-10"), ("to", "2026-01-11"), ("dimensions", "date"), ("metrics", "estimated_revenue")]))
                #expect(rows["2026-01-10"]?.estimatedMicros == 500_000)
                #expect(rows["2026-01-11"]?.estimatedMicros == 400_000)
                // No any-country entry: JP's 400 impressions and 3 taps and iad's 7 are unpriced.
                let totals = try await Self.page(services, [("apps", "priced"), ("from", "2026-01-10"), ("to", "2026-01-11"), ("metrics", "estimated_revenue")]).totals
                #expect(totals.unratedEvents == 410)
            }
        }
    }

    @Test("a country's entry in another currency than the any-country one, starting later, priced alike from every source and zone")
    func countryEntryInAnotherCurrency() async throws {
        try await withServices(flags: Reports.flags) { services in
            _ = try await services.appStore.createApp(id: "mixed", name: nil, timezone: "UTC", currency: "USD")
            var events: [AdEvent] = []
            func add(_ count: Int, _ at: String, _ country: String) {
                events += (0..<count).map { _ in Reports.event(.impression, at: Reports.micros(at)) { $0.country = country } }
            }
            add(100, "2026-01-10T12:00:00Z", "JP"); add(100, "2026-01-10T12:00:00Z", "US")
            add(100, "2026-01-11T12:00:00Z", "JP"); add(100, "2026-01-11T12:00:00Z", "US")
            // 00:10 on Jan 12 in Kolkata, still Jan 11 in UTC: an hour the Kolkata midnight cuts.
            add(10, "2026-01-11T18:40:00Z", "JP")
            try await Reports.store(services, app: "mixed", events)
            let money = MoneyStore(pool: services.database.pool)
            try await money.setRates([
                try Self.entry("admob", "*", cpm: "2.00", cpt: "0", from: "2026-01-01"),
                try Self.entry("admob", "JP", cpm: "300", cpt: "0", from: "2026-01-11", currency: "JPY"),
            ])
            _ = try await money.importFX([
                try FXRate.parse(date: "2026-01-10", base: "USD", currency: "JPY", rate: "150"),
                try FXRate.parse(date: "2026-01-11", base: "USD", currency: "JPY", rate: "160"),
            ])
            // Jan 10: JP still at the any-country 2.00 USD: 0.20 + US 0.20. Jan 11: JP 100 × 300 / 1000
            // = 30 JPY = 0.1875 USD at 160, US 0.20, and the 10 late ones 3 JPY = 0.01875 USD.
            for compacted in [false, true] {
                if compacted { try await Self.compactAndReprice(services) }
                for extra in [[], [("placement", "default")]] {
                    let utc = Self.byFirst(try await Self.page(services, [("apps", "mixed"), ("from", "2026-01-10"), ("to", "2026-01-12"), ("dimensions", "date"), ("metrics", "estimated_revenue")] + extra))
                    #expect(utc["2026-01-10"]?.estimatedMicros == 400_000, "compacted \(compacted) \(extra)")
                    #expect(utc["2026-01-11"]?.estimatedMicros == 406_250, "compacted \(compacted) \(extra)")
                }
                let kolkata = try await Self.page(services, [("apps", "mixed"), ("from", "2026-01-10"), ("to", "2026-01-12"), ("tz", "Asia/Kolkata"), ("dimensions", "date"), ("metrics", "estimated_revenue")])
                let days = Self.byFirst(kolkata)
                #expect(days["2026-01-10"]?.estimatedMicros == 400_000)
                #expect(days["2026-01-11"]?.estimatedMicros == 387_500)
                #expect(days["2026-01-12"]?.estimatedMicros == 18_750)
                #expect(kolkata.totals.unratedEvents == 0)
            }
            // Compare cannot match distinct devices row by row.
            let readable = try await services.reports.readableApps(only: nil)
            #expect(throws: ReportQueryError.self) {
                try ReportQuery.parse([("metrics", "unique_devices"), ("compare", "previous_period")], readable: readable, isAdmin: true, acceptsCSV: false)
            }
        }
    }

    @Test("FX files: the ECB's shape with N/A, date,currency,rate, errors naming line and field, gaps carried over weekends")
    func fxFiles() async throws {
        let ecb = try FXRate.parseCSV(Array(Self.fxCSV.utf8), base: "EUR")
        #expect(ecb.count == 8)
        #expect(ecb.first == FXRate(date: "2026-02-01", base: "EUR", currency: "USD", rate: "1.25"))
        let long = try FXRate.parseCSV(Array("date,currency,rate\n2026-02-01,USD,1.2500\n".utf8), base: "EUR")
        #expect(long == [FXRate(date: "2026-02-01", base: "EUR", currency: "USD", rate: "1.25")])
        #expect(throws: MoneyTableError("line 3: rate", "must be a positive decimal number (units of USD per 1 EUR), at most 12 digits before and after the point")) {
            try FXRate.parseCSV(Array("date,currency,rate\n2026-02-01,USD,1.25\n2026-02-02,USD,-1\n".utf8), base: "EUR")
        }
        #expect(throws: MoneyTableError.self) { try FXRate.parseCSV(Array("date,currency,rate\n2026-02-31,USD,1\n".utf8), base: "EUR") }
        // The ECB's files as downloaded: the daily one writes its date out and pads with
        // spaces; the history one keeps columns of currencies that are gone (CYP).
        let daily = try FXRate.parseCSV(Array("Date, USD, JPY, \n22 November 2024, 1.0412, 161.17, \n".utf8), base: "EUR")
        #expect(daily == [FXRate(date: "2024-11-22", base: "EUR", currency: "USD", rate: "1.0412"), FXRate(date: "2024-11-22", base: "EUR", currency: "JPY", rate: "161.17")])
        var skipped = Set<String>()
        let history = try FXRate.parseCSV(Array("Date,USD,CYP,\n2024-11-22,1.0412,N/A,\n2007-12-31,1.4721,0.585274,\n".utf8), base: "EUR", skipped: &skipped)
        #expect(history.map(\.currency) == ["USD", "USD"] && skipped == ["CYP"])
        // A JSON rate whose cpm is there but not a number is refused, not taken for 0.
        #expect(throws: MoneyTableError.self) {
            try JSONDecoder().decode(RateCardEntry.self, from: Data(#"{"network": "admob", "format": "banner", "currency": "USD", "cpm": null, "effective_from": "2026-01-01"}"#.utf8))
        }
        #expect(throws: MoneyTableError.self) { try RateCardEntry.parseCSV(Array("network,format,country,currency,cpm,cpt,effective_from\nadmob,banner,*,USD,1.1234567,0,2026-01-01\n".utf8)) }
        #expect(Money.parseMicros("0.125") == 125_000)
        #expect(Money.plain(micros: 125_000, currency: "USD") == "0.125")
        #expect(Money.plain(micros: 2_500_000, currency: "USD") == "2.50")
        #expect(Money.plain(micros: 800_000_000, currency: "JPY") == "800")

        try await withServices { services in
            let money = MoneyStore(pool: services.database.pool)
            // Friday and Monday published; Saturday and Sunday carried from Friday.
            let published = "date,currency,rate\n2026-11-13,USD,1.10\n2026-11-16,USD,1.12\n2026-12-01,USD,1.2\n"
            let result = try await money.importFX(try FXRate.parseCSV(Array(published.utf8), base: "EUR"), fillGaps: true)
            #expect(result.carried == 2)  // USD on two days (the base's own 1 is carried too, not counted); the 2-week gap is not filled
            let listed = try await money.fxRates(currency: "USD", from: "2026-11-13", to: "2026-11-17")
            #expect(listed.map(\.date) == ["2026-11-13", "2026-11-14", "2026-11-15", "2026-11-16"])
            #expect(listed[1].carriedFrom == "2026-11-13" && listed[1].rate == "1.1")
            // A rate published later for a carried day replaces it.
            _ = try await money.importFX([try FXRate.parse(date: "2026-11-14", base: "EUR", currency: "USD", rate: "1.11")])
            #expect(try await money.fxRates(currency: "USD", from: "2026-11-14", to: "2026-11-14").first == FXRate(date: "2026-11-14", base: "EUR", currency: "USD", rate: "1.11"))
            // Two different rates for one day in one import are refused.
            await #expect(throws: MoneyTableError.self) {
                _ = try await money.importFX([
                    try FXRate.parse(date: "2026-11-20", base: "EUR", currency: "USD", rate: "1.1"),
                    try FXRate.parse(date: "2026-11-20", base: "EUR", currency: "USD", rate: "1.2"),
                ])
            }
        }
    }

    @Test("unique_devices stays within its stated bound of an exact count(DISTINCT device), from every source and zone, and sums nothing twice")
    func uniqueDevices() async throws {
        try await withServices(flags: Reports.flags) { services in
            _ = try await services.appStore.createApp(id: "crowd", name: nil, timezone: "America/New_York", currency: "USD")
            // Seeded: the bound holds for 99.7% of estimates, and the test must not fail on the rest.
            var random = SplitMix64(seed: 20_261_123)
            var events: [AdEvent] = []
            let start = Reports.micros("2026-03-01T00:00:00Z")
            // 30,000 events over 4 days from 12,000 devices (some days share devices), 2 networks.
            for index in 0..<30_000 {
                let at = start + Int64.random(in: 0..<(4 * 86_400), using: &random) * 1_000_000
                let device = "device-\(Int.random(in: 0..<12_000, using: &random))"
                events.append(Reports.event(index % 3 == 0 ? .impression : .request, at: at, network: index % 2 == 0 ? "admob" : "iad") { $0.device = device })
            }
            try await Reports.store(services, app: "crowd", events)
            let exact = try await services.database.pool.query("""
                SELECT (occurred_at AT TIME ZONE 'America/New_York')::date::text, count(DISTINCT device) FROM events WHERE app_id = 'crowd' GROUP BY 1
                UNION ALL SELECT 'all', count(DISTINCT device) FROM events WHERE app_id = 'crowd' AND occurred_at >= '2026-03-01 00:00-05' AND occurred_at < '2026-03-04 00:00-05'
                """)
            var expected: [String: Double] = [:]
            for row in exact { expected[try row.decode(0, as: String.self)] = Double(try row.decode(1, as: Int.self)) }
            // The notes' bound: 3 standard errors of 2,048 registers.
            let bound = 3 * 1.04 / Double(2048).squareRoot()
            for compacted in [false, true] {
                if compacted { try await Self.compactAndReprice(services) }
                // New York from the daily rollups, and from raw events (a placement filter needs them).
                for extra in [[], [("placement", "default")]] {
                    let document = try await Self.page(services, [("apps", "crowd"), ("from", "2026-03-01"), ("to", "2026-03-03"), ("dimensions", "date"), ("metrics", "unique_devices,requests")] + extra)
                    #expect(document.rows.count == 3)
                    for row in document.rows {
                        let truth = expected[row.dimensions[0]!]!
                        #expect(abs(Double(row.counts.uniqueDevices) - truth) / truth <= bound, "\(row.dimensions[0]!): \(row.counts.uniqueDevices) vs \(truth) \(extra)")
                    }
                    let truth = expected["all"]!
                    #expect(abs(Double(document.totals.uniqueDevices) - truth) / truth <= bound, "total \(document.totals.uniqueDevices) vs \(truth)")
                    // Not a sum of the days: devices recur across them.
                    #expect(document.totals.uniqueDevices < document.rows.map(\.counts.uniqueDevices).reduce(0, +))
                }
                // Kathmandu (+05:45): hourly rows and the 15-minute rows of cut hours.
                let kathmandu = try await Self.page(services, [("apps", "crowd"), ("from", "2026-03-01"), ("to", "2026-03-03"), ("tz", "Asia/Kathmandu"), ("metrics", "unique_devices")])
                let exactKathmandu = Double(try await services.database.pool.query("""
                    SELECT count(DISTINCT device) FROM events WHERE app_id = 'crowd' AND occurred_at >= '2026-03-01 00:00+05:45' AND occurred_at < '2026-03-04 00:00+05:45'
                    """)[0].decode(0, as: Int.self))
                #expect(abs(Double(kathmandu.totals.uniqueDevices) - exactKathmandu) / exactKathmandu <= bound, "\(kathmandu.totals.uniqueDevices) vs \(exactKathmandu)")
            }
            // A small group is estimated too (the sketches list no hash, Migrations/0028): linear counting, within the bound.
            _ = try await services.appStore.createApp(id: "few", name: nil)
            try await Reports.store(services, app: "few", (0..<300).map { index in
                Reports.event(.request, at: start + Int64(index) * 60_000_000) { $0.device = "few-\(index % 150)" }
            })
            for compacted in [false, true] {
                if compacted { try await Self.compactAndReprice(services) }
                let few = try await Self.page(services, [("apps", "few"), ("from", "2026-03-01"), ("to", "2026-03-01"), ("metrics", "unique_devices")])
                #expect(abs(Double(few.totals.uniqueDevices) - 150) / 150 <= 0.02, "\(few.totals.uniqueDevices) of 150")
            }
        }
    }

    @Test("the ingest path hashes devices exactly as hll_hash_text does")
    func deviceHashAgrees() async throws {
        try await withServices { services in
            var random = SystemRandomNumberGenerator()
            var samples = ["", "a", "0123456789abcdef", "0123456789abcdefg", "ü-日本-device", String(repeating: "x", count: 64)]
            for _ in 0..<200 {
                let length = Int.random(in: 1...64, using: &random)
                samples.append(String((0..<length).map { _ in Character(UnicodeScalar(UInt8.random(in: 0x21...0x7e, using: &random))) }))
            }
            let rows = try await services.database.pool.query("SELECT hll_hash_text(s)::text FROM unnest(\(array: samples)::text[]) WITH ORDINALITY AS u (s, n) ORDER BY n")
            for (sample, row) in zip(samples, rows) {
                #expect("\(DeviceHash.hash(sample))" == (try row.decode(0, as: String.self)), "\(sample)")
            }
        }
    }
}
