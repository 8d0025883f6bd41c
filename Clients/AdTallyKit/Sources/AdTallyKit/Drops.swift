import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Events the server refused for good, one JSON line each with its reason; never resent.
enum DeadLetter {
    static let maxBytes = 1 << 20

    /// Both files gone (`forgetInstall()`: they hold the old id's events).
    static func removeAll(in directory: URL) {
        for name in ["dead-letter.ndjson", "dead-letter.1.ndjson"] {
            try? FileManager.default.removeItem(at: directory.appendingPathComponent(name))
        }
    }

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
        // Written under the engine's lock: no fsync (QueueDamage.replace).
        return QueueDamage.replace(file, with: Array(data))
    }
}
