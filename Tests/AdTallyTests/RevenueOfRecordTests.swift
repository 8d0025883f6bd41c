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

/// A network's final earnings as the revenue of record (issue 27 item 5, DESIGN §11,
/// Migrations/0016), on `ReconciliationTests.fixture`'s events and AdMob's report
/// (Los Angeles 10-31: 30 impressions, 0 USD; 11-01: 100 impressions, 0.60 USD).
@Suite("Revenue of record: a network's final earnings replace the SDK's revenue for its final days", .serialized)
struct RevenueOfRecordTests {
    static func report(_ services: AppServices, _ parameters: [(String, String)]) async throws -> ReportDocument {
        let query = try ReportQuery.parse(parameters, readable: try await services.reports.readableApps(only: nil), isAdmin: true, output: .json)
        return try await services.reports.page(query)
    }

    /// Rows by their dimension values joined with a space.
    static func byKey(_ document: ReportDocument) -> [String: ReportCounts] {
        Dictionary(uniqueKeysWithValues: document.rows.map { ($0.dimensions.map { $0 ?? "-" }.joined(separator: " "), $0.counts) })
    }

    static func setImportedAt(_ services: AppServices, _ id: Int64, _ at: String) async throws {
        try await services.database.pool.query("UPDATE network_imports SET imported_at = \(at)::timestamptz WHERE import_id = \(id)")
    }

    @Test("AdMob's final Los Angeles days take its earnings, spread over the day's impressions in every zone; a day turns at exactly final_after_days; a restatement replaces; DATA_DELAYED keeps the SDK's")
    func revenueOfRecord() async throws {
        try await withTestApp(flags: Reports.flags) { services, client in
            try await ReconciliationTests.fixture(services)
            let keys = try await Ingest.keys(services)
            let store = NetworkReportStore(pool: services.database.pool)
            try await store.setMappings([.init(source: .admob, kind: .app, external: "ca-app-pub-1234567890123456~1111111111", target: "game")])
            let first = try await ReconciliationTests.importFile(store, "admob-network.json", .admob)
            // Taken on LA's 11-04: 11-01 is 3 days old, 10-31 four.
            try await Self.setImportedAt(services, first.importID, "2026-11-04 12:00:00 America/Los_Angeles")
            let la = [("apps", "game"), ("from", "2026-10-31"), ("to", "2026-11-01"), ("tz", "America/Los_Angeles"), ("dimensions", "date,network"),
                      ("metrics", "impressions,revenue,reported_revenue,network_revenue,revenue_source")]

            // The default policy is the SDK's: 11-01 has the SDK's 0.50, nothing is the network's.
            var rows = Self.byKey(try await Self.report(services, la))
            #expect(rows["2026-11-01 admob"]?.revenueMicros == 500_000 && rows["2026-11-01 admob"]?.revenueSource == "sdk")

            _ = try await store.setSettings(network: "admob", tolerancePct: nil, finalAfterDays: nil, revenueSource: "network_when_final")
            var document = try await Self.report(services, la)
            rows = Self.byKey(document)
            // LA's 11-01: AdMob's 0.60 over our 90 impressions; the SDK's 0.50 is gone from revenue.
            let day = try #require(rows["2026-11-01 admob"])
            #expect(day.impressions == 90 && day.networkMicros == 600_000 && day.reportedMicros == 0 && day.revenueMicros == 600_000)
            #expect(day.networkImpressions == 90 && day.revenueSource == "network")
            // 10-31: AdMob earned nothing on our 30 impressions (it had none of revenue either).
            #expect(rows["2026-10-31 admob"]?.revenueMicros == 0 && rows["2026-10-31 admob"]?.revenueSource == "network")
            // AppLovin's policy is the SDK's: its 8 impressions at 0.02 (LA's 10-31 at 23:30).
            #expect(rows["2026-10-31 applovin"]?.revenueMicros == 160_000 && rows["2026-10-31 applovin"]?.revenueSource == "sdk")
            #expect(document.totals.revenueMicros == 760_000 && document.totals.networkMicros == 600_000)
            #expect(document.notes.revenueOfRecord.first?.contains("game admob: revenue of 2 days, 2026-10-31 to 2026-11-01 (America/Los_Angeles days) is the network's final earnings (import #\(first.importID))") == true,
                    "\(document.notes.revenueOfRecord)")

            // In UTC the same instants: 11-01 UTC holds LA 10-31's 20 impressions (0) and 50 of
            // LA 11-01's 90 (0.60 x 50/90 = 0.333333); 11-02 UTC the other 40 (0.266667). UTC
            // 11-03's 5 impressions are on no final day: the SDK's (none).
            let utc = [("apps", "game"), ("from", "2026-10-31"), ("to", "2026-11-03"), ("tz", "UTC"), ("dimensions", "date,network"), ("metrics", "impressions,revenue,revenue_source")]
            document = try await Self.report(services, utc)
            rows = Self.byKey(document)
            #expect(rows["2026-11-01 admob"]?.revenueMicros == 333_333 && rows["2026-11-01 admob"]?.revenueSource == "network")
            #expect(rows["2026-11-02 admob"]?.revenueMicros == 266_667)
            #expect(rows["2026-10-31 admob"]?.revenueMicros == 0 && rows["2026-10-31 admob"]?.networkImpressions == 10)
            #expect(rows["2026-11-03 admob"]?.revenueSource == "sdk" && rows["2026-11-03 admob"]?.networkImpressions == 0)
            // Every impression of AdMob's two final days is placed: 0.333333 + 0.266667 = 0.60.
            #expect(document.totals.networkMicros == 600_000 && document.totals.revenueMicros == 760_000)
            // By hour (the finest grain) and without a time dimension, the same sums.
            let hourly = try await Self.report(services, [("apps", "game"), ("from", "2026-10-31"), ("to", "2026-11-03"), ("dimensions", "hour,network"), ("metrics", "revenue")])
            #expect(hourly.totals.networkMicros == 600_000 && hourly.totals.revenueMicros == 760_000)
            let whole = try await Self.report(services, [("apps", "game"), ("from", "2026-10-31"), ("to", "2026-11-03"), ("dimensions", "network"), ("metrics", "revenue")])
            #expect(Self.byKey(whole)["admob"]?.revenueMicros == 600_000)
            // Raw events (a country dimension) agree with the rollups.
            let raw = try await Self.report(services, [("apps", "game"), ("from", "2026-10-31"), ("to", "2026-11-03"), ("dimensions", "network,country"), ("metrics", "revenue")])
            #expect(raw.notes.source.hasPrefix("raw events") && Self.byKey(raw)["admob US"]?.revenueMicros == 600_000, "\(raw.rows)")
            // revenue_source=sdk: the SDK's amounts, whatever the policy (what a reconciliation compares).
            let sdk = try await Self.report(services, la + [("revenue_source", "sdk")])
            #expect(Self.byKey(sdk)["2026-11-01 admob"]?.revenueMicros == 500_000 && sdk.notes.revenueOfRecord.isEmpty)
            let reconciled = try await ReconciliationTests.run(services, [("apps", "game"), ("from", "2026-11-01"), ("to", "2026-11-01"), ("dimensions", "date")])
            #expect(reconciled.rows.first?.ours.revenueMicros == 500_000)

            // Finality, exactly: 11-01 was imported 3 days after; with a window of 4 days it is
            // not final (the SDK's 0.50), 10-31 (4 days) still is.
            _ = try await store.setSettings(network: "admob", tolerancePct: nil, finalAfterDays: 4)
            rows = Self.byKey(try await Self.report(services, la))
            #expect(rows["2026-11-01 admob"]?.revenueMicros == 500_000 && rows["2026-11-01 admob"]?.revenueSource == "sdk")
            #expect(rows["2026-10-31 admob"]?.revenueSource == "network")
            _ = try await store.setSettings(network: "admob", tolerancePct: nil, finalAfterDays: 3)

            // A restatement (0.90 for 11-01), taken later, replaces the first import; the notes name it.
            let restated = String(decoding: try ReconciliationTests.fixture("admob-network.json"), as: UTF8.self).replacingOccurrences(of: "600000", with: "900000")
            let second = try await store.importReport(try NetworkReport.parse(Array(restated.utf8), source: .admob), fileSHA256: String(repeating: "b", count: 64), via: "cli")
            try await Self.setImportedAt(services, second.importID, "2026-11-05 12:00:00 America/Los_Angeles")
            document = try await Self.report(services, la)
            #expect(Self.byKey(document)["2026-11-01 admob"]?.revenueMicros == 900_000)
            #expect(document.notes.revenueOfRecord.first?.contains("(import #\(second.importID))") == true, "\(document.notes.revenueOfRecord)")

            // A DATA_DELAYED import makes none of its days final: the SDK's amounts again.
            try await services.database.pool.query("UPDATE network_imports SET is_delayed = true WHERE import_id = \(second.importID)")
            rows = Self.byKey(try await Self.report(services, la))
            #expect(rows["2026-11-01 admob"]?.revenueMicros == 500_000 && rows["2026-11-01 admob"]?.revenueSource == "sdk")
            try await services.database.pool.query("UPDATE network_imports SET is_delayed = false WHERE import_id = \(second.importID)")

            // Over HTTP: the revenue_source column, the notes, the sort by revenue.
            let (status, body) = try await Reports.get(client, keys.admin, "apps=game&from=2026-11-01&to=2026-11-02&tz=UTC&dimensions=date,network&metrics=impressions,revenue,revenue_source&sort=-revenue")
            #expect(status == .ok, "\(body)")
            let columns = (body["columns"] as? [[String: String]] ?? []).map { $0["name"]! }
            #expect(columns == ["date", "network", "impressions", "revenue", "revenue_source"])
            let httpRows = (body["rows"] as? [[Any]] ?? []).map { $0.map { "\($0)" } }
            // 0.90 x 50/90 = 0.50, 0.90 x 40/90 = 0.40, AppLovin's 0.16.
            #expect(httpRows == [["2026-11-01", "admob", "70", "0.50", "network"], ["2026-11-02", "admob", "40", "0.40", "network"], ["2026-11-01", "applovin", "8", "0.16", "sdk"]], "\(httpRows)")
            let notes = body["notes"] as? [String: Any] ?? [:]
            #expect((notes["revenue_of_record"] as? [String])?.first?.hasPrefix("game admob: revenue of 2 days") == true, "\(notes)")
            // MAX's UTC days for applovin, in the UTC app's own zone: read from the daily rollups,
            // by their own day. MAX says 10 impressions, 0.20 USD on 11-01 (our 8 at 0.02: 0.16).
            try await store.setMappings([.init(source: .max, kind: .app, external: "com.example.game", target: "game")])
            _ = try await store.importReport(
                try NetworkReport.parse(try ReconciliationTests.fixture("max-report.csv"), source: .max).withLines { $0.network == "APPLOVIN_NETWORK" },
                fileSHA256: String(repeating: "d", count: 64), via: "cli"
            )
            _ = try await store.setSettings(network: "applovin", tolerancePct: nil, finalAfterDays: nil, revenueSource: "network_when_final")
            // (With AdMob's Los Angeles days beside them the report moves admob's hours that lie in
            // another Los Angeles day than their UTC day's noon by the hour; for applovin alone, daily.)
            let mixed = try await Self.report(services, [("apps", "game"), ("from", "2026-11-01"), ("to", "2026-11-01"), ("dimensions", "date,network"), ("metrics", "revenue")])
            #expect(mixed.notes.source.hasPrefix("rollups: daily rows in the apps' own zone (and hourly rows, with 15-minute rows for hours a day boundary cuts, of the hours that lie in another"), "\(mixed.notes.source)")
            #expect(Self.byKey(mixed)["2026-11-01 applovin"]?.revenueMicros == 200_000)
            let own = try await Self.report(services, [("apps", "game"), ("from", "2026-11-01"), ("to", "2026-11-01"), ("dimensions", "date,network"), ("metrics", "impressions,revenue,revenue_source"), ("network", "applovin")])
            #expect(own.notes.source == "rollups: daily rows in the apps' own zone, and pending 15-minute deltas", "\(own.notes.source)")
            #expect(Self.byKey(own)["2026-11-01 applovin"]?.revenueMicros == 200_000 && Self.byKey(own)["2026-11-01 applovin"]?.revenueSource == "network", "\(own.rows)")
            // The same day by hour (the hourly rollups) agrees.
            let byHour = try await Self.report(services, [("apps", "game"), ("from", "2026-11-01"), ("to", "2026-11-01"), ("tz", "UTC"), ("dimensions", "hour"), ("metrics", "revenue"), ("network", "applovin")])
            #expect(byHour.totals.revenueMicros == 200_000)

            // A network's days in a half-hour zone (a CSV's Asia/Kolkata) for an app in that zone:
            // its earnings (1.00 for 11-01) are placed by the hour, as its weight counts them, so
            // none is lost: 10 impressions at 17:30 IST on 11-01 and 10 in the hour that starts
            // at 23:30 IST (18:00 UTC) but falls at 00:15 IST on 11-02.
            _ = try await services.appStore.createApp(id: "kol", name: nil, timezone: "Asia/Kolkata", currency: "USD")
            try await Reports.store(services, app: "kol", (0..<10).map { _ in Reports.event(.impression, at: Reports.micros("2026-11-01T12:00:00Z"), network: "unity") }
                + (0..<10).map { _ in Reports.event(.impression, at: Reports.micros("2026-11-01T18:45:00Z"), network: "unity") })
            try await services.compactor.compactOnce()
            let csv = "date,app,network,format,country,impressions,clicks,revenue,currency,timezone\n2026-11-01,kol,unity,banner,US,20,0,1.00,USD,Asia/Kolkata\n"
            _ = try await store.importReport(try NetworkReport.parse(Array(csv.utf8), source: .csv), fileSHA256: String(repeating: "9", count: 64), via: "cli")
            _ = try await store.setSettings(network: "unity", tolerancePct: nil, finalAfterDays: nil, revenueSource: "network_when_final")
            let kolkata = try await Self.report(services, [("apps", "kol"), ("from", "2026-11-01"), ("to", "2026-11-02"), ("dimensions", "date"), ("metrics", "revenue")])
            #expect(kolkata.notes.source.hasPrefix("rollups: daily rows in the apps' own zone (and hourly rows"), "\(kolkata.notes.source)")
            #expect(kolkata.totals.revenueMicros == 1_000_000, "\(kolkata.rows)")
            // Without a time dimension too: the hour that holds local midnight (18:00 UTC) is read
            // by its quarter hours, as the daily rows split it between two days' noons.
            let kolkataWhole = try await Self.report(services, [("apps", "kol"), ("from", "2026-11-01"), ("to", "2026-11-02"), ("dimensions", "network"), ("metrics", "revenue")])
            #expect(kolkataWhole.totals.revenueMicros == 1_000_000, "\(kolkataWhole.rows)")

            // A bad value names the parameter.
            let (bad, problem) = try await Reports.get(client, keys.admin, "apps=game&days=1&revenue_source=network")
            #expect(bad == .badRequest && "\(problem)".contains("revenue_source"))
            // The policy over HTTP: a bad value is a 400 naming it; the settings list it.
            try await client.execute(uri: "/v1/network-settings/admob", method: .put, headers: Reports.headers(keys.admin), body: ByteBuffer(string: #"{"revenue_source": "network"}"#)) { response in
                #expect(response.status == .badRequest && String(buffer: response.body).contains("revenue_source"))
            }
            try await client.execute(uri: "/v1/network-settings", method: .get, headers: Reports.headers(keys.admin)) { response in
                #expect(String(buffer: response.body).contains(#""revenue_source":"network_when_final""#), "\(String(buffer: response.body))")
            }
        }
    }

    @Test("a network day's weight (AdTally's impressions in it) is those of the hours that start in it, for apps in every kind of zone: whole-hour, half-hour, and those whose midnight happens twice (the Azores' and Havana's fall back)")
    func weightsInEveryZone() async throws {
        try await withServices(flags: Reports.flags) { services in
            let zones = ["America/New_York", "Atlantic/Azores", "America/Havana", "Asia/Kolkata", "Australia/Lord_Howe", "UTC", "Asia/Tokyo"]
            var csv = "date,app,network,format,country,impressions,clicks,revenue,currency,timezone\n"
            let start = Reports.micros("2026-10-22T00:00:00Z")
            for (n, zone) in zones.enumerated() {
                let app = "w\(n)"
                _ = try await services.appStore.createApp(id: app, name: nil, timezone: zone, currency: "USD")
                // 1 to 7 impressions in each quarter hour over 13 UTC days around the fall backs
                // (Azores 10-25, Havana, New York and Los Angeles 11-01): an hour misplaced changes a weight.
                var events: [AdEvent] = []
                for quarter in 0..<(13 * 96) {
                    let at: Int64 = start + Int64(quarter) * 900_000_000 + 60_000_000
                    for _ in 0...(quarter % 7) { events.append(Reports.event(.impression, at: at)) }
                }
                try await Reports.store(services, app: app, events)
                for day in 0..<12 {
                    csv += "\(ReportQuery.formatDate(ReportQuery.parseDate("2026-10-23")! + day)),\(app),admob,banner,US,100,0,1.00,USD,America/Los_Angeles\n"
                }
            }
            try await services.compactor.compactOnce()
            // A few pending in one hour of each app: the weights count them too.
            for n in zones.indices {
                try await Reports.store(services, app: "w\(n)", (0..<3).map { _ in Reports.event(.impression, at: Reports.micros("2026-10-29T10:20:00Z")) })
            }
            let store = NetworkReportStore(pool: services.database.pool)
            _ = try await store.importReport(try NetworkReport.parse(Array(csv.utf8), source: .csv), fileSHA256: String(repeating: "7", count: 64), via: "cli")
            _ = try await store.setSettings(network: "admob", tolerancePct: nil, finalAfterDays: nil, revenueSource: "network_when_final")
            let readable = try await services.reports.readableApps(only: nil)
            for (n, zone) in zones.enumerated() {
                let app = "w\(n)"
                let query = try ReportQuery.parse(
                    [("apps", app), ("from", "2026-10-24"), ("to", "2026-11-02"), ("dimensions", "date,network"), ("metrics", "revenue")], readable: readable, isAdmin: true
                )
                let days = try await services.database.pool.withConnection { try ReportPlan.recordDays(query, on: $0) }
                #expect(days.count == 12, "\(zone): \(days.map(\.day))")
                for day in days {
                    let expected = try await services.database.pool.query("""
                        SELECT (SELECT coalesce(sum(impressions), 0) FROM rollup_1h_compacted WHERE app_id = \(app) AND network = 'admob'
                                  AND hour >= \(day.from)::timestamptz AND hour < \(day.to)::timestamptz)
                             + (SELECT coalesce(sum(impressions), 0) FROM rollup_delta WHERE app_id = \(app) AND network = 'admob'
                                  AND date_trunc('hour', bucket, 'UTC') >= \(day.from)::timestamptz AND date_trunc('hour', bucket, 'UTC') < \(day.to)::timestamptz)
                        """)[0].decode(0, as: Int64.self)
                    #expect(day.impressions == expected && expected > 0, "\(zone) \(day.day): \(day.impressions) of \(expected)")
                }
            }
        }
    }
}
