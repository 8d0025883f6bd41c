import Foundation
import TextFormats

/// A PostgreSQL type OID, as found in `pg_type`.
public typealias PostgresTypeOID = UInt32

/// A Swift value that can be sent to PostgreSQL as a bound parameter, in text format.
public protocol PostgresEncodable: Sendable {
    /// The type the server should read the parameter as; 0 lets the server infer it.
    static var postgresType: PostgresTypeOID { get }
    /// The value in PostgreSQL's text input format.
    var postgresText: String { get }
    /// Appends `postgresText` as UTF-8; types on hot paths write it without a String.
    func appendPostgresText(to out: inout [UInt8])
}

extension PostgresEncodable {
    public func appendPostgresText(to out: inout [UInt8]) {
        out.append(contentsOf: postgresText.utf8)
    }
}

/// A `timestamptz` given as microseconds since the Unix epoch (UTC).
public struct PostgresMicros: PostgresEncodable, Hashable {
    /// Microseconds since 1970-01-01T00:00:00Z.
    public var micros: Int64
    /// Wraps microseconds.
    public init(_ micros: Int64) { self.micros = micros }

    public static var postgresType: PostgresTypeOID { 1184 }
    public var postgresText: String { CivilTime.timestamp(micros: micros) }
    public func appendPostgresText(to out: inout [UInt8]) { CivilTime.appendTimestamp(micros: micros, to: &out) }
}

/// One bound parameter: its text (nil for SQL NULL) and its type.
public struct PostgresBind: Sendable, Equatable {
    /// The text-format value, or nil for NULL.
    public var text: String?
    /// The parameter type OID (0: inferred by the server).
    public var type: PostgresTypeOID

    /// Creates a bind from text already in PostgreSQL's input format.
    public init(text: String?, type: PostgresTypeOID) {
        self.text = text
        self.type = type
    }

    /// Creates a bind from an encodable value.
    public init<T: PostgresEncodable>(_ value: T?) {
        self.text = value?.postgresText
        self.type = T.postgresType
    }
}

extension String: PostgresEncodable {
    // 0 (unknown) lets the server coerce a string to the column's type (uuid, date, ...).
    public static var postgresType: PostgresTypeOID { 0 }
    public var postgresText: String { self }
}

extension Substring: PostgresEncodable {
    public static var postgresType: PostgresTypeOID { 0 }
    public var postgresText: String { String(self) }
}

extension Int: PostgresEncodable {
    public static var postgresType: PostgresTypeOID { 20 }
    public var postgresText: String { String(self) }
}

extension Int64: PostgresEncodable {
    public static var postgresType: PostgresTypeOID { 20 }
    public var postgresText: String { String(self) }
}

extension Int32: PostgresEncodable {
    public static var postgresType: PostgresTypeOID { 23 }
    public var postgresText: String { String(self) }
}

extension Int16: PostgresEncodable {
    public static var postgresType: PostgresTypeOID { 21 }
    public var postgresText: String { String(self) }
}

extension Double: PostgresEncodable {
    public static var postgresType: PostgresTypeOID { 701 }
    public var postgresText: String {
        if isNaN { return "NaN" }
        if isInfinite { return self < 0 ? "-Infinity" : "Infinity" }
        return "\(self)"
    }
}

extension Bool: PostgresEncodable {
    public static var postgresType: PostgresTypeOID { 16 }
    public var postgresText: String { self ? "t" : "f" }
}

extension UUID: PostgresEncodable {
    public static var postgresType: PostgresTypeOID { 2950 }
    public var postgresText: String { UUIDText.string(self) }
    public func appendPostgresText(to out: inout [UInt8]) { UUIDText.append(self, to: &out) }
}

extension Date: PostgresEncodable {
    public static var postgresType: PostgresTypeOID { 1184 }
    /// ISO 8601 in UTC with microseconds, the precision of `timestamptz`.
    public var postgresText: String { PostgresTimestamp.format(self) }
}

/// Raw bytes for a `bytea` parameter.
public struct PostgresBytes: PostgresEncodable, PostgresDecodable, Hashable {
    /// The bytes.
    public var bytes: [UInt8]
    /// Wraps bytes.
    public init(_ bytes: [UInt8]) { self.bytes = bytes }

    public static var postgresType: PostgresTypeOID { 17 }
    public var postgresText: String {
        let digits = Array("0123456789abcdef".utf8)
        var out = [UInt8]()
        out.reserveCapacity(2 + bytes.count * 2)
        out.append(UInt8(ascii: "\\"))
        out.append(UInt8(ascii: "x"))
        for byte in bytes {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 0xF)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    public static func decodePostgres(_ text: String) -> PostgresBytes? {
        var utf8 = Array(text.utf8)
        guard utf8.count >= 2, utf8[0] == UInt8(ascii: "\\"), utf8[1] == UInt8(ascii: "x"),
              utf8.count % 2 == 0 else { return nil }
        utf8.removeFirst(2)
        var bytes = [UInt8]()
        bytes.reserveCapacity(utf8.count / 2)
        var index = 0
        while index < utf8.count {
            guard let high = hexValue(utf8[index]), let low = hexValue(utf8[index + 1]) else { return nil }
            bytes.append(high << 4 | low)
            index += 2
        }
        return PostgresBytes(bytes)
    }

    private static func hexValue(_ char: UInt8) -> UInt8? {
        switch char {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): char - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): char - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): char - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}
