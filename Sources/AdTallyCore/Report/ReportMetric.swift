/// What a report can group by (DESIGN §4).
public enum ReportDimension: String, Sendable, CaseIterable {
    case app, date, hour, week, month, network, placement, format, size, country, platform
    case osVersion = "os_version"
    case appVersion = "app_version"
    case errorCode = "error_code"
    /// How the network SDK knew a reported amount (DESIGN §2): precise, estimated,
    /// publisher_provided, unknown (sent without one); null for events without reported revenue.
    case revenuePrecision = "revenue_precision"
    /// A cohort report's install day (DESIGN §13), in the app's own zone.
    case cohort

    /// What a cohort report may group and filter by: the cohort, the app, and what a
    /// device was first seen with (country, platform, app version).
    public var isCohortDimension: Bool { [.cohort, .app, .country, .platform, .appVersion].contains(self) }

    /// A dimension of time in the report's zone.
    public var isTime: Bool { self == .date || self == .hour || self == .week || self == .month }

    /// Not carried by a `session` event (DESIGN §2): active devices, which sessions make,
    /// are the app's whatever a report names of these.
    public var isOnAdEventsOnly: Bool { [.network, .format, .placement, .size, .errorCode, .revenuePrecision].contains(self) }

    /// Kept in the rollups; the others need the raw events.
    public var isInRollups: Bool { isTime || self == .app || self == .network || self == .format }

    /// How its values read.
    public var valueType: ReportValueType {
        switch self {
        case .date, .week, .cohort: .date
        case .hour: .timestamp
        case .month: .month
        case .errorCode: .integer
        default: .string
        }
    }
}

/// The type of a report column, as the JSON `columns` list names it.
public enum ReportValueType: String, Sendable {
    /// Text.
    case string
    /// `YYYY-MM-DD`.
    case date
    /// `YYYY-MM`.
    case month
    /// RFC 3339 local time with its offset.
    case timestamp
    /// A whole number.
    case integer
    /// A ratio, a fraction (0.25 is 25%); null when its denominator is 0.
    case ratio
    /// A decimal string in the report currency's precision.
    case money
    /// A decimal number that is not a fraction: an average per day or per device (DAU,
    /// impressions per DAU); null when its denominator is 0.
    case number
    /// Money per device (ARPDAU): a decimal string with 4 more decimals than the report
    /// currency's precision (at most 6, micros); null when no device was active.
    case moneyPerDevice = "money_per_device"
    /// A relative change against the compared period (0.1 is +10%); null when the earlier value is 0 or missing.
    case change
}

/// A quantity the engine sums per group; every metric is made of these.
public enum ReportCount: Int, Sendable, CaseIterable {
    case requests, loads, impressions, errors, taps, actionCancels, expiries, wastedFills
    /// `session` events: the app came to the foreground.
    case sessions
    /// Revenue the network SDKs reported, converted to the report currency, in micros.
    case reportedMicros
    /// Revenue estimated from the rate card, converted to the report currency, in micros.
    case estimatedMicros
    /// Distinct `device` values (a sketch's estimate: not additive across groups).
    case uniqueDevices
    /// Distinct devices with any event, a `session` included, over the row's range (a sketch's estimate).
    case activeDevices
    /// Distinct devices with an impression over the row's range (a sketch's estimate).
    case adViewers
    /// The row's daily active devices summed over its days (device-days): DAU × days.
    case deviceDays
    /// The row's daily ad viewers summed over its days: DAV × days.
    case viewerDays
    /// The days of the report's range the row covers (1 for a date, the range's days without a time dimension).
    case days
    /// Reported revenue whose precision is `precise`, converted to the report currency, in micros.
    case preciseMicros
    /// Revenue of record (DESIGN §11): a network's final earnings for its days, spread over
    /// that day's impressions, in micros of the report currency, where the network's
    /// policy is `network_when_final`; those days' SDK and rate-card amounts are then 0.
    case networkMicros
    /// The impressions whose revenue is a network's final earnings (`networkMicros`).
    case networkImpressions
    /// Reported + estimated + network: derived, not a column of its own.
    case revenueMicros

}

/// The sums of one group.
public struct ReportCounts: Sendable, Equatable {
    /// Every count but revenue, indexed by `ReportCount.rawValue`.
    public var requests: Int64 = 0, loads: Int64 = 0, impressions: Int64 = 0, errors: Int64 = 0
    public var taps: Int64 = 0, actionCancels: Int64 = 0, expiries: Int64 = 0, wastedFills: Int64 = 0
    public var sessions: Int64 = 0
    public var uniqueDevices: Int64 = 0
    /// The audience (DESIGN §3): range-unique devices and viewers, and their daily
    /// values summed over the row's days (device-days), and those days.
    public var activeDevices: Int64 = 0, adViewers: Int64 = 0, deviceDays: Int64 = 0, viewerDays: Int64 = 0, days: Int64 = 0
    /// The part of `reportedMicros` the SDKs called precise.
    public var preciseMicros: Int128 = 0
    /// Money in micros of the report currency; wider than 64 bits because totals over years may be.
    public var reportedMicros: Int128 = 0, estimatedMicros: Int128 = 0
    /// A network's final earnings as revenue of record, and the impressions they are
    /// spread over (DESIGN §11; 0 unless a network's policy is `network_when_final`).
    public var networkMicros: Int128 = 0, networkImpressions: Int64 = 0
    /// Impressions and taps without reported revenue that no rate card entry priced.
    public var unratedEvents: Int64 = 0
    /// A cohort report's sums (DESIGN §13); empty in any other report.
    public var cohort = CohortCounts()

    /// Revenue: reported + estimated, or a network's final earnings where that network's
    /// policy takes them (DESIGN §3, §11).
    public var revenueMicros: Int128 { reportedMicros + estimatedMicros + networkMicros }

    /// Whose figures a row's revenue is (DESIGN §11): `sdk` (reported and rate-card
    /// amounts), `network` (every impression's revenue is a network's final earnings),
    /// or `mixed`.
    public var revenueSource: String {
        if networkImpressions == 0 && networkMicros == 0 { return "sdk" }
        return networkImpressions == impressions && reportedMicros + estimatedMicros == 0 ? "network" : "mixed"
    }

    /// All zero.
    public init() {}

    /// Adds another group's sums (two earlier rows that line up with one row). Unique
    /// devices, active devices and ad viewers do not add up; the sum is an upper bound,
    /// which is what is left. Device-days and days do add up over distinct days.
    public mutating func add(_ other: ReportCounts) {
        requests += other.requests; loads += other.loads; impressions += other.impressions; errors += other.errors
        taps += other.taps; actionCancels += other.actionCancels; expiries += other.expiries; wastedFills += other.wastedFills
        sessions += other.sessions
        activeDevices += other.activeDevices; adViewers += other.adViewers
        deviceDays += other.deviceDays; viewerDays += other.viewerDays; days += other.days
        preciseMicros += other.preciseMicros
        uniqueDevices += other.uniqueDevices; reportedMicros += other.reportedMicros; estimatedMicros += other.estimatedMicros
        networkMicros += other.networkMicros; networkImpressions += other.networkImpressions
        unratedEvents += other.unratedEvents
        if other.cohort.installs != 0 || other.cohort.immatureInstalls != 0 || !other.cohort.days.isEmpty { cohort.add(other.cohort) }
    }

    /// A count as a wide integer.
    public subscript(count: ReportCount) -> Int128 {
        switch count {
        case .requests: Int128(requests)
        case .loads: Int128(loads)
        case .impressions: Int128(impressions)
        case .errors: Int128(errors)
        case .taps: Int128(taps)
        case .actionCancels: Int128(actionCancels)
        case .expiries: Int128(expiries)
        case .wastedFills: Int128(wastedFills)
        case .sessions: Int128(sessions)
        case .reportedMicros: reportedMicros
        case .estimatedMicros: estimatedMicros
        case .uniqueDevices: Int128(uniqueDevices)
        case .activeDevices: Int128(activeDevices)
        case .adViewers: Int128(adViewers)
        case .deviceDays: Int128(deviceDays)
        case .viewerDays: Int128(viewerDays)
        case .days: Int128(days)
        case .preciseMicros: preciseMicros
        case .networkMicros: networkMicros
        case .networkImpressions: Int128(networkImpressions)
        case .revenueMicros: revenueMicros
        }
    }
}

/// A metric of DESIGN §3, defined once: by its formula over `ReportCount`s. The
/// engine's SQL (for sorting) and the values shown both come from the formula.
public enum ReportMetric: String, Sendable, CaseIterable {
    case requests, impressions
    case fillRate = "fill_rate"
    case loads
    case showRate = "show_rate"
    case errors
    case errorRate = "error_rate"
    case taps, ctr
    case actionCancels = "action_cancels"
    case cancelRate = "cancel_rate"
    case expiries
    case expiryRate = "expiry_rate"
    case wastedFills = "wasted_fills"
    case revenue
    case reportedRevenue = "reported_revenue"
    case estimatedRevenue = "estimated_revenue"
    case ecpm, rpm
    case uniqueDevices = "unique_devices"
    case sessions
    // The audience (DESIGN §3), in AdMob's, MAX's and LevelPlay's words.
    case activeDevices = "active_devices"
    case adViewers = "ad_viewers"
    case dau, dav
    case engagementRate = "engagement_rate"
    case arpdau, arpdav
    case impressionsPerDAU = "impressions_per_dau"
    case impressionsPerDAV = "impressions_per_dav"
    case sessionsPerDAU = "sessions_per_dau"
    /// Reported revenue the SDKs called precise, as a share of revenue.
    case preciseRevenueShare = "precise_revenue_share"
    /// The part of revenue that is networks' final earnings (DESIGN §11).
    case networkRevenue = "network_revenue"
    /// Whose figures the row's revenue is: sdk, network or mixed (DESIGN §11).
    case revenueSource = "revenue_source"

    /// DESIGN §4's default metrics.
    public static let defaults: [ReportMetric] = [.requests, .impressions, .fillRate, .taps, .ctr, .revenue, .ecpm]

    /// How a metric is computed from counts.
    public enum Formula: Sendable, Equatable {
        /// The count itself.
        case count(ReportCount)
        /// numerator / denominator; null when the denominator is 0.
        case ratio(ReportCount, ReportCount)
        /// A money count.
        case money(ReportCount)
        /// money × 1000 / denominator (eCPM, RPM); null when the denominator is 0.
        case moneyPerMille(ReportCount, ReportCount)
        /// numerator / denominator, a quantity per device or per day (DAU, impressions per
        /// DAU: not a fraction); null when the denominator is 0.
        case average(ReportCount, ReportCount)
        /// money / denominator, per device-day (ARPDAU); null when the denominator is 0.
        case moneyPerDevice(ReportCount, ReportCount)
        /// Whose figures revenue is (`ReportCounts.revenueSource`): text.
        case revenueSource
    }

    /// The definition (DESIGN §3).
    public var formula: Formula {
        switch self {
        case .requests: .count(.requests)
        case .impressions: .count(.impressions)
        case .fillRate: .ratio(.impressions, .requests)
        case .loads: .count(.loads)
        case .showRate: .ratio(.impressions, .loads)
        case .errors: .count(.errors)
        case .errorRate: .ratio(.errors, .requests)
        case .taps: .count(.taps)
        case .ctr: .ratio(.taps, .impressions)
        case .actionCancels: .count(.actionCancels)
        case .cancelRate: .ratio(.actionCancels, .taps)
        case .expiries: .count(.expiries)
        case .expiryRate: .ratio(.expiries, .requests)
        case .wastedFills: .count(.wastedFills)
        case .revenue: .money(.revenueMicros)
        case .reportedRevenue: .money(.reportedMicros)
        case .estimatedRevenue: .money(.estimatedMicros)
        case .ecpm: .moneyPerMille(.revenueMicros, .impressions)
        case .rpm: .moneyPerMille(.revenueMicros, .requests)
        case .uniqueDevices: .count(.uniqueDevices)
        case .sessions: .count(.sessions)
        case .activeDevices: .count(.activeDevices)
        case .adViewers: .count(.adViewers)
        // The average over the row's days of each day's count: device-days / days.
        case .dau: .average(.deviceDays, .days)
        case .dav: .average(.viewerDays, .days)
        // dav / dau: the days cancel out.
        case .engagementRate: .ratio(.viewerDays, .deviceDays)
        // revenue / dau / days = revenue / device-days; the same for the others.
        case .arpdau: .moneyPerDevice(.revenueMicros, .deviceDays)
        case .arpdav: .moneyPerDevice(.revenueMicros, .viewerDays)
        case .impressionsPerDAU: .average(.impressions, .deviceDays)
        case .impressionsPerDAV: .average(.impressions, .viewerDays)
        case .sessionsPerDAU: .average(.sessions, .deviceDays)
        case .preciseRevenueShare: .ratio(.preciseMicros, .revenueMicros)
        case .networkRevenue: .money(.networkMicros)
        case .revenueSource: .revenueSource
        }
    }

    /// Whether it is one of the audience metrics (DESIGN §3: from device sketches per
    /// local day of the report's zone).
    public var isAudience: Bool { !Set(counts).isDisjoint(with: [.activeDevices, .adViewers, .deviceDays, .viewerDays, .days]) }

    /// Whether it averages daily values (then an hour cannot group it: an hour is no day).
    public var isDailyAverage: Bool { !Set(counts).isDisjoint(with: [.deviceDays, .viewerDays]) }

    /// The counts the formula reads.
    public var counts: [ReportCount] {
        switch formula {
        case .count(let count), .money(let count): [count]
        case .ratio(let numerator, let denominator), .moneyPerMille(let numerator, let denominator),
             .average(let numerator, let denominator), .moneyPerDevice(let numerator, let denominator): [numerator, denominator]
        case .revenueSource: [.networkImpressions, .impressions, .reportedMicros, .estimatedMicros, .networkMicros]
        }
    }

    /// How its values read.
    public var valueType: ReportValueType {
        switch formula {
        case .count: .integer
        case .ratio: .ratio
        case .average: .number
        case .money, .moneyPerMille: .money
        case .moneyPerDevice: .moneyPerDevice
        case .revenueSource: .string
        }
    }

    /// Whether it involves money (and so the report currency).
    public var isMoney: Bool { valueType == .money || valueType == .moneyPerDevice }

    /// The metric's value for a group's counts.
    public func value(_ counts: ReportCounts) -> MetricValue {
        switch formula {
        case .count(let count): .integer(counts[count])
        case .money(let count): .micros(counts[count], per: 1)
        case .ratio(let numerator, let denominator):
            counts[denominator] == 0 ? .null : .ratio(MetricValue.double(counts[numerator]) / MetricValue.double(counts[denominator]))
        case .moneyPerMille(let numerator, let denominator):
            // Kept as a fraction: rounded once, to the currency's digits, when shown.
            counts[denominator] == 0 ? .null : .micros(counts[numerator] * 1000, per: counts[denominator])
        case .average(let numerator, let denominator):
            counts[denominator] == 0 ? .null : .ratio(MetricValue.double(counts[numerator]) / MetricValue.double(counts[denominator]))
        case .moneyPerDevice(let numerator, let denominator):
            counts[denominator] == 0 ? .null : .micros(counts[numerator], per: counts[denominator])
        case .revenueSource: .text(counts.revenueSource)
        }
    }
}

/// One metric value of one row.
public enum MetricValue: Sendable, Equatable {
    /// A ratio or change whose denominator was 0, or no value at all.
    case null
    /// A count.
    case integer(Int128)
    /// A fraction.
    case ratio(Double)
    /// An amount in micros of the report currency: `numerator / denominator` micros, exactly.
    case micros(Int128, per: Int128)
    /// A word (`revenue_source`).
    case text(String)

    /// The relative change from `earlier` to this value; null unless both are numbers and `earlier` is not 0.
    public func change(from earlier: MetricValue) -> MetricValue {
        guard let now = number, let before = earlier.number, before != 0 else { return .null }
        return .ratio((now - before) / before)
    }

    /// A wide integer as a Double, the same value as `Double(value)`: through Int64 when it
    /// fits (Int128's own conversion is generic and slow, and an export converts millions).
    static func double(_ value: Int128) -> Double {
        if let small = Int64(exactly: value) { return Double(small) }
        return Double(value)
    }

    /// The value as a number (for drawing it); nil when null.
    public var number: Double? {
        switch self {
        case .null: nil
        case .integer(let value): Self.double(value)
        case .micros(let value, let denominator): Self.double(value) / Self.double(denominator)
        case .ratio(let value): value
        case .text: nil
        }
    }
}
