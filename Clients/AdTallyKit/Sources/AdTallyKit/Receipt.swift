import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// AdTally's receipt for a batch (`POST /v1/events`, 200): how many events it stored,
/// how many it already had, and which it refused and why. Believed only when it is
/// AdTally's (DESIGN §10): JSON, the three fields, every index in the batch and named
/// once, and the counts adding up to the batch.
@_spi(Answers) public struct Receipt: Equatable, Sendable {
    /// An event AdTally refused for good: its place in the batch and the rule it broke.
    public struct Rejection: Equatable, Sendable {
        public var index: Int
        public var reason: String
    }

    public var accepted: Int
    public var duplicates: Int
    public var rejected: [Rejection]
    /// Events not stored because their install was erased after they occurred (their
    /// indexes; counted among `duplicates` too): delivered.
    public var erased: [Int] = []

    /// The most bytes of a receipt read: 1,000 rejections with their reasons fit well
    /// within it; a larger answer is not AdTally's and is read no further.
    public static let maxBytes = 512 << 10
    /// A rejection's reason is kept to this many bytes (AdTally's are under 200).
    static let maxReasonBytes = 1024

    private struct Wire: Decodable {
        struct Entry: Decodable {
            var index: Int
            var error: String?
        }
        var accepted: Int
        var duplicates: Int
        var rejected: [Entry]
        var erased: [Entry]?
    }

    /// The receipt in `body` for a batch of `count` events, or why it is not one.
    public static func parse(_ body: Data, mediaType: String, count: Int) -> Result<Receipt, AnswerRefusal> {
        guard mediaType == "application/json" else {
            return .failure(AnswerRefusal("a 200 that is not JSON (\(mediaType.isEmpty ? "no content type" : mediaType), \(body.count) bytes)"))
        }
        guard body.count <= maxBytes, let wire = try? JSONDecoder().decode(Wire.self, from: body) else {
            return .failure(AnswerRefusal("a 200 whose JSON is not AdTally's receipt (\(body.count) bytes)"))
        }
        guard (0...count).contains(wire.accepted), (0...count).contains(wire.duplicates), wire.rejected.count <= count else {
            return .failure(AnswerRefusal("a receipt whose counts are outside the batch of \(count)"))
        }
        guard wire.accepted + wire.duplicates + wire.rejected.count == count else {
            return .failure(AnswerRefusal(
                "a receipt for \(wire.accepted + wire.duplicates + wire.rejected.count) events (accepted \(wire.accepted), duplicates \(wire.duplicates), rejected \(wire.rejected.count)) for a batch of \(count)"
            ))
        }
        var seen = Set<Int>()
        var rejected: [Rejection] = []
        rejected.reserveCapacity(wire.rejected.count)
        for entry in wire.rejected {
            guard (0..<count).contains(entry.index) else {
                return .failure(AnswerRefusal("a receipt naming index \(entry.index), outside the batch of \(count)"))
            }
            guard seen.insert(entry.index).inserted else {
                return .failure(AnswerRefusal("a receipt naming index \(entry.index) twice"))
            }
            rejected.append(Rejection(index: entry.index, reason: Self.bounded(entry.error ?? "rejected")))
        }
        let erased = wire.erased?.map(\.index) ?? []
        guard erased.count <= wire.duplicates, Set(erased).count == erased.count, erased.allSatisfy({ (0..<count).contains($0) && !seen.contains($0) }) else {
            return .failure(AnswerRefusal("a receipt whose erased events are not among its duplicates of the batch of \(count)"))
        }
        return .success(Receipt(accepted: wire.accepted, duplicates: wire.duplicates, rejected: rejected, erased: erased))
    }

    /// `text` cut to `maxReasonBytes` on a character boundary, control characters as spaces.
    static func bounded(_ text: String) -> String {
        var out = ""
        var bytes = 0
        for scalar in text.unicodeScalars {
            let length = String(scalar).utf8.count
            guard bytes + length <= maxReasonBytes else { break }
            bytes += length
            out.unicodeScalars.append(scalar.value < 0x20 || scalar.value == 0x7F ? " " : scalar)
        }
        return out
    }
}

/// Why an answer was not believed, for the app's notice.
@_spi(Answers) public struct AnswerRefusal: Error, Equatable, Sendable, CustomStringConvertible {
    public var description: String
    init(_ description: String) { self.description = description }
}

/// What an answer to a batch means for the queue.
enum BatchOutcome: Equatable {
    /// AdTally's receipt: every event of the batch is answered.
    case delivered(Receipt)
    /// 413, or AdTally's own 400: the batch is halved. `byAdTally`: a single event refused
    /// so is a dead letter; a middlebox's refusal of a single event is retried instead.
    case split(String, byAdTally: Bool)
    /// AdTally refused the key (401/403 with its problem+json): sending stops.
    case stopped(Int, String)
    /// 429/503: retried after `Retry-After`, else the backoff.
    case retryAfter(TimeInterval?, String)
    /// No answer, or AdTally's own failure (5xx): retried with backoff.
    case failed(String)
    /// Something other than AdTally answered (a captive portal, a proxy, a redirect):
    /// retried with backoff, and the app told what answered.
    case notAdTally(status: Int, String)

    /// The meaning of `answer` to a batch of `count` events sent to `server`.
    static func judge(_ answer: WireAnswer, count: Int, server: URL) -> BatchOutcome {
        let problem = Problem(answer)
        switch answer.status {
        case 200:
            switch Receipt.parse(answer.body, mediaType: answer.mediaType, count: count) {
            case .success(let receipt): return .delivered(receipt)
            case .failure(let refusal): return .notAdTally(status: 200, "\(refusal)\(answer.via)")
            }
        case 300..<400:
            return .notAdTally(status: answer.status, Self.redirect(answer, server: server))
        case 413:
            return .split("413: \(problem?.detail ?? "content too large (not AdTally's answer\(answer.via))")", byAdTally: problem != nil)
        case 400 where problem != nil:
            return .split("400: \(problem!.detail)", byAdTally: true)
        case 401, 403:
            guard let problem else { return .notAdTally(status: answer.status, "\(answer.status) that is not AdTally's (\(answer.describedBody))\(answer.via)") }
            return .stopped(answer.status, problem.detail)
        case 429, 503:
            return .retryAfter(Self.retryAfter(answer.header("retry-after")), "\(answer.status): \(problem?.detail ?? HTTPStatusText.text(answer.status))")
        case 500..<600:
            return .failed("\(answer.status): \(problem?.detail ?? HTTPStatusText.text(answer.status))\(problem == nil ? answer.via : "")")
        default:
            if let problem { return .failed("\(answer.status): \(problem.detail)") }
            return .notAdTally(status: answer.status, "\(answer.status) that is not AdTally's (\(answer.describedBody))\(answer.via)")
        }
    }

    /// A redirect's notice: where it points, and the server URL the kit should be given.
    static func redirect(_ answer: WireAnswer, server: URL) -> String {
        guard let location = answer.header("location").map({ Receipt.bounded(String($0.prefix(2048))) }), !location.isEmpty else {
            return "a \(answer.status) redirect without a Location: not followed\(answer.via)"
        }
        var base = URL(string: location, relativeTo: server)?.absoluteURL.absoluteString ?? location
        for suffix in ["/v1/events", "/v1/client-drops", "/v1/mediation"] where base.hasSuffix(suffix) {
            base = String(base.dropLast(suffix.count))
        }
        return "a \(answer.status) redirect to \(location), not followed (a POST is never re-sent elsewhere): configure the server as \(base)"
    }

    /// `Retry-After` as seconds or an HTTP date, at most an hour.
    static func retryAfter(_ value: String?) -> TimeInterval? {
        guard let value = value?.trimmingCharacters(in: .whitespaces), !value.isEmpty, value.utf8.count <= 64 else { return nil }
        if let seconds = Double(value), seconds.isFinite, seconds >= 0 { return min(seconds, 3600) }
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss zzz"
        guard let date = formatter.date(from: value) else { return nil }
        return min(max(0, date.timeIntervalSinceNow), 3600)
    }
}

/// AdTally's own error answer: `application/problem+json` with its `status` and `detail`.
struct Problem {
    var detail: String

    init?(_ answer: WireAnswer) {
        struct Wire: Decodable {
            var status: Int
            var detail: String?
            var title: String?
        }
        guard answer.mediaType == "application/problem+json", answer.body.count <= Receipt.maxBytes,
              let wire = try? JSONDecoder().decode(Wire.self, from: answer.body), wire.status == answer.status else { return nil }
        detail = Receipt.bounded(wire.detail ?? wire.title ?? HTTPStatusText.text(answer.status))
    }
}

extension WireAnswer {
    /// What the body looked like, for a notice: its type and size.
    var describedBody: String {
        "\(mediaType.isEmpty ? "no content type" : mediaType), \(body.count) bytes"
    }

    /// ", from SERVER" when the answer named its server (a proxy often does).
    var via: String {
        guard let server = header("server"), !server.isEmpty else { return "" }
        return ", from \"\(Receipt.bounded(String(server.prefix(128))))\""
    }
}

/// A status code's reason phrase (HTTPURLResponse's, which both platforms have).
enum HTTPStatusText {
    static func text(_ status: Int) -> String { HTTPURLResponse.localizedString(forStatusCode: status) }
}
