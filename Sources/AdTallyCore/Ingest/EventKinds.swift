/// The step of an ad slot's life an event reports (DESIGN §1).
public enum EventType: String, Sendable, CaseIterable {
    case request, load, impression, tap
    case actionCancel = "action_cancel"
    case expiry, error
    /// The app came to the foreground: a session starts. It names no network or format.
    case session
}

/// How a network SDK knew the revenue it reported (DESIGN §2): AdMob's AdValue
/// precision; LevelPlay's BID → precise, RATE → publisher_provided, CPM → estimated.
public enum RevenuePrecision: String, Sendable, CaseIterable {
    case precise, estimated
    case publisherProvided = "publisher_provided"
    case unknown
}

/// The ad format.
public enum AdFormat: String, Sendable, CaseIterable {
    case banner, interstitial, native, rewarded
}

/// The app's platform.
public enum Platform: String, Sendable, CaseIterable {
    case ios, ipados, android, other
}
