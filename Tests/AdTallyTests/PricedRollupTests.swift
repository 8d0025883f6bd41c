import AdTallyApp
import AdTallyCore
@testable import AdTallyStorage
import Foundation
import PostgresKit
import Testing

/// Priced rollups (issue 25, Migrations/0012) against the query-time path they replace:
/// the same reports, to the micro, across card changes, FX changes and DST days, in
/// every zone and source, with deltas pending and compacted.
@Suite("Priced rollups: the same answers as pricing at query time", .serialized)
struct PricedRollupTests {
    /// The two DST changes of 2026 in New York (Mar 8: 23 hours; Nov 1: 25 hours), a day either side.
    static let windows = [("2026-03-07", "2026-03-09"), ("2026-10-31", "2026-11-02")]

    /// Unpriced impressions and taps in four countries, and reported revenue in three
    /// currencies, every 2 h 35 min (so every quarter of an hour is hit over the days, and
    /// every local midnight of the zones has events on both sides), for three apps.
    static func events(day: String, app: Int, seed: Int) -> [AdEvent] {
        var events: [AdEvent] = []
        let start = Reports.micros("\(day)T00:00:00Z")
        let countries = ["US", "JP", "DE", "BR"]
        for step in 0..<10 {
            let at = start + Int64(step) * 155 * 60_000_000 + Int64(app) * 7 * 60_000_000
            let network = step % 3 == 0 ? "unity" : "admob"
            let format: AdFormat = step % 2 == 0 ? .banner : .rewarded
            let country = countries[(step + app + seed) % countries.count]
            for n in 0..<(3 + (step * 7 + seed) % 11) {
                events.append(Reports.event(.impression, at: at, network: network, format: format) { $0.country = country })
                if n % 4 == 0 { events.append(Reports.event(.tap, at: at, network: network, format: format) { $0.country = country }) }
            }
            let (micros, currency): (Int64, String) = [(1_234_567, "USD"), (150_000_000, "JPY"), (987_001, "EUR")][(step + seed) % 3]
            events.append(Reports.event(.impression, at: at, network: network, format: format) {
                $0.country = country; $0.revenueMicros = micros + Int64(step); $0.currency = currency
            })
            events.append(Reports.event(.request, at: at, network: network, format: format))
        }
        return events
    }

    static let apps = [("ny", "America/New_York", "USD"), ("kol", "Asia/Kolkata", "EUR"), ("utc", "UTC", "JPY")]

    /// The card: amounts with thousandths of a micro, country entries in other currencies,
    /// entries that start inside the windows (at UTC midnight).
    static let card: [(String, String, String, String, String, String, String)] = [
        ("admob", "banner", "*", "USD", "1.234567", "0.05", "2026-03-01"),
        ("admob", "banner", "US", "EUR", "2.5", "0.1", "2026-03-08"),
        ("admob", "rewarded", "*", "USD", "9.87", "0.333", "2026-01-01"),
        ("admob", "rewarded", "JP", "JPY", "1200", "40", "2026-11-01"),
        ("unity", "banner", "DE", "EUR", "0.777", "0", "2026-01-01"),
        ("unity", "rewarded", "*", "USD", "3.003", "0.011", "2026-10-31"),
    ]

    static func rates(_ card: [(String, String, String, String, String, String, String)]) throws -> [RateCardEntry] {
        try card.map { try RateCardEntry.parse(network: $0.0, format: $0.1, country: $0.2, currency: $0.3, cpm: $0.4, cpt: $0.5, effectiveFrom: $0.6) }
    }

    /// EUR-based rates for every UTC day of the windows (and the day after the last).
    static func fx(shift: Double = 0) throws -> [FXRate] {
        var rates: [FXRate] = []
        for (index, day) in ["2026-03-06", "2026-03-07", "2026-03-08", "2026-03-09", "2026-03-10", "2026-10-30", "2026-10-31", "2026-11-01", "2026-11-02", "2026-11-03"].enumerated() {
            rates.append(try FXRate.parse(date: day, base: "EUR", currency: "USD", rate: String(format: "%.4f", 1.0731 + Double(index) * 0.0013 + shift)))
            rates.append(try FXRate.parse(date: day, base: "EUR", currency: "JPY", rate: String(format: "%.2f", 161.37 + Double(index) * 0.29 + shift)))
        }
        return rates
    }

    /// The reports compared: each source (own-zone days, hours with cut hours in other
    /// zones), several groupings and currencies, every app together.
    static func queries() -> [[(String, String)]] {
        var queries: [[(String, String)]] = []
        let metrics = ("metrics", "revenue,reported_revenue,estimated_revenue,impressions,taps,ecpm")
        for (from, to) in windows {
            let range = [("from", from), ("to", to), metrics]
            queries.append([("apps", "ny"), ("dimensions", "date,network")] + range)
            queries.append([("apps", "ny"), ("dimensions", "hour,format")] + range)
            queries.append([("apps", "ny"), ("dimensions", "date"), ("tz", "Asia/Kolkata"), ("currency", "EUR")] + range)
            queries.append([("apps", "kol"), ("dimensions", "date,format,network")] + range)
            queries.append([("apps", "kol"), ("dimensions", "week"), ("tz", "America/New_York"), ("currency", "JPY")] + range)
            queries.append([("apps", "utc"), ("dimensions", "month,app")] + range)
            queries.append([("dimensions", "app,date"), ("currency", "EUR")] + range)
            queries.append([("dimensions", "network"), ("tz", "Asia/Kathmandu")] + range)
            queries.append([("apps", "ny,kol"), ("dimensions", "country")] + range)
        }
        return queries
    }

    /// Every query's rows and totals, as text to compare.
    static func answers(_ services: AppServices) async throws -> [String] {
        var answers: [String] = []
        for parameters in queries() {
            let document = try await MoneyTests.page(services, parameters)
            let rows = document.rows.map { row in
                "\(row.dimensions.map { $0 ?? "-" }.joined(separator: "/")) rep=\(row.counts.reportedMicros) est=\(row.counts.estimatedMicros) imp=\(row.counts.impressions) taps=\(row.counts.taps)"
            }
            let totals = "totals rep=\(document.totals.reportedMicros) est=\(document.totals.estimatedMicros) unrated=\(document.totals.unratedEvents)"
            answers.append(([parameters.map { "\($0.0)=\($0.1)" }.joined(separator: "&")] + rows + [totals]).joined(separator: "\n"))
        }
        return answers
    }

    /// The answers of the query-time path: every app's every network and format dirty
    /// for the call (rows marked as the test's own), so no report reads a priced row.
    static func queryTimeAnswers(_ services: AppServices) async throws -> [String] {
        let pool = services.database.pool
        try await pool.query("""
            INSERT INTO rollup_dirty (app_id, network, format, from_day, to_day, marked_at)
            SELECT DISTINCT app_id, network, format, '-infinity'::date, 'infinity'::date, 'epoch'::timestamptz FROM rollup_1h_compacted
            UNION SELECT DISTINCT app_id, network, format, '-infinity'::date, 'infinity'::date, 'epoch'::timestamptz FROM rollup_delta
            """)
        let answers = try await Self.answers(services)
        try await pool.query("DELETE FROM rollup_dirty WHERE marked_at = 'epoch'::timestamptz")
        return answers
    }

    static func dirtyRanges(_ services: AppServices) async throws -> Int {
        try await services.database.pool.query("SELECT count(*) FROM rollup_dirty").first!.decode(0, as: Int.self)
    }

    /// The answers now, which must equal the query-time path's; returns them.
    @discardableResult
    static func expectSame(_ services: AppServices, _ label: String, sourceLocation: SourceLocation = #_sourceLocation) async throws -> [String] {
        let now = try await answers(services)
        let oracle = try await queryTimeAnswers(services)
        for (mine, theirs) in zip(now, oracle) where mine != theirs {
            Issue.record("\(label): priced rollups and the query-time path differ\n--- priced:\n\(mine)\n--- query time:\n\(theirs)", sourceLocation: sourceLocation)
        }
        return now
    }

    /// Every app's events on the windows' days, compacted (priced as they are folded) and re-priced.
    static func storeCompactedWindows(_ services: AppServices) async throws {
        for (index, app) in apps.enumerated() {
            for (from, to) in windows {
                for (seed, day) in [from, to].enumerated() { try await Reports.store(services, app: app.0, events(day: day, app: index, seed: seed)) }
            }
        }
        try await services.compactor.compactOnce()
        try await services.compactor.reprice(for: .seconds(120))
    }

    /// The three apps, the card and the FX rates; the store that set them.
    static func setUp(_ services: AppServices) async throws -> MoneyStore {
        for (id, zone, currency) in apps {
            _ = try await services.appStore.createApp(id: id, name: nil, timezone: zone, currency: currency)
        }
        let money = MoneyStore(pool: services.database.pool)
        try await money.setRates(try rates(card))
        _ = try await money.importFX(try fx())
        return money
    }

    @Test("reports from priced rollups equal the query-time path across card changes, FX changes and DST days; a change shows in the next report")
    func sameAsQueryTime() async throws {
        try await withServices(flags: Reports.flags) { services in
            let money = try await Self.setUp(services)
            // Most events compacted (priced as they are folded), some left pending.
            try await Self.storeCompactedWindows(services)
            #expect(try await Self.dirtyRanges(services) == 0)
            for (index, app) in Self.apps.enumerated() {
                try await Reports.store(services, app: app.0, Self.events(day: "2026-03-08", app: index, seed: 5))
            }
            let priced = try await services.database.pool.query("SELECT count(*), count(*) FILTER (WHERE estimated % 1 <> 0) FROM rollup_priced_1h").first!
            #expect(try priced.decode(0, as: Int.self) > 100)
            #expect(try priced.decode(1, as: Int.self) > 0, "some estimates carry thousandths of a micro")
            let first = try await Self.expectSame(services, "compacted and pending")

            // A card change: the next report shows it (priced at query time in the dirty range) ...
            try await money.setRates(try Self.rates([("admob", "banner", "US", "EUR", "4.1", "0.2", "2026-03-09"), ("unity", "rewarded", "*", "JPY", "500", "3", "2026-11-02")]))
            #expect(try await Self.dirtyRanges(services) > 0)
            let changed = try await Self.expectSame(services, "right after a card change")
            #expect(changed != first)
            // ... and the re-pricer folds the range back into the priced rows, same answers.
            try await services.compactor.reprice(for: .seconds(120))
            #expect(try await Self.dirtyRanges(services) == 0)
            #expect(try await Self.answers(services) == changed)
            try await Self.expectSame(services, "after re-pricing")

            // An entry deleted: its key falls back to the any-country entry.
            #expect(try await money.deleteRate(network: "admob", format: "banner", country: "US", effectiveFrom: "2026-03-08"))
            let deleted = try await Self.expectSame(services, "after a delete")
            #expect(deleted != changed)
            try await services.compactor.reprice(for: .seconds(120))
            #expect(try await Self.answers(services) == deleted)

            // FX changes need no re-pricing: conversion stays in the report.
            _ = try await money.importFX(try Self.fx(shift: 0.0421))
            let converted = try await Self.expectSame(services, "after an FX change")
            #expect(converted != deleted)

            // The pending deltas compacted: priced as they are folded, the same answers.
            try await services.compactor.compactOnce()
            #expect(try await Self.answers(services) == converted)
            try await Self.expectSame(services, "all compacted")
        }
    }

    @Test("a server of the version before priced rollups can neither finish a compaction pass nor change the card (it would leave them wrong)")
    func olderServersAreRefused() async throws {
        try await withServices(flags: Reports.flags) { services in
            let pool = services.database.pool
            // The statements the previous version ends a pass and a card change with.
            let pass = await #expect(throws: PostgresError.self) {
                try await pool.query("INSERT INTO rollup_compaction_passes (started_at, finished_at, server, delta_rows) VALUES (now(), now(), 'old', 1)")
            }
            #expect(pass?.sqlState == .notNullViolation)
            let card = await #expect(throws: PostgresError.self) {
                try await pool.query("""
                    INSERT INTO rate_cards (network, format, country, currency, cpm_micros, cpt_micros, effective_from)
                    VALUES ('admob', 'banner', '*', 'USD', 1, 0, '2026-01-01')
                    """)
            }
            #expect(card?.sqlState == .notNullViolation)
            // This version's own do.
            try await MoneyStore(pool: pool).setRates([try MoneyTests.entry("admob", "*", cpm: "1", cpt: "0", from: "2026-01-01")])
            _ = try await services.appStore.createApp(id: "ny", name: nil, timezone: "America/New_York", currency: "USD")
            try await Reports.store(services, app: "ny", Self.events(day: "2026-03-08", app: 0, seed: 1))
            #expect(try await services.compactor.compactOnce() > 0)
        }
    }

    /// The stored grains (ReportGrain.swift) and reports that look like one but are not
    /// (a zone half an hour off UTC, a limit), every app or one, in three currencies.
    static func grainQueries() -> [(parameters: [(String, String)], isGrain: Bool)] {
        let metrics = ("metrics", "requests,impressions,fill_rate,taps,revenue,reported_revenue,estimated_revenue,ecpm")
        var queries: [(parameters: [(String, String)], isGrain: Bool)] = []
        for (from, to) in windows {
            let range = [("from", from), ("to", to), metrics]
            queries.append(([("dimensions", "hour,app,network,format"), ("tz", "America/New_York")] + range, true))
            queries.append(([("dimensions", "app,hour,network,format"), ("tz", "UTC"), ("currency", "EUR")] + range, true))
            queries.append(([("apps", "ny"), ("dimensions", "date,app,network,format")] + range, true))
            queries.append(([("apps", "ny"), ("dimensions", "app,date,network,format"), ("currency", "JPY")] + range, true))
            queries.append(([("apps", "kol"), ("dimensions", "date,app,network,format"), ("network", "admob")] + range, true))
            queries.append(([("dimensions", "hour,app,network,format"), ("tz", "Asia/Kolkata")] + range, false))
            queries.append(([("dimensions", "hour,app,network,format"), ("tz", "UTC"), ("limit", "7")] + range, true))
            queries.append(([("dimensions", "network,hour,app,format"), ("tz", "UTC")] + range, false))
        }
        return queries
    }

    /// Streams every grain query and compares its rows and totals with the JSON page of
    /// the same query (grouped and sorted by PostgreSQL); says which streams were grains.
    static func expectGrainsSame(_ services: AppServices, _ label: String, grains: Bool, sourceLocation: SourceLocation = #_sourceLocation) async throws {
        let readable = try await services.reports.readableApps(only: nil)
        for (parameters, isGrain) in grainQueries() {
            let query = try ReportQuery.parse(parameters, readable: readable, isAdmin: true, acceptsCSV: true)
            let name = "\(label): \(parameters.map { "\($0.0)=\($0.1)" }.joined(separator: "&"))"
            // Whether the stream reads the grain: the plan says so, and (hours) the range's hours are whole.
            let dirty = try await services.database.pool.withConnection { connection in try ReportEngine.prepare(query, on: connection).dirty }
            let plan = ReportPlan(query, dirty: dirty)
            let streamsGrain = try await services.database.pool.withConnection { connection in
                try connection.withTransaction { connection in try plan.grain.map { try GrainReader(plan, $0, on: connection) != nil } ?? false }
            }
            #expect(streamsGrain == (isGrain && grains), "\(name)", sourceLocation: sourceLocation)

            var streamed: [ReportRow] = []
            let totals = try await services.reports.stream(query, withTotals: true, start: { _ in }, rows: { streamed += $0 })
            var paged = query
            paged.limit = query.limit ?? ReportQuery.maxLimit
            let document = try await services.reports.page(paged)
            #expect(!document.rows.isEmpty, "\(name)", sourceLocation: sourceLocation)
            #expect(streamed == document.rows, "\(name): the stream and the page differ", sourceLocation: sourceLocation)
            // The same in chunks of 3 rows a FETCH (cursors run out and are fetched ahead in
            // turn, keys meet across chunk ends) and 2 rows a call.
            if streamsGrain {
                let small = try await services.database.pool.withConnection { connection in
                    try connection.withTransaction(begin: ReportEngine.snapshot) { connection -> [ReportRow] in
                        let plan = ReportPlan(query, dirty: try ReportEngine.prepare(query, on: connection).dirty)
                        let grain = try #require(plan.grain)
                        let reader = try #require(try GrainReader(plan, grain, chunk: 3, on: connection))
                        var rows: [ReportRow] = []
                        while true {
                            let next = try reader.next(2, on: connection).rows
                            if next.isEmpty { break }
                            rows += next
                        }
                        try reader.finish(on: connection)
                        return rows
                    }
                }
                #expect(small == document.rows, "\(name): in small chunks", sourceLocation: sourceLocation)
            }
            if query.limit == nil { #expect(totals == document.totals, "\(name): totals", sourceLocation: sourceLocation) }
        }
    }

    @Test("an export of a stored grain streams the grouped report's rows and totals, to the micro, pending deltas and card changes included")
    func grainsStreamTheSameRows() async throws {
        try await withServices(flags: Reports.flags) { services in
            let money = try await Self.setUp(services)
            try await Self.storeCompactedWindows(services)
            try await Self.expectGrainsSame(services, "compacted", grains: true)
            // Pending deltas on the same keys as stored rows: one bucket, rounded once.
            for (index, app) in Self.apps.enumerated() {
                try await Reports.store(services, app: app.0, Self.events(day: "2026-03-08", app: index, seed: 5))
                try await Reports.store(services, app: app.0, Self.events(day: "2026-11-01", app: index, seed: 2))
            }
            try await Self.expectGrainsSame(services, "compacted and pending", grains: true)
            // Right after a card change the dirty ranges are priced at query time: no grain.
            try await money.setRates(try Self.rates([("admob", "banner", "US", "EUR", "4.1", "0.2", "2026-03-09")]))
            try await Self.expectGrainsSame(services, "dirty", grains: false)
            try await services.compactor.reprice(for: .seconds(120))
            _ = try await money.importFX(try Self.fx(shift: 0.0421))
            try await Self.expectGrainsSame(services, "re-priced, FX changed", grains: true)

            // A rate missing inside a grain fails it, naming the rate, even with a FETCH on its
            // way; the connection is clean for its next statement.
            #expect(try await money.deleteFX(date: "2026-03-08", currency: "USD", base: "EUR"))
            let eur = try ReportQuery.parse(
                [("dimensions", "app,hour,network,format"), ("tz", "UTC"), ("currency", "EUR"), ("from", "2026-03-07"), ("to", "2026-03-09")],
                readable: try await services.reports.readableApps(only: nil), isAdmin: true, acceptsCSV: true
            )
            try await services.database.pool.withConnection { connection in
                let failure = #expect(throws: ReportCurrencyError.self) {
                    try connection.withTransaction(begin: ReportEngine.snapshot) { connection in
                        let plan = ReportPlan(eur, dirty: try ReportEngine.prepare(eur, on: connection).dirty)
                        let grain = try #require(plan.grain)
                        let reader = try #require(try GrainReader(plan, grain, chunk: 3, on: connection))
                        while try !reader.next(2, on: connection).rows.isEmpty {}
                    }
                }
                #expect(failure?.date == "2026-03-08" && failure?.currency == "USD", "\(String(describing: failure))")
                let after = try connection.query("SELECT 1")
                #expect(after.count == 1)
            }
            await #expect(throws: ReportCurrencyError.self) { try await services.reports.stream(eur, start: { _ in }, rows: { _ in }) }
        }
    }

    @Test("a grain converts money exactly as PostgreSQL does, also past 128 bits (then PostgreSQL converts it)")
    func grainConversion() async throws {
        try await withServices(flags: Reports.flags) { services in
            try await services.database.pool.withConnection { connection in
                let amounts: [Int128] = [0, 1, 499, 500, 1_500, 2_500, 987_001_000, 123_456_789_012_345, -7_500, Int128(10).power(30), Int128(10).power(37)]
                for amount in amounts {
                    for (to, from) in [("1.0731", "161.37"), ("1", "1"), ("0.000000123456789", "98765.4321"), ("7", "3")] {
                        let mine = try GrainReader.convert(amount, to: to, from: from, connection)
                        let theirs = try connection.query("SELECT adtally_div_half_even(\(String(amount))::numeric * 0.001 * \(to)::numeric, \(from)::numeric)::text")
                        #expect(String(mine) == (try theirs.first?.decode(0, as: String.self)), "\(amount) at \(to) / \(from)")
                    }
                }
            }
        }
    }

    @Test("history compacted before priced rollups is dirty until re-priced, and answers the same meanwhile")
    func migratedHistory() async throws {
        try await withServices(flags: Reports.flags) { services in
            _ = try await Self.setUp(services)
            try await Reports.store(services, app: "ny", Self.events(day: "2026-03-08", app: 0, seed: 1))
            try await services.compactor.compactOnce()
            try await services.compactor.reprice(for: .seconds(60))
            let before = try await Self.answers(services)
            // As Migrations/0012 leaves an existing database: no priced rows, everything dirty.
            let pool = services.database.pool
            try await pool.query("DELETE FROM rollup_priced_1h")
            try await pool.query("DELETE FROM rollup_priced_day")
            try await pool.query("""
                INSERT INTO rollup_dirty (app_id, network, format, from_day, to_day)
                SELECT DISTINCT app_id, network, format, '-infinity'::date, 'infinity'::date FROM rollup_day_compacted WHERE network <> ''
                """)
            #expect(try await Self.answers(services) == before)
            try await services.compactor.reprice(for: .seconds(60))
            #expect(try await Self.dirtyRanges(services) == 0)
            #expect(try await Self.answers(services) == before)
        }
    }
}

extension Int128 {
    fileprivate func power(_ exponent: Int) -> Int128 { (0..<exponent).reduce(1) { value, _ in value * self } }
}
