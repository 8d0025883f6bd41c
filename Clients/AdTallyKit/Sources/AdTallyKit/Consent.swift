import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Consent and erasure on the app side (DESIGN §15): `optOut()`/`optIn()`, kept across
/// launches by a marker file (`opted-out`), and `forgetInstall()`, whose request to the
/// server is kept in `forget.json` until the server answers it.
enum Consent {
    static func marker(in directory: URL) -> URL { directory.appendingPathComponent("opted-out") }

    static func isOptedOut(in directory: URL) -> Bool {
        FileManager.default.fileExists(atPath: marker(in: directory).path)
    }
}

/// The ids of installs forgotten whose erasure the server has not answered, oldest first,
/// in `forget.json`. A lock of its own: each change is written and synced before it
/// counts, never under the engine's lock (which `record` takes).
final class PendingForgets: @unchecked Sendable {
    // @unchecked: `list` is only touched under `lock`.
    private let lock = NSLock()
    private let file: URL
    private var list: [String]

    init(file: URL) {
        self.file = file
        QueueDamage.clearForFile(file.path)
        list = (try? JSONDecoder().decode([String].self, from: Data(contentsOf: file))) ?? []
    }

    var ids: [String] { lock.locked { list } }

    /// Adds an id, on disk first (atomically and synced: a kill leaves the old list or the new one).
    func add(_ id: String) throws {
        try lock.locked {
            guard !list.contains(id) else { return }
            try save(list + [id])
            list.append(id)
        }
    }

    /// Removes an id; false (and kept) when the file cannot be written: the request is
    /// sent again after a backoff, which the server answers the same way.
    @discardableResult
    func remove(_ id: String) -> Bool {
        lock.locked {
            let kept = list.filter { $0 != id }
            guard (try? save(kept)) != nil else { return false }
            list = kept
            return true
        }
    }

    private func save(_ list: [String]) throws {
        if list.isEmpty {
            try? FileManager.default.removeItem(at: file)
            return
        }
        do {
            try JSONEncoder().encode(list).write(to: file, options: .atomic)
        } catch {
            throw AdTallyError.storage("cannot write \(file.path): \(error.localizedDescription)")
        }
    }
}

extension Engine {
    /// Opts out or in: the marker file, then the state, under `consentLock` (so the file and
    /// the state agree whatever calls race).
    func setOptedOut(_ value: Bool) throws {
        let (notices, ready) = try consentLock.locked { () -> ([AdTallyNotice], [CheckedContinuation<Void, any Error>]) in
            let marker = Consent.marker(in: directory)
            if value {
                guard FileManager.default.createFile(atPath: marker.path, contents: Data()) else {
                    throw AdTallyError.storage("cannot write \(marker.path)")
                }
            } else if FileManager.default.fileExists(atPath: marker.path) {
                do {
                    try FileManager.default.removeItem(at: marker)
                } catch {
                    throw AdTallyError.storage("cannot remove \(marker.path): \(error.localizedDescription)")
                }
            }
            return try lock.locked {
                guard !isClosed else { throw AdTallyError.closed }
                isOptedOut = value
                return value ? try dropQueuedLocked(.optedOut) : ([], [])
            }
        }
        deliver(notices, then: ready)
        wakeup.signal()
    }

    /// `forgetInstall()`, in an order a kill at any point leaves safe: the id to erase
    /// recorded (`forget.json`, synced, outside the engine's lock); then under the lock the
    /// queue dropped and a new id used (in memory), so that no event of the old id is left
    /// to send once its request may go; then the new id written to `device-id` (synced,
    /// outside the lock). A kill before that write reopens with the old id, which is in
    /// `forget.json`: the open finishes the forget (`finishForgetAtOpen`; events recorded
    /// meanwhile under the new id are dropped then, counted as forgotten).
    func forgetInstall() throws {
        let (notices, ready) = try consentLock.locked { () -> ([AdTallyNotice], [CheckedContinuation<Void, any Error>]) in
            let old = try lock.locked { () -> String in
                guard !isClosed else { throw AdTallyError.closed }
                return currentDeviceID
            }
            try forgets.add(old)
            let device = UUID().uuidString.lowercased()
            let fields = try Self.commonFields(configuration, device: device)
            let dropped = try lock.locked { () -> ([AdTallyNotice], [CheckedContinuation<Void, any Error>]) in
                guard !isClosed else { throw AdTallyError.closed }
                let dropped = try dropQueuedLocked(.forgotten)
                commonFields = fields
                currentDeviceID = device
                forgetFailures = 0
                forgetNotBefore = .distantPast
                return dropped
            }
            switchboard.forgetDevice()
            try Self.writeDeviceID(device, in: directory)
            DeadLetter.removeAll(in: directory)
            return dropped
        }
        deliver(notices, then: ready)
        wakeup.signal()
    }

    /// At open, when the id in use is one being forgotten (a forget killed midway): the
    /// queue dropped, a new id, as `forgetInstall` would have left them.
    func finishForgetAtOpen() throws {
        let device = UUID().uuidString.lowercased()
        let fields = try Self.commonFields(configuration, device: device)
        let (notices, _) = try lock.locked { () -> ([AdTallyNotice], [CheckedContinuation<Void, any Error>]) in
            let dropped = try dropQueuedLocked(.forgotten)
            commonFields = fields
            currentDeviceID = device
            return dropped
        }
        switchboard.forgetDevice()
        try Self.writeDeviceID(device, in: directory)
        DeadLetter.removeAll(in: directory)
        deliver(notices)
    }

    /// Every queued event dropped for `reason`: counted on disk first, then the head moved
    /// past them (under `lock`). Returns the notice and the flushes now answered (given
    /// after the notice). A batch out meanwhile is counted dropped too, and taken back
    /// if the server stores it after all (`finishBatch`).
    private func dropQueuedLocked(_ reason: DropReason) throws -> ([AdTallyNotice], [CheckedContinuation<Void, any Error>]) {
        let count = queue.pendingCount
        guard queue.head < queue.tail else { return ([], []) }
        if count > 0, !dropReports.add(count, reason) {
            dropReports.add(-count, reason)
            throw AdTallyError.storage("cannot write drops.json")
        }
        do {
            try queue.advance(to: queue.tail, records: count)
        } catch {
            if count > 0 { dropReports.add(-count, reason) }
            throw AdTallyError.storage("cannot write the queue's head")
        }
        if inFlight { inFlightDropReason = reason }
        guard count > 0 else { return ([], answeredWaiters()) }
        counters.dropped[reason, default: 0] += count
        return ([.dropped(count: count, reason: reason)], answeredWaiters())
    }

    /// What the server's answer to an erasure request says.
    enum ForgetAnswer {
        /// AdTally queued the erasure (202 with its job), or says there is nothing to erase
        /// or never will be (its problem+json 404 or 400 about the device): the id leaves the list.
        case answered
        case retryAfter(TimeInterval?)
        case failed
    }

    static func judgeForget(_ answer: WireAnswer?) -> ForgetAnswer {
        guard let answer else { return .failed }
        struct Job: Decodable {
            var id: String
            var status: String
        }
        switch answer.status {
        case 202:
            return answer.mediaType == "application/json" && (try? JSONDecoder().decode(Job.self, from: answer.body)) != nil ? .answered : .failed
        case 400, 404:
            // Only AdTally's own answer about the device: a route this server lacks, or a
            // proxy's page, is no answer.
            guard let problem = Problem(answer), problem.detail.hasPrefix("device:") else { return .failed }
            return .answered
        case 429, 503:
            return .retryAfter(BatchOutcome.retryAfter(answer.header("retry-after")))
        default:
            return .failed
        }
    }

    /// Asks the server to erase each forgotten id (`DELETE /v1/devices/{id}` with the
    /// app's key), with a backoff of its own; never the id in use.
    func sendForgets() async {
        guard let (ids, server, key) = lock.locked({ () -> ([String], URL, String)? in
            guard !isClosed, Date() >= forgetNotBefore else { return nil }
            let ids = forgets.ids.filter { $0 != currentDeviceID }
            return ids.isEmpty ? nil : (ids, self.server, appKey)
        }) else { return }
        for id in ids {
            let path = id.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? id
            let base = server.absoluteString.hasSuffix("/") ? String(server.absoluteString.dropLast()) : server.absoluteString
            guard let url = URL(string: "\(base)/v1/devices/\(path)") else {
                lock.locked { forgetFailures += 1; forgetNotBefore = Date().addingTimeInterval(configuration.retryCap) }
                return
            }
            var request = URLRequest(url: url, timeoutInterval: configuration.requestTimeout)
            request.httpMethod = "DELETE"
            request.setValue("Bearer \(key)", forHTTPHeaderField: "Authorization")
            request.setValue("application/json", forHTTPHeaderField: "Accept")
            request.setValue("AdTallyKit/1", forHTTPHeaderField: "User-Agent")
            let answer = try? await transport.exchange(request, maxBytes: Receipt.maxBytes, deadline: configuration.requestTimeout).get()
            var verdict = Self.judgeForget(answer)
            // Answered, but the list could not be written: tried again after a backoff, not at once.
            if case .answered = verdict, !forgets.remove(id) { verdict = .failed }
            let goOn = lock.locked { () -> Bool in
                guard !isClosed else { return false }
                switch verdict {
                case .answered:
                    forgetFailures = 0
                    return true
                case .retryAfter(let seconds?):
                    forgetFailures += 1
                    forgetNotBefore = Date().addingTimeInterval(seconds + Double.random(in: 0...max(0.05, seconds * 0.1)))
                case .retryAfter(nil), .failed:
                    forgetFailures += 1
                    let delay = min(configuration.retryCap, configuration.retryBase * pow(2, Double(min(forgetFailures - 1, 30))))
                    forgetNotBefore = Date().addingTimeInterval(delay / 2 + Double.random(in: 0...(delay / 2)))
                }
                return false
            }
            guard goOn else { return }
        }
    }
}
