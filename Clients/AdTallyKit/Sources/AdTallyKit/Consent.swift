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

/// The ids of installs forgotten whose erasure the server has not answered, oldest first.
struct PendingForgets {
    let file: URL
    private(set) var ids: [String]

    init(file: URL) {
        self.file = file
        QueueDamage.clearForFile(file.path)
        ids = (try? JSONDecoder().decode([String].self, from: Data(contentsOf: file))) ?? []
    }

    /// Adds an id, on disk first (atomically: a kill leaves the old list or the new one).
    mutating func add(_ id: String) throws {
        guard !ids.contains(id) else { return }
        try save(ids + [id])
        ids.append(id)
    }

    mutating func remove(_ id: String) {
        let kept = ids.filter { $0 != id }
        if (try? save(kept)) != nil { ids = kept }
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
    /// Opts out or in; the marker file first, so the choice survives a kill.
    func setOptedOut(_ value: Bool) throws {
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
        let notices = try lock.locked { () -> [AdTallyNotice] in
            guard !isClosed else { throw AdTallyError.closed }
            isOptedOut = value
            return value ? try dropQueuedLocked(.optedOut) : []
        }
        deliver(notices)
        wakeup.signal()
    }

    /// `forgetInstall()`: the id to erase recorded first, then the queue dropped, then a new
    /// id; a kill in between is finished when the folder is opened again (`finishForget`).
    func forgetInstall() throws {
        let notices = try lock.locked { () -> [AdTallyNotice] in
            guard !isClosed else { throw AdTallyError.closed }
            try forgets.add(currentDeviceID)
            return try finishForgetLocked()
        }
        deliver(notices)
        wakeup.signal()
    }

    /// At open: the current id is one being forgotten (a forget was killed midway).
    func finishForget() throws {
        let notices = try lock.locked { try finishForgetLocked() }
        deliver(notices)
    }

    /// The queue dropped and a new id made (under `lock`).
    private func finishForgetLocked() throws -> [AdTallyNotice] {
        let notices = try dropQueuedLocked(.forgotten)
        let device = try Self.deviceID(in: directory, new: true)
        commonFields = try Self.commonFields(configuration, device: device)
        currentDeviceID = device
        return notices
    }

    /// Every queued event dropped for `reason`: counted on disk first, then the head
    /// moved past them (under `lock`).
    private func dropQueuedLocked(_ reason: DropReason) throws -> [AdTallyNotice] {
        let count = queue.pendingCount
        guard queue.head < queue.tail else { return [] }
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
        guard count > 0 else { return [] }
        counters.dropped[reason, default: 0] += count
        // Flushes waiting for these events have their answer: there is nothing left to send.
        deliver([], then: answeredWaiters())
        return [.dropped(count: count, reason: reason)]
    }

    /// Asks the server to erase each forgotten id (`DELETE /v1/devices/{id}` with the
    /// app's key). An id leaves the list only on AdTally's own answer: 202 (queued), or
    /// its problem+json 404 (it never saw the id: nothing to erase) or 400.
    func sendForgets() async {
        guard let (ids, server, key) = lock.locked({ () -> ([String], URL, String)? in
            isClosed || forgets.ids.isEmpty ? nil : (forgets.ids, self.server, appKey)
        }) else { return }
        for id in ids {
            let path = id.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? id
            guard let url = URL(string: server.absoluteString.hasSuffix("/") ? "\(server.absoluteString)v1/devices/\(path)" : "\(server.absoluteString)/v1/devices/\(path)") else { return }
            var request = URLRequest(url: url, timeoutInterval: configuration.requestTimeout)
            request.httpMethod = "DELETE"
            request.setValue("Bearer \(key)", forHTTPHeaderField: "Authorization")
            request.setValue("application/json", forHTTPHeaderField: "Accept")
            request.setValue("AdTallyKit/1", forHTTPHeaderField: "User-Agent")
            let answer = try? await transport.exchange(request, maxBytes: Receipt.maxBytes, deadline: configuration.requestTimeout).get()
            let problem = answer.flatMap(Problem.init)
            let done = lock.locked { () -> Bool in
                guard !isClosed else { return false }
                lastSend = Date()
                switch answer?.status {
                case 202 where answer?.mediaType == "application/json":
                    forgets.remove(id)
                    return true
                case 400, 404:
                    guard problem != nil else { backOffLocked(); return false }
                    forgets.remove(id)
                    return true
                case 429, 503:
                    if let seconds = BatchOutcome.retryAfter(answer?.header("retry-after")) {
                        failures += 1
                        notBefore = Date().addingTimeInterval(seconds + Double.random(in: 0...max(0.05, seconds * 0.1)))
                    } else {
                        backOffLocked()
                    }
                    return false
                default:
                    // Unreachable, a refused key, a captive portal: tried again after a backoff.
                    backOffLocked()
                    return false
                }
            }
            guard done else { return }
        }
    }
}
