@testable import AdTallyKit
import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The queue on its own, and the kit with no server to reach: what is kept, what is
/// skipped, what is dropped and said. The kit against a real server is tested in the
/// server's suite (Tests/AdTallyTests/KitTests.swift).
final class QueueTests: XCTestCase {
    var folder: URL!

    override func setUp() {
        folder = FileManager.default.temporaryDirectory.appendingPathComponent("adtally-kit-tests-\(UUID().uuidString)")
    }

    override func tearDown() {
        try? FileManager.default.removeItem(at: folder)
    }

    /// A server that is never there (a port nothing listens on).
    let nowhere = URL(string: "http://127.0.0.1:9")!

    func record(_ text: String) -> [UInt8] { Array(#"{"id":"\#(text)"}"#.utf8) }

    func testRecordsSurviveReopeningInOrder() throws {
        var queue: EventQueue? = try EventQueue(folder: folder, segmentBytes: 256)
        for index in 0..<20 { try queue!.append(json: record("e\(index)"), occurredAtMillis: Int64(index)) }
        queue = nil
        let reopened = try EventQueue(folder: folder, segmentBytes: 256)
        XCTAssertEqual(reopened.pendingCount, 20)
        XCTAssertGreaterThan(try EventQueue.segmentNumbers(in: folder).count, 1, "small segments rotate")
        let records = try reopened.read(limit: 100, maxBytes: 1 << 20)
        XCTAssertEqual(records.map { String(decoding: $0.json, as: UTF8.self) }, (0..<20).map { #"{"id":"e\#($0)"}"# })
        XCTAssertEqual(records.map(\.occurredAtMillis), (0..<20).map(Int64.init))
    }

    func testAdvancingFinishesRecordsAndDeletesSegments() throws {
        let queue = try EventQueue(folder: folder, segmentBytes: 256)
        for index in 0..<20 { try queue.append(json: record("e\(index)"), occurredAtMillis: 0) }
        let first = try queue.read(limit: 12, maxBytes: 1 << 20)
        try queue.advance(to: first.last!.end, records: first.count)
        XCTAssertEqual(queue.pendingCount, 8)
        let reopened = try EventQueue(folder: folder, segmentBytes: 256)
        XCTAssertEqual(reopened.pendingCount, 8)
        XCTAssertEqual(try reopened.read(limit: 100, maxBytes: 1 << 20).first.map { String(decoding: $0.json, as: UTF8.self) }, #"{"id":"e12"}"#)
        XCTAssertFalse(FileManager.default.fileExists(atPath: EventQueue.segmentURL(folder, 1).path), "a finished segment is deleted")
    }

    /// A record torn by hand in the middle of a segment (its bytes cut short, then the
    /// next record written after it) loses that record only.
    /// The head is one fixed-width line rewritten in place: the same file (no new space
    /// needed to move it), and a torn one is told by its checksum and read from the start.
    func testTheHeadIsRewrittenInPlaceAndATornOneResendsFromTheStart() throws {
        let queue = try EventQueue(folder: folder, segmentBytes: 256)
        for index in 0..<20 { try queue.append(json: record("e\(index)"), occurredAtMillis: 0) }
        let headPath = folder.appendingPathComponent("head").path
        var before = stat()
        XCTAssertEqual(stat(headPath, &before), 0)
        let first = try queue.read(limit: 5, maxBytes: 1 << 20)
        try queue.advance(to: first.last!.end, records: first.count)
        var after = stat()
        XCTAssertEqual(stat(headPath, &after), 0)
        XCTAssertEqual(before.st_ino, after.st_ino, "the head is rewritten in place, not replaced")
        XCTAssertEqual(Int(after.st_size), EventQueue.headLineBytes)
        XCTAssertEqual(EventQueue.readHead(folder), queue.head)
        // A torn write: a byte of the offset changed, the checksum no longer matches.
        var bytes = try Data(contentsOf: URL(fileURLWithPath: headPath))
        bytes[25] = UInt8(ascii: "7")
        try bytes.write(to: URL(fileURLWithPath: headPath))
        XCTAssertNil(EventQueue.readHead(folder))
        let reopened = try EventQueue(folder: folder, segmentBytes: 256)
        XCTAssertEqual(first.last!.end.segment, 1)
        XCTAssertEqual(reopened.pendingCount, 20, "from the oldest segment kept: sent again, counted once by the server")
        XCTAssertEqual(reopened.damagedOnOpen, 0)
    }

    /// Segments lost under the kit — one replaced by a directory, one deleted — are
    /// counted from the ledger; the queue opens and goes on with the rest.
    func testLostSegmentsAreCountedFromTheLedger() throws {
        var queue: EventQueue? = try EventQueue(folder: folder, segmentBytes: 256)
        for index in 0..<40 { try queue!.append(json: record("e\(index)"), occurredAtMillis: 0) }
        queue!.writeLedger()
        queue = nil
        let numbers = try EventQueue.segmentNumbers(in: folder)
        XCTAssertGreaterThanOrEqual(numbers.count, 5)
        let ledger = QueueDamage.readLedger(folder)
        XCTAssertEqual(ledger.values.reduce(0, +), 40)
        let second = EventQueue.segmentURL(folder, numbers[1])
        try FileManager.default.removeItem(at: second)
        try FileManager.default.createDirectory(at: second.appendingPathComponent("x"), withIntermediateDirectories: true)
        try FileManager.default.removeItem(at: EventQueue.segmentURL(folder, numbers[3]))
        let reopened = try EventQueue(folder: folder, segmentBytes: 256)
        let lost = ledger[numbers[1]]! + ledger[numbers[3]]!
        XCTAssertEqual(reopened.lostOnOpen, lost)
        XCTAssertEqual(reopened.damagedOnOpen, lost)
        XCTAssertEqual(reopened.pendingCount, 40 - lost)
        XCTAssertEqual(try reopened.read(limit: 100, maxBytes: 1 << 20).count, 40 - lost)
        // Counted once: committed, a relaunch finds nothing new.
        reopened.commitDamage()
        XCTAssertEqual(try EventQueue(folder: folder, segmentBytes: 256).damagedOnOpen, 0)
    }

    /// The head's own segment deleted, and the whole queue folder replaced by a file:
    /// the kit still opens.
    func testTheHeadsSegmentGoneOrTheFolderAFileStillOpens() throws {
        var queue: EventQueue? = try EventQueue(folder: folder, segmentBytes: 256)
        for index in 0..<20 { try queue!.append(json: record("e\(index)"), occurredAtMillis: 0) }
        queue!.writeLedger()
        queue = nil
        let numbers = try EventQueue.segmentNumbers(in: folder)
        let ledger = QueueDamage.readLedger(folder)
        try FileManager.default.removeItem(at: EventQueue.segmentURL(folder, numbers[0]))
        let reopened = try EventQueue(folder: folder, segmentBytes: 256)
        XCTAssertEqual(reopened.lostOnOpen, ledger[numbers[0]]!)
        XCTAssertEqual(reopened.head.segment, numbers[1])
        try reopened.append(json: record("after"), occurredAtMillis: 0)

        try FileManager.default.removeItem(at: folder)
        try Data("not a folder".utf8).write(to: folder)
        let fresh = try EventQueue(folder: folder, segmentBytes: 256)
        try fresh.append(json: record("fresh"), occurredAtMillis: 0)
        XCTAssertEqual(fresh.pendingCount, 1)
    }

    /// Names and lines no queue of the kit's writes — a segment numbered near the top of
    /// the range, a ledger or head naming UInt32.max — open at once, counted, without a trap.
    func testStrayNumbersNeitherHangNorTrap() throws {
        var queue: EventQueue? = try EventQueue(folder: folder, segmentBytes: 256)
        try queue!.append(json: record("kept"), occurredAtMillis: 0)
        queue = nil
        try Data("x".utf8).write(to: EventQueue.segmentURL(folder, 99_999_999))
        try Data("4294967295 0\n".utf8).write(to: folder.appendingPathComponent("counts"))
        try Data("4294967295 0\n".utf8).write(to: folder.appendingPathComponent("head"))
        let reopened = try EventQueue(folder: folder, segmentBytes: 256)
        XCTAssertEqual(reopened.damagedOnOpen, 1, "the stray segment, one damaged stretch")
        XCTAssertEqual(try reopened.read(limit: 10, maxBytes: 1 << 20).map { String(decoding: $0.json, as: UTF8.self) }, [#"{"id":"kept"}"#])
        for _ in 0..<30 { try reopened.append(json: record("more"), occurredAtMillis: 0) }
    }

    func testATornRecordInTheMiddleLosesOnlyItself() throws {
        func segmentBytes(_ names: [String]) throws -> Data {
            let place = FileManager.default.temporaryDirectory.appendingPathComponent("adtally-kit-part-\(UUID().uuidString)")
            defer { try? FileManager.default.removeItem(at: place) }
            let queue = try EventQueue(folder: place, segmentBytes: 1 << 20)
            for name in names { try queue.append(json: record(name), occurredAtMillis: 0) }
            return try Data(contentsOf: EventQueue.segmentURL(place, 1))
        }
        let before = try segmentBytes(["before0", "before1", "before2"])
        let after = try segmentBytes(["after0", "after1", "after2"])
        // Half a record (its header and part of its JSON, as a power cut leaves one), then
        // whole records written after it.
        var bytes = before + before.prefix(before.count / 3 - 5) + after
        // And a flipped byte inside a whole record further on (after1).
        bytes[before.count + before.count / 3 - 5 + after.count / 2] ^= 0xFF
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        try bytes.write(to: EventQueue.segmentURL(folder, 1))
        let queue = try EventQueue(folder: folder, segmentBytes: 1 << 20)
        XCTAssertEqual(queue.damagedOnOpen, 2)
        let texts = try queue.read(limit: 100, maxBytes: 1 << 20).map { String(decoding: $0.json, as: UTF8.self) }
        XCTAssertEqual(texts, [#"{"id":"before0"}"#, #"{"id":"before1"}"#, #"{"id":"before2"}"#, #"{"id":"after0"}"#, #"{"id":"after2"}"#])
        XCTAssertEqual(queue.pendingCount, 5)
        XCTAssertEqual(try Data(contentsOf: EventQueue.segmentURL(folder, 1)).count, bytes.count, "damage before whole records is not cut")
        // Counted once: marked so (the engine does, once the count is on disk), the same
        // damage found again at a relaunch is not new.
        XCTAssertEqual(try EventQueue(folder: folder, segmentBytes: 1 << 20).damagedOnOpen, 2, "not marked yet")
        queue.commitDamage()
        XCTAssertEqual(try EventQueue(folder: folder, segmentBytes: 1 << 20).damagedOnOpen, 0)
    }

    /// A torn tail (the last append cut short) is cut off on open, so what is appended
    /// next follows a whole record.
    func testATornTailIsCutOff() throws {
        var queue: EventQueue? = try EventQueue(folder: folder, segmentBytes: 1 << 20)
        try queue!.append(json: record("a"), occurredAtMillis: 0)
        queue = nil
        let segment = EventQueue.segmentURL(folder, 1)
        let whole = try Data(contentsOf: segment)
        try (whole + whole.prefix(whole.count - 3)).write(to: segment)
        queue = try EventQueue(folder: folder, segmentBytes: 1 << 20)
        XCTAssertEqual(try Data(contentsOf: segment).count, whole.count)
        try queue!.append(json: record("b"), occurredAtMillis: 0)
        XCTAssertEqual(try queue!.read(limit: 10, maxBytes: 1 << 20).map { String(decoding: $0.json, as: UTF8.self) }, [#"{"id":"a"}"#, #"{"id":"b"}"#])
    }

    /// At its byte bound the queue drops its oldest events first, and says how many: to
    /// the app (a notice and the status) and, kept for sending, to the server.
    func testTheBoundDropsTheOldestAndSaysSo() throws {
        let noticed = Counter()
        var configuration = AdTallyConfiguration()
        configuration.maxQueueBytes = 16 * 1024
        configuration.segmentBytes = 4096
        configuration.sendInterval = 3600
        configuration.sendAfterEvents = 100_000
        configuration.notices = { notice in
            if case .dropped(let count, .queueFull) = notice { noticed.add(count) }
        }
        let tally = try AdTally(server: nowhere, appKey: "k", directory: folder, configuration: configuration)
        var ids: [UUID] = []
        for _ in 0..<300 { ids.append(try tally.sessionStarted()) }
        let status = tally.status
        let dropped = status.dropped[.queueFull] ?? 0
        XCTAssertGreaterThan(dropped, 0)
        XCTAssertEqual(status.pending + dropped, 300)
        XCTAssertLessThanOrEqual(status.pendingBytes, 16 * 1024)
        // Notices come on the kit's own queue, in order, soon after.
        for _ in 0..<200 where noticed.value != dropped { usleep(10_000) }
        XCTAssertEqual(noticed.value, dropped)
        // The ones kept are the newest.
        let queue = try EventQueue(folder: folder.appendingPathComponent("queue"), segmentBytes: 4096)
        let kept = try queue.read(limit: 1000, maxBytes: 1 << 20).compactMap { Engine.id(of: $0.json) }
        XCTAssertEqual(kept, Array(ids.suffix(status.pending)))
        // The count waits in drops.json for the server.
        let reports = try JSONSerialization.jsonObject(with: Data(contentsOf: folder.appendingPathComponent("drops.json"))) as? [[String: Any]]
        XCTAssertEqual(reports?.compactMap { ($0["count"] as? NSNumber)?.intValue }.reduce(0, +), dropped)
    }

    func testCallsOutOfOrderAreMisuseAndRecordNothing() throws {
        let misuses = Counter()
        var configuration = AdTallyConfiguration()
        configuration.misuseHandler = { _ in misuses.add(1) }
        let tally = try AdTally(server: nowhere, appKey: "k", directory: folder, configuration: configuration)
        let slot = try tally.slot(network: "admob", format: .interstitial)
        XCTAssertThrowsError(try slot.tapped()) { XCTAssertTrue("\($0)".contains("a tap on an ad never shown"), "\($0)") }
        XCTAssertThrowsError(try slot.loaded())
        try slot.requested()
        try slot.loaded()
        try slot.shown()
        XCTAssertThrowsError(try slot.shown()) { XCTAssertTrue("\($0)".contains("a second impression for one load"), "\($0)") }
        XCTAssertThrowsError(try slot.actionCancelled())
        try slot.tapped()
        try slot.actionCancelled()
        try slot.expired()
        XCTAssertThrowsError(try slot.expired())
        XCTAssertEqual(tally.status.pending, 6)
        XCTAssertEqual(misuses.value, 5)
        XCTAssertThrowsError(try tally.slot(network: "AdMob", format: .banner))
        XCTAssertThrowsError(try tally.slot(network: "admob", format: .banner, size: "320 x 50"))
        let next = try tally.slot(network: "admob", format: .banner)
        try next.requested()
        XCTAssertThrowsError(try next.shown(revenueMicros: -1, currency: "USD"))
        XCTAssertThrowsError(try next.shown(revenueMicros: 1, currency: "usd"))
        XCTAssertEqual(next.state, .requested)
    }

    /// A forget killed after it recorded the id to erase, before the new id was used: the
    /// next open finishes it (queue dropped as forgotten, a new id), so nothing of the old
    /// id is sent; optOut kept across an instance, and nothing written while opted out.
    func testAnInterruptedForgetIsFinishedAtOpenAndOptOutIsKept() throws {
        var configuration = AdTallyConfiguration()
        configuration.sendInterval = 3600
        var tally: AdTally? = try AdTally(server: nowhere, appKey: "k", directory: folder, configuration: configuration)
        let old = tally!.deviceID
        for _ in 0..<3 { try tally!.sessionStarted() }
        XCTAssertEqual(tally!.status.pending, 3)
        tally = nil
        // As a kill right after forget.json was written leaves the folder.
        try JSONEncoder().encode([old]).write(to: folder.appendingPathComponent("forget.json"))
        tally = try AdTally(server: nowhere, appKey: "k", directory: folder, configuration: configuration)
        XCTAssertNotEqual(tally!.deviceID, old)
        XCTAssertEqual(tally!.status.pending, 0)
        XCTAssertEqual(tally!.status.dropped[.forgotten], 3)
        XCTAssertEqual(tally!.status.forgetsPending, 1)
        XCTAssertEqual(try String(contentsOf: folder.appendingPathComponent("device-id"), encoding: .utf8), tally!.deviceID + "\n")

        try tally!.optOut()
        try tally!.sessionStarted()
        XCTAssertEqual(tally!.status.pending, 0)
        tally = nil
        tally = try AdTally(server: nowhere, appKey: "k", directory: folder, configuration: configuration)
        XCTAssertTrue(tally!.status.isOptedOut)
        try tally!.sessionStarted()
        XCTAssertEqual(tally!.status.pending, 0)
        try tally!.optIn()
        try tally!.sessionStarted()
        XCTAssertEqual(tally!.status.pending, 1)
        XCTAssertFalse(tally!.status.isOptedOut)
    }

    /// Two instances on one folder in one process share one queue and one sender;
    /// another holder of the folder's lock (another process) is refused.
    func testOneSenderPerQueue() throws {
        var configuration = AdTallyConfiguration()
        configuration.sendInterval = 3600
        let first = try AdTally(server: nowhere, appKey: "k", directory: folder, configuration: configuration)
        let second = try AdTally(server: nowhere, appKey: "k", directory: folder, configuration: configuration)
        try first.sessionStarted()
        try second.sessionStarted()
        XCTAssertEqual(first.status.pending, 2)
        XCTAssertEqual(second.status.pending, 2)
        XCTAssertTrue(first.engine === second.engine)

        let other = FileManager.default.temporaryDirectory.appendingPathComponent("adtally-kit-locked-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: other) }
        try FileManager.default.createDirectory(at: other, withIntermediateDirectories: true)
        let fd = open(other.appendingPathComponent("queue.lock").path, O_RDWR | O_CREAT, 0o600)
        defer { close(fd) }
        XCTAssertEqual(flock(fd, LOCK_EX | LOCK_NB), 0)
        XCTAssertThrowsError(try AdTally(server: nowhere, appKey: "k", directory: other)) {
            guard case AdTallyError.directoryInUse = $0 else { return XCTFail("\($0)") }
        }
    }

    func testEventJSONIsEscapedAndTimed() {
        var json = EventJSON(id: UUID(uuidString: "00000000-0000-0000-0000-000000000001")!, type: "request", occurredAtMillis: 1_764_150_000_123)
        json.add("placement", "a \"b\"\n\\ é")
        json.add("error_code", Int64(-3))
        let text = String(decoding: json.finish(), as: UTF8.self)
        XCTAssertEqual(text, #"{"id":"00000000-0000-0000-0000-000000000001","type":"request","occurred_at":"2025-11-26T09:40:00.123Z","placement":"a \"b\"\u000a\\ é","error_code":-3}"#)
        let object = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any]
        XCTAssertEqual(object?["placement"] as? String, "a \"b\"\n\\ é")
    }

    func testRetryAfterReadsSecondsAndDates() {
        XCTAssertEqual(BatchOutcome.retryAfter("5"), 5)
        XCTAssertNil(BatchOutcome.retryAfter("soon"))
        let date = BatchOutcome.retryAfter(DateFormatter.httpDate(Date().addingTimeInterval(30)))
        XCTAssertNotNil(date)
        XCTAssertTrue((25...31).contains(date ?? 0))
    }
}

/// A count shared with the kit's callbacks.
final class Counter: @unchecked Sendable {
    private let lock = NSLock()
    private var count = 0
    func add(_ amount: Int) { lock.lock(); count += amount; lock.unlock() }
    var value: Int { lock.lock(); defer { lock.unlock() }; return count }
}

extension DateFormatter {
    static func httpDate(_ date: Date) -> String {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss zzz"
        return formatter.string(from: date)
    }
}
