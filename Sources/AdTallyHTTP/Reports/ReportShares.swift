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
    /// Requests one key may run at once.
    public let perHolder: Int
    /// Requests one client address may run at once: more than a key, since many users
    /// may share an address (a proxy, a NAT), but never the whole pool.
    public let perAddress: Int
    private let holders = Mutex([String: Int]())

    /// A share of `perHolder` places per key and `perAddress` (default the same) per address.
    public init(perHolder: Int, perAddress: Int? = nil) {
        precondition(perHolder > 0, "a share needs room for one")
        self.perHolder = perHolder
        self.perAddress = max(1, perAddress ?? perHolder)
    }

    /// The share for a report pool of `connections`: half of it per key, so that a second
    /// key always finds a connection while the first holds its whole share, and all but
    /// one per address, so that another client always finds one.
    public convenience init(poolConnections connections: Int) {
        self.init(perHolder: max(1, connections / 2), perAddress: max(1, connections - 1))
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
        let names = [("key " + keyID, perHolder), ("address " + address, perAddress)]
        let full = holders.withLock { holders -> (String, Int)? in
            if let full = names.first(where: { holders[$0.0, default: 0] >= $0.1 }) { return full }
            for (name, _) in names { holders[name, default: 0] += 1 }
            return nil
        }
        if let (name, limit) = full {
            throw ProblemDetails(
                .tooManyRequests, title: "Too many reports at once",
                detail: "this \(name.hasPrefix("key") ? "key" : "client address") already runs \(limit) report(s), its share of the report connections; retry when one has finished",
                headers: [.retryAfter: "1"]
            )
        }
        return Place(shares: self, names: names.map(\.0))
    }

    fileprivate func leave(_ names: [String]) {
        holders.withLock { holders in
            for name in names {
                let left = holders[name, default: 1] - 1
                holders[name] = left > 0 ? left : nil
            }
        }
    }

    /// The address without its port: one client's connections share it.
    static func addressText(_ address: SocketAddress?) -> String {
        guard let address else { return "unknown" }
        return address.ipAddress ?? "\(address)"
    }
}
