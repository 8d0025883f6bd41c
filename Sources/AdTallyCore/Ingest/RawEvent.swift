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
    /// `revenue_precision` as submitted.
    public var revenuePrecision: RawValue?
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

    /// What `set` did with a field.
    public enum SetOutcome: Sendable, Equatable {
        /// The field was stored.
        case stored
        /// Events have no field of that name; nothing was stored.
        case unknown
        /// The field had a value already (the name came twice); the first is kept.
        case duplicate
    }

    /// Sets a field by its wire name.
    @discardableResult
    public mutating func set(_ name: String, _ value: RawValue) -> SetOutcome {
        var name = name
        return name.withUTF8 { set(nameBytes: $0, value) }
    }

    /// The same, by the name's UTF-8 bytes: dispatches on length and first byte
    /// instead of comparing against every field name in turn.
    @discardableResult
    public mutating func set(nameBytes name: UnsafeBufferPointer<UInt8>, _ value: RawValue) -> SetOutcome {
        func matches(_ field: StaticString) -> Bool {
            field.utf8CodeUnitCount == name.count && memcmp(field.utf8Start, name.baseAddress!, name.count) == 0
        }
        func store(_ field: inout RawValue?) -> SetOutcome {
            if field != nil { return .duplicate }
            field = value
            return .stored
        }
        guard let first = name.first else { return .unknown }
        switch (name.count, first) {
        case (2, UInt8(ascii: "i")) where matches("id"): return store(&id)
        case (4, UInt8(ascii: "t")) where matches("type"): return store(&type)
        case (11, UInt8(ascii: "o")) where matches("occurred_at"): return store(&occurredAt)
        case (7, UInt8(ascii: "n")) where matches("network"): return store(&network)
        case (6, UInt8(ascii: "f")) where matches("format"): return store(&format)
        case (9, UInt8(ascii: "p")) where matches("placement"): return store(&placement)
        case (4, UInt8(ascii: "s")) where matches("size"): return store(&size)
        case (7, UInt8(ascii: "c")) where matches("country"): return store(&country)
        case (8, UInt8(ascii: "p")) where matches("platform"): return store(&platform)
        case (10, UInt8(ascii: "o")) where matches("os_version"): return store(&osVersion)
        case (11, UInt8(ascii: "a")) where matches("app_version"): return store(&appVersion)
        case (6, UInt8(ascii: "d")) where matches("device"): return store(&device)
        case (14, UInt8(ascii: "r")) where matches("revenue_micros"): return store(&revenueMicros)
        case (8, UInt8(ascii: "c")) where matches("currency"): return store(&currency)
        case (17, UInt8(ascii: "r")) where matches("revenue_precision"): return store(&revenuePrecision)
        case (10, UInt8(ascii: "e")) where matches("error_code"): return store(&errorCode)
        case (10, UInt8(ascii: "w")) where matches("will_leave"): return store(&willLeave)
        case (5, UInt8(ascii: "s")) where matches("shown"): return store(&shown)
        case (3, UInt8(ascii: "a")) where matches("app"): return store(&app)
        default: return .unknown
        }
    }

    /// The id as submitted, when it is a string (for rejection reports).
    public var idText: String? {
        if case .string(let text) = id { return text }
        return nil
    }
}
