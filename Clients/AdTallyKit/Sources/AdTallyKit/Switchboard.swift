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
///
/// Only AdTally's answer replaces the last good one (`SwitchAnswer`): anything else — a
/// portal's page, a name the server could not have sent, a body over 64 KiB, a 304 with
/// nothing held — is a failed fetch, retried with a backoff (30 s doubling to an hour).
final class Switchboard: @unchecked Sendable {
    struct Answer: Codable {
        /// `enable_advertising`: the network to show; nil when the server has no policy.
        var network: String?
        var etag: String?
        var maxAge: TimeInterval
        var fetchedAt: Date
        /// The per-install id it was fetched with: in an experiment (DESIGN §14) the
        /// answer is the device's arm's, so a tag held for another id is not revalidated.
        var device: String?
    }

    private var server: URL
    private var appKey: String
    private let file: URL
    private let configuration: AdTallyConfiguration
    private let transport: Transport
    private let lock = NSLock()
    private var answers: [String: Answer]
    /// The fetch in flight per scope: a second caller waits for it.
    private var inFlight: [String: Task<Void, Never>] = [:]
    /// After failed fetches, when the next may start, and how many failed in a row.
    private var retryAt: [String: Date] = [:]
    private var failures: [String: Int] = [:]
    private var _counts = (fetches: 0, notModified: 0)
    /// Bumped when the install is forgotten: a fetch started before stores nothing (it
    /// was made with the old id, and would put it back).
    private var generation = 0
    /// The per-install id sent with each fetch (`device`), nil when the user opted out:
    /// set by the engine once, before the first fetch.
    var deviceID: @Sendable () -> String? = { nil }

    /// The shortest `max-age` honoured: a zero from the server (or from a middlebox)
    /// would otherwise start a fetch at every `network(for:)`.
    static let minMaxAge: TimeInterval = 1
    /// The largest `switch.json` read at launch (a few hundred placements fit in it).
    static let maxFileBytes = 1 << 20

    /// Fetches started and 304 answers, since the engine opened.
    var counts: (fetches: Int, notModified: Int) {
        lock.lock()
        defer { lock.unlock() }
        return _counts
    }

    init(server: URL, appKey: String, file: URL, configuration: AdTallyConfiguration, transport: Transport) {
        self.server = server
        self.appKey = appKey
        self.file = file
        self.configuration = configuration
        self.transport = transport
        answers = Self.load(file)
    }

    /// The answers kept in `file`, each checked as a fresh one would be (a file written by
    /// an earlier version, or damaged, gives up only what fails).
    static func load(_ file: URL) -> [String: Answer] {
        guard let size = (try? FileManager.default.attributesOfItem(atPath: file.path)[.size] as? NSNumber)?.intValue, size <= maxFileBytes,
              let data = try? Data(contentsOf: file),
              let saved = try? JSONDecoder().decode([String: Answer].self, from: data) else { return [:] }
        return saved.filter { _, answer in
            (answer.network.map(SwitchAnswer.isNetworkName) ?? true) && (answer.etag.map(SwitchAnswer.isETag) ?? true)
                && answer.maxAge.isFinite && answer.maxAge >= 0
        }
    }

    /// A forgotten install: no answer keeps its id (in memory or in `switch.json`), nor a tag
    /// fetched with it; each keeps its network until refreshed (at once) under the new id.
    func forgetDevice() {
        lock.locked {
            generation += 1
            for key in answers.keys {
                answers[key]?.device = nil
                answers[key]?.etag = nil
                answers[key]?.fetchedAt = .distantPast
            }
        }
        save()
    }

    /// At open: answers fetched with another id than the install's (a forget killed after
    /// its new id was written) keep no trace of it.
    func keepOnly(device: String) {
        let stale = lock.locked { answers.values.contains { $0.device != nil && $0.device != device } }
        if stale { forgetDevice() }
    }

    /// Another `AdTally` on the folder named another server or key.
    func update(server: URL, appKey: String) {
        lock.locked {
            self.server = server
            self.appKey = appKey
            retryAt = [:]
            failures = [:]
        }
    }

    private static func key(_ placement: String, _ country: String?) -> String { placement + "|" + (country ?? "") }

    func network(placement: String, country: String?, refreshing startRefresh: Bool = true) -> String? {
        let key = Self.key(placement, country)
        let now = Date()
        lock.lock()
        let answer = answers[key]
        let stale = answer.map { now >= $0.fetchedAt.addingTimeInterval(max(Self.minMaxAge, $0.maxAge)) } ?? true
        let start = startRefresh && stale && inFlight[key] == nil && (retryAt[key].map { now >= $0 } ?? true)
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

    /// Fetches the scope's answer now, or waits for the fetch already in flight.
    func refresh(placement: String, country: String?) async {
        let key = Self.key(placement, country)
        let task: Task<Void, Never> = lock.locked {
            if let running = inFlight[key] { return running }
            _counts.fetches += 1
            let held = answers[key]
            let server = self.server
            let appKey = self.appKey
            let task = Task.detached(priority: .utility) { [self] in
                await fetch(key: key, placement: placement, country: country, held: held, server: server, appKey: appKey)
                lock.locked { _ = inFlight.removeValue(forKey: key) }
            }
            inFlight[key] = task
            return task
        }
        await task.value
    }

    private func fetch(key: String, placement: String, country: String?, held: Answer?, server: URL, appKey: String) async {
        guard var components = URLComponents(url: server.appendingPathComponent("v1/mediation"), resolvingAgainstBaseURL: false) else {
            failed(key)
            return
        }
        // The device's id lets the server answer its experiment arm, the same every time.
        let started = lock.locked { generation }
        let device = deviceID()
        let held = held?.device == device ? held : nil
        components.queryItems = [URLQueryItem(name: "placement", value: placement)] + (country.map { [URLQueryItem(name: "country", value: $0)] } ?? [])
            + (device.map { [URLQueryItem(name: "device", value: $0)] } ?? [])
        guard let url = components.url else {
            failed(key)
            return
        }
        var request = URLRequest(url: url, timeoutInterval: configuration.requestTimeout)
        request.setValue("Bearer \(appKey)", forHTTPHeaderField: "Authorization")
        request.setValue("AdTallyKit/1", forHTTPHeaderField: "User-Agent")
        if let etag = held?.etag { request.setValue(etag, forHTTPHeaderField: "If-None-Match") }
        request.cachePolicy = .reloadIgnoringLocalCacheData

        guard case .success(let answer) = await transport.exchange(request, maxBytes: SwitchAnswer.maxBytes, deadline: configuration.requestTimeout) else {
            failed(key)
            return
        }
        let maxAge = min(86_400, Self.maxAge(answer.header("cache-control")) ?? 60)
        let now = Date()
        let changed = lock.locked { () -> Bool in
            // Made with an id forgotten since: nothing of it is kept (nor counted as failed).
            guard generation == started else { return true }
            switch answer.status {
            case 200:
                guard case .success(let network) = SwitchAnswer.parse(answer.body, mediaType: answer.mediaType) else { return false }
                let etag = answer.header("etag").flatMap { SwitchAnswer.isETag($0) ? $0 : nil }
                answers[key] = Answer(network: network, etag: etag, maxAge: maxAge, fetchedAt: now, device: device)
            case 304:
                // A 304 to nothing held is no answer (a middlebox's): a failed fetch.
                guard var kept = held, kept.etag != nil else { return false }
                _counts.notModified += 1
                kept.fetchedAt = now
                kept.maxAge = maxAge
                answers[key] = kept
            case 404 where Problem(answer) != nil:
                // AdTally's own 404: no policy answers; the app's default applies until one does.
                answers[key] = Answer(network: nil, etag: nil, maxAge: maxAge, fetchedAt: now, device: device)
            default:
                return false
            }
            retryAt[key] = nil
            failures[key] = nil
            return true
        }
        if changed { save() } else { failed(key) }
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

    /// A failed fetch: the next waits 30 s, doubled per failure in a row up to an hour,
    /// half of it at random (devices turned away together do not come back together).
    private func failed(_ key: String) {
        lock.locked {
            let count = (failures[key] ?? 0) + 1
            failures[key] = count
            let delay = min(3600, 30 * pow(2, Double(min(count - 1, 20))))
            retryAt[key] = Date().addingTimeInterval(delay / 2 + Double.random(in: 0...(delay / 2)))
        }
    }

    static func maxAge(_ cacheControl: String?) -> TimeInterval? {
        guard let cacheControl, cacheControl.utf8.count <= 1024 else { return nil }
        for part in cacheControl.split(separator: ",") {
            let item = part.trimmingCharacters(in: .whitespaces)
            if item.hasPrefix("max-age="), let seconds = Double(item.dropFirst(8)), seconds.isFinite, seconds >= 0 { return seconds }
        }
        return nil
    }
}

/// AdTally's switch answer (`GET /v1/mediation`, 200): a JSON object whose
/// `enable_advertising` is a network name by the server's own rule. Nothing else is
/// handed to the app.
@_spi(Answers) public enum SwitchAnswer {
    /// The most bytes of an answer read (the server's are at most 32 KiB).
    public static let maxBytes = 64 << 10

    private struct Wire: Decodable {
        var enable_advertising: String
    }

    /// The network an answer names, or why it is not AdTally's.
    public static func parse(_ body: Data, mediaType: String) -> Result<String, AnswerRefusal> {
        guard mediaType == "application/json" else {
            return .failure(AnswerRefusal("a switch answer that is not JSON (\(mediaType.isEmpty ? "no content type" : mediaType))"))
        }
        guard body.count <= maxBytes, let wire = try? JSONDecoder().decode(Wire.self, from: body) else {
            return .failure(AnswerRefusal("a switch answer without enable_advertising (\(body.count) bytes)"))
        }
        guard isNetworkName(wire.enable_advertising) else {
            return .failure(AnswerRefusal("a switch answer naming a network the server could not have sent"))
        }
        return .success(wire.enable_advertising)
    }

    /// The server's rule for a network: `[a-z0-9_.-]{1,32}`.
    public static func isNetworkName(_ name: String) -> Bool {
        (try? EventRules.checkNetwork(name)) != nil
    }

    /// An entity tag worth sending back: at most 256 visible ASCII characters.
    static func isETag(_ tag: String) -> Bool {
        let bytes = tag.utf8
        return (1...256).contains(bytes.count) && bytes.allSatisfy { (0x21...0x7E).contains($0) }
    }
}
