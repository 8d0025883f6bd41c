import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// An ad format (DESIGN §2).
public enum AdFormat: String, Sendable, CaseIterable {
    case banner, interstitial, native, rewarded
}

/// How the network SDK knew a revenue amount: AdMob's `GADAdValuePrecision`
/// (precise, estimated, publisher provided, unknown); LevelPlay's BID → precise,
/// RATE → publisherProvided, CPM → estimated.
public enum RevenuePrecision: String, Sendable, CaseIterable {
    case precise, estimated
    case publisherProvided = "publisher_provided"
    case unknown
}

/// Something the kit reports to the app as it happens.
public enum AdTallyNotice: Sendable, Equatable {
    /// Events left the queue unsent: the queue was at its byte bound (oldest first),
    /// they were older than the server accepts, or a damaged record was skipped.
    case dropped(count: Int, reason: DropReason)
    /// The server refused an event for good (a rule it broke, e.g. too old); it is in
    /// the dead-letter file with this reason and is never sent again.
    case rejected(id: UUID, reason: String)
    /// The server refused the key (401 or 403: revoked, unknown or another app's).
    /// Sending stops and the queue is kept; `resumeSending()` or a new `AdTally` tries again.
    case sendingStopped(status: Int, detail: String)
    /// A batch failed for a reason that will be retried (offline, 5xx, 429/503, a stalled
    /// link cut at the deadline).
    case sendFailed(String)
    /// Something other than AdTally answered — a captive portal's page, a proxy's 413 or
    /// 400, a redirect, a 200 that is not AdTally's receipt — and was not believed: the
    /// events stay queued and are sent again later. `detail` names what answered; for a
    /// redirect, the URL the kit's server should be configured with.
    case unexpectedAnswer(status: Int, detail: String)
}

/// Why events were dropped.
public enum DropReason: String, Sendable, CaseIterable {
    /// The queue reached its byte bound; the oldest went first.
    case queueFull = "queue_full"
    /// Older than `maxEventAge` (the server's window) before they could be sent.
    case expired
    /// The queue's files were damaged: a record torn by power loss or corrupted, or a
    /// segment deleted, replaced (a directory in its place) or unreadable.
    case damaged
    /// Queued when the install was forgotten (`forgetInstall()`).
    case forgotten
    /// Queued when the user opted out (`optOut()`).
    case optedOut = "opted_out"
}

/// Errors of the kit. Calls out of order are `misuse`: a programming error of the
/// app, reported and not sent.
public enum AdTallyError: Error, Sendable, Equatable, CustomStringConvertible {
    /// A call that breaks the ad lifecycle (DESIGN §1) or a value that breaks a rule of DESIGN §2.
    case misuse(String)
    /// The queue folder cannot be written.
    case storage(String)
    /// Another process holds the queue folder (one sender per queue).
    case directoryInUse(String)
    /// The server refused the key; sending has stopped.
    case sendingStopped(status: Int, detail: String)
    /// The instance was closed.
    case closed

    public var description: String {
        switch self {
        case .misuse(let text): "AdTally misuse: \(text)"
        case .storage(let text): "AdTally storage: \(text)"
        case .directoryInUse(let path): "AdTally: the queue folder \(path) is used by another process"
        case .sendingStopped(let status, let detail): "AdTally: the server refused the key (\(status)): \(detail)"
        case .closed: "AdTally: closed"
        }
    }
}

/// Builds an event's JSON object by hand: no encoder on the recording path.
struct EventJSON {
    private(set) var bytes: [UInt8] = []

    init(id: UUID, type: String, occurredAtMillis: Int64) {
        bytes.reserveCapacity(320)
        bytes.append(contentsOf: #"{"id":""#.utf8)
        bytes.append(contentsOf: id.uuidString.lowercased().utf8)
        bytes.append(contentsOf: #"","type":""#.utf8)
        bytes.append(contentsOf: type.utf8)
        bytes.append(contentsOf: #"","occurred_at":""#.utf8)
        Self.appendTimestamp(occurredAtMillis, to: &bytes)
        bytes.append(UInt8(ascii: "\""))
    }

    mutating func add(_ name: String, _ value: String?) {
        guard let value else { return }
        bytes.append(contentsOf: ",\"\(name)\":".utf8)
        Self.appendString(value, to: &bytes)
    }

    mutating func add(_ name: String, _ value: Int64?) {
        guard let value else { return }
        bytes.append(contentsOf: ",\"\(name)\":\(value)".utf8)
    }

    mutating func add(_ name: String, _ value: Bool?) {
        guard let value else { return }
        bytes.append(contentsOf: ",\"\(name)\":\(value ? "true" : "false")".utf8)
    }

    mutating func finish() -> [UInt8] {
        bytes.append(UInt8(ascii: "}"))
        return bytes
    }

    /// `YYYY-MM-DDTHH:MM:SS.mmmZ`.
    static func appendTimestamp(_ millis: Int64, to out: inout [UInt8]) {
        var seconds = time_t(millis >= 0 ? millis / 1000 : (millis - 999) / 1000)
        let fraction = Int(((millis % 1000) + 1000) % 1000)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        func two(_ value: Int32) {
            out.append(UInt8(48 + value / 10))
            out.append(UInt8(48 + value % 10))
        }
        let year = Int32(parts.tm_year) + 1900
        two(year / 100 % 100); two(year % 100)
        out.append(UInt8(ascii: "-")); two(parts.tm_mon + 1)
        out.append(UInt8(ascii: "-")); two(parts.tm_mday)
        out.append(UInt8(ascii: "T")); two(parts.tm_hour)
        out.append(UInt8(ascii: ":")); two(parts.tm_min)
        out.append(UInt8(ascii: ":")); two(parts.tm_sec)
        out.append(UInt8(ascii: "."))
        out.append(UInt8(48 + fraction / 100))
        out.append(UInt8(48 + fraction / 10 % 10))
        out.append(UInt8(48 + fraction % 10))
        out.append(UInt8(ascii: "Z"))
    }

    static func appendString(_ text: String, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "\""): out.append(contentsOf: #"\""#.utf8)
            case UInt8(ascii: "\\"): out.append(contentsOf: #"\\"#.utf8)
            case 0..<0x20: out.append(contentsOf: String(format: "\\u%04x", byte).utf8)
            default: out.append(byte)
            }
        }
        out.append(UInt8(ascii: "\""))
    }
}

/// The rules of DESIGN §2 the kit checks before it records, so that a bad value is
/// the app's error at the call, not a rejection found hours later.
enum EventRules {
    static func checkNetwork(_ name: String) throws {
        let bytes = name.utf8
        guard (1...32).contains(bytes.count), bytes.allSatisfy({ (0x61...0x7A).contains($0) || (0x30...0x39).contains($0) || $0 == 0x5F || $0 == 0x2E || $0 == 0x2D }) else {
            throw AdTallyError.misuse("network \"\(name)\" must match [a-z0-9_.-]{1,32}")
        }
    }

    static func checkPlacement(_ name: String) throws {
        guard (1...64).contains(name.count), name.utf8.count <= 256, !name.utf8.contains(0) else {
            throw AdTallyError.misuse("placement must be 1 to 64 characters without NUL")
        }
    }

    static func checkSize(_ size: String) throws {
        let parts = size.split(separator: "x", omittingEmptySubsequences: false)
        guard parts.count == 2, parts.allSatisfy({ (1...4).contains($0.count) && $0.allSatisfy(\.isASCII) && Int($0).map { $0 > 0 } == true }) else {
            throw AdTallyError.misuse("size \"\(size)\" must be WIDTHxHEIGHT in points, e.g. 320x50")
        }
    }

    static func checkCurrency(_ code: String) throws {
        guard code.utf8.count == 3, code.utf8.allSatisfy({ (0x41...0x5A).contains($0) }) else {
            throw AdTallyError.misuse("currency \"\(code)\" must be an ISO 4217 code in capitals, e.g. USD")
        }
    }

    static func checkVersion(_ text: String, _ field: String) throws {
        guard text.count <= 32, text.utf8.count <= 128, !text.utf8.contains(0) else {
            throw AdTallyError.misuse("\(field) must be at most 32 characters")
        }
    }
}
