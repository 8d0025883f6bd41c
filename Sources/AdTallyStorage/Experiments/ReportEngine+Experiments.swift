import AdTallyCore
import Foundation
import PostgresKit

/// The report engine's experiment results (DESIGN §14): every number is read here, from
/// the devices' exposures and their rows of the installs' grain (Migrations/0023: each
/// device's active days, and their money priced exactly as `revenue` is), with the
/// install deltas not yet folded, in one snapshot; `ExperimentResults` turns the sums
/// into intervals.
extension ReportEngine {
    /// An experiment's results as they stand (`now`: for tests).
    public func experimentResults(_ experiment: Experiment, app: ReportApp, now: Date = Date()) async throws -> ExperimentResults {
        let started = experiment.startedAt ?? now
        let end = experiment.stoppedAt ?? now
        // Local days of the app's zone. A stopped experiment ends at its stop: activity
        // through that day, exposures up to that instant, whole days until it (after it,
        // both arms ran the kept policy). The start's day is whole only from midnight.
        let from = try ReportQuery.today(in: app.timezone, now: started)
        let to = try ReportQuery.today(in: app.timezone, now: end)
        let today = try ReportQuery.today(in: app.timezone, now: now)
        let startsAtMidnight = try ReportQuery.today(in: app.timezone, now: started.addingTimeInterval(-1)) < from
        let wholeDays = max(0, to - from - (startsAtMidnight ? 0 : 1))
        // The money is priced as a revenue report over the experiment's days is.
        let money = try ReportQuery.parse(
            [("apps", app.id), ("tz", app.timezone), ("from", ReportQuery.formatDate(from)), ("to", ReportQuery.formatDate(to)), ("metrics", "revenue")],
            readable: [app], isAdmin: true, now: now
        )
        let sums = try await reads.run { pool, _, _ in
            try await pool.withTransaction(begin: Self.snapshot) { connection in
                try Self.experimentSums(experiment, app: app, money: money, through: to, on: connection)
            }
        }
        // The app's average DAU over the experiment's whole days (today's if none), for the projection.
        var appDAU: Double?
        let dauTo = max(from, min(to, today - 1))
        if let dau = try? await page(ReportQuery.parse(
            [("apps", app.id), ("tz", app.timezone), ("from", ReportQuery.formatDate(from)), ("to", ReportQuery.formatDate(dauTo)), ("metrics", "dau")],
            readable: [app], isAdmin: true, now: now
        )), let value = ReportMetric.dau.value(dau.totals).number {
            appDAU = value
        }
        return ExperimentResults(
            experiment: experiment, currency: app.currency, from: from, to: to, partialDay: to == today,
            wholeDays: wholeDays, sums: sums.days, retention: sums.retention, appDAU: appDAU
        )
    }

    /// What a stop records: the results it was decided on (and their verdict), or why they
    /// could not be read (a missing FX rate, a timeout): a harmful arm can always be stopped.
    public func stopDecision(_ experiment: Experiment) async -> (json: String, verdict: String) {
        do {
            guard let app = try await readableApps(only: experiment.app).first else { throw ExperimentStoreError.unknownApp(experiment.app) }
            let results = try await experimentResults(experiment, app: app)
            return (results.decisionJSON(), results.verdict)
        } catch {
            let text = "the results could not be read when it stopped: \(error)"
            return (String(decoding: (try? JSONSerialization.data(withJSONObject: ["error": text])) ?? Data("{}".utf8), as: UTF8.self), text)
        }
    }

    /// The arms' sums per local day, and their retention counts, in one statement.
    static func experimentSums(
        _ experiment: Experiment, app: ReportApp, money: ReportQuery, through last: Int, on connection: PostgresConnection
    ) throws -> (days: [Int: [ExperimentArm: ExperimentResults.DaySums]], retention: [ExperimentArm: ArmMoments]) {
        let prepared = try prepare(money, on: connection)
        let record = prepared.recordWindow != nil ? try ReportPlan.recordDays(money, on: connection) : []
        let plan = ReportPlan(money, distributed: prepared.distributed, record: record, source: .raw)
        let tz = app.timezone
        let through = ReportQuery.formatDate(last)
        // `t.today`: the day the results end on (today's, or the stop's): days before it are whole.
        var sql: PostgresQuery = """
            WITH t AS (SELECT \(through)::date AS today),
            x AS MATERIALIZED (
                SELECT e.device, e.arm, (e.first_at AT TIME ZONE \(tz))::date AS xday
                FROM experiment_exposures e WHERE e.app_id = \(app.id) AND e.experiment = \(experiment.name)
                  AND (\(experiment.stoppedAt)::timestamptz IS NULL OR e.first_at <= \(experiment.stoppedAt)::timestamptz)
            ), pend AS MATERIALIZED (
                SELECT d.app_id, d.device, x.arm, x.xday, (d.bucket AT TIME ZONE \(tz))::date AS day, date_trunc('hour', d.bucket, 'UTC') AS hour,
                       d.network, d.format, d.country::text AS country, d.currency, (d.first_at AT TIME ZONE \(tz))::date AS first_day,
                       d.requests, d.impressions, d.taps, d.revenue_micros, d.unpriced_impressions, d.unpriced_taps
                FROM install_delta d JOIN x ON x.device = d.device
                -- Every pending day (those before the exposure too): a device's install day is
                -- the earliest of its stored install and its pending events, as the
                -- compactor will leave it.
                WHERE d.app_id = \(app.id)
            ), act AS MATERIALIZED (
                -- Each device's active days (with its arm and exposure day, and the install day
                -- its pending deltas say, if any): no join between these sets below, only unions
                -- and groupings (a join's plan rests on estimates a new experiment lacks).
                SELECT u.device, u.arm, u.xday, u.day, sum(u.requests)::numeric AS q, sum(u.impressions)::numeric AS i, min(u.first_day) AS first_day
                FROM (SELECT s.device, x.arm, x.xday, s.day, s.requests, s.impressions, NULL::date AS first_day
                      FROM install_days s JOIN x ON x.device = s.device
                      WHERE s.app_id = \(app.id) AND s.day BETWEEN x.xday AND \(through)::date
                      UNION ALL SELECT p.device, p.arm, p.xday, p.day, p.requests, p.impressions, p.first_day FROM pend p) AS u
                GROUP BY u.device, u.arm, u.xday, u.day
            ), pending AS MATERIALIZED (
                SELECT s.arm, s.device, s.day, (s.hour AT TIME ZONE 'UTC')::date AS u, s.network, s.format,
                       0::bigint AS requests, 0::bigint AS loads, sum(s.impressions)::bigint AS impressions, 0::bigint AS errors, sum(s.taps)::bigint AS taps,
                       0::bigint AS action_cancels, 0::bigint AS expiries, 0::bigint AS wasted_fills, 0::bigint AS sessions,
                       NULL::hll AS devices, sum(s.revenue_micros)::numeric AS revenue_micros, s.currency, s.country,
                       sum(s.unpriced_impressions)::bigint AS ui, sum(s.unpriced_taps)::bigint AS ut, NULL::numeric AS est, NULL::bigint AS unrated_adjust,
                       0::numeric AS precise_micros\(unsafeRaw: plan.hasRecord ? ", s.app_id, s.hour AS h" : "")
                FROM (SELECT r.app_id, x.arm, r.device, r.day, r.hour, r.network, r.format, r.country::text AS country, r.currency,
                             r.impressions, r.taps, r.revenue_micros, r.unpriced_impressions, r.unpriced_taps
                      FROM install_day_revenue r JOIN x ON x.device = r.device WHERE r.app_id = \(app.id) AND r.day BETWEEN x.xday AND \(through)::date
                      UNION ALL
                      SELECT p.app_id, p.arm, p.device, p.day, p.hour, p.network, p.format, p.country, p.currency,
                             p.impressions, p.taps, p.revenue_micros, p.unpriced_impressions, p.unpriced_taps
                      FROM pend p WHERE p.impressions + p.taps > 0 AND p.day BETWEEN p.xday AND \(through)::date) AS s
                GROUP BY s.arm, s.device, s.day, u, s.network, s.format, s.currency, s.country\(unsafeRaw: plan.hasRecord ? ", s.app_id, s.hour" : "")
            ),
            \(unsafeRaw: RatePricing.pricesCTE("prices", of: "pending"))
            """
        if plan.hasRecord { sql.append(",\n\(plan.recordCTE())") }
        sql.append(",\nmoney AS (\n")
        sql.append(plan.pricedSums(names: ["arm", "device", "day"], rows: "pending AS s", dimensionList: "s.arm, s.device, s.day, "))
        sql.append("""
            ), dd AS (
                SELECT u.device, u.arm, u.day, sum(u.q) AS q, sum(u.i) AS i, sum(u.r) AS r
                FROM (SELECT a.device, a.arm, a.day, a.q, a.i, 0::numeric AS r FROM act a WHERE a.day BETWEEN a.xday AND \(through)::date
                      UNION ALL
                      SELECT m.device, m.arm, m.day, 0, 0, (m.reported_micros + m.estimated_micros + m.network_micros)::numeric FROM money m) AS u
                GROUP BY u.device, u.arm, u.day
            ), inc AS (
                SELECT w.arm, w.day, w.r, w.i, w.q,
                       coalesce(sum(w.r) OVER prior, 0) AS r0, coalesce(sum(w.i) OVER prior, 0) AS i0, coalesce(sum(w.q) OVER prior, 0) AS q0,
                       (row_number() OVER (PARTITION BY w.device ORDER BY w.day) - 1)::numeric AS d0
                FROM dd w
                WINDOW prior AS (PARTITION BY w.device ORDER BY w.day ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
            ), per AS (
                -- Devices active on their exposure day (only they can be installed on it), with
                -- whether they came back on day 1 and day 7.
                SELECT a.device, a.arm, a.xday, min(a.first_day) AS first_day,
                       bool_or(a.day = a.xday + 1) AS on1, bool_or(a.day = a.xday + 7) AS on7
                FROM act a GROUP BY a.device, a.arm, a.xday HAVING bool_or(a.day = a.xday)
            ), ret AS (
                SELECT p.arm,
                       count(*) FILTER (WHERE p.xday + 1 < t.today)::float8 AS e1, count(*) FILTER (WHERE p.xday + 1 < t.today AND p.on1)::float8 AS r1,
                       count(*) FILTER (WHERE p.xday + 7 < t.today)::float8 AS e7, count(*) FILTER (WHERE p.xday + 7 < t.today AND p.on7)::float8 AS r7
                FROM per p CROSS JOIN t
                LEFT JOIN installs i ON i.app_id = \(app.id) AND i.device = p.device
                WHERE least(i.day, p.first_day) = p.xday
                GROUP BY p.arm
            )
            -- Exact sums (numeric), then doubles: the same data gives the same bits in every run.
            SELECT 'd', arm, day - DATE '1970-01-01', count(*)::float8, sum(r)::float8, sum(i)::float8, sum(q)::float8, sum(r * r)::float8,
                   sum(2 * r0 * r + r * r)::float8, sum(2 * d0 + 1)::float8, sum(2 * i0 * i + i * i)::float8, sum(2 * q0 * q + q * q)::float8,
                   sum(r0 + r * d0 + r)::float8, sum(i0 + i * d0 + i)::float8, sum(q0 + q * d0 + q)::float8, sum(r0 * i + r * i0 + r * i)::float8,
                   sum(i0 * q + i * q0 + i * q)::float8, NULL
            FROM inc GROUP BY arm, day
            UNION ALL
            SELECT 'x', arm, xday - DATE '1970-01-01', count(*)::float8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, NULL FROM x GROUP BY arm, xday
            UNION ALL
            SELECT 'r', arm, 0, e1, r1, e7, r7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, NULL FROM ret
            UNION ALL
            SELECT 'a', arm, 0, count(DISTINCT device)::float8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, NULL FROM dd GROUP BY arm
            UNION ALL
            SELECT 'f', NULL, 0, coalesce(sum(unrated), 0)::float8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, min(missing_fx) FROM money
            """)
        var days: [Int: [ExperimentArm: ExperimentResults.DaySums]] = [:]
        var retention: [ExperimentArm: ArmMoments] = [:]
        for row in try connection.query(sql) {
            let kind: String = try row.decode(0)
            let arm = try row.decode(1, as: String?.self).flatMap(ExperimentArm.init(rawValue:))
            let day: Int = try row.decode(2)
            let v = try (3...16).map { try row.decode($0, as: Double?.self) ?? 0 }
            switch kind {
            case "d":
                guard let arm else { continue }
                var sums = days[day, default: [:]][arm, default: .init()]
                sums.active = v[0]
                sums.dayRevenue = v[1]
                sums.dayRevenueSquares = v[4]
                sums.moments.r += v[1]; sums.moments.d += v[0]; sums.moments.i += v[2]; sums.moments.q += v[3]
                sums.moments.rr += v[5]; sums.moments.dd += v[6]; sums.moments.ii += v[7]; sums.moments.qq += v[8]
                sums.moments.rd += v[9]; sums.moments.id += v[10]; sums.moments.qd += v[11]; sums.moments.ri += v[12]; sums.moments.iq += v[13]
                days[day, default: [:]][arm] = sums
            case "x":
                guard let arm else { continue }
                days[day, default: [:]][arm, default: .init()].moments.n += v[0]
            case "r":
                guard let arm else { continue }
                retention[arm, default: ArmMoments()].eligible1 = v[0]
                retention[arm, default: ArmMoments()].retained1 = v[1]
                retention[arm, default: ArmMoments()].eligible7 = v[2]
                retention[arm, default: ArmMoments()].retained7 = v[3]
            case "a":
                guard let arm else { continue }
                retention[arm, default: ArmMoments()].active = v[0]
            default:
                if let missing = try row.decode(17, as: String?.self) {
                    throw ReportCurrencyError(missing: missing, reportCurrency: money.currency)
                }
            }
        }
        return (days, retention)
    }
}
