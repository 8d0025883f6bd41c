import Foundation

/// A value as it arrived, before validation.
public enum RawValue: Sendable, Equatable {
    case string(String)
    /// A JSON number, as its literal text.
    case number(String)
    case bool(Bool)
    case null
    /// A JSON array or object, which no event field accepts.
    case composite

    var kindName: String {
        switch self {
        case .string: "a string"
        case .number: "a number"
        case .bool: "a boolean"
        case .null: "null"
        case .composite: "an array or object"
        }
    }
}

/// The fields of one submitted event, by name, before validation.
public struct RawEvent: Sendable, Equatable {
    /// `id` as submitted.
    public var id: RawValue?
    /// `type` as submitted.
    public var type: RawValue?
    /// `occurred_at` as submitted.
    public var occurredAt: RawValue?
    /// `network` as submitted.
    public var network: RawValue?
    /// `format` as submitted.
    public var format: RawValue?
    /// `placement` as submitted.
    public var placement: RawValue?
    /// `size` as submitted.
    public var size: RawValue?
    /// `country` as submitted.
    public var country: RawValue?
    /// `platform` as submitted.
    public var platform: RawValue?
    /// `os_version` as submitted.
    public var osVersion: RawValue?
    /// `app_version` as submitted.
    public var appVersion: RawValue?
    /// `device` as submitted.
    public var device: RawValue?
    /// `revenue_micros` as submitted.
    public var revenueMicros: RawValue?
    /// `currency` as submitted.
    public var currency: RawValue?
    /// `error_code` as submitted.
    public var errorCode: RawValue?
    /// `will_leave` as submitted.
    public var willLeave: RawValue?
    /// `shown` as submitted.
    public var shown: RawValue?
    /// `app` as submitted.
    public var app: RawValue?

    /// An event with no fields.
    public init() {}

    /// Sets a field by its wire name; returns false for a name events do not have.
    @discardableResult
    public mutating func set(_ name: String, _ value: RawValue) -> Bool {
        var name = name
        return name.withUTF8 { set(nameBytes: $0, value) }
    }

    /// The same, by the name's UTF-8 bytes: dispatches on length and first byte
    /// instead of comparing against every field name in turn.
    @discardableResult
    public mutating func set(nameBytes name: UnsafeBufferPointer<UInt8>, _ value: RawValue) -> Bool {
        func matches(_ field: StaticString) -> Bool {
            field.utf8CodeUnitCount == name.count && memcmp(field.utf8Start, name.baseAddress!, name.count) == 0
        }
        guard let first = name.first else { return false }
        switch (name.count, first) {
        case (2, UInt8(ascii: "i")) where matches("id"): id = value
        case (4, UInt8(ascii: "t")) where matches("type"): type = value
        case (11, UInt8(ascii: "o")) where matches("occurred_at"): occurredAt = value
        case (7, UInt8(ascii: "n")) where matches("network"): network = value
        case (6, UInt8(ascii: "f")) where matches("format"): format = value
        case (9, UInt8(ascii: "p")) where matches("placement"): placement = value
        case (4, UInt8(ascii: "s")) where matches("size"): size = value
        case (7, UInt8(ascii: "c")) where matches("country"): country = value
        case (8, UInt8(ascii: "p")) where matches("platform"): platform = value
        case (10, UInt8(ascii: "o")) where matches("os_version"): osVersion = value
        case (11, UInt8(ascii: "a")) where matches("app_version"): appVersion = value
        case (6, UInt8(ascii: "d")) where matches("device"): device = value
        case (14, UInt8(ascii: "r")) where matches("revenue_micros"): revenueMicros = value
        case (8, UInt8(ascii: "c")) where matches("currency"): currency = value
        case (10, UInt8(ascii: "e")) where matches("error_code"): errorCode = value
        case (10, UInt8(ascii: "w")) where matches("will_leave"): willLeave = value
        case (5, UInt8(ascii: "s")) where matches("shown"): shown = value
        case (3, UInt8(ascii: "a")) where matches("app"): app = value
        default: return false
        }
        return true
    }

    /// The id as submitted, when it is a string (for rejection reports).
    public var idText: String? {
        if case .string(let text) = id { return text }
        return nil
    }
}
