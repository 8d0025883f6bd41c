import AdTallyCore
import AdTallyStorage
import Foundation
import HTTPTypes
import Hummingbird
import Metrics
import NIOCore

/// Limits of one ingest request (DESIGN §2).
public struct IngestLimits: Sendable {
    /// Most events in one request.
    public var maxEvents: Int
    /// Most body bytes, compressed and decompressed alike.
    public var maxBytes: Int
    /// How old `occurred_at` may be.
    public var maxAge: Duration
    /// How far ahead of server time `occurred_at` may be.
    public var maxAhead: Duration
    /// Most ingest requests read and processed at once; more get 503 at once, so
    /// that the request bodies held in memory (each at most `maxBytes`, plus as
    /// much again when gzipped) stay bounded.
    public var maxConcurrent: Int
    /// Events before this time (microseconds since the epoch) are refused: their ids
    /// may be gone from the dedupe ledger (`EventStore.widenIDHorizon`).
    public var idsPrunedBeforeMicros: Int64?
    /// Longest a body may take to arrive in full: a client that sends a byte now and
    /// then would otherwise hold an ingest slot for good (408, and the connection closes).
    public var bodyTimeout: Duration = .seconds(60)

    /// The limits; the defaults are DESIGN §2's.
    public init(
        maxEvents: Int = 1000, maxBytes: Int = 1 << 20, maxAge: Duration = .seconds(7 * 86_400),
        maxAhead: Duration = .seconds(3600), maxConcurrent: Int = 256
    ) {
        self.maxEvents = maxEvents
        self.maxBytes = maxBytes
        self.maxAge = maxAge
        self.maxAhead = maxAhead
        self.maxConcurrent = maxConcurrent
    }
}

/// `POST /v1/events`: validate, queue for group commit, answer after the commit.
public struct IngestRoutes: Sendable {
    let authenticator: KeyAuthenticator
    let batcher: IngestBatcher
    let limits: IngestLimits
    let gate: ConcurrencyGate
    private let rejectedCounter = Counter(label: "adtally_ingest_events_total", dimensions: [("outcome", "rejected")])

    /// Creates the route.
    public init(authenticator: KeyAuthenticator, batcher: IngestBatcher, limits: IngestLimits) {
        self.authenticator = authenticator
        self.batcher = batcher
        self.limits = limits
        self.gate = ConcurrencyGate(limit: limits.maxConcurrent)
    }

    /// Adds the route to a router.
    public func register(on router: Routes) {
        router.post("v1/events") { request, context in try await ingest(request, channel: context.channel) }
    }

    struct Rejected: Encodable {
        var index: Int
        var id: String?
        var error: String
    }

    /// An event refused because its device was erased after it occurred (DESIGN §15):
    /// not stored, and delivered as far as the client is concerned.
    struct Erased: Encodable {
        var index: Int
        var id: String
    }

    struct IngestReceipt: Encodable {
        var accepted: Int
        var duplicates: Int
        var rejected: [Rejected]
        /// Only when some event was erased.
        var erased: [Erased]?
    }

    func ingest(_ request: Request, channel: (any Channel)? = nil) async throws -> Response {
        guard gate.tryEnter() else {
            Self.countRefusal("concurrency")
            throw ProblemDetails(
                .serviceUnavailable, detail: "too many ingest requests in progress (\(gate.limit)); retry shortly", headers: [.retryAfter: "1"]
            )
        }
        defer { gate.leave() }
        let key = try await authenticator.require(.ingest, request)
        guard let appID = key.app else { throw ProblemDetails(.forbidden, detail: "an ingest key must belong to an app") }

        let isNDJSON = try Self.bodyKind(request)
        let body = try await collectBody(request, channel: channel)
        let maxEvents = limits.maxEvents
        let slots: [EventBatchReader.Slot]
        do {
            slots = try body.withBytes { bytes throws(BodyError) in
                isNDJSON ? try EventBatchReader.readNDJSON(bytes, maxEvents: maxEvents) : try EventBatchReader.readJSON(bytes, maxEvents: maxEvents)
            }
        } catch {
            if error.isTooManyEvents { throw ProblemDetails(.contentTooLarge, detail: error.message) }
            throw ProblemDetails(.badRequest, title: "Unreadable body", detail: error.message)
        }

        var validator = EventValidator(appID: appID, maxAge: limits.maxAge, maxAhead: limits.maxAhead)
        validator.idsPrunedBeforeMicros = limits.idsPrunedBeforeMicros
        let now = Int64(Date().timeIntervalSince1970 * 1_000_000)
        var events: [AppEvent] = []
        events.reserveCapacity(slots.count)
        // Each valid event's index in the body (for the erased ones' answer).
        var bodyIndex: [Int] = []
        bodyIndex.reserveCapacity(slots.count)
        var rejected: [Rejected] = []
        for (index, slot) in slots.enumerated() {
            switch slot {
            case .unreadable(let reason):
                rejected.append(Rejected(index: index, id: nil, error: reason))
            case .event(let raw):
                do {
                    events.append(AppEvent(appID: appID, event: try validator.validate(raw, nowMicros: now)))
                    bodyIndex.append(index)
                } catch {
                    rejected.append(Rejected(index: index, id: raw.idText, error: error.description))
                }
            }
        }
        if !rejected.isEmpty { rejectedCounter.increment(by: rejected.count) }

        let receipt: IngestBatcher.Receipt
        do {
            receipt = try await batcher.submit(events, isFirstAttempt: Self.isFirstAttempt(request.headers))
        } catch let refusal as IngestBatcher.Refusal {
            Self.countRefusal(refusal.reason)
            throw ProblemDetails(.serviceUnavailable, detail: refusal.description, headers: [.retryAfter: "1"])
        }
        let json: ByteBuffer
        if rejected.isEmpty && receipt.erased.isEmpty {
            // The usual receipt, without a JSONEncoder per request.
            json = ByteBuffer(string: #"{"accepted":\#(receipt.accepted),"duplicates":\#(receipt.duplicates),"rejected":[]}"#)
        } else {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
            let erased = receipt.erased.map { Erased(index: bodyIndex[$0], id: events[$0].event.id.uuidString.lowercased()) }
            json = ByteBuffer(bytes: try encoder.encode(IngestReceipt(
                accepted: receipt.accepted, duplicates: receipt.duplicates, rejected: rejected, erased: erased.isEmpty ? nil : erased
            )))
        }
        return Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: json))
    }

    /// `AdTally-Attempt: 1`: the client never sent this batch before (AdTallyKit says so
    /// for a batch none of whose events it posted since it started, nor found queued when
    /// it started). Anything else, or no header, may be a retry.
    static func isFirstAttempt(_ headers: HTTPFields) -> Bool {
        guard let name = HTTPField.Name("AdTally-Attempt") else { return false }
        return headers[name] == "1"
    }

    /// Every 503 of ingest, by why: `concurrency` (too many requests in progress)
    /// and the batcher's refusals.
    static func countRefusal(_ reason: String) {
        Counter(label: "adtally_ingest_refusals_total", dimensions: [("reason", reason)]).increment()
    }

    /// JSON (false) or NDJSON (true), from Content-Type; anything else is 415.
    static func bodyKind(_ request: Request) throws -> Bool {
        let contentType = request.headers[.contentType] ?? ""
        let mediaType = contentType.split(separator: ";").first.map { $0.trimmingCharacters(in: .whitespaces).lowercased() } ?? ""
        switch mediaType {
        case "application/json": return false
        case "application/x-ndjson", "application/ndjson": return true
        default:
            throw ProblemDetails(
                .unsupportedMediaType,
                detail: "Content-Type \"\(contentType)\" is not accepted; send application/json or application/x-ndjson"
            )
        }
    }

    /// A request body as received, or inflated: read in place, not copied.
    enum Body {
        case received(ByteBuffer)
        case inflated([UInt8])

        func withBytes<T>(_ body: (UnsafeBufferPointer<UInt8>) throws(BodyError) -> T) throws(BodyError) -> T {
            switch self {
            case .received(let buffer):
                let result: Result<T, BodyError> = buffer.withUnsafeReadableBytes { raw in
                    do throws(BodyError) {
                        return .success(try body(UnsafeBufferPointer(start: raw.baseAddress?.assumingMemoryBound(to: UInt8.self), count: raw.count)))
                    } catch {
                        return .failure(error)
                    }
                }
                return try result.get()
            case .inflated(let bytes):
                let result: Result<T, BodyError> = bytes.withUnsafeBufferPointer { buffer in
                    do throws(BodyError) { return .success(try body(buffer)) } catch { return .failure(error) }
                }
                return try result.get()
            }
        }
    }

    /// The body, inflated when gzip-encoded, never more than `maxBytes` either way.
    func collectBody(_ request: Request, channel: (any Channel)?) async throws -> Body {
        let limit = limits.maxBytes
        let tooLarge = ProblemDetails(.contentTooLarge, detail: "the body is larger than \(limit) bytes (the limit holds after decompression too)")
        if let length = request.headers[.contentLength].flatMap(Int.init), length > limit { throw tooLarge }
        let timeout = limits.bodyTimeout
        let buffer: ByteBuffer
        do {
            let collected = try await withThrowingTaskGroup(of: ByteBuffer?.self) { group in
                group.addTask { try await request.body.collect(upTo: limit) }
                group.addTask {
                    try await Task.sleep(for: timeout)
                    return nil
                }
                defer { group.cancelAll() }
                return try await group.next()!
            }
            guard let collected else {
                // Answer, then close the connection: the rest of the body is not wanted.
                if let channel {
                    channel.eventLoop.scheduleTask(in: .milliseconds(200)) { channel.close(promise: nil) }
                }
                throw ProblemDetails(
                    .requestTimeout, detail: "the body did not arrive in full within \(timeout.components.seconds) s",
                    headers: [.connection: "close"]
                )
            }
            buffer = collected
        } catch is NIOTooManyBytesError {
            throw tooLarge
        }
        switch request.headers[.contentEncoding]?.lowercased().trimmingCharacters(in: .whitespaces) {
        case nil, "", "identity":
            return .received(buffer)
        case "gzip", "x-gzip":
            let inflated: Result<[UInt8], Gunzip.Failure> = buffer.withUnsafeReadableBytes { bytes in
                do throws(Gunzip.Failure) { return .success(try Gunzip.inflate(bytes, limit: limit)) } catch { return .failure(error) }
            }
            do throws(Gunzip.Failure) {
                return .inflated(try inflated.get())
            } catch .tooLarge {
                throw tooLarge
            } catch .corrupt(let reason) {
                throw ProblemDetails(.badRequest, title: "Unreadable body", detail: "the gzip body cannot be inflated: \(reason)")
            }
        case let other?:
            throw ProblemDetails(.unsupportedMediaType, detail: "Content-Encoding \"\(other)\" is not accepted; send gzip or none")
        }
    }
}
