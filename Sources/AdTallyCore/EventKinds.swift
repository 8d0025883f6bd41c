/// The step of an ad slot's life an event reports (DESIGN §1).
public enum EventType: String, Sendable, CaseIterable {
    case request, load, impression, tap
    case actionCancel = "action_cancel"
    case expiry, error
}

/// The ad format.
public enum AdFormat: String, Sendable, CaseIterable {
    case banner, interstitial, native, rewarded
}

/// The app's platform.
public enum Platform: String, Sendable, CaseIterable {
    case ios, ipados, android, other
}
