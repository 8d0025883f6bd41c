import PostgresKit

/// Leases one of `pool`'s connections, runs `body` while it is held, then gives it
/// back. The hold ends after 60 s at the latest, so a pool that never lets a waiter
/// go makes a test fail rather than hang.
public func whileHoldingAConnection<T>(of pool: PostgresPool, _ body: () async throws -> T) async throws -> T {
    let (released, release) = AsyncStream<Void>.makeStream()
    let held = Locked(false)
    let holder = Task {
        try await pool.withLease { _ in
            held.withLock { $0 = true }
            for await _ in released {}
        }
    }
    let watchdog = Task {
        try? await Task.sleep(for: .seconds(60))
        release.finish()
    }
    defer { watchdog.cancel() }
    let result: Result<T, any Error>
    do {
        guard try await eventually({ held.withLock { $0 } }) else {
            throw TestSetupError(description: "no connection of the pool became free to hold")
        }
        result = .success(try await body())
    } catch {
        result = .failure(error)
    }
    release.finish()
    try await holder.value
    return try result.get()
}
