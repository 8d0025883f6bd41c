import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The mediation switch read the way AdWhirl's apps read their file (DESIGN §9, §10):
/// the answer of `GET /v1/mediation` (the key's app) per placement and country, cached
/// in memory and in `switch.json`, refreshed at launch and whenever its `max-age` has
/// lapsed, with `If-None-Match` so that an unchanged answer costs a 304 and a device
/// keeps its side of a weighted split (the server keeps a tag's network). Callers
/// never wait: they get the cached network, or the compiled-in default.
final class Switchboard: @unchecked Sendable {
    struct Answer: Codable {
        /// `enable_advertising`: the network to show; nil when the server has no policy.
        var network: String?
        var etag: String?
        var maxAge: TimeInterval
        var fetchedAt: Date
    }

    private var server: URL
    private var appKey: String
    private let file: URL
    private let configuration: AdTallyConfiguration
    private let session: URLSession
    private let lock = NSLock()
    private var answers: [String: Answer]
    private var refreshing: Set<String> = []
    /// After a failed fetch, when the next may start (no retry storm while offline).
    private var retryAt: [String: Date] = [:]
    private var _counts = (fetches: 0, notModified: 0)

    /// Fetches started and 304 answers, since the engine opened.
    var counts: (fetches: Int, notModified: Int) {
        lock.lock()
        defer { lock.unlock() }
        return _counts
    }

    init(server: URL, appKey: String, file: URL, configuration: AdTallyConfiguration, session: URLSession) {
        self.server = server
        self.appKey = appKey
        self.file = file
        self.configuration = configuration
        self.session = session
        answers = (try? JSONDecoder().decode([String: Answer].self, from: Data(contentsOf: file))) ?? [:]
    }

    /// Another `AdTally` on the folder named another server or key.
    func update(server: URL, appKey: String) {
        lock.locked {
            self.server = server
            self.appKey = appKey
            retryAt = [:]
        }
    }

    private static func key(_ placement: String, _ country: String?) -> String { placement + "|" + (country ?? "") }

    func network(placement: String, country: String?, refreshing startRefresh: Bool = true) -> String? {
        let key = Self.key(placement, country)
        let now = Date()
        lock.lock()
        let answer = answers[key]
        let stale = answer.map { now >= $0.fetchedAt.addingTimeInterval($0.maxAge) } ?? true
        let start = startRefresh && stale && !refreshing.contains(key) && (retryAt[key].map { now >= $0 } ?? true)
        lock.unlock()
        if start { Task.detached(priority: .utility) { await self.refresh(placement: placement, country: country) } }
        if let answer, answer.network != nil || answer.etag != nil { return answer.network ?? fallback(placement) }
        return fallback(placement)
    }

    private func fallback(_ placement: String) -> String? {
        configuration.defaultNetworks[placement] ?? configuration.defaultNetwork
    }

    /// Refreshes every answer held (and the default placement's) at launch.
    func refreshAll() {
        lock.lock()
        var scopes = Set(answers.keys)
        lock.unlock()
        scopes.insert(Self.key("default", nil))
        for key in scopes {
            let parts = key.split(separator: "|", maxSplits: 1, omittingEmptySubsequences: false)
            let placement = String(parts[0])
            let country = parts.count > 1 && !parts[1].isEmpty ? String(parts[1]) : nil
            Task.detached(priority: .utility) { await self.refresh(placement: placement, country: country) }
        }
    }

    func refresh(placement: String, country: String?) async {
        let key = Self.key(placement, country)
        let start: (go: Bool, held: Answer?, server: URL, appKey: String) = lock.locked {
            guard !refreshing.contains(key) else { return (false, nil, self.server, self.appKey) }
            refreshing.insert(key)
            _counts.fetches += 1
            return (true, answers[key], self.server, self.appKey)
        }
        guard start.go else { return }
        let held = start.held
        let server = start.server
        let appKey = start.appKey
        defer { lock.locked { _ = refreshing.remove(key) } }

        var components = URLComponents(url: server.appendingPathComponent("v1/mediation"), resolvingAgainstBaseURL: false)!
        components.queryItems = [URLQueryItem(name: "placement", value: placement)] + (country.map { [URLQueryItem(name: "country", value: $0)] } ?? [])
        var request = URLRequest(url: components.url!, timeoutInterval: configuration.requestTimeout)
        request.setValue("Bearer \(appKey)", forHTTPHeaderField: "Authorization")
        request.setValue("AdTallyKit/1", forHTTPHeaderField: "User-Agent")
        if let etag = held?.etag { request.setValue(etag, forHTTPHeaderField: "If-None-Match") }
        request.cachePolicy = .reloadIgnoringLocalCacheData

        guard let (data, response) = try? await session.adTallyData(for: request), let http = response as? HTTPURLResponse else {
            failed(key)
            return
        }
        let maxAge = Self.maxAge(http.value(forHTTPHeaderField: "Cache-Control")) ?? 60
        let now = Date()
        lock.locked {
            switch http.statusCode {
            case 200:
                let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any]
                if let network = object?["enable_advertising"] as? String {
                    answers[key] = Answer(network: network, etag: http.value(forHTTPHeaderField: "ETag"), maxAge: maxAge, fetchedAt: now)
                } else {
                    retryAt[key] = now.addingTimeInterval(30)
                }
            case 304:
                _counts.notModified += 1
                if var answer = held {
                    answer.fetchedAt = now
                    answer.maxAge = maxAge
                    answers[key] = answer
                }
            case 404:
                // No policy answers: the app's own default applies until one does.
                answers[key] = Answer(network: nil, etag: nil, maxAge: maxAge, fetchedAt: now)
            default:
                retryAt[key] = now.addingTimeInterval(30)
            }
        }
        save()
    }

    private let saving = NSLock()
    private var version = 0
    private var savedVersion = 0

    /// Writes the answers held now; a write that started earlier never lands after a later one.
    private func save() {
        let mine = lock.locked { () -> Int in
            version += 1
            return version
        }
        saving.locked {
            guard mine > savedVersion, let data = try? JSONEncoder().encode(lock.locked { answers }) else { return }
            savedVersion = lock.locked { version }
            try? data.write(to: file, options: .atomic)
        }
    }

    private func failed(_ key: String) {
        lock.lock()
        retryAt[key] = Date().addingTimeInterval(30)
        lock.unlock()
    }

    static func maxAge(_ cacheControl: String?) -> TimeInterval? {
        guard let cacheControl else { return nil }
        for part in cacheControl.split(separator: ",") {
            let item = part.trimmingCharacters(in: .whitespaces)
            if item.hasPrefix("max-age="), let seconds = Double(item.dropFirst(8)), seconds >= 0 { return seconds }
        }
        return nil
    }
}
