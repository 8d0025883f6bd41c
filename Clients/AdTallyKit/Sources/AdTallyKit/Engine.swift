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
/// sender, the switch. One lock guards the queue and the counters; no file is read
/// or fsynced under it but in `record` itself (and its fsync with `syncEveryRecord`).
final class Engine: @unchecked Sendable {
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
    private var syncer: Task<Void, Never>?
    private let wakeup = Wakeup()
    private var isClosed = false
    /// Notices and the flushes they precede are delivered in order, off the caller's thread.
    private let notices = DispatchQueue(label: "adtally.notices")

    // Sending state (under `lock`).
    private var server: URL
    private var appKey: String
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
    /// (on Linux, libcurl's: a probe went from 24 to 29.6 MiB creating one, and one per
    /// engine put make bench-client's peak at 41.2 MiB against 37.6 with this), and its
    /// connections are shared. Each request carries its engine's timeout; closing an engine cancels its own.
    static let sharedSession: URLSession = {
        let configuration = URLSessionConfiguration.ephemeral
        configuration.httpMaximumConnectionsPerHost = 2
        configuration.urlCache = nil
        return URLSession(configuration: configuration)
    }()

    // MARK: - Opening: one engine per folder per process

    /// The engines open in this process, by folder.
    private final class Registry: @unchecked Sendable {
        let lock = NSLock()
        var engines: [String: Engine] = [:]
    }

    private static let registry = Registry()

    static func open(server: URL, appKey: String, directory: URL, configuration: AdTallyConfiguration) throws -> Engine {
        let path = directory.standardizedFileURL.resolvingSymlinksInPath().path
        return try registry.lock.locked {
            if let engine = registry.engines[path] {
                engine.adopt(server: server, appKey: appKey)
                return engine
            }
            let engine = try Engine(server: server, appKey: appKey, directory: directory, configuration: configuration)
            registry.engines[path] = engine
            engine.start()
            return engine
        }
    }

    /// Another `AdTally` on this folder: it shares the engine; a new key or server it
    /// names is used from now on (a key rotated after a refusal sends again).
    private func adopt(server: URL, appKey: String) {
        let changed = lock.locked { () -> Bool in
            users += 1
            guard server != self.server || appKey != self.appKey else { return false }
            self.server = server
            self.appKey = appKey
            stoppedBy = nil
            failures = 0
            notBefore = .distantPast
            return true
        }
        if changed {
            switchboard.update(server: server, appKey: appKey)
            wakeup.signal()
        }
    }

    private init(server: URL, appKey: String, directory: URL, configuration: AdTallyConfiguration) throws {
        guard configuration.maxQueueBytes >= 2 * configuration.segmentBytes, configuration.segmentBytes >= 4096 else {
            throw AdTallyError.misuse("maxQueueBytes must be at least two segments (segmentBytes ≥ 4096)")
        }
        guard configuration.batchBytes >= EventQueue.maxRecordBytes, configuration.batchSize >= 1 else {
            throw AdTallyError.misuse("batchBytes must be at least \(EventQueue.maxRecordBytes) and batchSize at least 1")
        }
        self.server = server
        self.appKey = appKey
        self.directory = directory
        self.configuration = configuration
        batchLimit = max(1, min(configuration.batchSize, 1000))
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let device = try Self.deviceID(in: directory)
        deviceID = device
        // Checked before the folder is locked: a bad setting leaves nothing held.
        commonFields = try Self.commonFields(configuration, device: device)
        lockFD = openLockFile(directory.appendingPathComponent("queue.lock").path)
        guard lockFD >= 0 else { throw AdTallyError.storage("cannot open \(directory.path)/queue.lock") }
        guard flock(lockFD, LOCK_EX | LOCK_NB) == 0 else {
            close(lockFD)
            throw AdTallyError.directoryInUse(directory.path)
        }
        do {
            queue = try EventQueue(folder: directory.appendingPathComponent("queue"), segmentBytes: configuration.segmentBytes)
        } catch {
            close(lockFD)
            throw error
        }
        dropReports = DropReports(file: directory.appendingPathComponent("drops.json"))
        session = Self.sharedSession
        switchboard = Switchboard(server: server, appKey: appKey, file: directory.appendingPathComponent("switch.json"), configuration: configuration, session: session)
        if queue.damagedOnOpen > 0 {
            // Counted on disk first, then marked as counted: a kill between the two counts it again, never never.
            let damaged = queue.damagedOnOpen
            if dropReports.add(damaged, .damaged) { queue.commitDamage() } else { dropReports.add(-damaged, .damaged) }
            counters.dropped[.damaged] = damaged
            deliver([.dropped(count: damaged, reason: .damaged)])
        } else {
            queue.commitDamage()
        }
    }

    private func start() {
        sender = Task.detached(priority: .utility) { [self] in await self.sendLoop() }
        if case .syncEvery(let interval) = configuration.durability {
            syncer = Task.detached(priority: .utility) { [self] in
                while !Task.isCancelled {
                    try? await Task.sleep(nanoseconds: UInt64(min(3600, max(0.01, interval)) * 1e9))
                    syncIfDirty()
                }
            }
        }
        switchboard.refreshAll()
        #if canImport(UIKit) && !os(watchOS)
        NotificationCenter.default.addObserver(forName: UIApplication.didEnterBackgroundNotification, object: nil, queue: nil) { [weak self] _ in
            self?.enteredBackground()
        }
        #endif
    }

    /// One `AdTally` of this engine went away; the last one closes it. A batch in
    /// flight then changes nothing: its events stay queued, and a later instance sends
    /// them again under the same ids.
    func release() {
        // All under the registry's lock: an instance opened meanwhile on this folder waits
        // for the folder's lock to be free rather than finding it held (directoryInUse).
        Self.registry.lock.locked {
            let pending = lock.locked { () -> [CheckedContinuation<Void, any Error>]? in
                users -= 1
                guard users == 0 else { return nil }
                isClosed = true
                queue.sync()
                defer { waiters = [] }
                return waiters.map(\.continuation)
            }
            guard let pending else { return }
            Self.registry.engines = Self.registry.engines.filter { $0.value !== self }
            deliver([], then: pending, error: AdTallyError.closed)
            sender?.cancel()
            syncer?.cancel()
            wakeup.signal()
            // The sender may finish a request after this; closed, it changes no file.
            flock(lockFD, LOCK_UN)
            close(lockFD)
        }
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
        // Enqueued under the lock: the notice goes before any flush the sender answers next.
        if dropped > 0 { deliver([.dropped(count: dropped, reason: .queueFull)]) }
        let due = queue.pendingCount >= configuration.sendAfterEvents
        lock.unlock()
        if due { wakeup.signal() }
        return id
    }

    /// Drops the oldest segments while the queue is over its byte bound (under `lock`,
    /// no batch in flight). Each drop is counted on disk (drops.json) before the head
    /// passes the events, so a kill between the two over-counts at worst, never hides.
    private func enforceBound() -> Int {
        var dropped = 0
        while queue.pendingBytes > configuration.maxQueueBytes, queue.head.segment < queue.tail.segment {
            let count = queue.headSegmentCount
            // Nothing is dropped that could not be counted on disk first (a full disk: the
            // queue stays over its bound until a write succeeds again).
            if count > 0, !dropReports.add(count, .queueFull) {
                dropReports.add(-count, .queueFull)
                break
            }
            guard (try? queue.dropOldestSegment()) != nil else {
                // The head could not be written: nothing left, so the count is taken back.
                if count > 0 { dropReports.add(-count, .queueFull) }
                break
            }
            counters.dropped[.queueFull, default: 0] += count
            dropped += count
        }
        return dropped
    }

    /// fsync of what was written since the last, outside the lock (the syncer, every interval).
    private func syncIfDirty() {
        guard let fd = lock.locked({ queue.takeSyncHandle() }) else { return }
        EventQueue.sync(fd)
        close(fd)
    }

    func reportMisuse(_ error: AdTallyError) {
        configuration.misuseHandler?(error)
    }

    /// Gives notices to the app in order, on the notices queue, then resumes `then`.
    private func deliver(_ list: [AdTallyNotice], then continuations: [CheckedContinuation<Void, any Error>] = [], error: (any Error)? = nil) {
        guard !list.isEmpty || !continuations.isEmpty else { return }
        let handler = configuration.notices
        notices.async {
            if let handler { for notice in list { handler(notice) } }
            for continuation in continuations {
                if let error { continuation.resume(throwing: error) } else { continuation.resume() }
            }
        }
    }

    var status: AdTallyStatus {
        let switchCounts = switchboard.counts
        return lock.locked {
            var status = counters
            status.pending = queue.pendingCount
            status.pendingBytes = queue.pendingBytes
            status.stoppedBy = stoppedBy?.status
            status.switchFetches = switchCounts.fetches
            status.switchNotModified = switchCounts.notModified
            return status
        }
    }

    // MARK: - Flushing

    func flush() async throws {
        let id = UUID()
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                lock.lock()
                // Answered at once through the notices queue too, after the notices before it.
                if let stopped = stoppedBy {
                    deliver([], then: [continuation], error: AdTallyError.sendingStopped(status: stopped.status, detail: stopped.detail))
                    lock.unlock()
                    return
                }
                if isClosed {
                    deliver([], then: [continuation], error: AdTallyError.closed)
                    lock.unlock()
                    return
                }
                if queue.head >= queue.tail {
                    deliver([], then: [continuation])
                    lock.unlock()
                    return
                }
                if Task.isCancelled {
                    // Cancelled before the waiter was added: the handler found nothing to cancel.
                    deliver([], then: [continuation], error: CancellationError())
                    lock.unlock()
                    return
                }
                waiters.append((queue.tail, id, continuation))
                flushRequested = true
                lock.unlock()
                wakeup.signal()
            }
        } onCancel: {
            let waiter = lock.locked { () -> CheckedContinuation<Void, any Error>? in
                guard let index = waiters.firstIndex(where: { $0.id == id }) else { return nil }
                return waiters.remove(at: index).continuation
            }
            waiter?.resume(throwing: CancellationError())
        }
    }

    /// The waiters whose events have all been answered (under `lock`), removed. Drop
    /// reports are not waited for: they are sent as soon as the server takes them.
    private func answeredWaiters() -> [CheckedContinuation<Void, any Error>] {
        let head = queue.head
        let done = waiters.filter { $0.target <= head }
        waiters.removeAll { $0.target <= head }
        return done.map(\.continuation)
    }

    func enteredBackground() {
        lock.locked { flushRequested = true }
        syncIfDirty()
        wakeup.signal()
    }

    func resumeSending() {
        lock.locked {
            stoppedBy = nil
            failures = 0
            notBefore = .distantPast
        }
        wakeup.signal()
    }

    // MARK: - Sending

    private enum Next {
        case wait(TimeInterval)
        case send
        case stop
    }

    private func nextStep() -> Next {
        lock.locked {
            if isClosed { return .stop }
            if stoppedBy != nil { return .wait(3600) }
            let hasWork = queue.head < queue.tail || dropReports.hasUnsent
            guard hasWork else {
                flushRequested = false
                return .wait(configuration.sendInterval)
            }
            let now = Date()
            if now < notBefore { return .wait(notBefore.timeIntervalSince(now)) }
            if flushRequested || queue.pendingCount >= configuration.sendAfterEvents || failures > 0 { return .send }
            let due = lastSend.addingTimeInterval(configuration.sendInterval)
            return now >= due ? .send : .wait(due.timeIntervalSince(now))
        }
    }

    private func sendLoop() async {
        while !Task.isCancelled {
            switch nextStep() {
            case .stop: return
            case .wait(let seconds):
                await wakeup.sleep(seconds)
            case .send:
                await sendBatch()
                // Flushes whose events are answered return now, whatever the drop reports meet.
                let ready = lock.locked { () -> [CheckedContinuation<Void, any Error>] in
                    let ready = answeredWaiters()
                    if queue.head >= queue.tail { flushRequested = false }
                    return ready
                }
                deliver([], then: ready)
                if lock.locked({ Date() >= notBefore && stoppedBy == nil }) { await sendDropReports() }
            }
        }
    }

    /// The batch to send from the head, read outside the lock (no advance or drop runs
    /// while it is in flight); nil when there is none.
    private func takeBatch() -> (records: [QueuedRecord], server: URL, key: String)? {
        guard let (plan, server, key) = lock.locked({ () -> (EventQueue.ReadPlan, URL, String)? in
            guard queue.head < queue.tail, !inFlight, !isClosed else { return nil }
            inFlight = true
            lastSend = Date()
            return (queue.readPlan(), self.server, appKey)
        }) else { return nil }
        syncIfDirty()
        let records: [QueuedRecord]
        do {
            records = try EventQueue.records(in: plan, limit: lock.locked { batchLimit }, maxBytes: configuration.batchBytes)
        } catch {
            lock.locked {
                inFlight = false
                backOffLocked()
            }
            deliver([.sendFailed("cannot read the queue: \(error)")])
            return nil
        }
        guard !records.isEmpty else {
            // Every stretch between head and tail was read, and none holds a whole record:
            // damage only (counted when the queue was opened). Pass it.
            lock.locked {
                inFlight = false
                guard !isClosed else { return }
                if (try? queue.advance(to: plan.tail, records: 0)) == nil { backOffLocked() }
            }
            return nil
        }
        return (records, server, key)
    }

    private func sendBatch() async {
        guard let (records, server, key) = takeBatch(), let last = records.last else { return }
        let oldest = Int64((Date().timeIntervalSince1970 - min(configuration.maxEventAge, 100 * 365 * 86_400)) * 1000)
        let fresh = records.filter { $0.occurredAtMillis >= oldest }
        var outcome = Outcome.delivered(rejected: [])
        if !fresh.isEmpty {
            outcome = await post(fresh, to: server, key: key)
        }
        let (list, refused, stopped) = lock.locked { () -> ([AdTallyNotice], [CheckedContinuation<Void, any Error>], (status: Int, detail: String)?) in
            let list = finishBatch(records, fresh: fresh, last: last, outcome: outcome)
            // A refused key fails the flushes waiting, after the app was told.
            guard let stopped = stoppedBy else { return (list, [], nil) }
            defer { waiters = [] }
            return (list, waiters.map(\.continuation), stopped)
        }
        deliver(list, then: refused, error: stopped.map { AdTallyError.sendingStopped(status: $0.status, detail: $0.detail) })
    }

    /// Applies the server's answer to a batch (under `lock`): the queue's head, the
    /// dead letters, the retry timing; returns the notices to give. Nothing changes once
    /// the engine is closed (the events stay queued for the next instance).
    private func finishBatch(_ records: [QueuedRecord], fresh: [QueuedRecord], last: QueuedRecord, outcome: Outcome) -> [AdTallyNotice] {
        inFlight = false
        guard !isClosed else { return [] }
        var notices: [AdTallyNotice] = []
        let expired = records.count - fresh.count
        counters.requests += fresh.isEmpty ? 0 : 1
        /// The batch leaves the queue: expired events counted (on disk first), then the head
        /// moves. False when the head could not be written (a full disk): the batch stays,
        /// uncounted, to be sent again (the server counts it once) after a backoff.
        func finish() -> Bool {
            if expired > 0, !dropReports.add(expired, .expired) {
                dropReports.add(-expired, .expired)
                backOffLocked()
                notices.append(.sendFailed("cannot write drops.json"))
                return false
            }
            guard (try? queue.advance(to: last.end, records: records.count)) != nil else {
                if expired > 0 { dropReports.add(-expired, .expired) }
                backOffLocked()
                notices.append(.sendFailed("cannot write the queue's head"))
                return false
            }
            if expired > 0 {
                counters.dropped[.expired, default: 0] += expired
                notices.append(.dropped(count: expired, reason: .expired))
            }
            return true
        }
        switch outcome {
        case .delivered(let rejected):
            guard finish() else { break }
            counters.delivered += fresh.count - rejected.count
            counters.deadLettered += rejected.count
            for (index, reason) in rejected where index < fresh.count {
                DeadLetter.append(fresh[index].json, reason: reason, in: directory)
                if let id = Self.id(of: fresh[index].json) { notices.append(.rejected(id: id, reason: reason)) }
            }
            if !fresh.isEmpty {
                failures = 0
                notBefore = .distantPast
                batchLimit = min(max(1, min(configuration.batchSize, 1000)), batchLimit * 2)
            }
        case .split(let detail):
            counters.splits += 1
            if fresh.count == 1 {
                // One event the server cannot take at all: it leaves with the reason.
                if finish() {
                    DeadLetter.append(fresh[0].json, reason: detail, in: directory)
                    counters.deadLettered += 1
                    if let id = Self.id(of: fresh[0].json) { notices.append(.rejected(id: id, reason: detail)) }
                }
            } else {
                batchLimit = max(1, fresh.count / 2)
            }
        case .stopped(let status, let detail):
            stoppedBy = (status, detail)
            notices.append(.sendingStopped(status: status, detail: detail))
        case .retryAfter(let seconds, let detail):
            counters.throttled += 1
            if let seconds {
                // As long as the server asked, and a little more, at random, so that the
                // devices it turned away do not all come back in the same second.
                failures += 1
                notBefore = Date().addingTimeInterval(seconds + Double.random(in: 0...max(0.05, seconds * 0.1)))
            } else {
                backOffLocked()
            }
            notices.append(.sendFailed(detail))
        case .failed(let detail):
            backOffLocked()
            notices.append(.sendFailed(detail))
        }
        let dropped = enforceBound()
        if dropped > 0 { notices.append(.dropped(count: dropped, reason: .queueFull)) }
        return notices
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
        case retryAfter(TimeInterval?, String)
        case failed(String)
    }

    private func post(_ records: [QueuedRecord], to server: URL, key: String) async -> Outcome {
        var body: [UInt8] = []
        body.reserveCapacity(records.reduce(0) { $0 + $1.json.count + 1 })
        for record in records {
            body.append(contentsOf: record.json)
            body.append(UInt8(ascii: "\n"))
        }
        var request = URLRequest(url: server.appendingPathComponent("v1/events"), timeoutInterval: configuration.requestTimeout)
        request.httpMethod = "POST"
        request.setValue("Bearer \(key)", forHTTPHeaderField: "Authorization")
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
        // AdTally's own errors are problem+json; a proxy's 400 or 413 is not about the events.
        let isProblem = (http.value(forHTTPHeaderField: "Content-Type") ?? "").hasPrefix("application/problem+json")
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
        case 413:
            return .split("413: \(detail)")
        case 400 where isProblem:
            return .split("400: \(detail)")
        case 401, 403:
            return .stopped(http.statusCode, detail)
        case 429, 503:
            return .retryAfter(Self.retryAfter(http.value(forHTTPHeaderField: "Retry-After")), "\(http.statusCode): \(detail)")
        default:
            return .failed("\(http.statusCode): \(detail)")
        }
    }

    /// Sends the counts of dropped events (`POST /v1/client-drops`), each report once by
    /// its id; a failure backs off like a batch's.
    private func sendDropReports() async {
        guard let (reports, server, key) = lock.locked({ () -> ([DropReports.Report], URL, String)? in
            isClosed ? nil : (dropReports.seal(), self.server, appKey)
        }) else { return }
        for report in reports {
            var request = URLRequest(url: server.appendingPathComponent("v1/client-drops"), timeoutInterval: configuration.requestTimeout)
            request.httpMethod = "POST"
            request.setValue("Bearer \(key)", forHTTPHeaderField: "Authorization")
            request.setValue("application/json", forHTTPHeaderField: "Content-Type")
            request.httpBody = Data(#"{"id":"\#(report.id.uuidString.lowercased())","reason":"\#(report.reason)","dropped":\#(report.count)}"#.utf8)
            let answer = try? await session.adTallyData(for: request)
            let http = answer?.1 as? HTTPURLResponse
            let status = http?.statusCode
            let done = lock.locked { () -> Bool in
                guard !isClosed else { return false }
                lastSend = Date()
                switch status {
                case 200, 400, 404:
                    // 400 or 404: a report this server cannot take will never be taken; not resent.
                    dropReports.remove(report.id)
                    return true
                case 401, 403:
                    // The key is refused here as for a batch: the app is told, flushes waiting fail.
                    let detail = answer.map { Self.detail($0.0, status: status ?? 401) } ?? "the key was refused"
                    stoppedBy = (status ?? 401, detail)
                    let waiting = waiters.map(\.continuation)
                    waiters = []
                    deliver([.sendingStopped(status: status ?? 401, detail: detail)], then: waiting,
                            error: AdTallyError.sendingStopped(status: status ?? 401, detail: detail))
                    return false
                case 429, 503:
                    if let seconds = Self.retryAfter(http?.value(forHTTPHeaderField: "Retry-After")) {
                        failures += 1
                        notBefore = Date().addingTimeInterval(seconds + Double.random(in: 0...max(0.05, seconds * 0.1)))
                    } else {
                        backOffLocked()
                    }
                    return false
                default:
                    backOffLocked()
                    return false
                }
            }
            guard done else { return }
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
        if let country, !Countries.codes.contains(country) {
            throw AdTallyError.misuse("country \"\(country)\" must be an ISO 3166-1 alpha-2 code in capitals (ZZ for unknown)")
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
        // A region that is no ISO country (IC, EA, DG, a number) is left out: the server counts ZZ.
        guard let code, Countries.codes.contains(code) else { return nil }
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

/// The folder's lock file, opened (`open(2)`: Engine has a static `open` of its own).
private func openLockFile(_ path: String) -> Int32 {
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

    /// Adds `count` (negative: takes it back) to the open report of `reason`; true when
    /// drops.json was written.
    @discardableResult
    mutating func add(_ count: Int, _ reason: DropReason) -> Bool {
        if let index = reports.firstIndex(where: { !$0.sealed && $0.reason == reason.rawValue }) {
            reports[index].count += count
            if reports[index].count <= 0 { reports.remove(at: index) }
        } else if count > 0 {
            reports.append(Report(id: UUID(), reason: reason.rawValue, count: count, sealed: false))
        }
        return save()
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

    @discardableResult
    private func save() -> Bool {
        if reports.isEmpty {
            try? FileManager.default.removeItem(at: file)
            return true
        }
        guard let data = try? JSONEncoder().encode(reports) else { return false }
        return (try? data.write(to: file, options: .atomic)) != nil
    }
}
