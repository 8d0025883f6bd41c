import AdTallyCore
import AdTallyStorage
import Foundation

/// `adtally ingest`: NDJSON or CSV files through the same validation, dedupe and
/// storage as `POST /v1/events`, in large batches. Importing a file twice adds nothing.
public struct FileImporter: Sendable {
    /// How a file's events are written.
    public enum Format: String, Sendable, CaseIterable {
        case ndjson, csv

        /// `.csv` is CSV; anything else is NDJSON.
        public static func guess(path: String) -> Format {
            path.lowercased().hasSuffix(".csv") ? .csv : .ndjson
        }
    }

    /// Running totals, reported as the import goes.
    public struct Progress: Sendable, Equatable {
        /// The file being read.
        public var file: String = ""
        /// Bytes of it read so far.
        public var bytesRead: Int = 0
        /// Its size.
        public var totalBytes: Int = 0
        /// Events newly stored, all files so far.
        public var accepted = 0
        /// Events already stored before.
        public var duplicates = 0
        /// Events of erased devices that occurred before their erasure (DESIGN §15): not stored.
        public var erased = 0
        /// Events refused by validation or unreadable.
        public var rejected = 0
        /// The first rejections, as "file:line: field: rule".
        public var firstRejections: [String] = []
    }

    let store: EventStore
    var validator: EventValidator
    let batchSize: Int
    /// How many rejections the summary lists.
    public static let rejectionsShown = 10
    /// Newly stored events between two rollup compactions.
    static let compactEvery = 200_000

    /// An importer for one app.
    public init(
        store: EventStore, appID: String, batchSize: Int = 10_000,
        maxAge: Duration = .seconds(7 * 86_400), maxAhead: Duration = .seconds(3600)
    ) {
        self.store = store
        self.validator = EventValidator(appID: appID, maxAge: maxAge, maxAhead: maxAhead, acceptsTextValues: true)
        self.batchSize = batchSize
    }

    /// Imports the files in order, calling `report` after every batch; returns the totals.
    public func importFiles(
        _ paths: [String], format: Format? = nil, report: (Progress) -> Void = { _ in }
    ) async throws -> Progress {
        var importer = self
        importer.validator.idsPrunedBeforeMicros = try await store.widenIDHorizon(to: validator.maxAge)
        var progress = Progress()
        for path in paths {
            try await importer.importFile(path, format: format ?? .guess(path: path), progress: &progress, report: report)
        }
        // A bulk load leaves many deltas; fold them now rather than leave them to the next server.
        try await RollupCompactor(store: store).compactOnce()
        return progress
    }

    private func importFile(_ path: String, format: Format, progress: inout Progress, report: (Progress) -> Void) async throws {
        guard let handle = FileHandle(forReadingAtPath: path) else { throw ImportError.unreadable(path) }
        defer { try? handle.close() }
        progress.file = path
        progress.bytesRead = 0
        progress.totalBytes = (try? FileManager.default.attributesOfItem(atPath: path)[.size] as? Int) ?? 0
        let name = URL(fileURLWithPath: path).lastPathComponent
        var pending: [(line: Int, raw: RawEvent)] = []
        var csv = CSVRecordReader()
        var header: [String]?
        var repeatedColumn: String?
        var carry: [UInt8] = []
        var lineNumber = 0

        func take(_ slot: EventBatchReader.Slot?, line: Int, progress: inout Progress) {
            switch slot {
            case nil: break
            case .unreadable(let reason):
                // The reader's reason starts with "line N: "; the file:line prefix says that already.
                let prefix = "line \(line): "
                reject("\(name):\(line): \(reason.hasPrefix(prefix) ? String(reason.dropFirst(prefix.count)) : reason)", &progress)
            case .event(let raw):
                pending.append((line, raw))
            }
        }
        func csvRecord(_ record: CSVRecordReader.Record, progress: inout Progress) {
            guard let columns = header else {
                let names = record.fields.map { $0.trimmingCharacters(in: .whitespaces).lowercased() }
                header = names
                var seen = Set<String>()
                repeatedColumn = names.first { !seen.insert($0).inserted }
                return
            }
            if let repeatedColumn {
                reject("\(name):\(record.line): the header names the column \"\(repeatedColumn)\" twice", &progress)
                return
            }
            var raw = RawEvent()
            for (column, value) in zip(columns, record.fields) { raw.set(column, .string(value)) }
            if record.fields.count != columns.count {
                reject("\(name):\(record.line): has \(record.fields.count) fields, the header has \(columns.count)", &progress)
                return
            }
            pending.append((record.line, raw))
        }

        while true {
            let chunk = try handle.read(upToCount: 4 << 20) ?? Data()
            let atEnd = chunk.isEmpty
            progress.bytesRead += chunk.count
            switch format {
            case .ndjson:
                carry.append(contentsOf: chunk)
                var start = 0
                carry.withUnsafeBufferPointer { buffer in
                    var index = 0
                    while index < buffer.count {
                        if buffer[index] == UInt8(ascii: "\n") {
                            lineNumber += 1
                            take(EventBatchReader.readLine(UnsafeBufferPointer(rebasing: buffer[start..<index]), number: lineNumber),
                                 line: lineNumber, progress: &progress)
                            start = index + 1
                        }
                        index += 1
                    }
                    if atEnd && start < buffer.count {
                        lineNumber += 1
                        take(EventBatchReader.readLine(UnsafeBufferPointer(rebasing: buffer[start...]), number: lineNumber),
                             line: lineNumber, progress: &progress)
                        start = buffer.count
                    }
                }
                carry.removeFirst(start)
            case .csv:
                for record in csv.feed(chunk) { csvRecord(record, progress: &progress) }
                if atEnd, let last = csv.finish() { csvRecord(last, progress: &progress) }
            }
            if pending.count >= batchSize || atEnd {
                try await flush(&pending, name: name, progress: &progress)
                report(progress)
            }
            if atEnd { break }
        }
    }

    private func flush(_ pending: inout [(line: Int, raw: RawEvent)], name: String, progress: inout Progress) async throws {
        let now = Int64(Date().timeIntervalSince1970 * 1_000_000)
        var events: [AppEvent] = []
        events.reserveCapacity(pending.count)
        for (line, raw) in pending {
            do {
                events.append(AppEvent(appID: validator.appID, event: try validator.validate(raw, nowMicros: now)))
            } catch {
                reject("\(name):\(line): \(error.description)", &progress)
            }
        }
        pending.removeAll(keepingCapacity: true)
        var offset = 0
        while offset < events.count {
            let slice = Array(events[offset..<min(offset + batchSize, events.count)])
            let outcomes = try await store.write(slice)
            let stored = outcomes.lazy.filter { $0 == .stored }.count
            let erased = outcomes.lazy.filter { $0 == .erased }.count
            let before = progress.accepted
            progress.accepted += stored
            progress.erased += erased
            progress.duplicates += slice.count - stored - erased
            offset += slice.count
            // Fold the rollup deltas as the import goes, so a long import leaves no
            // backlog for one big compaction (the CLI runs no compactor of its own).
            if progress.accepted / Self.compactEvery != before / Self.compactEvery {
                try await RollupCompactor(store: store).compactOnce()
            }
        }
    }

    private func reject(_ message: String, _ progress: inout Progress) {
        progress.rejected += 1
        if progress.firstRejections.count < Self.rejectionsShown { progress.firstRejections.append(message) }
    }
}

/// A file that could not be imported at all.
public enum ImportError: Error, CustomStringConvertible {
    case unreadable(String)
    public var description: String {
        switch self {
        case .unreadable(let path): "cannot read \(path)"
        }
    }
}
