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
/// networks' America/Los_Angeles and UTC are).
///
/// Which import is current: per app and network, the source and zone of its newest
/// import (as the reconciliation compares); per day, the newest import of that source
/// that covers it (has lines for it, or states a range that holds it). The day is
/// final when that import was taken `final_after_days` or more after it (in its zone)
/// and carries no DATA_DELAYED warning.
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

    /// Most record days a report reads (an app-network-day each): ten years of 20 apps' 5 networks.
    static let maxRecordDays = 400_000

    /// The record days that may touch the report's range (the network's days around it),
    /// read in the report's snapshot; none unless the report reads revenue, asks for the
    /// revenue of record, and a network's policy takes it.
    static func recordDays(_ query: ReportQuery, on connection: PostgresConnection) throws -> [RecordDay] {
        let probe = ReportPlan(query)
        guard query.revenueSource == .ofRecord, probe.needsMoney || probe.needed.contains(.networkImpressions) else { return [] }
        let networks = query.filters.first { $0.dimension == .network }?.values
        let apps = query.filters.first { $0.dimension == .app }?.values ?? query.apps
        let rc = query.currency
        let rows = try connection.query("""
            WITH policy AS (
                SELECT network, final_after_days FROM network_settings
                WHERE revenue_source = 'network_when_final' AND (\(networks == nil) OR network = ANY(\(array: networks ?? [])))
            ), pick AS (
                -- Per app and network, the source and zone of its newest import.
                SELECT DISTINCT ON (r.app_id, r.network) r.app_id, r.network, i.source, i.zone, p.final_after_days,
                       ((\(probe.t0) AT TIME ZONE i.zone)::date) AS lo, (((\(probe.t1) - interval '1 microsecond') AT TIME ZONE i.zone)::date) AS hi
                FROM network_report_rows r JOIN policy p ON p.network = r.network JOIN network_imports i ON i.import_id = r.import_id
                WHERE r.app_id = ANY(\(array: apps))
                ORDER BY r.app_id, r.network, r.import_id DESC
            ), covering AS (
                -- Every import of that source covers the days it has lines for ...
                SELECT r.app_id, r.network, r.day, r.import_id
                FROM network_report_rows r JOIN pick k ON k.app_id = r.app_id AND k.network = r.network
                JOIN network_imports i ON i.import_id = r.import_id AND i.source = k.source AND i.zone = k.zone
                WHERE r.day BETWEEN k.lo AND k.hi
                UNION
                -- ... and a file that states its range (AdMob's), every day of it.
                SELECT DISTINCT r.app_id, r.network, d.day::date, r.import_id
                FROM network_report_rows r JOIN pick k ON k.app_id = r.app_id AND k.network = r.network
                JOIN network_imports i ON i.import_id = r.import_id AND i.source = k.source AND i.zone = k.zone AND i.has_range
                CROSS JOIN LATERAL generate_series(greatest(i.first_day, k.lo), least(i.last_day, k.hi), interval '1 day') AS d (day)
                WHERE i.first_day <= k.hi AND i.last_day >= k.lo
            ), current AS (
                SELECT DISTINCT ON (c.app_id, c.network, c.day) c.app_id, c.network, c.day, c.import_id
                FROM covering c ORDER BY c.app_id, c.network, c.day, c.import_id DESC
            ), days AS (
                SELECT c.app_id, c.network, c.day, c.import_id, i.zone,
                       c.day::timestamp AT TIME ZONE i.zone AS t0, (c.day + 1)::timestamp AT TIME ZONE i.zone AS t1
                FROM current c JOIN network_imports i ON i.import_id = c.import_id JOIN pick k ON k.app_id = c.app_id AND k.network = c.network
                WHERE NOT i.is_delayed AND (i.imported_at AT TIME ZONE i.zone)::date - c.day >= k.final_after_days
            )
            SELECT d.app_id, d.network, d.zone, d.day::text, d.import_id, d.t0::text, d.t1::text,
                   coalesce(e.micros, 0)::text, e.missing,
                   (SELECT coalesce(sum(r.impressions), 0) FROM rollup_1h_compacted r
                    WHERE r.app_id = d.app_id AND r.network = d.network AND r.hour >= d.t0 AND r.hour < d.t1)
                   + (SELECT coalesce(sum(r.impressions), 0) FROM rollup_delta r
                      WHERE r.app_id = d.app_id AND r.network = d.network AND r.bucket >= d.t0 AND date_trunc('hour', r.bucket) < d.t1
                        AND date_trunc('hour', r.bucket) >= d.t0),
                   extract(epoch FROM d.t0)::bigint, extract(epoch FROM d.t1)::bigint
            FROM days d
            LEFT JOIN LATERAL (
                -- The day's earnings in the report currency, converted on the network's date.
                SELECT sum(CASE WHEN r.currency = \(rc) THEN r.revenue_micros ELSE adtally_div_half_even(r.revenue_micros * fx.to_rate, fx.from_rate) END) AS micros,
                       min(CASE WHEN r.currency <> \(rc) AND fx.to_rate IS NULL AND r.revenue_micros <> 0
                                THEN r.day::text || ' ' || r.currency || ' '
                                     || CASE WHEN NOT EXISTS (SELECT 1 FROM fx_rates x WHERE x.day = r.day) THEN '*'
                                             WHEN EXISTS (SELECT 1 FROM fx_rates x WHERE x.day = r.day AND x.currency = \(rc)) THEN r.currency ELSE \(rc) END END) AS missing
                FROM network_report_rows r
                LEFT JOIN LATERAL (
                    SELECT t.rate AS to_rate, f.rate AS from_rate
                    FROM fx_rates t JOIN fx_rates f ON f.day = t.day AND f.base = t.base AND f.currency = r.currency
                    WHERE r.currency <> \(rc) AND t.day = r.day AND t.currency = \(rc)
                    ORDER BY t.base LIMIT 1
                ) AS fx ON true
                WHERE r.app_id = d.app_id AND r.network = d.network AND r.day = d.day AND r.import_id = d.import_id
            ) AS e ON true
            ORDER BY d.app_id, d.network, d.day
            LIMIT \(maxRecordDays + 1)
            """)
        guard rows.count <= maxRecordDays else {
            throw ReportQueryError("from", "the range holds more than \(maxRecordDays) days of networks' final earnings (revenue of record); narrow the range or the apps, or ask for revenue_source=sdk", kind: .tooLarge)
        }
        return try rows.map { row in
            if let missing = try row.decode(8, as: String?.self) { throw ReportCurrencyError(missing: missing, reportCurrency: rc) }
            return RecordDay(
                app: try row.decode(0), network: try row.decode(1), zone: try row.decode(2), day: try row.decode(3), importID: try row.decode(4),
                from: try row.decode(5), to: try row.decode(6), fromEpoch: try row.decode(10), toEpoch: try row.decode(11),
                micros: try row.decode(7), impressions: try row.decode(9)
            )
        }
    }

    /// Whether the report's revenue takes some network's final earnings.
    var hasRecord: Bool { !record.isEmpty }

    /// The record days as a CTE `record (id, app_id, network, t0, t1, micros, w)`.
    func recordCTE() -> PostgresQuery {
        """
        record AS MATERIALIZED (
            SELECT x.id::int AS id, x.app_id, x.network, x.t0, x.t1, x.micros, x.w
            FROM unnest(\(array: record.indices.map { $0 + 1 })::int[], \(array: record.map(\.app))::text[], \(array: record.map(\.network))::text[],
                        \(array: record.map(\.from))::timestamptz[], \(array: record.map(\.to))::timestamptz[],
                        \(array: record.map(\.micros))::numeric[], \(array: record.map(\.impressions))::bigint[]) AS x (id, app_id, network, t0, t1, micros, w)
        )
        """
    }

    /// The record day a priced row `s` (its app, network and hour `s.h`) lies in, as a
    /// lateral join `rec` (NULLs when none).
    var recordJoin: String {
        """
        LEFT JOIN LATERAL (
            SELECT x.id, x.micros, x.w FROM record x
            WHERE x.app_id = s.app_id AND x.network = s.network AND date_trunc('hour', s.h) >= x.t0 AND date_trunc('hour', s.h) < x.t1
        ) AS rec ON true
        """
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
