import AdTallyApp
import AdTallyCore
@testable import AdTallyStorage
import Foundation
import Hummingbird
import HummingbirdTesting
import PostgresKit
import TextFormats
import Testing

@Suite("Audience metrics: DAU, DAV and the metrics over them", .serialized)
struct AudienceTests {
    /// One event of the fixture, on local day 0, 1 or 2 of its app at a local time.
    struct Local {
        var day: Int
        var hour: Int
        var minute: Int
        var type: EventType
        var device: String
        var network = "admob"
    }

    /// Three local days, hand-counted (times sit next to local midnights, where a zone's
    /// day begins in the middle of a UTC hour or quarter):
    /// - day 0: sessions A A B C C C; impressions A A (admob), B (iad); requests A B D (admob).
    ///   Active {A B C D} = 4, viewers {A B} = 2 (admob {A}, iad {B}).
    /// - day 1: sessions E E A; impressions E A (admob). Active {A E} = 2, viewers {A E} = 2.
    /// - day 2: a session of F, no ad. Active {F} = 1, viewers none.
    /// Every impression reports 1.00 USD.
    static let fixture: [Local] = [
        Local(day: 0, hour: 0, minute: 5, type: .session, device: "A"),
        Local(day: 0, hour: 0, minute: 6, type: .request, device: "A"),
        Local(day: 0, hour: 0, minute: 7, type: .impression, device: "A"),
        Local(day: 0, hour: 12, minute: 0, type: .session, device: "A"),
        Local(day: 0, hour: 12, minute: 1, type: .impression, device: "A"),
        Local(day: 0, hour: 9, minute: 30, type: .session, device: "B"),
        Local(day: 0, hour: 9, minute: 31, type: .request, device: "B"),
        Local(day: 0, hour: 9, minute: 32, type: .impression, device: "B", network: "iad"),
        Local(day: 0, hour: 23, minute: 50, type: .session, device: "C"),
        Local(day: 0, hour: 23, minute: 51, type: .session, device: "C"),
        Local(day: 0, hour: 23, minute: 52, type: .session, device: "C"),
        Local(day: 0, hour: 23, minute: 53, type: .request, device: "D"),
        Local(day: 1, hour: 0, minute: 1, type: .session, device: "E"),
        Local(day: 1, hour: 0, minute: 2, type: .impression, device: "E"),
        Local(day: 1, hour: 12, minute: 0, type: .session, device: "E"),
        Local(day: 1, hour: 23, minute: 58, type: .session, device: "A"),
        Local(day: 1, hour: 23, minute: 59, type: .impression, device: "A"),
        Local(day: 2, hour: 0, minute: 0, type: .session, device: "F"),
    ]

    /// The fixture's events for local days starting at `first` in `zone`.
    static func events(first: String, zone: String) -> [AdEvent] {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: zone)!
        let start = ReportQuery.parseDate(first)!
        return fixture.map { local in
            let date = CivilTime.date(days: start + local.day)
            let instant = calendar.date(from: DateComponents(year: date.year, month: date.month, day: date.day, hour: local.hour, minute: local.minute))!
            let micros = Int64(instant.timeIntervalSince1970) * 1_000_000
            if local.type == .session {
                var event = Reports.event(.session, at: micros, network: "") { $0.device = local.device }
                event.format = nil
                event.placement = ""
                event.platform = .ios
                return event
            }
            return Reports.event(local.type, at: micros, network: local.network) { event in
                event.device = local.device
                event.platform = .ios
                if local.type == .impression { event.revenueMicros = 1_000_000; event.currency = "USD" }
            }
        }
    }

    static let metrics = "dau,dav,active_devices,ad_viewers,engagement_rate,arpdau,arpdav,impressions_per_dau,impressions_per_dav,sessions_per_dau,sessions,impressions,revenue"

    /// Cells by column name, for the row whose first cell is `key` (or the totals when nil).
    static func values(_ body: [String: Any], _ key: String?) -> [String: String] {
        let columns = (body["columns"] as? [[String: String]] ?? []).map { $0["name"]! }
        func text(_ value: Any?) -> String { value == nil || value is NSNull ? "null" : "\(value!)" }
        guard let key else {
            let totals = body["totals"] as? [String: Any] ?? [:]
            return Dictionary(uniqueKeysWithValues: totals.map { ($0.key, text($0.value)) })
        }
        guard let row = (body["rows"] as? [[Any]] ?? []).first(where: { "\($0[0])" == key }) else { return [:] }
        return Dictionary(uniqueKeysWithValues: zip(columns, row.map(text)))
    }

    @Test("hand-computed DAU, DAV, ARPDAU and the rest: by date and over the range (average of daily vs range-unique), by network, in Kathmandu and across a DST day, from deltas, rollups and raw events")
    func handComputed() async throws {
        try await withTestApp(flags: Reports.flags) { services, client in
            let keys = try await Ingest.keys(services, app: "holder")
            // (app, its zone, the zone the report asks for, the first local day)
            let cases = [
                ("ktm", "Asia/Kathmandu", "Asia/Kathmandu", "2026-03-02"),
                ("utc-ktm", "UTC", "Asia/Kathmandu", "2026-03-02"),
                ("ny", "America/New_York", "America/New_York", "2026-03-07"),
                ("utc-ny", "UTC", "America/New_York", "2026-03-07"),
            ]
            for (app, zone, reportZone, first) in cases {
                _ = try await services.appStore.createApp(id: app, name: nil, timezone: zone, currency: "USD")
                try await Reports.store(services, app: app, Self.events(first: first, zone: reportZone))
            }
            for compacted in [false, true] {
                if compacted { try await services.compactor.compactOnce() }
                for (app, _, reportZone, first) in cases {
                    let day = ReportQuery.parseDate(first)!
                    let (d0, d1, d2) = (ReportQuery.formatDate(day), ReportQuery.formatDate(day + 1), ReportQuery.formatDate(day + 2))
                    let range = "apps=\(app)&tz=\(reportZone)&from=\(d0)&to=\(d2)&metrics=\(Self.metrics)"
                    let label = "\(app) in \(reportZone), compacted: \(compacted)"
                    // The rollups, then raw events (a filter on platform needs them).
                    for raw in ["", "&platform=ios"] {
                        let (status, byDate) = try await Reports.get(client, keys.admin, range + "&dimensions=date" + raw)
                        #expect(status == .ok, "\(byDate)")
                        let source = (byDate["notes"] as? [String: Any])?["source"] as? String ?? ""
                        #expect(source.hasPrefix(raw.isEmpty ? "rollups" : "raw events"), "\(source)")
                        #expect(Self.values(byDate, d0) == [
                            "date": d0, "dau": "4", "dav": "2", "active_devices": "4", "ad_viewers": "2", "engagement_rate": "0.5",
                            "arpdau": "0.750000", "arpdav": "1.500000", "impressions_per_dau": "0.75", "impressions_per_dav": "1.5",
                            "sessions_per_dau": "1.5", "sessions": "6", "impressions": "3", "revenue": "3.00",
                        ], "\(label) \(raw) day 0")
                        #expect(Self.values(byDate, d1)["dau"] == "2" && Self.values(byDate, d1)["dav"] == "2", "\(label) \(raw) day 1")
                        #expect(Self.values(byDate, d1)["arpdau"] == "1.000000" && Self.values(byDate, d1)["sessions_per_dau"] == "1.5", "\(label) \(raw) day 1")
                        // A day with a session and no ad: active, not a viewer; its ratios over viewers are null.
                        #expect(Self.values(byDate, d2) == [
                            "date": d2, "dau": "1", "dav": "0", "active_devices": "1", "ad_viewers": "0", "engagement_rate": "0",
                            "arpdau": "0.000000", "arpdav": "null", "impressions_per_dau": "0", "impressions_per_dav": "null",
                            "sessions_per_dau": "1", "sessions": "1", "impressions": "0", "revenue": "0.00",
                        ], "\(label) \(raw) day 2")
                        // Over the range: the average of daily values (7 device-days / 3 days) is not the
                        // range-unique count (6 devices: A B C D E F); both are right.
                        let total: [String: String] = [
                            "dau": "2.333333", "dav": "1.333333", "active_devices": "6", "ad_viewers": "3", "engagement_rate": "0.571429",
                            "arpdau": "0.714286", "arpdav": "1.250000", "impressions_per_dau": "0.714286", "impressions_per_dav": "1.25",
                            "sessions_per_dau": "1.428571", "sessions": "10", "impressions": "5", "revenue": "5.00",
                        ]
                        #expect(Self.values(byDate, nil) == total, "\(label) \(raw) totals")
                        let (_, whole) = try await Reports.get(client, keys.admin, range + raw)
                        #expect(Self.values(whole, nil) == total, "\(label) \(raw) no dimension, totals")
                        #expect((whole["rows"] as? [[Any]])?.count == 1)
                    }

                    // By network: DAU is the app's (a session names no network), DAV the network's own viewers.
                    let (_, byNetwork) = try await Reports.get(
                        client, keys.admin, "apps=\(app)&tz=\(reportZone)&from=\(d0)&to=\(d2)&dimensions=network&metrics=dau,dav,active_devices,ad_viewers,arpdau,arpdav,impressions_per_dav"
                    )
                    // Only the networks: sessions (stored under no network) are no row of their own
                    // unless sessions are asked for (then their row counts them).
                    #expect((byNetwork["rows"] as? [[Any]] ?? []).map { "\($0[0])" } == ["admob", "iad"], "\(label)")
                    let (_, withSessions) = try await Reports.get(client, keys.admin, range + "&dimensions=network")
                    #expect((withSessions["rows"] as? [[Any]] ?? []).map { "\($0[0])" } == ["", "admob", "iad"], "\(label)")
                    let admob = Self.values(byNetwork, "admob"), iad = Self.values(byNetwork, "iad")
                    #expect(admob["dau"] == "2.333333" && admob["active_devices"] == "6", "\(label) \(admob)")
                    // admob's viewers: {A} on day 0, {A E} on day 1; iad's: {B} on day 0.
                    #expect(admob["dav"] == "1" && admob["ad_viewers"] == "2" && admob["impressions_per_dav"] == "1.333333", "\(label) \(admob)")
                    #expect(iad["dav"] == "0.333333" && iad["ad_viewers"] == "1" && iad["arpdav"] == "1.000000", "\(label) \(iad)")
                    #expect(iad["arpdau"] == "0.142857", "\(label) \(iad)")
                    #expect(Self.values(byNetwork, nil)["dav"] == "1.333333", "\(label) the totals are the app's")
                    let approximate = (byNetwork["notes"] as? [String: Any])?["approximate"] as? [String] ?? []
                    #expect(approximate.contains { $0.contains("are the app's") }, "\(approximate)")
                    #expect(approximate.contains { $0.contains("2.3%") }, "\(approximate)")

                    // A filter on one date: a one-day average.
                    let (_, oneDay) = try await Reports.get(client, keys.admin, range + "&date=\(d1)")
                    #expect(Self.values(oneDay, nil)["dau"] == "2" && Self.values(oneDay, nil)["active_devices"] == "2", "\(label)")
                }
            }

            // A week the range cuts averages the range's days in it (03-01 is a Sunday: its
            // week has no events; 03-02 and 03-03 make 4 + 2 device-days over 2 days); a month;
            // a filter on a week.
            let week = try await Reports.rows(client, keys.admin, "apps=ktm&from=2026-03-01&to=2026-03-03&dimensions=week&metrics=dau,sessions")
            #expect(week.map { "\($0[0]) \($0[1])" } == ["2026-03-02 3"], "\(week)")
            let month = try await Reports.rows(client, keys.admin, "apps=ktm&from=2026-03-02&to=2026-03-04&dimensions=month&metrics=dau")
            #expect(month.map { "\($0[0]) \($0[1])" } == ["2026-03 2.333333"], "\(month)")
            let (_, weekFilter) = try await Reports.get(client, keys.admin, "apps=ktm&from=2026-03-01&to=2026-03-03&week=2026-03-02&metrics=dau")
            #expect(Self.values(weekFilter, nil)["dau"] == "3", "\(weekFilter)")
            // Two apps read in one zone: each row its own, the totals the union (the fixture's
            // device names are the same in both, so the union is one app's).
            let (_, twoApps) = try await Reports.get(client, keys.admin, "apps=ktm,utc-ktm&tz=Asia/Kathmandu&from=2026-03-02&to=2026-03-04&dimensions=app&metrics=dau,active_devices")
            #expect((twoApps["rows"] as? [[Any]] ?? []).map { "\($0[0]) \($0[1]) \($0[2])" } == ["ktm 2.333333 6", "utc-ktm 2.333333 6"], "\(twoApps)")
            #expect(Self.values(twoApps, nil)["dau"] == "2.333333")
            // Compared with the period before: 03-03..03-04 (dau (2 + 1) / 2) against 03-01..03-02 (4 / 2).
            let (comparedStatus, comparedBody) = try await Reports.get(client, keys.admin, "apps=ktm&from=2026-03-03&to=2026-03-04&metrics=dau&compare=previous_period")
            #expect(comparedStatus == .ok)
            let comparedTotals = Self.values(comparedBody, nil)
            #expect(comparedTotals["dau"] == "1.5" && comparedTotals["dau_previous"] == "2" && comparedTotals["dau_change"] == "-0.25", "\(comparedTotals)")

            // Sorting by a derived metric.
            let (status, sorted) = try await Reports.get(client, keys.admin, "apps=ktm&from=2026-03-02&to=2026-03-04&dimensions=date&metrics=arpdau,dau&sort=-arpdau")
            #expect(status == .ok)
            #expect((sorted["rows"] as? [[Any]] ?? []).map { "\($0[0])" } == ["2026-03-03", "2026-03-02", "2026-03-04"])
            // Distinct devices over a range do not compare.
            let (refused, body) = try await Reports.get(client, keys.admin, "apps=ktm&from=2026-03-02&to=2026-03-04&metrics=active_devices&compare=previous_period")
            #expect(refused == .badRequest && "\(body)".contains("active_devices"), "\(body)")
            // An hour is not a day.
            let (hourly, hourBody) = try await Reports.get(client, keys.admin, "apps=ktm&from=2026-03-02&to=2026-03-02&dimensions=hour&metrics=dau")
            #expect(hourly == .badRequest && "\(hourBody)".contains("metrics"), "\(hourBody)")
            let hours = try await Reports.rows(client, keys.admin, "apps=ktm&from=2026-03-02&to=2026-03-02&dimensions=hour&metrics=active_devices,ad_viewers")
            // Per hour: {A} at 00, {B} at 09, {A} at 12, {C D} at 23; viewers A, B, A.
            #expect(hours.map { "\($0[1])/\($0[2])" } == ["1/1", "1/1", "1/1", "2/0"], "\(hours)")
        }
    }

    @Test("sketches stay within their stated bound of exact count(DISTINCT device), daily and over the range")
    func withinBound() async throws {
        try await withTestApp(flags: Reports.flags) { services, client in
            let keys = try await Ingest.keys(services, app: "big")
            var random = SplitMix64(seed: 26)
            let start = Reports.micros("2026-02-01T00:00:00Z")
            var events: [AdEvent] = []
            for _ in 0..<40_000 {
                let micros = start + Int64(random.next() % (4 * 86_400)) * 1_000_000
                let device = "device-\(random.next() % 12_000)"
                let type: EventType = random.next() % 3 == 0 ? .impression : .request
                events.append(Reports.event(type, at: micros) { $0.device = device })
            }
            try await Reports.store(services, app: "big", events)
            try await services.compactor.compactOnce()
            let exact = try await services.database.pool.query("""
                SELECT (occurred_at AT TIME ZONE 'UTC')::date::text, count(DISTINCT device), count(DISTINCT device) FILTER (WHERE type = 'impression')
                FROM events WHERE app_id = 'big' GROUP BY 1 ORDER BY 1
                """).map { (try $0.decode(0, as: String.self), try $0.decode(1, as: Int.self), try $0.decode(2, as: Int.self)) }
            let whole = try await services.database.pool.query("SELECT count(DISTINCT device) FROM events WHERE app_id = 'big'").first!.decode(0, as: Int.self)
            let (_, body) = try await Reports.get(client, keys.admin, "apps=big&tz=UTC&from=2026-02-01&to=2026-02-04&dimensions=date&metrics=dau,dav,active_devices")
            // 3 standard errors (2.3% each): the bound the notes state for 997 in 1,000.
            func within(_ estimate: String?, _ truth: Int) -> Bool {
                guard let value = Double(estimate ?? "") else { return false }
                return abs(value - Double(truth)) <= 0.069 * Double(truth)
            }
            #expect(exact.count == 4)
            for (day, devices, viewers) in exact {
                let row = Self.values(body, day)
                #expect(within(row["dau"], devices), "\(day): \(row) against \(devices)")
                #expect(within(row["dav"], viewers), "\(day): \(row) against \(viewers)")
            }
            #expect(within(Self.values(body, nil)["active_devices"], whole), "\(Self.values(body, nil)) against \(whole)")
            let average = Double(exact.map(\.1).reduce(0, +)) / 4
            #expect(abs((Double(Self.values(body, nil)["dau"] ?? "") ?? 0) - average) <= 0.069 * average)
        }
    }

    @Test("each app's day sketch is the union of its networks' and formats' day sketches, as passes fold it and as Migrations/0022 builds it")
    func appDaySketches() async throws {
        try await withServices { services in
            _ = try await services.appStore.createApp(id: "ktm", name: nil, timezone: "Asia/Kathmandu")
            var random = SplitMix64(seed: 42)
            let start = Reports.micros("2026-02-01T00:00:00Z")
            for _ in 0..<3 {
                var events: [AppEvent] = []
                for index in 0..<2_000 {
                    let micros = start + Int64(random.next() % (3 * 86_400)) * 1_000_000
                    let device = "device-\(random.next() % 900)"
                    let type: EventType = [.impression, .request, .session][index % 3]
                    var event = Reports.event(type, at: micros) { $0.device = device }
                    if type != .session { event.network = ["admob", "unity", "iad"][index % 3 == 0 ? Int(random.next() % 3) : 0] } else { event.network = ""; event.format = nil }
                    events.append(AppEvent(appID: "ktm", event: event))
                }
                _ = try await services.eventStore.store(events)
                try await services.compactor.compactOnce()
            }
            let compare = """
                SELECT count(*)::int FROM rollup_devices_app_day a
                FULL JOIN (SELECT app_id, day, hll_union_agg(devices) AS devices, hll_union_agg(viewers) AS viewers
                           FROM rollup_devices_day_compacted GROUP BY 1, 2) AS u USING (app_id, day)
                WHERE hll_cardinality(a.devices) IS DISTINCT FROM hll_cardinality(u.devices)
                   OR hll_cardinality(a.viewers) IS DISTINCT FROM hll_cardinality(u.viewers)
                """
            #expect(try await Ingest.count(services, "SELECT count(*)::int FROM rollup_devices_app_day") == 4, "three UTC days are four Kathmandu days")
            #expect(try await Ingest.count(services, compare) == 0)
            let migration = try String(contentsOf: Migrator.defaultDirectory(explicit: nil).appendingPathComponent("0022_audience_app_days.sql"), encoding: .utf8)
            let insert = try #require(migration.range(of: "INSERT INTO rollup_devices_app_day")).lowerBound
            try await services.database.pool.query("TRUNCATE rollup_devices_app_day")
            _ = try await services.database.pool.withConnection { try $0.execute(unsafeSQL: String(migration[insert...])) }
            #expect(try await Ingest.count(services, "SELECT count(*)::int FROM rollup_devices_app_day") == 4)
            #expect(try await Ingest.count(services, compare) == 0)
        }
    }

    @Test("revenue_precision splits reported revenue, and the split sums to it; precise_revenue_share is the precise part of revenue, in the report currency")
    func precision() async throws {
        try await withTestApp(flags: Reports.flags) { services, client in
            let keys = try await Ingest.keys(services, app: "prec")
            let t = Reports.micros("2026-01-10T12:00:00Z")
            func paid(_ type: EventType, _ micros: Int64, _ precision: RevenuePrecision?, currency: String = "USD") -> AdEvent {
                Reports.event(type, at: t) { $0.revenueMicros = micros; $0.currency = currency; $0.revenuePrecision = precision }
            }
            // precise 1.00 + 0.10 (a tap), estimated 2.00, publisher_provided 0.25, none given 0.50 (unknown),
            // 1.00 EUR precise (1.10 USD at the day's rate), and two requests without revenue.
            let events = [
                paid(.impression, 1_000_000, .precise), paid(.tap, 100_000, .precise), paid(.impression, 2_000_000, .estimated),
                paid(.impression, 250_000, .publisherProvided), paid(.impression, 500_000, nil), paid(.impression, 1_000_000, .precise, currency: "EUR"),
                Reports.event(.request, at: t), Reports.event(.request, at: t),
            ]
            try await Reports.store(services, app: "prec", events)
            _ = try await services.database.pool.query("INSERT INTO fx_rates (day, base, currency, rate) VALUES ('2026-01-10', 'EUR', 'USD', 1.1), ('2026-01-10', 'EUR', 'EUR', 1)")
            let query = "apps=prec&from=2026-01-10&to=2026-01-10&currency=USD&metrics=reported_revenue,revenue,precise_revenue_share,requests"
            let (status, split) = try await Reports.get(client, keys.read, query + "&dimensions=revenue_precision")
            #expect(status == .ok, "\(split)")
            let rows = (split["rows"] as? [[Any]] ?? []).map { $0.map { $0 is NSNull ? "null" : "\($0)" } }
            // NULL (the requests) sorts last.
            #expect(rows == [
                ["estimated", "2.00", "2.00", "0", "0"],
                ["precise", "2.20", "2.20", "1", "0"],
                ["publisher_provided", "0.25", "0.25", "0", "0"],
                ["unknown", "0.50", "0.50", "0", "0"],
                ["null", "0.00", "0.00", "null", "2"],
            ], "\(rows)")
            let totals = Self.values(split, nil)
            #expect(totals["reported_revenue"] == "4.95" && totals["revenue"] == "4.95", "\(totals)")
            #expect(totals["precise_revenue_share"] == "0.444444", "2.20 / 4.95: \(totals)")
            let (_, whole) = try await Reports.get(client, keys.read, query)
            #expect(Self.values(whole, nil)["precise_revenue_share"] == "0.444444")
            let source = (whole["notes"] as? [String: Any])?["source"] as? String ?? ""
            #expect(source.contains("precise_revenue_share"), "\(source)")
            // A filter on a precision, and a bad one named.
            let precise = try await Reports.rows(client, keys.read, query + "&revenue_precision=precise,unknown")
            #expect(precise.first.map { "\($0[0])" } == "2.70")
            let (bad, body) = try await Reports.get(client, keys.read, query + "&revenue_precision=exact")
            #expect(bad == .badRequest && "\(body)".contains("revenue_precision"), "\(body)")
        }
    }

    @Test("Migrations/0014 on a database with history: viewers sketched from the raw events kept, pending deltas included; older days say they count no viewers")
    func migratedHistory() async throws {
        try await withServices(flags: Reports.flags) { services in
            _ = try await services.appStore.createApp(id: "hist", name: nil, timezone: "UTC", currency: "USD")
            let t = Reports.micros("2026-01-10T12:00:00Z")
            func impression(_ device: String, at micros: Int64) -> AdEvent { Reports.event(.impression, at: micros) { $0.device = device } }
            // Compacted: A B C saw ads, D only asked; pending: E saw one an hour later.
            try await Reports.store(services, app: "hist", [impression("A", at: t), impression("B", at: t), impression("C", at: t), Reports.event(.request, at: t) { $0.device = "D" }])
            try await services.compactor.compactOnce()
            try await Reports.store(services, app: "hist", [impression("E", at: t + 3_600_000_000)])
            let engine = services.reports
            let readable = try await engine.readableApps(only: "hist")
            func dav(_ from: String) async throws -> (viewers: Int64, notes: ReportNotes) {
                let query = try ReportQuery.parse([("apps", "hist"), ("from", from), ("to", "2026-01-10"), ("metrics", "ad_viewers,dav,active_devices")], readable: readable, isAdmin: true)
                let page = try await engine.page(query)
                return (page.totals.adViewers, page.notes)
            }
            #expect(try await dav("2026-01-10").viewers == 4)
            // The database as the previous version left it: no viewer sketches anywhere.
            let pool = services.database.pool
            for table in ["rollup_devices_15m_compacted", "rollup_devices_1h_compacted", "rollup_devices_day_compacted"] {
                try await pool.query(PostgresQuery(unsafeSQL: "ALTER TABLE \(table) DROP COLUMN viewers"))
            }
            let previous = """
                ALTER TABLE rollup_delta DROP COLUMN viewer_hashes;
                ALTER TABLE id_horizon DROP COLUMN viewers_from;
                ALTER TABLE report_series DROP COLUMN sessions, DROP COLUMN dau, DROP COLUMN dav, DROP COLUMN engagement_rate, DROP COLUMN arpdau;
                ALTER TABLE mediation_policies DROP COLUMN rank_by;
                DROP TABLE rollup_devices_app_day
                """
            _ = try await pool.withConnection { try $0.execute(unsafeSQL: previous) }
            let file = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
                .appendingPathComponent("Migrations/0014_audience.sql")
            let migration = try String(contentsOf: file, encoding: .utf8)
            _ = try await pool.withConnection { try $0.execute(unsafeSQL: migration) }
            // And the later one that unions each app's day (Migrations/0022), as the migrator applies them in order.
            let appDays = try String(contentsOf: file.deletingLastPathComponent().appendingPathComponent("0022_audience_app_days.sql"), encoding: .utf8)
            _ = try await pool.withConnection { try $0.execute(unsafeSQL: appDays) }
            // And 0028, which rewrites the sketches those two made without their hashes.
            let noHashes = try String(contentsOf: file.deletingLastPathComponent().appendingPathComponent("0028_sketches_without_hashes.sql"), encoding: .utf8)
            _ = try await pool.withConnection { try $0.execute(unsafeSQL: noHashes) }
            #expect(try await dav("2026-01-10").viewers == 4, "from the raw events, before the pending delta is folded")
            try await services.compactor.compactOnce()
            let after = try await dav("2026-01-10")
            #expect(after.viewers == 4 && after.notes.viewersFrom == nil, "\(after.notes)")
            // A range from before the oldest raw event kept says viewers are missing there.
            #expect(try await dav("2026-01-09").notes.viewersFrom == ReportQuery.parseDate("2026-01-10"))
        }
    }
}
