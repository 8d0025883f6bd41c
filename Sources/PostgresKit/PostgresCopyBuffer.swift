/// Rows in PostgreSQL's COPY text format, built as UTF-8 bytes.
///
/// Lengths are byte counts by construction, so multi-byte text is sent intact.
public struct PostgresCopyBuffer: Sendable {
    /// The encoded rows.
    public private(set) var bytes: [UInt8] = []
    /// Rows appended so far.
    public private(set) var rowCount = 0
    private var fieldsInRow = 0

    /// An empty buffer; `capacity` is a byte-size hint.
    public init(capacity: Int = 0) { bytes.reserveCapacity(capacity) }

    /// Appends one field of the current row; nil is SQL NULL.
    public mutating func append(_ text: String?) throws {
        separate()
        guard let text else {
            bytes.append(UInt8(ascii: "\\"))
            bytes.append(UInt8(ascii: "N"))
            return
        }
        for byte in text.utf8 {
            switch byte {
            case 0:
                throw PostgresError(kind: .invalidParameter, message: "COPY field contains a NUL byte, which PostgreSQL text cannot store")
            case UInt8(ascii: "\\"): bytes.append(UInt8(ascii: "\\")); bytes.append(UInt8(ascii: "\\"))
            case UInt8(ascii: "\t"): bytes.append(UInt8(ascii: "\\")); bytes.append(UInt8(ascii: "t"))
            case UInt8(ascii: "\n"): bytes.append(UInt8(ascii: "\\")); bytes.append(UInt8(ascii: "n"))
            case UInt8(ascii: "\r"): bytes.append(UInt8(ascii: "\\")); bytes.append(UInt8(ascii: "r"))
            default: bytes.append(byte)
            }
        }
    }

    /// Appends a field whose text form needs no escaping (numbers, UUIDs, timestamps).
    public mutating func append<Value: PostgresEncodable>(_ value: Value?) {
        separate()
        guard let value else {
            bytes.append(UInt8(ascii: "\\"))
            bytes.append(UInt8(ascii: "N"))
            return
        }
        bytes.append(contentsOf: value.postgresText.utf8)
    }

    /// Ends the current row.
    public mutating func endRow() {
        bytes.append(UInt8(ascii: "\n"))
        rowCount += 1
        fieldsInRow = 0
    }

    private mutating func separate() {
        if fieldsInRow > 0 { bytes.append(UInt8(ascii: "\t")) }
        fieldsInRow += 1
    }
}
