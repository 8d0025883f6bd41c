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
        ISOTimestamp.parseMicros(text, rules: .postgres).map { Date(timeIntervalSince1970: Double($0) / 1_000_000) }
    }
}
