import Foundation

/// The rules of an erasure request (DESIGN §15) and the keyed hash its tombstones hold.
public enum DeviceErasure {
    /// Most devices one request erases (a bulk request; PostHog's bound too).
    public static let maxDevices = 1000

    /// The devices of a request, checked: 1 to `maxDevices` ids, each a device as events
    /// give it (`device`: 1 to 64 characters, no NUL), each once (repeats are folded).
    /// The error names the field (`devices[3]`) and the rule.
    public static func devices(_ ids: [String]) throws(FieldError) -> [String] {
        guard !ids.isEmpty else { throw FieldError("devices", "must name at least one device") }
        guard ids.count <= maxDevices else { throw FieldError("devices", "must name at most \(maxDevices) devices (\(ids.count) given); split the request") }
        var seen = Set<String>()
        var kept: [String] = []
        for (index, id) in ids.enumerated() {
            guard isDevice(id) else { throw FieldError("devices[\(index)]", deviceRule) }
            if seen.insert(id).inserted { kept.append(id) }
        }
        return kept
    }

    /// Whether `id` is a device id as the events carry it.
    public static func isDevice(_ id: String) -> Bool {
        !id.isEmpty && TextRule.device.allows(id) && !id.utf8.contains(0)
    }

    /// What `isDevice` requires.
    public static let deviceRule = "must be a device id as the events give it: 1 to 64 characters, no NUL"

    /// The key tombstones are hashed with, derived from the servers' credentials key
    /// (`ADTALLY_CREDENTIALS_KEY`, or the database's own secret): a purpose of its own, so
    /// that no other use of that key ever computes the same bytes.
    public static func tombstoneKey(credentialsKey: String) -> [UInt8] {
        SHA256.hmac(key: Array(credentialsKey.utf8), message: Array("adtally device tombstones v1".utf8))
    }

    /// HMAC-SHA-256 of the app and the device (a zero byte between: no app and device pair
    /// runs into another's). Without the key, a tombstone cannot be checked against a guessed id.
    public static func tombstone(key: [UInt8], app: String, device: String) -> [UInt8] {
        var message = Array(app.utf8)
        message.append(0)
        message.append(contentsOf: device.utf8)
        return SHA256.hmac(key: key, message: message)
    }

    /// Where an erasure job stands.
    public enum Status: String, Sendable, Codable, CaseIterable {
        case queued, running, done, failed
    }
}
