import AdTallyApp
import AdTallyCore
@testable import AdTallyStorage
import Foundation
import PostgresKit
import Testing

/// The install grains of Migrations/0023_installs.sql: written by the ingest path as
/// deltas, folded by the compactor, and equal to what the migration builds from the
/// raw events.
@Suite("Installs and their days")
struct InstallsTests {
    /// 2026-03-01 00:00 UTC.
    static let start: Int64 = 1_772_323_200 * 1_000_000
    static let hour: Int64 = 3_600 * 1_000_000

    static func event(
        _ app: String, _ device: String?, _ type: EventType, at micros: Int64, network: String = "admob", country: String = "NP",
        revenue: Int64? = nil, currency: String? = nil, platform: Platform? = .ios, version: String? = "1.0"
    ) -> AppEvent {
        AppEvent(appID: app, event: AdEvent(
            id: UUID(), type: type, occurredAtMicros: micros, network: type == .session ? "" : network,
            format: type == .session ? nil : .banner, country: country, platform: platform, appVersion: version, device: device,
            revenueMicros: revenue, currency: currency,
            willLeave: type == .tap ? false : nil
        ))
    }

    /// Ten days of a few devices in Asia/Kathmandu (+05:45: local midnight cuts a UTC hour):
    /// sessions, requests, impressions with and without reported revenue, taps.
    static func history(_ app: String) -> [AppEvent] {
        var events: [AppEvent] = []
        for day in 0..<10 {
            let base = start + Int64(day) * 24 * hour
            for device in 0..<6 where day % (device + 1) == 0 {
                let name = "dev-\(device)"
                // 18:00-18:30 UTC straddles Kathmandu's midnight (18:15 UTC).
                events.append(event(app, name, .session, at: base + 18 * hour + Int64(device) * 60_000_000, platform: device % 2 == 0 ? .ios : .android))
                events.append(event(app, name, .request, at: base + 18 * hour + 20 * 60_000_000))
                events.append(event(app, name, .impression, at: base + 18 * hour + 25 * 60_000_000, network: device % 2 == 0 ? "admob" : "unity",
                                    revenue: device % 3 == 0 ? 1_500 : nil, currency: device % 3 == 0 ? "JPY" : nil))
                if device == 1 { events.append(event(app, name, .tap, at: base + 3 * hour, country: "IN")) }
            }
        }
        events.append(event(app, nil, .request, at: start + hour))
        return events
    }

    /// installs, install_days and install_day_revenue, as one comparable string.
    static func state(_ services: AppServices) async throws -> String {
        try await services.database.pool.query("""
            SELECT concat_ws(' | ',
              (SELECT string_agg(concat_ws(',', app_id, device, first_seen, day, country, platform, app_version), ';' ORDER BY app_id, device) FROM installs),
              (SELECT string_agg(concat_ws(',', app_id, device, day, cohort, events, requests, impressions, taps, sessions), ';' ORDER BY app_id, device, day) FROM install_days),
              (SELECT string_agg(concat_ws(',', app_id, device, day, cohort, hour, network, format, country, currency, impressions, taps, revenue_micros,
                                           priced_events, unpriced_impressions, unpriced_taps), ';' ORDER BY app_id, device, day, hour, network, format, country, currency)
               FROM install_day_revenue))
            """).first?.decode(0, as: String.self) ?? ""
    }

    /// The same four tables rebuilt from the raw events by the migration's own statements.
    static func fromRawEvents(_ services: AppServices) async throws -> String {
        let migration = try String(contentsOf: Migrator.defaultDirectory(explicit: nil).appendingPathComponent("0023_installs.sql"), encoding: .utf8)
        let history = try #require(migration.range(of: "-- History:")).lowerBound
        try await services.database.pool.withTransaction { connection in
            _ = try connection.execute(unsafeSQL: "TRUNCATE installs, install_days, install_day_revenue")
            _ = try connection.execute(unsafeSQL: String(migration[history...]))
        }
        return try await state(services)
    }

    @Test("ingest and compaction keep each device's install and days, equal to the migration's from the raw events")
    func compactedEqualsRaw() async throws {
        try await withServices { services in
            _ = try await services.appStore.createApp(id: "k", name: nil, timezone: "Asia/Kathmandu")
            _ = try await services.appStore.createApp(id: "u", name: nil)
            let events = Self.history("k") + Self.history("u")
            // Later days first: the earlier ones arrive late (an offline device's queue) and
            // move those devices' installs back.
            let late = events.filter { $0.event.occurredAtMicros < Self.start + 3 * 24 * Self.hour }
            let early = events.filter { $0.event.occurredAtMicros >= Self.start + 3 * 24 * Self.hour }
            #expect(try await services.eventStore.store(early).allSatisfy { $0 })
            #expect(try await Self.count(services, "install_delta") > 0)
            try await services.compactor.compactOnce()
            #expect(try await Self.count(services, "install_delta") == 0)
            let before = try await services.database.pool.query("SELECT day::text FROM installs WHERE app_id = 'k' AND device = 'dev-0'").first?.decode(0, as: String.self)
            #expect(before == "2026-03-04", "dev-0 is first seen on day 3 until the late events come: 18:00 UTC is 23:45 in Kathmandu")
            #expect(try await services.eventStore.store(late).allSatisfy { $0 })
            // The same batch again (a retry): nothing new, nothing counted twice.
            #expect(try await services.eventStore.store(late).allSatisfy { !$0 })
            try await services.compactor.compactOnce()
            let compacted = try await Self.state(services)
            let moved = try await services.database.pool.query("SELECT day::text, platform FROM installs WHERE app_id = 'k' AND device = 'dev-0'").first
            #expect(try moved?.decode(0, as: String.self) == "2026-03-01", "a late event moves the device to the earlier cohort")
            // Kathmandu's day: dev-5's 18:05 UTC session is 23:50 local; its 18:25 impression is the next day.
            #expect(try await Self.count(services, "install_days WHERE app_id = 'k' AND device = 'dev-5'") == 4)
            #expect(try await Self.count(services, "install_days WHERE app_id = 'u' AND device = 'dev-5'") == 2)
            #expect(try await Self.count(services, "installs WHERE device IS NULL") == 0)
            #expect(try await Self.count(services, "installs") == 12)
            #expect(try await Self.count(services, "install_days d JOIN installs i USING (app_id, device) WHERE d.cohort <> i.day") == 0,
                    "every day of a moved install follows it")
            #expect(try await Self.count(services, "install_day_revenue d JOIN installs i USING (app_id, device) WHERE d.cohort <> i.day") == 0)
            #expect(compacted == (try await Self.fromRawEvents(services)))
        }
    }

    @Test("ties at one instant keep the same install whatever order they arrive in")
    func tiesDoNotDependOnOrder() async throws {
        for order in [false, true] {
            try await withServices { services in
                _ = try await services.appStore.createApp(id: "t", name: nil)
                let a = Self.event("t", "d", .session, at: Self.start, platform: .android, version: "2.0")
                let b = Self.event("t", "d", .session, at: Self.start, platform: .android, version: "1.0")
                for item in order ? [a, b] : [b, a] {
                    _ = try await services.eventStore.store([item])
                    try await services.compactor.compactOnce()
                }
                let version = try await services.database.pool.query("SELECT app_version FROM installs").first?.decode(0, as: String.self)
                #expect(version == "1.0", "order \(order)")
            }
        }
    }

    static func count(_ services: AppServices, _ from: String) async throws -> Int {
        try await services.database.pool.query("SELECT count(*)::int FROM \(unsafeRaw: from)").first?.decode(0, as: Int.self) ?? -1
    }
}
