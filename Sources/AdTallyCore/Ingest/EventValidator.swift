import Foundation
import TextFormats

/// Checks raw events against the event rules of DESIGN §2.
///
/// Every rejection names the field and the rule, e.g.
/// `network: must match [a-z0-9_.-]{1,32}`.
public struct EventValidator: Sendable {
    /// The key's app; an event's `app`, when present, must equal it.
    public var appID: String
    /// How far in the past `occurred_at` may be (default 7 days).
    public var maxAge: Duration
    /// How far in the future `occurred_at` may be (default 1 hour).
    public var maxAhead: Duration
    /// Accept numbers and booleans written as strings (CSV files carry only text).
    public var acceptsTextValues: Bool
    /// Ids of events before this time (microseconds since the epoch) may have been
    /// pruned from the dedupe ledger, so such events are refused whatever `maxAge`
    /// says: a retry of one could not be told from a new event. Nil: none were.
    public var idsPrunedBeforeMicros: Int64?

    /// Creates a validator for one app.
    public init(appID: String, maxAge: Duration = .seconds(7 * 86_400), maxAhead: Duration = .seconds(3600), acceptsTextValues: Bool = false) {
        self.appID = appID
        self.maxAge = maxAge
        self.maxAhead = maxAhead
        self.acceptsTextValues = acceptsTextValues
    }

    /// A rejected field: its name and the rule it broke.
    public struct Rejection: Error, Sendable, Equatable, CustomStringConvertible {
        /// The field at fault, by its wire name.
        public var field: String
        /// The rule it broke.
        public var rule: String
        public var description: String { "\(field): \(rule)" }
        /// A rejection of `field` for breaking `rule`.
        public init(field: String, rule: String) {
            self.field = field
            self.rule = rule
        }
    }

    /// Validates one event against the clock `nowMicros` (microseconds since the epoch).
    public func validate(_ raw: RawEvent, nowMicros: Int64) throws(Rejection) -> AdEvent {
        let idText = try requiredString(raw.id, "id")
        guard let id = UUIDText.parse(idText) else { throw Rejection(field: "id", rule: "must be a UUID") }

        let typeText = try requiredString(raw.type, "type")
        guard let type = EventType(rawValue: typeText) else {
            throw Rejection(field: "type", rule: "must be one of \(EventType.allCases.map(\.rawValue).joined(separator: ", "))")
        }

        let occurredText = try requiredString(raw.occurredAt, "occurred_at")
        guard let occurredAt = RFC3339.parseMicros(occurredText) else {
            throw Rejection(field: "occurred_at", rule: "must be an RFC 3339 timestamp with an offset, e.g. 2026-11-21T10:31:19Z")
        }
        if occurredAt < nowMicros - Self.micros(maxAge) {
            throw Rejection(field: "occurred_at", rule: "is more than \(Self.describe(maxAge)) in the past (outside the accepted window)")
        }
        if let prunedBefore = idsPrunedBeforeMicros, occurredAt < prunedBefore {
            throw Rejection(
                field: "occurred_at",
                rule: "is before \(CivilTime.timestamp(micros: prunedBefore)), from when the dedupe ledger has been pruned (a copy of it could not be recognised)"
            )
        }
        if occurredAt > nowMicros + Self.micros(maxAhead) {
            throw Rejection(field: "occurred_at", rule: "is more than \(Self.describe(maxAhead)) ahead of server time (outside the accepted window)")
        }

        let network: String
        let format: AdFormat?
        if type == .session {
            // A session is the app's, not an ad slot's: it names no network or format.
            if try optionalString(raw.network, "network") != nil { throw Rejection(field: "network", rule: "must be absent on session events (a session names no network)") }
            if try optionalString(raw.format, "format") != nil { throw Rejection(field: "format", rule: "must be absent on session events (a session names no format)") }
            for (value, field) in [(raw.placement, "placement"), (raw.size, "size")] where try optionalString(value, field) != nil {
                throw Rejection(field: field, rule: "must be absent on session events (a session is the app's, not an ad slot's)")
            }
            network = Self.noNetwork
            format = nil
        } else {
            network = try requiredString(raw.network, "network")
            guard Self.isNetworkName(network) else { throw Rejection(field: "network", rule: "must match [a-z0-9_.-]{1,32}") }
            let formatText = try requiredString(raw.format, "format")
            guard let value = AdFormat(rawValue: formatText) else {
                throw Rejection(field: "format", rule: "must be one of \(AdFormat.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            format = value
        }

        var event = AdEvent(id: id, type: type, occurredAtMicros: occurredAt, network: network, format: format)
        // A session has no placement either: stored as "", never as the ad slots' "default".
        if type == .session { event.placement = "" }

        if let placement = try optionalString(raw.placement, "placement") {
            guard Self.isPlacement(placement) else {
                try Self.refuseNUL(placement, "placement")
                throw Rejection(field: "placement", rule: Self.placementRule)
            }
            event.placement = placement
        }
        if let size = try optionalString(raw.size, "size") {
            guard Self.isBannerSize(size) else { throw Rejection(field: "size", rule: "must be WIDTHxHEIGHT in points, e.g. 320x50") }
            event.size = size
        }
        if let country = try optionalString(raw.country, "country") {
            guard let code = Self.countryCode(country) else {
                throw Rejection(field: "country", rule: "must be an ISO 3166-1 alpha-2 code (ZZ for unknown)")
            }
            event.country = code
        }
        if let platform = try optionalString(raw.platform, "platform") {
            guard let value = Platform(rawValue: platform) else {
                throw Rejection(field: "platform", rule: "must be one of \(Platform.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            event.platform = value
        }
        event.osVersion = try boundedString(raw.osVersion, "os_version", .version)
        event.appVersion = try boundedString(raw.appVersion, "app_version", .version)
        event.device = try boundedString(raw.device, "device", .device)

        let revenue = try optionalInteger(raw.revenueMicros, "revenue_micros")
        let currency = try optionalString(raw.currency, "currency")
        switch (revenue, currency) {
        case (nil, nil): break
        case (.some, nil): throw Rejection(field: "currency", rule: "is required with revenue_micros")
        case (nil, .some): throw Rejection(field: "revenue_micros", rule: "is required with currency")
        case (.some(let micros), .some(let code)):
            guard (0...Self.maxRevenueMicros).contains(micros) else {
                throw Rejection(field: "revenue_micros", rule: "must be an integer from 0 to \(Self.maxRevenueMicros)")
            }
            guard let code = ISOCodes.currency(code) else { throw Rejection(field: "currency", rule: "must be an ISO 4217 currency code, e.g. USD") }
            guard type == .impression || type == .tap else {
                throw Rejection(field: "revenue_micros", rule: "is allowed only on impression and tap events")
            }
            event.revenueMicros = micros
            event.currency = code
        }
        if let precision = try optionalString(raw.revenuePrecision, "revenue_precision") {
            guard let value = RevenuePrecision(rawValue: precision) else {
                throw Rejection(field: "revenue_precision", rule: "must be one of \(RevenuePrecision.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            guard event.revenueMicros != nil else { throw Rejection(field: "revenue_precision", rule: "is allowed only with revenue_micros") }
            event.revenuePrecision = value
        }

        if let code = try optionalInteger(raw.errorCode, "error_code") {
            guard type == .error else { throw Rejection(field: "error_code", rule: "is allowed only on error events") }
            guard let small = Int(exactly: code), Int32(exactly: small) != nil else {
                throw Rejection(field: "error_code", rule: "must be a 32-bit integer")
            }
            event.errorCode = small
        } else if type == .error {
            throw Rejection(field: "error_code", rule: "is required on error events")
        }

        if let leaves = try optionalBool(raw.willLeave, "will_leave") {
            guard type == .tap else { throw Rejection(field: "will_leave", rule: "is allowed only on tap events") }
            event.willLeave = leaves
        }
        if let shown = try optionalBool(raw.shown, "shown") {
            guard type == .expiry else { throw Rejection(field: "shown", rule: "is allowed only on expiry events") }
            event.shown = shown
        } else if type == .expiry {
            throw Rejection(field: "shown", rule: "is required on expiry events")
        }

        if let app = try optionalString(raw.app, "app"), app != appID {
            throw Rejection(field: "app", rule: "must equal the key's app (\(appID))")
        }
        return event
    }

    // MARK: - Field helpers

    private func requiredString(_ value: RawValue?, _ field: String) throws(Rejection) -> String {
        guard let value, value != .null else { throw Rejection(field: field, rule: "is required") }
        guard case .string(let text) = value else { throw Rejection(field: field, rule: "must be a string, got \(value.kindName)") }
        if acceptsTextValues && text.isEmpty { throw Rejection(field: field, rule: "is required") }
        return text
    }

    private func optionalString(_ value: RawValue?, _ field: String) throws(Rejection) -> String? {
        guard let value, value != .null else { return nil }
        guard case .string(let text) = value else { throw Rejection(field: field, rule: "must be a string, got \(value.kindName)") }
        if acceptsTextValues && text.isEmpty { return nil }
        return text
    }

    private func boundedString(_ value: RawValue?, _ field: String, _ rule: TextRule) throws(Rejection) -> String? {
        guard let text = try optionalString(value, field) else { return nil }
        guard rule.allows(text) else { throw Rejection(field: field, rule: "must be " + rule.limitText) }
        try Self.refuseNUL(text, field)
        return text
    }

    /// The network a session is stored under: none. No network name is empty, so no
    /// report filter or mediation policy can name it.
    public static let noNetwork = ""

    /// What the events of a network their app never admitted are counted as (the
    /// storage layer's `AppNetworks`); no network an app can show.
    public static let otherNetwork = "other"

    /// A placement as events name it (and report filters, mediation policies): 1 to 64
    /// characters within `TextRule.placement`, no NUL.
    public static func isPlacement(_ text: String) -> Bool {
        !text.isEmpty && TextRule.placement.allows(text) && !text.utf8.contains(0)
    }

    /// What `isPlacement` requires, as a rejection says it.
    public static let placementRule = "must be 1 to 64 characters (at most 256 bytes of UTF-8)"

    /// Whether `text` is a version as events give it (`os_version`, `app_version`), no NUL.
    public static func isVersion(_ text: String) -> Bool {
        TextRule.version.allows(text) && !text.utf8.contains(0)
    }

    /// A country as events name it (and mediation policies, rate cards): the ISO
    /// 3166-1 alpha-2 code in ASCII letters of either case, upper-cased; nil when it is none.
    public static func countryCode(_ text: String) -> String? {
        guard text.utf8.count == 2, let upper = ISOCodes.asciiUppercased(text), ISOCodes.countries.contains(upper) else { return nil }
        return upper
    }

    /// PostgreSQL text cannot hold U+0000; refusing it here keeps one event from
    /// failing the whole group commit it would be written in.
    private static func refuseNUL(_ text: String, _ field: String) throws(Rejection) {
        if text.utf8.contains(0) { throw Rejection(field: field, rule: "must not contain NUL (U+0000) characters") }
    }

    private func optionalInteger(_ value: RawValue?, _ field: String) throws(Rejection) -> Int64? {
        guard let value, value != .null else { return nil }
        let literal: String
        switch value {
        case .number(let text): literal = text
        case .string(let text) where acceptsTextValues:
            if text.isEmpty { return nil }
            literal = text
        default: throw Rejection(field: field, rule: "must be an integer, got \(value.kindName)")
        }
        guard let number = Int64(literal) else { throw Rejection(field: field, rule: "must be a 64-bit integer") }
        return number
    }

    private func optionalBool(_ value: RawValue?, _ field: String) throws(Rejection) -> Bool? {
        guard let value, value != .null else { return nil }
        switch value {
        case .bool(let flag): return flag
        case .string(let text) where acceptsTextValues:
            switch text.lowercased() {
            case "": return nil
            case "true", "1": return true
            case "false", "0": return false
            default: throw Rejection(field: field, rule: "must be true or false")
            }
        default: throw Rejection(field: field, rule: "must be a boolean, got \(value.kindName)")
        }
    }

    // MARK: - Rules

    /// `[a-z0-9_.-]{1,32}`.
    public static func isNetworkName(_ text: String) -> Bool {
        let bytes = text.utf8
        guard (1...32).contains(bytes.count) else { return false }
        return bytes.allSatisfy { byte in
            (0x61...0x7A).contains(byte) || (0x30...0x39).contains(byte) || byte == 0x5F || byte == 0x2E || byte == 0x2D
        }
    }

    /// The most revenue one event may report: 10^15 micros, a billion units of its
    /// currency. No single impression or tap earns near that in any currency (even at
    /// ~10^6 units to the US dollar it is $1,000 per event), and it keeps every sum
    /// of one request (at most 1,000 events: 10^18) inside a 64-bit integer. Larger
    /// sums (a group commit, the rollups over years) are checked or numeric.
    public static let maxRevenueMicros: Int64 = 1_000_000_000_000_000

    /// `WxH` with 1–4 digit sides, both non-zero.
    static func isBannerSize(_ text: String) -> Bool {
        var width = 0, height = 0, digits = 0, seenX = false
        for byte in text.utf8 {
            if byte == UInt8(ascii: "x") {
                guard !seenX, (1...4).contains(digits) else { return false }
                seenX = true
                digits = 0
            } else if byte >= 0x30 && byte <= 0x39 {
                digits += 1
                // A fifth digit already breaks the rule; stopping here also keeps the
                // side from growing past any integer.
                guard digits <= 4 else { return false }
                if seenX { height = height * 10 + Int(byte - 0x30) } else { width = width * 10 + Int(byte - 0x30) }
            } else {
                return false
            }
        }
        return seenX && (1...4).contains(digits) && width > 0 && height > 0
    }

    static func micros(_ duration: Duration) -> Int64 {
        duration.components.seconds * 1_000_000 + duration.components.attoseconds / 1_000_000_000_000
    }

    static func describe(_ duration: Duration) -> String {
        let seconds = duration.components.seconds
        if seconds % 86_400 == 0 { return "\(seconds / 86_400) day\(seconds == 86_400 ? "" : "s")" }
        if seconds % 3600 == 0 { return "\(seconds / 3600) hour\(seconds == 3600 ? "" : "s")" }
        return "\(seconds) seconds"
    }
}
