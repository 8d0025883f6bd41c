import AdTallyKitZlib
import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Where a record starts in the queue: a segment number and a byte offset in it.
struct QueuePosition: Comparable, Hashable, CustomStringConvertible {
    var segment: UInt32
    var offset: Int

    static func < (a: QueuePosition, b: QueuePosition) -> Bool {
        a.segment != b.segment ? a.segment < b.segment : a.offset < b.offset
    }

    var description: String { "\(segment):\(offset)" }
}

/// One record read back from the queue: the event's JSON and where the next record starts.
struct QueuedRecord {
    /// When the event happened, in milliseconds since the epoch (its `occurred_at`).
    var occurredAtMillis: Int64
    /// The event object, as sent.
    var json: [UInt8]
    /// The position just after it.
    var end: QueuePosition
}

/// The on-disk queue (DESIGN §10: persist, then send, then finish).
///
/// Append-only segment files `NNNNNNNN.seg` in the queue folder. A record is
/// `magic (4) | length (4, LE) | CRC-32 (4, LE) | occurred_at ms (8, LE) | JSON`; the
/// CRC covers the time and the JSON. The `head` file names the first record not yet
/// answered by the server (replaced atomically by rename); everything before it has
/// left the queue, and whole segments before it are deleted.
///
/// A record that fails its check (a torn write at power loss, a flipped bit) is
/// skipped by scanning for the next magic whose length and CRC check out, so damage
/// never spreads past the record it hit; a torn tail of the last segment is cut off on
/// open, before anything is appended after it.
///
/// Not thread-safe: `AdTally` serialises every call behind its lock.
final class EventQueue {
    static let magic: [UInt8] = [0xAD, 0x7A, 0x11, 0x9E]
    static let headerBytes = 20
    /// The highest segment number the queue uses (far beyond any device's lifetime of
    /// 256 KiB segments); a higher one in the folder is damage.
    static let maxSegment: UInt32 = 1 << 30
    /// Larger than any event the kit writes (each field is bounded); a length above it is damage.
    static let maxRecordBytes = 64 * 1024

    let folder: URL
    let segmentBytes: Int
    private var writeFD: Int32 = -1
    /// Segments sealed since the last sync, still open: the syncer fsyncs and closes them
    /// outside the caller's lock (a rotation inside `record` never waits for the disk).
    private var retiredFDs: [Int32] = []
    /// A segment was created since the last sync: the folder needs one too.
    private var isFolderDirty = false
    /// Segments the head passed, to be removed by the next sync's work (outside the lock).
    private var finishedSegments: [String] = []
    /// The head file, kept open and rewritten in place: moving the head needs no new space.
    private var headFD: Int32 = -1
    /// The segment being appended to and its size.
    private(set) var tail: QueuePosition
    /// The first record not yet answered.
    private(set) var head: QueuePosition
    /// Records between head and tail, and their bytes (headers included).
    private(set) var pendingCount = 0
    private(set) var pendingBytes = 0
    /// Records per segment from the head on (the head segment's count is from the head).
    private var segmentCounts: [UInt32: Int] = [:]
    private var segmentSizes: [UInt32: Int] = [:]
    /// The counts as last written to the ledger.
    private var ledgerWritten: [UInt32: Int] = [:]
    /// Events lost on open: damaged stretches, and the events of segments that were
    /// missing or unreadable (from the ledger).
    private(set) var damagedOnOpen = 0
    /// Of `damagedOnOpen`, the events of lost segments.
    private(set) var lostOnOpen = 0
    /// Written since the last `sync`.
    private(set) var isDirty = false
    /// The damage found on open is counted on disk (`commitDamage`): until then neither
    /// the head nor the ledger is written, so a lost segment keeps its count there.
    private(set) var isDamageCommitted = false

    init(folder: URL, segmentBytes: Int) throws {
        self.folder = folder
        self.segmentBytes = segmentBytes
        try QueueDamage.ensureDirectory(folder)
        // Segments the kit cannot open as files (a directory in a segment's place) are lost.
        var lost: Set<UInt32> = []
        var segments: [UInt32] = []
        var strays = 0
        for (number, kind) in Self.segmentEntries(in: folder) {
            if number > Self.maxSegment {
                // No segment the kit wrote has such a number (damage, or a stray file): aside,
                // one damaged stretch, and never a number the queue must count up to.
                QueueDamage.moveAside(Self.segmentURL(folder, number).path)
                strays += 1
            } else if kind == .regularFile {
                segments.append(number)
            } else {
                QueueDamage.moveAside(Self.segmentURL(folder, number).path)
                lost.insert(number)
            }
        }
        segments.sort()
        let ledger = QueueDamage.readLedger(folder).filter { $0.key <= Self.maxSegment }
        // A head that is missing or torn: from the oldest segment, sent again (the server
        // counts each id once), rather than a guess that could pass unsent events.
        let seen = Set(segments).union(lost).union(ledger.keys)
        head = Self.readHead(folder) ?? QueuePosition(segment: seen.min() ?? 1, offset: 0)
        for number in segments where number < head.segment { unlink(Self.segmentURL(folder, number).path) }
        var contents: [UInt32: [UInt8]] = [:]
        for number in segments where number >= head.segment {
            do {
                contents[number] = try Self.read(Self.segmentURL(folder, number))
            } catch let error as SegmentReadError where !error.isLost {
                // A failure that may pass (out of descriptors, an I/O error, a file locked by
                // data protection): nothing is given up; opening fails, and is tried again later.
                throw AdTallyError.storage(error.description)
            } catch {
                QueueDamage.moveAside(Self.segmentURL(folder, number).path)
                lost.insert(number)
            }
        }
        let readable = contents.keys.sorted()
        // Lost: a segment from the head on that the ledger or the folder knew of and that
        // cannot be read now; and a gap between readable ones the ledger never saw (its
        // count unknown, one damaged stretch like any other).
        var lostEvents = strays
        let highest = seen.max() ?? head.segment
        let from = head.segment
        var missing = seen.filter { $0 >= from && contents[$0] == nil }
        for (before, after) in zip(readable, readable.dropFirst()) where after - before > 1 {
            // A gap wider than any queue's segments is one damaged stretch, not enumerated.
            if after - before > 4096 {
                lostEvents += 1
            } else {
                for number in (before + 1)..<after { missing.insert(number) }
            }
        }
        for number in missing {
            lostEvents += ledger[number] ?? 1
            // Known as lost from now on (a zero in the ledger): not counted again at the next launch.
            segmentCounts[number] = 0
            segmentSizes[number] = 0
        }
        lostOnOpen = lostEvents
        if contents[head.segment] == nil {
            // The head's own segment is gone: the queue goes on from the next one there is.
            head = QueuePosition(segment: readable.first ?? (highest + (seen.isEmpty ? 0 : 1)), offset: 0)
        }
        let first = head.segment
        segmentCounts = segmentCounts.filter { $0.key >= first }
        segmentSizes = segmentSizes.filter { $0.key >= first }
        tail = QueuePosition(segment: max(head.segment, readable.last ?? head.segment), offset: 0)
        var newDamage: Set<QueuePosition> = []
        for number in readable {
            let data = contents[number]!
            let start = number == head.segment ? min(head.offset, data.count) : 0
            var records = 0
            var lastEnd = start
            var damageStarts: [Int] = []
            Self.scan(data, from: start, damage: { damageStarts.append($0) }) { _, _, end in
                records += 1
                lastEnd = end
            }
            var size = data.count
            if number == readable.last, lastEnd < data.count {
                // A torn tail: cut it off so that appends follow a whole record. What lies
                // between records before it was skipped above and stays skipped.
                let tailDamage = Self.scan(data, from: lastEnd) { _, _, _ in }
                if tailDamage > 0 {
                    if truncate(Self.segmentURL(folder, number).path, off_t(lastEnd)) == 0 {
                        size = lastEnd
                    } else {
                        // Cannot be cut (a full disk, a read-only file): appends go to a new segment.
                        tail = QueuePosition(segment: number + 1, offset: 0)
                    }
                }
            }
            for offset in damageStarts where offset < size { newDamage.insert(QueuePosition(segment: number, offset: offset)) }
            segmentCounts[number] = records
            segmentSizes[number] = size
            pendingCount += records
            pendingBytes += size - start
            if number == tail.segment { tail.offset = size }
        }
        if head.offset > (segmentSizes[head.segment] ?? 0) { head.offset = segmentSizes[head.segment] ?? 0 }
        damage = newDamage
        // Damage stays in its file until the head passes it: count each stretch once,
        // not again at every launch (the stretches counted are kept in `damage`).
        let known = Set(Self.readDamage(folder))
        damagedOnOpen = damage.subtracting(known).count + lostEvents
        isDamageCommitted = damagedOnOpen == 0
        ledgerWritten = ledger
        openHead()
        try openForAppend()
    }

    /// Marks the damage found on open as counted (once its count is on disk).
    func commitDamage() {
        isDamageCommitted = true
        if damage != Set(Self.readDamage(folder)) { Self.writeDamage(folder, damage) }
        writeLedger(force: true)
        // The head as opened (it may have moved past a lost segment).
        try? writeHead(head)
    }

    /// Writes the per-segment counts when they changed since the last write.
    func writeLedger(force: Bool = false) {
        guard isDamageCommitted, force || segmentCounts != ledgerWritten else { return }
        if QueueDamage.writeLedger(folder, segmentCounts) { ledgerWritten = segmentCounts }
    }

    /// Damaged stretches found on open (each counted once as a dropped event: a damaged
    /// record's length cannot be trusted, so neither can a count of what it held).
    private var damage: Set<QueuePosition> = []

    static func readDamage(_ folder: URL) -> [QueuePosition] {
        guard let text = try? String(contentsOf: folder.appendingPathComponent("damage"), encoding: .utf8) else { return [] }
        return text.split(separator: "\n").compactMap { line in
            let parts = line.split(separator: " ")
            guard parts.count == 2, let segment = UInt32(parts[0]), let offset = Int(parts[1]) else { return nil }
            return QueuePosition(segment: segment, offset: offset)
        }
    }

    static func writeDamage(_ folder: URL, _ damage: Set<QueuePosition>) {
        let text = damage.sorted().map { "\($0.segment) \($0.offset)\n" }.joined()
        QueueDamage.replace(folder.appendingPathComponent("damage"), with: Array(text.utf8))
    }

    deinit {
        if writeFD >= 0 { close(writeFD) }
        if headFD >= 0 { close(headFD) }
        for fd in retiredFDs { close(fd) }
        for path in finishedSegments { unlink(path) }
    }

    // MARK: - Appending

    /// Appends one record; it is in the file (the page cache) when this returns.
    @discardableResult
    func append(json: [UInt8], occurredAtMillis: Int64) throws -> QueuePosition {
        // A rotation whose new file could not be opened is tried again here.
        if writeFD < 0 { try openForAppend() }
        if tail.offset >= segmentBytes { try rotate() }
        let length = 8 + json.count
        var frame = [UInt8](repeating: 0, count: 12 + length)
        frame.withUnsafeMutableBufferPointer { out in
            out[0] = Self.magic[0]; out[1] = Self.magic[1]; out[2] = Self.magic[2]; out[3] = Self.magic[3]
            Self.store(UInt32(length), at: 4, in: out)
            Self.store64(UInt64(bitPattern: occurredAtMillis), at: 12, in: out)
            json.withUnsafeBufferPointer { source in
                _ = memcpy(out.baseAddress! + 20, source.baseAddress!, json.count)
            }
            let crc = AdTallyKitZlib.crc32(0, out.baseAddress! + 12, uInt(length))
            Self.store(UInt32(truncatingIfNeeded: crc), at: 8, in: out)
        }
        let position = tail
        try frame.withUnsafeBytes { bytes in
            var done = 0
            while done < bytes.count {
                let written = write(writeFD, bytes.baseAddress! + done, bytes.count - done)
                if written < 0 {
                    if errno == EINTR { continue }
                    let code = errno
                    // Leave no partial record behind for the next append to follow.
                    _ = ftruncate(writeFD, off_t(position.offset))
                    throw AdTallyError.storage("cannot write the queue (\(String(cString: strerror(code))))")
                }
                done += written
            }
        }
        tail.offset += frame.count
        segmentSizes[tail.segment] = tail.offset
        segmentCounts[tail.segment, default: 0] += 1
        pendingCount += 1
        pendingBytes += frame.count
        isDirty = true
        return position
    }

    /// What a sync must do, taken under the caller's lock and done outside it: fsync
    /// (and close) each descriptor, then fsync the folder when a segment was created.
    struct SyncWork {
        var descriptors: [Int32] = []
        var folder: URL?
        /// Segments the head passed: removed here, outside the lock, since an unlink may
        /// wait on the file system's journal behind another process's sync.
        var finished: [String] = []

        var isEmpty: Bool { descriptors.isEmpty && folder == nil && finished.isEmpty }

        /// Does it (outside any lock), closing the descriptors.
        func run() {
            for path in finished { unlink(path) }
            for fd in descriptors {
                EventQueue.sync(fd)
                close(fd)
            }
            if let folder { EventQueue.syncFolder(folder) }
        }
    }

    /// The syncing owed since the last: the segment being appended to (a duplicate
    /// descriptor, so a rotation meanwhile cannot close it) when written to, the segments
    /// sealed since, and the folder when a segment was created. The caller runs it.
    func takeSync() -> SyncWork {
        var work = SyncWork()
        if isDirty, writeFD >= 0 {
            let fd = dup(writeFD)
            if fd >= 0 {
                work.descriptors.append(fd)
                isDirty = false
            }
        }
        work.descriptors += retiredFDs
        retiredFDs = []
        work.finished = finishedSegments
        finishedSegments = []
        if isFolderDirty {
            work.folder = folder
            isFolderDirty = false
        }
        return work
    }

    static func sync(_ fd: Int32) {
        #if canImport(Darwin)
        _ = fcntl(fd, F_FULLFSYNC)
        #else
        _ = fdatasync(fd)
        #endif
    }

    /// Starts a new segment. The sealed one is synced later, by whoever takes the sync
    /// work, never here: this runs inside `record`.
    private func rotate() throws {
        try startSegment(syncingOld: true)
        // The sealed segment's count is final: in the ledger before it can be lost.
        writeLedger()
    }

    /// Moves the tail to a new segment; the old one's descriptor is handed to the next
    /// sync when `syncingOld` and it holds unsynced writes, else closed.
    private func startSegment(syncingOld: Bool) throws {
        if writeFD >= 0 {
            if syncingOld && isDirty { retiredFDs.append(writeFD) } else { close(writeFD) }
        }
        writeFD = -1
        isDirty = false
        tail = QueuePosition(segment: tail.segment + 1, offset: 0)
        segmentSizes[tail.segment] = 0
        segmentCounts[tail.segment] = 0
        try openForAppend()
    }

    private func openForAppend() throws {
        let path = Self.segmentURL(folder, tail.segment).path
        QueueDamage.clearForFile(path)
        let isNew = access(path, F_OK) != 0
        writeFD = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        guard writeFD >= 0 else { throw AdTallyError.storage("cannot open \(path) (\(String(cString: strerror(errno))))") }
        if segmentSizes[tail.segment] == nil { segmentSizes[tail.segment] = 0 }
        if segmentCounts[tail.segment] == nil { segmentCounts[tail.segment] = 0 }
        // A new file's name must survive power loss as its records do (synced with the next sync).
        if isNew { isFolderDirty = true }
    }

    /// The segment being appended to was lost (deleted under the kit): later records go
    /// to a new one.
    private func abandonTail() throws {
        try startSegment(syncingOld: false)
    }

    // MARK: - Reading and finishing

    /// What lies between the head and the tail now: the segments and byte ranges to read.
    /// Taken under the caller's lock; read with `records(in:)` outside it, while no
    /// advance or drop runs (the sender holds the batch in flight).
    struct ReadPlan {
        var folder: URL
        var ranges: [(segment: UInt32, from: Int, to: Int)]
        var tail: QueuePosition
    }

    func readPlan() -> ReadPlan {
        var ranges: [(segment: UInt32, from: Int, to: Int)] = []
        // The segments known, not every number between (a gap may be wide: damage).
        for segment in known(from: head.segment, through: tail.segment) {
            let end = segment == tail.segment ? tail.offset : (segmentSizes[segment] ?? 0)
            let from = segment == head.segment ? head.offset : 0
            if from < end { ranges.append((segment, from, end)) }
        }
        return ReadPlan(folder: folder, ranges: ranges, tail: tail)
    }

    /// The numbers of the segments the queue knows in `from...through`, in order.
    private func known(from: UInt32, through: UInt32) -> [UInt32] {
        guard from <= through else { return [] }
        return Set(segmentSizes.keys).union(segmentCounts.keys).union([tail.segment])
            .filter { $0 >= from && $0 <= through }.sorted()
    }

    /// Records read from a plan, and the first segment that could not be read (lost:
    /// deleted, replaced, cut short), where reading stopped.
    struct Batch {
        var records: [QueuedRecord] = []
        var unreadable: UInt32?
        /// A read failed for a reason that may pass (out of descriptors, an I/O error).
        var failure: String?
    }

    /// Up to `limit` records (and about `maxBytes` of JSON) of a plan, in order.
    static func records(in plan: ReadPlan, limit: Int, maxBytes: Int) -> Batch {
        var batch = Batch()
        var bytes = 0
        for range in plan.ranges where batch.records.count < limit && bytes < maxBytes {
            let data: [UInt8]
            do {
                data = try read(segmentURL(plan.folder, range.segment), upTo: range.to, mustExist: true)
            } catch let error as SegmentReadError {
                if error.isLost { batch.unreadable = range.segment } else { batch.failure = error.description }
                return batch
            } catch {
                batch.failure = "\(error)"
                return batch
            }
            guard data.count == range.to else {
                // Cut short by someone else: what it held past the cut cannot be sent.
                batch.unreadable = range.segment
                return batch
            }
            var stop = false
            scan(data, from: range.from) { json, millis, recordEnd in
                if stop { return }
                batch.records.append(QueuedRecord(
                    occurredAtMillis: millis, json: Array(data[json]),
                    end: QueuePosition(segment: range.segment, offset: recordEnd)
                ))
                bytes += json.count
                if batch.records.count >= limit || bytes >= maxBytes { stop = true }
            }
        }
        return batch
    }

    /// Up to `limit` records from the head on (tests; the sender reads a plan outside its lock).
    func read(limit: Int, maxBytes: Int) throws -> [QueuedRecord] {
        let batch = Self.records(in: readPlan(), limit: limit, maxBytes: maxBytes)
        if batch.records.isEmpty, let unreadable = batch.unreadable { throw AdTallyError.storage("segment \(unreadable) cannot be read") }
        if batch.records.isEmpty, let failure = batch.failure { throw AdTallyError.storage(failure) }
        return batch.records
    }

    /// Records of `segment` not yet answered (from the head, in the head's segment).
    func count(of segment: UInt32) -> Int { segment < head.segment ? 0 : segmentCounts[segment] ?? 0 }

    /// Passes a segment that can no longer be read (reached by the head: everything
    /// before it left the queue); returns how many events it held. The segment being
    /// appended to is replaced by a new one.
    func loseSegment(_ number: UInt32) throws -> Int {
        guard number >= head.segment, number <= tail.segment else { return 0 }
        let lost = count(of: number)
        if number == tail.segment { try abandonTail() }
        QueueDamage.moveAside(Self.segmentURL(folder, number).path)
        try advance(to: QueuePosition(segment: number + 1, offset: 0), records: lost)
        return lost
    }

    /// Records in the head's segment from the head on: what `dropOldestSegment` would drop.
    var headSegmentCount: Int { segmentCounts[head.segment] ?? 0 }

    /// Moves the head to `position` (never back), counting the records passed, and
    /// deletes the segments wholly before it. Returns how many records left.
    @discardableResult
    func advance(to position: QueuePosition, records: Int) throws -> Int {
        guard head < position else { return 0 }
        var newHead = position
        if newHead.segment == tail.segment && newHead.offset > tail.offset { newHead.offset = tail.offset }
        // On disk first: a head that cannot be written leaves every count as it was.
        try writeHead(newHead)
        let oldHead = head
        head = newHead
        // Bytes passed: whole segments from the old head, then the part of the new head's.
        var passedBytes = 0
        let passed = head.segment > oldHead.segment ? known(from: oldHead.segment, through: head.segment - 1) : []
        for number in passed {
            passedBytes += (segmentSizes[number] ?? 0) - (number == oldHead.segment ? oldHead.offset : 0)
        }
        passedBytes += head.offset - (head.segment == oldHead.segment ? oldHead.offset : 0)
        pendingBytes = max(0, pendingBytes - passedBytes)
        pendingCount = max(0, pendingCount - records)
        var left = records
        for number in passed + [head.segment] {
            let inSegment = segmentCounts[number] ?? 0
            if number < head.segment {
                left -= inSegment
                segmentCounts[number] = nil
                segmentSizes[number] = nil
            } else {
                segmentCounts[number] = max(0, inSegment - left)
            }
        }
        finishedSegments += passed.map { Self.segmentURL(folder, $0).path }
        // Best effort (a full disk must not stop the head): the counts as they are now.
        writeLedger()
        return records
    }

    /// Drops the oldest segment's records (the head's), for the byte bound; returns how
    /// many were dropped. Nothing when the head is in the segment being appended to.
    func dropOldestSegment() throws -> Int {
        guard head.segment < tail.segment else { return 0 }
        let dropped = segmentCounts[head.segment] ?? 0
        let next = known(from: head.segment + 1, through: tail.segment).first ?? tail.segment
        try advance(to: QueuePosition(segment: next, offset: 0), records: dropped)
        return dropped
    }

    /// The head file's one line: `SEGMENT OFFSET CRC32` at fixed widths, so that every
    /// write replaces the same bytes in place (no new space: a full disk still lets the
    /// head move), and a torn write is told by its checksum.
    static func headLine(_ head: QueuePosition) -> [UInt8] {
        let body = String(format: "%010u %020ld", head.segment, head.offset)
        let crc = body.utf8.withContiguousStorageIfAvailable { crc32(0, $0.baseAddress, uInt($0.count)) } ?? 0
        return Array((body + String(format: " %08lx\n", UInt(crc))).utf8)
    }

    static let headLineBytes = headLine(QueuePosition(segment: 0, offset: 0)).count

    private func openHead() {
        let path = folder.appendingPathComponent("head").path
        QueueDamage.clearForFile(path)
        headFD = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        // Written once at its full width now, so that later writes only replace bytes.
        if headFD >= 0 { try? writeHead(head) }
    }

    private func writeHead(_ head: QueuePosition) throws {
        // Nothing that passes lost events reaches the disk before their count does.
        guard isDamageCommitted else { throw AdTallyError.storage("the queue's damage is not counted on disk yet") }
        if headFD < 0 { openHead() }
        guard headFD >= 0 else { throw AdTallyError.storage("cannot open the queue's head file (\(String(cString: strerror(errno))))") }
        let line = Self.headLine(head)
        let written = line.withUnsafeBytes { pwrite(headFD, $0.baseAddress!, $0.count, 0) }
        guard written == line.count else {
            throw AdTallyError.storage("cannot write the queue's head file (\(String(cString: strerror(errno))))")
        }
        if lseek(headFD, 0, SEEK_END) > off_t(line.count) { _ = ftruncate(headFD, off_t(line.count)) }
    }

    // MARK: - File format

    static func segmentURL(_ folder: URL, _ number: UInt32) -> URL {
        folder.appendingPathComponent(String(format: "%08u.seg", number))
    }

    static func segmentNumbers(in folder: URL) throws -> [UInt32] {
        segmentEntries(in: folder).filter { $0.kind == .regularFile }.map(\.number).sorted()
    }

    /// Every `NNNNNNNN.seg` in the folder, with what it is (a file, or damage in its place).
    static func segmentEntries(in folder: URL) -> [(number: UInt32, kind: QueueDamage.Kind)] {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: folder.path)) ?? []
        return names.compactMap { name in
            guard name.hasSuffix(".seg"), name.utf8.count == 12, let number = UInt32(name.dropLast(4)) else { return nil }
            return (number, QueueDamage.kind(folder.appendingPathComponent(name).path))
        }
    }

    /// The head as written, or nil when it is missing, unreadable or torn (its checksum
    /// does not match). A head of the earlier two-field form is read too.
    static func readHead(_ folder: URL) -> QueuePosition? {
        let path = folder.appendingPathComponent("head").path
        guard QueueDamage.kind(path) == .regularFile, let bytes = try? read(URL(fileURLWithPath: path), upTo: 256) else { return nil }
        let text = String(decoding: bytes, as: UTF8.self)
        let parts = text.split(whereSeparator: { $0 == " " || $0 == "\n" })
        if parts.count == 3 {
            guard bytes.count >= headLineBytes, Array(bytes.prefix(headLineBytes)) == headLine(QueuePosition(
                segment: UInt32(parts[0]) ?? 0, offset: Int(parts[1]) ?? -1
            )) else { return nil }
        } else if parts.count != 2 {
            return nil
        }
        guard let segment = UInt32(parts[0]), segment <= maxSegment, let offset = Int(parts[1]), offset >= 0 else { return nil }
        return QueuePosition(segment: segment, offset: offset)
    }

    /// Why a file could not be read; `isLost` when it never will be (gone, not a file,
    /// not ours to read), not when the failure may pass (out of descriptors, an I/O error).
    struct SegmentReadError: Error, CustomStringConvertible {
        var path: String
        var code: Int32

        var isLost: Bool { [ENOENT, EISDIR, ENOTDIR, ELOOP].contains(code) }
        var description: String { "cannot read \(path) (\(String(cString: strerror(code))))" }
    }

    static func read(_ url: URL, upTo end: Int? = nil, mustExist: Bool = false) throws -> [UInt8] {
        let fd = open(url.path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard fd >= 0 else {
            if errno == ENOENT && !mustExist { return [] }
            throw SegmentReadError(path: url.path, code: errno)
        }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw SegmentReadError(path: url.path, code: errno) }
        guard info.st_mode & S_IFMT == S_IFREG else { throw SegmentReadError(path: url.path, code: EISDIR) }
        let size = min(Int(info.st_size), end ?? Int.max)
        var data = [UInt8](repeating: 0, count: size)
        var done = 0
        while done < size {
            let count = data.withUnsafeMutableBytes { pread(fd, $0.baseAddress! + done, size - done, off_t(done)) }
            if count < 0 && errno == EINTR { continue }
            if count < 0 { throw SegmentReadError(path: url.path, code: errno) }
            guard count > 0 else { break }
            done += count
        }
        if done < size { data.removeSubrange(done...) }
        return data
    }

    /// Calls `record` with each whole record's JSON range, time and end offset from
    /// `start`; returns how many damaged stretches were skipped.
    @discardableResult
    static func scan(_ data: [UInt8], from start: Int, damage: (Int) -> Void = { _ in }, _ record: (Range<Int>, Int64, Int) -> Void) -> Int {
        var offset = start
        var damaged = 0
        var inDamage = false
        data.withUnsafeBufferPointer { bytes in
            while offset + headerBytes <= bytes.count {
                if let (jsonLength, millis) = check(bytes, at: offset) {
                    let end = offset + headerBytes + jsonLength
                    record((offset + headerBytes)..<end, millis, end)
                    offset = end
                    inDamage = false
                } else {
                    if !inDamage {
                        damaged += 1
                        damage(offset)
                    }
                    inDamage = true
                    offset += 1
                }
            }
        }
        if offset < data.count && !inDamage {
            damaged += 1
            damage(offset)
        }
        return damaged
    }

    /// The record at `offset` when its magic, length and CRC check out.
    private static func check(_ bytes: UnsafeBufferPointer<UInt8>, at offset: Int) -> (Int, Int64)? {
        guard bytes[offset] == magic[0], bytes[offset + 1] == magic[1], bytes[offset + 2] == magic[2], bytes[offset + 3] == magic[3] else { return nil }
        let length = Int(load(bytes, at: offset + 4))
        guard length >= 8, length <= maxRecordBytes, offset + 12 + length <= bytes.count else { return nil }
        let crc = crc32(0, bytes.baseAddress! + offset + 12, uInt(length))
        guard UInt32(truncatingIfNeeded: crc) == load(bytes, at: offset + 8) else { return nil }
        let millis = Int64(bitPattern: UInt64(load(bytes, at: offset + 12)) | UInt64(load(bytes, at: offset + 16)) << 32)
        return (length - 8, millis)
    }

    private static func load(_ bytes: UnsafeBufferPointer<UInt8>, at offset: Int) -> UInt32 {
        UInt32(bytes[offset]) | UInt32(bytes[offset + 1]) << 8 | UInt32(bytes[offset + 2]) << 16 | UInt32(bytes[offset + 3]) << 24
    }

    private static func store(_ value: UInt32, at offset: Int, in bytes: UnsafeMutableBufferPointer<UInt8>) {
        for index in 0..<4 { bytes[offset + index] = UInt8(truncatingIfNeeded: value >> (8 * UInt32(index))) }
    }

    private static func store64(_ value: UInt64, at offset: Int, in bytes: UnsafeMutableBufferPointer<UInt8>) {
        for index in 0..<8 { bytes[offset + index] = UInt8(truncatingIfNeeded: value >> (8 * UInt64(index))) }
    }

    /// fsync of the folder, so that a new segment's name survives power loss.
    static func syncFolder(_ folder: URL) {
        let fd = open(folder.path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return }
        _ = fsync(fd)
        close(fd)
    }
}
