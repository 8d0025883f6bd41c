import AdTallyCore
import Foundation
import Logging
import Metrics
import PostgresKit
import Synchronization

/// Group commit for ingest: concurrent requests queue their events, a few flushers
/// write whole groups in one transaction each, and every request is answered only
/// after its group committed.
///
/// The queue is bounded: when it is full, or the database was just found
/// unreachable, `submit` fails at once so the client gets a 503 and retries later
/// (safe: event ids make retries idempotent). A request waits at most
/// `commitTimeout` for its group.
public final class IngestBatcher: Sendable {
    /// Limits and concurrency.
    public struct Configuration: Sendable {
        /// Most events waiting to be written, across all requests.
        public var maxQueuedEvents: Int
        /// Most events one transaction writes.
        public var maxGroupEvents: Int
        /// Transactions in flight at once (each holds one pooled connection).
        public var flushers: Int
        /// Longest a request waits for its group's commit.
        public var commitTimeout: Duration
        /// How long submissions are refused after the database was found unreachable.
        public var unavailableBackoff: Duration
        /// While another flusher is writing, a free flusher that finds fewer events than
        /// this queued waits `linger` once for more before it starts a transaction (like
        /// PostgreSQL's commit_delay): fewer, larger transactions, each with the same
        /// per-statement cost. 0 turns it off.
        public var lingerBelowEvents: Int
        /// See `lingerBelowEvents`.
        public var linger: Duration

        /// Limits and concurrency; the defaults suit one server.
        public init(
            maxQueuedEvents: Int = 200_000, maxGroupEvents: Int = 20_000, flushers: Int = 4,
            commitTimeout: Duration = .seconds(10), unavailableBackoff: Duration = .seconds(1),
            lingerBelowEvents: Int = 400, linger: Duration = .milliseconds(1)
        ) {
            self.maxQueuedEvents = maxQueuedEvents
            self.maxGroupEvents = maxGroupEvents
            self.flushers = flushers
            self.commitTimeout = commitTimeout
            self.unavailableBackoff = unavailableBackoff
            self.lingerBelowEvents = lingerBelowEvents
            self.linger = linger
        }
    }

    /// What happened to a request's events.
    public struct Receipt: Sendable, Equatable {
        /// Newly stored.
        public var accepted: Int
        /// Already stored before (or earlier in the same request), and the erased ones.
        public var duplicates: Int
        /// The positions (in the request's events) of those refused because their device
        /// was erased after they occurred (DESIGN §15): not stored, delivered all the same,
        /// and counted among `duplicates` too.
        public var erased: [Int] = []
    }

    /// Why events were not taken; every case means "retry later".
    public enum Refusal: Error, Sendable, CustomStringConvertible {
        case queueFull
        case databaseUnavailable(String)
        case timedOut
        case shuttingDown

        public var description: String {
            switch self {
            case .queueFull: "the ingest queue is full; retry shortly"
            case .databaseUnavailable(let reason): "the database is unavailable (\(reason)); retry shortly"
            case .timedOut: "the events were not committed in time; retry (already stored events count as duplicates)"
            case .shuttingDown: "the server is shutting down; retry on another instance"
            }
        }

        /// The `reason` label of `adtally_ingest_refusals_total`.
        public var reason: String {
            switch self {
            case .queueFull: "queue_full"
            case .databaseUnavailable: "database_unavailable"
            case .timedOut: "commit_timeout"
            case .shuttingDown: "shutting_down"
            }
        }
    }

    /// One request's events and the continuation that answers it, resumed exactly once.
    private final class Ticket: Sendable {
        let events: [AppEvent]
        /// The client says it never sent these events before (`submit`).
        let isFirstAttempt: Bool
        private let continuation: Mutex<CheckedContinuation<Receipt, any Error>?>
        private let timer = Mutex<Task<Void, Never>?>(nil)

        init(events: [AppEvent], isFirstAttempt: Bool, continuation: CheckedContinuation<Receipt, any Error>) {
            self.events = events
            self.isFirstAttempt = isFirstAttempt
            self.continuation = Mutex(continuation)
        }

        var isOpen: Bool { continuation.withLock { $0 != nil } }

        /// Fails the ticket with `timedOut` unless it finishes within `timeout`.
        func startTimer(_ timeout: Duration) {
            let task = Task { [weak self] in
                try? await Task.sleep(for: timeout)
                if !Task.isCancelled { self?.finish(.failure(Refusal.timedOut)) }
            }
            timer.withLock { $0 = task }
            if !isOpen { task.cancel() }
        }

        func finish(_ result: Result<Receipt, any Error>) {
            guard let continuation = continuation.withLock({ $0.take() }) else { return }
            timer.withLock { $0.take() }?.cancel()
            continuation.resume(with: result)
        }
    }

    private struct State: ~Copyable {
        var tickets: [Ticket] = []
        var queuedEvents = 0
        var idleFlushers: [CheckedContinuation<Void, Never>] = []
        var isFinishing = false
        /// Flushers inside a transaction now.
        var writing = 0
        var refuseUntil: ContinuousClock.Instant?
    }

    private let store: EventStore
    private let configuration: Configuration
    private let state = Mutex(State())
    private let logger: Logger
    private let queueGauge = Gauge(label: "adtally_ingest_queue_events")
    private let flushTimer = Metrics.Timer(label: "adtally_ingest_flush_seconds")
    private let storedCounter = Counter(label: "adtally_ingest_events_total", dimensions: [("outcome", "accepted")])
    private let duplicateCounter = Counter(label: "adtally_ingest_events_total", dimensions: [("outcome", "duplicate")])
    private let erasedCounter = Counter(label: "adtally_ingest_events_total", dimensions: [("outcome", "erased")])

    /// Creates a batcher; call `run()` to start its flushers.
    public init(store: EventStore, configuration: Configuration = .init(), logger: Logger = Logger(label: "adtally.ingest")) {
        self.store = store
        self.configuration = configuration
        self.logger = logger
        // What the queue gauge is measured against (the operators' rule AdTallyIngestQueueNearlyFull).
        Gauge(label: "adtally_ingest_queue_limit_events").record(configuration.maxQueuedEvents)
    }

    /// Queues events and returns once they are committed. `isFirstAttempt`: the client
    /// says it never sent them before (`EventStore.store`'s `expectsNew`), a hint that
    /// saves their ids the ledger probe, never trusted for correctness.
    public func submit(_ events: [AppEvent], isFirstAttempt: Bool = false) async throws -> Receipt {
        if events.isEmpty { return Receipt(accepted: 0, duplicates: 0) }
        let timeout = configuration.commitTimeout
        return try await withCheckedThrowingContinuation { continuation in
            let ticket = Ticket(events: events, isFirstAttempt: isFirstAttempt, continuation: continuation)
            let outcome = state.withLock { state -> Result<CheckedContinuation<Void, Never>?, Refusal> in
                if state.isFinishing { return .failure(.shuttingDown) }
                if let until = state.refuseUntil, ContinuousClock.now < until {
                    return .failure(.databaseUnavailable("it refused connections moments ago"))
                }
                if state.queuedEvents + events.count > configuration.maxQueuedEvents { return .failure(.queueFull) }
                state.tickets.append(ticket)
                state.queuedEvents += events.count
                return .success(state.idleFlushers.popLast())
            }
            switch outcome {
            case .failure(let refusal):
                ticket.finish(.failure(refusal))
            case .success(let flusher):
                ticket.startTimer(timeout)
                flusher?.resume()
            }
        }
    }

    /// Runs the flushers until `finish()` and the queue is drained.
    public func run() async {
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<configuration.flushers {
                group.addTask { await self.flushLoop() }
            }
        }
    }

    /// Stops taking events; `run()` returns once what is queued is written.
    public func finish() {
        let idle = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.isFinishing = true
            defer { state.idleFlushers = [] }
            return state.idleFlushers
        }
        idle.forEach { $0.resume() }
    }

    private func flushLoop() async {
        while let group = await nextGroup() {
            await flush(group)
            state.withLock { $0.writing -= 1 }
        }
    }

    /// The next tickets to write (up to `maxGroupEvents`, at least one), or nil when finished;
    /// counts the caller as writing until `flushLoop` says it is done.
    private func nextGroup() async -> [Ticket]? {
        var lingered = false
        while true {
            enum Next { case group([Ticket]), wait, linger, done }
            let next = state.withLock { state -> Next in
                if state.tickets.isEmpty { return state.isFinishing ? .done : .wait }
                if !lingered, !state.isFinishing, state.writing > 0, state.queuedEvents < configuration.lingerBelowEvents {
                    return .linger
                }
                var count = 0
                var taken = 0
                for ticket in state.tickets {
                    if taken > 0 && count + ticket.events.count > configuration.maxGroupEvents { break }
                    count += ticket.events.count
                    taken += 1
                }
                let group = Array(state.tickets.prefix(taken))
                state.tickets.removeFirst(taken)
                state.queuedEvents -= count
                state.writing += 1
                return .group(group)
            }
            switch next {
            case .group(let group): return group
            case .done: return nil
            case .linger:
                lingered = true
                try? await Task.sleep(for: configuration.linger)
            case .wait:
                await withCheckedContinuation { continuation in
                    let resumeNow = state.withLock { state -> Bool in
                        if !state.tickets.isEmpty || state.isFinishing { return true }
                        state.idleFlushers.append(continuation)
                        return false
                    }
                    if resumeNow { continuation.resume() }
                }
            }
        }
    }

    private func flush(_ group: [Ticket]) async {
        // A request that already timed out got its 503; its client retries, so skip it.
        let live = group.filter(\.isOpen)
        queueGauge.record(state.withLock { $0.queuedEvents })
        guard !live.isEmpty else { return }
        let events = live.flatMap(\.events)
        let started = ContinuousClock.now
        do {
            // The events of requests that said they are sent for the first time skip the probe.
            let expectsNew = live.contains(where: \.isFirstAttempt)
                ? live.flatMap { repeatElement($0.isFirstAttempt, count: $0.events.count) } : nil
            let outcomes = try await store.write(events, expectsNew: expectsNew)
            let elapsed = ContinuousClock.now - started
            flushTimer.record(duration: elapsed)
            var offset = 0
            var accepted = 0
            var erasedCount = 0
            for ticket in live {
                let mine = outcomes[offset..<offset + ticket.events.count]
                let stored = mine.lazy.filter { $0 == .stored }.count
                let erased = mine.indices.filter { mine[$0] == .erased }.map { $0 - offset }
                offset += ticket.events.count
                accepted += stored
                erasedCount += erased.count
                // Erased events count among the duplicates too (not stored now, as a duplicate is
                // not): a kit that predates erasure checks that the counts add up to its batch.
                ticket.finish(.success(Receipt(accepted: stored, duplicates: ticket.events.count - stored, erased: erased)))
            }
            storedCounter.increment(by: accepted)
            duplicateCounter.increment(by: events.count - accepted - erasedCount)
            if erasedCount > 0 { erasedCounter.increment(by: erasedCount) }
        } catch let error as PostgresError where error.isTransient {
            // Unreachable, shutting down, out of a resource, read-only after a failover,
            // a timeout or a deadlock after the retry: the client retries later (503).
            logger.warning("ingest flush failed: database unavailable", metadata: ["error": "\(error)"])
            if error.isConnectionBroken || error.kind == .poolTimeout {
                let backoff = configuration.unavailableBackoff
                state.withLock { $0.refuseUntil = ContinuousClock.now + backoff }
            }
            live.forEach { $0.finish(.failure(Refusal.databaseUnavailable(error.message))) }
        } catch {
            logger.error("ingest flush failed", metadata: ["error": "\(String(reflecting: error))", "requests": "\(live.count)"])
            // One request's events must not fail the others: write them one by one.
            if live.count > 1 {
                for ticket in live { await flush([ticket]) }
            } else {
                live.forEach { $0.finish(.failure(error)) }
            }
        }
    }
}
