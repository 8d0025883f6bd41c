import Synchronization

/// Admits at most `limit` holders at once; the rest are turned away at once
/// rather than queued, so that memory held by request bodies stays bounded.
public final class ConcurrencyGate: Sendable {
    private let count = Mutex(0)
    /// The most holders at once.
    public let limit: Int

    /// A gate for `limit` holders.
    public init(limit: Int) {
        precondition(limit > 0, "a gate needs room for one")
        self.limit = limit
    }

    /// Takes a place if one is free.
    public func tryEnter() -> Bool {
        count.withLock { count in
            guard count < limit else { return false }
            count += 1
            return true
        }
    }

    /// Gives a place back.
    public func leave() {
        count.withLock { $0 -= 1 }
    }

    /// Holders now.
    public var holders: Int { count.withLock { $0 } }
}
