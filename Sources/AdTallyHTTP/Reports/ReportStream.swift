import AdTallyCore
import AdTallyStorage
import Foundation
import Hummingbird
import Logging
import NIOCore
import Synchronization

/// How long a CSV report stream may hold its snapshot. A stream reads every row in one
/// REPEATABLE READ transaction, and while it is open vacuum can remove no row version
/// that the snapshot might see, in any table: a reader that trickles must not keep it
/// for hours. Once the database has been read to the end the transaction is over, and
/// what is left to send is the socket's business (`WriteStallHandler`).
public struct ReportStreamLimits: Sendable, Equatable {
    /// The longest a stream's transaction may stay open (`ADTALLY_REPORT_STREAM_MAX_SECONDS`).
    public var maxLifetime: Duration = .seconds(1800)
    /// The least a reader must take, on average over each `window` in which rows were
    /// waiting for it: a window in which the database was still computing rows does not
    /// count (`ADTALLY_REPORT_STREAM_MIN_BYTES_PER_SECOND`; 0: no minimum).
    public var minBytesPerSecond = 4096
    /// The span the rate is measured over (`ADTALLY_REPORT_STREAM_RATE_WINDOW_SECONDS`).
    public var window: Duration = .seconds(30)

    public init() {}

    public init(maxLifetime: Duration, minBytesPerSecond: Int, window: Duration) {
        self.maxLifetime = maxLifetime
        self.minBytesPerSecond = minBytesPerSecond
        self.window = window
    }
}

/// Why a stream was cut.
struct ReportStreamCut: Error, CustomStringConvertible {
    var description: String
}

/// Hands CSV chunks from the engine's stream (the producer, which holds the
/// transaction) to the response body (the consumer, which writes to the socket), one
/// at a time: the producer fetches the next chunk while the consumer writes this one,
/// then waits for it to be taken. Either side, or the watchdog, can end it; the other
/// is woken with the error.
final class ReportChunkPipe: Sendable {
    private struct State {
        var started = false
        var startWaiter: CheckedContinuation<Void, any Error>?
        var pending: [UInt8]?
        var putWaiter: CheckedContinuation<Void, any Error>?
        var takeWaiter: CheckedContinuation<[UInt8]?, any Error>?
        /// The producer ended (nil error: read to the end).
        var produced: (any Error)?? = nil
        /// The stream was cut (the consumer left, or the watchdog ended it).
        var cut: (any Error)?
        var bytesWritten = 0
    }

    private let state = Mutex(State())

    /// The producer has its snapshot and has refused nothing: the 200 may go.
    func started() {
        let waiter = state.withLock { state -> CheckedContinuation<Void, any Error>? in
            state.started = true
            defer { state.startWaiter = nil }
            return state.startWaiter
        }
        waiter?.resume()
    }

    /// Returns once the producer started; throws what it refused with before that.
    func waitStarted() async throws {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            let outcome: Result<Void, any Error>? = state.withLock { state in
                if state.started { return .success(()) }
                if case .some(let error) = state.produced { return .failure(error ?? ReportStreamCut(description: "the report ended before it started")) }
                if let cut = state.cut { return .failure(cut) }
                state.startWaiter = continuation
                return nil
            }
            if let outcome { continuation.resume(with: outcome) }
        }
    }

    /// Gives the consumer a chunk; returns when it was taken, throws when the stream was cut.
    func put(_ bytes: [UInt8]) async throws {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            let action: (() -> Void)? = state.withLock { state in
                if let cut = state.cut { return { continuation.resume(throwing: cut) } }
                if let taker = state.takeWaiter {
                    state.takeWaiter = nil
                    return {
                        taker.resume(returning: bytes)
                        continuation.resume()
                    }
                }
                state.pending = bytes
                state.putWaiter = continuation
                return nil
            }
            action?()
        }
    }

    /// The producer's end: nil when every row was read, or why it failed.
    func finish(_ error: (any Error)?) {
        let wake: [() -> Void] = state.withLock { state in
            state.produced = .some(error)
            var wake: [() -> Void] = []
            if let waiter = state.startWaiter {
                state.startWaiter = nil
                wake.append { waiter.resume(throwing: error ?? ReportStreamCut(description: "the report ended before it started")) }
            }
            if let taker = state.takeWaiter, state.pending == nil {
                state.takeWaiter = nil
                wake.append { if let error { taker.resume(throwing: error) } else { taker.resume(returning: nil) } }
            }
            return wake
        }
        for action in wake { action() }
    }

    /// The next chunk; nil after the last one. Throws when the producer failed or the stream was cut.
    func take() async throws -> [UInt8]? {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<[UInt8]?, any Error>) in
            let action: (() -> Void)? = state.withLock { state in
                if let cut = state.cut { return { continuation.resume(throwing: cut) } }
                if let bytes = state.pending {
                    state.pending = nil
                    let putter = state.putWaiter
                    state.putWaiter = nil
                    return {
                        putter?.resume()
                        continuation.resume(returning: bytes)
                    }
                }
                if case .some(let error) = state.produced {
                    return { if let error { continuation.resume(throwing: error) } else { continuation.resume(returning: nil) } }
                }
                state.takeWaiter = continuation
                return nil
            }
            action?()
        }
    }

    /// Ends the stream from the consumer's side (or the watchdog's): the producer's next
    /// or pending `put` throws, so its transaction is rolled back.
    func cut(_ error: any Error) {
        let wake: [() -> Void] = state.withLock { state in
            guard state.cut == nil else { return [] }
            state.cut = error
            var wake: [() -> Void] = []
            if let waiter = state.startWaiter { state.startWaiter = nil; wake.append { waiter.resume(throwing: error) } }
            if let putter = state.putWaiter { state.putWaiter = nil; state.pending = nil; wake.append { putter.resume(throwing: error) } }
            if let taker = state.takeWaiter { state.takeWaiter = nil; wake.append { taker.resume(throwing: error) } }
            return wake
        }
        for action in wake { action() }
    }

    func wrote(_ count: Int) { state.withLock { $0.bytesWritten += count } }

    /// Bytes written so far; whether the producer (the transaction) has ended; whether
    /// the consumer is waiting for the database (then the reader is not the slow one).
    var progress: (bytes: Int, producerEnded: Bool, cut: Bool, waitingForRows: Bool) {
        state.withLock { state in
            let ended: Bool
            if case .some = state.produced { ended = true } else { ended = false }
            return (state.bytesWritten, ended, state.cut != nil, state.takeWaiter != nil)
        }
    }
}

extension ReportRoutes {
    /// The most a CSV write hands the socket at once (a chunk of rows is megabytes).
    static let csvSlice = 16 * 1024

    /// A CSV report as one stream in one snapshot: the engine's stream starts here, and
    /// its refusals (a missing FX rate, a compared period over the bound, an unknown
    /// zone) are thrown before the 200; the rows it then reads in that same snapshot go
    /// out as the reader takes them. The stream's transaction is cut (rolled back, the
    /// connection closed: a truncated body) when it outlives `limits.maxLifetime` or the
    /// reader takes less than `limits.minBytesPerSecond` over a window.
    static func csvResponse(
        _ request: Request, _ query: ReportQuery, engine: ReportEngine, holding place: ReportShares.Place, channel: any Channel, limits: ReportStreamLimits,
        headers: HTTPFields
    ) async throws -> Response {
        // A HEAD (routes answer HEAD with GET's handler and drop the body) reads nothing:
        // a stream started for it would hold its snapshot with no reader.
        if request.method == .head { return Response(status: .ok, headers: headers) }
        let pipe = ReportChunkPipe()
        let layout = ReportLayout(query: query)
        let logger = Logger(label: "adtally.reports")
        #if os(Linux)
        // The kernel keeps at most this much of the CSV unsent: the socket is writable
        // again as soon as the reader takes that much, not once a third of a send buffer
        // autotuned to megabytes has drained, so the writes (and the rate the watchdog
        // sees) follow the reader. What is in flight is not limited, nor the speed.
        let unsentLowWater = ChannelOptions.Types.SocketOption(level: .init(rawValue: Int32(IPPROTO_TCP)), name: .init(rawValue: 25))  // TCP_NOTSENT_LOWAT
        try? await channel.setOption(unsentLowWater, value: SocketOptionValue(csvSlice))
        #endif
        let producer = Task {
            defer { withExtendedLifetime(place) {} }
            do {
                var out: [UInt8] = []
                out.reserveCapacity(1 << 16)
                // The stream's transaction is cut by the watchdog below; PostgreSQL's own idle
                // cut (for a server that died) must not come first, while a chunk of rows
                // is written at the slowest rate allowed.
                try await engine.stream(query, refusingFirst: true, idleInTransaction: limits.maxLifetime) { _ in
                    pipe.started()
                } rows: { rows in
                    out.removeAll(keepingCapacity: true)
                    for row in rows { layout.appendCSV(row, to: &out) }
                    try await pipe.put(out)
                }
                pipe.finish(nil)
            } catch {
                pipe.finish(error)
            }
        }
        do {
            try await pipe.waitStarted()
        } catch {
            await producer.value
            throw error
        }
        let watchdog = Task {
            let clock = ContinuousClock()
            let begun = clock.now
            var windowStart = begun
            var windowBytes = 0
            let tick = min(Duration.seconds(1), limits.window)
            while true {
                try? await Task.sleep(for: tick)
                let progress = pipe.progress
                if progress.producerEnded || progress.cut { return }
                let now = clock.now
                var reason: String?
                if progress.waitingForRows {
                    // The database is computing the next rows: not the reader's time.
                    windowStart = now
                    windowBytes = progress.bytes
                }
                if now - begun >= limits.maxLifetime {
                    reason = "it was still reading after \(limits.maxLifetime.components.seconds) s, the longest a report stream may hold its snapshot (ADTALLY_REPORT_STREAM_MAX_SECONDS)"
                } else if now - windowStart >= limits.window {
                    let seconds = Double((now - windowStart).components.seconds) + Double((now - windowStart).components.attoseconds) / 1e18
                    let moved = progress.bytes - windowBytes
                    if limits.minBytesPerSecond > 0, Double(moved) < Double(limits.minBytesPerSecond) * seconds {
                        reason = "the reader took \(moved) bytes in \(Int(seconds)) s, less than \(limits.minBytesPerSecond) bytes a second (ADTALLY_REPORT_STREAM_MIN_BYTES_PER_SECOND)"
                    }
                    windowStart = now
                    windowBytes = progress.bytes
                }
                if let reason {
                    logger.notice("CSV report stream cut: \(reason)", metadata: ["query": "\(query.canonicalText)"])
                    pipe.cut(ReportStreamCut(description: reason))
                    channel.close(promise: nil)
                    return
                }
            }
        }
        let body = ResponseBody { writer in
            defer { watchdog.cancel() }
            var header: [UInt8] = []
            ReportText.appendCSVRecord(layout.columns.map { .text($0.name) }, to: &header)
            do {
                try await writer.write(ByteBuffer(bytes: header))
                pipe.wrote(header.count)
                while let chunk = try await pipe.take() {
                    // In slices: each write waits for the socket, so the rate is seen as it goes.
                    var offset = 0
                    while offset < chunk.count {
                        let end = min(chunk.count, offset + Self.csvSlice)
                        try await writer.write(ByteBuffer(bytes: chunk[offset..<end]))
                        // The write reaches the channel on its event loop, after this task
                        // goes on: until it has, the channel looks writable however much is
                        // queued, and a chunk of megabytes would be buffered at once.
                        try await channel.eventLoop.submit {}.get()
                        pipe.wrote(end - offset)
                        offset = end
                    }
                }
            } catch {
                pipe.cut(error)
                // The 200 and part of the file are sent: all that is left is to cut the
                // connection (the client sees a truncated body, never a complete-looking
                // file) and to say why here, as nothing else will.
                if error is ChannelError || error is ReportStreamCut {
                    // The client left, stopped reading (WriteStallHandler) or read too slowly: its own doing.
                    logger.notice("CSV report stream ended: the connection closed", metadata: ["error": "\(error)", "query": "\(query.canonicalText)"])
                } else {
                    logger.error("CSV report stream failed", metadata: ["error": "\(error)", "query": "\(query.canonicalText)"])
                }
                await producer.value
                throw error
            }
            await producer.value
            try await writer.finish(nil)
        }
        return Response(status: .ok, headers: headers, body: body)
    }
}
