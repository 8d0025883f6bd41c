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
    /// Larger than any event the kit writes (each field is bounded); a length above it is damage.
    static let maxRecordBytes = 64 * 1024

    let folder: URL
    let segmentBytes: Int
    private var writeFD: Int32 = -1
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
    /// Damaged records skipped when the queue was opened.
    private(set) var damagedOnOpen = 0
    /// Written since the last `sync`.
    private(set) var isDirty = false

    init(folder: URL, segmentBytes: Int) throws {
        self.folder = folder
        self.segmentBytes = segmentBytes
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        let segments = try Self.segmentNumbers(in: folder)
        head = Self.readHead(folder) ?? QueuePosition(segment: segments.first ?? 1, offset: 0)
        if let first = segments.first, head.segment < first { head = QueuePosition(segment: first, offset: 0) }
        // Segments wholly before the head were answered; a crash between the head's
        // rename and their deletion leaves them behind.
        for number in segments where number < head.segment { unlink(Self.segmentURL(folder, number).path) }
        tail = QueuePosition(segment: max(head.segment, segments.last ?? head.segment), offset: 0)
        for number in segments where number >= head.segment {
            let data = try Self.read(Self.segmentURL(folder, number))
            let start = number == head.segment ? min(head.offset, data.count) : 0
            var records = 0
            var lastEnd = start
            var damageStarts: [Int] = []
            Self.scan(data, from: start, damage: { damageStarts.append($0) }) { _, _, end in
                records += 1
                lastEnd = end
            }
            var size = data.count
            if number == segments.last, lastEnd < data.count {
                // A torn tail: cut it off so that appends follow a whole record. What lies
                // between records before it was skipped above and stays skipped.
                let tailDamage = Self.scan(data, from: lastEnd) { _, _, _ in }
                if tailDamage > 0 {
                    guard truncate(Self.segmentURL(folder, number).path, off_t(lastEnd)) == 0 else {
                        throw AdTallyError.storage("cannot cut the torn tail of \(Self.segmentURL(folder, number).path) (\(String(cString: strerror(errno))))")
                    }
                    size = lastEnd
                }
            }
            for offset in damageStarts where offset < size { damage.insert(QueuePosition(segment: number, offset: offset)) }
            segmentCounts[number] = records
            segmentSizes[number] = size
            pendingCount += records
            pendingBytes += size - start
            if number == tail.segment { tail.offset = size }
        }
        if head.offset > (segmentSizes[head.segment] ?? 0) { head.offset = segmentSizes[head.segment] ?? 0 }
        // Damage stays in its file until the head passes it: count each stretch once,
        // not again at every launch (the stretches counted are kept in `damage`).
        let known = Set(Self.readDamage(folder))
        damagedOnOpen = damage.subtracting(known).count
        try openForAppend()
    }

    /// Marks the damage found on open as counted (once its count is on disk).
    func commitDamage() {
        if damage != Set(Self.readDamage(folder)) { Self.writeDamage(folder, damage) }
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
        try? Data(text.utf8).write(to: folder.appendingPathComponent("damage"), options: .atomic)
    }

    deinit { if writeFD >= 0 { close(writeFD) } }

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
            let crc = crc32(0, out.baseAddress! + 12, uInt(length))
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

    /// A descriptor to fsync the segment being appended to with, outside the caller's
    /// lock (a duplicate, so a rotation meanwhile cannot close it), or nil when nothing
    /// was written since the last; the caller closes it.
    func takeSyncHandle() -> Int32? {
        guard isDirty, writeFD >= 0 else { return nil }
        isDirty = false
        let fd = dup(writeFD)
        return fd >= 0 ? fd : nil
    }

    static func sync(_ fd: Int32) {
        #if canImport(Darwin)
        _ = fcntl(fd, F_FULLFSYNC)
        #else
        _ = fdatasync(fd)
        #endif
    }

    /// fsync of the segment being appended to (earlier segments were synced when they were closed).
    func sync() {
        guard isDirty, writeFD >= 0 else { return }
        Self.sync(writeFD)
        isDirty = false
    }

    private func rotate() throws {
        sync()
        close(writeFD)
        writeFD = -1
        tail = QueuePosition(segment: tail.segment + 1, offset: 0)
        segmentSizes[tail.segment] = 0
        segmentCounts[tail.segment] = 0
        try openForAppend()
        Self.syncFolder(folder)
    }

    private func openForAppend() throws {
        let path = Self.segmentURL(folder, tail.segment).path
        let isNew = access(path, F_OK) != 0
        writeFD = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        guard writeFD >= 0 else { throw AdTallyError.storage("cannot open \(path) (\(String(cString: strerror(errno))))") }
        if segmentSizes[tail.segment] == nil { segmentSizes[tail.segment] = 0 }
        // A new file's name must survive power loss as its records do.
        if isNew { Self.syncFolder(folder) }
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
        var segment = head.segment
        while segment <= tail.segment {
            let end = segment == tail.segment ? tail.offset : (segmentSizes[segment] ?? 0)
            let from = segment == head.segment ? head.offset : 0
            if from < end { ranges.append((segment, from, end)) }
            segment += 1
        }
        return ReadPlan(folder: folder, ranges: ranges, tail: tail)
    }

    /// Up to `limit` records (and about `maxBytes` of JSON) of a plan, in order.
    static func records(in plan: ReadPlan, limit: Int, maxBytes: Int) throws -> [QueuedRecord] {
        var records: [QueuedRecord] = []
        var bytes = 0
        for range in plan.ranges where records.count < limit && bytes < maxBytes {
            let data = try read(segmentURL(plan.folder, range.segment), upTo: range.to, mustExist: true)
            guard data.count == range.to else {
                throw AdTallyError.storage("\(segmentURL(plan.folder, range.segment).path) is shorter than the queue wrote it (\(data.count) of \(range.to) bytes)")
            }
            var stop = false
            scan(data, from: range.from) { json, millis, recordEnd in
                if stop { return }
                records.append(QueuedRecord(
                    occurredAtMillis: millis, json: Array(data[json]),
                    end: QueuePosition(segment: range.segment, offset: recordEnd)
                ))
                bytes += json.count
                if records.count >= limit || bytes >= maxBytes { stop = true }
            }
        }
        return records
    }

    /// Up to `limit` records from the head on (tests; the sender reads a plan outside its lock).
    func read(limit: Int, maxBytes: Int) throws -> [QueuedRecord] {
        try Self.records(in: readPlan(), limit: limit, maxBytes: maxBytes)
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
        for number in oldHead.segment..<head.segment {
            passedBytes += (segmentSizes[number] ?? 0) - (number == oldHead.segment ? oldHead.offset : 0)
        }
        passedBytes += head.offset - (head.segment == oldHead.segment ? oldHead.offset : 0)
        pendingBytes -= passedBytes
        pendingCount -= records
        var left = records
        for number in oldHead.segment...head.segment {
            let inSegment = segmentCounts[number] ?? 0
            if number < head.segment {
                left -= inSegment
                segmentCounts[number] = nil
                segmentSizes[number] = nil
            } else {
                segmentCounts[number] = max(0, inSegment - left)
            }
        }
        if oldHead.segment < head.segment {
            for number in oldHead.segment..<head.segment { unlink(Self.segmentURL(folder, number).path) }
        }
        return records
    }

    /// Drops the oldest segment's records (the head's), for the byte bound; returns how
    /// many were dropped. Nothing when the head is in the segment being appended to.
    func dropOldestSegment() throws -> Int {
        guard head.segment < tail.segment else { return 0 }
        let dropped = segmentCounts[head.segment] ?? 0
        try advance(to: QueuePosition(segment: head.segment + 1, offset: 0), records: dropped)
        return dropped
    }

    private func writeHead(_ head: QueuePosition) throws {
        let text = "\(head.segment) \(head.offset)\n"
        let temporary = folder.appendingPathComponent("head.tmp")
        try Data(text.utf8).write(to: temporary)
        guard rename(temporary.path, folder.appendingPathComponent("head").path) == 0 else {
            throw AdTallyError.storage("cannot replace the queue's head file (\(String(cString: strerror(errno))))")
        }
    }

    // MARK: - File format

    static func segmentURL(_ folder: URL, _ number: UInt32) -> URL {
        folder.appendingPathComponent(String(format: "%08u.seg", number))
    }

    static func segmentNumbers(in folder: URL) throws -> [UInt32] {
        try FileManager.default.contentsOfDirectory(atPath: folder.path).compactMap { name -> UInt32? in
            guard name.hasSuffix(".seg") else { return nil }
            return UInt32(name.dropLast(4))
        }.sorted()
    }

    static func readHead(_ folder: URL) -> QueuePosition? {
        guard let text = try? String(contentsOf: folder.appendingPathComponent("head"), encoding: .utf8) else { return nil }
        let parts = text.split(whereSeparator: { $0 == " " || $0 == "\n" })
        guard parts.count == 2, let segment = UInt32(parts[0]), let offset = Int(parts[1]), offset >= 0 else { return nil }
        return QueuePosition(segment: segment, offset: offset)
    }

    static func read(_ url: URL, upTo end: Int? = nil, mustExist: Bool = false) throws -> [UInt8] {
        let fd = open(url.path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            if errno == ENOENT && !mustExist { return [] }
            throw AdTallyError.storage("cannot read \(url.path) (\(String(cString: strerror(errno))))")
        }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw AdTallyError.storage("cannot stat \(url.path)") }
        let size = min(Int(info.st_size), end ?? Int.max)
        var data = [UInt8](repeating: 0, count: size)
        var done = 0
        while done < size {
            let count = data.withUnsafeMutableBytes { pread(fd, $0.baseAddress! + done, size - done, off_t(done)) }
            if count < 0 && errno == EINTR { continue }
            if count < 0 { throw AdTallyError.storage("cannot read \(url.path) (\(String(cString: strerror(errno))))") }
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
