import Logging
import NIOPosix
import Synchronization

/// A bounded pool of libpq connections with an async API.
///
/// Blocking libpq calls run on the pool's own `NIOThreadPool` (one thread per
/// connection), never on Swift's cooperative pool. A task waiting for a free
/// connection gives up after `acquireTimeout` with a clear error. A connection
/// that broke (server restarted, network cut) is noticed — at lease time by
/// reading the socket, after use by its status — and replaced.
public final class PostgresPool: Sendable {
    /// How the pool connects and how large it grows.
    public struct Configuration: Sendable {
        /// `postgresql://` URL or `key=value` conninfo.
        public var conninfo: String
        /// The most connections open at once (and the number of blocking threads).
        public var maxConnections: Int
        /// How long a task waits for a connection before failing.
        public var acquireTimeout: Duration
        /// Connect, TCP and statement timeouts of every connection.
        public var options: PostgresConnection.Options

        /// Creates a configuration.
        public init(
            conninfo: String, maxConnections: Int = 8, acquireTimeout: Duration = .seconds(10),
            options: PostgresConnection.Options = .init()
        ) {
            precondition(maxConnections > 0, "a pool needs at least one connection")
            self.conninfo = conninfo
            self.maxConnections = maxConnections
            self.acquireTimeout = acquireTimeout
            self.options = options
        }
    }

    private enum Grant: Sendable {
        case connection(PostgresConnection)
        case openNew
    }

    private struct Waiter {
        var id: UInt64
        var continuation: CheckedContinuation<Grant, any Error>
        /// Fails the wait after `acquireTimeout`; cancelled once the waiter is served.
        var timer: Task<Void, Never>?

        /// Hands the waiter its grant (or error) and stops its timer.
        func resume(with result: Result<Grant, any Error>) {
            timer?.cancel()
            continuation.resume(with: result)
        }
    }

    private struct State: ~Copyable {
        var idle: [PostgresConnection] = []
        var open = 0
        var waiters: [Waiter] = []
        var nextWaiterID: UInt64 = 0
        var isClosed = false
        /// When a waiter last gave up for want of a connection.
        var lastTimeout: ContinuousClock.Instant?
        /// When a task was last given a connection.
        var lastGrant: ContinuousClock.Instant?
    }

    /// The configuration the pool was made with.
    public let configuration: Configuration
    private let threadPool: NIOThreadPool
    private let state = Mutex(State())
    private let logger: Logger

    /// Creates a pool; connections open lazily on first use.
    public init(configuration: Configuration, logger: Logger = Logger(label: "adtally.postgres")) {
        self.configuration = configuration
        self.logger = logger
        self.threadPool = NIOThreadPool(numberOfThreads: configuration.maxConnections)
        threadPool.start()
    }

    /// Leases a connection, runs `body` with it on a pool thread, and returns the
    /// connection to the pool (or drops it if it broke).
    public func withConnection<T: Sendable>(
        _ body: @escaping @Sendable (PostgresConnection) throws -> T
    ) async throws -> T {
        let connection = try await acquire()
        do {
            let value = try await threadPool.runIfActive { try body(connection) }
            release(connection)
            return value
        } catch {
            release(connection)
            throw error
        }
    }

    /// Leases a connection for work that suspends between statements (a report streamed
    /// to a socket chunk by chunk): each `lease.run` runs on a pool thread, and between
    /// them the caller may await anything. The connection goes back to the pool when
    /// `body` ends; a transaction left open (an error, a client gone mid-stream) is
    /// rolled back first, or the connection is dropped if that fails.
    public func withLease<T: Sendable>(_ body: (PostgresLease) async throws -> T) async throws -> T {
        let connection = try await acquire()
        let lease = PostgresLease(connection: connection, threadPool: threadPool)
        let result: Result<T, any Error>
        do {
            result = .success(try await body(lease))
        } catch {
            result = .failure(error)
        }
        if connection.isUsable, !connection.isIdle {
            _ = try? await threadPool.runIfActive { try connection.execute(unsafeSQL: "ROLLBACK") }
        }
        release(connection)
        return try result.get()
    }

    /// Runs `body` inside a transaction on a leased connection.
    public func withTransaction<T: Sendable>(
        begin: String = "BEGIN", _ body: @escaping @Sendable (PostgresConnection) throws -> T
    ) async throws -> T {
        try await withConnection { try $0.withTransaction(begin: begin, body) }
    }

    /// Runs one query on a leased connection.
    @discardableResult
    public func query(_ query: PostgresQuery) async throws -> PostgresRows {
        try await withConnection { try $0.query(query) }
    }

    /// Connections currently open (idle or leased), for metrics and tests.
    public var openConnections: Int { state.withLock { $0.open } }

    /// Tasks waiting for a connection, for metrics and tests.
    public var waitingTasks: Int { state.withLock { $0.waiters.count } }

    /// How long ago a task last waited `acquireTimeout` in vain for a connection, if
    /// one ever did: readiness says from it that the pool's work cannot be served.
    public var sinceLastTimeout: Duration? { state.withLock { $0.lastTimeout.map { ContinuousClock.now - $0 } } }

    /// How long ago a task was last given a connection (nil: never).
    public var sinceLastGrant: Duration? { state.withLock { $0.lastGrant.map { ContinuousClock.now - $0 } } }

    /// Closes idle connections and refuses new leases; leased ones close when returned.
    public func shutdown() async {
        let (idle, waiters) = state.withLock { state -> ([PostgresConnection], [Waiter]) in
            state.isClosed = true
            let idle = state.idle
            let waiters = state.waiters
            state.open -= idle.count
            state.idle = []
            state.waiters = []
            return (idle, waiters)
        }
        for waiter in waiters {
            waiter.resume(with: .failure(PostgresError(kind: .poolClosed, message: "the connection pool is shut down")))
        }
        _ = idle  // released here; deinit calls PQfinish
        try? await threadPool.shutdownGracefully()
    }

    // MARK: - Leasing

    private enum Step {
        case use(PostgresConnection)
        case openNew
        case wait
        case closed
    }

    private func acquire() async throws -> PostgresConnection {
        let connection = try await acquireConnection()
        state.withLock { $0.lastGrant = ContinuousClock.now }
        return connection
    }

    private func acquireConnection() async throws -> PostgresConnection {
        let step = state.withLock { state -> Step in
            if state.isClosed { return .closed }
            if let connection = state.idle.popLast() { return .use(connection) }
            if state.open < configuration.maxConnections {
                state.open += 1
                return .openNew
            }
            return .wait
        }
        let grant: Grant
        switch step {
        case .closed: throw PostgresError(kind: .poolClosed, message: "the connection pool is shut down")
        case .use(let connection): grant = .connection(connection)
        case .openNew: grant = .openNew
        case .wait: grant = try await waitForGrant()
        }
        switch grant {
        case .openNew:
            return try await openConnection()
        case .connection(let connection):
            let alive: Bool
            do {
                alive = try await threadPool.runIfActive { connection.checkAlive() }
            } catch {
                // Cancelled, or the pool's threads stopped: the connection is still
                // ours to give back, or its slot would be lost for good.
                release(connection)
                throw error
            }
            if alive { return connection }
            logger.info("replacing a broken PostgreSQL connection", metadata: ["target": "\(connection.target)"])
            return try await openConnection()
        }
    }

    /// Opens a connection in a slot already counted in `open`; frees the slot on failure.
    private func openConnection() async throws -> PostgresConnection {
        let conninfo = configuration.conninfo
        let options = configuration.options
        do {
            return try await threadPool.runIfActive { try PostgresConnection(connecting: conninfo, options: options) }
        } catch {
            freeSlot()
            throw error
        }
    }

    private func waitForGrant() async throws -> Grant {
        let timeout = configuration.acquireTimeout
        let maxConnections = configuration.maxConnections
        let id = state.withLock { state -> UInt64 in
            state.nextWaiterID += 1
            return state.nextWaiterID
        }
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                let timer = Task { [weak self] in
                    try? await Task.sleep(for: timeout)
                    guard !Task.isCancelled, let self else { return }
                    let waiter = self.state.withLock { state -> Waiter? in
                        guard let index = state.waiters.firstIndex(where: { $0.id == id }) else { return nil }
                        state.lastTimeout = ContinuousClock.now
                        return state.waiters.remove(at: index)
                    }
                    waiter?.continuation.resume(throwing: PostgresError(
                        kind: .poolTimeout,
                        message: "no PostgreSQL connection became free within \(timeout) (pool of \(maxConnections))"
                    ))
                }
                let closed = state.withLock { state -> Bool in
                    if state.isClosed { return true }
                    state.waiters.append(Waiter(id: id, continuation: continuation, timer: timer))
                    return false
                }
                if closed {
                    timer.cancel()
                    continuation.resume(throwing: PostgresError(kind: .poolClosed, message: "the connection pool is shut down"))
                } else if Task.isCancelled {
                    // Cancelled before the waiter was queued: onCancel found nothing to remove.
                    removeWaiter(id)?.resume(with: .failure(CancellationError()))
                }
            }
        } onCancel: {
            removeWaiter(id)?.resume(with: .failure(CancellationError()))
        }
    }

    /// Takes a waiter out of the queue, if it is still waiting.
    private func removeWaiter(_ id: UInt64) -> Waiter? {
        state.withLock { state in
            guard let index = state.waiters.firstIndex(where: { $0.id == id }) else { return nil }
            return state.waiters.remove(at: index)
        }
    }

    private func release(_ connection: PostgresConnection) {
        // A connection still inside a transaction (or not knowing, after an error)
        // must not be lent to the next task: drop it and open a fresh one instead.
        let usable = connection.isUsable && connection.isIdle
        let (waiter, grant) = state.withLock { state -> (Waiter?, Grant?) in
            if state.isClosed || !usable {
                state.open -= 1
                guard !state.isClosed, !state.waiters.isEmpty else { return (nil, nil) }
                state.open += 1
                return (state.waiters.removeFirst(), .openNew)
            }
            if !state.waiters.isEmpty {
                return (state.waiters.removeFirst(), .connection(connection))
            }
            state.idle.append(connection)
            return (nil, nil)
        }
        if let waiter, let grant { waiter.resume(with: .success(grant)) }
    }

    /// A slot whose connection failed to open: hand it to a waiter, who tries again.
    private func freeSlot() {
        let waiter = state.withLock { state -> Waiter? in
            guard !state.isClosed, !state.waiters.isEmpty else {
                state.open -= 1
                return nil
            }
            return state.waiters.removeFirst()
        }
        waiter?.resume(with: .success(.openNew))
    }
}

/// A connection held across suspension points; see `PostgresPool.withLease`.
public struct PostgresLease: Sendable {
    let connection: PostgresConnection
    let threadPool: NIOThreadPool

    /// Runs `body` with the leased connection on a pool thread.
    public func run<T: Sendable>(_ body: @escaping @Sendable (PostgresConnection) throws -> T) async throws -> T {
        let connection = self.connection
        return try await threadPool.runIfActive { try body(connection) }
    }
}
