import Foundation

/// Rules for apps and keys.
public enum AppRules {
    /// `[a-z0-9][a-z0-9_.-]{0,63}`.
    public static func isAppID(_ text: String) -> Bool {
        let bytes = Array(text.utf8)
        guard (1...64).contains(bytes.count) else { return false }
        func allowed(_ byte: UInt8) -> Bool {
            (0x61...0x7A).contains(byte) || (0x30...0x39).contains(byte) || byte == 0x5F || byte == 0x2E || byte == 0x2D
        }
        guard bytes.allSatisfy(allowed), bytes[0] != 0x5F, bytes[0] != 0x2E, bytes[0] != 0x2D else { return false }
        return true
    }

    /// Whether `name` is an IANA time zone this system knows.
    public static func isTimeZone(_ name: String) -> Bool {
        TimeZone(identifier: name) != nil && (name == "UTC" || name.contains("/") || TimeZone.knownTimeZoneIdentifiers.contains(name))
    }

    /// Most characters of an app's display name.
    public static let maxNameLength = 200

    /// Validates an app's fields; the error names the field and the rule.
    public static func validateApp(id: String, name: String? = nil, timezone: String, currency: String) throws(EventValidator.Rejection) {
        guard isAppID(id) else {
            throw .init(field: "app", rule: "\"\(id)\" must match [a-z0-9][a-z0-9_.-]{0,63}")
        }
        if let name {
            guard !name.isEmpty, TextRule.appName.allows(name) else {
                throw .init(field: "name", rule: "must be 1 to \(maxNameLength) characters (at most \(TextRule.appName.bytes) bytes of UTF-8)")
            }
            guard !name.unicodeScalars.contains(where: { $0.properties.generalCategory == .control }) else {
                throw .init(field: "name", rule: "must not contain control characters (such as NUL or line breaks)")
            }
        }
        guard isTimeZone(timezone) else {
            throw .init(field: "timezone", rule: "\"\(timezone)\" is not an IANA time zone (e.g. Europe/Berlin, UTC)")
        }
        guard ISOCodes.isCurrency(currency) else {
            throw .init(field: "currency", rule: "\"\(currency)\" is not an ISO 4217 currency code (e.g. USD)")
        }
    }
}
