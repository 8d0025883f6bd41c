import AdTallyCore
import Foundation
import PostgresKit
import Synchronization

/// The networks each app's events may name (Migrations/0010, DESIGN §2): the app's
/// declared list when it has one, else the first `maxPerApp` seen. Events naming any
/// other network are stored and counted under `other`: the ingest key ships inside
/// the app, and networks invented with it must not grow every report, the dashboard
/// and the mediation answer, nor win a slot.
///
/// Ingest asks the database only for a network it has not seen admitted for the app,
/// while the app can still admit one; what it learns is kept for `ttl` (a list
/// declared through another server takes effect within it).
public final class AppNetworks: Sendable {
    /// Networks an app without a declared list admits, in the order first seen.
    public static let maxPerApp = 64
    /// What the events of a network not admitted are counted as.
    public static let other = EventValidator.otherNetwork

    private struct Entry {
        var admitted: Set<String>
        /// No network can be admitted any more (a declared list, or `maxPerApp` reached).
        var isClosed: Bool
        var expires: ContinuousClock.Instant
    }

    private let cache = Mutex([String: Entry]())
    let ttl: Duration

    /// Admission over the database `EventStore` writes to.
    public init(ttl: Duration = .seconds(30)) {
        self.ttl = ttl
    }

    /// Forgets what is known of `app` (its declared list changed through this server).
    public func forget(_ app: String) {
        cache.withLock { $0[app] = nil }
    }

    /// For each event, whether its network may be named, admitting new networks as the
    /// rules allow. Only when the cache cannot answer, in a short transaction of its own
    /// (it holds the app's admission lock until it ends), before the write's.
    func admitted(_ events: [AppEvent], on connection: PostgresConnection) throws -> @Sendable (AppEvent) -> Bool {
        let now = ContinuousClock.now
        var wanted: [String: Set<String>] = [:]
        // Networks in the order first seen, for admission when places are few.
        var order: [(app: String, network: String)] = []
        // A session names no network ("") and needs no place.
        for item in events where item.event.network != Self.other && item.event.network != EventValidator.noNetwork {
            if wanted[item.appID, default: []].insert(item.event.network).inserted { order.append((item.appID, item.event.network)) }
        }
        // Apps whose cached entry cannot answer for every network they name here.
        let unknown = cache.withLock { cache in
            wanted.filter { app, networks in
                guard let entry = cache[app], entry.expires > now else { return true }
                return !entry.isClosed && !networks.isSubset(of: entry.admitted)
            }
        }
        if !unknown.isEmpty {
            let apps = unknown.keys.sorted()
            let pairs = order.filter { unknown[$0.app] != nil }
            // Per app, in statements that name one app_id each (Citus routes them to one
            // shard; it refuses correlated subqueries over unnest()), under the app's
            // admission lock, taken in app order so that two admitters cannot deadlock.
            let fresh = try connection.withTransaction { connection -> [String: Entry] in
                var fresh: [String: Entry] = [:]
                for app in apps {
                    _ = try connection.query("SELECT pg_advisory_xact_lock(2022, hashtext(\(app)))")
                    guard let row = try connection.query(AppStore.networksQuery(app: app)).first else {
                        // An app that does not exist admits nothing (no key sends for it; tests may).
                        fresh[app] = Entry(admitted: [], isClosed: true, expires: now + ttl)
                        continue
                    }
                    let (declared, seen) = try AppStore.decodeNetworks(row)
                    var admitted = Set(seen)
                    // New networks in the order first seen: within the declared list, or while places are left.
                    var new: [String] = []
                    for pair in pairs where pair.app == app && !admitted.contains(pair.network) && !new.contains(pair.network) {
                        if let declared {
                            if declared.contains(pair.network) { new.append(pair.network) }
                        } else if admitted.count + new.count < Self.maxPerApp {
                            new.append(pair.network)
                        }
                    }
                    if !new.isEmpty {
                        _ = try connection.query("""
                            INSERT INTO app_networks (app_id, network) SELECT \(app), n FROM unnest(\(array: new)::text[]) AS n ON CONFLICT DO NOTHING
                            """)
                        admitted.formUnion(new)
                    }
                    // A declared list is the admitted set itself; else the networks admitted so far.
                    let effective = declared.map(Set.init) ?? admitted
                    fresh[app] = Entry(admitted: effective, isClosed: declared != nil || effective.count >= Self.maxPerApp, expires: now + ttl)
                }
                return fresh
            }
            cache.withLock { cache in
                // Bounded like the apps themselves: one entry an app that sent events.
                for (app, entry) in fresh { cache[app] = entry }
            }
        }
        let known = cache.withLock { cache in wanted.keys.reduce(into: [String: Set<String>]()) { $0[$1] = cache[$1]?.admitted ?? [] } }
        return { item in item.event.network == Self.other || item.event.network == EventValidator.noNetwork || known[item.appID]?.contains(item.event.network) == true }
    }
}

/// An app's networks as its admin sees them: the declared list, if any, and the
/// networks admitted so far (`AppNetworks`).
public struct AppNetworkList: Sendable, Encodable, Equatable {
    /// The app.
    public var app: String
    /// The declared list; nil: the first `AppNetworks.maxPerApp` seen are admitted.
    public var declared: [String]?
    /// The networks its events may name now (the declared list when there is one).
    public var admitted: [String]
    /// How many an app without a list admits.
    public var limit: Int = AppNetworks.maxPerApp

    enum CodingKeys: String, CodingKey { case app, declared, admitted, limit }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(app, forKey: .app)
        try container.encode(declared, forKey: .declared)
        try container.encode(admitted, forKey: .admitted)
        try container.encode(limit, forKey: .limit)
    }
}

extension AppStore {
    /// An app's declared list and the networks admitted so far: one row, none for an
    /// unknown app. The app is named in each part, not correlated (Citus refuses a
    /// subquery of app_networks, distributed, correlated with apps, a reference table).
    static func networksQuery(app: String) -> PostgresQuery {
        """
        SELECT to_json(a.networks)::text, coalesce(to_json(ARRAY(SELECT n.network FROM app_networks n WHERE n.app_id = \(app) ORDER BY n.network))::text, '[]')
        FROM apps a WHERE a.app_id = \(app)
        """
    }

    /// A row of `networksQuery`: the declared list (nil: none) and the admitted networks.
    static func decodeNetworks(_ row: PostgresRow) throws -> (declared: [String]?, seen: [String]) {
        let decoder = JSONDecoder()
        let declared = try row.decode(0, as: String?.self).map { try decoder.decode([String].self, from: Data($0.utf8)) }
        return (declared, try decoder.decode([String].self, from: Data(try row.decode(1, as: String.self).utf8)))
    }

    /// An app's declared and admitted networks; nil for an unknown app.
    public func networks(app: String) async throws -> AppNetworkList? {
        guard let row = try await pool.query(Self.networksQuery(app: app)).first else { return nil }
        let (declared, seen) = try Self.decodeNetworks(row)
        return AppNetworkList(app: app, declared: declared?.sorted(), admitted: (declared ?? seen).sorted())
    }

    /// Declares an app's networks (nil: none, the first `AppNetworks.maxPerApp` seen are
    /// admitted again); names checked as events check theirs. Networks admitted before
    /// and not on the list are forgotten, so their events count as `other` from now on.
    public func setNetworks(app: String, _ networks: [String]?) async throws -> AppNetworkList {
        if let networks {
            guard !networks.isEmpty else {
                throw AppStoreError.invalid(field: "networks", rule: "names at least one network (null drops the list: the first \(AppNetworks.maxPerApp) seen are admitted)")
            }
            guard networks.count <= AppNetworks.maxPerApp else {
                throw AppStoreError.invalid(field: "networks", rule: "at most \(AppNetworks.maxPerApp) networks")
            }
            for name in networks where !EventValidator.isNetworkName(name) || name == AppNetworks.other {
                throw AppStoreError.invalid(field: "networks", rule: "\"\(name)\" is not a network name ([a-z0-9_.-], 1 to 32 characters, not other)")
            }
        }
        let list = networks.map { Array(Set($0)).sorted() }
        let updated = try await pool.withTransaction { connection in
            // Under the app's admission lock: no admission in flight inserts behind the DELETE.
            _ = try connection.query("SELECT pg_advisory_xact_lock(2022, hashtext(\(app)))")
            let rows = if let list {
                try connection.query("UPDATE apps SET networks = \(array: list)::text[] WHERE app_id = \(app) RETURNING 1")
            } else {
                try connection.query("UPDATE apps SET networks = NULL WHERE app_id = \(app) RETURNING 1")
            }
            guard !rows.isEmpty else { return false }
            if let list {
                _ = try connection.query("DELETE FROM app_networks WHERE app_id = \(app) AND NOT (network = ANY(\(array: list)::text[]))")
            }
            return true
        }
        guard updated, let result = try await self.networks(app: app) else { throw AppStoreError.unknownApp(app) }
        return result
    }
}
