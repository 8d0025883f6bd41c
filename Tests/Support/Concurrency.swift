import Foundation

/// Runs blocking work (a process, a socket read, a server's shutdown) on a thread
/// of its own and returns its result: blocking one of the few cooperative threads
/// for seconds starves every other test's in-process server.
public func onOwnThread<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread.detachNewThread { continuation.resume(with: Result { try body() }) }
    }
}

/// `onOwnThread` for work that cannot fail.
public func onOwnThread<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { continuation in
        Thread.detachNewThread { continuation.resume(returning: body()) }
    }
}

/// At most `limit` bodies run at once; the others wait their turn, in order,
/// without holding a thread.
public actor AsyncGate {
    private var free: Int
    private var waiting: [CheckedContinuation<Void, Never>] = []

    public init(limit: Int) { free = limit }

    /// Runs `body` once a place is free, and frees it afterwards.
    public func run<T: Sendable>(_ body: @Sendable () async throws -> T) async rethrows -> T {
        if free > 0 {
            free -= 1
        } else {
            await withCheckedContinuation { waiting.append($0) }
        }
        defer {
            if waiting.isEmpty { free += 1 } else { waiting.removeFirst().resume() }
        }
        return try await body()
    }
}

/// Polls `condition` every 10 ms until it holds (true) or `seconds` pass (false).
/// The bound only says when to give up: a loaded machine may take seconds.
public func eventually(within seconds: Double = 60, _ condition: () async throws -> Bool) async throws -> Bool {
    let deadline = ContinuousClock.now + .seconds(seconds)
    while true {
        if try await condition() { return true }
        if ContinuousClock.now >= deadline { return false }
        try await Task.sleep(for: .milliseconds(10))
    }
}
