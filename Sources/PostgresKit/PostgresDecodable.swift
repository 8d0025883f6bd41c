import Foundation
import TextFormats

/// A Swift type that a result column can be decoded into, from PostgreSQL's text output.
///
/// Connections are opened with `DateStyle=ISO`, `TimeZone=UTC` and
/// `bytea_output=hex`, so the text forms below are the only ones to parse.
public protocol PostgresDecodable: Sendable {
    /// Parses the text form of a non-NULL value; nil when it is not valid for this type.
    static func decodePostgres(_ text: String) -> Self?
    /// Whether SQL NULL decodes to a value (true only for Optional).
    static var acceptsNull: Bool { get }
    /// The value NULL decodes to, when `acceptsNull`.
    static var nullValue: Self? { get }
}

extension PostgresDecodable {
    public static var acceptsNull: Bool { false }
    public static var nullValue: Self? { nil }
}

extension Optional: PostgresDecodable where Wrapped: PostgresDecodable {
    public static func decodePostgres(_ text: String) -> Wrapped?? {
        Wrapped.decodePostgres(text).map { .some($0) }
    }
    public static var acceptsNull: Bool { true }
    public static var nullValue: Wrapped?? { .some(nil) }
}

extension String: PostgresDecodable {
    public static func decodePostgres(_ text: String) -> String? { text }
}

extension Int: PostgresDecodable {
    public static func decodePostgres(_ text: String) -> Int? { Int(text) }
}

extension Int64: PostgresDecodable {
    public static func decodePostgres(_ text: String) -> Int64? { Int64(text) }
}

extension Int32: PostgresDecodable {
    public static func decodePostgres(_ text: String) -> Int32? { Int32(text) }
}

extension Int16: PostgresDecodable {
    public static func decodePostgres(_ text: String) -> Int16? { Int16(text) }
}

extension Double: PostgresDecodable {
    public static func decodePostgres(_ text: String) -> Double? { Double(text) }
}

extension Bool: PostgresDecodable {
    public static func decodePostgres(_ text: String) -> Bool? {
        switch text {
        case "t", "true": true
        case "f", "false": false
        default: nil
        }
    }
}

extension UUID: PostgresDecodable {
    public static func decodePostgres(_ text: String) -> UUID? { UUIDText.parse(text) }
}

extension Date: PostgresDecodable {
    public static func decodePostgres(_ text: String) -> Date? { PostgresTimestamp.parse(text) }
}

/// Text conversion of `timestamptz` values in the session settings AdTally uses.
public enum PostgresTimestamp {
    /// Formats a date as `YYYY-MM-DD HH:MM:SS.ffffff+00`.
    public static func format(_ date: Date) -> String {
        format(micros: Int64((date.timeIntervalSince1970 * 1_000_000).rounded()))
    }

    /// Formats microseconds since the epoch as `YYYY-MM-DD HH:MM:SS.ffffff+00`.
    public static func format(micros: Int64) -> String { CivilTime.timestamp(micros: micros) }

    /// Parses ISO output such as `2026-11-21 10:31:19.123456+00` or `...+05:30`.
    public static func parse(_ text: String) -> Date? {
        let chars = Array(text.utf8)
        var index = 0
        func number(_ count: Int) -> Int? {
            guard index + count <= chars.count else { return nil }
            var value = 0
            for offset in 0..<count {
                let char = chars[index + offset]
                guard char >= 48, char <= 57 else { return nil }
                value = value * 10 + Int(char - 48)
            }
            index += count
            return value
        }
        func expect(_ char: Character) -> Bool {
            guard index < chars.count, chars[index] == char.asciiValue! else { return false }
            index += 1
            return true
        }
        guard let year = number(4), expect("-"), let month = number(2), expect("-"), let day = number(2),
              expect(" ") || expect("T"),
              let hour = number(2), expect(":"), let minute = number(2), expect(":"), let second = number(2)
        else { return nil }
        var fraction = 0.0
        if index < chars.count, chars[index] == UInt8(ascii: ".") {
            index += 1
            var scale = 0.1
            while index < chars.count, chars[index] >= 48, chars[index] <= 57 {
                fraction += Double(chars[index] - 48) * scale
                scale /= 10
                index += 1
            }
        }
        var offsetSeconds = 0
        if index < chars.count {
            let sign: Int
            switch chars[index] {
            case UInt8(ascii: "+"): sign = 1
            case UInt8(ascii: "-"): sign = -1
            case UInt8(ascii: "Z"): sign = 0
            default: return nil
            }
            index += 1
            if sign != 0 {
                guard let hours = number(2) else { return nil }
                var minutes = 0
                var secs = 0
                if expect(":") { guard let value = number(2) else { return nil }; minutes = value }
                if expect(":") { guard let value = number(2) else { return nil }; secs = value }
                offsetSeconds = sign * (hours * 3600 + minutes * 60 + secs)
            }
        }
        guard index == chars.count else { return nil }
        let days = CivilTime.days(year: year, month: month, day: day)
        let epochSeconds = days * 86_400 + hour * 3600 + minute * 60 + second - offsetSeconds
        return Date(timeIntervalSince1970: Double(epochSeconds) + fraction)
    }
}
