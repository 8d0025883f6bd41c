import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The sender: batches from the queue's head, each answer judged (`BatchOutcome`), the
/// head moved only by AdTally's own receipt, and the backoff between failures.
extension Engine {
    enum Next {
        case wait(TimeInterval)
        case send
        case stop
    }

    func nextStep() -> Next {
        lock.locked {
            if isClosed { return .stop }
            if stoppedBy != nil { return .wait(3600) }
            let now = Date()
            // A forgotten install's erasure request goes whenever its own backoff allows,
            // opted out too (it is the user's own request).
            let forgetting = forgets.ids.contains { $0 != currentDeviceID }
            let forgetsDue = forgetting && now >= forgetNotBefore
            let hasWork = !isOptedOut && (queue.head < queue.tail || dropReports.hasUnsent)
            guard hasWork else {
                flushRequested = false
                if forgetsDue { return .send }
                if forgetting { return .wait(max(0.01, min(configuration.sendInterval, forgetNotBefore.timeIntervalSince(now)))) }
                return .wait(configuration.sendInterval)
            }
            if forgetsDue { return .send }
            if now < notBefore { return .wait(notBefore.timeIntervalSince(now)) }
            if flushRequested || queue.pendingCount >= configuration.sendAfterEvents || failures > 0 { return .send }
            let due = lastSend.addingTimeInterval(configuration.sendInterval)
            return now >= due ? .send : .wait(due.timeIntervalSince(now))
        }
    }

    func sendLoop() async {
        while !Task.isCancelled {
            switch nextStep() {
            case .stop: return
            case .wait(let seconds):
                await wakeup.sleep(seconds)
            case .send:
                await sendForgets()
                // The events keep their own timing: a failing erasure request never holds them.
                if lock.locked({ isOptedOut || Date() < notBefore }) { continue }
                await sendBatch()
                // Flushes whose events are answered return now, whatever the drop reports meet.
                let ready = lock.locked { () -> [CheckedContinuation<Void, any Error>] in
                    let ready = answeredWaiters()
                    if queue.head >= queue.tail { flushRequested = false }
                    return ready
                }
                deliver([], then: ready)
                if lock.locked({ Date() >= notBefore && stoppedBy == nil && !isOptedOut }) { await sendDropReports() }
            }
        }
    }

    /// The batch to send from the head, read outside the lock; nil when there is none.
    /// The byte bound may drop segments meanwhile (it is kept while a batch is out), so
    /// a segment that vanished under the read is checked against the head first.
    private func takeBatch() -> (records: [QueuedRecord], server: URL, key: String)? {
        guard let (plan, server, key) = lock.locked({ () -> (EventQueue.ReadPlan, URL, String)? in
            guard queue.head < queue.tail, !inFlight, !isClosed, !isOptedOut else { return nil }
            inFlight = true
            lastSend = Date()
            return (queue.readPlan(), self.server, appKey)
        }) else { return nil }
        syncIfDirty()
        let batch = EventQueue.records(in: plan, limit: lock.locked { batchLimit }, maxBytes: configuration.batchBytes)
        if !batch.records.isEmpty { return (batch.records, server, key) }
        let notices = lock.locked { () -> [AdTallyNotice] in
            inFlight = false
            inFlightDropReason = nil
            guard !isClosed else { return [] }
            if let failure = batch.failure {
                backOffLocked()
                return [.sendFailed("cannot read the queue: \(failure)")]
            }
            if let number = batch.unreadable {
                // Dropped by the bound since the plan was taken: nothing lost.
                guard number >= queue.head.segment else { return [] }
                return loseSegment(number)
            }
            // Every stretch between head and tail was read, and none holds a whole record:
            // damage only (counted when the queue was opened). Pass it.
            if (try? queue.advance(to: plan.tail, records: 0)) == nil { backOffLocked() }
            return []
        }
        deliver(notices)
        return nil
    }

    /// A segment the head reached that can no longer be read (deleted or replaced under
    /// the kit): its events are counted as damaged, on disk first, then passed (under `lock`).
    private func loseSegment(_ number: UInt32) -> [AdTallyNotice] {
        let count = queue.count(of: number)
        if count > 0, !dropReports.add(count, .damaged) {
            dropReports.add(-count, .damaged)
            backOffLocked()
            return [.sendFailed("cannot write drops.json")]
        }
        guard (try? queue.loseSegment(number)) != nil else {
            if count > 0 { dropReports.add(-count, .damaged) }
            backOffLocked()
            return [.sendFailed("cannot pass a lost segment of the queue")]
        }
        guard count > 0 else { return [] }
        counters.dropped[.damaged, default: 0] += count
        return [.dropped(count: count, reason: .damaged)]
    }

    private func sendBatch() async {
        guard let (records, server, key) = takeBatch(), let last = records.last else { return }
        let oldest = Int64((Date().timeIntervalSince1970 - min(configuration.maxEventAge, 100 * 365 * 86_400)) * 1000)
        var fresh = records.filter { $0.occurredAtMillis >= oldest }
        var outcome = BatchOutcome.delivered(Receipt(accepted: 0, duplicates: 0, rejected: []))
        // Dropped whole meanwhile (forgetInstall, optOut): nothing of it is posted.
        if lock.locked({ queue.head >= last.end }) { fresh = [] }
        if let first = fresh.first, let end = fresh.last?.end {
            // Never posted before (by this process, or before it started), or maybe a retry.
            let isFirstAttempt = lock.locked { () -> Bool in
                defer { postedThrough = max(postedThrough, end) }
                return first.end > postedThrough
            }
            outcome = await post(fresh, to: server, key: key, isFirstAttempt: isFirstAttempt)
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

    /// Applies the answer to a batch (under `lock`): the queue's head, the dead letters,
    /// the retry timing; returns the notices to give. Nothing changes once the engine is
    /// closed (the events stay queued for the next instance).
    private func finishBatch(_ records: [QueuedRecord], fresh: [QueuedRecord], last: QueuedRecord, outcome: BatchOutcome) -> [AdTallyNotice] {
        inFlight = false
        let droppedFor = inFlightDropReason ?? .queueFull
        inFlightDropReason = nil
        guard !isClosed else { return [] }
        var notices: [AdTallyNotice] = []
        // The bound may have dropped the batch's oldest segments while it was out
        // (counted then); the head passes only what is still queued.
        let head = queue.head
        let queued = records.filter { $0.end > head }
        let freshEnds = Set(fresh.map(\.end))
        let expiredQueued = queued.filter { !freshEnds.contains($0.end) }.count
        counters.requests += fresh.isEmpty ? 0 : 1
        /// The batch leaves the queue: expired events counted (on disk first), then the head
        /// moves. False when the head could not be written: the batch stays, uncounted, to
        /// be sent again (the server counts it once) after a backoff.
        func finish() -> Bool {
            if expiredQueued > 0, !dropReports.add(expiredQueued, .expired) {
                dropReports.add(-expiredQueued, .expired)
                backOffLocked()
                notices.append(.sendFailed("cannot write drops.json"))
                return false
            }
            guard (try? queue.advance(to: last.end, records: queued.count)) != nil else {
                if expiredQueued > 0 { dropReports.add(-expiredQueued, .expired) }
                backOffLocked()
                notices.append(.sendFailed("cannot write the queue's head"))
                return false
            }
            if expiredQueued > 0 {
                counters.dropped[.expired, default: 0] += expiredQueued
                notices.append(.dropped(count: expiredQueued, reason: .expired))
            }
            return true
        }
        switch outcome {
        case .delivered(let receipt):
            guard finish() else { break }
            // Events the bound (or forgetInstall, optOut) dropped while their batch was out,
            // then stored by the server: not dropped after all. Their count is still in the open report (reports are
            // sealed only between batches), so it is taken back there and here.
            let storedMeanwhile = fresh.filter { $0.end <= head }.count
            if storedMeanwhile > 0 {
                dropReports.add(-storedMeanwhile, droppedFor)
                counters.dropped[droppedFor] = max(0, (counters.dropped[droppedFor] ?? 0) - storedMeanwhile)
            }
            counters.delivered += fresh.count - receipt.rejected.count
            counters.erased += receipt.erased.count
            counters.deadLettered += receipt.rejected.count
            for rejection in receipt.rejected {
                let json = fresh[rejection.index].json
                // A forgotten install's events are kept nowhere, dead letters included.
                if droppedFor != .forgotten { DeadLetter.append(json, reason: rejection.reason, in: directory) }
                if let id = Self.id(of: json) { notices.append(.rejected(id: id, reason: rejection.reason)) }
            }
            if !fresh.isEmpty {
                failures = 0
                notBefore = .distantPast
                batchLimit = min(max(1, min(configuration.batchSize, 1000)), batchLimit * 2)
            }
        case .split(let detail, let byAdTally):
            counters.splits += 1
            if fresh.count > 1 {
                batchLimit = max(1, fresh.count / 2)
            } else if byAdTally {
                // One event AdTally cannot take at all: it leaves with the reason.
                if finish() {
                    if droppedFor != .forgotten { DeadLetter.append(fresh[0].json, reason: detail, in: directory) }
                    counters.deadLettered += 1
                    if let id = Self.id(of: fresh[0].json) { notices.append(.rejected(id: id, reason: detail)) }
                }
            } else {
                // A middlebox refuses even one event: it waits, and is sent again later.
                counters.unexpectedAnswers += 1
                backOffLocked()
                notices.append(.unexpectedAnswer(status: 413, detail: detail))
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
        case .notAdTally(let status, let detail):
            counters.unexpectedAnswers += 1
            backOffLocked()
            notices.append(.unexpectedAnswer(status: status, detail: detail))
        }
        let dropped = enforceBound()
        if dropped > 0 { notices.append(.dropped(count: dropped, reason: .queueFull)) }
        return notices
    }

    /// Exponential backoff with jitter: half the delay fixed, half random (under `lock`).
    func backOffLocked() {
        failures += 1
        let delay = min(configuration.retryCap, configuration.retryBase * pow(2, Double(min(failures - 1, 30))))
        notBefore = Date().addingTimeInterval(delay / 2 + Double.random(in: 0...(delay / 2)))
    }

    private func post(_ records: [QueuedRecord], to server: URL, key: String, isFirstAttempt: Bool) async -> BatchOutcome {
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
        request.setValue("application/json", forHTTPHeaderField: "Accept")
        request.setValue("AdTallyKit/1", forHTTPHeaderField: "User-Agent")
        // The server skips a probe of its id ledger for a batch sent the first time; for any
        // other (2: maybe sent before) it keeps a retry's duplicates out of its log.
        request.setValue(isFirstAttempt ? "1" : "2", forHTTPHeaderField: "AdTally-Attempt")
        if let compressed = Gzip.compress(body) {
            request.setValue("gzip", forHTTPHeaderField: "Content-Encoding")
            request.httpBody = Data(compressed)
        } else {
            request.httpBody = Data(body)
        }
        switch await transport.exchange(request, maxBytes: Receipt.maxBytes, deadline: configuration.requestTimeout) {
        case .failure(let failure):
            return .failed("\(server.absoluteString): \(failure)")
        case .success(let answer):
            return BatchOutcome.judge(answer, count: records.count, server: server)
        }
    }

    /// Sends the counts of dropped events (`POST /v1/client-drops`), each report once by
    /// its id; a failure backs off like a batch's. A report leaves only on AdTally's own
    /// answer: its 200, or its problem+json 400/404 (a report it can never take).
    func sendDropReports() async {
        guard let (reports, server, key) = lock.locked({ () -> ([DropReports.Report], URL, String)? in
            isClosed ? nil : (dropReports.seal(), self.server, appKey)
        }) else { return }
        for report in reports {
            var request = URLRequest(url: server.appendingPathComponent("v1/client-drops"), timeoutInterval: configuration.requestTimeout)
            request.httpMethod = "POST"
            request.setValue("Bearer \(key)", forHTTPHeaderField: "Authorization")
            request.setValue("application/json", forHTTPHeaderField: "Content-Type")
            request.httpBody = Data(#"{"id":"\#(report.id.uuidString.lowercased())","reason":"\#(report.reason)","dropped":\#(report.count)}"#.utf8)
            let answer = try? await transport.exchange(request, maxBytes: Receipt.maxBytes, deadline: configuration.requestTimeout).get()
            let problem = answer.flatMap(Problem.init)
            let done = lock.locked { () -> Bool in
                guard !isClosed else { return false }
                lastSend = Date()
                switch answer?.status {
                case 200 where answer.map(Self.isDropReceipt) ?? false:
                    dropReports.remove(report.id)
                    return true
                case 400, 404:
                    // AdTally's own: a report this server cannot take will never be taken; not resent.
                    guard problem != nil else { backOffLocked(); return false }
                    dropReports.remove(report.id)
                    return true
                case 401, 403:
                    guard let problem, let status = answer?.status else { backOffLocked(); return false }
                    // The key is refused here as for a batch: the app is told, flushes waiting fail.
                    stoppedBy = (status, problem.detail)
                    let waiting = waiters.map(\.continuation)
                    waiters = []
                    deliver([.sendingStopped(status: status, detail: problem.detail)], then: waiting,
                            error: AdTallyError.sendingStopped(status: status, detail: problem.detail))
                    return false
                case 429, 503:
                    if let seconds = BatchOutcome.retryAfter(answer?.header("retry-after")) {
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

    /// AdTally's answer to a drop report: JSON with its `recorded` flag.
    static func isDropReceipt(_ answer: WireAnswer) -> Bool {
        struct Wire: Decodable { var recorded: Bool }
        return answer.mediaType == "application/json" && (try? JSONDecoder().decode(Wire.self, from: answer.body)) != nil
    }

    static func id(of json: [UInt8]) -> UUID? {
        // Every record starts with {"id":"<36 characters>".
        guard json.count > 43 else { return nil }
        return UUID(uuidString: String(decoding: json[7..<43], as: UTF8.self))
    }
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
