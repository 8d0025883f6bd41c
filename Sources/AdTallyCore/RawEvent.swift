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
    public var id: RawValue?
    public var type: RawValue?
    public var occurredAt: RawValue?
    public var network: RawValue?
    public var format: RawValue?
    public var placement: RawValue?
    public var size: RawValue?
    public var country: RawValue?
    public var platform: RawValue?
    public var osVersion: RawValue?
    public var appVersion: RawValue?
    public var device: RawValue?
    public var revenueMicros: RawValue?
    public var currency: RawValue?
    public var errorCode: RawValue?
    public var willLeave: RawValue?
    public var shown: RawValue?
    public var app: RawValue?

    /// An event with no fields.
    public init() {}

    /// The field names events may carry (DESIGN §2); others are ignored.
    public static let fieldNames = [
        "id", "type", "occurred_at", "network", "format", "placement", "size", "country", "platform",
        "os_version", "app_version", "device", "revenue_micros", "currency", "error_code", "will_leave", "shown", "app",
    ]

    /// Sets a field by its wire name; returns false for a name events do not have.
    @discardableResult
    public mutating func set(_ name: String, _ value: RawValue) -> Bool {
        switch name {
        case "id": id = value
        case "type": type = value
        case "occurred_at": occurredAt = value
        case "network": network = value
        case "format": format = value
        case "placement": placement = value
        case "size": size = value
        case "country": country = value
        case "platform": platform = value
        case "os_version": osVersion = value
        case "app_version": appVersion = value
        case "device": device = value
        case "revenue_micros": revenueMicros = value
        case "currency": currency = value
        case "error_code": errorCode = value
        case "will_leave": willLeave = value
        case "shown": shown = value
        case "app": app = value
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
