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
/// sender (Sending.swift), the switch. One lock guards the queue and the counters; no
/// file is read under it but in `record` itself, and nothing is ever fsynced under it
/// (a sync's work is taken under the lock and done outside it).
final class Engine: @unchecked Sendable {
    let directory: URL
    let configuration: AdTallyConfiguration
    /// The per-install id (under `lock`: `forgetInstall()` starts a new one).
    var currentDeviceID: String
    /// The fields every event carries, as JSON text after the event's own (`,"country":…`),
    /// the device id last (under `lock`).
    var commonFields: [UInt8]
    let switchboard: Switchboard
    /// Consent (Consent.swift, under `lock`): opted out, nothing is recorded or sent.
    var isOptedOut: Bool
    /// Ids of installs forgotten whose erasure the server has not answered yet (a lock of
    /// its own: its file is synced, never under `lock`).
    let forgets: PendingForgets
    /// The erasure requests' own backoff (under `lock`): a request that keeps failing must
    /// not hold back the events.
    var forgetFailures = 0
    var forgetNotBefore = Date.distantPast
    /// One consent change at a time (`optOut`, `optIn`, `forgetInstall`): each writes a file
    /// and then the state under `lock`, in the same order.
    let consentLock = NSLock()
    /// A consent drop while a batch was out: the reason its events were counted under, taken
    /// back if the server stored them after all (`finishBatch`).
    var inFlightDropReason: DropReason?

    let lock = NSLock()
    let queue: EventQueue
    private let lockFD: Int32
    private var users = 1
    private var sender: Task<Void, Never>?
    private var syncer: Task<Void, Never>?
    let wakeup = Wakeup()
    var isClosed = false
    /// Notices and the flushes they precede are delivered in order, off the caller's thread.
    private let notices = DispatchQueue(label: "adtally.notices")

    // Sending state (under `lock`).
    var server: URL
    var appKey: String
    var inFlight = false
    var failures = 0
    var notBefore = Date.distantPast
    var batchLimit: Int
    var flushRequested = false
    /// Every queued record that ends at or before this position was posted by this
    /// process, or was queued when it started (an earlier one may have posted it): a
    /// batch wholly after it is sent for the first time (`AdTally-Attempt: 1`).
    var postedThrough = QueuePosition(segment: 0, offset: 0)
    var lastSend = Date()
    var stoppedBy: (status: Int, detail: String)?
    var waiters: [(target: QueuePosition, id: UUID, continuation: CheckedContinuation<Void, any Error>)] = []
    var counters = AdTallyStatus()
    var dropReports: DropReports
    /// Every request goes through it: capped answers, total deadlines, no redirects
    /// (one URLSession for every engine of the process; see `Transport`).
    let transport = Transport.shared

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
        try QueueDamage.ensureDirectory(directory)
        let device = try Self.deviceID(in: directory)
        currentDeviceID = device
        // Checked before the folder is locked: a bad setting leaves nothing held.
        commonFields = try Self.commonFields(configuration, device: device)
        isOptedOut = Consent.isOptedOut(in: directory)
        forgets = PendingForgets(file: directory.appendingPathComponent("forget.json"))
        QueueDamage.clearForFile(directory.appendingPathComponent("queue.lock").path)
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
        postedThrough = queue.tail
        QueueDamage.clearForFile(directory.appendingPathComponent("drops.json").path)
        QueueDamage.clearForFile(directory.appendingPathComponent("switch.json").path)
        QueueDamage.clearForFile(directory.appendingPathComponent("dead-letter.ndjson").path)
        dropReports = DropReports(file: directory.appendingPathComponent("drops.json"))
        switchboard = Switchboard(server: server, appKey: appKey, file: directory.appendingPathComponent("switch.json"), configuration: configuration, transport: transport)
        if queue.damagedOnOpen > 0 {
            counters.dropped[.damaged] = queue.damagedOnOpen
            deliver([.dropped(count: queue.damagedOnOpen, reason: .damaged)])
            commitDamageIfCounted()
        } else {
            queue.commitDamage()
        }
        // A forget that a kill interrupted (its id recorded, the queue or the new id not yet):
        // finished now, before anything of the old id can be sent.
        if forgets.ids.contains(device) {
            do {
                try finishForgetAtOpen()
            } catch {
                flock(lockFD, LOCK_UN)
                close(lockFD)
                throw error
            }
        }
    }

    private func start() {
        // The switch sends the per-install id (not after an opt-out): an experiment answers its arm.
        switchboard.deviceID = { [weak self] in
            guard let self else { return nil }
            return self.lock.locked { self.isOptedOut ? nil : self.currentDeviceID }
        }
        switchboard.keepOnly(device: lock.locked { currentDeviceID })
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
            let closing = lock.locked { () -> (continuations: [CheckedContinuation<Void, any Error>], sync: EventQueue.SyncWork)? in
                users -= 1
                guard users == 0 else { return nil }
                isClosed = true
                queue.writeLedger()
                defer { waiters = [] }
                return (waiters.map(\.continuation), queue.takeSync())
            }
            guard let (pending, sync) = closing else { return }
            sync.run()
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

        lock.lock()
        guard !isClosed else {
            lock.unlock()
            throw AdTallyError.closed
        }
        // Opted out: nothing is written, nothing will be sent (the id is the caller's only).
        if isOptedOut {
            lock.unlock()
            return id
        }
        bytes.append(contentsOf: commonFields)
        do {
            try queue.append(json: bytes, occurredAtMillis: millis)
        } catch {
            lock.unlock()
            throw error
        }
        // The bound holds while a batch is out too (a stalled link must not grow the queue).
        let dropped = enforceBound()
        // Enqueued under the lock: the notice goes before any flush the sender answers next.
        if dropped > 0 { deliver([.dropped(count: dropped, reason: .queueFull)]) }
        let due = queue.pendingCount >= configuration.sendAfterEvents
        let sync = configuration.durability == .syncEveryRecord ? queue.takeSync() : nil
        lock.unlock()
        // An fsync per record, as asked, but outside the lock: other threads keep recording.
        sync?.run()
        if due { wakeup.signal() }
        return id
    }

    /// Drops the oldest segments while the queue is over its byte bound (under `lock`).
    /// Each drop is counted on disk (drops.json) before the head passes the events, so a
    /// kill between the two over-counts at worst, never hides. A batch in flight whose
    /// segments go is finished for what is left of it (`finishBatch`).
    func enforceBound() -> Int {
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

    /// fsync of what was written since the last, outside the lock (the syncer, every
    /// interval, and before a send); the ledger of counts with it.
    func syncIfDirty() {
        let work = lock.locked { () -> EventQueue.SyncWork in
            if !isClosed {
                commitDamageIfCounted()
                queue.writeLedger()
            }
            return queue.takeSync()
        }
        work.run()
    }

    /// Counts the damage found on open in drops.json, then lets the queue write what passes
    /// it (under `lock`, or in init). Counted on disk first, then marked as counted: a kill
    /// between the two counts it again, never never. While drops.json cannot be written
    /// (a full disk), tried again at every sync; the head does not move meanwhile.
    func commitDamageIfCounted() {
        guard !queue.isDamageCommitted else { return }
        let damaged = queue.damagedOnOpen
        if dropReports.add(damaged, .damaged) { queue.commitDamage() } else { dropReports.add(-damaged, .damaged) }
    }

    func reportMisuse(_ error: AdTallyError) {
        configuration.misuseHandler?(error)
    }

    /// Gives notices to the app in order, on the notices queue, then resumes `then`.
    func deliver(_ list: [AdTallyNotice], then continuations: [CheckedContinuation<Void, any Error>] = [], error: (any Error)? = nil) {
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
            status.isOptedOut = isOptedOut
            status.forgetsPending = forgets.ids.filter { $0 != currentDeviceID }.count
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
    func answeredWaiters() -> [CheckedContinuation<Void, any Error>] {
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

    // MARK: - Install facts

    /// The per-install id: read from `device-id`, or made (a random UUID) and kept there.
    static func deviceID(in directory: URL) throws -> String {
        let file = directory.appendingPathComponent("device-id")
        QueueDamage.clearForFile(file.path)
        if let text = try? String(contentsOf: file, encoding: .utf8), let id = UUID(uuidString: text.trimmingCharacters(in: .whitespacesAndNewlines)) {
            return id.uuidString.lowercased()
        }
        let id = UUID().uuidString.lowercased()
        try writeDeviceID(id, in: directory)
        return id
    }

    /// Keeps `id` in `device-id` (atomically, synced).
    static func writeDeviceID(_ id: String, in directory: URL) throws {
        let file = directory.appendingPathComponent("device-id")
        do {
            try Data((id + "\n").utf8).write(to: file, options: .atomic)
        } catch {
            throw AdTallyError.storage("cannot write \(file.path): \(error.localizedDescription)")
        }
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
