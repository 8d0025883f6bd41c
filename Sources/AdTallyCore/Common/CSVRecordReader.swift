/// Splits RFC 4180 CSV into records, fed in chunks of bytes.
///
/// Quoted fields may hold commas, doubled quotes and line breaks; CRLF and LF both end a record.
public struct CSVRecordReader: Sendable {
    private var field: [UInt8] = []
    private var record: [String] = []
    private var inQuotes = false
    private var quoteJustClosed = false
    private var fieldStarted = false
    /// 1-based line on which the record being read started.
    private var recordLine = 1
    private var line = 1
    /// Bytes of a leading UTF-8 byte-order mark seen so far (Excel's "CSV UTF-8" starts
    /// with one); nil once the first byte that is not part of one has been read.
    private var byteOrderMark: Int? = 0

    /// A reader at the start of a file.
    public init() {}

    /// A record and the line it started on.
    public struct Record: Sendable, Equatable {
        /// The fields, unquoted.
        public var fields: [String]
        /// The line the record starts on (1-based).
        public var line: Int

        /// Every field is empty or spaces and tabs: a blank line, which no reader counts.
        public var isBlank: Bool { !fields.contains { !$0.allSatisfy { $0 == " " || $0 == "\t" } } }
    }

    /// Feeds bytes; returns the records they completed.
    public mutating func feed(_ bytes: some Sequence<UInt8>) -> [Record] {
        var records: [Record] = []
        for byte in bytes {
            if let seen = byteOrderMark {
                if seen < 3, byte == Self.byteOrderMarkBytes[seen] {
                    byteOrderMark = seen + 1 == 3 ? nil : seen + 1
                    continue
                }
                // Not a mark after all (invalid UTF-8 either way): keep its bytes.
                byteOrderMark = nil
                field.append(contentsOf: Self.byteOrderMarkBytes[0..<seen])
                if seen > 0 { fieldStarted = true }
            }
            if inQuotes {
                if byte == UInt8(ascii: "\"") {
                    inQuotes = false
                    quoteJustClosed = true
                } else {
                    if byte == UInt8(ascii: "\n") { line += 1 }
                    field.append(byte)
                }
                continue
            }
            switch byte {
            case UInt8(ascii: "\""):
                if quoteJustClosed {
                    field.append(byte)  // "" inside a quoted field
                    inQuotes = true
                    quoteJustClosed = false
                } else if !fieldStarted {
                    inQuotes = true
                    fieldStarted = true
                } else {
                    field.append(byte)  // stray quote in an unquoted field: keep it
                }
            case UInt8(ascii: ","):
                endField()
            case UInt8(ascii: "\r"):
                continue
            case UInt8(ascii: "\n"):
                line += 1
                if let done = endRecord() { records.append(done) }
            default:
                quoteJustClosed = false
                fieldStarted = true
                field.append(byte)
            }
        }
        return records
    }

    static let byteOrderMarkBytes: [UInt8] = [0xEF, 0xBB, 0xBF]

    /// Every record of a whole file that has a non-blank field (blank lines dropped).
    public static func records(of bytes: some Sequence<UInt8>) -> [Record] {
        var reader = CSVRecordReader()
        var records = reader.feed(bytes)
        if let last = reader.finish() { records.append(last) }
        return records.filter { !$0.isBlank }
    }

    /// Ends input; returns the last record if it had no final line break.
    public mutating func finish() -> Record? {
        endRecord()
    }

    private mutating func endField() {
        record.append(String(decoding: field, as: UTF8.self))
        field.removeAll(keepingCapacity: true)
        quoteJustClosed = false
        fieldStarted = false
    }

    private mutating func endRecord() -> Record? {
        defer { recordLine = line }
        if record.isEmpty && field.isEmpty && !fieldStarted {
            return nil  // blank line
        }
        endField()
        let done = Record(fields: record, line: recordLine)
        record = []
        return done
    }
}
