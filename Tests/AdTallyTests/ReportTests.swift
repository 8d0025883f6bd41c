import AdTallyApp
import AdTallyCore
@testable import AdTallyStorage
import Foundation
import Hummingbird
import HummingbirdTesting
import Testing

@Suite("GET /v1/reports", .serialized)
struct ReportTests {
    /// One UTC day of hand-counted events: 10 requests, 8 impressions (4 priced at
    /// 1.25 USD), 2 loads, 1 error, 3 taps (one priced 0.50), 1 cancel, 2 expiries
    /// (one never shown) on admob; 2 taps and nothing else on iad. The requests come
    /// from 4 devices, iad's taps from one of those and one more: 5 in all.
    static func fixture(_ services: AppServices, app: String) async throws {
        let t = Reports.micros("2026-01-10T12:00:00Z")
        var events: [AdEvent] = []
        events += (0..<10).map { index in Reports.event(.request, at: t) { $0.device = "device-\(index % 4)" } }
        events += (0..<8).map { index in
            Reports.event(.impression, at: t) { if index < 4 { $0.revenueMicros = 1_250_000; $0.currency = "USD" } }
        }
        events += (0..<2).map { _ in Reports.event(.load, at: t, format: .interstitial) }
        events.append(Reports.event(.error, at: t))
        events += (0..<3).map { index in Reports.event(.tap, at: t) { if index == 0 { $0.revenueMicros = 500_000; $0.currency = "USD" } } }
        events.append(Reports.event(.actionCancel, at: t))
        events.append(Reports.event(.expiry, at: t, format: .interstitial) { $0.shown = false })
        events.append(Reports.event(.expiry, at: t, format: .interstitial) { $0.shown = true })
        events += (0..<2).map { index in Reports.event(.tap, at: t, network: "iad") { $0.device = index == 0 ? "device-0" : "device-9" } }
        try await Reports.store(services, app: app, events)
    }

    @Test("every metric matches its hand-computed value; a zero denominator is null, money a decimal string")
    func metricFormulas() async throws {
        try await withTestApp(flags: Reports.flags) { services, client in
            let keys = try await Ingest.keys(services)
            try await Self.fixture(services, app: "demo")
            // The rollups and the raw events (a filter on placement needs them) must agree.
            // (precise_revenue_share reads raw events only: AudienceTests checks it.)
            let all = ReportMetric.allCases.filter { $0 != .preciseRevenueShare }.map(\.rawValue).joined(separator: ",")
            for (compacted, raw) in [(false, false), (false, true), (true, false), (true, true)] {
                if compacted { try await services.compactor.compactOnce() }
                let metrics = all
                let (status, body) = try await Reports.get(client, keys.read, "from=2026-01-10&to=2026-01-10&dimensions=network&metrics=\(metrics)\(raw ? "&placement=default" : "")")
                let source = (body["notes"] as? [String: Any])?["source"] as? String ?? ""
                #expect(source.hasPrefix(raw ? "raw events" : "rollups"), "\(source)")
                #expect(status == .ok)
                let columns = (body["columns"] as? [[String: String]] ?? []).map { $0["name"]! }
                #expect(columns == ["network"] + metrics.split(separator: ",").map(String.init))
                let rows = body["rows"] as? [[Any]] ?? []
                try #require(rows.count == 2, "\(body)")
                func cell(_ row: Int, _ name: String) -> String {
                    let value = rows[row][columns.firstIndex(of: name)!]
                    return value is NSNull ? "null" : "\(value)"
                }
                // admob
                let expected: [String: String] = [
                    "requests": "10", "impressions": "8", "fill_rate": "0.8", "loads": "2", "show_rate": "4", "errors": "1",
                    "error_rate": "0.1", "taps": "3", "ctr": "0.375", "action_cancels": "1", "cancel_rate": "0.333333",
                    "expiries": "2", "expiry_rate": "0.2", "wasted_fills": "1", "revenue": "5.50", "ecpm": "687.50", "rpm": "550.00",
                    "reported_revenue": "5.50", "estimated_revenue": "0.00", "unique_devices": "4",
                    // The audience of one day: the app's 5 devices are active (by network too: the
                    // app's); no impression carries a device, so nobody viewed an ad.
                    "active_devices": "5", "dau": "5", "ad_viewers": "0", "dav": "0", "engagement_rate": "0",
                    "arpdau": "1.100000", "arpdav": "null", "impressions_per_dau": "1.6", "impressions_per_dav": "null", "sessions_per_dau": "0",
                    // No network's policy takes its earnings: the SDK's revenue.
                    "network_revenue": "0.00", "revenue_source": "sdk",
                ]
                for (name, value) in expected where columns.contains(name) { #expect(cell(0, name) == value, "admob \(name), compacted: \(compacted)") }
                // iad: only taps, so every ratio over requests or impressions is null, not 0.
                for name in ["fill_rate", "show_rate", "error_rate", "ctr", "expiry_rate", "ecpm", "rpm"] { #expect(cell(1, name) == "null", "iad \(name)") }
                #expect(cell(1, "taps") == "2")
                #expect(cell(1, "cancel_rate") == "0")
                #expect(cell(1, "revenue") == "0.00")
                let totals = body["totals"] as? [String: Any] ?? [:]
                #expect("\(totals["taps"]!)" == "5")
                #expect("\(totals["ctr"]!)" == "0.625")
                #expect("\(totals["revenue"]!)" == "5.50")
                // Not additive: 4 devices on admob, 2 on iad, 5 in all.
                #expect(cell(1, "unique_devices") == "2")
                #expect("\(totals["unique_devices"]!)" == "5")
            }
        }
    }

    @Test("a raw-served report that starts before the oldest kept raw events says it is incomplete")
    func rawRetentionNote() async throws {
        try await withTestApp(flags: Reports.flags) { services, client in
            let keys = try await Ingest.keys(services)
            try await Self.fixture(services, app: "demo")
            func notes(_ query: String) async throws -> [String: Any] {
                let (status, body) = try await Reports.get(client, keys.read, query)
                #expect(status == .ok)
                return body["notes"] as? [String: Any] ?? [:]
            }
            let before = try await notes("from=2026-01-09&to=2026-01-10&dimensions=placement&metrics=requests")
            #expect((before["incomplete"] as? [String])?.first?.contains("2026-01-10") == true, "\(before)")
            #expect(try await notes("from=2026-01-10&to=2026-01-10&dimensions=placement&metrics=requests")["incomplete"] == nil)
            // The rollups keep every day: a rollup-served report is complete.
            #expect(try await notes("from=2026-01-09&to=2026-01-10&dimensions=network&metrics=requests")["incomplete"] == nil)
        }
    }

    @Test("money is shown in the currency's own precision, rounded half to even")
    func moneyStrings() {
        #expect(Money.format(micros: 1_234_567, currency: "USD") == "1.23")
        #expect(Money.format(micros: 1_235_000, currency: "USD") == "1.24")
        #expect(Money.format(micros: 1_225_000, currency: "USD") == "1.22")
        #expect(Money.format(micros: 1_500_000, currency: "JPY") == "2")
        #expect(Money.format(micros: 2_500_000, currency: "JPY") == "2")
        #expect(Money.format(micros: 1_234_500, currency: "KWD") == "1.234")
        #expect(Money.format(micros: 1_234_501, currency: "KWD") == "1.235")
        #expect(Money.format(micros: 5, currency: "USD") == "0.00")
        #expect(Money.format(micros: (0..<30).reduce(Int128(1)) { value, _ in value * 10 }, currency: "USD") == "1" + String(repeating: "0", count: 24) + ".00")
        // eCPM-like fractions are rounded once: 15,001 micros per 3 impressions x 1000 is 5,000.333 micros.
        #expect(Money.format(micros: 15_001 * 1000, per: 3000, digits: 2) == "0.01")
        #expect(Money.format(micros: 2_500_000, per: 1, digits: 0) == "2")
        #expect(ReportText.ratio(1.0 / 3) == "0.333333")
        #expect(ReportText.ratio(2) == "2")
        #expect(ReportText.ratio(0.0000004) == "0")
        #expect(ReportText.ratio(0.05) == "0.05")
        #expect(ReportText.ratio(-0.5) == "-0.5")
        #expect(ReportText.ratio(12.000001) == "12.000001")
        #expect(Money.format(micros: -1_235_000, currency: "USD") == "-1.24")
        #expect(Money.format(micros: Int128(Int64.max) * 4 + 500_000, currency: "USD") == "36893488147419.60")
    }

    // MARK: - Zones

    /// UTC days around DST changes of New York and London; every 15-minute bucket
    /// holds 1 to 3 requests (so a boundary off by 15 minutes changes some day's count).
    static let windows = ["2025-10-24", "2025-10-31", "2026-03-06", "2026-03-27"]

    static func zoneEvents() -> [AdEvent] {
        var events: [AdEvent] = []
        for window in windows {
            let start = Reports.micros(window + "T00:00:00Z")
            for bucket in 0..<(5 * 96) {
                let micros = start + Int64(bucket) * 900_000_000 + 60_000_000
                for _ in 0..<(bucket % 3 + 1) { events.append(Reports.event(.request, at: micros)) }
            }
        }
        return events
    }

    /// Requests per local date, computed with Foundation's zone data (not PostgreSQL's).
    static func expectedDays(_ events: [AdEvent], zone: String) -> [String: Int] {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: zone)!
        formatter.dateFormat = "yyyy-MM-dd"
        var days: [String: Int] = [:]
        for event in events { days[formatter.string(from: event.occurredAt), default: 0] += 1 }
        return days
    }

    @Test("a day is exactly its local midnights: Kolkata, Kathmandu, and 23- and 25-hour DST days, from every rollup grain")
    func exactDaysInEveryZone() async throws {
        try await withTestApp(flags: Reports.flags) { services, client in
            let keys = try await Ingest.keys(services, app: "utc")
            let zones = ["Asia/Kolkata", "Asia/Kathmandu", "America/New_York", "Europe/London"]
            let events = Self.zoneEvents()
            try await Reports.store(services, app: "utc", events)
            for (index, zone) in zones.enumerated() {
                _ = try await services.appStore.createApp(id: "zone\(index)", name: nil, timezone: zone, currency: "USD")
                try await Reports.store(services, app: "zone\(index)", events.map { var copy = $0; copy.id = UUID(); return copy })
            }
            for compacted in [false, true] {
                if compacted { try await services.compactor.compactOnce() }
                for (index, zone) in zones.enumerated() {
                    let expected = Self.expectedDays(events, zone: zone)
                    for window in Self.windows {
                        let from = ReportQuery.formatDate(ReportQuery.parseDate(window)! + 1)
                        let to = ReportQuery.formatDate(ReportQuery.parseDate(window)! + 3)
                        let range = "from=\(from)&to=\(to)&dimensions=date&metrics=requests"
                        // The app's own zone (daily rollups) and the UTC app read in that zone (hourly + 15-minute).
                        let own = Reports.map(try await Reports.rows(client, keys.admin, "apps=zone\(index)&\(range)"))
                        let other = Reports.map(try await Reports.rows(client, keys.admin, "apps=utc&tz=\(zone)&\(range)"))
                        let raw = try await Reports.rows(client, keys.admin, "apps=utc&tz=\(zone)&from=\(from)&to=\(to)&dimensions=date,platform&metrics=requests")
                        let want = expected.filter { $0.key >= from && $0.key <= to }
                        #expect(own == want, "\(zone) \(window) daily, compacted: \(compacted)")
                        #expect(other == want, "\(zone) \(window) hourly, compacted: \(compacted)")
                        #expect(Reports.map(raw) == want, "\(zone) \(window) raw events")
                    }
                }
            }

            // Weeks and months together (they do not nest): the month turns at local midnight
            // of 1 April, 18:30 UTC, inside an hour that lies in one ISO week.
            let local = Self.expectedDays(events, zone: "Asia/Kolkata")
            var wanted: [String: Int] = [:]
            for (day, count) in local where day >= "2026-03-28" && day <= "2026-04-01" {
                let number = ReportQuery.parseDate(day)!
                let monday = number - ((number + 3) % 7)
                wanted[ReportQuery.formatDate(monday) + "|" + String(day.prefix(7)), default: 0] += count
            }
            let weekMonth = try await Reports.rows(client, keys.admin, "apps=utc&tz=Asia/Kolkata&from=2026-03-28&to=2026-04-01&dimensions=week,month&metrics=requests")
            var got: [String: Int] = [:]
            for row in weekMonth { got["\(row[0])|\(row[1])"] = (row[2] as? NSNumber)?.intValue }
            #expect(got == wanted)

            // The notes name the short and long days, with their length.
            let (_, body) = try await Reports.get(client, keys.admin, "apps=zone2&from=2025-11-01&to=2025-11-03&dimensions=date&metrics=requests")
            let notes = body["notes"] as? [String: Any] ?? [:]
            let lengths = notes["day_lengths"] as? [[String: Any]] ?? []
            #expect(lengths.count == 1)
            #expect(lengths.first?["date"] as? String == "2025-11-02")
            #expect((lengths.first?["hours"] as? NSNumber)?.intValue == 25)
            let (_, london) = try await Reports.get(client, keys.admin, "apps=zone3&from=2026-03-29&to=2026-03-29&metrics=requests")
            let londonLengths = (london["notes"] as? [String: Any])?["day_lengths"] as? [[String: Any]] ?? []
            #expect((londonLengths.first?["hours"] as? NSNumber)?.intValue == 23)

            // A repeated local hour is two rows, told apart by their offsets; a skipped one is absent.
            let fallBack = try await Reports.rows(client, keys.admin, "apps=zone2&from=2025-11-02&to=2025-11-02&dimensions=hour&metrics=requests")
            let hours = fallBack.map { "\($0[0])" }
            #expect(hours.count == 25)
            #expect(hours.contains("2025-11-02T01:00:00-04:00"))
            #expect(hours.contains("2025-11-02T01:00:00-05:00"))
            #expect(hours.sorted() == hours)
            // East of UTC the repeated hour still comes in time order (+01:00, then +00:00).
            let londonFallBack = try await Reports.rows(client, keys.admin, "apps=zone3&from=2025-10-26&to=2025-10-26&dimensions=hour&metrics=requests")
                .map { "\($0[0])" }
            #expect(londonFallBack.count == 25)
            let repeated = londonFallBack.filter { $0.hasPrefix("2025-10-26T01:") }
            #expect(repeated == ["2025-10-26T01:00:00+01:00", "2025-10-26T01:00:00+00:00"])
            let springForward = try await Reports.rows(client, keys.admin, "apps=zone3&from=2026-03-29&to=2026-03-29&dimensions=hour&metrics=requests")
            #expect(springForward.count == 23)
            #expect(!springForward.contains { "\($0[0])".hasPrefix("2026-03-29T01:") })
            let kolkata = try await Reports.rows(client, keys.admin, "apps=utc&tz=Asia/Kolkata&from=2026-03-07&to=2026-03-07&dimensions=hour&metrics=requests")
            #expect(kolkata.count == 24)
            #expect("\(kolkata[0][0])" == "2026-03-07T00:00:00+05:30")
            #expect(kolkata.reduce(0) { $0 + (($1[1] as? NSNumber)?.intValue ?? 0) } == Self.expectedDays(events, zone: "Asia/Kolkata")["2026-03-07"])
        }
    }

    // MARK: - Query features

    static func networkEvents(_ services: AppServices, app: String) async throws {
        let day = Reports.micros("2026-02-02T10:00:00Z")
        var events: [AdEvent] = []
        for (network, requests, revenue): (String, Int, Int64) in [("admob", 30, 2_000_000), ("iad", 20, 9_000_000), ("nend", 10, 1_000_000)] {
            for offset: Int64 in [0, -7 * 86_400_000_000] {  // this week and the week before
                events += (0..<requests).map { _ in Reports.event(.request, at: day + offset, network: network) }
                events.append(Reports.event(.impression, at: day + offset, network: network) {
                    $0.revenueMicros = revenue * (offset == 0 ? 2 : 1); $0.currency = "USD"
                })
            }
        }
        events.append(Reports.event(.request, at: day, network: "admob") { $0.placement = "=HYPERLINK(\"http://x\")"; $0.country = "JP" })
        events.append(Reports.event(.request, at: day, network: "admob") { $0.placement = "menu, \"top\""; $0.country = "JP" })
        try await Reports.store(services, app: app, events)
    }

    @Test("filters, sort and compare (previous period and year over year)")
    func filtersSortCompare() async throws {
        try await withTestApp(flags: Reports.flags) { services, client in
            let keys = try await Ingest.keys(services)
            try await Self.networkEvents(services, app: "demo")
            let week = "from=2026-01-27&to=2026-02-02"
            let filtered = try await Reports.rows(client, keys.read, "\(week)&dimensions=network&metrics=requests&network=iad,nend")
            #expect(filtered.map { "\($0[0])" } == ["iad", "nend"])
            let sorted = try await Reports.rows(client, keys.read, "\(week)&dimensions=network&metrics=requests,revenue&sort=-revenue")
            #expect(sorted.map { "\($0[0])" } == ["iad", "admob", "nend"])
            #expect(sorted.map { "\($0[2])" } == ["18.00", "4.00", "2.00"])
            let byRequests = try await Reports.rows(client, keys.read, "\(week)&dimensions=network&metrics=requests&sort=requests")
            #expect(byRequests.map { "\($0[0])" } == ["nend", "iad", "admob"])
            let bannerOnly = try await Reports.rows(client, keys.read, "\(week)&dimensions=network&metrics=requests&format=banner&network=nend")
            #expect(bannerOnly.map { "\($0[1])" } == ["10"])
            let noInterstitial = try await Reports.rows(client, keys.read, "\(week)&dimensions=network&metrics=requests&format=interstitial")
            #expect(noInterstitial.isEmpty)

            let (status, body) = try await Reports.get(client, keys.read, "\(week)&dimensions=network&metrics=requests,revenue&compare=previous_period")
            #expect(status == .ok)
            let columns = (body["columns"] as? [[String: String]] ?? []).map { $0["name"]! }
            #expect(columns == ["network", "requests", "requests_previous", "requests_change", "revenue", "revenue_previous", "revenue_change"])
            let rows = body["rows"] as? [[Any]] ?? []
            let iad = rows.first { "\($0[0])" == "iad" } ?? []
            #expect(iad.map { "\($0)" } == ["iad", "20", "20", "0", "18.00", "9.00", "1"])
            let totals = body["totals"] as? [String: Any] ?? [:]
            #expect("\(totals["revenue_previous"]!)" == "12.00")
            #expect("\(totals["revenue_change"]!)" == "1")
            let byDate = try await Reports.rows(client, keys.read, "from=2026-02-02&to=2026-02-02&dimensions=date&metrics=requests&compare=previous_period")
            #expect(byDate.map { $0.map { "\($0)" } } == [["2026-02-02", "62", "0", "<null>"]])
            let weekly = try await Reports.rows(client, keys.read, "from=2026-02-02&to=2026-02-08&dimensions=date&metrics=requests&compare=previous_period")
            #expect(weekly.first.map { $0.map { "\($0)" } } == ["2026-02-02", "62", "60", "0.033333"])
            let yearly = try await Reports.rows(client, keys.read, "from=2027-02-02&to=2027-02-02&dimensions=date&metrics=requests&compare=year_over_year")
            #expect(yearly.isEmpty)
            let (_, yoy) = try await Reports.get(client, keys.read, "from=2027-02-02&to=2027-02-02&metrics=requests&compare=year_over_year")
            #expect("\((yoy["totals"] as? [String: Any])?["requests_previous"] ?? "")" == "62")
        }
    }

    @Test("keyset paging: by a metric with ties and NULLs every row comes once; rows moving before the cursor neither repeat nor push others out")
    func keysetPaging() async throws {
        try await withTestApp(flags: Reports.flags) { services, client in
            let keys = try await Ingest.keys(services)
            let at = Reports.micros("2026-01-05T10:00:00Z")
            // 12 networks: requests 10, 20, …, with ties (every third repeats); every fourth has
            // impressions only (no requests: fill_rate is NULL, sorted last).
            var events: [AdEvent] = []
            for n in 0..<12 {
                let requests = n % 4 == 3 ? 0 : 10 * (n - n % 3 + 1)
                events += (0..<requests).map { _ in Reports.event(.request, at: at, network: "net\(n)") }
                events += (0..<(n + 1)).map { _ in Reports.event(.impression, at: at, network: "net\(n)") }
            }
            try await Reports.store(services, app: "demo", events)
            func walk(_ query: String, between: (Int) async throws -> Void = { _ in }) async throws -> [String] {
                var seen: [String] = []
                var cursor: String?
                var pages = 0
                repeat {
                    let (status, body) = try await Reports.get(client, keys.read, query + (cursor.map { "&cursor=\($0)" } ?? ""))
                    #expect(status == .ok, "\(body)")
                    seen += (body["rows"] as? [[Any]] ?? []).map { "\($0[0])" }
                    cursor = body["next_cursor"] as? String
                    pages += 1
                    try await between(pages)
                } while cursor != nil && pages < 50
                return seen
            }
            let base = "from=2026-01-05&to=2026-01-05&dimensions=network&metrics=requests,fill_rate&tz=UTC&limit=5"
            for sort in ["-requests", "requests", "-fill_rate", "fill_rate,-network"] {
                let all = try await Reports.rows(client, keys.read, base.replacingOccurrences(of: "limit=5", with: "limit=100") + "&sort=\(sort)").map { "\($0[0])" }
                #expect(try await walk(base + "&sort=\(sort)") == all, "sort=\(sort)")
                #expect(all.count == 12)
            }
            // After the first page, the last rows jump ahead of it: the rest still come once each.
            let moved = try await walk(base + "&sort=-requests") { page in
                guard page == 1 else { return }
                try await Reports.store(services, app: "demo", (0..<500).map { _ in Reports.event(.request, at: at, network: "net0") })
                try await services.compactor.compactOnce()
            }
            // Page 1 was net10, net9, net6, net8, net4 (100, 100, 70, 70, 40; ties by name); net0
            // (10) then jumped to the front. An offset would have shown net4 again and
            // net0 never; the keyset goes on after net4: every other row once.
            #expect(moved == ["net10", "net9", "net6", "net8", "net4", "net5", "net1", "net2", "net11", "net3", "net7"], "\(moved)")
        }
    }

    @Test("following next_cursor returns every row exactly once; a cursor of another query is refused")
    func cursorPaging() async throws {
        try await withTestApp(flags: Reports.flags) { services, client in
            let keys = try await Ingest.keys(services)
            let start = Reports.micros("2026-01-01T00:00:00Z")
            try await Reports.store(services, app: "demo", (0..<(24 * 10)).map { Reports.event(.request, at: start + Int64($0) * 3_600_000_000) })
            let query = "from=2026-01-01&to=2026-01-10&dimensions=hour&metrics=requests&tz=UTC&limit=7"
            var seen: [String] = []
            var cursor: String?
            var pages = 0
            repeat {
                let (status, body) = try await Reports.get(client, keys.read, query + (cursor.map { "&cursor=\($0)" } ?? ""))
                #expect(status == .ok)
                seen += (body["rows"] as? [[Any]] ?? []).map { "\($0[0])" }
                #expect("\((body["totals"] as? [String: Any])?["requests"] ?? "")" == "240")
                cursor = body["next_cursor"] as? String
                pages += 1
            } while cursor != nil && pages < 100
            #expect(seen.count == 240)
            #expect(Set(seen).count == 240)
            #expect(seen == seen.sorted())
            #expect(pages == 35)

            let (_, first) = try await Reports.get(client, keys.read, query)
            let next = try #require(first["next_cursor"] as? String)
            let (status, body) = try await Reports.get(client, keys.read, "from=2026-01-01&to=2026-01-09&dimensions=hour&metrics=requests&tz=UTC&limit=7&cursor=\(next)")
            #expect(status == .badRequest)
            #expect((body["detail"] as? String ?? "").hasPrefix("cursor:"))
            let (forged, _) = try await Reports.get(client, keys.read, query + "&cursor=c1.zz.0000")
            #expect(forged == .badRequest)
        }
    }

    @Test("CSV is RFC 4180 with CRLF, streamed; a formula cell comes back neutralised, numbers stay numbers")
    func csv() async throws {
        try await withTestApp(flags: Reports.flags) { services, client in
            let keys = try await Ingest.keys(services)
            try await Self.networkEvents(services, app: "demo")
            let query = "from=2026-02-02&to=2026-02-02&dimensions=placement,country&metrics=requests,fill_rate,revenue&sort=placement"
            var acceptCSV = Reports.headers(keys.read)
            acceptCSV[.accept] = "text/csv"
            for (uri, headers) in [("/v1/reports?\(query)&format=csv", Reports.headers(keys.read)), ("/v1/reports?\(query)", acceptCSV)] {
                try await client.execute(uri: uri, method: .get, headers: headers) { response in
                    #expect(response.status == .ok)
                    #expect(response.headers[.contentType]?.hasPrefix("text/csv") == true)
                    let text = String(buffer: response.body)
                    let records = try #require(Reports.strictCSV(text), "not RFC 4180: \(text)")
                    #expect(records.first == ["placement", "country", "requests", "fill_rate", "revenue"])
                    #expect(records.count == 4)
                    #expect(records.contains(["'=HYPERLINK(\"http://x\")", "JP", "1", "0", "0.00"]))
                    #expect(records.contains(["menu, \"top\"", "JP", "1", "0", "0.00"]))
                    #expect(records.contains(["default", "ZZ", "60", "0.05", "24.00"]))
                    #expect(text.contains("\"'=HYPERLINK(\"\"http://x\"\")\""))
                }
            }
        }
    }

    @Test("every bad parameter is a 400 that names it")
    func badParameters() async throws {
        try await withTestApp(flags: Reports.flags) { services, client in
            let keys = try await Ingest.keys(services)
            let cases: [(String, String)] = [
                ("from=2026-13-01", "from"), ("to=yesterday", "to"), ("from=2026-02-02&to=2026-02-01", "to"), ("tz=Mars/Olympus", "tz"),
                ("dimensions=date,color", "dimensions"), ("dimensions=date,date", "dimensions"), ("metrics=clicks", "metrics"),
                ("currency=XYZ", "currency"), ("sort=revenue2", "sort"), ("dimensions=date&sort=network", "sort"), ("limit=0", "limit"),
                ("limit=100001", "limit"), ("limit=ten", "limit"), ("cursor=abc", "cursor"), ("compare=last_week", "compare"),
                ("format=xml", "format"), ("format=csv,banner", "format"), ("colour=red", "colour"), ("days=0", "days"),
                ("days=3&from=2026-01-01", "days"), ("error_code=abc", "error_code"), ("platform=windows", "platform"),
                ("date=2026-02-30", "date"), ("week=2026-02-04", "week"), ("month=2026-1", "month"), ("network=", "network"), ("apps=demo,nope", "apps"),
                ("from=2000-01-01&to=2026-01-01", "from"), ("from=0001-01-01&to=0001-01-01&compare=previous_period", "from"),
            ]
            for (query, parameter) in cases {
                let (status, body) = try await Reports.get(client, keys.admin, query)
                #expect(status == .badRequest, "\(query)")
                #expect((body["detail"] as? String ?? "").hasPrefix(parameter + ":"), "\(query): \(body["detail"] ?? "")")
            }
        }
    }

    @Test("access: a read key reads its own app only, an admin key every app, an ingest key nothing")
    func accessMatrix() async throws {
        try await withTestApp(flags: Reports.flags) { services, client in
            let keys = try await Ingest.keys(services, app: "one")
            _ = try await services.appStore.createApp(id: "two", name: nil)
            let otherRead = try await services.appStore.createKey(app: "two", scope: .read).secret
            #expect(try await Reports.get(client, keys.read, "apps=one").status == .ok)
            #expect(try await Reports.get(client, keys.read, "").status == .ok)
            #expect(try await Reports.get(client, keys.read, "apps=two").status == .forbidden)
            #expect(try await Reports.get(client, keys.read, "apps=one,two").status == .forbidden)
            #expect(try await Reports.get(client, otherRead, "apps=one").status == .forbidden)
            #expect(try await Reports.get(client, keys.ingest, "apps=one").status == .forbidden)
            #expect(try await Reports.get(client, "atk_" + String(repeating: "0", count: 48), "").status == .unauthorized)
            let (status, body) = try await Reports.get(client, keys.admin, "dimensions=app")
            #expect(status == .ok)
            #expect((body["query"] as? [String: Any])?["apps"] as? [String] == ["one", "two"])
            #expect(try await Reports.get(client, keys.read, "app=two").status == .forbidden)
            #expect(try await Reports.get(client, keys.admin, "apps=one&app=two").status == .badRequest)
        }
    }

    @Test("revenue in a currency the report cannot convert is a 422 naming the currency and date")
    func foreignCurrency() async throws {
        try await withTestApp(flags: Reports.flags) { services, client in
            let keys = try await Ingest.keys(services)
            let t = Reports.micros("2026-03-03T23:30:00Z")
            try await Reports.store(services, app: "demo", [
                Reports.event(.impression, at: t) { $0.revenueMicros = 100; $0.currency = "JPY" },
                Reports.event(.impression, at: t, network: "iad") { $0.revenueMicros = 100; $0.currency = "USD" },
            ])
            for compacted in [false, true] {
                if compacted { try await services.compactor.compactOnce() }
                let (status, body) = try await Reports.get(client, keys.read, "from=2026-03-01&to=2026-03-05&metrics=requests,revenue")
                #expect(status == .unprocessableContent)
                let detail = body["detail"] as? String ?? ""
                #expect(detail.contains("JPY") && detail.contains("2026-03-03"), "\(detail)")
                #expect(try await Reports.get(client, keys.read, "from=2026-03-01&to=2026-03-05&metrics=requests,revenue&network=iad").status == .ok)
                #expect(try await Reports.get(client, keys.read, "from=2026-03-01&to=2026-03-05&metrics=requests,taps").status == .ok)
                let (_, jpy) = try await Reports.get(client, keys.read, "from=2026-03-01&to=2026-03-05&metrics=revenue&currency=JPY&network=admob")
                #expect("\((jpy["totals"] as? [String: Any])?["revenue"] ?? "")" == "0")
            }
        }
    }
}

@Suite("Reports and ingest share nothing they could run out of")
struct ReportPoolTests {
    @Test("while every report connection is taken, ingest still commits at once")
    func reportsDoNotStarveIngest() async throws {
        var flags = Reports.flags
        flags.poolSize = 2
        try await withTestApp(flags: flags) { services, client in
            let keys = try await Ingest.keys(services)
            let pool = services.reports.reads.primary
            // Hold as many report transactions as the engine can have open, and one more waiting.
            var releases: [AsyncStream<Void>.Continuation] = []
            var holders: [Task<Void, any Error>] = []
            for _ in 0...Database.reportConnections {
                let (stream, release) = AsyncStream<Void>.makeStream()
                releases.append(release)
                holders.append(Task { try await pool.withLease { _ in for await _ in stream { break } } })
            }
            for _ in 0..<200 where pool.openConnections < Database.reportConnections { try await Task.sleep(for: .milliseconds(10)) }
            #expect(pool.openConnections == Database.reportConnections)
            try await client.execute(uri: "/v1/events", method: .post, headers: Ingest.headers(keys.ingest), body: Ingest.body([Ingest.event()])) { response in
                #expect(response.status == .ok)
            }
            for release in releases { release.yield(); release.finish() }
            for holder in holders { try await holder.value }
        }
    }
}
