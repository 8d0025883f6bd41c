import Foundation

/// One validated ad lifecycle event, ready to store.
public struct AdEvent: Sendable, Equatable {
    /// Made once per event by the client; a retry sends the same id.
    public var id: UUID
    /// The lifecycle step.
    public var type: EventType
    /// Device clock, as microseconds since the Unix epoch (UTC).
    public var occurredAtMicros: Int64
    /// The ad network, `[a-z0-9_.-]{1,32}`; "" (`EventValidator.noNetwork`) on a session.
    public var network: String
    /// The ad format; nil on a session.
    public var format: AdFormat?
    /// The app's placement name; `default` when not sent.
    public var placement: String
    /// Banner size, `WxH`.
    public var size: String?
    /// ISO 3166-1 alpha-2, upper case; `ZZ` when unknown.
    public var country: String
    /// The device platform.
    public var platform: Platform?
    /// OS version, at most 32 characters.
    public var osVersion: String?
    /// App version, at most 32 characters.
    public var appVersion: String?
    /// Opaque; used only for unique-device counts.
    public var device: String?
    /// Revenue the network SDK reported, in micros of `currency`.
    public var revenueMicros: Int64?
    /// ISO 4217, upper case; present exactly when `revenueMicros` is.
    public var currency: String?
    /// How the SDK knew the revenue; only with `revenueMicros` (nil: not said, `unknown`).
    public var revenuePrecision: RevenuePrecision?
    /// The network's error code, on `error` events.
    public var errorCode: Int?
    /// On `tap`: the action sends the user out of the app.
    public var willLeave: Bool?
    /// On `expiry`: the ad had been displayed.
    public var shown: Bool?

    /// Creates an event; validation lives in `EventValidator`.
    public init(
        id: UUID, type: EventType, occurredAtMicros: Int64, network: String, format: AdFormat?,
        placement: String = "default", size: String? = nil, country: String = "ZZ", platform: Platform? = nil,
        osVersion: String? = nil, appVersion: String? = nil, device: String? = nil, revenueMicros: Int64? = nil,
        currency: String? = nil, errorCode: Int? = nil, willLeave: Bool? = nil, shown: Bool? = nil
    ) {
        self.id = id
        self.type = type
        self.occurredAtMicros = occurredAtMicros
        self.network = network
        self.format = format
        self.placement = placement
        self.size = size
        self.country = country
        self.platform = platform
        self.osVersion = osVersion
        self.appVersion = appVersion
        self.device = device
        self.revenueMicros = revenueMicros
        self.currency = currency
        self.errorCode = errorCode
        self.willLeave = willLeave
        self.shown = shown
    }

    /// The event time as a `Date`.
    public var occurredAt: Date { Date(timeIntervalSince1970: Double(occurredAtMicros) / 1_000_000) }

    /// Start of the 15-minute UTC bucket the event falls in, in epoch seconds.
    ///
    /// Every IANA zone's offset is a multiple of 15 minutes, so days in any zone are
    /// exact unions of these buckets.
    public var bucketStartSeconds: Int64 {
        let seconds = occurredAtMicros >= 0 ? occurredAtMicros / 1_000_000 : (occurredAtMicros - 999_999) / 1_000_000
        return seconds - ((seconds % 900) + 900) % 900
    }
}
