import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Damage to the kit's folder that the kit did not cause — a segment deleted, a
/// directory where a file should be, a head torn or unreadable — found without ever
/// stopping `AdTally(...)` from opening: what cannot be read is moved aside or skipped,
/// and every event that can no longer be sent is counted as a `damaged` drop.
///
/// A lost segment's events are counted from the ledger (`queue/counts`): the records
/// each segment held from the head on, written when a segment is sealed, when the head
/// moves, at close, and with every periodic sync, so that a segment that disappears
/// cannot take its count with it (an active segment's count is at most one sync
/// interval old, like the events power loss may take).
enum QueueDamage {
    enum Kind {
        case missing
        case regularFile
        case directory
        case other
    }

    /// What is at `path`, without following a symbolic link.
    static func kind(_ path: String) -> Kind {
        var info = stat()
        guard lstat(path, &info) == 0 else { return .missing }
        switch info.st_mode & S_IFMT {
        case S_IFREG: return .regularFile
        case S_IFDIR: return .directory
        default: return .other
        }
    }

    /// Moves whatever is at `path` out of the way (to `NAME.damaged-XXXXXXXX` beside it),
    /// or removes it when it cannot be moved; true when the path is free afterwards.
    @discardableResult
    static func moveAside(_ path: String) -> Bool {
        guard kind(path) != .missing else { return true }
        let aside = path + ".damaged-" + UUID().uuidString.prefix(8).lowercased()
        if rename(path, aside) == 0 { return true }
        try? FileManager.default.removeItem(atPath: path)
        return kind(path) == .missing
    }

    /// `path` as a file the kit can open: anything else there (a directory, a socket, a
    /// link) is moved aside.
    static func clearForFile(_ path: String) {
        let found = kind(path)
        if found != .missing && found != .regularFile { moveAside(path) }
    }

    /// `url` as a directory: anything else there is moved aside, then the folder made.
    static func ensureDirectory(_ url: URL) throws {
        let found = kind(url.path)
        if found != .missing && found != .directory { moveAside(url.path) }
        do {
            try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        } catch {
            throw AdTallyError.storage("cannot create \(url.path): \(error.localizedDescription)")
        }
    }

    /// Replaces `url`'s contents by a new file renamed over it, without fsync: these small
    /// files are written under the lock `record()` takes, where no sync may run
    /// (Foundation's `.atomic` write fsyncs). A crash leaves the old file or the new one;
    /// power loss may take the last write, as it may the last second of events.
    @discardableResult
    static func replace(_ url: URL, with bytes: [UInt8]) -> Bool {
        clearForFile(url.path)
        let temporary = url.path + ".tmp"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return false }
        var done = 0
        while done < bytes.count {
            let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + done, bytes.count - done) }
            if written < 0 && errno == EINTR { continue }
            guard written > 0 else {
                close(fd)
                unlink(temporary)
                return false
            }
            done += written
        }
        close(fd)
        guard rename(temporary, url.path) == 0 else {
            unlink(temporary)
            return false
        }
        return true
    }

    // MARK: - The ledger

    static func ledgerURL(_ folder: URL) -> URL { folder.appendingPathComponent("counts") }

    /// Records per segment (from the head on) as last written; empty when there is none.
    static func readLedger(_ folder: URL) -> [UInt32: Int] {
        let path = ledgerURL(folder).path
        guard kind(path) == .regularFile, let text = try? String(contentsOfFile: path, encoding: .utf8), text.utf8.count <= 1 << 20 else { return [:] }
        var counts: [UInt32: Int] = [:]
        for line in text.split(separator: "\n") {
            let parts = line.split(separator: " ")
            guard parts.count == 2, let segment = UInt32(parts[0]), let count = Int(parts[1]), (0...(1 << 30)).contains(count) else { continue }
            counts[segment] = count
        }
        return counts
    }

    /// Writes the ledger (a new file renamed over the old: a torn write leaves the old).
    /// Not fatal when it fails (a full disk): the counts are then as of the last write.
    @discardableResult
    static func writeLedger(_ folder: URL, _ counts: [UInt32: Int]) -> Bool {
        let text = counts.keys.sorted().map { "\($0) \(counts[$0]!)\n" }.joined()
        return replace(ledgerURL(folder), with: Array(text.utf8))
    }
}
