import Foundation

/// The sums an experiment's results are computed from, for one arm (DESIGN §14): over
/// its `n` exposed devices, each device's totals from its first exposure on — revenue
/// (micros of the report currency), active days, impressions, requests — summed, squared
/// and multiplied pairwise, so that every ratio's delta-method variance can be formed
/// without the devices themselves.
public struct ArmMoments: Sendable, Equatable {
    /// Exposed devices.
    public var n: Double = 0
    /// Σ per device of revenue (micros), active days, impressions, requests.
    public var r: Double = 0, d: Double = 0, i: Double = 0, q: Double = 0
    /// Σ of squares.
    public var rr: Double = 0, dd: Double = 0, ii: Double = 0, qq: Double = 0
    /// Σ of products.
    public var rd: Double = 0, id: Double = 0, qd: Double = 0, ri: Double = 0, iq: Double = 0
    /// Devices first exposed on their install day whose day 1 (day 7) has passed, and
    /// those of them active on it.
    public var eligible1: Double = 0, retained1: Double = 0, eligible7: Double = 0, retained7: Double = 0
    /// Exposed devices active (any event) on a day since their exposure: what the
    /// minimum sample counts, so that devices that only asked the switch (a bench, a
    /// crawler with the app's key) make no sample. (A holder of the key can send events
    /// too: this filters noise, it is no defence against a deliberate liar.)
    public var active: Double = 0

    /// Nothing yet.
    public init() {}

    /// Adds another's sums (a day's increments).
    public mutating func add(_ other: ArmMoments) {
        n += other.n
        r += other.r; d += other.d; i += other.i; q += other.q
        rr += other.rr; dd += other.dd; ii += other.ii; qq += other.qq
        rd += other.rd; id += other.id; qd += other.qd; ri += other.ri; iq += other.iq
        eligible1 += other.eligible1; retained1 += other.retained1; eligible7 += other.eligible7; retained7 += other.retained7
        active += other.active
    }
}

/// An estimate with its standard error and 95 % interval; nil parts where it is undefined
/// (no device, a zero denominator).
public struct Estimate: Sendable, Equatable {
    /// The point estimate.
    public var value: Double?
    /// Its standard error.
    public var standardError: Double?
    /// The 95 % interval: value ∓ 1.96 · standard error.
    public var low: Double? { value.flatMap { v in standardError.map { v - ExperimentStatistics.z * $0 } } }
    public var high: Double? { value.flatMap { v in standardError.map { v + ExperimentStatistics.z * $0 } } }

    /// An estimate.
    public init(_ value: Double?, _ standardError: Double?) {
        self.value = value
        self.standardError = standardError
    }

    /// The estimate multiplied by a constant (a unit change).
    public func scaled(_ factor: Double) -> Estimate {
        Estimate(value.map { $0 * factor }, standardError.map { $0 * abs(factor) })
    }
}

/// The treatment against the control for one metric.
public struct Lift: Sendable, Equatable {
    /// t − c, with its standard error √(se_t² + se_c²).
    public var difference: Estimate
    /// (t − c) / c, and its interval: the difference's divided by c.
    public var value: Double?
    public var low: Double?
    public var high: Double?
    /// Whether the difference's 95 % interval excludes 0.
    public var isSignificant: Bool
}

/// The sample-ratio check: exposed devices per arm against the treatment's share.
public struct SampleRatio: Sendable, Equatable {
    public var chi2: Double
    public var p: Double
    /// p < 0.001: the split is not what it was set to be.
    public var isBroken: Bool
}

/// The statistics of DESIGN §14, from arms' sums: no database, no rounding.
public enum ExperimentStatistics {
    /// The normal quantile of a two-sided 95 % interval.
    public static let z = 1.959963984540054
    /// Below this p, a sample-ratio check marks the split broken.
    public static let brokenSplitP = 0.001
    /// No winner before this many whole days and exposed devices per arm.
    public static let minimumDays = 7, minimumDevices = 1000
    /// A retention is read as lost (vetoing a win) only over this many eligible devices per
    /// arm: below it, a proportion of 0 or 1 has a zero-width interval that proves nothing.
    public static let minimumRetentionDevices = 100.0

    /// The metrics of an arm, in their order.
    public static let metrics = [
        "arpdau", "impressions_per_dau", "requests_per_dau", "fill_rate", "ecpm", "revenue_per_device", "retention_d1", "retention_d7",
    ]

    /// A ratio of sums over devices (Σx / Σy) with the delta method's variance, the device
    /// as the unit: var(x/y) ≈ (var(x) − 2·q·cov(x, y) + q²·var(y)) / (n · ȳ²), q = Σx/Σy,
    /// with sample variances and covariance (n − 1) of the per-device sums.
    public static func ratio(n: Double, x: Double, y: Double, xx: Double, yy: Double, xy: Double) -> Estimate {
        guard n > 0, y != 0 else { return Estimate(nil, nil) }
        let q = x / y
        guard n > 1 else { return Estimate(q, nil) }
        let mx = x / n, my = y / n
        let varX = (xx - n * mx * mx) / (n - 1), varY = (yy - n * my * my) / (n - 1), cov = (xy - n * mx * my) / (n - 1)
        let variance = (varX - 2 * q * cov + q * q * varY) / (n * my * my)
        return Estimate(q, max(0, variance).squareRoot())
    }

    /// A mean over devices (Σx / n) with its standard error √(var(x) / n).
    public static func mean(n: Double, x: Double, xx: Double) -> Estimate {
        guard n > 0 else { return Estimate(nil, nil) }
        let m = x / n
        guard n > 1 else { return Estimate(m, nil) }
        return Estimate(m, (max(0, (xx - n * m * m) / (n - 1)) / n).squareRoot())
    }

    /// A proportion (k of m) with its standard error √(p(1 − p) / m).
    public static func proportion(_ k: Double, of m: Double) -> Estimate {
        guard m > 0 else { return Estimate(nil, nil) }
        let p = k / m
        return Estimate(p, (p * (1 - p) / m).squareRoot())
    }

    /// An arm's metrics (money in units of the currency, not micros).
    public static func estimates(_ m: ArmMoments) -> [String: Estimate] {
        [
            "arpdau": ratio(n: m.n, x: m.r, y: m.d, xx: m.rr, yy: m.dd, xy: m.rd).scaled(1e-6),
            "impressions_per_dau": ratio(n: m.n, x: m.i, y: m.d, xx: m.ii, yy: m.dd, xy: m.id),
            "requests_per_dau": ratio(n: m.n, x: m.q, y: m.d, xx: m.qq, yy: m.dd, xy: m.qd),
            "fill_rate": ratio(n: m.n, x: m.i, y: m.q, xx: m.ii, yy: m.qq, xy: m.iq),
            "ecpm": ratio(n: m.n, x: m.r, y: m.i, xx: m.rr, yy: m.ii, xy: m.ri).scaled(1e-3),
            "revenue_per_device": mean(n: m.n, x: m.r, xx: m.rr).scaled(1e-6),
            "retention_d1": proportion(m.retained1, of: m.eligible1),
            "retention_d7": proportion(m.retained7, of: m.eligible7),
        ]
    }

    /// The treatment's lift over the control.
    public static func lift(treatment t: Estimate, control c: Estimate) -> Lift? {
        guard let tv = t.value, let cv = c.value, let st = t.standardError, let sc = c.standardError else { return nil }
        let difference = Estimate(tv - cv, (st * st + sc * sc).squareRoot())
        let low = difference.low!, high = difference.high!
        let significant = low > 0 || high < 0
        guard cv != 0 else { return Lift(difference: difference, value: nil, low: nil, high: nil, isSignificant: significant) }
        let bounds = [low / cv, high / cv].sorted()
        return Lift(difference: difference, value: (tv - cv) / cv, low: bounds[0], high: bounds[1], isSignificant: significant)
    }

    /// χ² (one degree of freedom) of the exposed devices against the share, and its p.
    public static func sampleRatio(control: Double, treatment: Double, treatmentShare: Double) -> SampleRatio {
        let total = control + treatment
        guard total > 0, treatmentShare > 0, treatmentShare < 1 else { return SampleRatio(chi2: 0, p: 1, isBroken: false) }
        let expectedT = total * treatmentShare, expectedC = total - expectedT
        let chi2 = (treatment - expectedT) * (treatment - expectedT) / expectedT + (control - expectedC) * (control - expectedC) / expectedC
        let p = erfc((chi2 / 2).squareRoot())
        return SampleRatio(chi2: chi2, p: p, isBroken: p < brokenSplitP)
    }
}
