import AdTallyApp
import AdTallyCore
@testable import AdTallyStorage
import AdTallyTestSupport
import Foundation
import PostgresKit
import Testing

@Suite("Rollup deltas and their compaction")
struct RollupCompactorTests {
    static let now = Int64(Date().timeIntervalSince1970 * 1_000_000)

    /// A mixed set of events for one app: every type, revenue in two currencies and none.
    static func events(app: String = "a", count: Int, at micros: Int64 = now) -> [AppEvent] {
        let types: [EventType] = [.request, .load, .impression, .tap, .error, .expiry, .actionCancel]
        return (0..<count).map { index in
            let type = types[index % types.count]
            let priced = (type == .impression || type == .tap) && index % 3 == 0
            return AppEvent(appID: app, event: AdEvent(
                id: UUID(), type: type, occurredAtMicros: micros - Int64(index % 4) * 900_000_000,
                network: ["admob", "nend"][index % 2], format: index % 5 == 0 ? .interstitial : .banner,
                country: ["JP", "US", "DE"][index % 3], revenueMicros: priced ? 1_000 : nil,
                currency: priced ? (index % 2 == 0 ? "JPY" : "USD") : nil,
                errorCode: type == .error ? 3 : nil, willLeave: type == .tap ? false : nil, shown: type == .expiry ? false : nil
            ))
        }
    }

    /// Every total both views serve, as one comparable string.
    static func totals(_ services: AppServices) async throws -> String {
        let rows = try await services.database.pool.query("""
            SELECT (SELECT string_agg(concat_ws(',', app_id, bucket, network, format, requests, loads, impressions, errors,
                                                taps, action_cancels, expiries, wasted_fills), ';' ORDER BY app_id, bucket, network, format)
                    FROM rollup_15m)
                || '|' ||
                   (SELECT string_agg(concat_ws(',', app_id, bucket, network, format, country, currency, revenue_micros, priced_events,
                                                unpriced_impressions, unpriced_taps), ';' ORDER BY app_id, bucket, network, format, country, currency)
                    FROM rollup_revenue_15m) AS totals
            """)
        return try rows.first?.decode(0, as: String?.self) ?? ""
    }

    /// The same totals computed from the raw events.
    static func totalsFromEvents(_ services: AppServices) async throws -> String {
        let rows = try await services.database.pool.query("""
            WITH e AS (SELECT *, date_bin('15 minutes', occurred_at, 'epoch') AS bucket FROM events)
            SELECT (SELECT string_agg(concat_ws(',', app_id, bucket, network, format, requests, loads, impressions, errors,
                                                taps, action_cancels, expiries, wasted_fills), ';' ORDER BY app_id, bucket, network, format)
                    FROM (SELECT app_id, bucket, network, format,
                                 count(*) FILTER (WHERE type = 'request') AS requests, count(*) FILTER (WHERE type = 'load') AS loads,
                                 count(*) FILTER (WHERE type = 'impression') AS impressions, count(*) FILTER (WHERE type = 'error') AS errors,
                                 count(*) FILTER (WHERE type = 'tap') AS taps, count(*) FILTER (WHERE type = 'action_cancel') AS action_cancels,
                                 count(*) FILTER (WHERE type = 'expiry') AS expiries,
                                 count(*) FILTER (WHERE type = 'expiry' AND NOT shown) AS wasted_fills
                          FROM e GROUP BY 1, 2, 3, 4) AS c)
                || '|' ||
                   (SELECT string_agg(concat_ws(',', app_id, bucket, network, format, country, currency, revenue_micros, priced_events,
                                                unpriced_impressions, unpriced_taps), ';' ORDER BY app_id, bucket, network, format, country, currency)
                    FROM (SELECT app_id, bucket, network, format, country, coalesce(currency, '') AS currency,
                                 coalesce(sum(revenue_micros), 0) AS revenue_micros, count(revenue_micros) AS priced_events,
                                 count(*) FILTER (WHERE revenue_micros IS NULL AND type = 'impression') AS unpriced_impressions,
                                 count(*) FILTER (WHERE revenue_micros IS NULL AND type = 'tap') AS unpriced_taps
                          FROM e WHERE type IN ('impression', 'tap') GROUP BY 1, 2, 3, 4, 5, 6) AS r)
            """)
        return try rows.first?.decode(0, as: String?.self) ?? ""
    }

    /// `rows` pending delta rows of one request each for `app`, admob banners, spread over
    /// `hours` hours from hour `firstHour` after 2023-11-15 00:00 UTC.
    static func requestDeltas(_ services: AppServices, app: String, rows: Int, hours: Int = 1, firstHour: Int = 0) async throws {
        try await services.database.pool.query("""
            INSERT INTO rollup_delta (app_id, bucket, network, format, country, currency, requests, loads, impressions, errors, taps,
                                      action_cancels, expiries, wasted_fills, revenue_micros, priced_events, unpriced_impressions, unpriced_taps)
            SELECT \(app), to_timestamp(1700006400 + (\(firstHour) + i % \(hours)) * 3600), 'admob', 'banner', NULL, NULL, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
            FROM generate_series(1, \(rows)) AS i
            """)
    }

    static func pendingDeltas(_ services: AppServices) async throws -> Int {
        try await Ingest.count(services, "SELECT count(*)::int FROM rollup_delta")
    }

    @Test("the views count every stored event before, during and after compaction")
    func viewsStayExact() async throws {
        try await withServices { services in
            #expect(try await services.eventStore.store(Self.events(count: 300)).allSatisfy { $0 })
            #expect(try await Self.pendingDeltas(services) > 0)
            let expected = try await Self.totalsFromEvents(services)
            #expect(try await Self.totals(services) == expected)

            let compactor = services.compactor
            #expect(try await compactor.compactOnce() > 0)
            #expect(try await Self.pendingDeltas(services) == 0)
            #expect(try await Self.totals(services) == expected)
            #expect(try await Ingest.count(services, "SELECT count(*)::int FROM rollup_15m_compacted") > 0)

            // More events on the same keys: deltas again, then added to the compacted rows.
            #expect(try await services.eventStore.store(Self.events(count: 300)).allSatisfy { $0 })
            let more = try await Self.totalsFromEvents(services)
            #expect(more != expected)
            #expect(try await Self.totals(services) == more)
            try await compactor.compactOnce()
            #expect(try await Self.totals(services) == more)
            #expect(try await compactor.compactOnce() == 0)
        }
    }

    @Test("after a burst of deltas (a backfill) the emptied delta table gives its space back, so reports do not scan it")
    func deltaTableShrinksAfterABurst() async throws {
        try await withServices { services in
            _ = try await services.appStore.createApp(id: "a", name: nil)
            // 300,000 delta rows, as an import of history leaves them: well over the threshold.
            try await services.database.pool.query("""
                INSERT INTO rollup_delta (app_id, bucket, network, format, country, currency, requests, loads, impressions, errors, taps,
                                          action_cancels, expiries, wasted_fills, revenue_micros, priced_events, unpriced_impressions, unpriced_taps)
                SELECT 'a', to_timestamp(1700000000 + (i % 9000) * 900), 'n' || (i % 30), 'banner', NULL, NULL, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
                FROM generate_series(1, 300000) AS i
                """)
            let size = "SELECT (pg_relation_size('rollup_delta') / 1048576)::int"
            #expect(try await Ingest.count(services, size) > RollupCompactor.shrinkDeltaTableAboveMB)
            // An autovacuum of the table holds its lock through the pass (it did once, in
            // CI): both of the pass's vacuums skip the table. The real autovacuum is kept
            // off this table so that it cannot do so at another moment of the test.
            try await services.database.pool.query("ALTER TABLE rollup_delta SET (autovacuum_enabled = false)")
            let autovacuum = try PostgresConnection(connecting: services.database.pool.configuration.conninfo)
            _ = try autovacuum.execute(unsafeSQL: "BEGIN; LOCK TABLE rollup_delta IN SHARE UPDATE EXCLUSIVE MODE")
            #expect(try await services.compactor.compactOnce() == 300_000)
            // Folded a span of buckets at a time (each statement well inside the statement
            // timeout), not in one statement.
            let passes = try await Ingest.count(services, "SELECT count(*)::int FROM rollup_compaction_passes")
            let largest = try await Ingest.count(services, "SELECT max(delta_rows)::int FROM rollup_compaction_passes")
            #expect(passes >= 300_000 / RollupCompactor.passRows && largest <= RollupCompactor.passRows, "\(passes) passes, the largest \(largest) rows")
            #expect(try await Ingest.count(services, size) > RollupCompactor.shrinkDeltaTableAboveMB)
            _ = try autovacuum.execute(unsafeSQL: "ROLLBACK")
            // The next pass gives the space back, though it has no rows to move.
            #expect(try await services.compactor.compactOnce() == 0)
            #expect(try await Ingest.count(services, size) < RollupCompactor.shrinkDeltaTableAboveMB)
            #expect(try await Ingest.count(services, "SELECT sum(requests)::int FROM rollup_15m_compacted") == 300_000)
        }
    }

    @Test("a large pass after the delta tables were emptied and vacuumed plans on fresh statistics (they said empty: quadratic nested loops)")
    func passAnalyzesStaleDeltaStatistics() async throws {
        try await withServices { services in
            _ = try await services.appStore.createApp(id: "a", name: nil)
            // No autovacuum: one holding a table at the pass makes the ANALYZE skip it, and
            // one analyzing beside the first pass's DELETE can count the deleted rows.
            try await services.database.pool.query("ALTER TABLE rollup_delta SET (autovacuum_enabled = false)")
            try await services.database.pool.query("ALTER TABLE install_delta SET (autovacuum_enabled = false)")
            // A small pass leaves the state every pass leaves: rows deleted, then vacuumed,
            // pages kept (vacuum_truncate = false), so the statistics say the table is empty.
            try await Self.requestDeltas(services, app: "a", rows: RollupCompactor.analyzeDeltasFromRows / 2)
            #expect(try await services.compactor.compactOnce() == RollupCompactor.analyzeDeltasFromRows / 2)
            let statistics = "SELECT count(*)::int FROM pg_class WHERE relname = 'rollup_delta' AND reltuples <= 0"
            #expect(try await Ingest.count(services, statistics) == 1, "the table's statistics after a pass: empty (or none)")
            let analyzed = "SELECT count(*)::int FROM pg_stat_user_tables WHERE relname IN ('rollup_delta', 'install_delta') AND analyze_count > 0"
            #expect(try await Ingest.count(services, analyzed) == 0)
            // A large pass on those statistics analyzes both tables first (counted as a manual
            // ANALYZE, not autovacuum's; the counters reach the view within seconds).
            try await Self.requestDeltas(services, app: "a", rows: RollupCompactor.analyzeDeltasFromRows * 2, hours: 4)
            #expect(try await services.compactor.compactOnce() == RollupCompactor.analyzeDeltasFromRows * 2)
            try await waitUntil(within: 30) { try await Ingest.count(services, analyzed) == 2 }
            #expect(try await Ingest.count(services, "SELECT sum(requests)::int FROM rollup_15m_compacted") == RollupCompactor.analyzeDeltasFromRows * 5 / 2)
        }
    }

    @Test("a pass bounded inside one bucket plans for the rows it moves, not one (the bound's estimate from the bucket statistics: quadratic nested loops)")
    func boundInsideOneBucketPlansItsRows() async throws {
        let logPath = try #require(ProcessInfo.processInfo.environment["ADTALLY_TEST_POSTGRES_LOG"])
        try await withServices { services in
            let pool = services.database.pool
            for app in ["a1", "a2"] { _ = try await services.appStore.createApp(id: app, name: nil) }
            try await pool.query("ALTER TABLE rollup_delta SET (autovacuum_enabled = false)")
            try await pool.query("ALTER TABLE install_delta SET (autovacuum_enabled = false)")
            // After a burst every pending delta is of the current quarter hour, and a pass's
            // budget cuts it between apps: the bound is (that bucket, the next app).
            for app in ["a1", "a2"] {
                try await Self.requestDeltas(services, app: app, rows: 3_000)
                try await pool.query("""
                    INSERT INTO install_delta (app_id, bucket, device, network, format, country, currency, first_at, first_platform, first_version,
                                               events, requests, impressions, taps, sessions, revenue_micros, priced_events, unpriced_impressions, unpriced_taps)
                    SELECT \(app), to_timestamp(1700006400), 'd' || i, 'admob', 'banner', 'JP', '', to_timestamp(1700006400), NULL, NULL, 1, 1, 0, 0, 0, 0, 0, 0, 0
                    FROM generate_series(1, 3000) AS i
                    """)
            }
            // Fresh statistics: they say every row is of that bucket, so a row comparison
            // `(bucket, app_id) < (that bucket, 'a2')` reads as `bucket <` it: no row.
            try await pool.query("ANALYZE rollup_delta, install_delta")
            // The pass's plans, as PostgreSQL ran them (auto_explain, this database's new
            // sessions only), in the cluster's log.
            let database = try await pool.query("SELECT current_database()")[0].decode(0, as: String.self)
            _ = try await pool.withConnection { connection in
                try connection.execute(unsafeSQL: "ALTER DATABASE \(database) SET session_preload_libraries = 'auto_explain'")
                try connection.execute(unsafeSQL: "ALTER DATABASE \(database) SET auto_explain.log_min_duration = 0")
            }
            let conninfo = try TestDatabase.clusterURL.replacingOccurrences(of: "dbname=postgres", with: "dbname=\(database)")
            let explained = PostgresPool(configuration: .init(conninfo: conninfo, maxConnections: 2))
            do {
                try await Self.checkPlans(services, explained, logPath: logPath)
            } catch {
                await explained.shutdown()
                throw error
            }
            await explained.shutdown()
        }
    }

    /// `boundInsideOneBucketPlansItsRows`'s passes, on a pool whose sessions log their plans.
    static func checkPlans(_ services: AppServices, _ explained: PostgresPool, logPath: String) async throws {
        let compactor = RollupCompactor(
            store: EventStore(pool: explained, credentialsKey: nil), limits: .init(rows: 3_000, target: .seconds(60), timeout: .seconds(60), start: 3_000)
        )
        let logStart = (try FileManager.default.attributesOfItem(atPath: logPath)[.size] as? NSNumber)?.intValue ?? 0
        #expect(try await compactor.compactOnce() == 6_000)
        #expect(try await Ingest.count(services, "SELECT sum(requests)::int FROM rollup_15m_compacted") == 6_000)
        #expect(try await Ingest.count(services, "SELECT count(*)::int FROM installs") == 6_000)
        // auto_explain writes as the statement ends; the log is read once it holds both.
        func estimates(_ table: String) throws -> [Int] {
            let handle = try FileHandle(forReadingFrom: URL(fileURLWithPath: logPath))
            defer { try? handle.close() }
            try handle.seek(toOffset: UInt64(logStart))
            let text = String(decoding: try handle.readToEnd() ?? Data(), as: UTF8.self)
            return text.matches(of: try Regex("Delete on \(table)  \\(cost=[0-9.]+ rows=([0-9]+)")).compactMap { Int($0.output[1].substring ?? "") }
        }
        try await waitUntil("both passes' plans are logged", within: 30) { try estimates("install_delta").count >= 2 && estimates("rollup_delta").count >= 2 }
        // The first pass's bound cuts the bucket: 3,000 rows go. A plan for one row joined
        // the CTEs by nested loops that rescan one per row of the other.
        for table in ["rollup_delta", "install_delta"] {
            let rows = try estimates(table)
            #expect(rows.allSatisfy { $0 >= 300 }, "\(table): the passes' estimated rows \(rows)")
        }
    }

    @Test("a pass is bounded by time too: one cut by its own timeout is tried again smaller at once, so a stalled group holds back only itself while the rest folds")
    func passesBoundedByTime() async throws {
        try await withServices { services in
            for app in ["a", "b"] { _ = try await services.appStore.createApp(id: app, name: nil) }
            func deltas(app: String, hour: Int, rows: Int) async throws { try await Self.requestDeltas(services, app: app, rows: rows, firstHour: hour) }
            // b's hour 2 is compacted already; another transaction then holds its row, as a
            // long writer (or a checkpoint storm's slowness) would.
            try await deltas(app: "b", hour: 2, rows: 1)
            try await services.compactor.compactOnce()
            try await deltas(app: "a", hour: 0, rows: 10)
            try await deltas(app: "a", hour: 1, rows: 10)
            try await deltas(app: "b", hour: 2, rows: 10)
            let holder = try PostgresConnection(connecting: services.database.pool.configuration.conninfo)
            _ = try holder.execute(unsafeSQL: "BEGIN; SELECT * FROM rollup_1h_compacted WHERE app_id = 'b' FOR UPDATE")

            let compactor = RollupCompactor(
                store: services.eventStore, limits: .init(rows: 1_000, target: .seconds(10), timeout: .seconds(1))
            )
            let started = ContinuousClock.now
            // The first pass takes all three groups and is cut after its own second; the ones
            // after it fold a's hours; b's one group, which cannot be split, waits under the
            // pool's timeout until the row is let go.
            let folding = Task { try await compactor.compactOnce() }
            let aFolded = "SELECT coalesce(sum(requests), 0)::int FROM rollup_1h_compacted WHERE app_id = 'a'"
            for _ in 0..<100 where try await Ingest.count(services, aFolded) < 20 { try await Task.sleep(for: .milliseconds(100)) }
            #expect(try await Ingest.count(services, aFolded) == 20)
            #expect(ContinuousClock.now - started < .seconds(15))
            #expect(try await Self.pendingDeltas(services) == 10)
            #expect(compactor.budget.current < 1_000)

            _ = try holder.execute(unsafeSQL: "ROLLBACK")
            #expect(try await folding.value == 30)
            #expect(try await Ingest.count(services, "SELECT sum(requests)::int FROM rollup_1h_compacted WHERE app_id = 'b'") == 11)
            #expect(try await Ingest.count(services, "SELECT sum(requests)::int FROM rollup_day_compacted") == 31)
        }
    }

    @Test("an operator's cancel of a pass is a failure, not a cut: the pass is not retried smaller")
    func cancelIsNotACut() async throws {
        try await withServices { services in
            _ = try await services.appStore.createApp(id: "a", name: nil)
            try await Self.requestDeltas(services, app: "a", rows: 30, hours: 3)
            // The hours exist compacted, and another transaction holds them: the pass waits.
            try await services.compactor.compactOnce()
            try await Self.requestDeltas(services, app: "a", rows: 30, hours: 3)
            let holder = try PostgresConnection(connecting: services.database.pool.configuration.conninfo)
            _ = try holder.execute(unsafeSQL: "BEGIN; SELECT * FROM rollup_1h_compacted FOR UPDATE")
            let compactor = RollupCompactor(store: services.eventStore, limits: .init(rows: 1_000, timeout: .seconds(20)))
            let folding = Task { try await compactor.compactOnce() }
            // Once the pass waits, an operator cancels it.
            // (This test's database only: the suites share one cluster.)
            let waiting = "SELECT count(*)::int FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%rollup_delta%'"
            for _ in 0..<100 where try await Ingest.count(services, waiting) == 0 { try await Task.sleep(for: .milliseconds(50)) }
            try await services.database.pool.query("""
                SELECT pg_cancel_backend(pid) FROM pg_stat_activity
                WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%rollup_delta%'
                """)
            do {
                _ = try await folding.value
                Issue.record("a cancelled pass returned")
            } catch let error as PostgresError {
                #expect(error.sqlState == .queryCanceled)
            } catch {
                Issue.record("a cancel was taken for a cut: \(error)")
            }
            #expect(compactor.budget.current == 1_000)
            _ = try holder.execute(unsafeSQL: "ROLLBACK")
            #expect(try await compactor.compactOnce() == 30)
        }
    }

    @Test("a pass's budget follows its time: smaller in proportion past the target, twice as large under half of it, never past the most")
    func passBudgetFollowsTime() {
        let limits = RollupCompactor.PassLimits(rows: 100_000, target: .seconds(10), timeout: .seconds(30))
        #expect(RollupCompactor.nextBudget(rows: 100_000, moved: 100_000, more: true, elapsed: .seconds(40), limits: limits) == 25_000)
        #expect(RollupCompactor.nextBudget(rows: 25_000, moved: 25_000, more: true, elapsed: .seconds(2), limits: limits) == 50_000)
        #expect(RollupCompactor.nextBudget(rows: 80_000, moved: 80_000, more: true, elapsed: .seconds(1), limits: limits) == 100_000)
        #expect(RollupCompactor.nextBudget(rows: 50_000, moved: 50_000, more: true, elapsed: .seconds(7), limits: limits) == 50_000)
        // The last pass of a backlog does not grow the next one: the next backlog starts slow again.
        #expect(RollupCompactor.nextBudget(rows: 50_000, moved: 10, more: false, elapsed: .milliseconds(5), limits: limits) == 10_000)
        #expect(RollupCompactor.nextBudget(rows: 5_000, moved: 10, more: false, elapsed: .milliseconds(5), limits: limits) == 5_000)
        // Under the pool's statement timeout: half of it where that is under 30 s; one group, the pool's (5 minutes where none).
        let short = RollupCompactor.PassLimits(statementTimeout: .seconds(20))
        #expect(short.timeout == .seconds(10) && short.singleGroupTimeout == .seconds(20))
        let usual = RollupCompactor.PassLimits(statementTimeout: .seconds(60))
        #expect(usual.timeout == .seconds(30) && usual.singleGroupTimeout == .seconds(60))
        let none = RollupCompactor.PassLimits(statementTimeout: nil)
        #expect(none.timeout == .seconds(30) && none.singleGroupTimeout == .seconds(300))
        // A backlog is met slowly: the first pass takes 10,000 rows (never more than the most).
        #expect(usual.start == 10_000 && RollupCompactor.PassLimits(rows: 1_000).start == 1_000)
    }

    @Test("a group spanning many apps and networks sums each pair apart")
    func manySourcesInOneGroup() async throws {
        try await withServices { services in
            // 12 apps x 2 networks: more pairs than the accumulator scans before it hashes.
            let events = (0..<12).flatMap { Self.events(app: "app\($0)", count: 40) }.shuffled()
            #expect(try await services.eventStore.store(events).allSatisfy { $0 })
            #expect(try await Self.totals(services) == (try await Self.totalsFromEvents(services)))
            try await services.compactor.compactOnce()
            #expect(try await Self.totals(services) == (try await Self.totalsFromEvents(services)))
        }
    }

    @Test("a duplicate adds nothing to the deltas, also beside new events")
    func duplicatesAddNoDelta() async throws {
        try await withServices { services in
            let events = Self.events(count: 50)
            _ = try await services.eventStore.store(events)
            let deltas = try await Self.pendingDeltas(services)
            #expect(try await services.eventStore.store(events).allSatisfy { !$0 })
            #expect(try await Self.pendingDeltas(services) == deltas)
            // Known and new ids in one call: only the new ones are stored and counted.
            let more = Self.events(count: 30)
            let stored = try await services.eventStore.store(Array(events.prefix(20)) + more)
            #expect(stored == Array(repeating: false, count: 20) + Array(repeating: true, count: 30))
            #expect(try await Ingest.count(services, "SELECT count(*)::int FROM events") == 80)
            #expect(try await Self.totals(services) == (try await Self.totalsFromEvents(services)))
        }
    }

    @Test("only one compactor runs at a time; another skips its pass")
    func oneAtATime() async throws {
        try await withServices { services in
            _ = try await services.eventStore.store(Self.events(count: 20))
            try await services.database.pool.withConnection { connection in
                try connection.withTransaction { connection in
                    try connection.query("SELECT pg_advisory_xact_lock(\(Int64(0x4164_526F_6C6C)))")
                    // The pool has other connections; the compactor must not wait for this one.
                    let skipped = try runBlocking { try await services.compactor.compactOnce() }
                    #expect(skipped == 0)
                }
            }
            #expect(try await services.compactor.compactOnce() > 0)
        }
    }

    @Test("compacting while 8 writers ingest loses and doubles nothing")
    func compactionUnderLoad() async throws {
        try await withServices(flags: .init(poolSize: 10)) { services in
            let compactor = services.compactor
            let store = services.eventStore
            let writing = Locked(true)
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask {
                    while writing.withLock({ $0 }) { try await compactor.compactOnce() }
                }
                try await withThrowingTaskGroup(of: Void.self) { writers in
                    for writer in 0..<8 {
                        writers.addTask {
                            for _ in 0..<10 {
                                let stored = try await store.store(Self.events(app: "app\(writer % 3)", count: 100))
                                #expect(stored.allSatisfy { $0 })
                            }
                        }
                    }
                    try await writers.waitForAll()
                }
                writing.withLock { $0 = false }
                try await group.waitForAll()
            }
            try await compactor.compactOnce()
            #expect(try await Self.pendingDeltas(services) == 0)
            #expect(try await Ingest.count(services, "SELECT count(*)::int FROM events") == 8_000)
            #expect(try await Self.totals(services) == (try await Self.totalsFromEvents(services)))
        }
    }
}

/// Runs async work to completion from synchronous code (here: inside a blocking
/// connection's transaction, on a pool thread).
private func runBlocking<T: Sendable>(_ work: @escaping @Sendable () async throws -> T) throws -> T {
    let result = Locked<Result<T, any Error>?>(nil)
    let done = DispatchSemaphore(value: 0)
    Task {
        let outcome: Result<T, any Error>
        do { outcome = .success(try await work()) } catch { outcome = .failure(error) }
        result.withLock { $0 = outcome }
        done.signal()
    }
    done.wait()
    return try result.withLock { $0 }!.get()
}
