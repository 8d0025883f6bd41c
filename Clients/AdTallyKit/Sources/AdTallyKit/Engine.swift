import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
#if canImport(UIKit)
import UIKit
#endif

/// The shared state behind every `AdTally` of one queue folder: the queue, the
/// sender, the switch. One lock guards the queue and the counters.
final class Engine: @unchecked Sendable {
    let server: URL
    let appKey: String
    let directory: URL
    let configuration: AdTallyConfiguration
    let deviceID: String
    /// The fields every event carries, as JSON text after the event's own (`,"country":…`).
    private let commonFields: [UInt8]
    let switchboard: Switchboard

    let lock = NSLock()
    private let queue: EventQueue
    private let lockFD: Int32
    private var users = 1
    private var sender: Task<Void, Never>?
    private let wakeup = Wakeup()
    private var isClosed = false

    // Sending state (under `lock`).
    private var inFlight = false
    private var failures = 0
    private var notBefore = Date.distantPast
    private var batchLimit: Int
    private var flushRequested = false
    private var lastSend = Date()
    private var stoppedBy: (status: Int, detail: String)?
    private var waiters: [(target: QueuePosition, id: UUID, continuation: CheckedContinuation<Void, any Error>)] = []
    private var counters = AdTallyStatus(pending: 0, pendingBytes: 0, delivered: 0, dropped: [:], deadLettered: 0, stoppedBy: nil, requests: 0, splits: 0, throttled: 0, switchFetches: 0, switchNotModified: 0)
    private var dropReports: DropReports
    private let session: URLSession

    /// One URLSession for every engine of the process: a session costs memory of its own
    /// (on Linux, libcurl's: ~5 MiB, measured by make bench-client), and its connections are
    /// shared. Each request carries its engine's timeout; closing an engine cancels its own.
    static let sharedSession: URLSession = {
        let configuration = URLSessionConfiguration.ephemeral
        configuration.httpMaximumConnectionsPerHost = 2
        configuration.urlCache = nil
        return URLSession(configuration: configuration)
    }()

    // MARK: - Opening: one engine per folder per process

    private static let registryLock = NSLock()
    nonisolated(unsafe) private static var registry: [String: Engine] = [:]

    static func open(server: URL, appKey: String, directory: URL, configuration: AdTallyConfiguration) throws -> Engine {
        let path = directory.standardizedFileURL.resolvingSymlinksInPath().path
        registryLock.lock()
        defer { registryLock.unlock() }
        if let engine = registry[path] {
            engine.lock.lock()
            engine.users += 1
            engine.lock.unlock()
            return engine
        }
        let engine = try Engine(server: server, appKey: appKey, directory: directory, configuration: configuration)
        registry[path] = engine
        engine.start()
        return engine
    }

    private init(server: URL, appKey: String, directory: URL, configuration: AdTallyConfiguration) throws {
        guard configuration.maxQueueBytes >= 2 * configuration.segmentBytes, configuration.segmentBytes >= 4096 else {
            throw AdTallyError.misuse("maxQueueBytes must be at least two segments (segmentBytes ≥ 4096)")
        }
        self.server = server
        self.appKey = appKey
        self.directory = directory
        self.configuration = configuration
        batchLimit = max(1, min(configuration.batchSize, 1000))
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        lockFD = Glibc_open(directory.appendingPathComponent("queue.lock").path)
        guard lockFD >= 0 else { throw AdTallyError.storage("cannot open \(directory.path)/queue.lock") }
        guard flock(lockFD, LOCK_EX | LOCK_NB) == 0 else {
            close(lockFD)
            throw AdTallyError.directoryInUse(directory.path)
        }
        do {
            queue = try EventQueue(folder: directory.appendingPathComponent("queue"), segmentBytes: configuration.segmentBytes)
            deviceID = try Self.deviceID(in: directory)
        } catch {
            close(lockFD)
            throw error
        }
        commonFields = try Self.commonFields(configuration, device: deviceID)
        dropReports = DropReports(file: directory.appendingPathComponent("drops.json"))
        session = Self.sharedSession
        switchboard = Switchboard(server: server, appKey: appKey, file: directory.appendingPathComponent("switch.json"), configuration: configuration, session: session)
        if queue.damagedOnOpen > 0 { noteDropped(queue.damagedOnOpen, .damaged) }
    }

    private func start() {
        sender = Task.detached(priority: .utility) { [self] in await self.sendLoop() }
        switchboard.refreshAll()
        #if canImport(UIKit) && !os(watchOS)
        NotificationCenter.default.addObserver(forName: UIApplication.didEnterBackgroundNotification, object: nil, queue: nil) { [weak self] _ in
            self?.enteredBackground()
        }
        #endif
    }

    /// One `AdTally` of this engine went away; the last one closes it.
    func release() {
        Self.registryLock.lock()
        lock.lock()
        users -= 1
        let last = users == 0
        if last { isClosed = true }
        let pending = last ? waiters : []
        if last { waiters = [] }
        lock.unlock()
        if last { Self.registry = Self.registry.filter { $0.value !== self } }
        Self.registryLock.unlock()
        guard last else { return }
        for waiter in pending { waiter.continuation.resume(throwing: AdTallyError.closed) }
        sender?.cancel()
        wakeup.signal()
        lock.lock()
        queue.sync()
        lock.unlock()
        flock(lockFD, LOCK_UN)
        close(lockFD)
    }

    // MARK: - Recording

    func record(type: String, network: String?, format: AdFormat?, placement: String?, size: String?, fields: (inout EventJSON) -> Void) throws -> UUID {
        let id = UUID()
        let millis = Int64((Date().timeIntervalSince1970 * 1000).rounded(.down))
        var json = EventJSON(id: id, type: type, occurredAtMillis: millis)
        json.add("network", network)
        json.add("format", format?.rawValue)
        json.add("placement", placement)
        json.add("size", size)
        fields(&json)
        var bytes = json.finish()
        bytes.removeLast()
        bytes.append(contentsOf: commonFields)

        var dropped = 0
        lock.lock()
        guard !isClosed else {
            lock.unlock()
            throw AdTallyError.closed
        }
        do {
            try queue.append(json: bytes, occurredAtMillis: millis)
        } catch {
            lock.unlock()
            throw error
        }
        if configuration.durability == .syncEveryRecord { queue.sync() }
        if !inFlight { dropped = enforceBound() }
        let due = queue.pendingCount >= configuration.sendAfterEvents
        lock.unlock()
        if dropped > 0 { noteDropped(dropped, .queueFull) }
        if due { wakeup.signal() }
        return id
    }

    /// Drops the oldest segments while the queue is over its byte bound (under `lock`, no batch in flight).
    private func enforceBound() -> Int {
        var dropped = 0
        while queue.pendingBytes > configuration.maxQueueBytes, queue.head.segment < queue.tail.segment {
            guard let count = try? queue.dropOldestSegment() else { break }
            dropped += count
        }
        return dropped
    }

    func reportMisuse(_ error: AdTallyError) {
        configuration.misuseHandler?(error)
    }

    private func noteDropped(_ count: Int, _ reason: DropReason) {
        lock.lock()
        counters.dropped[reason, default: 0] += count
        dropReports.add(count, reason)
        lock.unlock()
        configuration.notices?(.dropped(count: count, reason: reason))
    }

    var status: AdTallyStatus {
        lock.lock()
        defer { lock.unlock() }
        var status = counters
        status.pending = queue.pendingCount
        status.pendingBytes = queue.pendingBytes
        status.stoppedBy = stoppedBy?.status
        let switchCounts = switchboard.counts
        status.switchFetches = switchCounts.fetches
        status.switchNotModified = switchCounts.notModified
        return status
    }

    // MARK: - Flushing

    func flush() async throws {
        let id = UUID()
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                lock.lock()
                if let stopped = stoppedBy {
                    lock.unlock()
                    continuation.resume(throwing: AdTallyError.sendingStopped(status: stopped.status, detail: stopped.detail))
                    return
                }
                if isClosed {
                    lock.unlock()
                    continuation.resume(throwing: AdTallyError.closed)
                    return
                }
                if queue.head >= queue.tail && !dropReports.hasUnsent {
                    lock.unlock()
                    continuation.resume()
                    return
                }
                waiters.append((queue.tail, id, continuation))
                flushRequested = true
                lock.unlock()
                wakeup.signal()
            }
        } onCancel: {
            lock.lock()
            let index = waiters.firstIndex { $0.id == id }
            let waiter = index.map { waiters.remove(at: $0) }
            lock.unlock()
            waiter?.continuation.resume(throwing: CancellationError())
        }
    }

    /// Resumes the waiters whose events have all been answered (under `lock`); returns them.
    private func answeredWaiters() -> [CheckedContinuation<Void, any Error>] {
        guard !dropReports.hasUnsent else { return [] }
        let head = queue.head
        let done = waiters.filter { $0.target <= head }
        waiters.removeAll { $0.target <= head }
        return done.map(\.continuation)
    }

    func enteredBackground() {
        lock.lock()
        queue.sync()
        flushRequested = true
        lock.unlock()
        wakeup.signal()
    }

    func resumeSending() {
        lock.lock()
        stoppedBy = nil
        failures = 0
        notBefore = .distantPast
        lock.unlock()
        wakeup.signal()
    }

    // MARK: - Sending

    private enum Next {
        case wait(TimeInterval)
        case send
        case stop
    }

    private func nextStep() -> Next {
        lock.lock()
        defer { lock.unlock() }
        if isClosed { return .stop }
        if stoppedBy != nil { return .wait(3600) }
        let hasWork = queue.pendingCount > 0 || dropReports.hasUnsent || queue.head < queue.tail
        guard hasWork else {
            // Nothing to send: answer waiters that only wait for what is already done.
            flushRequested = false
            return .wait(configuration.sendInterval)
        }
        let now = Date()
        if now < notBefore { return .wait(notBefore.timeIntervalSince(now)) }
        if flushRequested || queue.pendingCount >= configuration.sendAfterEvents || failures > 0 { return .send }
        let due = lastSend.addingTimeInterval(configuration.sendInterval)
        return now >= due ? .send : .wait(due.timeIntervalSince(now))
    }

    private func sendLoop() async {
        var lastSync = Date()
        while !Task.isCancelled {
            switch nextStep() {
            case .stop: return
            case .wait(let seconds):
                if case .syncEvery(let interval) = configuration.durability {
                    // Sync what waits at most `interval` after it was written.
                    let wait = min(seconds, max(0.05, interval - Date().timeIntervalSince(lastSync)))
                    await wakeup.sleep(wait)
                    if Date().timeIntervalSince(lastSync) >= interval {
                        lock.locked { queue.sync() }
                        lastSync = Date()
                    }
                } else {
                    await wakeup.sleep(seconds)
                }
            case .send:
                await sendBatch()
                await sendDropReports()
                let ready = lock.locked { () -> [CheckedContinuation<Void, any Error>] in
                    let ready = answeredWaiters()
                    if queue.head >= queue.tail && !dropReports.hasUnsent { flushRequested = false }
                    return ready
                }
                for continuation in ready { continuation.resume() }
            }
        }
    }

    /// The batch to send from the head (synced to disk first), or nil when there is none.
    private func takeBatch() -> [QueuedRecord]? {
        lock.locked {
            queue.sync()
            let records: [QueuedRecord]
            do {
                records = try queue.read(limit: batchLimit, maxBytes: configuration.batchBytes)
            } catch {
                configuration.notices?(.sendFailed("cannot read the queue: \(error)"))
                backOffLocked()
                return nil
            }
            guard !records.isEmpty else {
                // Only damage left between head and tail: pass it.
                _ = try? queue.advance(to: queue.tail, records: queue.pendingCount)
                return nil
            }
            inFlight = true
            lastSend = Date()
            return records
        }
    }

    private func sendBatch() async {
        guard let records = takeBatch(), let last = records.last else { return }
        let oldest = Int64((Date().timeIntervalSince1970 - configuration.maxEventAge) * 1000)
        let fresh = records.filter { $0.occurredAtMillis >= oldest }
        var outcome = Outcome.delivered(rejected: [])
        if !fresh.isEmpty {
            outcome = await post(fresh)
        }
        let (notices, dropped, refused) = lock.locked { () -> ([AdTallyNotice], Int, [CheckedContinuation<Void, any Error>]) in
            let (notices, dropped) = finishBatch(records, fresh: fresh, last: last, outcome: outcome)
            // A refused key fails the flushes waiting: after the app was told (below).
            guard stoppedBy != nil else { return (notices, dropped, []) }
            defer { waiters = [] }
            return (notices, dropped, waiters.map(\.continuation))
        }
        if dropped > 0 { noteDropped(dropped, .queueFull) }
        for notice in notices { configuration.notices?(notice) }
        if let stopped = lock.locked({ stoppedBy }) {
            for continuation in refused { continuation.resume(throwing: AdTallyError.sendingStopped(status: stopped.status, detail: stopped.detail)) }
        }
    }

    /// Applies the server's answer to a batch (under `lock`): the queue's head, the
    /// dead letters, the retry timing; returns the notices to give and the events the
    /// bound dropped meanwhile.
    private func finishBatch(_ records: [QueuedRecord], fresh: [QueuedRecord], last: QueuedRecord, outcome: Outcome) -> ([AdTallyNotice], Int) {
        var notices: [AdTallyNotice] = []
        let expired = records.count - fresh.count
        inFlight = false
        counters.requests += fresh.isEmpty ? 0 : 1
        switch outcome {
        case .delivered(let rejected):
            counters.delivered += fresh.count - rejected.count
            counters.deadLettered += rejected.count
            for (index, reason) in rejected where index < fresh.count {
                DeadLetter.append(fresh[index].json, reason: reason, in: directory)
                if let id = Self.id(of: fresh[index].json) { notices.append(.rejected(id: id, reason: reason)) }
            }
            _ = try? queue.advance(to: last.end, records: records.count)
            failures = 0
            notBefore = .distantPast
            batchLimit = min(max(1, min(configuration.batchSize, 1000)), batchLimit * 2)
            if expired > 0 {
                counters.dropped[.expired, default: 0] += expired
                dropReports.add(expired, .expired)
                notices.append(.dropped(count: expired, reason: .expired))
            }
        case .split(let detail):
            counters.splits += 1
            if fresh.count == 1 {
                // One event the server cannot take at all: it leaves with the reason.
                DeadLetter.append(fresh[0].json, reason: detail, in: directory)
                counters.deadLettered += 1
                if let id = Self.id(of: fresh[0].json) { notices.append(.rejected(id: id, reason: detail)) }
                _ = try? queue.advance(to: last.end, records: records.count)
            } else {
                batchLimit = max(1, fresh.count / 2)
            }
        case .stopped(let status, let detail):
            stoppedBy = (status, detail)
            notices.append(.sendingStopped(status: status, detail: detail))
        case .retryAfter(let seconds, let detail):
            counters.throttled += 1
            failures += 1
            notBefore = Date().addingTimeInterval(seconds)
            notices.append(.sendFailed(detail))
        case .failed(let detail):
            backOffLocked()
            notices.append(.sendFailed(detail))
        }
        return (notices, enforceBound())
    }

    /// Exponential backoff with jitter: half the delay fixed, half random (under `lock`).
    private func backOffLocked() {
        failures += 1
        let delay = min(configuration.retryCap, configuration.retryBase * pow(2, Double(min(failures - 1, 30))))
        notBefore = Date().addingTimeInterval(delay / 2 + Double.random(in: 0...(delay / 2)))
    }

    private enum Outcome {
        case delivered(rejected: [(Int, String)])
        case split(String)
        case stopped(Int, String)
        case retryAfter(TimeInterval, String)
        case failed(String)
    }

    private func post(_ records: [QueuedRecord]) async -> Outcome {
        var body: [UInt8] = []
        body.reserveCapacity(records.reduce(0) { $0 + $1.json.count + 1 })
        for record in records {
            body.append(contentsOf: record.json)
            body.append(UInt8(ascii: "\n"))
        }
        var request = URLRequest(url: server.appendingPathComponent("v1/events"), timeoutInterval: configuration.requestTimeout)
        request.httpMethod = "POST"
        request.setValue("Bearer \(appKey)", forHTTPHeaderField: "Authorization")
        request.setValue("application/x-ndjson", forHTTPHeaderField: "Content-Type")
        request.setValue("AdTallyKit/1", forHTTPHeaderField: "User-Agent")
        if let compressed = Gzip.compress(body) {
            request.setValue("gzip", forHTTPHeaderField: "Content-Encoding")
            request.httpBody = Data(compressed)
        } else {
            request.httpBody = Data(body)
        }
        let data: Data
        let response: URLResponse
        do {
            (data, response) = try await session.adTallyData(for: request)
        } catch {
            return .failed("cannot reach \(server.absoluteString): \(error.localizedDescription)")
        }
        guard let http = response as? HTTPURLResponse else { return .failed("not an HTTP answer") }
        let detail = Self.detail(data, status: http.statusCode)
        switch http.statusCode {
        case 200:
            guard let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any],
                  let rejected = object["rejected"] as? [[String: Any]], object["accepted"] is NSNumber else {
                // A 200 that does not name the events is not an answer: send them again.
                return .failed("a 200 without a receipt")
            }
            return .delivered(rejected: rejected.compactMap { entry in
                guard let index = (entry["index"] as? NSNumber)?.intValue else { return nil }
                return (index, (entry["error"] as? String) ?? "rejected")
            })
        case 400, 413:
            return .split("\(http.statusCode): \(detail)")
        case 401, 403:
            return .stopped(http.statusCode, detail)
        case 429, 503:
            let seconds = Self.retryAfter(http.value(forHTTPHeaderField: "Retry-After")) ?? configuration.retryBase
            return .retryAfter(seconds, "\(http.statusCode): \(detail)")
        default:
            return .failed("\(http.statusCode): \(detail)")
        }
    }

    /// Sends the counts of dropped events (`POST /v1/client-drops`), each report once by its id.
    private func sendDropReports() async {
        let (reports, stopped) = lock.locked { (dropReports.seal(), stoppedBy != nil) }
        guard !stopped else { return }
        for report in reports {
            var request = URLRequest(url: server.appendingPathComponent("v1/client-drops"), timeoutInterval: configuration.requestTimeout)
            request.httpMethod = "POST"
            request.setValue("Bearer \(appKey)", forHTTPHeaderField: "Authorization")
            request.setValue("application/json", forHTTPHeaderField: "Content-Type")
            request.httpBody = Data(#"{"id":"\#(report.id.uuidString.lowercased())","reason":"\#(report.reason)","dropped":\#(report.count)}"#.utf8)
            guard let (_, response) = try? await session.adTallyData(for: request), let http = response as? HTTPURLResponse else { return }
            // 400 or 404: a report this server cannot take will never be taken; it is not resent.
            let done = [200, 400, 404].contains(http.statusCode)
            if done { lock.locked { dropReports.remove(report.id) } }
            if !done { return }
        }
    }

    static func detail(_ data: Data, status: Int) -> String {
        if let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any], let detail = object["detail"] as? String { return detail }
        return HTTPURLResponse.localizedString(forStatusCode: status)
    }

    /// `Retry-After` as seconds or an HTTP date.
    static func retryAfter(_ value: String?) -> TimeInterval? {
        guard let value = value?.trimmingCharacters(in: .whitespaces), !value.isEmpty else { return nil }
        if let seconds = Double(value), seconds >= 0 { return min(seconds, 3600) }
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss zzz"
        guard let date = formatter.date(from: value) else { return nil }
        return min(max(0, date.timeIntervalSinceNow), 3600)
    }

    static func id(of json: [UInt8]) -> UUID? {
        // Every record starts with {"id":"<36 characters>".
        guard json.count > 43 else { return nil }
        return UUID(uuidString: String(decoding: json[7..<43], as: UTF8.self))
    }

    // MARK: - Install facts

    static func deviceID(in directory: URL) throws -> String {
        let file = directory.appendingPathComponent("device-id")
        if let text = try? String(contentsOf: file, encoding: .utf8), let id = UUID(uuidString: text.trimmingCharacters(in: .whitespacesAndNewlines)) {
            return id.uuidString.lowercased()
        }
        let id = UUID().uuidString.lowercased()
        do {
            try Data((id + "\n").utf8).write(to: file, options: .atomic)
        } catch {
            throw AdTallyError.storage("cannot write \(file.path): \(error.localizedDescription)")
        }
        return id
    }

    static func commonFields(_ configuration: AdTallyConfiguration, device: String) throws -> [UInt8] {
        var json = EventJSON(id: UUID(), type: "", occurredAtMillis: 0)
        let start = json.bytes.count
        let country = configuration.country ?? Self.localeCountry()
        if let country {
            guard country.utf8.count == 2, country.utf8.allSatisfy({ (0x41...0x5A).contains($0) }) else {
                throw AdTallyError.misuse("country \"\(country)\" must be an ISO 3166-1 alpha-2 code in capitals")
            }
        }
        json.add("country", country)
        let platform = configuration.platform ?? Self.systemPlatform
        guard ["ios", "ipados", "android", "other"].contains(platform) else { throw AdTallyError.misuse("platform must be ios, ipados, android or other") }
        json.add("platform", platform)
        let os = configuration.osVersion ?? Self.systemVersion
        try EventRules.checkVersion(os, "osVersion")
        json.add("os_version", os)
        if let version = configuration.appVersion ?? (Bundle.main.object(forInfoDictionaryKey: "CFBundleShortVersionString") as? String) {
            try EventRules.checkVersion(version, "appVersion")
            json.add("app_version", version)
        }
        json.add("device", device)
        return Array(json.finish()[start...])
    }

    static func localeCountry() -> String? {
        let code: String?
        if #available(iOS 16, macOS 13, tvOS 16, *) {
            code = Locale.current.region?.identifier
        } else {
            code = Locale.current.regionCode
        }
        guard let code, code.utf8.count == 2, code.utf8.allSatisfy({ (0x41...0x5A).contains($0) }) else { return nil }
        return code
    }

    static var systemPlatform: String {
        #if os(iOS)
        return UIDevice.current.userInterfaceIdiom == .pad ? "ipados" : "ios"
        #else
        return "other"
        #endif
    }

    static var systemVersion: String {
        let version = ProcessInfo.processInfo.operatingSystemVersion
        return "\(version.majorVersion).\(version.minorVersion).\(version.patchVersion)"
    }
}

extension NSLock {
    /// `body` under the lock (callable from async code, unlike `lock()`).
    func locked<T>(_ body: () throws -> T) rethrows -> T {
        lock()
        defer { unlock() }
        return try body()
    }
}

private func Glibc_open(_ path: String) -> Int32 {
    open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
}

/// Wakes the sender early (a count reached, a flush, the background).
final class Wakeup: @unchecked Sendable {
    private let lock = NSLock()
    private var pending = false
    private var sleeper: Task<Void, Never>?

    func signal() {
        lock.lock()
        pending = true
        sleeper?.cancel()
        lock.unlock()
    }

    /// Sleeps `seconds` unless signalled (a signal before the call ends it at once).
    func sleep(_ seconds: TimeInterval) async {
        let task: Task<Void, Never>? = lock.locked {
            if pending {
                pending = false
                return nil
            }
            let task = Task { () -> Void in _ = try? await Task.sleep(nanoseconds: UInt64(max(0, min(seconds, 86_400)) * 1e9)) }
            sleeper = task
            return task
        }
        guard let task else { return }
        await withTaskCancellationHandler { await task.value } onCancel: { task.cancel() }
        lock.locked { sleeper = nil }
    }
}

/// Events the server refused for good, one JSON line each with its reason; never resent.
enum DeadLetter {
    static let maxBytes = 1 << 20

    static func append(_ json: [UInt8], reason: String, in directory: URL) {
        let file = directory.appendingPathComponent("dead-letter.ndjson")
        // Bounded: past 1 MiB the file moves to dead-letter.1.ndjson (replacing the older one).
        if let size = (try? FileManager.default.attributesOfItem(atPath: file.path)[.size] as? NSNumber)?.intValue, size > maxBytes {
            let old = directory.appendingPathComponent("dead-letter.1.ndjson")
            _ = rename(file.path, old.path)
        }
        var line: [UInt8] = Array(#"{"error":"#.utf8)
        EventJSON.appendString(reason, to: &line)
        line.append(contentsOf: #","event":"#.utf8)
        line.append(contentsOf: json)
        line.append(contentsOf: "}\n".utf8)
        let fd = open(file.path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return }
        _ = line.withUnsafeBytes { write(fd, $0.baseAddress!, $0.count) }
        close(fd)
    }
}

/// Counts of dropped events waiting to be told to the server, each report with an id
/// made once so that a retried report counts once. Kept in `drops.json`.
struct DropReports {
    struct Report: Codable {
        var id: UUID
        var reason: String
        var count: Int
        /// Sent at least once: its count is frozen, later drops open a new report.
        var sealed: Bool
    }

    let file: URL
    private var reports: [Report]

    init(file: URL) {
        self.file = file
        reports = (try? JSONDecoder().decode([Report].self, from: Data(contentsOf: file))) ?? []
    }

    var hasUnsent: Bool { !reports.isEmpty }

    mutating func add(_ count: Int, _ reason: DropReason) {
        if let index = reports.firstIndex(where: { !$0.sealed && $0.reason == reason.rawValue }) {
            reports[index].count += count
        } else {
            reports.append(Report(id: UUID(), reason: reason.rawValue, count: count, sealed: false))
        }
        save()
    }

    /// Every report, sealed for sending.
    mutating func seal() -> [Report] {
        guard reports.contains(where: { !$0.sealed }) else { return reports }
        for index in reports.indices { reports[index].sealed = true }
        save()
        return reports
    }

    mutating func remove(_ id: UUID) {
        reports.removeAll { $0.id == id }
        save()
    }

    private func save() {
        if reports.isEmpty {
            try? FileManager.default.removeItem(at: file)
        } else if let data = try? JSONEncoder().encode(reports) {
            try? data.write(to: file, options: .atomic)
        }
    }
}
