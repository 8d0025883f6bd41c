import Foundation
import TextFormats

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
        guard var text else {
            bytes.append(UInt8(ascii: "\\"))
            bytes.append(UInt8(ascii: "N"))
            return
        }
        try text.withUTF8 { utf8 in
            // Most fields (ids, names, versions) need no escaping: copy them whole.
            if !utf8.contains(where: { $0 == UInt8(ascii: "\\") || $0 == UInt8(ascii: "\t") || $0 == UInt8(ascii: "\n") || $0 == UInt8(ascii: "\r") || $0 == 0 }) {
                bytes.append(contentsOf: utf8)
                return
            }
            for byte in utf8 {
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
    }

    /// Appends a field whose text form needs no COPY escaping (numbers, UUIDs, timestamps, enum names).
    public mutating func append<Value: PostgresEncodable>(_ value: Value?) {
        separate()
        guard let value else {
            bytes.append(UInt8(ascii: "\\"))
            bytes.append(UInt8(ascii: "N"))
            return
        }
        value.appendPostgresText(to: &bytes)
    }

    // Non-generic forms of the above for the types ingest writes per event: a
    // generic call across modules goes through witness tables and run-time metadata.

    /// Appends a UUID.
    public mutating func append(_ id: UUID) {
        separate()
        UUIDText.append(id, to: &bytes)
    }

    /// Appends a `timestamptz`.
    public mutating func append(_ time: PostgresMicros) {
        separate()
        CivilTime.appendTimestamp(micros: time.micros, to: &bytes)
    }

    /// Appends an integer or NULL.
    public mutating func append(_ number: Int64?) {
        separate()
        guard let number else { return appendNull() }
        // Digits straight into the buffer (no String per number: delta rows carry twelve).
        if number < 0 { bytes.append(UInt8(ascii: "-")) }
        var magnitude = number.magnitude
        if magnitude < 10 {
            bytes.append(UInt8(ascii: "0") + UInt8(magnitude))
            return
        }
        let start = bytes.count
        while magnitude > 0 {
            bytes.append(UInt8(ascii: "0") + UInt8(magnitude % 10))
            magnitude /= 10
        }
        bytes[start...].reverse()
    }

    /// Appends an integer or NULL.
    public mutating func append(_ number: Int?) {
        append(number.map(Int64.init))
    }

    /// Appends a boolean or NULL.
    public mutating func append(_ flag: Bool?) {
        separate()
        guard let flag else { return appendNull() }
        bytes.append(flag ? UInt8(ascii: "t") : UInt8(ascii: "f"))
    }

    private mutating func appendNull() {
        bytes.append(UInt8(ascii: "\\"))
        bytes.append(UInt8(ascii: "N"))
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
