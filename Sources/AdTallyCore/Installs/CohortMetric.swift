/// A cohort metric (DESIGN §13), over the installs of a report's cohorts: a device's
/// cohort is the local day (the app's zone) AdTally first saw it, its day N the N-th
/// local day after that one.
///
/// Every value of day N reads only the cohorts whose day N has fully passed in the app's
/// zone (mature): a cohort still inside it shows `null`, never a partial value, and a
/// row or the totals over several cohorts average over the mature ones only.
public struct CohortMetric: Sendable, Hashable {
    /// What is counted.
    public enum Kind: String, Sendable, CaseIterable {
        /// Devices whose day 0 is the cohort's day (once that day has passed).
        case installs
        /// Installs active (any event) on day N / installs.
        case retention
        /// Revenue of the cohort's devices on days 0…N / installs (cumulative ad LTV),
        /// priced exactly as `revenue` is, in the report currency.
        case revenuePerInstall = "revenue_per_install"
        /// Impressions of the cohort's devices on days 0…N / installs.
        case impressionsPerInstall = "impressions_per_install"
    }

    public var kind: Kind
    /// N (0 for installs).
    public var day: Int

    /// The largest N a metric may name.
    public static let maxDay = 90

    /// A metric of day `day`.
    public init(_ kind: Kind, day: Int = 0) {
        self.kind = kind
        self.day = kind == .installs ? 0 : day
    }

    /// `installs`, or `<kind>_d<N>` with N from 0 to `maxDay` (no leading zeros); nil for any other name.
    public init?(name: String) {
        if name == Kind.installs.rawValue {
            self.init(.installs)
            return
        }
        guard let marker = name.range(of: "_d", options: .backwards) else { return nil }
        let digits = name[marker.upperBound...]
        guard let kind = Kind(rawValue: String(name[..<marker.lowerBound])), kind != .installs,
              !digits.isEmpty, digits.count <= 2, digits.allSatisfy({ $0.isASCII && $0.isNumber }),
              digits == "0" || digits.first != "0", let day = Int(digits), day <= Self.maxDay
        else { return nil }
        self.init(kind, day: day)
    }

    /// Its name in the API, columns and CSV headers.
    public var name: String { kind == .installs ? kind.rawValue : "\(kind.rawValue)_d\(day)" }

    /// The metrics a cohort report shows when none are asked for.
    public static let defaults: [CohortMetric] = [
        CohortMetric(.installs), CohortMetric(.retention, day: 1), CohortMetric(.retention, day: 7), CohortMetric(.retention, day: 30),
        CohortMetric(.revenuePerInstall, day: 7), CohortMetric(.revenuePerInstall, day: 30),
    ]

    /// How the allowed names read in an error.
    public static let namesText = "installs, retention_dN, revenue_per_install_dN, impressions_per_install_dN (N from 0 to \(maxDay))"

    /// How its values read.
    public var valueType: ReportValueType {
        switch kind {
        case .installs: .integer
        case .retention: .ratio
        case .revenuePerInstall: .moneyPerDevice
        case .impressionsPerInstall: .number
        }
    }

    /// The metric's value for a group's cohort sums.
    public func value(_ counts: CohortCounts) -> MetricValue {
        if kind == .installs { return counts.installs == 0 && counts.immatureInstalls > 0 ? .null : .integer(Int128(counts.installs)) }
        guard let sums = counts.days[day], sums.matureInstalls > 0 else { return .null }
        switch kind {
        case .installs: return .null
        case .retention: return .ratio(MetricValue.double(Int128(sums.active)) / MetricValue.double(Int128(sums.matureInstalls)))
        case .revenuePerInstall: return .micros(sums.revenueMicros, per: Int128(sums.matureInstalls))
        case .impressionsPerInstall: return .ratio(MetricValue.double(Int128(sums.impressions)) / MetricValue.double(Int128(sums.matureInstalls)))
        }
    }
}

/// The cohort sums of one group (a row or the totals): its installs, and for each day N
/// a cohort metric of the report names, the sums of the cohorts mature at N.
public struct CohortCounts: Sendable, Equatable {
    /// Devices installed on the group's cohort days that have passed (today's is still
    /// growing: its installs show `null` until it ends, like every day-N cell).
    public var installs: Int64 = 0
    /// Devices installed so far today (a cohort that has not ended), counted in no value.
    public var immatureInstalls: Int64 = 0
    /// By N.
    public var days: [Int: CohortDay] = [:]

    /// None.
    public init() {}

    /// Adds another group's sums (the sums add up: a device is in one cohort).
    public mutating func add(_ other: CohortCounts) {
        installs += other.installs
        immatureInstalls += other.immatureInstalls
        for (day, sums) in other.days { days[day, default: CohortDay()].add(sums) }
    }
}

/// One day N of a group's cohorts, over those mature at N.
public struct CohortDay: Sendable, Equatable {
    /// Installs of the cohorts whose day N has fully passed: every value's denominator.
    public var matureInstalls: Int64 = 0
    /// Of those, the devices active on day N.
    public var active: Int64 = 0
    /// Their revenue on days 0…N, in micros of the report currency.
    public var revenueMicros: Int128 = 0
    /// Their impressions on days 0…N.
    public var impressions: Int64 = 0

    public init(matureInstalls: Int64 = 0, active: Int64 = 0, revenueMicros: Int128 = 0, impressions: Int64 = 0) {
        self.matureInstalls = matureInstalls
        self.active = active
        self.revenueMicros = revenueMicros
        self.impressions = impressions
    }

    public mutating func add(_ other: CohortDay) {
        matureInstalls += other.matureInstalls; active += other.active
        revenueMicros += other.revenueMicros; impressions += other.impressions
    }
}
