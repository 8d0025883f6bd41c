import Hummingbird
import NIOCore
import Synchronization

/// Keeps any one key, and any one client address, to its share of the report pool.
///
/// Read keys ship in dashboards and scripts, and anyone holding one can open report
/// requests; without a share, a few slow or stalled requests of one key hold every
/// report connection and every app's reports wait behind them. A request takes a
/// place for its key and one for its address before it runs, keeps them until its
/// response is written in full (a CSV streams long after the handler returns), and is
/// answered 429 with `Retry-After` when either is full.
public final class ReportShares: Sendable {
    /// Requests one key, or one address, may run at once.
    public let perHolder: Int
    private let holders = Mutex([String: Int]())

    /// A share of `perHolder` places per key and per address.
    public init(perHolder: Int) {
        precondition(perHolder > 0, "a share needs room for one")
        self.perHolder = perHolder
    }

    /// The share for a report pool of `connections`: half of it, so that a second key
    /// always finds a connection while the first holds its whole share.
    public convenience init(poolConnections connections: Int) {
        self.init(perHolder: max(1, connections / 2))
    }

    /// Places taken for one request; given back when the last reference to it goes
    /// (the response body that captured it has been written, or dropped unwritten).
    public final class Place: Sendable {
        private let shares: ReportShares
        private let names: [String]

        fileprivate init(shares: ReportShares, names: [String]) {
            self.shares = shares
            self.names = names
        }

        deinit { shares.leave(names) }
    }

    /// Takes a place for the key and the client address, or throws a 429 naming which is full.
    public func enter(keyID: String, channel: any Channel) throws -> Place {
        let address = Self.addressText(channel.remoteAddress)
        let names = ["key " + keyID, "address " + address]
        let full = holders.withLock { holders -> String? in
            if let full = names.first(where: { holders[$0, default: 0] >= perHolder }) { return full }
            for name in names { holders[name, default: 0] += 1 }
            return nil
        }
        if let full {
            throw ProblemDetails(
                .tooManyRequests, title: "Too many reports at once",
                detail: "this \(full.hasPrefix("key") ? "key" : "client address") already runs \(perHolder) report(s), its share of the report connections; retry when one has finished",
                headers: [.retryAfter: "1"]
            )
        }
        return Place(shares: self, names: names)
    }

    fileprivate func leave(_ names: [String]) {
        holders.withLock { holders in
            for name in names {
                let left = holders[name, default: 1] - 1
                holders[name] = left > 0 ? left : nil
            }
        }
    }

    /// Places held now, for tests.
    public var held: Int { holders.withLock { $0.values.reduce(0, +) } / 2 }

    /// The address without its port: one client's connections share it.
    static func addressText(_ address: SocketAddress?) -> String {
        guard let address else { return "unknown" }
        return address.ipAddress ?? "\(address)"
    }
}
