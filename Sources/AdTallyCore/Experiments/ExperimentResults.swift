import Foundation

/// An experiment's results (DESIGN §14): per arm, over its exposed devices and their
/// activity from the local day of their first exposure on, each metric with its 95 %
/// interval; the treatment's lift; the sample-ratio check; ARPDAU by day and cumulative;
/// and a verdict in words. Built by the report engine from the arms' sums (`ArmMoments`).
public struct ExperimentResults: Sendable {
    /// One day's sums of an arm: the increments of the cumulative sums (`moments`, whose
    /// `n` is the devices first exposed that day) and the day's own revenue over its
    /// active devices (`active`, `dayRevenue`, `dayRevenueSquares`, micros).
    public struct DaySums: Sendable {
        public var moments = ArmMoments()
        public var active: Double = 0
        public var dayRevenue: Double = 0
        public var dayRevenueSquares: Double = 0
        public init() {}
    }

    /// One day of the series.
    public struct Day: Sendable {
        public var date: String
        public var devices: [ExperimentArm: Double] = [:]
        public var active: [ExperimentArm: Double] = [:]
        public var arpdau: [ExperimentArm: Estimate] = [:]
        public var cumulativeARPDAU: [ExperimentArm: Estimate] = [:]
        public var cumulativeLift: Lift?
    }

    public var experiment: Experiment
    public var currency: String
    /// Local days (since the epoch) the results span: the start's to today's (or the stop's).
    public var from: Int
    public var to: Int
    /// Whether `to` is a day still under way.
    public var partialDay: Bool
    /// Whole local days since the start (the start's own day counts only if it started at midnight).
    public var wholeDays: Int
    public var moments: [ExperimentArm: ArmMoments]
    public var estimates: [ExperimentArm: [String: Estimate]]
    public var projected: [ExperimentArm: Estimate]
    public var lifts: [String: Lift]
    public var sampleRatio: SampleRatio
    public var days: [Day]
    public var winner: ExperimentArm?
    public var verdict: String
    public var missing: [String]
    public var notes: [String]

    /// The results from the arms' sums per day (`sums[day][arm]`), each device's
    /// exposure day counted in `n`; `retention` the arms' retention counts;
    /// `appDAU` the app's average DAU over the experiment's days (for the projection).
    public init(
        experiment: Experiment, currency: String, from: Int, to: Int, partialDay: Bool, wholeDays: Int,
        sums: [Int: [ExperimentArm: DaySums]], retention: [ExperimentArm: ArmMoments], appDAU: Double?
    ) {
        self.experiment = experiment
        self.currency = currency
        self.from = from
        self.to = to
        self.partialDay = partialDay
        self.wholeDays = wholeDays
        var cumulative: [ExperimentArm: ArmMoments] = [.control: ArmMoments(), .treatment: ArmMoments()]
        var series: [Day] = []
        let lastDay = to
        if from <= lastDay {
            for day in from...lastDay {
                var entry = Day(date: ReportQuery.formatDate(day))
                for arm in ExperimentArm.allCases {
                    let daySums = sums[day]?[arm] ?? DaySums()
                    cumulative[arm]!.add(daySums.moments)
                    entry.devices[arm] = cumulative[arm]!.n
                    entry.active[arm] = daySums.active
                    // The day's ARPDAU: the mean revenue of its active devices.
                    entry.arpdau[arm] = ExperimentStatistics.mean(n: daySums.active, x: daySums.dayRevenue, xx: daySums.dayRevenueSquares).scaled(1e-6)
                    let m = cumulative[arm]!
                    entry.cumulativeARPDAU[arm] = ExperimentStatistics.ratio(n: m.n, x: m.r, y: m.d, xx: m.rr, yy: m.dd, xy: m.rd).scaled(1e-6)
                }
                entry.cumulativeLift = ExperimentStatistics.lift(treatment: entry.cumulativeARPDAU[.treatment]!, control: entry.cumulativeARPDAU[.control]!)
                series.append(entry)
            }
        }
        // Devices exposed before `from` cannot be (exposures start with the experiment), nor
        // after `to` but for a server's clock ahead of this one's: any such day of `sums`
        // still counts in the totals (not drawn in the series).
        for (day, byArm) in sums where day < from || day > lastDay {
            for (arm, daySums) in byArm { cumulative[arm]!.add(daySums.moments) }
        }
        for arm in ExperimentArm.allCases {
            let r = retention[arm] ?? ArmMoments()
            cumulative[arm]!.eligible1 = r.eligible1
            cumulative[arm]!.retained1 = r.retained1
            cumulative[arm]!.eligible7 = r.eligible7
            cumulative[arm]!.retained7 = r.retained7
            cumulative[arm]!.active = r.active
        }
        moments = cumulative
        days = series
        let estimates = cumulative.mapValues(ExperimentStatistics.estimates)
        self.estimates = estimates
        projected = appDAU.map { dau in estimates.mapValues { $0["arpdau"]!.scaled(dau * 30) } } ?? [:]
        var lifts: [String: Lift] = [:]
        for metric in ExperimentStatistics.metrics {
            if let lift = ExperimentStatistics.lift(treatment: estimates[.treatment]![metric]!, control: estimates[.control]![metric]!) { lifts[metric] = lift }
        }
        self.lifts = lifts
        sampleRatio = ExperimentStatistics.sampleRatio(
            control: cumulative[.control]!.n, treatment: cumulative[.treatment]!.n, treatmentShare: Double(experiment.treatmentShare) / 100
        )
        var notes = [
            "devices: those that got a switch answer under the experiment (with their per-install id); each device's activity counts from the local day of its first exposure on, in the app's zone, in every placement of the app",
            "intervals: 95 %, the device as the unit; ratios of sums (arpdau, impressions_per_dau, requests_per_dau, fill_rate, ecpm) by the delta method, var(R/D) ≈ (var(r) − 2·q·cov(r,d) + q²·var(d)) / (n·d̄²); revenue_per_device as a mean; retention as a proportion of the devices first exposed on their install day whose day N has passed",
            "lift: (treatment − control) / control; its interval is that of the difference (± 1.96·√(se_t² + se_c²)) divided by the control's value; significant when the difference's interval excludes 0",
        ]
        if partialDay { notes.append("\(ReportQuery.formatDate(to)) is a day still under way: it is included, so the last day's numbers will still grow") }
        if let stopped = experiment.stoppedAt {
            notes.append("stopped at \(stopped.formatted(.iso8601)): the results end there — devices first exposed until then, their activity through \(ReportQuery.formatDate(to)) (after it both arms ran the kept policy)")
        }
        if experiment.isAA { notes.append("an A/A test: both arms have the same policy, so any lift is noise — the interval should contain 0 in about 95 of 100 such tests") }
        if appDAU != nil { notes.append("projected_monthly_revenue: the arm's ARPDAU × the app's average DAU over the experiment's days × 30, as if 100 % of devices had the arm's policy") }
        var missing: [String] = []
        if wholeDays < ExperimentStatistics.minimumDays {
            missing.append("\(ExperimentStatistics.minimumDays - wholeDays) more whole day\(ExperimentStatistics.minimumDays - wholeDays == 1 ? "" : "s") (\(wholeDays) of \(ExperimentStatistics.minimumDays))")
        }
        // The floor counts exposed devices seen active since: asking the switch alone (a
        // bench, a crawler with the app's key) makes no device of a test.
        for arm in ExperimentArm.allCases where cumulative[arm]!.active < Double(ExperimentStatistics.minimumDevices) {
            let short = Int(Double(ExperimentStatistics.minimumDevices) - cumulative[arm]!.active)
            missing.append("\(short) more active exposed device\(short == 1 ? "" : "s") in \(arm.rawValue) (\(Int(cumulative[arm]!.active)) of \(ExperimentStatistics.minimumDevices))")
        }
        self.missing = missing
        let arpdau = lifts["arpdau"]
        func percent(_ value: Double?) -> String {
            guard let value else { return "?" }
            return String(format: "%+.1f%%", value * 100)
        }
        let liftText = arpdau.map { "ARPDAU lift \(percent($0.value)) (95 % interval \(percent($0.low)) to \(percent($0.high)))" } ?? "no ARPDAU lift yet (an arm has no active device-day)"
        let eligible = ["retention_d1": (cumulative[.control]!.eligible1, cumulative[.treatment]!.eligible1),
                        "retention_d7": (cumulative[.control]!.eligible7, cumulative[.treatment]!.eligible7)]
        let readable = ["retention_d1", "retention_d7"].filter { metric in
            eligible[metric].map { min($0.0, $0.1) >= ExperimentStatistics.minimumRetentionDevices } ?? false
        }
        let retentionLoss = readable.filter { metric in lifts[metric].map { $0.isSignificant && ($0.difference.value ?? 0) < 0 } ?? false }
        let unread = ["retention_d1", "retention_d7"].filter { !readable.contains($0) }.map { metric in
            "\(metric) not readable yet (\(Int(min(eligible[metric]!.0, eligible[metric]!.1))) of \(Int(ExperimentStatistics.minimumRetentionDevices)) eligible devices per arm)"
        }
        winner = nil
        if sampleRatio.isBroken {
            verdict = String(
                format: "broken split: %.0f control and %.0f treatment devices where %d%% were to be treatment (χ² %.1f, p %.2g < 0.001); the arms are not comparable and no result stands — look for devices that do not send their id, a cache that shares one answer, or a kit version that treats the arms differently",
                cumulative[.control]!.n, cumulative[.treatment]!.n, experiment.treatmentShare, sampleRatio.chi2, sampleRatio.p
            )
        } else if !missing.isEmpty {
            verdict = "too early to name a winner: \(missing.joined(separator: ", ")) needed; so far \(liftText)"
        } else if experiment.isAA {
            verdict = arpdau?.isSignificant == true
                ? "A/A test: the identical arms differ significantly (\(liftText)) — expected in about 1 of 20 A/A tests; if it repeats, the split or the data is biased"
                : "A/A test: no significant difference, as expected of identical arms (\(liftText)): the interval's width is this traffic's noise"
        } else if let arpdau, arpdau.isSignificant {
            let better: ExperimentArm = (arpdau.difference.value ?? 0) > 0 ? .treatment : .control
            if better == .treatment && !retentionLoss.isEmpty {
                verdict = "no winner: the treatment earns more per daily user (\(liftText)) but keeps fewer users (\(retentionLoss.joined(separator: ", ")) significantly lower)"
            } else {
                winner = better
                verdict = "\(better.rawValue) wins: \(liftText), significant"
                if better == .treatment {
                    verdict += readable.isEmpty ? "" : ", and \(readable.joined(separator: " and ")) \(readable.count == 1 ? "is" : "are") not significantly lower"
                    verdict += unread.isEmpty ? "" : "; \(unread.joined(separator: ", "))"
                }
            }
        } else {
            verdict = "no significant difference: \(liftText) — the interval includes 0, so a lift of that size is not told apart from noise"
        }
        self.notes = notes
    }

    /// A number as the JSON shows it: nine decimals (a standard error of an ARPDAU is in
    /// the ten-thousandths), null for none or a non-finite value.
    static func rounded(_ value: Double?) -> Any {
        guard let value, value.isFinite else { return NSNull() }
        return (value * 1e9).rounded() / 1e9
    }

    static func json(_ estimate: Estimate) -> [String: Any] {
        ["value": rounded(estimate.value), "low": rounded(estimate.low), "high": rounded(estimate.high)]
    }

    static func json(_ lift: Lift) -> [String: Any] {
        ["value": rounded(lift.value), "low": rounded(lift.low), "high": rounded(lift.high), "significant": lift.isSignificant,
         "difference": json(lift.difference)]
    }

    /// What a stop records of the results it was decided on.
    public func decisionJSON() -> String {
        let object = jsonObject()
        let kept: [String: Any] = [
            "verdict": verdict, "winner": winner?.rawValue ?? NSNull(), "whole_days": wholeDays,
            "arpdau_lift": (object["lift"] as? [String: Any])?["arpdau"] ?? NSNull(), "sample_ratio": object["sample_ratio"] ?? NSNull(),
            "devices": ["control": Int(moments[.control]?.n ?? 0), "treatment": Int(moments[.treatment]?.n ?? 0)],
        ]
        return String(decoding: (try? JSONSerialization.data(withJSONObject: kept, options: [.sortedKeys])) ?? Data("{}".utf8), as: UTF8.self)
    }

    /// The results as the API answers them.
    public func jsonObject() -> [String: Any] {
        var arms: [String: Any] = [:]
        for arm in ExperimentArm.allCases {
            var object: [String: Any] = ["devices": Int(moments[arm]!.n), "active_devices": Int(moments[arm]!.active)]
            for metric in ExperimentStatistics.metrics { object[metric] = Self.json(estimates[arm]![metric]!) }
            object["projected_monthly_revenue"] = projected[arm].map(Self.json) ?? NSNull()
            object["active_device_days"] = Int(moments[arm]!.d)
            arms[arm.rawValue] = object
        }
        var lift: [String: Any] = [:]
        for metric in ExperimentStatistics.metrics {
            lift[metric] = lifts[metric].map(Self.json) ?? ["value": NSNull(), "low": NSNull(), "high": NSNull(), "significant": false, "difference": ["value": NSNull(), "low": NSNull(), "high": NSNull()]]
        }
        let series: [[String: Any]] = days.map { day in
            var object: [String: Any] = ["date": day.date]
            for arm in ExperimentArm.allCases {
                object[arm.rawValue] = [
                    "devices": Int(day.devices[arm] ?? 0), "active": Int(day.active[arm] ?? 0),
                    "arpdau": Self.json(day.arpdau[arm]!), "cumulative_arpdau": Self.json(day.cumulativeARPDAU[arm]!),
                ] as [String: Any]
            }
            object["cumulative_arpdau_lift"] = day.cumulativeLift.map(Self.json) ?? NSNull()
            return object
        }
        return [
            "experiment": experiment.name, "app": experiment.app, "placement": experiment.placement, "status": experiment.status,
            "treatment_share": experiment.treatmentShare, "currency": currency,
            "from": ReportQuery.formatDate(from), "to": ReportQuery.formatDate(to), "partial_day": partialDay ? ReportQuery.formatDate(to) as Any : NSNull(), "whole_days": wholeDays,
            "arms": arms, "lift": lift,
            "sample_ratio": ["chi2": Self.rounded(sampleRatio.chi2), "p": sampleRatio.p, "broken": sampleRatio.isBroken, "expected_treatment_share": Double(experiment.treatmentShare) / 100],
            "winner": winner?.rawValue ?? NSNull(), "verdict": verdict, "missing": missing, "days": series, "notes": notes,
            "aa_test": experiment.isAA,
        ]
    }
}
