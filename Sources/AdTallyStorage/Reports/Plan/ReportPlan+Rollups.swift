import AdTallyCore
import PostgresKit

/// The rollup sources of a report (`Source.daily` and `.hourly`): the parts read from
/// the compacted rollups and the pending deltas, and the CTEs that say which hours and
/// days they cover.
extension ReportPlan {
    static let zeroCounts = "0, 0, 0, 0, 0, 0, 0, 0, 0"
    static let countList = rollupCounts.joined(separator: ", ")
    /// The columns of a rollup part after its 8 counts: the device sketch, then money.
    static let partColumns = "devices, revenue_micros, currency, country, ui, ut, est, unrated_adjust"
    /// A part without money: no revenue, currency, country, unpriced counts, adjustment.
    static let noMoney = "0::numeric, NULL::text, NULL::text, 0::bigint, 0::bigint, NULL::numeric, NULL::bigint"
    /// The rows the rollup sources sum: (app_id, d = local date, hk = local hour text
    /// or NULL, u = UTC date (money rows), network, format, 9 counts, devices (a sketch
    /// or NULL), revenue_micros, currency, country, ui / ut (unpriced impressions /
    /// taps), est, unrated), in two lists:
    /// - `stored`: rows whose money (if any) is priced already: counts and sketches
    ///   (currency NULL), and the priced rollups (Migrations/0012: reported revenue in
    ///   `revenue_micros`, estimated in `est`, both in `currency`; unrated events in `unrated`);
    /// - `pending`: rows a report prices itself (`RatePricing`): currency '' with a
    ///   country for impressions and taps without reported revenue, else the reported
    ///   currency; est and unrated NULL. The pending deltas, the 15-minute rows of cut
    ///   hours, and the revenue of the ranges a card change left dirty.
    /// Without money, everything is `stored` (money columns empty), but for the deltas
    /// when `deltasPending` (`ReportGrain` merges them apart). `fxCheck` (`missingFX`):
    /// only the rows that may need an FX rate, the priced rows of other currencies than
    /// the report's and the pending ones; no counts, no sketches.
    func rollupParts(deltasPending: Bool = false, fxCheck: Bool = false) -> (stored: [PostgresQuery], pending: [PostgresQuery]) {
        var stored: [PostgresQuery] = []
        var pending: [PostgresQuery] = []
        let money = needsMoney
        let devices = needsDevices && !fxCheck
        // Rows in the report currency never need a rate; '' is unrated events only.
        let needsRate: PostgresQuery = fxCheck ? " AND r.currency NOT IN (\(query.currency), '')" : ""
        let dirty = money && !self.dirty.isEmpty
        let utcOfBucket = "(r.bucket AT TIME ZONE 'UTC')::date"
        // A row's (app, network, format, UTC date) in a dirty range, or not.
        func isDirty(_ utcDay: String) -> String {
            "EXISTS (SELECT 1 FROM dirty_days x WHERE x.app_id = r.app_id AND x.network = r.network AND x.format = r.format AND x.u = \(utcDay))"
        }
        func clean(_ utcDay: String) -> PostgresQuery { dirty ? " AND NOT \(unsafeRaw: isDirty(utcDay))" : "" }
        // The daily rows of every app and network; the hourly ones (with the 15-minute rows
        // of cut hours), limited by `pairs` (an SQL condition on r, or nothing).
        func daily() {
            // With a network's days placed by the hour, a daily row is placed at its day's noon
            // (`edges` below moves the hours that lie in another network day).
            let dayInstant = recordByHour ? noon("r.day") : "NULL::timestamptz"
            let days: PostgresQuery = "BETWEEN \(ReportQuery.formatDate(query.from))::date AND \(ReportQuery.formatDate(query.to))::date"
            if !fxCheck {
                stored.append("""
                    SELECT r.app_id, r.day, NULL::text, NULL::date, r.network, r.format, \(unsafeRaw: Self.countList), NULL::hll, \(unsafeRaw: Self.noMoney)\(unsafeRaw: at(dayInstant))
                    FROM rollup_day_compacted r WHERE r.app_id = ANY(\(apps)) AND r.day \(days)\(columnFilters("r"))
                    """)
            }
            if money {
                stored.append("""
                    SELECT r.app_id, r.day, NULL::text, r.utc_day, r.network, r.format, \(unsafeRaw: Self.zeroCounts), NULL::hll,
                           r.reported, r.currency, NULL::text, 0::bigint, 0::bigint, r.estimated, r.unrated\(unsafeRaw: at(dayInstant))
                    FROM rollup_priced_day r WHERE r.app_id = ANY(\(apps)) AND r.day \(days)\(columnFilters("r"))\(needsRate)\(clean("r.utc_day"))
                    """)
            }
            if dirty {
                pending.append("""
                    SELECT r.app_id, r.day, NULL::text, r.utc_day, r.network, r.format, \(unsafeRaw: Self.zeroCounts), NULL::hll,
                           r.revenue_micros, r.currency, NULL::text, 0::bigint, 0::bigint, NULL::numeric, NULL::bigint\(unsafeRaw: at(dayInstant))
                    FROM rollup_revenue_day_compacted r
                    WHERE r.app_id = ANY(\(apps)) AND r.day \(days) AND r.currency <> ''\(columnFilters("r")) AND \(unsafeRaw: isDirty("r.utc_day"))
                    """)
                pending.append("""
                    SELECT r.app_id, r.day, NULL::text, r.utc_day, r.network, r.format, \(unsafeRaw: Self.zeroCounts), NULL::hll,
                           0::numeric, ''::text, r.country, r.impressions, r.taps, NULL::numeric, NULL::bigint\(unsafeRaw: at(dayInstant))
                    FROM rollup_unpriced_day_compacted r
                    WHERE r.app_id = ANY(\(apps)) AND r.day \(days)\(columnFilters("r")) AND \(unsafeRaw: isDirty("r.utc_day"))
                    """)
            }
            if devices {
                stored.append("""
                    SELECT r.app_id, r.day, NULL::text, NULL::date, r.network, r.format, \(unsafeRaw: Self.zeroCounts), r.devices, \(unsafeRaw: Self.noMoney)\(unsafeRaw: at("NULL::timestamptz"))
                    FROM rollup_devices_day_compacted r WHERE r.app_id = ANY(\(apps)) AND r.day \(days)\(columnFilters("r", devices: true))
                    """)
            }
        }
        // `edges`: only the hours of the apps and networks with a network's days whose network
        // day is not the one of their local day's noon, where the daily rows placed them, and
        // one of the two is a record day (`edgesCTE`). Each is read as two rows that cancel but
        // for the money: itself at its own hour (+) and negated at that noon (-), so its counts
        // stay the daily row's and its money moves to its own network day (its priced rows
        // only where exactly one of the two is a record day: `money`). No sketches: the daily
        // rows' count the devices.
        func hourly(_ pairs: PostgresQuery, edges: Bool = false) {
            // An hourly table's rows `r` joined to their hour: with `edges`, looked up per edge
            // hour by the key (a nested loop forced by LATERAL: in a generic plan the planner
            // took the app's every network's rows of the range by a bitmap scan, 17,000 for
            // 360, to hash them against the edges). Not on Citus, which refuses a correlated
            // subquery with OFFSET: a join there.
            let signed = edges ? " CROSS JOIN (VALUES (1), (-1)) AS sg (k)" : ""
            // `money`: a table of money, read for the edges whose SDK amounts move only (`edgesCTE`).
            func hourRows(_ table: String, money: Bool = false) -> PostgresQuery {
                guard edges else { return "\(unsafeRaw: table) r \(wholeHours)" }
                if distributed {
                    return "\(unsafeRaw: table) r JOIN record_edges AS hours ON hours.app_id = r.app_id AND hours.network = r.network AND hours.h = r.hour\(unsafeRaw: money ? " AND hours.money" : "")\(unsafeRaw: signed)"
                }
                return """
                    \(unsafeRaw: money ? "(SELECT * FROM record_edges WHERE money)" : "record_edges") AS hours
                    CROSS JOIN LATERAL (SELECT * FROM \(unsafeRaw: table) x WHERE x.app_id = hours.app_id AND x.hour = hours.h AND x.network = hours.network OFFSET 0) AS r\(unsafeRaw: signed)
                    """
            }
            func n(_ value: String) -> String { edges ? "sg.k * \(value)" : value }
            let counts = edges ? Self.rollupCounts.map { "sg.k * r.\($0)" }.joined(separator: ", ") : Self.countList
            func instant(_ own: String, day: String) -> String { edges ? "CASE WHEN sg.k = 1 THEN \(own) ELSE \(noon(day)) END" : own }
            let utcOfHour = "(r.hour AT TIME ZONE 'UTC')::date"
            if !fxCheck {
                stored.append("""
                    SELECT r.app_id, hours.d, hours.hk, NULL::date, r.network, r.format, \(unsafeRaw: counts), NULL::hll, \(unsafeRaw: Self.noMoney)\(unsafeRaw: at(instant("r.hour", day: "hours.d")))
                    FROM \(hourRows("rollup_1h_compacted"))
                    WHERE r.app_id = ANY(\(apps)) AND \(hourRange)\(columnFilters("r"))\(pairs)
                    """)
                stored.append("""
                    SELECT r.app_id, \(unsafeRaw: rowDate), \(unsafeRaw: rowHour), NULL::date, r.network, r.format, \(unsafeRaw: counts), NULL::hll, \(unsafeRaw: Self.noMoney)\(unsafeRaw: at(instant("r.bucket", day: rowDate)))
                    FROM rollup_15m_compacted r\(unsafeRaw: signed)
                    WHERE r.app_id = ANY(\(apps)) AND \(cutBuckets)\(columnFilters("r"))\(pairs)
                    """)
            }
            if money {
                stored.append("""
                    SELECT r.app_id, hours.d, hours.hk, \(unsafeRaw: utcOfHour), r.network, r.format, \(unsafeRaw: Self.zeroCounts), NULL::hll,
                           \(unsafeRaw: n("r.reported")), r.currency, NULL::text, 0::bigint, 0::bigint, \(unsafeRaw: n("r.estimated")), \(unsafeRaw: n("r.unrated"))\(unsafeRaw: at(instant("r.hour", day: "hours.d")))
                    FROM \(hourRows("rollup_priced_1h", money: true))
                    WHERE r.app_id = ANY(\(apps)) AND \(hourRange)\(columnFilters("r"))\(pairs)\(needsRate)\(clean(utcOfHour))
                    """)
                // Cut hours: every country's row, each priced at its own rate.
                pending.append("""
                    SELECT r.app_id, \(unsafeRaw: rowDate), \(unsafeRaw: rowHour), \(unsafeRaw: utcOfBucket), r.network, r.format, \(unsafeRaw: Self.zeroCounts), NULL::hll,
                           \(unsafeRaw: n("r.revenue_micros")), r.currency, r.country::text, \(unsafeRaw: n("r.unpriced_impressions")), \(unsafeRaw: n("r.unpriced_taps")), NULL::numeric, NULL::bigint\(unsafeRaw: at(instant("r.bucket", day: rowDate)))
                    FROM rollup_revenue_15m_compacted r\(unsafeRaw: signed)
                    WHERE r.app_id = ANY(\(apps)) AND \(cutBuckets)\(columnFilters("r"))\(pairs)
                    """)
            }
            if dirty {
                pending.append("""
                    SELECT r.app_id, hours.d, hours.hk, \(unsafeRaw: utcOfHour), r.network, r.format, \(unsafeRaw: Self.zeroCounts), NULL::hll,
                           \(unsafeRaw: n("r.revenue_micros")), r.currency, NULL::text, 0::bigint, 0::bigint, NULL::numeric, NULL::bigint\(unsafeRaw: at(instant("r.hour", day: "hours.d")))
                    FROM \(hourRows("rollup_revenue_1h_compacted", money: true))
                    WHERE r.app_id = ANY(\(apps)) AND \(hourRange) AND r.currency <> ''\(columnFilters("r"))\(pairs) AND \(unsafeRaw: isDirty(utcOfHour))
                    """)
                pending.append("""
                    SELECT r.app_id, hours.d, hours.hk, \(unsafeRaw: utcOfHour), r.network, r.format, \(unsafeRaw: Self.zeroCounts), NULL::hll,
                           0::numeric, ''::text, r.country, \(unsafeRaw: n("r.impressions")), \(unsafeRaw: n("r.taps")), NULL::numeric, NULL::bigint\(unsafeRaw: at(instant("r.hour", day: "hours.d")))
                    FROM \(hourRows("rollup_unpriced_1h_compacted", money: true))
                    WHERE r.app_id = ANY(\(apps)) AND \(hourRange)\(columnFilters("r"))\(pairs) AND \(unsafeRaw: isDirty(utcOfHour))
                    """)
            }
            if devices && !edges {
                stored.append("""
                    SELECT r.app_id, hours.d, hours.hk, NULL::date, r.network, r.format, \(unsafeRaw: Self.zeroCounts), r.devices, \(unsafeRaw: Self.noMoney)\(unsafeRaw: at("NULL::timestamptz"))
                    FROM rollup_devices_1h_compacted r \(wholeHours)
                    WHERE r.app_id = ANY(\(apps)) AND \(hourRange)\(columnFilters("r", devices: true))\(pairs)
                    """)
                stored.append("""
                    SELECT r.app_id, \(unsafeRaw: rowDate), \(unsafeRaw: rowHour), NULL::date, r.network, r.format, \(unsafeRaw: Self.zeroCounts), r.devices, \(unsafeRaw: Self.noMoney)\(unsafeRaw: at("NULL::timestamptz"))
                    FROM rollup_devices_15m_compacted r
                    WHERE r.app_id = ANY(\(apps)) AND \(cutBuckets)\(columnFilters("r", devices: true))\(pairs)
                    """)
            }
        }
        switch source {
        case .daily where recordByHour:
            // Every row by the day, each at its day's noon; the hours of the apps and networks
            // whose network's days lie in another zone that are not in the network day of
            // their local day's noon, moved there by the hour (`edges`): for AdMob's Los
            // Angeles days of an app in New York, 3 hours of each day. (Reading all of those
            // apps and networks' rows by the hour took the bench's record report to 5-6x the
            // default report.) The networks named apart too: an index condition on the 15-minute
            // rows' key. The FX check reads them too: they decide which daily money is the SDK's.
            let networks = Array(Set(record.map(\.network))).sorted()
            let pairs: PostgresQuery = " AND r.network = ANY(\(array: networks)::text[]) AND (r.app_id || chr(1) || r.network) = ANY(\(array: recordPairs)::text[])"
            daily()
            hourly(pairs, edges: true)
        case .daily:
            daily()
        case .hourly:
            hourly("")
        case .raw:
            preconditionFailure("raw events are not rollup parts")
        }
        // Deltas not yet compacted: every committed event is counted at once.
        // A session row's devices are not ad devices (see columnFilters).
        let deltaDevices = devices ? "CASE WHEN r.network <> '' THEN (SELECT \(Self.sketch("h::hll_hashval")) FROM unnest(r.device_hashes) AS h) END" : "NULL::hll"
        let deltas: PostgresQuery = """
            SELECT r.app_id, \(unsafeRaw: rowDate), \(unsafeRaw: rowHour), \(unsafeRaw: utcOfBucket), r.network, r.format, \(unsafeRaw: Self.countList), \(unsafeRaw: deltaDevices),
                   r.revenue_micros::numeric, r.currency, r.country::text, r.unpriced_impressions::bigint, r.unpriced_taps::bigint, NULL::numeric, NULL::bigint\(unsafeRaw: at("r.bucket"))
            FROM rollup_delta r WHERE r.app_id = ANY(\(apps)) AND r.bucket >= \(t0) AND r.bucket < \(t1)\(columnFilters("r"))
            """
        if money || deltasPending { pending.append(deltas) } else { stored.append(deltas) }
        return (stored, pending)
    }

    /// The (app, network, format, UTC date)s of the range whose priced rows a card change
    /// left stale (Migrations/0012): their money is priced here, from the revenue and
    /// unpriced rollups, until the re-pricer has rewritten them.
    func dirtyDaysCTE() -> PostgresQuery {
        let firstDay: PostgresQuery = "(\(t0) AT TIME ZONE 'UTC')::date"
        let lastDay: PostgresQuery = "((\(t1) - interval '1 microsecond') AT TIME ZONE 'UTC')::date"
        return """
            dirty_days AS MATERIALIZED (
                SELECT DISTINCT d.app_id, d.network, d.format, u::date AS u
                FROM unnest(\(array: dirty.map(\.app))::text[], \(array: dirty.map(\.network))::text[], \(array: dirty.map(\.format))::text[],
                            \(array: dirty.map(\.from))::date[], \(array: dirty.map(\.to))::date[]) AS d (app_id, network, format, from_day, to_day),
                     generate_series(greatest(d.from_day, \(firstDay))::timestamp, least(d.to_day, \(lastDay))::timestamp, interval '1 day') AS u
            )
            """
    }

    /// Joined into a union of parts: one statement.
    static func union(_ parts: [PostgresQuery]) -> PostgresQuery {
        var sql: PostgresQuery = ""
        for (index, part) in parts.enumerated() {
            if index > 0 { sql.append("\nUNION ALL\n") }
            sql.append(part)
        }
        return sql
    }

    /// The UTC hours of the range, and whether each lies wholly inside it and inside
    /// one group of the finest time dimension used (then its hourly row is exact).
    func hoursCTE() -> PostgresQuery {
        let used = query.usedDimensions
        // Weeks and months do not nest (a month can end mid-week): any of date, week or
        // month makes every local midnight a boundary; an hour, every local hour.
        // The audience counts devices per local day: every local midnight is a boundary.
        // Daily rows placed among a network's days by their noon (`recordByHour`): every local
        // midnight too, as the daily rows split an hour there between two noons.
        let finest: ReportDimension? = used.contains(.hour) ? .hour
            : used.contains(where: { $0 == .date || $0 == .week || $0 == .month }) || needsAudience || (source == .daily && recordByHour) ? .date : nil
        let sameGroup: String
        switch finest {
        case .hour?: sameGroup = "date_trunc('hour', h, \(zone)) = date_trunc('hour', h + interval '45 minutes', \(zone))"
        case .date?: sameGroup = "\(local("h"))::date = \(local("h + interval '45 minutes'"))::date"
        case .week?: sameGroup = "date_trunc('week', \(local("h"))) = date_trunc('week', \(local("h + interval '45 minutes'")))"
        case .month?: sameGroup = "date_trunc('month', \(local("h"))) = date_trunc('month', \(local("h + interval '45 minutes'")))"
        default: sameGroup = "true"
        }
        return """
            hours AS MATERIALIZED (
                SELECT h, (h >= \(t0) AND h + interval '1 hour' <= \(t1) AND \(unsafeRaw: sameGroup)) AS whole,
                       \(unsafeRaw: local("h"))::date AS d, \(unsafeRaw: needsHour ? hourText("date_trunc('hour', h, \(zone))") : "NULL::text") AS hk
                FROM generate_series(date_trunc('hour', \(t0), 'UTC'), \(t1) - interval '15 minutes', interval '1 hour') AS h
            ), cut AS (
                -- The quarter hours of the cut hours, as one array: an index lookup each, and
                -- an estimate the planner gets right (a join on ranges made it expect millions).
                SELECT coalesce(array_agg(b), '{}') AS buckets
                FROM hours, generate_series(hours.h, hours.h + interval '45 minutes', interval '15 minutes') AS b WHERE NOT hours.whole
            )
            """
    }
}
