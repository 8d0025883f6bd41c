import AdTallyCore
import PostgresKit

/// The revenue of record (DESIGN §11, Migrations/0016): for a network whose policy is
/// `network_when_final`, each app's days (in the network's zone) whose current import
/// is final take the network's earnings as their revenue, instead of the SDKs' reported
/// and the rate card's estimated amounts.
///
/// How a report places a day's earnings: they are spread over that day's impressions
/// of the app and network in AdTally, equally (each impression gets the network's own
/// eCPM of the day), so a row of the report gets the share of its impressions, whatever
/// its dimensions, range or zone; the SDK and rate-card amounts of those instants are 0.
/// A row's share is rounded half to even to micros once; a row that holds a whole
/// network day holds its earnings exactly. The hours are UTC hours: a day of the
/// network's zone is the hours that start in it (exact for whole-hour zones, which the
/// networks' America/Los_Angeles and UTC are). Where the network's zone is the apps'
/// and the report's (MAX's UTC for apps in UTC), the daily rollups serve, by their day;
/// where any is in another zone (or not whole UTC hours), a report in the apps' own zone
/// reads every row by the day, placed at its day's noon, and moves by the hour only the
/// hours of the apps and networks with record days that lie in another network day than
/// that noon where one of the two is a record day (their priced rows only where exactly
/// one is: `ReportPlan.recordByHour`, `edgesCTE`).
///
/// Which import is current: per app and network, one source and zone, whatever the
/// report's range: the network's own report if it has one (AdMob's for admob, MAX's for
/// applovin, LevelPlay's for ironsource), else the source of its newest import; per day,
/// the newest import of that source and zone that covers it (has lines for it, or
/// states a range that holds it). The day is final when that import was taken
/// `final_after_days` or more after it (in its zone) and carries no DATA_DELAYED warning.
extension ReportPlan {
    /// One app's network day whose revenue is the network's.
    struct RecordDay: Sendable, Equatable {
        var app: String
        var network: String
        var zone: String
        var day: String
        var importID: Int64
        /// Its instants [from, to), as PostgreSQL writes a timestamptz, and in seconds since 1970.
        var from: String
        var to: String
        var fromEpoch: Int64
        var toEpoch: Int64
        /// The network's earnings, converted to the report currency on the day (micros, exact).
        var micros: String
        /// AdTally's impressions of the app and network in those hours: the earnings are spread over them.
        var impressions: Int64
    }

    /// The record days that may touch the report's range (the network's days around it),
    /// read in the report's snapshot on its connection; none unless the report reads
    /// revenue and asks for the revenue of record (ReportEngine.plan calls it only when
    /// a network's policy takes it). At most `ReconciliationEngine.maxRows` of them: the
    /// coverage read is capped there.
    static func recordDays(_ query: ReportQuery, on connection: PostgresConnection) throws -> [RecordDay] {
        guard query.revenueSource == .ofRecord, ReportPlan(query).needsMoney else { return [] }
        let asked = query.filters.first { $0.dimension == .network }?.values
        var finalAfter: [String: Int] = [:]
        for row in try connection.query("SELECT network, final_after_days FROM network_settings WHERE revenue_source = 'network_when_final'") {
            let network: String = try row.decode(0)
            if asked?.contains(network) ?? true { finalAfter[network] = try row.decode(1) }
        }
        guard !finalAfter.isEmpty else { return [] }

        // Per app and network, the source and zone its revenue of record is read from.
        let apps = query.filters.first { $0.dimension == .app }?.values ?? query.apps
        struct Choice: Equatable { var source, zone: String }
        var chosen: [ReconciliationEngine.Pair: Choice] = [:]
        for row in try connection.query("""
            SELECT DISTINCT ON (p.app_id, p.network) p.app_id, p.network, i.source, i.zone
            FROM network_import_pairs p JOIN network_imports i ON i.import_id = p.import_id
            WHERE p.app_id = ANY(\(array: apps)::text[]) AND p.network = ANY(\(array: finalAfter.keys.sorted())::text[])
            ORDER BY p.app_id, p.network,
                     i.source = CASE p.network WHEN 'admob' THEN 'admob' WHEN 'applovin' THEN 'max' WHEN 'ironsource' THEN 'levelplay' END DESC NULLS LAST,
                     p.import_id DESC
            """) {
            chosen[ReconciliationEngine.Pair(app: try row.decode(0), network: try row.decode(1))] = Choice(source: try row.decode(2), zone: try row.decode(3))
        }
        guard !chosen.isEmpty else { return [] }

        // The imports covering the networks' days that may touch the range (a network's
        // zone is within a day of the report's): per day, the newest of the chosen source and zone.
        var span = query
        span.from -= 2
        span.to += 2
        span.filters = [(.app, apps), (.network, Set(chosen.keys.map(\.network)).sorted())]
        let coverage: [ReconciliationEngine.Covered: [ReconciliationEngine.Coverage]]
        do {
            coverage = try ReconciliationEngine.decodeCoverage(try connection.query(ReconciliationEngine.coverageSQL(span)))
        } catch let error as ReportQueryError where error.kind == .tooLarge {
            throw Self.tooManyRecordDays()
        }
        var final: [ReconciliationEngine.Covered: ReconciliationEngine.Coverage] = [:]
        for (key, options) in coverage {
            guard let choice = chosen[ReconciliationEngine.Pair(app: key.app, network: key.network)],
                  let cover = options.first(where: { $0.source == choice.source && $0.zone == choice.zone }),
                  !cover.isDelayed, cover.margin >= finalAfter[key.network]!
            else { continue }
            final[key] = cover
        }
        guard !final.isEmpty else { return [] }

        // Their earnings on those days, in the report currency on each network day (a day a
        // stated range covers without a line earned 0). Only the final days are read: a
        // missing FX rate of a day not used is no error here.
        span.filters.append((.date, Set(final.keys.map(\.day)).sorted()))
        let groups: [ReconciliationEngine.TheirGroup]
        do {
            groups = try ReconciliationEngine.decodeTheirs(
                try connection.query(ReconciliationEngine.theirsSQL(span, grain: [.date, .app, .network])), width: 3, currency: query.currency
            )
        } catch let error as ReportQueryError where error.kind == .tooLarge {
            throw Self.tooManyRecordDays()
        }
        var earnings: [ReconciliationEngine.Covered: Int128] = [:]
        for group in groups {
            guard let day = group.key[0], let app = group.key[1], let network = group.key[2] else { continue }
            let key = ReconciliationEngine.Covered(app: app, network: network, day: day)
            if final[key]?.importID == group.importID { earnings[key, default: 0] += group.side.revenueMicros }
        }

        // Each day's instants, and AdTally's impressions of its app and network in its hours
        // (the hours that start in it). Read from the app's daily rows where that is fewer rows:
        // the network day spans parts of two of the app's local days (AdMob's Los Angeles day of
        // an app in New York: 21 hours of one, 3 of the next); a part of more than half its local
        // day is that day's daily row less the hours outside it, the rest of the network day its
        // hours (a smaller part, and a local day of 23 hours a day of 25 holds wholly). By the
        // daily row only where every bound (the network day's and the local day's) is a whole
        // UTC hour and the local day's bounds are its own (not the later of a midnight that
        // happens twice): there the daily and hourly rows sum the same quarter hours. Elsewhere
        // (a half-hour zone, the Azores' fall back) every hour of the part, as before. (Every
        // hour of each day by the hourly rows, one heap page each, took 11 ms of the bench's
        // 60 ms record report.) The pending deltas by their hour.
        let days = final.keys.sorted { ($0.app, $0.network, $0.day) < ($1.app, $1.network, $1.day) }
        let dayApps = Array(Set(days.map(\.app))).sorted()
        let cte: PostgresQuery = """
            WITH x AS MATERIALIZED (
                SELECT u.i, u.app_id, u.network, u.day::timestamp AT TIME ZONE u.zone AS t0, (u.day + 1)::timestamp AT TIME ZONE u.zone AS t1
                FROM unnest(\(array: days.indices.map { Int32($0) })::int[], \(array: days.map(\.app))::text[], \(array: days.map(\.network))::text[],
                            \(array: days.map { final[$0]!.zone })::text[], \(array: days.map(\.day))::date[]) AS u (i, app_id, network, zone, day)
            )
            """
        var instantsSQL = cte
        instantsSQL.append("\nSELECT x.i, x.t0::text, x.t1::text, extract(epoch FROM x.t0)::bigint, extract(epoch FROM x.t1)::bigint FROM x ORDER BY x.i")
        let instants = try connection.query(instantsSQL)
            .map { row in (from: try row.decode(1, as: String.self), to: try row.decode(2, as: String.self), fromEpoch: try row.decode(3, as: Int64.self), toEpoch: try row.decode(4, as: Int64.self)) }
        var impressions = [Int64](repeating: 0, count: days.count)
        var weightsSQL = cte
        weightsSQL.append("""
            , ends AS MATERIALIZED (
                -- The first and the last of the app's local days the network day overlaps.
                SELECT x.*, (x.t0 AT TIME ZONE a.timezone)::date AS d1, ((x.t1 - interval '1 microsecond') AT TIME ZONE a.timezone)::date AS d2, a.timezone AS tz
                FROM x JOIN apps a ON a.app_id = x.app_id
            ), parts AS MATERIALIZED (
                -- Each of those two local days [s, e) and the network day's part of it [a, b).
                -- By the daily row only where s and e are the day's own bounds: a local midnight
                -- that happens twice (the Azores' and Havana's fall back) is read as its later
                -- instant, and the hour before it is filed under the day it starts.
                SELECT p.*, extract(epoch FROM p.s)::bigint % 3600 = 0 AND extract(epoch FROM p.e)::bigint % 3600 = 0
                            AND extract(epoch FROM p.a)::bigint % 3600 = 0 AND extract(epoch FROM p.b)::bigint % 3600 = 0
                            AND ((p.s - interval '1 microsecond') AT TIME ZONE p.tz)::date < p.day
                            AND ((p.e - interval '1 microsecond') AT TIME ZONE p.tz)::date = p.day
                            AND p.b - p.a > (p.e - p.s) / 2 AS by_day
                FROM (SELECT n.i, n.app_id, n.network, n.tz, n.t0, n.t1, l.day, l.first, l.last,
                             l.day::timestamp AT TIME ZONE n.tz AS s, (l.day + 1)::timestamp AT TIME ZONE n.tz AS e,
                             greatest(n.t0, l.day::timestamp AT TIME ZONE n.tz) AS a, least(n.t1, (l.day + 1)::timestamp AT TIME ZONE n.tz) AS b
                      FROM ends n CROSS JOIN LATERAL (VALUES (n.d1, true, true, n.d2 = n.d1), (n.d2, n.d2 <> n.d1, false, true)) AS l (day, used, first, last)
                      WHERE l.used) AS p
            ), hour_spans AS MATERIALIZED (
                -- The hours a daily row holds outside the network day, taken away (-1);
                SELECT i, app_id, network, s AS h0, a AS h1, -1 AS k FROM parts WHERE by_day AND s < a
                UNION ALL
                SELECT i, app_id, network, b, e, -1 FROM parts WHERE by_day AND b < e
                UNION ALL
                -- and the network day's hours no daily row read holds, added (+1): between the first
                -- local day's part (when by its daily row) and the last's (the same).
                SELECT i, app_id, network, coalesce(max(b) FILTER (WHERE by_day AND first), min(t0)), coalesce(min(a) FILTER (WHERE by_day AND last), min(t1)), 1
                FROM parts GROUP BY i, app_id, network
                HAVING coalesce(max(b) FILTER (WHERE by_day AND first), min(t0)) < coalesce(min(a) FILTER (WHERE by_day AND last), min(t1))
            )
            SELECT h.i, sum(h.k * r.impressions)::bigint FROM hour_spans h
            JOIN rollup_1h_compacted r ON r.app_id = h.app_id AND r.network = h.network AND r.hour >= h.h0 AND r.hour < h.h1
            WHERE r.app_id = ANY(\(array: dayApps)::text[])
            GROUP BY h.i
            UNION ALL
            SELECT p.i, sum(r.impressions)::bigint FROM parts p
            JOIN rollup_day_compacted r ON r.app_id = p.app_id AND r.network = p.network AND r.day = p.day
            WHERE p.by_day AND r.app_id = ANY(\(array: dayApps)::text[])
            GROUP BY p.i
            UNION ALL
            SELECT x.i, sum(r.impressions)::bigint FROM rollup_delta r
            JOIN x ON x.app_id = r.app_id AND x.network = r.network AND date_trunc('hour', r.bucket, 'UTC') >= x.t0 AND date_trunc('hour', r.bucket, 'UTC') < x.t1
            WHERE r.app_id = ANY(\(array: dayApps)::text[])
            GROUP BY x.i
            """)
        for row in try connection.query(weightsSQL) {
            impressions[Int(try row.decode(0, as: Int32.self))] += try row.decode(1, as: Int64.self)
        }
        return days.enumerated().map { index, key in
            let instant = instants[index]
            return RecordDay(
                app: key.app, network: key.network, zone: final[key]!.zone, day: key.day, importID: final[key]!.importID,
                from: instant.from, to: instant.to, fromEpoch: instant.fromEpoch, toEpoch: instant.toEpoch,
                micros: String(earnings[key] ?? 0), impressions: impressions[index]
            )
        }
    }

    static func tooManyRecordDays() -> ReportQueryError {
        ReportQueryError(
            "from", "the range (with a compared period) holds more app-network-days of networks' reports than a report reads for the revenue of record; "
                + "narrow the range or the apps, or ask for revenue_source=sdk", kind: .tooLarge
        )
    }

    /// Whether the report's revenue takes some network's final earnings.
    var hasRecord: Bool { !record.isEmpty }

    /// The record days as a CTE `record (id, app_id, network, hour, micros, w)`: a row per
    /// UTC hour of each day, so a row of the report finds its day by equality (a hash
    /// join), however many days the range holds.
    /// From daily rows (the network's zone is the apps' and the report's), a row per day
    /// `(id, app_id, network, day, micros, w)` instead, found by the rows' own day.
    func recordCTE() -> PostgresQuery {
        if source == .daily && !recordByHour {
            return """
                record AS MATERIALIZED (
                    SELECT x.id::int AS id, x.app_id, x.network, x.day, x.micros, x.w
                    FROM unnest(\(array: record.indices.map { $0 + 1 })::int[], \(array: record.map(\.app))::text[], \(array: record.map(\.network))::text[],
                                \(array: record.map(\.day))::date[], \(array: record.map(\.micros))::numeric[], \(array: record.map(\.impressions))::bigint[])
                         AS x (id, app_id, network, day, micros, w)
                )
                """
        }
        return """
        record AS MATERIALIZED (
            SELECT x.id::int AS id, x.app_id, x.network, h.hour, x.micros, x.w
            FROM unnest(\(array: record.indices.map { $0 + 1 })::int[], \(array: record.map(\.app))::text[], \(array: record.map(\.network))::text[],
                        \(array: record.map(\.from))::timestamptz[], \(array: record.map(\.to))::timestamptz[],
                        \(array: record.map(\.micros))::numeric[], \(array: record.map(\.impressions))::bigint[]) AS x (id, app_id, network, t0, t1, micros, w)
            -- The hours that start in the day (every hour of it in a whole-hour zone).
            CROSS JOIN LATERAL generate_series(date_trunc('hour', x.t0, 'UTC'), x.t1, interval '1 hour') AS h (hour)
            WHERE h.hour >= x.t0 AND h.hour < x.t1
        )
        """
    }

    /// With daily rows placed at their local day's noon (`recordByHour`): the whole UTC hours
    /// `h` of the range, per app and network with record days, whose day in the network's
    /// zone is not the one of their local day's noon, with the hours CTE's `whole`, `d` and
    /// `hk` (so it joins as `hours`): the hours `ReportPlan.rollupParts` moves from the noon
    /// to their own day. Found by the zone's arithmetic, not by joining `record`, whose size
    /// the planner cannot know (joined, it was built by merge joins rescanning `record`: the
    /// bench's record report statement took 82 ms with it, 50-75 ms without).
    /// Only the hours where at least one of the two days is a record day (the hour's own, and
    /// its noon's: looked up in `record`'s hours, as `recordJoin` places a row, by a hashed
    /// subplan): where neither is, the hour's two rows (at its own hour and negated at the
    /// noon) take no network earnings and cancel exactly. `money`: exactly one of them is;
    /// only then do its SDK and rate-card amounts move (a record day has none, so where both
    /// are, both rows' are 0): the priced rows are read for those hours only.
    func edgesCTE() -> PostgresQuery {
        let pairs = recordPairZones
        let noonHour = "date_bin('1 hour', \(noon("hours.d")), TIMESTAMPTZ '2000-01-01 00:00:00+00')"
        return """
            record_edges AS MATERIALIZED (
                SELECT e.app_id, e.network, e.h, e.whole, e.d, e.hk, e.own <> e.at_noon AS money
                FROM (
                    SELECT p.app_id, p.network, hours.h, hours.whole, hours.d, hours.hk,
                           (p.app_id, p.network, hours.h) IN (SELECT app_id, network, hour FROM record) AS own,
                           (p.app_id, p.network, \(unsafeRaw: noonHour)) IN (SELECT app_id, network, hour FROM record) AS at_noon
                    FROM hours, unnest(\(array: pairs.map(\.app))::text[], \(array: pairs.map(\.network))::text[], \(array: pairs.map(\.zone))::text[])
                                AS p (app_id, network, zone)
                    WHERE hours.whole
                      AND (hours.h AT TIME ZONE p.zone)::date <> (\(unsafeRaw: noonHour) AT TIME ZONE p.zone)::date
                ) AS e
                WHERE e.own OR e.at_noon
            )
            """
    }

    /// The record day a priced row `s` (its app, network and the UTC hour of `s.h`) lies in,
    /// as `rec` (NULLs when none): one at most, as an app and network's days are of one zone.
    var recordJoin: String {
        if source == .daily && !recordByHour { return "LEFT JOIN record AS rec ON rec.app_id = s.app_id AND rec.network = s.network AND rec.day = s.d" }
        // The UTC hour by arithmetic (date_bin): date_trunc with a zone converts every row.
        return "LEFT JOIN record AS rec ON rec.app_id = s.app_id AND rec.network = s.network AND rec.hour = date_bin('1 hour', s.h, TIMESTAMPTZ '2000-01-01 00:00:00+00')"
    }
}

extension ReportPlan {
    /// The notes' lines on the revenue of record: per app and network, the days of the
    /// report's range (`t0`…`t1`, seconds since 1970) whose revenue is the network's final
    /// earnings, and the imports they come from.
    func recordNotes(t0: Int64, t1: Int64) -> [String] {
        struct Key: Hashable, Comparable {
            var app, network, zone: String
            static func < (a: Key, b: Key) -> Bool { (a.app, a.network, a.zone) < (b.app, b.network, b.zone) }
        }
        var days: [Key: [RecordDay]] = [:]
        for day in record where day.fromEpoch < t1 && day.toEpoch > t0 {
            days[Key(app: day.app, network: day.network, zone: day.zone), default: []].append(day)
        }
        guard !days.isEmpty else { return [] }
        var lines = days.keys.sorted().map { key -> String in
            let list = days[key]!.sorted { $0.day < $1.day }
            let imports = Set(list.map(\.importID)).sorted().map { "#\($0)" }.joined(separator: ", ")
            let unplaced = list.filter { $0.impressions == 0 && $0.micros != "0" }.map(\.day)
            var line = "\(key.app) \(key.network): revenue of \(list.count == 1 ? list[0].day : "\(list.count) days, \(list.first!.day) to \(list.last!.day)") "
                + "(\(key.zone) days) is the network's final earnings (import\(imports.contains(",") ? "s" : "") \(imports)), spread over its impressions"
            if !unplaced.isEmpty {
                line += "; on \(unplaced.joined(separator: ", ")) AdTally has no impression to place them on, so they are in no row"
            }
            return line
        }
        lines.append("other days and networks: the SDKs' reported revenue and the rate card's estimates (revenue_source=sdk shows those for every day)")
        return lines
    }
}
